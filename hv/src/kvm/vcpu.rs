//! [`KvmVcpu`]: one KVM vCPU — `KVM_RUN`, exit translation, read completion.
//! It never hands out references into `kvm_run`: exits are copied out.

use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    KVM_INTERNAL_ERROR_EMULATION, KVM_SYSTEM_EVENT_CRASH, KVM_SYSTEM_EVENT_RESET,
    KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit as KvmExit, VcpuFd};

#[cfg(target_arch = "aarch64")]
use super::aarch64 as arch;
use super::kick::{self, KickState};
#[cfg(target_arch = "x86_64")]
use super::x86_64 as arch;
use super::{KvmError, KvmKick, KvmVm};
use crate::memory::SlotTable;
use crate::{HvError, IoData, Regs, SystemEvent, Vcpu, VcpuExit};

/// A read exit waiting for its data: where in `kvm_run` the data goes.
#[derive(Debug)]
struct PendingRead {
    data: *mut u8,
    len: usize,
}

/// A KVM vCPU. Not `Send`: it stays on the thread that created it.
///
/// ```compile_fail
/// fn is_send<T: Send>() {}
/// is_send::<boxdesk_hv::kvm::KvmVcpu>();
/// ```
#[derive(Debug)]
pub struct KvmVcpu {
    pub(super) fd: VcpuFd,
    id: u32,
    kick: Arc<KickState>,
    pending: Option<PendingRead>,
    _memory: Arc<Mutex<SlotTable>>,
    _thread_bound: PhantomData<*const ()>,
}

impl KvmVcpu {
    pub(super) fn new(vm: &KvmVm, id: u32) -> Result<Self, HvError> {
        kick::prepare_thread()?;
        let fd = vm
            .fd
            .create_vcpu(id.into())
            .map_err(|e| KvmError::CreateVcpu(id, e))?;
        arch::init_vcpu(vm, &fd, id)?;
        Ok(Self {
            fd,
            id,
            kick: KickState::for_this_thread(),
            pending: None,
            _memory: Arc::clone(&vm.slots),
            _thread_bound: PhantomData,
        })
    }

    /// The underlying `kvm-ioctls` vCPU, for what this crate does not wrap.
    pub fn raw(&self) -> &VcpuFd {
        &self.fd
    }

    fn enter(&mut self) -> Result<VcpuExit, HvError> {
        loop {
            if self.kick.requested.swap(false, Ordering::AcqRel) {
                self.fd.set_kvm_immediate_exit(0);
                return Ok(VcpuExit::Cancelled);
            }
            let (exit, pending) = match self.fd.run() {
                Ok(exit) => translate(exit),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    // A kick (flag checked above) or a foreign signal: re-arm.
                    self.fd.set_kvm_immediate_exit(0);
                    continue;
                }
                // A page of a memory slot the host cannot fault in (a file
                // mapping past the file's end); the guest state is intact.
                Err(e) if e.errno() == libc::EFAULT => return Ok(VcpuExit::MemoryFault),
                Err(e) => return Err(KvmError::Run(e).into()),
            };
            self.pending = pending;
            return Ok(match exit {
                Step::Done(exit) => exit,
                Step::Internal => self.internal_error(),
                Step::StringIo => VcpuExit::Unknown {
                    what: "string port i/o (rep ins/outs)".into(),
                },
            });
        }
    }

    fn internal_error(&mut self) -> VcpuExit {
        let run = self.fd.get_kvm_run();
        // SAFETY: exit_reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is
        // the union member the kernel filled.
        let internal = unsafe { run.__bindgen_anon_1.internal };
        let n = (internal.ndata as usize).min(internal.data.len());
        let what = if internal.suberror == KVM_INTERNAL_ERROR_EMULATION {
            "emulation failure: kvm could not emulate an instruction"
        } else {
            "kvm internal error"
        };
        VcpuExit::InternalError {
            reason: format!(
                "{what} (suberror {}, data {:x?})",
                internal.suberror,
                &internal.data[..n]
            ),
        }
    }
}

impl Drop for KvmVcpu {
    fn drop(&mut self) {
        self.kick.retire();
    }
}

