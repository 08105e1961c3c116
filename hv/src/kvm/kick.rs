//! [`KvmKick`]: stopping a vCPU that may be inside `KVM_RUN`, from any thread.
//!
//! Owns the kick signal's handler and the per-thread pointer it uses. The
//! handler only ever writes `immediate_exit` of the `kvm_run` page of the
//! vCPU currently inside [`KvmVcpu::run`](super::KvmVcpu) on that thread;
//! nothing else here touches a vCPU.

use std::cell::Cell;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use kvm_bindings::kvm_run;

use super::KvmError;
use crate::VcpuKick;

thread_local! {
    /// `kvm_run` of the vCPU this thread is running, or null.
    static RUNNING: Cell<*mut kvm_run> = const { Cell::new(ptr::null_mut()) };
}

/// The signal that kicks vCPU threads: SIGRTMIN. The VMM must not use it.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let run = RUNNING.with(Cell::get);
    if !run.is_null() {
        // SAFETY: RUNNING is set by KvmVcpu::run on this very thread to its
        // own kvm_run mapping for exactly the span of the run call, during
        // which the mapping is alive. A volatile byte store is what KVM's
        // documentation prescribes for immediate_exit from a signal handler.
        unsafe { ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

/// Installs the handler (once per process) and unblocks the signal on the
/// calling thread, which will run a vCPU.
pub(super) fn prepare_thread() -> Result<(), KvmError> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed = INSTALLED.get_or_init(|| {
        // SAFETY: zeroed sigaction is a valid "no flags, empty mask" value;
        // the handler is an extern "C" fn with the SA_SIGINFO signature and
        // does nothing that is not async-signal-safe (one volatile store).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_kick as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO; // no SA_RESTART: KVM_RUN must return EINTR
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(kick_signal(), &act, ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    if let Err(errno) = installed {
        return Err(KvmError::Signal(io::Error::from_raw_os_error(*errno)));
    }
    // SAFETY: the set is initialised by sigemptyset before use and only
    // names our signal; pthread_sigmask changes this thread's mask only.
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, kick_signal());
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, ptr::null_mut())
    };
    if rc != 0 {
        return Err(KvmError::Signal(io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// Marks `run` as the `kvm_run` of the vCPU running on this thread (null
/// when it leaves `KVM_RUN`).
pub(super) fn set_running(run: *mut kvm_run) {
    RUNNING.with(|r| r.set(run));
}

/// A thread id that may be sent and shared (musl's `pthread_t` is a pointer).
#[derive(Debug, Clone, Copy)]
struct Thread(libc::pthread_t);

// SAFETY: a pthread_t is an opaque thread id that any thread of the process
// may pass to pthread_kill; nothing is dereferenced through it here.
unsafe impl Send for Thread {}
// SAFETY: as above; the id is only copied, never mutated.
unsafe impl Sync for Thread {}

/// State shared by a vCPU and its kick handles.
#[derive(Debug)]
pub(super) struct KickState {
    /// A kick is pending: the next (or current) run returns Cancelled.
    pub requested: AtomicBool,
    /// The vCPU's thread while the vCPU exists; `None` once it is dropped.
    thread: Mutex<Option<Thread>>,
}

impl KickState {
    /// State for a vCPU living on the calling thread.
    pub fn for_this_thread() -> Arc<Self> {
        Arc::new(Self {
            requested: AtomicBool::new(false),
            // SAFETY: pthread_self has no preconditions.
            thread: Mutex::new(Some(Thread(unsafe { libc::pthread_self() }))),
        })
    }

    /// The vCPU is gone: later kicks do nothing.
    pub fn retire(&self) {
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A `Send + Sync` handle that makes its vCPU's run return
/// [`VcpuExit::Cancelled`](crate::VcpuExit::Cancelled).
#[derive(Debug, Clone)]
pub struct KvmKick(pub(super) Arc<KickState>);

impl VcpuKick for KvmKick {
    fn kick(&self) {
        self.0.requested.store(true, Ordering::Release);
        let thread = self.0.thread.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Thread(thread)) = *thread {
            // SAFETY: while `thread` is Some the vCPU exists, and a vCPU
            // (which is !Send) is dropped on the thread that created it, so
            // the thread is alive; holding the lock keeps it Some for the
            // duration of the call.
            unsafe { libc::pthread_kill(thread, kick_signal()) };
        }
    }
}
