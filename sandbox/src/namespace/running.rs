//! A running namespace sandbox: [`NamespaceSandbox`], the namespace
//! backend's [`Sandbox`]. Its constructor takes the common
//! [`SandboxSpec`] and where to put things ([`Places`]: the agent's socket,
//! the log, optionally a hybrid socket in front of the agent) and starts
//! bwrap; the rest of its life is the trait's.
//!
//! What it does on the host: puts the sandbox in a cgroup of its own where
//! the host allows one (removed again at its end) and says in `info` what
//! holds; binds the agent's socket outside the sandbox, hands it to the
//! agent as an inherited descriptor; copies what the sandbox prints into
//! the capped log; waits for the agent's handshake; forwards the hybrid
//! socket to the agent, if it has one; asks the agent to shut down
//! (Shutdown frame) and kills bwrap after the grace.
//!
//! Threads: bwrap is started, and waited for, by a thread of its own
//! ("sandbox") that lives exactly as long as the sandbox: bwrap's
//! `--die-with-parent` follows the thread that started it, so the owner
//! may start one from any thread. Plus the log pump and, once ready, the
//! hybrid socket's accept thread.
//!
//! This module owns one namespace sandbox's life and the ready timeout and
//! grace it lives by. It must never assume a control socket, a name lock
//! or a state dir around it: whoever holds it decides those.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, FrameWriter, Session, Stream};
use boxdesk_platform::socket::{self, SocketError};
use boxdesk_platform::sync::lock;
use nix::sys::signal::{self, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use std::process::Child;

use super::{HostEntry, NamespaceError, Spec};
use crate::cgroup::{self, CgroupError};
use crate::forward::{self, AgentAddr};
use crate::host_system::{self, EtcFiles, Placement};
use crate::keeper::{Keeper, Starter};
use crate::log;
use crate::running::{
    DnsSockets, Ended, Endpoint, Info, InsideListener, Net, Rootfs, Sandbox, SandboxSpec, Share,
    StartError, Unsupported,
};
use crate::state::Owner;

/// How long the agent may take to answer its first handshake.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a namespace sandbox puts what it makes on the host.
#[derive(Debug, Clone)]
pub struct Places {
    /// The agent's own socket, bound here outside the sandbox (in a
    /// private dir: whoever reaches it reaches the agent). A leftover file
    /// there is replaced: the caller owns the path.
    pub agent_sock: PathBuf,
    /// A hybrid-vsock socket (`<name>.agent`) to serve in front of the
    /// agent once it is ready, bound at start (a live one there is
    /// [`SocketError::InUse`]); none for an owner that talks to the agent
    /// itself.
    pub front: Option<PathBuf>,
    /// The log what the sandbox prints goes to (opened by [`crate::log`]).
    pub log: PathBuf,
    /// A directory for the sandbox's copies of the host's `/etc` files
    /// (made when one is needed; [`crate::host_system::EtcFiles`]).
    pub etc: PathBuf,
}

/// Why a namespace sandbox could not start (inside
/// [`StartError::Backend`]).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// bwrap or its spec could not be set up.
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// The sandbox's limits could not be set up.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The hybrid socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The state dir's writable dirs could not be handed to the sandbox.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The namespace backend has no disk images: its `/` is the host's.
    #[error("the namespace backend cannot boot a rootfs image (use --backend kvm)")]
    Rootfs,
    /// The namespace backend has no display devices.
    #[error("the namespace backend has no display: a display needs a VM (kvm or hvf)")]
    Display,
    /// A `--mem` or `--cpus` the user asked for cannot be held here.
    #[error("cannot enforce {0}; run `boxdesk doctor` for what would let this host hold limits, or leave the flag out to run without that limit")]
    Unenforceable(String),
    /// Some other system call failed.
    #[error("{what}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> RunError {
    move |source| RunError::Os { what, source }
}

