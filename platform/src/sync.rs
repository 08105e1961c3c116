//! Locking that survives a panicked holder: the state behind boxdesk's
//! mutexes stays consistent at every unlock, so a poisoned lock is taken
//! as it is rather than spreading the panic to the daemon.
//!
//! This module owns that one rule; it must never hide a panic itself (the
//! panic is reported where it happened, only the lock is reused).

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, ignoring poisoning.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
