//! The agent as a whole: startup (init duties or subreaper, root, reaper,
//! listener), the accept loop handing each connection to a session thread
//! (`workers`), and what a
//! Shutdown frame does in each [`Mode`].
//!
//! Owns the state every session shares ([`Agent`]). It must never let a
//! session's failure stop the accept loop, never kill anything outside its
//! own children's process groups unless it is a VM's init, and never exit
//! as a VM's init.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{signal, SigHandler, Signal};

use crate::fdio;
use crate::listen::{ListenError, Listener};
use crate::reaper::{ReaperError, Registry};
use crate::workers::Workers;
use crate::Config;
use boxdesk_platform::beneath::{Beneath, PathError};

/// Name prefix of session threads (the panic hook tells them apart).
pub const SESSION_THREAD: &str = "session";

/// Why the agent could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The root directory could not be opened.
    #[error("--root: {0}")]
    Root(PathError),
    /// The reaper could not start.
    #[error(transparent)]
    Reaper(#[from] ReaperError),
    /// The listening socket could not be set up.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// Waiting for connections failed.
    #[error("accept loop: {0}")]
    Accept(io::Error),
}

/// Which process the agent is, which decides its init duties and what
/// Shutdown does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// PID 1 of a VM (`BOXDESK_NAMESPACE` unset): mounts, hostname, `lo`;
    /// Shutdown powers off.
    VmInit,
    /// PID 1 of a pid namespace (`BOXDESK_NAMESPACE` set): no init duties;
    /// Shutdown exits, which ends the namespace.
    NamespaceInit,
    /// Any other process: a child subreaper; Shutdown kills its execs'
    /// process groups and [`crate::run`] returns.
    Child,
}

impl Mode {
    /// The mode of this process.
    pub fn detect() -> Mode {
        match (
            std::process::id() == 1,
            std::env::var_os("BOXDESK_NAMESPACE").is_some(),
        ) {
            (true, false) => Mode::VmInit,
            (true, true) => Mode::NamespaceInit,
            (false, _) => Mode::Child,
        }
    }
}

/// What every session shares.
pub struct Agent {
    /// PutFile/GetFile resolve beneath this.
    pub root: Beneath,
    /// Where `/results` files come from.
    pub results: PathBuf,
    /// Running execs, for the reaper and for Shutdown.
    pub registry: Arc<Registry>,
    mode: Mode,
    mounted: Vec<PathBuf>,
    /// Written once to stop the accept loop.
    stop: Mutex<Option<OwnedFd>>,
}

impl Agent {
    /// A Shutdown frame: power off (VM) or kill every exec's process group
    /// and make [`run`] return.
    pub fn shutdown(&self) {
        if self.mode == Mode::VmInit {
            crate::power::vm_shutdown(&self.mounted);
        }
        for pid in self.registry.live_pids() {
            // SAFETY: kill has no memory arguments; -pid is the process
            // group the exec's child leads.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let stop = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(fd) = stop {
            let _ = fdio::write(fd.as_fd(), &[1]);
        }
    }
}

/// Runs the agent: init duties as a VM's init, then serves connections on
/// `config.listen`, a thread each, until a Shutdown frame. Returns `Ok(())`
/// after Shutdown outside a VM (the caller should exit 0); in a VM,
/// Shutdown powers off and this never returns. The process's
/// `waitpid(-1)` belongs to the agent from here on: an embedding binary
/// must not start or wait for children of its own.
pub fn run(config: Config) -> Result<(), AgentError> {
    // EPIPE on a closed socket ends one session, never the agent.
    // SAFETY: SIG_IGN installs no handler code.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
    let mode = Mode::detect();
    let mounted = match mode {
        Mode::VmInit => {
            crate::power::install_panic_hook();
            crate::init::vm_init()
        }
        Mode::NamespaceInit => Vec::new(),
        Mode::Child => {
            // Best effort: qemu user emulation, for one, refuses it. Then
            // orphans go to the real init; the agent still reaps its own
            // children and kills its execs' process groups.
            if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
                log!("cannot become a child subreaper ({e}); orphans of execs go to init");
            }
            Vec::new()
        }
    };
    let root = Beneath::open(&config.root).map_err(AgentError::Root)?;
    let registry = Registry::new();
    registry.start_reaper()?;
    let listener = Listener::bind(&config.listen)?;
    let (stop_rx, stop_tx) = fdio::pipe().map_err(AgentError::Accept)?;
    let agent = Arc::new(Agent {
        root,
        results: config.results,
        registry,
        mode,
        mounted,
        stop: Mutex::new(Some(stop_tx)),
    });
    crate::console::ready(&config.listen);
    accept_loop(&listener, &stop_rx, &agent)
}

fn accept_loop(listener: &Listener, stop: &OwnedFd, agent: &Arc<Agent>) -> Result<(), AgentError> {
    let workers = Arc::new(Workers::default());
    loop {
        let mut fds = [
            fdio::pollfd(listener.fd(), libc::POLLIN),
            fdio::pollfd(stop.as_fd(), libc::POLLIN),
        ];
        fdio::poll(&mut fds, None).map_err(AgentError::Accept)?;
        if fds[1].revents != 0 {
            return Ok(());
        }
        if fds[0].revents == 0 {
            continue;
        }
        let conn = match listener.accept() {
            Ok(conn) => conn,
            Err(e) => {
                // EMFILE and friends pass; do not spin on them.
                if e.kind() != io::ErrorKind::WouldBlock {
                    log!("accept: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
        };
        if let Err(e) = workers.dispatch(conn, agent) {
            log!("{e}");
        }
    }
}