/// A started namespace sandbox. Dropping it kills it.
#[derive(Debug)]
pub struct NamespaceSandbox {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    agent: Arc<AgentAddr>,
    agent_sock: PathBuf,
    front: Option<PathBuf>,
    front_listener: Mutex<Option<UnixListener>>,
    /// The front as its accepting thread answers it (a duplicate), shut
    /// down at the end so that thread returns.
    front_serving: Mutex<Option<OwnedFd>>,
    log: PathBuf,
    pid: u32,
    net: Net,
    more: Vec<(&'static str, String)>,
    /// Set by a stop or kill: the end that follows is [`Ended::Stopped`].
    stopping: AtomicBool,
    /// Whether bwrap has been reaped (its pid is no longer its own), and
    /// how it ended (`exit status: 1`) once what the sandbox made is undone.
    end: Mutex<EndState>,
    end_cv: Condvar,
    cgroup: Arc<Mutex<CgroupSlot>>,
}

/// The sandbox's cgroup while it lives, and the OOM kills it had counted
/// when it was removed: a client asking why its session ended after the
/// sandbox went (its monitor killed at the memory limit) still gets the
/// answer.
#[derive(Debug)]
struct CgroupSlot {
    live: Option<cgroup::Cgroup>,
    oom_kills_at_removal: Option<u64>,
}

impl NamespaceSandbox {
    /// Starts the sandbox of `spec` (its workspace's dirs are handed to
    /// the sandbox's root first); returns once bwrap runs, before its agent
    /// answers ([`Sandbox::wait_ready`]). On an error nothing it made is
    /// left.
    pub fn start(spec: &SandboxSpec, places: Places) -> Result<Self, StartError> {
        Self::start_inner(spec, places).map_err(StartError::backend)
    }

