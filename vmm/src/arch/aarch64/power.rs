//! vCPU power states for PSCI calls the VMM answers itself (on
//! Hypervisor.framework; KVM answers PSCI in the kernel): `CPU_ON`,
//! `CPU_OFF`, `AFFINITY_INFO`. A secondary vCPU's thread waits in
//! [`CpuPower::wait_on`] until a `CPU_ON` names it, then enters the guest at
//! the requested entry point.
//!
//! Portable and unit-tested on every host; it never touches a vCPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use boxdesk_hv::psci::ret;

use boxdesk_platform::sync::lock;

/// One vCPU's power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Off,
    /// `CPU_ON` accepted; its thread has not picked it up yet.
    OnPending {
        entry: u64,
        context: u64,
    },
    On,
}

/// The power state of every vCPU of one VM.
#[derive(Debug)]
pub struct CpuPower {
    cpus: Mutex<Vec<State>>,
    changed: Condvar,
}

/// `AFFINITY_INFO` answers.
const AFFINITY_ON: i64 = 0;
const AFFINITY_OFF: i64 = 1;
const AFFINITY_ON_PENDING: i64 = 2;

/// The vCPU id of an MPIDR affinity value (the inverse of
/// [`mpidr_for`](boxdesk_hv::arch::aarch64::mpidr_for)), if it names one of
/// `vcpus`.
pub fn vcpu_of(mpidr: u64, vcpus: u32) -> Option<u32> {
    let (aff0, aff1, aff2, aff3) = (
        mpidr & 0xff,
        (mpidr >> 8) & 0xff,
        (mpidr >> 16) & 0xff,
        (mpidr >> 32) & 0xff,
    );
    if aff0 >= 16 || aff3 != 0 {
        return None;
    }
    let id = aff0 + (aff1 << 4) + (aff2 << 12);
    u32::try_from(id).ok().filter(|id| *id < vcpus)
}

impl CpuPower {
    /// vCPU 0 on, the others off.
    pub fn new(vcpus: u32) -> Self {
        let mut cpus = vec![State::Off; vcpus as usize];
        if let Some(boot) = cpus.first_mut() {
            *boot = State::On;
        }
        Self {
            cpus: Mutex::new(cpus),
            changed: Condvar::new(),
        }
    }

    /// `CPU_ON` of the vCPU `target` names, to start at `entry` (which must
    /// lie in `ram`) with x0 = `context`. Returns the PSCI return value.
    pub fn cpu_on(&self, target: u64, entry: u64, context: u64, ram: std::ops::Range<u64>) -> i64 {
        let mut cpus = lock(&self.cpus);
        let Some(id) = vcpu_of(target, cpus.len() as u32) else {
            return ret::INVALID_PARAMETERS;
        };
        if !ram.contains(&entry) {
            return ret::INVALID_ADDRESS;
        }
        match cpus[id as usize] {
            State::On => ret::ALREADY_ON,
            State::OnPending { .. } => ret::ON_PENDING,
            State::Off => {
                cpus[id as usize] = State::OnPending { entry, context };
                self.changed.notify_all();
                ret::SUCCESS
            }
        }
    }

    /// `CPU_OFF` by vCPU `id`: its thread then waits in [`Self::wait_on`].
    pub fn cpu_off(&self, id: u32) {
        if let Some(s) = lock(&self.cpus).get_mut(id as usize) {
            *s = State::Off;
        }
    }

    /// `AFFINITY_INFO` for `target` at affinity level 0 (the only one
    /// answered; others are `INVALID_PARAMETERS`).
    pub fn affinity_info(&self, target: u64, lowest_level: u64) -> i64 {
        let cpus = lock(&self.cpus);
        match (lowest_level, vcpu_of(target, cpus.len() as u32)) {
            (0, Some(id)) => match cpus[id as usize] {
                State::On => AFFINITY_ON,
                State::Off => AFFINITY_OFF,
                State::OnPending { .. } => AFFINITY_ON_PENDING,
            },
            _ => ret::INVALID_PARAMETERS,
        }
    }

