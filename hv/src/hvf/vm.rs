//! [`HvfVm`]: the process's one VM — 16 KiB memory mappings, dirty tracking
//! by write protection, the GIC, and vCPU creation. It never calls a
//! vCPU-bound `hv_vcpu_*` function: those belong to each vCPU's thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use applevisor::prelude::{
    GicDisabled, HypervisorError, VirtualMachine, VirtualMachineConfig, VirtualMachineInstance,
};
use applevisor_sys::{
    hv_memory_flags_t, hv_vm_map, hv_vm_protect, hv_vm_unmap, HV_MEMORY_EXEC, HV_MEMORY_READ,
    HV_MEMORY_WRITE,
};
use vm_memory::bitmap::Bitmap;
use vm_memory::GuestRegionMmap;

use super::gic::Gic;
use super::kick::KickState;
use super::{HvfError, HvfVcpu, PAGE_SIZE};
use crate::memory::{DirtyTracker, Slot, SlotTable};
use crate::{DirtyLog, HvError, MapFlags, MemoryError, MemorySlot, Vm, VmConfig};

/// Most regions one VM maps (a bookkeeping limit; the framework has none).
pub(super) const MAX_SLOTS: u32 = 512;

/// Whether this process holds a VM.
static VM_EXISTS: AtomicBool = AtomicBool::new(false);

/// Held by the VM and each vCPU: the process may create a new VM once the
/// last of them is gone.
#[derive(Debug)]
struct VmToken;

impl VmToken {
    fn take() -> Result<Self, HvfError> {
        VM_EXISTS
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| Self)
            .map_err(|_| HvfError::VmExists)
    }
}

impl Drop for VmToken {
    fn drop(&mut self) {
        VM_EXISTS.store(false, Ordering::Release);
    }
}

pub(super) const RWX: hv_memory_flags_t = HV_MEMORY_READ | HV_MEMORY_WRITE | HV_MEMORY_EXEC;
pub(super) const RX: hv_memory_flags_t = HV_MEMORY_READ | HV_MEMORY_EXEC;

pub(super) fn check(what: &'static str, rc: i32) -> Result<(), HvfError> {
    match rc {
        0 => Ok(()),
        rc => Err(HvfError::Return(what, rc)),
    }
}

/// What the VM shares with its vCPUs.
#[derive(Debug)]
pub(super) struct Shared {
    pub slots: Mutex<SlotTable>,
    /// Dirty bitmaps of the slots mapped with `log_dirty`, by slot.
    pub dirty: Mutex<HashMap<u32, DirtyTracker>>,
    pub gic: Gic,
    /// Wake-up state of each vCPU, for interrupt delivery.
    pub vcpus: Mutex<Vec<Arc<KickState>>>,
    /// The virtual counter offset every vCPU shares (the first vCPU's):
    /// arm64 booting.rst wants CNTVOFF equal on all CPUs.
    pub vtimer_offset: std::sync::OnceLock<u64>,
    _token: VmToken,
}

impl Shared {
    pub fn slots(&self) -> MutexGuard<'_, SlotTable> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn dirty(&self) -> MutexGuard<'_, HashMap<u32, DirtyTracker>> {
        self.dirty.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes every vCPU but `except` re-evaluate its interrupts.
    pub fn wake_all(&self, except: Option<u32>, exit_running: bool) {
        let vcpus = self.vcpus.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for (i, k) in vcpus.iter().enumerate() {
            if Some(i as u32) != except {
                if exit_running {
                    k.wake();
                } else {
                    k.unpark();
                }
            }
        }
    }
}

/// The process's Hypervisor.framework VM. `Send + Sync`.
#[derive(Debug)]
pub struct HvfVm {
    instance: VirtualMachineInstance<GicDisabled>,
    pub(super) shared: Arc<Shared>,
}

impl HvfVm {
    pub(super) fn new(config: &VmConfig) -> Result<Self, HvError> {
        let token = VmToken::take()?;
        let instance =
            VirtualMachine::with_config(VirtualMachineConfig::new()).map_err(|e| match e {
                HypervisorError::Busy => HvfError::VmExists,
                e => HvfError::Call("hv_vm_create", e),
            })?;
        let gic = Gic::new(config.gic)?;
        let shared = Shared {
            slots: Mutex::new(SlotTable::new(PAGE_SIZE, MAX_SLOTS)),
            dirty: Mutex::new(HashMap::new()),
            gic,
            vcpus: Mutex::new(Vec::new()),
            vtimer_offset: std::sync::OnceLock::new(),
            _token: token,
        };
        Ok(Self {
            instance,
            shared: Arc::new(shared),
        })
    }

