//! A userspace GICv3 model: distributor, redistributors and the system-register
//! CPU interface, for Hypervisor.framework before macOS 15 (no `hv_gic`).
//!
//! Portable: compiled and unit-tested on every host. It is a state machine
//! only — the backend feeds it guest MMIO ([`GicV3::dist_read`],
//! [`GicV3::redist_read`]…), trapped `ICC_*` accesses
//! ([`GicV3::sysreg_read`]…) and interrupt lines ([`GicV3::set_spi_level`],
//! [`GicV3::set_ppi_level`]), and asks [`GicV3::irq_pending`] whether to
//! assert a vCPU's IRQ input. It never touches a vCPU, a thread or a lock.
//!
//! Scope: one security state (GICD_CTLR.DS = 1), affinity routing always on,
//! group 1 delivery, 5 priority bits, no LPIs/ITS, no preemption grouping
//! (a pending interrupt preempts when its priority is strictly higher than
//! the running one). That is what Linux needs.

mod cpuif;
mod regs;
#[cfg(test)]
mod tests;

use crate::arch::aarch64::mpidr_for;

/// The INTID an acknowledge returns when nothing is pending.
pub const SPURIOUS: u32 = 1023;
/// The priority bits implemented (the rest of each priority byte reads 0).
const PRIORITY_MASK: u8 = 0xf8;

/// One interrupt's state.
#[derive(Debug, Clone, Copy)]
struct Irq {
    enabled: bool,
    /// Latched pending (edge, or set through ISPENDR).
    latched: bool,
    /// The input line (level-triggered interrupts are pending while high).
    line: bool,
    active: bool,
    priority: u8,
    group1: bool,
    edge: bool,
    /// IROUTER (SPIs only): affinity, or bit 31 = any CPU.
    route: u64,
}

impl Irq {
    fn new(edge: bool) -> Self {
        Self {
            enabled: false,
            latched: false,
            line: false,
            active: false,
            priority: 0,
            group1: false,
            edge,
            route: 0,
        }
    }

    fn pending(&self) -> bool {
        self.latched || (!self.edge && self.line)
    }

    fn set_line(&mut self, level: bool) {
        if self.edge && level && !self.line {
            self.latched = true;
        }
        self.line = level;
    }
}

/// One vCPU's banked interrupts (SGIs, PPIs) and CPU-interface state.
#[derive(Debug, Clone)]
struct Cpu {
    mpidr: u64,
    private: [Irq; 32],
    sleep: bool,
    pmr: u8,
    bpr1: u64,
    grpen1: bool,
    grpen0: bool,
    eoi_mode: bool,
    ap1r0: u64,
    /// Acknowledged, not yet priority-dropped: (intid, priority).
    running: Vec<(u32, u8)>,
}

impl Cpu {
    fn new(id: u32) -> Self {
        let mut private = [Irq::new(false); 32];
        for irq in &mut private[..16] {
            irq.edge = true; // SGIs are always edge
        }
        Self {
            mpidr: mpidr_for(id),
            private,
            sleep: true,
            pmr: 0,
            bpr1: 0,
            grpen1: false,
            grpen0: false,
            eoi_mode: false,
            ap1r0: 0,
            running: Vec::new(),
        }
    }

    fn running_priority(&self) -> u8 {
        self.running.iter().map(|&(_, p)| p).min().unwrap_or(0xff)
    }
}

/// The whole GICv3: one distributor, one redistributor + CPU interface per vCPU.
#[derive(Debug, Clone)]
pub struct GicV3 {
    ctlr: u32,
    spis: Vec<Irq>,
    cpus: Vec<Cpu>,
}

impl GicV3 {
    /// A GIC for `vcpus` vCPUs (ids 0..vcpus, MPIDRs from
    /// [`mpidr_for`]) and `spis` shared interrupts, rounded up to a
    /// multiple of 32 (at most 988).
    pub fn new(vcpus: u32, spis: u32) -> Self {
        let spis = (spis.div_ceil(32).clamp(1, 31) * 32).min(988);
        Self {
            ctlr: 0,
            spis: vec![Irq::new(false); spis as usize],
            cpus: (0..vcpus).map(Cpu::new).collect(),
        }
    }

    /// Number of vCPUs.
    pub fn vcpus(&self) -> usize {
        self.cpus.len()
    }

    /// Adds vCPU `id` (its MPIDR from [`mpidr_for`]) and returns its index
    /// in this model; for backends that learn the vCPUs one at a time.
    pub fn add_vcpu(&mut self, id: u32) -> usize {
        self.cpus.push(Cpu::new(id));
        self.cpus.len() - 1
    }

    /// Drives SPI `spi` (INTID 32 + `spi`) to `level`. Out of range: ignored.
    pub fn set_spi_level(&mut self, spi: u32, level: bool) {
        if let Some(irq) = self.spis.get_mut(spi as usize) {
            irq.set_line(level);
        }
    }

    /// Drives PPI `intid` (16..32) of vCPU `cpu` to `level`, e.g. the virtual
    /// timer ([`VTIMER_INTID`](crate::arch::aarch64::VTIMER_INTID)).
    pub fn set_ppi_level(&mut self, cpu: usize, intid: u32, level: bool) {
        if (16..32).contains(&intid) {
            if let Some(c) = self.cpus.get_mut(cpu) {
                c.private[intid as usize].set_line(level);
            }
        }
    }

    /// Whether vCPU `cpu`'s IRQ input should be asserted now.
    pub fn irq_pending(&self, cpu: usize) -> bool {
        self.highest_pending(cpu).is_some_and(|(_, prio)| {
            let c = &self.cpus[cpu];
            prio < c.pmr && prio < c.running_priority()
        })
    }

    fn grp1_enabled(&self) -> bool {
        self.ctlr & regs::CTLR_ENABLE_GRP1 != 0
    }

    /// The vCPU an SPI is routed to.
    fn spi_target(&self, irq: &Irq) -> usize {
        if irq.route & (1 << 31) != 0 {
            return 0;
        }
        let aff = irq.route & 0xff_00ff_ffff;
        self.cpus
            .iter()
            .position(|c| c.mpidr & 0xff_00ff_ffff == aff)
            .unwrap_or(0)
    }

    /// The highest-priority deliverable interrupt for `cpu` (lowest INTID on
    /// ties), ignoring PMR and the running priority.
    fn highest_pending(&self, cpu: usize) -> Option<(u32, u8)> {
        let c = self.cpus.get(cpu)?;
        if !c.grpen1 || !self.grp1_enabled() {
            return None;
        }
        let ready = |irq: &Irq| irq.enabled && irq.group1 && irq.pending() && !irq.active;
        let private = c.private.iter().enumerate().map(|(i, irq)| (i as u32, irq));
        let shared = self
            .spis
            .iter()
            .enumerate()
            .filter(|(_, irq)| self.spi_target(irq) == cpu)
            .map(|(i, irq)| (i as u32 + 32, irq));
        private
            .chain(shared)
            .filter(|(_, irq)| ready(irq))
            .map(|(id, irq)| (id, irq.priority))
            .min_by_key(|&(id, prio)| (prio, id))
    }

    fn irq_mut(&mut self, cpu: usize, intid: u32) -> Option<&mut Irq> {
        match intid {
            0..32 => self
                .cpus
                .get_mut(cpu)
                .map(|c| &mut c.private[intid as usize]),
            _ => self.spis.get_mut(intid as usize - 32),
        }
    }
}
