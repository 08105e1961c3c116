//! Trapped exceptions on Hypervisor.framework: the syndrome (decoded by the
//! portable [`crate::syndrome`]) becomes an MMIO exit, a dirty-page mark, a
//! PSCI answer, a WFI wait, or a userspace-GIC access. Returns `None` when
//! the guest just continues.

use std::sync::atomic::Ordering;
use std::time::Duration;

use applevisor_sys::{hv_vcpu_exit_exception_t, hv_vm_protect};

use super::gic::{frame, GicFrame};
use super::vcpu::PendingRead;
use super::vm::{check, RWX};
use super::{HvfError, HvfVcpu, PAGE_SIZE};
use crate::arch::aarch64::SysReg;
use crate::psci::PsciCall;
use crate::syndrome::{DataAbort, FaultKind, Syndrome, SysRegAccess};
use crate::{HvError, IoData, SystemEvent, VcpuExit};

/// Longest WFI wait before looking again (the framework's GIC cannot be
/// asked whether an SGI is pending, so its waits stay short).
const FRAMEWORK_GIC_WFI: Duration = Duration::from_millis(10);
const USERSPACE_WFI: Duration = Duration::from_secs(1);

type Handled = Result<Option<VcpuExit>, HvError>;

fn internal(reason: String) -> Handled {
    Ok(Some(VcpuExit::InternalError { reason }))
}

impl HvfVcpu {
    pub(super) fn handle_exception(&mut self, e: &hv_vcpu_exit_exception_t) -> Handled {
        match Syndrome::decode(e.syndrome) {
            Syndrome::DataAbort(abort) => self.data_abort(abort, e.physical_address),
            Syndrome::Hvc { .. } => self.psci(),
            Syndrome::Smc { .. } => {
                self.advance_pc()?; // unlike HVC, a trapped SMC returns to itself
                self.psci()
            }
            Syndrome::Wfx { wfe } => {
                self.advance_pc()?;
                if !wfe {
                    self.wait_for_interrupt()?;
                }
                Ok(None)
            }
            Syndrome::SysReg(access) => self.sysreg(access),
            Syndrome::InstructionAbort { fault } => internal(format!(
                "instruction fetch from ipa {:#x} failed ({fault:?})",
                e.physical_address
            )),
            Syndrome::Brk { imm } => Ok(Some(VcpuExit::Unknown {
                what: format!("brk #{imm:#x} at ipa {:#x}", e.physical_address),
            })),
            Syndrome::Other { ec, iss } => Ok(Some(VcpuExit::Unknown {
                what: format!("exception class {ec:#x} (iss {iss:#x})"),
            })),
        }
    }

    fn data_abort(&mut self, abort: DataAbort, ipa: u64) -> Handled {
        if abort.write
            && matches!(abort.fault, FaultKind::Permission { .. })
            && self.mark_dirty(ipa)?
        {
            return Ok(None); // the store is retried on the now-writable page
        }
        if !abort.valid {
            return internal(format!(
                "data abort at ipa {ipa:#x} without a valid syndrome (cannot emulate)"
            ));
        }
        if let Some((model, config)) = self.shared.gic.userspace() {
            let mut gic = model.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(f) = frame(config, gic.vcpus(), ipa) {
                if abort.write {
                    let value = self.x(abort.reg)?;
                    match f {
                        GicFrame::Distributor(off) => gic.dist_write(off, abort.size, value),
                        GicFrame::Redistributor(off) => gic.redist_write(off, abort.size, value),
                    }
                    drop(gic);
                    self.shared.wake_all(Some(self.id), true);
                } else {
                    let value = match f {
                        GicFrame::Distributor(off) => gic.dist_read(off, abort.size),
                        GicFrame::Redistributor(off) => gic.redist_read(off, abort.size),
                    };
                    self.set_x(abort.reg, abort.load_value(value))?;
                }
                self.advance_pc()?;
                return Ok(None);
            }
        }
        self.advance_pc()?;
        if abort.write {
            let value = self.x(abort.reg)?.to_le_bytes();
            let data = IoData::new(&value[..abort.size]);
            return Ok(Some(VcpuExit::Mmio {
                addr: ipa,
                len: abort.size,
                write: data,
            }));
        }
        self.pending = Some(PendingRead { abort });
        Ok(Some(VcpuExit::Mmio {
            addr: ipa,
            len: abort.size,
            write: None,
        }))
    }

    /// A write fault on a write-protected page of a logged slot: record the
    /// page and open it for writing. `false` when `ipa` is not in one.
    fn mark_dirty(&self, ipa: u64) -> Result<bool, HvError> {
        let slots = self.shared.slots();
        let Some((id, slot)) = slots.find(ipa) else {
            return Ok(false);
        };
        if !slot.flags.log_dirty || slot.flags.read_only {
            return Ok(false);
        }
        let mut dirty = self.shared.dirty();
        let Some(tracker) = dirty.get_mut(&id) else {
            return Ok(false);
        };
        tracker.mark(ipa);
        let page = ipa & !(PAGE_SIZE - 1);
        // SAFETY: re-opening a page of a slot this VM mapped has no host-side effect.
        check("hv_vm_protect", unsafe {
            hv_vm_protect(page, PAGE_SIZE as usize, RWX)
        })?;
        Ok(true)
    }

