//! The vCPU threads: each creates its vCPU (a vCPU belongs to the thread
//! that created it), sets up its boot state through the host's machine,
//! reports ready, and turns every exit into one bus call until the VM
//! ends. An exit the VMM cannot serve ends the VM as a crash with the
//! console's tail. On aarch64 with VMM-side PSCI (Hypervisor.framework),
//! secondary vCPUs wait for the guest's `CPU_ON` before entering it.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use boxdesk_devices::console::Console;
use boxdesk_devices::virtio::Memory;
use boxdesk_hv::{SystemEvent, Vcpu, VcpuExit, VcpuKick, Vm as _};

use super::arch::host;
use super::{console_tail, lock, Buses, Ending, HvVcpu, HvVm, Kicks, VmEnd, VmmError};

/// What every vCPU thread shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub vm: Arc<HvVm>,
    pub mem: Memory,
    pub buses: Arc<Buses>,
    pub ending: Arc<Ending>,
    pub kicks: Kicks,
    pub console: Arc<Mutex<dyn Console>>,
    pub boot: Arc<host::Boot>,
    pub vcpus: u32,
}

/// The vCPU threads, set up and waiting for [`Go::start`]; dropped without
/// it, they end without running the guest.
pub(super) struct Go(Vec<std::sync::mpsc::Sender<()>>);

impl Go {
    /// Lets every vCPU enter the guest.
    pub fn start(self) {
        for tx in &self.0 {
            let _ = tx.send(());
        }
    }
}

/// Starts one thread per vCPU and waits until each has its vCPU set up (or
/// one failed); the threads then wait for [`Go::start`].
pub(super) fn start_all(shared: &Shared) -> Result<Go, VmmError> {
    #[cfg(target_arch = "aarch64")]
    let power = Arc::new(host::Power::new(shared.vcpus));
    #[cfg(target_arch = "aarch64")]
    {
        let p = power.clone();
        lock(&shared.kicks).push(Box::new(move || p.wake_all()));
    }
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let mut go = Go(Vec::new());
    for id in 0..shared.vcpus {
        let (s, ready) = (shared.clone(), ready_tx.clone());
        let (go_tx, go_rx) = std::sync::mpsc::channel();
        go.0.push(go_tx);
        #[cfg(target_arch = "aarch64")]
        let power = power.clone();
        std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || {
                let Some(mut vcpu) = setup(id, &s, ready) else {
                    return;
                };
                if go_rx.recv().is_err() {
                    return;
                }
                #[cfg(target_arch = "aarch64")]
                run(id, &mut vcpu, &s, &power);
                #[cfg(not(target_arch = "aarch64"))]
                run(id, &mut vcpu, &s);
                let _ = std::io::stderr().flush();
            })
            .map_err(VmmError::Thread)?;
    }
    drop(ready_tx);
    for _ in 0..shared.vcpus {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => break,
        }
    }
    Ok(go)
}

/// Creates vCPU `id` on this thread and sets up its boot state.
fn setup(
    id: u32,
    s: &Shared,
    ready: std::sync::mpsc::Sender<Result<(), VmmError>>,
) -> Option<HvVcpu> {
    let vcpu =
        s.vm.create_vcpu(id)
            .map_err(VmmError::from)
            .and_then(|mut v| {
                host::setup_vcpu(&mut v, &s.mem, id, s.vcpus, &s.boot)?;
                Ok(v)
            });
    match vcpu {
        Ok(vcpu) => {
            let kick = vcpu.kick_handle();
            lock(&s.kicks).push(Box::new(move || kick.kick()));
            let _ = ready.send(Ok(()));
            Some(vcpu)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            None
        }
    }
}

/// Ends the VM as a crash of vCPU `id`.
fn crash(s: &Shared, id: u32, what: impl std::fmt::Display) {
    s.ending.set(VmEnd::Crash {
        reason: format!("vCPU {id}: {what}"),
        serial: console_tail(&s.console),
    });
}

/// Runs vCPU `id` until the VM ends.
fn run(
    id: u32,
    vcpu: &mut HvVcpu,
    s: &Shared,
    #[cfg(target_arch = "aarch64")] power: &host::Power,
) {
    let stop = &s.ending.stop;
    #[cfg(target_arch = "aarch64")]
    if host::VMM_PSCI && id > 0 {
        match host::wait_for_cpu_on(vcpu, id, power, stop) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return crash(s, id, e),
        }
    }
    let mut buf = [0u8; 8];
    while !stop.load(Ordering::SeqCst) {
        let exit = match vcpu.run() {
            Ok(exit) => exit,
            Err(e) => return crash(s, id, e),
        };
        match exit {
            VcpuExit::Pio { port, len, write } => match write {
                Some(data) => {
                    s.buses.pio.write(u64::from(port), &data);
                }
                None => {
                    let b = &mut buf[..len.min(8)];
                    b.fill(0xff);
                    s.buses.pio.read(u64::from(port), b);
                    let _ = vcpu.complete_read(b);
                }
            },
            VcpuExit::Mmio { addr, len, write } => match write {
                Some(data) => {
                    s.buses.mmio.write(addr, &data);
                }
                None => {
                    let b = &mut buf[..len.min(8)];
                    b.fill(0);
                    s.buses.mmio.read(addr, b);
                    let _ = vcpu.complete_read(b);
                }
            },
            VcpuExit::Hlt | VcpuExit::Cancelled => {}
            VcpuExit::Shutdown | VcpuExit::SystemEvent(SystemEvent::Reset) => {
                s.ending.set(VmEnd::Reset)
            }
            VcpuExit::SystemEvent(SystemEvent::Poweroff) => s.ending.set(VmEnd::Poweroff),
            #[cfg(target_arch = "aarch64")]
            VcpuExit::Psci(call) => match host::psci(vcpu, id, call, power, &s.boot) {
                Ok(host::PsciNext::Run) => {}
                Ok(host::PsciNext::Off) => match host::wait_for_cpu_on(vcpu, id, power, stop) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => return crash(s, id, e),
                },
                Err(e) => return crash(s, id, e),
            },
            other => return crash(s, id, format_args!("{other:?}")),
        }
    }
}
