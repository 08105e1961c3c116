//! What makes a sandbox one `boxdesk ls` lists: a [`Keeper`] holds its
//! name (the name's lock), its control socket `<name>.sock`, its state dir,
//! and, once started, the sandbox itself as a `dyn` [`Sandbox`]; it answers
//! the control socket (`info`, `stop`) and ends the sandbox by the one
//! state-dir rule ([`End`]). The helper process (`boxdesk __vmm`) is a
//! keeper plus signals; cowork keeps each of its sandboxes with one, in
//! its own process, started by the [`Starter`] its binary hands it.
//!
//! Lifecycle: [`Keeper::claim`] (lock, socket, state dir) → [`Keeper::serve`]
//! (the control socket answers, `state starting`) → [`Keeper::hold`] the
//! started sandbox → [`Keeper::ready`] (`state running`) → one
//! [`Keeper::end`] (or [`Keeper::abandon`] after a failed start).
//!
//! This module owns the name's claim and the state dir's fate at the end.
//! It must never name a backend, never remove a socket or state it did not
//! make, and never let a second end undo what the first is doing.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use boxdesk_platform::screen::{InputSink, Screen};
use boxdesk_platform::sync::lock;
use boxdesk_platform::{dirs, socket, DirError, NameError, SandboxPaths, SocketError};

use crate::control::{self, protocol::PROTO_VERSION, Controlled};
use crate::lock::{LockError, NameLock};
use crate::running::{Sandbox, SandboxSpec, StartError, STOP_GRACE};
use crate::state::{Owner, StateDir, StateError};