    pub(super) fn instance(&self) -> &VirtualMachineInstance<GicDisabled> {
        &self.instance
    }
}

fn map_flags(flags: MapFlags) -> hv_memory_flags_t {
    if flags.read_only || flags.log_dirty {
        RX // logged slots start write-protected: the first write faults
    } else {
        RWX
    }
}

impl Vm for HvfVm {
    type Vcpu = HvfVcpu;

    fn map_memory<B>(
        &self,
        region: &Arc<GuestRegionMmap<B>>,
        flags: MapFlags,
    ) -> Result<MemorySlot, HvError>
    where
        B: Bitmap + Send + Sync + 'static,
    {
        let slot = Slot::of_region(region, flags);
        let mut slots = self.shared.slots();
        let id = slots.insert(slot)?;
        let s = slots.get(id)?;
        // SAFETY: the slot table keeps the host mapping [host, host + size)
        // alive until the region is unmapped (hv_vm_unmap before removal)
        // or every vCPU and the VM are gone (the table lives in `Shared`).
        let rc = unsafe {
            hv_vm_map(
                s.host as *const _,
                s.guest,
                s.size as usize,
                map_flags(flags),
            )
        };
        if let Err(e) = check("hv_vm_map", rc) {
            let _ = slots.remove(id);
            return Err(e.into());
        }
        if flags.log_dirty {
            self.shared
                .dirty()
                .insert(id, DirtyTracker::new(s.guest, s.size, PAGE_SIZE));
        }
        Ok(MemorySlot(id))
    }

    fn unmap_memory(&self, slot: MemorySlot) -> Result<(), HvError> {
        let mut slots = self.shared.slots();
        let s = slots.get(slot.0)?;
        // SAFETY: unmapping a range this VM mapped has no host-side effect.
        check("hv_vm_unmap", unsafe {
            hv_vm_unmap(s.guest, s.size as usize)
        })?;
        slots.remove(slot.0)?;
        self.shared.dirty().remove(&slot.0);
        Ok(())
    }

    fn dirty_log(&self, slot: MemorySlot) -> Result<DirtyLog, HvError> {
        let mut dirty = self.shared.dirty();
        let tracker = dirty.get_mut(&slot.0).ok_or_else(|| {
            let exists = self.shared.slots().get(slot.0).is_ok();
            if exists {
                MemoryError::NotLogged(slot.0)
            } else {
                MemoryError::NoSuchSlot(slot.0)
            }
        })?;
        // Re-arm before handing the log out: a write after this faults again
        // and lands in the next log (the fault handler waits for this lock).
        let log = tracker.take();
        for page in log.dirty_pages() {
            // SAFETY: write-protecting a page of a mapped slot has no host-side effect.
            check("hv_vm_protect", unsafe {
                hv_vm_protect(page, PAGE_SIZE as usize, RX)
            })?;
        }
        Ok(log)
    }

    fn create_vcpu(&self, id: u32) -> Result<HvfVcpu, HvError> {
        HvfVcpu::new(self, id)
    }

    fn finalize(&self) -> Result<(), HvError> {
        Ok(())
    }

    fn set_irq_line(&self, line: u32, level: bool) -> Result<(), HvError> {
        let userspace = self.shared.gic.set_spi(line, level)?;
        // The userspace model needs running vCPUs to re-read their IRQ line;
        // the framework's GIC only needs WFI waiters woken.
        self.shared.wake_all(None, userspace);
        Ok(())
    }
}