    fn start_inner(spec: &SandboxSpec, places: Places) -> Result<Self, RunError> {
        if !matches!(spec.rootfs, Rootfs::Default | Rootfs::Host)
            || (spec.container.is_some() && spec.rootfs != Rootfs::Default)
        {
            return Err(RunError::Rootfs);
        }
        if spec.display.is_some() {
            return Err(RunError::Display);
        }
        let mut ns = namespace_spec(spec)?;
        // The host's /etc files whose links would dangle inside, as
        // regular files kept current; an OCI container has its own /etc.
        let etc = match &spec.container {
            Some(_) => None,
            None => {
                let root = Path::new("/");
                let copies = host_system::etc_copies(root, &ns.host, spec.resolv_conf.as_deref());
                let files = EtcFiles::prepare(root, &places.etc, &ns.host, copies)
                    .map_err(os("the sandbox's copies of /etc files"))?;
                for p in files.placements() {
                    let (Placement::Dir { host, inside } | Placement::File { host, inside }) = p;
                    ns.binds.push(super::Bind::Ro {
                        host: host.clone(),
                        inside: inside.clone(),
                    });
                }
                Some(files)
            }
        };
        if let Some(ws) = &spec.workspace {
            ws.hand_to(Owner {
                uid: ns.ids.uid,
                gid: ns.ids.gid,
            })?;
        }
        let agent = Arc::new(AgentAddr::new(&places.agent_sock).map_err(os("agent socket path"))?);
        let front_listener = match &places.front {
            Some(path) => Some(socket::bind_exclusive(path)?),
            None => None,
        };
        let remove_front = || {
            if let Some(path) = &places.front {
                let _ = fs::remove_file(path);
            }
        };
        let t = Instant::now();
        let (cgroup, fds, mut more) = match limits(&spec.name, spec) {
            Ok(l) => l,
            Err(e) => {
                remove_front();
                return Err(e);
            }
        };
        tracing::debug!("limits set up in {:?}", t.elapsed());
        if let Some(c) = spec.resources.cpus {
            more.insert(0, ("vcpus", c.to_string()));
        }
        if let Some(m) = spec.resources.mem_mib {
            more.insert(
                usize::from(spec.resources.cpus.is_some()),
                ("mem_mib", m.to_string()),
            );
        }
        more.push(("uid_map", format!("0:{}:1", ns.ids.uid)));
        more.push(("gid_map", format!("0:{}:1", ns.ids.gid)));
        more.push(("pids_max", ns.pids_max.to_string()));
        more.push(("tmp_mib", (ns.tmp_bytes >> 20).to_string()));
        more.push(("shares", Share::info_word(&spec.shares)));
        if spec.container.is_none() {
            let host: Vec<String> = ns
                .host
                .iter()
                .filter(|e| matches!(e, HostEntry::Dir(_)))
                .map(|e| e.path().display().to_string())
                .collect();
            more.push(("host_system", host.join(",")));
        }
        if let Some(files) = &etc {
            more.push(("resolv_conf", resolver_word(spec, files)));
        }
        let cgroup = Arc::new(Mutex::new(CgroupSlot {
            live: cgroup,
            oom_kills_at_removal: None,
        }));
        let undo_cgroup = {
            let cgroup = Arc::clone(&cgroup);
            move || {
                let mut slot = lock(&cgroup);
                if let Some(cg) = slot.live.take() {
                    slot.oom_kills_at_removal = Some(cg.oom_kills());
                    if let Err(e) = cg.remove() {
                        tracing::warn!("removing the sandbox's cgroup: {e}");
                    }
                }
            }
        };

        // bwrap is started by the thread that then waits for it: its
        // `--die-with-parent` follows that thread.
        let (tx, rx) = mpsc::channel();
        let keeper = {
            let agent_sock = places.agent_sock.clone();
            let log_path = places.log.clone();
            move || keep(ns, fds, agent_sock, log_path, tx)
        };
        let spawned = std::thread::Builder::new()
            .name("sandbox".into())
            .stack_size(128 * 1024)
            .spawn(keeper);
        let started = match spawned {
            Err(e) => Err(os("starting a thread")(e)),
            Ok(_) => rx
                .recv()
                .unwrap_or_else(|_| Err(os("starting the sandbox")(io::ErrorKind::Other.into()))),
        };
        let (pid, ended) = match started {
            Ok(s) => s,
            Err(e) => {
                remove_front();
                undo_cgroup();
                return Err(e);
            }
        };
        more.push(("sandbox_pid", pid.to_string()));
        let inner = Arc::new(Inner {
            agent,
            agent_sock: places.agent_sock,
            front: places.front,
            front_listener: Mutex::new(front_listener),
            front_serving: Mutex::new(None),
            log: places.log,
            pid,
            net: spec.net,
            more,
            stopping: AtomicBool::new(false),
            end: Mutex::new(EndState::default()),
            end_cv: Condvar::new(),
            cgroup,
        });
        // What the keeper thread does once bwrap has ended (it is a zombie
        // until reaped here, under the lock `kill` takes).
        let on_end = Arc::clone(&inner);
        let _ = ended.send(Box::new(move |mut child: Child| {
            let how = {
                let mut end = lock(&on_end.end);
                end.reaped = true;
                match child.wait() {
                    Ok(s) => s.to_string(),
                    Err(e) => format!("could not be waited for: {e}"),
                }
            };
            undo_cgroup();
            let _ = fs::remove_file(&on_end.agent_sock);
            if let Some(front) = &on_end.front {
                let _ = fs::remove_file(front);
            }
            lock(&on_end.end).how = Some(how);
            on_end.stop_front();
            on_end.end_cv.notify_all();
        }));
        if let Some(files) = etc.filter(|f| !f.placements().is_empty()) {
            keep_current(files, Arc::downgrade(&inner));
        }
        Ok(NamespaceSandbox { inner })
    }

