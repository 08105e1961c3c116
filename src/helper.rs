//! `boxdesk __vmm`: the one process per sandbox. It takes the name's lock,
//! binds `<name>.sock` and `<name>.agent`, starts the namespace sandbox,
//! waits for its agent's handshake, tells its starter it is ready (one byte
//! on a pipe), then serves both sockets until `stop`, a signal, or the
//! sandbox's death, and tears everything down. The namespace sandbox's
//! part (bwrap, the agent's readiness, forwarding `<name>.agent`) is
//! `bwrap`, Linux only; elsewhere a helper asked for it refuses.
//!
//! Threads: main (starts the sandbox, then waits for it to exit), control
//! accept (+ one per connection), agent accept (+ two per forwarded
//! connection), and one that takes SIGTERM/SIGINT/SIGHUP. SIGPIPE is
//! ignored, so a vanished peer is an `EPIPE` on its own connection.
//!
//! This module owns the sandbox's lifecycle and what `info` reports. It
//! must never exit because of what a peer sent, never remove a socket or
//! state it did not create, and never report anything but the namespace
//! backend's real posture (`backend namespace`, `isolation namespaces`).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, FrameWriter, Session};
use boxdesk_platform::sync::lock;
use boxdesk_platform::{dirs, socket, DirError, NameError, SandboxPaths, SocketError};
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};

use boxdesk_sandbox::control::{self, protocol::PROTO_VERSION, Sandbox};
use boxdesk_sandbox::forward::AgentAddr;
use boxdesk_sandbox::lock::{LockError, NameLock};
#[cfg(target_os = "linux")]
use boxdesk_sandbox::namespace::NamespaceError;
use boxdesk_sandbox::state::{StateDir, StateError};

/// The namespace backend's half: bwrap, its agent, `<name>.agent`.
#[cfg(target_os = "linux")]
mod bwrap;

/// Off Linux there is no namespace backend:
/// [`crate::backend::Backend::resolve`] refuses it before a helper starts,
/// and a helper asked anyway says so.
#[cfg(not(target_os = "linux"))]
mod bwrap {
    use std::os::unix::net::UnixListener;
    use std::sync::Arc;

    use super::{fail, AgentAddr, HelperError, HelperOptions, Shared};
    use crate::backend::{Backend, BackendError};

    pub(super) fn run(
        shared: Arc<Shared>,
        _opts: HelperOptions,
        _agent_listener: Option<UnixListener>,
        _agent: Arc<AgentAddr>,
    ) -> Result<std::convert::Infallible, HelperError> {
        let e = BackendError::NeedsLinux(Backend::Namespace);
        Err(fail(&shared, None, e.into()))
    }
}

/// vCPUs of a VM when `--cpus` is not given.
pub const DEFAULT_VCPUS: u32 = 1;
/// RAM of a VM in MiB when `--mem` is not given.
pub const DEFAULT_MEM_MIB: u32 = 512;

/// How long the agent may take to answer its first handshake.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the sandbox may take to exit after a Shutdown frame.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// What `boxdesk __vmm` was asked to run.
#[derive(Debug)]
pub struct HelperOptions {
    /// The sandbox's name (already valid or refused here).
    pub name: String,
    /// `--cpus`: vCPUs of a VM (default [`DEFAULT_VCPUS`]), a CPU quota of
    /// a namespace sandbox (default none).
    pub cpus: Option<u32>,
    /// `--mem`: RAM of a VM (default [`DEFAULT_MEM_MIB`]), a memory limit of
    /// a namespace sandbox (default none).
    pub mem_mib: Option<u32>,
    /// Share the host network.
    pub net: bool,
    /// Keep the state dir and log after stop.
    pub keep: bool,
    /// Run over a state dir an earlier sandbox of this name left.
    pub reuse: bool,
    /// Most processes and threads inside (namespace backend).
    // The CLI sets these everywhere; only the namespace backend (Linux)
    // reads them.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub pids: u64,
    /// Size of `/tmp` and `/dev/shm`, bytes (namespace backend).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub tmp_bytes: u64,
    /// Where to write one byte once ready. Closed without a byte on a
    /// failed start; otherwise held open until the helper exits, so the
    /// starter sees end-of-file exactly when the helper is gone.
    pub ready: Option<OwnedFd>,
    /// Boot a VM (the `kvm` or `hvf` backend) instead of a namespace sandbox.
    pub vm: Option<VmOptions>,
}

