//! The GICv3 CPU interface: trapped `ICC_*_EL1` system-register accesses.

use super::{GicV3, PRIORITY_MASK, SPURIOUS};
use crate::arch::aarch64::SysReg;

/// ICC_SRE_EL1: SRE, DFB, DIB set (system registers only).
const SRE: u64 = 0b111;
/// ICC_CTLR_EL1 read-only part: PRIbits = 4 (5 bits), IDbits = 0 (16), A3V.
const CTLR_RO: u64 = (4 << 8) | (1 << 15);
/// ICC_CTLR_EL1.EOImode.
const CTLR_EOIMODE: u64 = 1 << 1;

impl GicV3 {
    /// A trapped MRS of `reg` by vCPU `cpu`: the value to load, or `None`
    /// when `reg` is not a CPU-interface register this model implements.
    pub fn sysreg_read(&mut self, cpu: usize, reg: SysReg) -> Option<u64> {
        let c = self.cpus.get(cpu)?;
        Some(match reg {
            SysReg::ICC_SRE_EL1 => SRE,
            SysReg::ICC_CTLR_EL1 => CTLR_RO | if c.eoi_mode { CTLR_EOIMODE } else { 0 },
            SysReg::ICC_PMR_EL1 => c.pmr.into(),
            SysReg::ICC_BPR1_EL1 => c.bpr1,
            SysReg::ICC_BPR0_EL1 => 0,
            SysReg::ICC_IGRPEN1_EL1 => c.grpen1.into(),
            SysReg::ICC_IGRPEN0_EL1 => c.grpen0.into(),
            SysReg::ICC_RPR_EL1 => c.running_priority().into(),
            SysReg::ICC_AP1R0_EL1 => c.ap1r0,
            SysReg::ICC_AP0R0_EL1 => 0,
            SysReg::ICC_IAR1_EL1 => self.acknowledge(cpu).into(),
            SysReg::ICC_HPPIR1_EL1 => self
                .highest_pending(cpu)
                .map_or(SPURIOUS, |(id, _)| id)
                .into(),
            SysReg::ICC_IAR0_EL1 | SysReg::ICC_HPPIR0_EL1 => SPURIOUS.into(),
            _ => return None,
        })
    }

    /// A trapped MSR of `value` to `reg` by vCPU `cpu`; `false` when `reg`
    /// is not a CPU-interface register this model implements.
    pub fn sysreg_write(&mut self, cpu: usize, reg: SysReg, value: u64) -> bool {
        if cpu >= self.cpus.len() {
            return false;
        }
        if reg == SysReg::ICC_SGI1R_EL1 || reg == SysReg::ICC_ASGI1R_EL1 {
            self.generate_sgi(cpu, value);
            return true;
        }
        let c = &mut self.cpus[cpu];
        match reg {
            SysReg::ICC_PMR_EL1 => c.pmr = value as u8 & PRIORITY_MASK,
            SysReg::ICC_BPR1_EL1 => c.bpr1 = value & 7,
            SysReg::ICC_IGRPEN1_EL1 => c.grpen1 = value & 1 != 0,
            SysReg::ICC_IGRPEN0_EL1 => c.grpen0 = value & 1 != 0,
            SysReg::ICC_CTLR_EL1 => c.eoi_mode = value & CTLR_EOIMODE != 0,
            SysReg::ICC_AP1R0_EL1 => c.ap1r0 = value & 0xffff_ffff,
            SysReg::ICC_EOIR1_EL1 => self.end_of_interrupt(cpu, value as u32 & 0xff_ffff),
            SysReg::ICC_DIR_EL1 => self.deactivate(cpu, value as u32 & 0xff_ffff),
            SysReg::ICC_SRE_EL1
            | SysReg::ICC_BPR0_EL1
            | SysReg::ICC_AP0R0_EL1
            | SysReg::ICC_EOIR0_EL1
            | SysReg::ICC_SGI0R_EL1 => {}
            _ => return false,
        }
        true
    }

    /// ICC_IAR1_EL1: takes the highest-priority deliverable interrupt,
    /// makes it active and raises the running priority to its priority.
    fn acknowledge(&mut self, cpu: usize) -> u32 {
        if !self.irq_pending(cpu) {
            return SPURIOUS;
        }
        let Some((intid, prio)) = self.highest_pending(cpu) else {
            return SPURIOUS;
        };
        if let Some(irq) = self.irq_mut(cpu, intid) {
            irq.active = true;
            irq.latched = false;
        }
        let c = &mut self.cpus[cpu];
        c.running.push((intid, prio));
        c.ap1r0 |= 1 << (prio >> 3);
        intid
    }

    /// ICC_EOIR1_EL1: drops the running priority of `intid`; with EOImode 0
    /// it also deactivates it.
    fn end_of_interrupt(&mut self, cpu: usize, intid: u32) {
        let c = &mut self.cpus[cpu];
        if let Some(pos) = c.running.iter().rposition(|&(id, _)| id == intid) {
            let (_, prio) = c.running.remove(pos);
            if !c.running.iter().any(|&(_, p)| p == prio) {
                c.ap1r0 &= !(1 << (prio >> 3));
            }
        }
        if !c.eoi_mode {
            self.deactivate(cpu, intid);
        }
    }

    /// ICC_DIR_EL1 (or EOI with EOImode 0): clears the active state.
    fn deactivate(&mut self, cpu: usize, intid: u32) {
        if let Some(irq) = self.irq_mut(cpu, intid) {
            irq.active = false;
        }
    }

    /// ICC_SGI1R_EL1: makes SGI `INTID` pending on the listed vCPUs (or all
    /// others, IRM).
    fn generate_sgi(&mut self, from: usize, value: u64) {
        let intid = ((value >> 24) & 0xf) as usize;
        let all_others = value & (1 << 40) != 0;
        let targets = value & 0xffff;
        let aff1 = (value >> 16) & 0xff;
        let aff2 = (value >> 32) & 0xff;
        let aff3 = (value >> 48) & 0xff;
        let rs = (value >> 44) & 0xf;
        for (i, c) in self.cpus.iter_mut().enumerate() {
            let m = c.mpidr;
            let hit = if all_others {
                i != from
            } else {
                let aff0 = m & 0xff;
                (m >> 8) & 0xff == aff1
                    && (m >> 16) & 0xff == aff2
                    && (m >> 32) & 0xff == aff3
                    && aff0 >> 4 == rs
                    && targets & (1 << (aff0 & 0xf)) != 0
            };
            if hit {
                c.private[intid].latched = true;
            }
        }
    }
}