/// Why a name could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The runtime dir is missing, not ours, or not private.
    #[error(transparent)]
    RuntimeDir(#[from] DirError),
    /// The name is not valid, or its socket path too long.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Another keeper holds the name.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The control socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The state dir could not be prepared.
    #[error(transparent)]
    State(#[from] StateError),
}

/// What starts a kept sandbox on the backend its owner's binary chose
/// (cowork is handed one: it never picks a backend itself).
pub trait Starter: Send + Sync + std::fmt::Debug {
    /// Starts the sandbox of `spec` under `keeper`'s claim (its agent
    /// socket and hybrid socket go where the claim's paths say), what it
    /// prints to `log` (an owner that keeps its logs elsewhere than the
    /// claim's `<name>.log`); returns once it is started, before its agent
    /// answers.
    fn start(
        &self,
        spec: &SandboxSpec,
        keeper: &Keeper,
        log: &std::path::Path,
    ) -> Result<Box<dyn Sandbox>, StartError>;

    /// Who root inside this backend's sandboxes is on the host: whom a
    /// host dir shared writable must belong to.
    fn inside_owner(&self) -> Owner;

    /// The backend's name, as `info` says it (`namespace`, `kvm`, `hvf`).
    fn backend(&self) -> &'static str;
}

/// How a kept sandbox ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `stop`, a signal, or a guest that powered off: the state dir goes
    /// (unless kept, then it is marked stopped), and so does the log.
    Stop,
    /// The sandbox died on its own: the state dir stays, marked with why,
    /// for `ls` to show as `dead` and for `stop` to remove.
    Died(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Running,
    Stopping,
}

/// One claimed name and the sandbox under it.
pub struct Keeper {
    name: String,
    keep: bool,
    reused: bool,
    claimed: Instant,
    paths: SandboxPaths,
    state: StateDir,
    phase: Mutex<Phase>,
    ready_ms: AtomicU64,
    ending: AtomicBool,
    lock: Mutex<Option<NameLock>>,
    sandbox: OnceLock<Arc<dyn Sandbox>>,
    /// The control socket as [`Keeper::serve`] answers it (a duplicate):
    /// shut down at the end, which ends the accepting thread in an owner
    /// that outlives its sandbox.
    serving: Mutex<Option<OwnedFd>>,
    labels: Mutex<Vec<(&'static str, String)>>,
    on_stop: Box<dyn Fn() + Send + Sync>,
    /// [`Keeper::hand_over`]: the state dir's last `rmdir` and the lock
    /// file are another process's.
    handed_over: AtomicBool,
}

/// What a jailed keeper's reaper finishes once the keeper's process is
/// gone ([`Keeper::hand_over`]).
#[derive(Debug, Clone)]
pub struct Handover {
    /// The state dir: removed if the keeper left it empty.
    pub state_dir: std::path::PathBuf,
    /// The name's lock file: removed, then the lock released.
    pub lock_file: std::path::PathBuf,
    /// The locked descriptor, which the reaper inherits.
    pub lock_fd: std::os::fd::RawFd,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Keeper {
    /// Claims `name`: takes its lock, binds `<name>.sock` (returned, to
    /// [`Keeper::serve`]) and prepares its state dir (refusing one an
    /// earlier sandbox left unless `reuse`; marked kept with `keep`).
    /// `on_stop` runs after a `stop` request's [`Keeper::end`] (the helper
    /// exits there).
    pub fn claim(
        name: &str,
        keep: bool,
        reuse: bool,
        on_stop: Box<dyn Fn() + Send + Sync>,
    ) -> Result<(Arc<Keeper>, UnixListener), KeeperError> {
        let claimed = Instant::now();
        let runtime = dirs::runtime_dir()?;
        let paths = SandboxPaths::new(&runtime, name)?;
        // Lock files a killed helper left, so the runtime dir stays tidy.
        NameLock::sweep(&runtime);
        let name_lock = NameLock::acquire(&runtime, name)?;
        let control = socket::bind_exclusive(&paths.sock)?;
        let prepared = dirs::state_dir()
            .map_err(StateError::from)
            .and_then(|root| StateDir::prepare(&root, name, keep, reuse, Owner::us()));
        let state = match prepared {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&paths.sock);
                return Err(e.into());
            }
        };
        let keeper = Keeper {
            name: name.to_owned(),
            keep,
            reused: reuse,
            claimed,
            paths,
            state,
            phase: Mutex::new(Phase::Starting),
            ready_ms: AtomicU64::new(0),
            ending: AtomicBool::new(false),
            lock: Mutex::new(Some(name_lock)),
            sandbox: OnceLock::new(),
            serving: Mutex::new(None),
            labels: Mutex::new(Vec::new()),
            on_stop,
            handed_over: AtomicBool::new(false),
        };
        Ok((Arc::new(keeper), control))
    }

    /// Answers the control socket `control` (from [`Keeper::claim`]) on a
    /// thread of its own, until the end (or for as long as the process
    /// lives).
    pub fn serve(self: &Arc<Self>, control: UnixListener) -> io::Result<()> {
        *lock(&self.serving) = Some(OwnedFd::from(control.try_clone()?));
        let me: Arc<dyn Controlled> = Arc::clone(self) as Arc<dyn Controlled>;
        let keeper = Arc::clone(self);
        std::thread::Builder::new()
            .name("control-accept".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                let e = control::server::serve(control, me);
                if !keeper.ending() {
                    tracing::error!("control socket: {e}");
                }
            })
            .map(drop)
    }

    /// Ends [`Keeper::serve`]'s accepting: the socket is shut down, so its
    /// `accept` fails and the thread returns.
    fn stop_serving(&self) {
        if let Some(fd) = lock(&self.serving).take() {
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }

    /// Hands the last steps of the end to a process that outlives this one
    /// and stays where this one is leaving (a helper about to enter its
    /// own mount namespace, where its state dir is a mount point and the
    /// runtime dir's lock must outlast it): from now on an end empties the
    /// state dir but leaves it, and closes the lock without removing its
    /// file; the reaper, holding the lock too, does both once this process
    /// is gone, so no new claim of the name can start in between.
    pub fn hand_over(&self) -> Option<Handover> {
        let lock = lock(&self.lock);
        let held = lock.as_ref()?;
        self.handed_over.store(true, Ordering::SeqCst);
        Some(Handover {
            state_dir: self.state.dir.clone(),
            lock_file: held.path().to_owned(),
            lock_fd: held.as_raw_fd(),
        })
    }

    /// Releases the name: the lock file goes with it unless handed over.
    fn release(&self) {
        if let Some(l) = lock(&self.lock).take() {
            if self.handed_over.load(Ordering::SeqCst) {
                l.leave();
            } else {
                l.release();
            }
        }
    }

    /// Removes the state dir; a handed-over one is a mount point here and
    /// only emptied.
    fn remove_state(&self) -> io::Result<()> {
        match self.state.remove() {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && self.handed_over.load(Ordering::SeqCst) =>
            {
                Ok(())
            }
            r => r,
        }
    }

    /// The name's runtime paths: `<name>.sock`, `<name>.agent`, `<name>.log`.
    pub fn paths(&self) -> &SandboxPaths {
        &self.paths
    }

    /// The name's state dir.
    pub fn state(&self) -> &StateDir {
        &self.state
    }

    /// The spec of a sandbox over this state dir
    /// ([`SandboxSpec::for_state`]).
    pub fn spec(&self) -> SandboxSpec {
        SandboxSpec::for_state(&self.name, &self.state)
    }

    /// Adds `key value` pairs to `info` (cowork: its profile).
    pub fn label(&self, key: &'static str, value: String) {
        lock(&self.labels).push((key, value));
    }

    /// Holds the started sandbox: from now on `info` reports it and an end
    /// stops it. Only the first call counts.
    pub fn hold(&self, sandbox: Arc<dyn Sandbox>) {
        let _ = self.sandbox.set(sandbox);
    }

    /// The sandbox's agent answered: `state running`, and the time from
    /// the claim to now is its time to ready.
    pub fn ready(&self) {
        let ms = self.claimed.elapsed().as_millis().max(1) as u64;
        self.ready_ms.store(ms, Ordering::Relaxed);
        *lock(&self.phase) = Phase::Running;
        tracing::info!("sandbox {} ready in {ms} ms", self.name);
    }

    /// Whether an end has begun.
    pub fn ending(&self) -> bool {
        self.ending.load(Ordering::SeqCst)
    }

    /// Ends the sandbox: `<name>.sock` goes, the sandbox is stopped (its
    /// agent asked to shut down, killed after [`STOP_GRACE`]), then the
    /// state dir follows `end`'s rule and the name is released (after a
    /// stop, as soon as the state dir is moved aside, before its removal). Returns
    /// whether this call did it: `false` when another end (or
    /// [`Keeper::abandon`]) came first, which may still be running.
    pub fn end(&self, end: End) -> bool {
        if self.ending.swap(true, Ordering::SeqCst) {
            return false;
        }
        *lock(&self.phase) = Phase::Stopping;
        tracing::info!("stopping sandbox {}", self.name);
        let _ = std::fs::remove_file(&self.paths.sock);
        self.stop_serving();
        if let Some(sandbox) = self.sandbox.get() {
            sandbox.stop(STOP_GRACE);
        }
        let t = Instant::now();
        self.finish_state(&end);
        tracing::debug!("state clean-up took {:?}", t.elapsed());
        true
    }

    /// Undoes the claim after a failed start (the sandbox has undone its
    /// own part): `<name>.sock` goes, and the state dir unless it was kept
    /// or reused (not this run's to remove); the log stays, it explains the
    /// failure. Returns `false`, doing nothing, when an end came first.
    pub fn abandon(&self) -> bool {
        if self.ending.swap(true, Ordering::SeqCst) {
            return false;
        }
        let _ = std::fs::remove_file(&self.paths.sock);
        self.stop_serving();
        if let Some(sandbox) = self.sandbox.get() {
            sandbox.kill();
            sandbox.wait();
        }
        if !self.keep && !self.reused {
            let _ = self.remove_state();
        }
        self.release();
        true
    }

    /// The one rule for the state dir at the end (see [`crate::state`]).
    fn finish_state(&self, end: &End) {
        match end {
            End::Stop if self.keep => self.state.mark_stopped(),
            End::Stop => {
                let _ = std::fs::remove_file(&self.paths.log);
                let _ = std::fs::remove_file(crate::log::rotated(&self.paths.log));
                // Moved aside, the name is free at once; a deep tree is
                // then removed with nothing waiting to kill this process.
                let moved = if self.handed_over.load(Ordering::SeqCst) {
                    None
                } else {
                    crate::trash::move_to_trash(&self.state.dir).ok()
                };
                let removed = match moved {
                    Some(moved) => {
                        self.release();
                        moved.remove()
                    }
                    None => self.remove_state(),
                };
                if let Err(e) = removed {
                    tracing::warn!("cannot remove {}: {e}", self.state.dir.display());
                }
            }
            End::Died(why) => {
                tracing::error!(
                    "{why}; its state stays in {} until `boxdesk stop {}`",
                    self.state.dir.display(),
                    self.name
                );
                self.state.mark_ended(why);
            }
        }
        self.release();
    }
}

impl Controlled for Keeper {
    fn info(&self) -> Vec<(&'static str, String)> {
        let phase = match *lock(&self.phase) {
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
        };
        let info = self.sandbox.get().map(|s| s.info());
        let mut v = vec![
            ("proto", PROTO_VERSION.to_string()),
            ("pid", std::process::id().to_string()),
        ];
        if let Some(i) = &info {
            v.push(("net", i.net.to_owned()));
            v.push(("rootfs", i.rootfs.clone()));
            v.push(("channel", i.channel.to_owned()));
        }
        v.push(("name", self.name.clone()));
        if let Some(i) = &info {
            v.push(("backend", i.backend.to_owned()));
            v.push(("isolation", i.isolation.to_owned()));
        }
        v.push(("arch", std::env::consts::ARCH.to_owned()));
        v.push(("state", phase.to_owned()));
        v.push(("uptime_ms", self.claimed.elapsed().as_millis().to_string()));
        v.extend(lock(&self.labels).iter().cloned());
        if let Some(i) = info {
            v.extend(i.more);
            match self.ready_ms.load(Ordering::Relaxed) {
                0 => {}
                ms => v.push((i.ready_key, ms.to_string())),
            }
        }
        v
    }

    fn stop(&self) {
        if self.end(End::Stop) {
            (self.on_stop)();
        }
    }

    fn screen(&self) -> Option<Arc<Screen>> {
        self.sandbox.get()?.screen()
    }

    fn input(&self) -> Option<Arc<dyn InputSink>> {
        self.sandbox.get()?.input()
    }
}

/// Clears what killed helpers (or a killed cowork server) of this user
/// left: lock files in the runtime dir no process holds, and state trees
/// whose remover died ([`crate::trash::sweep`]; one still being removed is
/// left to its remover).
pub fn sweep_leftovers() {
    if let Ok(runtime) = dirs::runtime_dir() {
        NameLock::sweep(&runtime);
    }
    if let Ok(state_root) = dirs::state_dir() {
        crate::trash::sweep(&state_root);
    }
}
