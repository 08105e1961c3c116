//! [`KvmVm`]: one KVM VM — memory slots, interrupt lines, vCPU creation.
//! It never lets KVM reach host memory it does not keep alive (see the
//! slot table's owner references).

use std::sync::{Arc, Mutex, MutexGuard};

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES, KVM_MEM_READONLY};
use kvm_ioctls::VmFd;
use vm_memory::bitmap::Bitmap;
use vm_memory::GuestRegionMmap;
use vmm_sys_util::eventfd::EventFd;

#[cfg(target_arch = "aarch64")]
use super::aarch64 as arch;
#[cfg(target_arch = "x86_64")]
use super::x86_64 as arch;
use super::{KvmError, KvmVcpu};
use crate::memory::{Slot, SlotTable};
use crate::{DirtyLog, HvError, MapFlags, MemoryError, MemorySlot, Vm, VmConfig};

/// A KVM VM. `Send + Sync`: share it with the vCPU threads.
pub struct KvmVm {
    pub(super) fd: VmFd,
    pub(super) arch: arch::VmArch,
    /// Shared with the vCPUs: host memory outlives every vCPU that can reach it.
    pub(super) slots: Arc<Mutex<SlotTable>>,
    page_size: u64,
}

impl std::fmt::Debug for KvmVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvmVm")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

impl KvmVm {
    pub(super) fn new(kvm: Arc<kvm_ioctls::Kvm>, config: &VmConfig) -> Result<Self, HvError> {
        let fd = kvm.create_vm().map_err(KvmError::CreateVm)?;
        let arch = arch::VmArch::new(&kvm, &fd, config)?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let limit = kvm.get_nr_memslots().min(u16::MAX.into()) as u32;
        Ok(Self {
            fd,
            arch,
            slots: Arc::new(Mutex::new(SlotTable::new(page_size, limit))),
            page_size,
        })
    }

    /// The underlying `kvm-ioctls` VM, for what this crate does not wrap.
    pub fn raw(&self) -> &VmFd {
        &self.fd
    }

    /// Makes every write to `event` pulse interrupt line `line` (numbered as
    /// in [`Vm::set_irq_line`]) without a trip through userspace.
    pub fn register_irqfd(&self, event: &EventFd, line: u32) -> Result<(), HvError> {
        self.fd
            .register_irqfd(event, line)
            .map_err(|e| KvmError::IrqLine(line, e))?;
        Ok(())
    }

    /// Makes every 4-byte guest write of `value` to the MMIO address `addr`
    /// signal `event` inside the kernel, the vCPU going on without an exit
    /// to userspace (a virtio-mmio `QueueNotify`); writes of other values
    /// or sizes exit as before.
    pub fn register_ioevent(&self, event: &EventFd, addr: u64, value: u32) -> Result<(), HvError> {
        self.fd
            .register_ioevent(event, &kvm_ioctls::IoEventAddress::Mmio(addr), value)
            .map_err(|e| KvmError::IoEvent(addr, e))?;
        Ok(())
    }

    /// Undoes [`register_irqfd`](Self::register_irqfd).
    pub fn unregister_irqfd(&self, event: &EventFd, line: u32) -> Result<(), HvError> {
        self.fd
            .unregister_irqfd(event, line)
            .map_err(|e| KvmError::IrqLine(line, e))?;
        Ok(())
    }

    fn slots(&self) -> MutexGuard<'_, SlotTable> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_region(&self, id: u32, slot: &Slot, size: u64) -> Result<(), KvmError> {
        let mut flags = 0;
        if slot.flags.read_only {
            flags |= KVM_MEM_READONLY;
        }
        if slot.flags.log_dirty {
            flags |= KVM_MEM_LOG_DIRTY_PAGES;
        }
        let region = kvm_userspace_memory_region {
            slot: id,
            flags,
            guest_phys_addr: slot.guest,
            memory_size: size,
            userspace_addr: slot.host as u64,
        };
        // SAFETY: `slot` keeps the host mapping [host, host + size) alive
        // (its owner Arc) for as long as the slot table holds it; the entry
        // is removed only after KVM has dropped the region (size 0), and the
        // table itself lives until the VM and every vCPU (which may keep the
        // kernel VM alive) are gone — so the guest never reaches freed memory.
        unsafe { self.fd.set_user_memory_region(region) }
            .map_err(|e| KvmError::MapMemory(slot.guest, e))
    }
}

impl Vm for KvmVm {
    type Vcpu = KvmVcpu;

    fn map_memory<B>(
        &self,
        region: &Arc<GuestRegionMmap<B>>,
        flags: MapFlags,
    ) -> Result<MemorySlot, HvError>
    where
        B: Bitmap + Send + Sync + 'static,
    {
        let slot = Slot::of_region(region, flags);
        let mut slots = self.slots();
        let id = slots.insert(slot)?;
        let slot = slots.get(id)?;
        if let Err(e) = self.set_region(id, slot, slot.size) {
            let _ = slots.remove(id);
            return Err(e.into());
        }
        Ok(MemorySlot(id))
    }

    fn unmap_memory(&self, slot: MemorySlot) -> Result<(), HvError> {
        let mut slots = self.slots();
        self.set_region(slot.0, slots.get(slot.0)?, 0)?;
        slots.remove(slot.0)?;
        Ok(())
    }

    fn dirty_log(&self, slot: MemorySlot) -> Result<DirtyLog, HvError> {
        let slots = self.slots();
        let s = slots.get(slot.0)?;
        if !s.flags.log_dirty {
            return Err(MemoryError::NotLogged(slot.0).into());
        }
        let bitmap = self
            .fd
            .get_dirty_log(slot.0, s.size as usize)
            .map_err(|e| KvmError::DirtyLog(slot.0, e))?;
        let pages = (s.size / self.page_size) as usize;
        Ok(DirtyLog::new(s.guest, self.page_size, pages, bitmap))
    }

    fn create_vcpu(&self, id: u32) -> Result<KvmVcpu, HvError> {
        KvmVcpu::new(self, id)
    }

    fn finalize(&self) -> Result<(), HvError> {
        self.arch.finalize()
    }

    fn set_irq_line(&self, line: u32, level: bool) -> Result<(), HvError> {
        self.fd
            .set_irq_line(arch::irq_line_number(line), level)
            .map_err(|e| KvmError::IrqLine(line, e))?;
        Ok(())
    }
}
