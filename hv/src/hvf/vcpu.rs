//! [`HvfVcpu`]: one thread-bound vCPU — the run loop, pending interrupt
//! and virtual-timer bookkeeping before each entry, read completion. It is
//! never touched from another thread: wake-ups go through [`super::kick`].

use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use applevisor::prelude::{ExitReason, InterruptType, Vcpu as HvVcpu};

use super::kick::{HvfKick, KickState};
use super::vm::Shared;
use super::{HvfError, HvfVm};
use crate::arch::aarch64::{mpidr_for, vtimer_asserted, SysReg, VTIMER_INTID};
use crate::syndrome::DataAbort;
use crate::{HvError, Regs, Vcpu, VcpuExit};

/// An MMIO load waiting for its data: the register it goes to and how.
#[derive(Debug)]
pub(super) struct PendingRead {
    pub abort: DataAbort,
}

/// A Hypervisor.framework vCPU. Not `Send`: every framework call on it must
/// come from the thread that created it.
#[derive(Debug)]
pub struct HvfVcpu {
    pub(super) vcpu: HvVcpu,
    pub(super) shared: Arc<Shared>,
    pub(super) kick: Arc<KickState>,
    pub(super) id: u32,
    /// This vCPU's index in the userspace GIC model, if the VM uses it.
    pub(super) gic_cpu: Option<usize>,
    pub(super) pending: Option<PendingRead>,
    /// The framework masked the virtual timer after it fired.
    vtimer_masked: bool,
    _thread_bound: PhantomData<*const ()>,
}

impl HvfVcpu {
    pub(super) fn new(vm: &HvfVm, id: u32) -> Result<Self, HvError> {
        let vcpu = vm
            .instance()
            .vcpu_create()
            .map_err(|e| HvfError::Call("hv_vcpu_create", e))?;
        let kick = Arc::new(KickState::new(vcpu.id()));
        let shared = Arc::clone(&vm.shared);
        let gic_cpu = shared
            .gic
            .userspace()
            .map(|(model, _)| model.lock().unwrap_or_else(|e| e.into_inner()).add_vcpu(id));
        {
            let mut vcpus = shared.vcpus.lock().unwrap_or_else(|e| e.into_inner());
            let index = id as usize;
            if vcpus.len() <= index {
                vcpus.resize_with(index + 1, || Arc::new(KickState::retired()));
            }
            vcpus[index] = Arc::clone(&kick);
        }
        let this = Self {
            vcpu,
            shared,
            kick,
            id,
            gic_cpu,
            pending: None,
            vtimer_masked: false,
            _thread_bound: PhantomData,
        };
        this.set_sys_reg(SysReg::MPIDR_EL1, mpidr_for(id))?;
        let own = this
            .vcpu
            .get_vtimer_offset()
            .map_err(|e| HvfError::Call("hv_vcpu_get_vtimer_offset", e))?;
        let common = *this.shared.vtimer_offset.get_or_init(|| own);
        if common != own {
            this.vcpu
                .set_vtimer_offset(common)
                .map_err(|e| HvfError::Call("hv_vcpu_set_vtimer_offset", e))?;
        }
        Ok(this)
    }

    /// Unmasks the virtual timer once the guest has dealt with it, and keeps
    /// the userspace GIC's timer PPI level in step.
    fn sync_vtimer(&mut self) -> Result<(), HvError> {
        if !self.vtimer_masked {
            return Ok(());
        }
        if vtimer_asserted(self.get_sys_reg(SysReg::CNTV_CTL_EL0)?) {
            return Ok(());
        }
        if let (Some(cpu), Some((model, _))) = (self.gic_cpu, self.shared.gic.userspace()) {
            model
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_ppi_level(cpu, VTIMER_INTID, false);
        }
        self.vcpu
            .set_vtimer_mask(false)
            .map_err(|e| HvfError::Call("hv_vcpu_set_vtimer_mask", e))?;
        self.vtimer_masked = false;
        Ok(())
    }

    fn vtimer_fired(&mut self) {
        self.vtimer_masked = true;
        if let (Some(cpu), Some((model, _))) = (self.gic_cpu, self.shared.gic.userspace()) {
            model
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .set_ppi_level(cpu, VTIMER_INTID, true);
        }
    }

    /// Asserts the IRQ input when the userspace GIC has something for us
    /// (the framework clears it after every run).
    fn sync_irq_line(&self) -> Result<(), HvError> {
        if let (Some(cpu), Some((model, _))) = (self.gic_cpu, self.shared.gic.userspace()) {
            let pending = model
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .irq_pending(cpu);
            self.vcpu
                .set_pending_interrupt(InterruptType::IRQ, pending)
                .map_err(|e| HvfError::Call("hv_vcpu_set_pending_interrupt", e))?;
        }
        Ok(())
    }
}

impl Drop for HvfVcpu {
    fn drop(&mut self) {
        self.kick.retire();
    }
}

impl Vcpu for HvfVcpu {
    type Kick = HvfKick;

    fn id(&self) -> u32 {
        self.id
    }

    fn run(&mut self) -> Result<VcpuExit, HvError> {
        if self.pending.is_some() {
            self.complete_read(&[0; 8][..self.pending.as_ref().map_or(0, |p| p.abort.size)])?;
        }
        loop {
            if self.kick.requested.swap(false, Ordering::AcqRel) {
                return Ok(VcpuExit::Cancelled);
            }
            self.sync_vtimer()?;
            self.sync_irq_line()?;
            self.vcpu
                .run()
                .map_err(|e| HvfError::Call("hv_vcpu_run", e))?;
            let exit = self.vcpu.get_exit_info();
            match exit.reason {
                // A kick (checked at the top) or an interrupt wake-up.
                ExitReason::CANCELED => {}
                ExitReason::EXCEPTION => {
                    if let Some(exit) = self.handle_exception(&exit.exception)? {
                        return Ok(exit);
                    }
                }
                ExitReason::VTIMER_ACTIVATED => self.vtimer_fired(),
                ExitReason::UNKNOWN => {
                    return Ok(VcpuExit::Unknown {
                        what: "hypervisor.framework exit reason unknown".into(),
                    })
                }
            }
        }
    }

    fn complete_read(&mut self, data: &[u8]) -> Result<(), HvError> {
        let pending = self.pending.take().ok_or(HvError::NoPendingRead)?;
        let want = pending.abort.size;
        if data.len() != want {
            self.pending = Some(pending);
            return Err(HvError::ReadLength {
                want,
                got: data.len(),
            });
        }
        let mut bytes = [0u8; 8];
        bytes[..want].copy_from_slice(data);
        let value = pending.abort.load_value(u64::from_le_bytes(bytes));
        Ok(self.set_x(pending.abort.reg, value)?)
    }

    fn get_regs(&self) -> Result<Regs, HvError> {
        self.read_regs()
    }

    fn set_regs(&mut self, regs: &Regs) -> Result<(), HvError> {
        self.write_regs(regs)
    }

    fn kick_handle(&self) -> HvfKick {
        HvfKick(Arc::clone(&self.kick))
    }
}
