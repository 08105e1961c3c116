//! The agent as a whole: startup (non-dumpable, limits, init duties or
//! subreaper, root, reaper, listener), the accept loop (`gate`, which hands
//! each connection to a session thread through `workers`), and what a
//! Shutdown frame does in each [`Mode`].
//!
//! Owns the state every session shares ([`Agent`]). It must never let a
//! session's failure stop the accept loop, never kill anything outside its
//! execs' sessions unless it is a VM's init, and never exit as a VM's
//! init.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nix::sys::signal::{signal, SigHandler, Signal};

use crate::fdio;
use crate::gate::{Gate, GateError};
use crate::limits::LimitsError;
use crate::listen::{ListenError, Listener};
use crate::reaper::{ReaperError, Registry};
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
    /// A start-up setting (non-dumpable, `--pids-max`) could not be made.
    #[error(transparent)]
    Limits(#[from] LimitsError),
    /// The stop pipe could not be created.
    #[error("cannot create the stop pipe: {0}")]
    StopPipe(std::io::Error),
    /// Waiting for connections failed.
    #[error(transparent)]
    Accept(#[from] GateError),
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
    /// Whether every orphan of an exec is reparented to the agent (it is
    /// PID 1 or a child subreaper), which lets `sweep` skip its `/proc`
    /// scan when the agent has no children left.
    pub adopts_orphans: bool,
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
    // An inherited listening socket is claimed before anything else opens
    // a descriptor that could take its number.
    let inherited = match config.listen {
        crate::Listen::Fd(fd) => Some(crate::listen::adopt(fd)?),
        _ => None,
    };
    // Whatever else was inherited (a container's sandbox runs the agent
    // from a descriptor to its binary) reaches no process the agent starts.
    crate::limits::cloexec_inherited();
    // EPIPE on a closed socket ends one session, never the agent.
    // SAFETY: SIG_IGN installs no handler code.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
    // Before any connection or child: nothing in the sandbox may open the
    // agent's descriptors or memory through /proc.
    crate::limits::non_dumpable()?;
    // Before any thread: a domain is per thread, inherited by new ones.
    if config.scope_host {
        match crate::landlock::Domain::scopes_only().and_then(|d| d.map(|d| d.enter()).transpose()) {
            Ok(Some(())) => {}
            Ok(None) => log!(
                "Landlock here: {}; no scopes, so host abstract sockets stay reachable on the host's network",
                crate::landlock::Support::here().describe()
            ),
            Err(e) => log!("cannot enter a Landlock scope: {e}"),
        }
    }
    crate::limits::one_malloc_arena();
    crate::limits::raise_open_files();
    if let Some(max) = config.pids_max {
        crate::limits::limit_tasks(max)?;
    }
    let mode = Mode::detect();
    let mut adopts_orphans = mode != Mode::Child;
    let mounted = match mode {
        Mode::VmInit => {
            crate::power::install_panic_hook();
            let mounted = crate::init::vm_init();
            crate::relay::start_asked();
            mounted
        }
        Mode::NamespaceInit => Vec::new(),
        Mode::Child => {
            // Best effort: qemu user emulation, for one, refuses it. Then
            // orphans go to the real init; the agent still reaps its own
            // children and kills its execs' process groups.
            match nix::sys::prctl::set_child_subreaper(true) {
                Ok(()) => adopts_orphans = true,
                Err(e) => {
                    log!("cannot become a child subreaper ({e}); orphans of execs go to init")
                }
            }
            Vec::new()
        }
    };
    let root = Beneath::open(&config.root).map_err(AgentError::Root)?;
    let registry = Registry::new();
    registry.start_reaper()?;
    let mut listener = match inherited {
        Some(listener) => listener,
        None => Listener::bind(&config.listen)?,
    };
    if let Some(uid) = config.peer_uid {
        listener.only_peer(uid);
    }
    let (stop_rx, stop_tx) = fdio::pipe().map_err(AgentError::StopPipe)?;
    let agent = Arc::new(Agent {
        root,
        results: config.results,
        registry,
        adopts_orphans,
        mode,
        mounted,
        stop: Mutex::new(Some(stop_tx)),
    });
    crate::console::ready(&config.listen);
    Ok(Gate::new(&listener, &stop_rx, &agent).run()?)
}