    /// Blocks vCPU `id`'s thread until a `CPU_ON` names it (returning its
    /// entry point and x0, the vCPU now on) or `stop` is set and
    /// [`Self::wake_all`] called (returning `None`).
    pub fn wait_on(&self, id: u32, stop: &AtomicBool) -> Option<(u64, u64)> {
        let mut cpus = lock(&self.cpus);
        loop {
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            let slot = cpus.get_mut(id as usize)?;
            if let State::OnPending { entry, context } = *slot {
                *slot = State::On;
                return Some((entry, context));
            }
            cpus = self.changed.wait(cpus).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Wakes every waiting thread to look at its stop flag.
    pub fn wake_all(&self) {
        let _cpus = lock(&self.cpus);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use boxdesk_hv::arch::aarch64::mpidr_for;

    use super::*;

    const RAM: std::ops::Range<u64> = 0x8000_0000..0x9000_0000;

    #[test]
    fn mpidr_affinities_map_back_to_vcpu_ids_and_strangers_to_none() {
        for id in [0, 1, 15, 16, 17, 100] {
            assert_eq!(vcpu_of(mpidr_for(id), 123), Some(id));
        }
        assert_eq!(vcpu_of(mpidr_for(4), 4), None, "past the last vCPU");
        assert_eq!(vcpu_of(0x10, 123), None, "aff0 >= 16 is never used");
        assert_eq!(vcpu_of(1 << 32, 123), None, "aff3");
    }

    #[test]
    fn cpu_on_starts_a_waiting_secondary_once_with_its_entry_and_context() {
        let p = Arc::new(CpuPower::new(2));
        let stop = Arc::new(AtomicBool::new(false));
        let (p2, s2) = (p.clone(), stop.clone());
        let t = std::thread::spawn(move || p2.wait_on(1, &s2));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(p.affinity_info(mpidr_for(1), 0), AFFINITY_OFF);
        assert_eq!(p.cpu_on(mpidr_for(1), 0x8008_0000, 42, RAM), ret::SUCCESS);
        assert_eq!(t.join().unwrap(), Some((0x8008_0000, 42)));
        assert_eq!(p.affinity_info(mpidr_for(1), 0), AFFINITY_ON);
        assert_eq!(p.cpu_on(mpidr_for(1), 0x8008_0000, 0, RAM), ret::ALREADY_ON);
        assert_eq!(p.cpu_on(mpidr_for(0), 0x8008_0000, 0, RAM), ret::ALREADY_ON);
    }

    #[test]
    fn a_pending_cpu_on_is_reported_as_pending() {
        let p = CpuPower::new(2);
        assert_eq!(p.cpu_on(mpidr_for(1), 0x8000_0000, 0, RAM), ret::SUCCESS);
        assert_eq!(p.affinity_info(mpidr_for(1), 0), AFFINITY_ON_PENDING);
        assert_eq!(p.cpu_on(mpidr_for(1), 0x8000_0000, 0, RAM), ret::ON_PENDING);
    }

    #[test]
    fn bad_targets_entries_and_levels_are_refused_with_psci_codes() {
        let p = CpuPower::new(2);
        assert_eq!(
            p.cpu_on(mpidr_for(2), 0x8000_0000, 0, RAM),
            ret::INVALID_PARAMETERS
        );
        assert_eq!(p.cpu_on(mpidr_for(1), 0x1000, 0, RAM), ret::INVALID_ADDRESS);
        assert_eq!(p.affinity_info(mpidr_for(9), 0), ret::INVALID_PARAMETERS);
        assert_eq!(p.affinity_info(mpidr_for(1), 1), ret::INVALID_PARAMETERS);
    }

    #[test]
    fn cpu_off_lets_a_vcpu_be_started_again() {
        let p = CpuPower::new(2);
        let stop = AtomicBool::new(false);
        assert_eq!(p.cpu_on(mpidr_for(1), 0x8000_0000, 1, RAM), ret::SUCCESS);
        assert_eq!(p.wait_on(1, &stop), Some((0x8000_0000, 1)));
        p.cpu_off(1);
        assert_eq!(p.affinity_info(mpidr_for(1), 0), AFFINITY_OFF);
        assert_eq!(p.cpu_on(mpidr_for(1), 0x8000_1000, 2, RAM), ret::SUCCESS);
        assert_eq!(p.wait_on(1, &stop), Some((0x8000_1000, 2)));
    }

    #[test]
    fn a_stop_releases_a_secondary_that_was_never_started() {
        let p = Arc::new(CpuPower::new(3));
        let stop = Arc::new(AtomicBool::new(false));
        let (p2, s2) = (p.clone(), stop.clone());
        let t = std::thread::spawn(move || p2.wait_on(2, &s2));
        std::thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::SeqCst);
        p.wake_all();
        assert_eq!(t.join().unwrap(), None);
    }
}