/// A translated exit, before anything needs `kvm_run` again.
enum Step {
    Done(VcpuExit),
    Internal,
    StringIo,
}

fn io(data: &[u8]) -> Option<IoData> {
    IoData::new(data)
}

/// Turns a kvm-ioctls exit into owned data; reads are zero-filled (what an
/// unanswered read loads) and remembered for `complete_read`.
fn translate(exit: KvmExit<'_>) -> (Step, Option<PendingRead>) {
    let done = |e| (Step::Done(e), None);
    match exit {
        KvmExit::IoOut(port, data) => match io(data).filter(|_| data.len() <= 4) {
            Some(d) => done(VcpuExit::Pio {
                port,
                len: data.len(),
                write: Some(d),
            }),
            None => (Step::StringIo, None),
        },
        KvmExit::IoIn(port, data) if data.len() <= 4 => {
            data.fill(0);
            let pending = PendingRead {
                data: data.as_mut_ptr(),
                len: data.len(),
            };
            let exit = VcpuExit::Pio {
                port,
                len: data.len(),
                write: None,
            };
            (Step::Done(exit), Some(pending))
        }
        KvmExit::IoIn(..) => (Step::StringIo, None),
        KvmExit::MmioWrite(addr, data) => done(VcpuExit::Mmio {
            addr,
            len: data.len(),
            write: io(data),
        }),
        KvmExit::MmioRead(addr, data) => {
            data.fill(0);
            let pending = PendingRead {
                data: data.as_mut_ptr(),
                len: data.len(),
            };
            let exit = VcpuExit::Mmio {
                addr,
                len: data.len(),
                write: None,
            };
            (Step::Done(exit), Some(pending))
        }
        KvmExit::Hlt => done(VcpuExit::Hlt),
        KvmExit::Shutdown => done(VcpuExit::Shutdown),
        KvmExit::SystemEvent(kind, _) => done(match kind {
            KVM_SYSTEM_EVENT_SHUTDOWN => VcpuExit::SystemEvent(SystemEvent::Poweroff),
            KVM_SYSTEM_EVENT_RESET => VcpuExit::SystemEvent(SystemEvent::Reset),
            KVM_SYSTEM_EVENT_CRASH => VcpuExit::SystemEvent(SystemEvent::Crash),
            other => VcpuExit::Unknown {
                what: format!("system event {other}"),
            },
        }),
        KvmExit::InternalError => (Step::Internal, None),
        KvmExit::FailEntry(reason, _) => done(VcpuExit::FailEntry { reason }),
        other => done(VcpuExit::Unknown {
            what: format!("{other:?}"),
        }),
    }
}

impl Vcpu for KvmVcpu {
    type Kick = KvmKick;

    fn id(&self) -> u32 {
        self.id
    }

    fn run(&mut self) -> Result<VcpuExit, HvError> {
        self.pending = None;
        kick::set_running(self.fd.get_kvm_run());
        let exit = self.enter();
        kick::set_running(std::ptr::null_mut());
        exit
    }

    fn complete_read(&mut self, data: &[u8]) -> Result<(), HvError> {
        let pending = self.pending.take().ok_or(HvError::NoPendingRead)?;
        if data.len() != pending.len {
            let want = pending.len;
            self.pending = Some(pending);
            return Err(HvError::ReadLength {
                want,
                got: data.len(),
            });
        }
        // SAFETY: `pending.data` points at `len` bytes of the kvm_run mapping
        // that `self.fd` owns (alive: we hold &mut self), recorded at the
        // last exit; no reference into kvm_run is live now, and the kernel
        // reads it only on the next KVM_RUN.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), pending.data, data.len()) };
        Ok(())
    }

    fn get_regs(&self) -> Result<Regs, HvError> {
        arch::get_regs(&self.fd)
    }

    fn set_regs(&mut self, regs: &Regs) -> Result<(), HvError> {
        arch::set_regs(&self.fd, regs)
    }

    fn kick_handle(&self) -> KvmKick {
        KvmKick(Arc::clone(&self.kick))
    }
}
