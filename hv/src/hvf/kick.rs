//! [`HvfKick`] and the per-vCPU wake-up state it shares with its vCPU:
//! `hv_vcpus_exit` for a vCPU inside `hv_vcpu_run`, a condition variable for
//! one waiting out a WFI in the backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use applevisor_sys::{hv_vcpu_t, hv_vcpus_exit};

use crate::VcpuKick;

/// State shared by a vCPU, its kick handles and the VM (for interrupt wake-ups).
#[derive(Debug)]
pub(super) struct KickState {
    /// A kick is pending: the next (or current) run returns Cancelled.
    pub requested: AtomicBool,
    /// The framework's vCPU id while the vCPU exists.
    vcpu: Mutex<Option<hv_vcpu_t>>,
    /// Set by [`KickState::wake`], consumed by [`KickState::park`].
    woken: Mutex<bool>,
    cond: Condvar,
}

impl KickState {
    pub fn new(vcpu: hv_vcpu_t) -> Self {
        Self {
            requested: AtomicBool::new(false),
            vcpu: Mutex::new(Some(vcpu)),
            woken: Mutex::new(false),
            cond: Condvar::new(),
        }
    }

    /// A placeholder for a vCPU id not created yet.
    pub fn retired() -> Self {
        let state = Self::new(0);
        state.retire();
        state
    }

    fn vcpu(&self) -> MutexGuard<'_, Option<hv_vcpu_t>> {
        self.vcpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The vCPU is being destroyed: later kicks and wake-ups do nothing.
    pub fn retire(&self) {
        *self.vcpu() = None;
    }

    /// Makes the vCPU look at its interrupts again: leaves `hv_vcpu_run`
    /// (a CANCELED exit the vCPU swallows unless `requested`) or a WFI wait.
    pub fn wake(&self) {
        if let Some(id) = *self.vcpu() {
            // SAFETY: `id` names a live vCPU (Some until the vCPU retires,
            // which takes this lock first); the array has one element.
            unsafe { hv_vcpus_exit(&id, 1) };
        }
        self.unpark();
    }

    /// Ends a WFI wait only (the framework's GIC delivers to running vCPUs).
    pub fn unpark(&self) {
        *self.woken.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cond.notify_all();
    }

    /// Waits at most `timeout` for a [`wake`](Self::wake); returns whether
    /// one came.
    pub fn park(&self, timeout: Duration) -> bool {
        let woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) = self
            .cond
            .wait_timeout_while(woken, timeout, |w| !*w)
            .unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *woken, false)
    }
}

/// A `Send + Sync` handle that makes its vCPU's run return
/// [`VcpuExit::Cancelled`](crate::VcpuExit::Cancelled).
#[derive(Debug, Clone)]
pub struct HvfKick(pub(super) std::sync::Arc<KickState>);

impl VcpuKick for HvfKick {
    fn kick(&self) {
        self.0.requested.store(true, Ordering::Release);
        self.0.wake();
    }
}
