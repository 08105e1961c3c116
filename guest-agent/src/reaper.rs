//! The one owner of `waitpid(-1)`: a reaper thread that collects the exit
//! of every child of the agent — the execs it started, and every orphan
//! the kernel reparents to it (as PID 1, or as a child subreaper) — and a
//! [`Registry`] of the execs whose status someone is waiting for.
//!
//! The race this module exists to close: an exec's child can exit before
//! the spawning thread has recorded its pid, and a reaper that reaped it
//! then would throw the status away as an orphan's. So children are forked
//! *while the registry lock is held* ([`Registry::spawn`]), and the reaper
//! first only peeks at an exited child (`waitid(WNOWAIT)`), then takes the
//! lock, and only then reaps it. std's `Command::spawn` itself reaps a
//! child whose `exec` failed; it does so inside our lock, so the reaper
//! never steals that status either (it finds `ECHILD` and moves on).
//!
//! An exec may also reap its own registered child by pid, with the lock
//! held ([`Registry::try_reap`]), when its pidfd says the child exited:
//! that saves a thread hop on every exec's exit.
//!
//! Never: reap while a spawn holds the lock, block while holding the lock
//! (the session sweep's `/proc` scan under it does not wait on anything),
//! or call std's `Child::wait` (statuses only ever come from here).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

// A panic elsewhere cannot leave the map half-updated (every update is a
// single insert or remove), so a poisoned lock is still usable.
use boxdesk_platform::sync::lock;
use nix::errno::Errno;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// Why the reaper could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReaperError {
    /// The reaper thread could not be created.
    #[error("cannot start the reaper thread: {0}")]
    Thread(io::Error),
}

/// Where the reaper leaves one exec's exit status, and how it wakes the
/// session waiting for it.
#[derive(Debug)]
pub struct ExitSlot {
    status: Mutex<Option<i32>>,
    wake: OwnedFd,
}

impl ExitSlot {
    /// A new slot and the read end of its wake-up pipe (readable once the
    /// status is in the slot).
    pub fn new() -> io::Result<(Arc<ExitSlot>, OwnedFd)> {
        let (rx, tx) = crate::fdio::pipe()?;
        let slot = ExitSlot {
            status: Mutex::new(None),
            wake: tx,
        };
        Ok((Arc::new(slot), rx))
    }

    /// The exit status: 0–255, or −N when killed by signal N; `None` while
    /// the process runs.
    pub fn status(&self) -> Option<i32> {
        *lock(&self.status)
    }

    fn deliver(&self, status: i32) {
        *lock(&self.status) = Some(status);
        // A full pipe already holds a wake-up; nothing else can go wrong
        // that the session could act on.
        let _ = crate::fdio::write(self.wake.as_fd(), &[1]);
    }
}

/// The wire status word (the `Exit` frame's) for a wait result: the exit code, or −N
/// for a death by signal N; `None` for stops and continues.
pub fn wire_status(ws: WaitStatus) -> Option<i32> {
    match ws {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(-(sig as i32)),
        _ => None,
    }
}

#[derive(Default)]
struct Inner {
    live: HashMap<i32, Arc<ExitSlot>>,
    /// Bumped by every spawn, so a reaper with no children can sleep until
    /// there may be one.
    spawns: u64,
}

/// The execs whose exit statuses are awaited, keyed by pid.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
    spawned: Condvar,
}

impl Registry {
    /// An empty registry; call [`Registry::start_reaper`] once.
    pub fn new() -> Arc<Registry> {
        Arc::new(Registry::default())
    }

    /// Runs `spawn` (which forks and returns the child's pid) with the
    /// registry locked and registers the pid under `slot` before the lock
    /// is released, so the reaper cannot see the exit first.
    pub fn spawn<T>(
        &self,
        slot: &Arc<ExitSlot>,
        spawn: impl FnOnce() -> io::Result<(T, i32)>,
    ) -> io::Result<(T, i32)> {
        let mut inner = lock(&self.inner);
        let (value, pid) = spawn()?;
        inner.live.insert(pid, Arc::clone(slot));
        inner.spawns += 1;
        drop(inner);
        self.spawned.notify_all();
        Ok((value, pid))
    }

    /// Reaps `pid` now if it has exited and is still registered: its exec
    /// saw the exit first (its pidfd turned readable) and need not wait for
    /// the reaper thread. The lock makes this and the reaper exclusive, and
    /// a pid that is no longer registered is never waited for (it may
    /// already belong to another process).
    pub fn try_reap(&self, pid: i32) {
        let mut inner = lock(&self.inner);
        if !inner.live.contains_key(&pid) {
            return;
        }
        let Ok(ws) = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) else {
            return;
        };
        if let (Some(code), Some(slot)) = (wire_status(ws), inner.live.remove(&pid)) {
            drop(inner);
            slot.deliver(code);
        }
    }

    /// Stops waiting for `pid`: when it exits later it is reaped like an
    /// orphan and its status discarded.
    pub fn forget(&self, pid: i32) {
        lock(&self.inner).live.remove(&pid);
    }

    /// Runs `f` with spawns (and reaping) held off; `f` learns whether
    /// `pid` is the pid of an exec now running. The session sweep uses it
    /// so that a pid recycled for a new exec is never signalled by the
    /// sweep of an old one.
    pub fn with_spawns_held<R>(&self, pid: i32, f: impl FnOnce(bool) -> R) -> R {
        let inner = lock(&self.inner);
        f(inner.live.contains_key(&pid))
    }

    /// The pids (= process groups) of every exec still running.
    pub fn live_pids(&self) -> Vec<i32> {
        lock(&self.inner).live.keys().copied().collect()
    }

    /// Starts the reaper thread; it runs until the process ends.
    pub fn start_reaper(self: &Arc<Self>) -> Result<(), ReaperError> {
        let registry = Arc::clone(self);
        std::thread::Builder::new()
            .name("reaper".into())
            .stack_size(64 * 1024)
            .spawn(move || registry.reap_forever())
            .map(drop)
            .map_err(ReaperError::Thread)
    }

    fn reap_forever(&self) {
        loop {
            let seen = lock(&self.inner).spawns;
            // Peek only: the child stays a zombie until we hold the lock.
            match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                Ok(ws) => {
                    if let Some(pid) = ws.pid() {
                        self.reap(pid);
                    }
                }
                Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => self.wait_for_spawn(seen),
                Err(e) => {
                    log!("reaper: waitid: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Reaps `pid` with the lock held and hands its status to its exec, if
    /// any. `ECHILD` means std reaped it (a failed exec) under our lock.
    fn reap(&self, pid: Pid) {
        let mut inner = lock(&self.inner);
        let ws = match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(ws) => ws,
            Err(_) => return,
        };
        let Some(code) = wire_status(ws) else { return };
        if let Some(slot) = inner.live.remove(&pid.as_raw()) {
            drop(inner);
            slot.deliver(code);
        }
    }

    /// No children at all: sleep until a spawn. The timeout covers orphans
    /// that reach PID 1 without the agent having started anything (a
    /// process that entered the namespace from outside).
    fn wait_for_spawn(&self, seen: u64) {
        let inner = lock(&self.inner);
        if inner.spawns == seen {
            let _ = self.spawned.wait_timeout(inner, Duration::from_secs(1));
        }
    }
}