/// What a VM sandbox boots.
#[derive(Debug, Clone, Default)]
pub struct VmOptions {
    /// `--kernel`, else the image lookup of [`boxdesk_vmm::image`].
    pub kernel: Option<PathBuf>,
    /// `--initrd`, else the image lookup.
    pub initrd: Option<PathBuf>,
    /// `--rootfs IMG` and whether it is writable (`--rootfs-rw`).
    pub rootfs: Option<(PathBuf, bool)>,
}

/// Why the helper could not start or run its sandbox.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The runtime dir is missing, not ours, or not private.
    #[error(transparent)]
    RuntimeDir(#[from] DirError),
    /// The name is not valid, or its socket path too long.
    #[error(transparent)]
    Name(#[from] NameError),
    /// Another helper holds the name.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The backend cannot run here.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// The sandbox's state dir could not be prepared.
    #[error(transparent)]
    State(#[from] StateError),
    /// The sandbox could not be prepared or started.
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// The sandbox's limits could not be set up.
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Cgroup(#[from] boxdesk_sandbox::cgroup::CgroupError),
    /// The sandbox ended before its agent answered.
    #[cfg(target_os = "linux")]
    #[error("the sandbox exited ({status}) before its agent answered; log {}:\n{tail}", log.display())]
    Died {
        /// How bwrap ended.
        status: std::process::ExitStatus,
        /// The log file.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// No guest image could be found.
    #[error(transparent)]
    Image(#[from] boxdesk_vmm::image::ImageError),
    /// The VM could not be built or started.
    #[error("cannot start the VM: {0}")]
    Vmm(#[from] boxdesk_vmm::VmmError),
    /// The VM ended before its agent answered.
    #[error("the VM ended ({end:?}) before its agent answered; console log {}:\n{tail}", log.display())]
    VmDied {
        /// How it ended.
        end: boxdesk_vmm::VmEnd,
        /// The console log.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// The agent did not answer in time.
    #[error("the agent did not answer within {}s; log {}:\n{tail}", READY_TIMEOUT.as_secs(), log.display())]
    NotReady {
        /// The log file.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
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

fn os(what: &'static str) -> impl FnOnce(io::Error) -> HelperError {
    move |source| HelperError::Os { what, source }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    Running,
    Stopping,
}

/// Everything the threads share.
struct Shared {
    name: String,
    cpus: Option<u32>,
    mem_mib: Option<u32>,
    net: bool,
    keep: bool,
    reused: bool,
    started: Instant,
    ready_ms: AtomicU64,
    phase: Mutex<Phase>,
    sandbox_pid: AtomicU32,
    exited: Mutex<bool>,
    exited_cv: Condvar,
    stopping: AtomicBool,
    paths: SandboxPaths,
    state: StateDir,
    agent: Arc<AgentAddr>,
    lock: Mutex<Option<NameLock>>,
    /// The VM, for the `kvm` backend (set once it is started).
    vm: Mutex<Option<Arc<boxdesk_vmm::RunningVm>>>,
    /// Whether this sandbox is a VM.
    is_vm: bool,
    /// The rootfs image, for `info`.
    rootfs: Option<PathBuf>,
    /// What the backend adds to `info` (id map, limits).
    extra_info: Mutex<Vec<(&'static str, String)>>,
    /// What the backend must undo once its sandbox has ended (its cgroup),
    /// run by every end: stop, death, failed start.
    after_end: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

/// Why a helper ends.
#[derive(Debug)]
enum End {
    /// `stop`, or a signal to the helper: the state dir goes (unless
    /// `--keep`).
    Stop,
    /// The sandbox died on its own: the state dir stays for `ls` to show as
    /// `dead` and for `stop` to remove.
    Died(String),
}

impl Sandbox for Shared {
    fn info(&self) -> Vec<(&'static str, String)> {
        let phase = match *lock(&self.phase) {
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Stopping => "stopping",
        };
        let mut v = vec![
            ("proto", PROTO_VERSION.to_string()),
            ("pid", std::process::id().to_string()),
            ("net", if self.net { "host" } else { "none" }.to_owned()),
            (
                "rootfs",
                match (&self.rootfs, self.is_vm) {
                    (Some(p), _) => p.display().to_string(),
                    (None, true) => "initramfs".to_owned(),
                    (None, false) => "host".to_owned(),
                },
            ),
            (
                "channel",
                if self.is_vm { "vsock" } else { "unix" }.to_owned(),
            ),
            ("name", self.name.clone()),
            (
                "backend",
                if self.is_vm {
                    crate::backend::Backend::HOST_VM.to_string()
                } else {
                    "namespace".to_owned()
                },
            ),
            (
                "isolation",
                if self.is_vm { "vm" } else { "namespaces" }.to_owned(),
            ),
            ("arch", std::env::consts::ARCH.to_owned()),
            ("state", phase.to_owned()),
            ("uptime_ms", self.started.elapsed().as_millis().to_string()),
        ];
        // What the sandbox has (a VM) or is held to (namespaces); nothing
        // when a namespace sandbox has no such limit.
        if let Some(c) = self.cpus {
            v.push(("vcpus", c.to_string()));
        }
        if let Some(m) = self.mem_mib {
            v.push(("mem_mib", m.to_string()));
        }
        v.extend(lock(&self.extra_info).iter().cloned());
        match self.ready_ms.load(Ordering::Relaxed) {
            0 => {}
            ms if self.is_vm => v.push(("boot_ms", ms.to_string())),
            ms => v.push(("ready_ms", ms.to_string())),
        }
        match self.sandbox_pid.load(Ordering::Relaxed) {
            0 => {}
            pid => v.push(("sandbox_pid", pid.to_string())),
        }
        v
    }

    fn stop(&self) {
        self.teardown(0, End::Stop)
    }
}

impl Shared {
    /// Removes the sockets, ends the sandbox, removes its state (on a
    /// [`End::Stop`] without `--keep`; a death leaves it, marked) and exits
    /// the process with `code`. A second caller waits for the first to
    /// finish.
    fn teardown(&self, code: i32, end: End) -> ! {
        if self.stopping.swap(true, Ordering::SeqCst) {
            loop {
                std::thread::park();
            }
        }
        *lock(&self.phase) = Phase::Stopping;
        tracing::info!("stopping sandbox {}", self.name);
        let _ = std::fs::remove_file(&self.paths.sock);
        if !self.is_vm {
            // (A VM's vsock muxer serves it: it goes once the VM is down.)
            let _ = std::fs::remove_file(&self.paths.agent);
        }
        if self.sandbox_pid.load(Ordering::SeqCst) != 0 || lock(&self.vm).is_some() {
            let already = self.has_exited();
            let _conn = if already {
                None
            } else {
                self.ask_agent_to_exit()
            };
            let asked = Instant::now();
            let exited = self.wait_exited(SHUTDOWN_GRACE);
            tracing::debug!("sandbox exited {:?} after Shutdown", asked.elapsed());
            if !exited {
                tracing::warn!(
                    "the sandbox did not exit within {}s of Shutdown; killing it",
                    SHUTDOWN_GRACE.as_secs()
                );
                self.kill_sandbox();
                self.wait_exited(SHUTDOWN_GRACE);
            }
        }
        let _ = std::fs::remove_file(&self.paths.agent);
        let _ = std::fs::remove_file(self.state.agent_sock());
        let t = Instant::now();
        self.run_after_end();
        tracing::debug!("backend clean-up took {:?}", t.elapsed());
        let t = Instant::now();
        self.finish_state(&end);
        tracing::debug!("state clean-up took {:?}", t.elapsed());
        std::process::exit(code)
    }

    /// Sends our session header and a Shutdown frame without waiting for
    /// the agent's header, so a wedged agent costs at most the write
    /// timeout before the sandbox is killed instead.
    ///
    /// The connection is returned to be held open until the sandbox has
    /// exited: closing it at once would make the agent's own header write
    /// fail before it reads the Shutdown frame.
    fn ask_agent_to_exit(&self) -> Option<Box<dyn std::any::Any>> {
        if self.is_vm {
            // Through the VM's vsock muxer: CONNECT, OK, handshake, then
            // the Shutdown frame.
            let mut s =
                Session::connect_hybrid(&self.paths.agent, boxdesk_channel::AGENT_PORT).ok()?;
            let _ = s.send(&Frame::Shutdown);
            return Some(Box::new(s));
        }
        let mut s = self.agent.connect().ok()?;
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        if s.write_all(&boxdesk_channel::session_header()).is_ok() {
            let _ = FrameWriter::new(&mut s).write_frame(&Frame::Shutdown);
        }
        Some(Box::new(s))
    }

    fn has_exited(&self) -> bool {
        match lock(&self.vm).as_ref() {
            Some(vm) => vm.wait_timeout(Duration::ZERO).is_some(),
            None => *lock(&self.exited),
        }
    }

    fn wait_exited(&self, limit: Duration) -> bool {
        if let Some(vm) = lock(&self.vm).clone() {
            return vm.wait_timeout(limit).is_some();
        }
        let guard = lock(&self.exited);
        let (guard, _) = self
            .exited_cv
            .wait_timeout_while(guard, limit, |exited| !*exited)
            .unwrap_or_else(|p| p.into_inner());
        *guard
    }

    /// SIGKILL to bwrap's monitor; `--die-with-parent` takes the agent,
    /// and with PID 1 gone the kernel ends the whole pid namespace.
    fn kill_sandbox(&self) {
        if let Some(vm) = lock(&self.vm).as_ref() {
            vm.kill();
            return;
        }
        let exited = lock(&self.exited);
        let pid = self.sandbox_pid.load(Ordering::SeqCst);
        if !*exited && pid != 0 {
            let _ = signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
    }

    fn run_after_end(&self) {
        let hooks = std::mem::take(&mut *lock(&self.after_end));
        for hook in hooks {
            hook();
        }
    }

    /// The one rule for the state dir at the end (see [`boxdesk_sandbox::state`]).
    fn finish_state(&self, end: &End) {
        match end {
            End::Stop if self.keep => self.state.mark_stopped(),
            End::Stop => {
                if let Err(e) = self.state.remove() {
                    tracing::warn!("cannot remove {}: {e}", self.state.dir.display());
                }
                let _ = std::fs::remove_file(&self.paths.log);
                let _ = std::fs::remove_file(boxdesk_sandbox::log::rotated(&self.paths.log));
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
        if let Some(l) = lock(&self.lock).take() {
            l.release();
        }
    }
}

/// Runs the helper; returns only on a startup failure (after cleaning up
/// what it made). Once running, it ends the process itself.
pub fn run(opts: HelperOptions) -> Result<std::convert::Infallible, HelperError> {
    let started = Instant::now();
    // Before any thread exists, so every thread inherits the mask and
    // only the signal thread takes these.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&signals), None)
        .map_err(|e| os("blocking signals")(e.into()))?;
    // SAFETY: SIG_IGN installs no handler code; nothing else in this
    // process manages SIGPIPE.
    unsafe { signal::signal(Signal::SIGPIPE, signal::SigHandler::SigIgn) }
        .map_err(|e| os("ignoring SIGPIPE")(e.into()))?;

    let runtime = dirs::runtime_dir()?;
    let paths = SandboxPaths::new(&runtime, &opts.name)?;
    let name_lock = NameLock::acquire(&runtime, &opts.name)?;
    let control = socket::bind_exclusive(&paths.sock)?;
    let is_vm = opts.vm.is_some();
    let agent_listener = if is_vm {
        // The VM's vsock device binds `<name>.agent` itself; make sure no
        // live server holds it.
        match socket::clear_if_stale(&paths.agent) {
            Ok(socket::Staleness::Live) => {
                let _ = std::fs::remove_file(&paths.sock);
                return Err(SocketError::InUse(paths.agent.clone()).into());
            }
            Ok(_) => None,
            Err(e) => {
                let _ = std::fs::remove_file(&paths.sock);
                return Err(e.into());
            }
        }
    } else {
        match socket::bind_exclusive(&paths.agent) {
            Ok(l) => Some(l),
            Err(e) => {
                let _ = std::fs::remove_file(&paths.sock);
                return Err(e.into());
            }
        }
    };
    let prepared = dirs::state_dir()
        .map_err(StateError::from)
        .and_then(|root| {
            StateDir::prepare(&root, &opts.name, opts.keep, opts.reuse, state_owner(&opts))
        });
    let state = match prepared {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&paths.sock);
            let _ = std::fs::remove_file(&paths.agent);
            return Err(e.into());
        }
    };
    let agent = Arc::new(AgentAddr::new(&state.agent_sock()).map_err(os("agent socket path"))?);
    let shared = Arc::new(Shared {
        name: opts.name.clone(),
        cpus: if is_vm {
            Some(opts.cpus.unwrap_or(DEFAULT_VCPUS))
        } else {
            opts.cpus
        },
        mem_mib: if is_vm {
            Some(opts.mem_mib.unwrap_or(DEFAULT_MEM_MIB))
        } else {
            opts.mem_mib
        },
        net: opts.net,
        keep: opts.keep,
        reused: opts.reuse,
        started,
        ready_ms: AtomicU64::new(0),
        phase: Mutex::new(Phase::Starting),
        sandbox_pid: AtomicU32::new(0),
        exited: Mutex::new(false),
        exited_cv: Condvar::new(),
        stopping: AtomicBool::new(false),
        paths: paths.clone(),
        state,
        agent: Arc::clone(&agent),
        lock: Mutex::new(Some(name_lock)),
        vm: Mutex::new(None),
        is_vm,
        rootfs: opts
            .vm
            .as_ref()
            .and_then(|v| v.rootfs.as_ref().map(|r| r.0.clone())),
        extra_info: Mutex::new(Vec::new()),
        after_end: Mutex::new(Vec::new()),
    });

    let sh = Arc::clone(&shared);
    spawn_thread("signals", move || {
        if let Ok(sig) = signals.wait() {
            tracing::info!("{sig}: stopping");
        }
        sh.teardown(0, End::Stop)
    })?;
    let sh: Arc<dyn Sandbox> = Arc::clone(&shared) as Arc<dyn Sandbox>;
    spawn_thread("control-accept", move || {
        let e = control::server::serve(control, sh);
        tracing::error!("control socket: {e}");
    })?;

    tracing::debug!("sockets bound, state dir ready at {:?}", started.elapsed());
    if let Some(vm_opts) = &opts.vm {
        return run_vm(&shared, &opts, vm_opts);
    }
    bwrap::run(shared, opts, agent_listener, agent)
}

/// Who owns the state dir's writable dirs: root inside the sandbox (a
/// namespace sandbox of a root helper: the subordinate id), else us.
fn state_owner(opts: &HelperOptions) -> boxdesk_sandbox::state::Owner {
    #[cfg(target_os = "linux")]
    if opts.vm.is_none() {
        let ids = boxdesk_sandbox::namespace::IdMap::for_this_process();
        return boxdesk_sandbox::state::Owner {
            uid: ids.uid,
            gid: ids.gid,
        };
    }
    let _ = opts;
    // SAFETY: getuid/getgid cannot fail.
    unsafe {
        boxdesk_sandbox::state::Owner {
            uid: libc::getuid(),
            gid: libc::getgid(),
        }
    }
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), HelperError> {
    std::thread::Builder::new()
        .name(name.into())
        .stack_size(128 * 1024)
        .spawn(f)
        .map(drop)
        .map_err(os("starting a thread"))
}

/// How long a VM's agent may take to answer (a boot under nested TCG in
/// CI takes seconds).
const VM_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The `kvm` backend: boots the VM, waits for its agent through the vsock
/// muxer on `<name>.agent`, reports ready, then waits for the VM to end.
fn run_vm(
    shared: &Arc<Shared>,
    opts: &HelperOptions,
    v: &VmOptions,
) -> Result<std::convert::Infallible, HelperError> {
    let started = shared.started;
    let image = match boxdesk_vmm::image::find(
        std::env::consts::ARCH,
        v.kernel.clone(),
        v.initrd.clone(),
    ) {
        Ok(i) => i,
        Err(e) => return Err(fail(shared, None, e.into())),
    };
    let console = match boxdesk_sandbox::log::open(&shared.paths.log) {
        Ok(f) => f,
        Err(e) => return Err(fail(shared, None, os("opening the console log")(e))),
    };
    let spec = boxdesk_vmm::VmSpec {
        kernel: image.kernel,
        initrd: image.initrd,
        mem_mib: opts.mem_mib.unwrap_or(DEFAULT_MEM_MIB),
        vcpus: opts.cpus.unwrap_or(DEFAULT_VCPUS),
        vsock_uds: shared.paths.agent.clone(),
        console,
        rootfs: v.rootfs.clone(),
    };
    let vm = match boxdesk_vmm::RunningVm::start(spec) {
        Ok(vm) => Arc::new(vm),
        Err(e) => return Err(fail(shared, None, e.into())),
    };
    *lock(&shared.vm) = Some(Arc::clone(&vm));
    tracing::debug!("VM started at {:?}", started.elapsed());
    // The agent prints its ready line on the console once it listens:
    // watch for it on the host side (free for the guest) and only then
    // connect; a connect attempt before that costs the booting guest a
    // vsock REQUEST and its RST. Attempts every 50 ms anyway, in case the
    // line was missed.
    let deadline = Instant::now() + VM_READY_TIMEOUT;
    let mut last_try = Instant::now();
    loop {
        if let Some(end) = vm.wait_timeout(Duration::from_millis(1)) {
            let e = HelperError::VmDied {
                end,
                log: shared.paths.log.clone(),
                tail: vm.serial_tail(),
            };
            return Err(fail(shared, None, e));
        }
        let announced = vm.serial_tail().contains("guest-agent ready");
        if announced || last_try.elapsed() >= Duration::from_millis(50) {
            last_try = Instant::now();
            if Session::connect_hybrid(&shared.paths.agent, boxdesk_channel::AGENT_PORT).is_ok() {
                break;
            }
        }
        if Instant::now() > deadline {
            vm.kill();
            let e = HelperError::NotReady {
                log: shared.paths.log.clone(),
                tail: vm.serial_tail(),
            };
            return Err(fail(shared, None, e));
        }
    }
    shared.ready_ms.store(
        started.elapsed().as_millis().max(1) as u64,
        Ordering::Relaxed,
    );
    *lock(&shared.phase) = Phase::Running;
    tracing::info!(
        "VM {} ready in {} ms",
        opts.name,
        started.elapsed().as_millis()
    );
    let _ready = opts
        .ready
        .as_ref()
        .and_then(|fd| fd.try_clone().ok())
        .map(|fd| {
            let mut f = File::from(fd);
            let _ = f.write_all(b"R");
            f
        });
    let end = vm.wait();
    if !shared.stopping.load(Ordering::SeqCst) {
        let tail = vm.serial_tail();
        let panicked = tail.contains("Kernel panic");
        let why = match &end {
            boxdesk_vmm::VmEnd::Reset if panicked => {
                tracing::error!("the guest kernel panicked; console tail:\n{tail}");
                "the guest kernel panicked".to_owned()
            }
            boxdesk_vmm::VmEnd::Reset => {
                tracing::error!(
                    "the guest rebooted itself (a VM cannot reboot: stopping); console tail:\n{tail}"
                );
                "the guest rebooted itself".to_owned()
            }
            boxdesk_vmm::VmEnd::Poweroff => {
                tracing::info!("the guest powered off; the sandbox stops");
                shared.teardown(0, End::Stop);
            }
            boxdesk_vmm::VmEnd::Killed => "the VM was killed".to_owned(),
            boxdesk_vmm::VmEnd::Crash { reason, serial } => {
                tracing::error!("the VM crashed: {reason}; console tail:\n{serial}");
                format!("the VM crashed: {reason}")
            }
        };
        shared.teardown(1, End::Died(why));
    }
    loop {
        std::thread::park();
    }
}

/// Cleans up after a failed start and hands the error back. If a signal
/// already started a teardown, that one finishes and exits instead.
fn fail(shared: &Arc<Shared>, child: Option<Child>, e: HelperError) -> HelperError {
    if shared.stopping.swap(true, Ordering::SeqCst) {
        loop {
            std::thread::park();
        }
    }
    let _ = std::fs::remove_file(&shared.paths.sock);
    if let Some(vm) = lock(&shared.vm).take() {
        vm.kill();
    }
    let _ = std::fs::remove_file(&shared.paths.agent);
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
    shared.run_after_end();
    // The log explains the failure: keep it. A state dir this run did not
    // make (`--reuse`, `--keep`) is not this run's to remove.
    if !shared.keep && !shared.reused {
        let _ = shared.state.remove();
    }
    if let Some(l) = lock(&shared.lock).take() {
        l.release();
    }
    e
}