    fn psci(&mut self) -> Handled {
        let x = [self.x(0)?, self.x(1)?, self.x(2)?, self.x(3)?];
        let call = PsciCall::decode(x);
        match call {
            PsciCall::SystemOff => Ok(Some(VcpuExit::SystemEvent(SystemEvent::Poweroff))),
            PsciCall::SystemReset => Ok(Some(VcpuExit::SystemEvent(SystemEvent::Reset))),
            // Standby or powerdown alike, as KVM does: wait like WFI, then
            // return success (a powerdown resume from its entry point is
            // optional for the PSCI caller).
            PsciCall::CpuSuspend { .. } => {
                self.wait_for_interrupt()?;
                self.set_x(0, 0)?;
                Ok(None)
            }
            _ => match call.stateless_answer() {
                Some(answer) => {
                    self.set_x(0, answer as u64)?;
                    Ok(None)
                }
                None => Ok(Some(VcpuExit::Psci(call))),
            },
        }
    }

    /// Trapped MSR/MRS: the userspace GIC's CPU interface, else RAZ/WI.
    fn sysreg(&mut self, access: SysRegAccess) -> Handled {
        let model = self.gic_cpu.zip(self.shared.gic.userspace());
        if access.read {
            let value = model
                .and_then(|(cpu, (m, _))| {
                    m.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .sysreg_read(cpu, access.reg)
                })
                .unwrap_or(0);
            self.set_x(access.rt, value)?;
        } else if let Some((cpu, (m, _))) = model {
            let value = self.x(access.rt)?;
            let handled = m
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sysreg_write(cpu, access.reg, value);
            if handled && access.reg == SysReg::ICC_SGI1R_EL1 {
                self.shared.wake_all(Some(self.id), true);
            }
        }
        self.advance_pc()?;
        Ok(None)
    }

    /// WFI: returns once an interrupt may be pending, the virtual timer's
    /// deadline passes, or a kick arrives (the run loop then sees it).
    fn wait_for_interrupt(&self) -> Result<(), HvError> {
        let userspace = self.gic_cpu.zip(self.shared.gic.userspace());
        loop {
            if self.kick.requested.load(Ordering::Acquire) {
                return Ok(());
            }
            if let Some((cpu, (m, _))) = userspace {
                if m.lock().unwrap_or_else(|e| e.into_inner()).irq_pending(cpu) {
                    return Ok(());
                }
            }
            let cap = if userspace.is_some() {
                USERSPACE_WFI
            } else {
                FRAMEWORK_GIC_WFI
            };
            let timer = self.vtimer_remaining()?;
            if timer == Some(Duration::ZERO) {
                return Ok(());
            }
            let wait = timer.map_or(cap, |t| t.min(cap));
            let woken = self.kick.park(wait);
            if woken || userspace.is_none() || Some(wait) == timer {
                return Ok(());
            }
        }
    }

    /// Time until the virtual timer fires, `None` when it is off or masked.
    fn vtimer_remaining(&self) -> Result<Option<Duration>, HvError> {
        let ctl = self.get_sys_reg(SysReg::CNTV_CTL_EL0)?;
        if ctl & 0b11 != 0b01 {
            return Ok(None);
        }
        let cval = self.get_sys_reg(SysReg::CNTV_CVAL_EL0)?;
        let offset = self
            .vcpu
            .get_vtimer_offset()
            .map_err(|e| HvfError::Call("hv_vcpu_get_vtimer_offset", e))?;
        let (count, freq) = host_counter();
        let ticks = cval.saturating_sub(count.wrapping_sub(offset));
        let nanos = u128::from(ticks) * 1_000_000_000 / u128::from(freq.max(1));
        Ok(Some(
            Duration::from_nanos(nanos.min(u64::MAX.into()) as u64),
        ))
    }
}

/// The host's virtual counter (CNTVCT_EL0) and its frequency (CNTFRQ_EL0);
/// the guest's counter is this minus the vCPU's vtimer offset.
fn host_counter() -> (u64, u64) {
    let (count, freq): (u64, u64);
    // SAFETY: both registers are readable at EL0 on macOS (they back
    // mach_absolute_time); the reads touch no memory.
    unsafe {
        std::arch::asm!(
            "isb",
            "mrs {0}, cntvct_el0",
            "mrs {1}, cntfrq_el0",
            out(reg) count,
            out(reg) freq,
            options(nomem, nostack),
        );
    }
    (count, freq)
}