    /// bwrap's pid (its monitor; the agent, PID 1 inside, is its child).
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// OOM kills in the sandbox so far, where a cgroup enforces its limits
    /// (once the sandbox has ended, the count its cgroup ended with).
    pub fn oom_kills(&self) -> Option<u64> {
        let slot = lock(&self.inner.cgroup);
        match &slot.live {
            Some(c) => Some(c.oom_kills()),
            None => slot.oom_kills_at_removal,
        }
    }
}

/// How often the copies of the host's /etc files are compared with the
/// host's.
const ETC_REFRESH: Duration = Duration::from_secs(1);

/// Keeps `files` current with the host's while the sandbox runs, on a
/// thread of its own (the host's resolver file changes when the network
/// does).
fn keep_current(mut files: EtcFiles, sandbox: std::sync::Weak<Inner>) {
    let spawned = std::thread::Builder::new()
        .name("etc-copies".into())
        .stack_size(64 * 1024)
        .spawn(move || loop {
            std::thread::sleep(ETC_REFRESH);
            match sandbox.upgrade() {
                Some(inner) if !lock(&inner.end).reaped => {}
                _ => return,
            }
            if let Err(e) = files.refresh() {
                tracing::warn!("refreshing the copies in {}: {e}", files.dir().display());
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("the copies of /etc files will not follow the host's: {e}");
    }
}

/// `info`'s word for where the sandbox's resolver comes from: `host` (the
/// host's `/etc/resolv.conf`, seen live), `host-copy:PATH` (a copy at the
/// end of the host's link), `boxdesk:PATH` (its owner's resolver), `none`.
fn resolver_word(spec: &SandboxSpec, files: &EtcFiles) -> String {
    let copy = files.shown().into_iter().find(|(n, _)| *n == "resolv.conf");
    match (&spec.resolv_conf, copy) {
        (Some(_), Some((_, at))) => format!("boxdesk:{}", at.display()),
        (Some(_), None) => "none".to_owned(),
        (None, Some((_, at))) => format!("host-copy:{}", at.display()),
        (None, None) => "host".to_owned(),
    }
}

type OnEnd = Box<dyn FnOnce(Child) + Send>;

#[derive(Debug, Default)]
struct EndState {
    reaped: bool,
    how: Option<String>,
}

/// The "sandbox" thread: starts bwrap, reports its pid (or why it could
/// not start) on `tx`, then waits for it and runs what the sandbox's
/// owner sent back for its end.
fn keep(
    ns: Spec,
    fds: Vec<std::os::fd::RawFd>,
    agent_sock: PathBuf,
    log_path: PathBuf,
    tx: mpsc::Sender<Result<(u32, mpsc::Sender<OnEnd>), RunError>>,
) {
    let spawn = || -> Result<(std::process::Child, std::fs::File), RunError> {
        // Any file at the agent's path is a leftover of an earlier run
        // (the caller owns the path).
        let _ = fs::remove_file(&agent_sock);
        let listener: OwnedFd = UnixListener::bind(&agent_sock)
            .map_err(os("binding the agent's socket"))?
            .into();
        let started = super::spawn(&ns, &listener, fds)?;
        Ok((started.child, started.output))
    };
    let (mut child, output) = match spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = fs::remove_file(&agent_sock);
            let _ = tx.send(Err(e));
            return;
        }
    };
    let pump = std::thread::Builder::new()
        .name("sandbox-log".into())
        .stack_size(128 * 1024)
        .spawn(move || log::pump(output, &log_path));
    if let Err(e) = pump {
        let _ = child.kill();
        let _ = child.wait();
        let _ = fs::remove_file(&agent_sock);
        let _ = tx.send(Err(os("starting a thread")(e)));
        return;
    }
    let (end_tx, end_rx) = mpsc::channel::<OnEnd>();
    if tx.send(Ok((child.id(), end_tx))).is_err() {
        let _ = child.kill();
    }
    // Waits without reaping: until reaped, bwrap's pid stays its own, so
    // a kill cannot reach another process.
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
    while let Err(nix::errno::Errno::EINTR) = waitid(Id::Pid(pid), flags) {}
    match end_rx.recv() {
        Ok(on_end) => on_end(child),
        Err(_) => {
            let _ = child.wait();
            let _ = fs::remove_file(&agent_sock);
        }
    }
}

/// The bwrap spec of `spec`. Every share follows the host's later mounts
/// ([`Share::follows_mounts`]) whether asked or not: bwrap's binds are
/// recursive, in a mount namespace whose mounts are slaves of ours.
fn namespace_spec(spec: &SandboxSpec) -> Result<Spec, RunError> {
    let mut ns = Spec::new(&spec.name)?;
    ns.net = spec.net == Net::Host;
    if let Some(ws) = &spec.workspace {
        ns.binds = ws.binds();
    }
    ns.binds.extend(spec.shares.iter().map(|s: &Share| {
        // A `run --share` is id-mapped when root; cowork's folders (they
        // follow its later mounts) are its own dirs, handed to the
        // sandbox's ids, with id-mapped attachments beneath.
        let (host, inside) = (s.host.clone(), s.inside.clone());
        match (s.follows_mounts, s.writable) {
            (false, writable) => super::Bind::Share {
                host,
                inside,
                writable,
            },
            (true, true) => super::Bind::Rw { host, inside },
            (true, false) => super::Bind::Ro { host, inside },
        }
    }));
    ns.home = spec.home.clone();
    ns.cwd = spec.cwd.clone();
    ns.pids_max = spec.resources.pids;
    // A container's own RLIMIT_NPROC is the agent's task limit (the cgroup
    // keeps `resources.pids`).
    if let Some(nproc) = spec.container.as_ref().and_then(|c| {
        c.rlimits
            .iter()
            .find(|r| r.resource == libc::RLIMIT_NPROC as i32)
            .map(|r| r.hard)
    }) {
        ns.pids_max = nproc;
    }
    ns.tmp_bytes = spec.resources.tmp_bytes;
    ns.container = spec.container.clone();
    Ok(ns)
}

type Limits = (
    Option<cgroup::Cgroup>,
    Vec<std::os::fd::RawFd>,
    Vec<(&'static str, String)>,
);

/// Puts the sandbox's limits in a cgroup named `name` where this host and
/// user allow one; returns it, the `cgroup.procs` descriptors bwrap's
/// child joins, and what `info` says of the limits. The pids cap also
/// holds without a cgroup: the agent sets RLIMIT_NPROC in the sandbox's
/// user namespace. Without `--mem`, a sandbox (not an OCI container) is
/// capped at half the host's RAM where a cgroup can hold it. A `--mem` or
/// `--cpus` that cannot be held is refused when the spec requires its
/// limits.
fn limits(name: &str, spec: &SandboxSpec) -> Result<Limits, RunError> {
    let container = spec.container.as_ref();
    let asked_mem = spec.resources.mem_mib.map(u64::from);
    let wanted = cgroup::Limits {
        // A container's quota may be a fraction of a CPU.
        cpus: container
            .and_then(|c| c.cpu_quota)
            .or(spec.resources.cpus.map(f64::from)),
        // An OCI container without a limit has none, as under runc.
        mem_mib: asked_mem.or_else(|| container.is_none().then(default_mem_mib).flatten()),
        pids: Some(spec.resources.pids),
        cpu_shares: container.and_then(|c| c.cpu_shares),
    };
    // The limits that must hold or be refused: the flags the user typed.
    let required: Vec<&str> = [
        (asked_mem.is_some(), "--mem"),
        (spec.resources.cpus.is_some(), "--cpus"),
    ]
    .into_iter()
    .filter_map(|(asked, flag)| (asked && spec.resources.limits_required).then_some(flag))
    .collect();
    let mut info = Vec::new();
    match cgroup::create(name, &wanted)? {
        cgroup::Placement::Enforced(cg) => {
            // Each unenforced entry starts with its flag (`--mem: why`).
            let missed: Vec<&str> = cg
                .unenforced()
                .iter()
                .map(String::as_str)
                .filter(|why| required.iter().any(|flag| why.starts_with(flag)))
                .collect();
            if !missed.is_empty() {
                let why = missed.join("; ");
                if let Err(e) = cg.remove() {
                    tracing::warn!("removing the sandbox's cgroup: {e}");
                }
                return Err(RunError::Unenforceable(why));
            }
            let version = match cg.version() {
                cgroup::Version::V1 => "cgroup-v1",
                cgroup::Version::V2 => "cgroup-v2",
            };
            info.push(("limits", version.to_owned()));
            info.push(("cgroup", cg.location()));
            if asked_mem.is_none() {
                if let Some(m) = cg.enforced().mem_mib {
                    info.push(("mem_mib", m.to_string()));
                    info.push(("mem_source", "default".to_owned()));
                }
            }
            if !cg.unenforced().is_empty() {
                info.push(("limits_unenforced", cg.unenforced().join(",")));
            }
            let fds = cg.join_fds().as_slice().to_vec();
            Ok((Some(cg), fds, info))
        }
        cgroup::Placement::Unenforced { why } => {
            if !required.is_empty() {
                return Err(RunError::Unenforceable(format!(
                    "{}: {why}",
                    required.join(" or ")
                )));
            }
            info.push(("limits", "unenforced".to_owned()));
            info.push(("limits_why", why));
            Ok((None, Vec::new(), info))
        }
    }
}

/// Half the host's RAM in MiB (`MemTotal`), as Docker Desktop sizes its VM:
/// a runaway sandbox cannot take the host down with it.
fn default_mem_mib() -> Option<u64> {
    let meminfo = fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some((kib / 1024 / 2).max(16))
}

impl Inner {
    /// Shuts the front down (once), so its accepting thread returns.
    fn stop_front(&self) {
        if let Some(fd) = lock(&self.front_serving).take() {
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
    }

    fn ended(&self) -> Option<String> {
        lock(&self.end).how.clone()
    }

    /// Waits up to `limit` for the end; whether it came.
    fn wait_end(&self, limit: Duration) -> bool {
        let guard = lock(&self.end);
        let (guard, _) = self
            .end_cv
            .wait_timeout_while(guard, limit, |end| end.how.is_none())
            .unwrap_or_else(|p| p.into_inner());
        guard.how.is_some()
    }

    /// SIGKILL to bwrap's monitor; `--die-with-parent` takes the agent,
    /// and with PID 1 gone the kernel ends the whole pid namespace.
    fn kill(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Under the lock, so the pid is still bwrap's: it is reaped only
        // under this lock.
        let end = lock(&self.end);
        if !end.reaped {
            let _ = signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        }
    }

    /// Sends our session header and a Shutdown frame without waiting for
    /// the agent's header, so a wedged agent costs at most the write
    /// timeout before the sandbox is killed instead.
    ///
    /// The connection is returned to be held open until the sandbox has
    /// exited: closing it at once would make the agent's own header write
    /// fail before it reads the Shutdown frame.
    fn ask_agent_to_exit(&self) -> Option<std::os::unix::net::UnixStream> {
        let mut s = self.agent.connect().ok()?;
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        if s.write_all(&boxdesk_channel::session_header()).is_ok() {
            let _ = FrameWriter::new(&mut s).write_frame(&Frame::Shutdown);
        }
        Some(s)
    }
}

impl Sandbox for NamespaceSandbox {
    fn wait_ready(&self) -> Result<(), StartError> {
        let me = &self.inner;
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pause = Duration::from_micros(100);
        loop {
            if let Some(how) = me.ended() {
                // Let the log thread write out what bwrap said.
                std::thread::sleep(Duration::from_millis(20));
                return Err(StartError::Died {
                    how: format!("the sandbox exited ({how})"),
                    log: me.log.clone(),
                    tail: log::tail(&me.log),
                });
            }
            if let Ok(s) = me.agent.connect() {
                if Session::over(Stream::Unix(s)).is_ok() {
                    break;
                }
            }
            if Instant::now() > deadline {
                me.kill();
                me.wait_end(crate::running::STOP_GRACE);
                return Err(StartError::NotReady {
                    within: READY_TIMEOUT,
                    log: me.log.clone(),
                    tail: log::tail(&me.log),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
        if let Some(listener) = lock(&me.front_listener).take() {
            let agent = Arc::clone(&me.agent);
            let serving = listener
                .try_clone()
                .map_err(|e| StartError::backend(os("duplicating the agent socket")(e)))?;
            *lock(&me.front_serving) = Some(OwnedFd::from(serving));
            if me.ended().is_some() {
                // Its end came first and found nothing to shut down.
                me.stop_front();
            }
            let inner = Arc::clone(me);
            std::thread::Builder::new()
                .name("agent-accept".into())
                .stack_size(128 * 1024)
                .spawn(move || {
                    let e = forward::serve(listener, agent);
                    if inner.ended().is_none() {
                        tracing::error!("agent socket: {e}");
                    }
                })
                .map_err(|e| {
                    me.kill();
                    StartError::backend(os("starting a thread")(e))
                })?;
        }
        Ok(())
    }

    fn agent(&self) -> Endpoint {
        match &self.inner.front {
            Some(path) => Endpoint::Hybrid {
                path: path.clone(),
                port: boxdesk_channel::AGENT_PORT,
            },
            None => Endpoint::Unix(self.inner.agent.path().to_owned()),
        }
    }

    fn owner_agent(&self) -> Endpoint {
        Endpoint::Unix(self.inner.agent.path().to_owned())
    }

    fn listen_inside(&self, port: u16) -> Result<InsideListener, StartError> {
        listen_in_netns(self.inner.pid, port)
            .map(InsideListener::Tcp)
            .map_err(StartError::backend)
    }

    fn dns_inside(&self) -> Result<DnsSockets, StartError> {
        if self.inner.net == Net::Host {
            return Err(StartError::backend(Unsupported(
                "a sandbox on the host's network uses the host's resolver".into(),
            )));
        }
        dns_in_netns(self.inner.pid).map_err(StartError::backend)
    }

    fn oom_kills(&self) -> Option<u64> {
        NamespaceSandbox::oom_kills(self)
    }

    fn info(&self) -> Info {
        Info {
            backend: "namespace",
            isolation: "namespaces",
            channel: "unix",
            net: self.inner.net.word(),
            rootfs: "host".to_owned(),
            ready_key: "ready_ms",
            more: self.inner.more.clone(),
        }
    }

    fn stop(&self, grace: Duration) {
        let me = &self.inner;
        me.stopping.store(true, Ordering::SeqCst);
        // No new clients while it goes.
        if let Some(front) = &me.front {
            let _ = fs::remove_file(front);
        }
        if me.ended().is_some() {
            return;
        }
        let _conn = me.ask_agent_to_exit();
        let asked = Instant::now();
        let ended = me.wait_end(grace);
        tracing::debug!("sandbox exited {:?} after Shutdown", asked.elapsed());
        if !ended {
            tracing::warn!(
                "the sandbox did not exit within {}s of Shutdown; killing it",
                grace.as_secs()
            );
            me.kill();
            me.wait_end(grace);
        }
    }

    fn kill(&self) {
        self.inner.kill();
    }

    fn wait(&self) -> Ended {
        let me = &self.inner;
        let guard = lock(&me.end);
        let guard = me
            .end_cv
            .wait_while(guard, |end| end.how.is_none())
            .unwrap_or_else(|p| p.into_inner());
        let how = guard.how.clone().unwrap_or_default();
        drop(guard);
        if me.stopping.load(Ordering::SeqCst) {
            Ended::Stopped
        } else {
            Ended::Died(format!("the sandbox exited on its own ({how})"))
        }
    }

    fn log_tail(&self) -> String {
        log::tail(&self.inner.log)
    }
}

/// A listener on 127.0.0.1:`port` inside the sandbox's network namespace
/// ([`in_netns`]). Non-blocking, for an async owner.
fn listen_in_netns(pid: u32, port: u16) -> Result<std::net::TcpListener, RunError> {
    in_netns(pid, move || {
        let l = std::net::TcpListener::bind(("127.0.0.1", port))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
}

/// The sockets of a DNS server on 127.0.0.1:53 inside the sandbox's
/// network namespace ([`in_netns`]), non-blocking. Port 53 is bound from
/// here, the namespace's owner: nothing inside holds a capability.
fn dns_in_netns(pid: u32) -> Result<DnsSockets, RunError> {
    in_netns(pid, || {
        let udp = std::net::UdpSocket::bind(("127.0.0.1", 53))?;
        udp.set_nonblocking(true)?;
        let tcp = std::net::TcpListener::bind(("127.0.0.1", 53))?;
        tcp.set_nonblocking(true)?;
        Ok(DnsSockets { udp, tcp })
    })
}

/// Runs `make` inside the network namespace of the agent (bwrap `pid`'s
/// one child, PID 1 of the sandbox), on a short-lived thread that enters
/// it: a socket made there stays in that namespace.
fn in_netns<T: Send + 'static>(
    pid: u32,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> Result<T, RunError> {
    let agent: u32 = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|c| c.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| os("finding the agent's pid")(io::ErrorKind::NotFound.into()))?;
    let ns = fs::File::open(format!("/proc/{agent}/ns/net"))
        .map_err(os("opening the sandbox's network namespace"))?;
    let made = std::thread::spawn(move || -> io::Result<T> {
        // Only this thread changes namespace, and it ends right after.
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
        make()
    })
    .join()
    .map_err(|_| os("entering the sandbox's network namespace")(io::ErrorKind::Other.into()))?;
    made.map_err(os("listening in the sandbox's network namespace"))
}

/// The namespace backend's [`Starter`]: a kept sandbox's agent socket in
/// its state dir (never inside the sandbox), its `<name>.agent` forwarded
/// to it.
#[derive(Debug, Clone, Copy, Default)]
pub struct NamespaceStarter;

impl Starter for NamespaceStarter {
    fn start(
        &self,
        spec: &SandboxSpec,
        keeper: &Keeper,
        log: &std::path::Path,
    ) -> Result<Box<dyn Sandbox>, StartError> {
        let places = Places {
            agent_sock: keeper.state().agent_sock(),
            front: Some(keeper.paths().agent.clone()),
            log: log.to_owned(),
            etc: keeper.state().etc(),
        };
        Ok(Box::new(NamespaceSandbox::start(spec, places)?))
    }

    fn inside_owner(&self) -> Owner {
        let ids = super::IdMap::for_this_process();
        Owner {
            uid: ids.uid,
            gid: ids.gid,
        }
    }

    fn backend(&self) -> &'static str {
        "namespace"
    }
}

impl Drop for NamespaceSandbox {
    fn drop(&mut self) {
        if self.inner.ended().is_none() {
            self.inner.kill();
            self.inner.wait_end(crate::running::STOP_GRACE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(dir: &std::path::Path) -> Places {
        Places {
            agent_sock: dir.join("agent.sock"),
            front: Some(dir.join("t.agent")),
            log: dir.join("t.log"),
            etc: dir.join("etc"),
        }
    }

    #[test]
    fn a_sandbox_whose_agent_never_answers_is_reported_dead_and_leaves_no_socket_behind() {
        if super::super::find_bwrap().is_none() {
            println!("skipped: no bwrap on PATH");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let places = places(dir.path());
        // The agent is this test binary, which runs no test named
        // `__agent` and exits at once: the sandbox ends before it answers.
        let spec = SandboxSpec::new(format!("ns-running-test-{}", std::process::id()));
        let sb = NamespaceSandbox::start(&spec, places.clone()).unwrap();
        assert!(sb.pid() > 0);
        assert!(places.front.as_ref().unwrap().exists(), "front not bound");
        match sb.wait_ready() {
            Err(StartError::Died { how, log, .. }) => {
                assert!(how.starts_with("the sandbox exited ("), "{how}");
                assert_eq!(log, places.log);
            }
            other => panic!("expected Died, got {other:?}"),
        }
        assert!(matches!(sb.wait(), Ended::Died(why) if why.contains("on its own")));
        assert!(!places.agent_sock.exists(), "the agent's socket stayed");
        assert!(!places.front.unwrap().exists(), "the front socket stayed");
        let info = sb.info();
        assert_eq!((info.backend, info.isolation), ("namespace", "namespaces"));
        assert!(info.more.iter().any(|(k, _)| *k == "sandbox_pid"));
    }

    #[test]
    fn the_starter_hands_shared_dirs_to_us_as_a_user_and_never_to_root_as_root() {
        let owner = NamespaceStarter.inside_owner();
        if boxdesk_platform::euid() == 0 {
            assert_ne!(owner.uid, 0, "a root-started sandbox is never root outside");
            assert_ne!(owner.gid, 0);
        } else {
            assert_eq!((owner.uid, owner.gid), (Owner::us().uid, Owner::us().gid));
        }
    }

    #[test]
    fn a_rootfs_image_is_refused_before_anything_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = SandboxSpec::new("ns-rootfs-test");
        spec.rootfs = Rootfs::Image {
            path: "/img".into(),
            writable: false,
        };
        let e = NamespaceSandbox::start(&spec, places(dir.path())).unwrap_err();
        assert!(e.to_string().contains("cannot boot a rootfs image"), "{e}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
