//! `boxdesk __vmm`: the one process per sandbox. It claims the name (its
//! lock, `<name>.sock`, its state dir: a [`Keeper`]), starts the sandbox
//! its backend makes, waits for its agent, tells its starter it is ready
//! (one byte on a pipe), then serves the control socket until `stop`, a
//! signal, or the sandbox's end, and exits.
//!
//! Threads: main (starts the sandbox, then waits for it to end), control
//! accept (+ one per connection), one that takes SIGTERM/SIGINT/SIGHUP,
//! and the sandbox's own ([`boxdesk_sandbox::Sandbox`]). SIGPIPE is
//! ignored, so a vanished peer is an `EPIPE` on its own connection.
//!
//! This module owns the process: signals, exit codes, which of the two
//! ends a sandbox's end is. It must never exit because of what a peer sent,
//! and never branch on the backend past [`start`], which picks the one
//! implementation; what `info` says comes from the sandbox.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

#[cfg(target_os = "linux")]
mod view;

use boxdesk_sandbox::keeper::{End, Keeper, KeeperError};
use boxdesk_sandbox::running::{Ended, Net, Rootfs, Sandbox, SandboxSpec, Share, StartError};
use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};

pub use boxdesk_vmm::sandbox::DEFAULT_MEM_MIB;

/// What `boxdesk __vmm` was asked to run.
#[derive(Debug)]
pub struct HelperOptions {
    /// The sandbox's name (already valid or refused here).
    pub name: String,
    /// `--cpus`: vCPUs of a VM (default [`boxdesk_vmm::sandbox::DEFAULT_VCPUS`]), a CPU quota of
    /// a namespace sandbox (default none; refused where cgroups cannot hold it).
    pub cpus: Option<u32>,
    /// `--mem`: RAM of a VM (default [`DEFAULT_MEM_MIB`]), a memory limit of
    /// a namespace sandbox (default half the host's RAM where cgroups hold
    /// it; a `--mem` or `--cpus` they cannot hold is refused).
    pub mem_mib: Option<u32>,
    /// Share the host network.
    pub net: bool,
    /// Keep the state dir and log after stop.
    pub keep: bool,
    /// Run over a state dir an earlier sandbox of this name left.
    pub reuse: bool,
    /// Most processes and threads inside (namespace backend).
    pub pids: u64,
    /// Size of `/tmp` and `/dev/shm`, bytes (namespace backend).
    pub tmp_bytes: u64,
    /// Where to write one byte once ready. Closed without a byte on a
    /// failed start; otherwise held open until the helper exits, so the
    /// starter sees end-of-file exactly when the helper is gone.
    pub ready: Option<OwnedFd>,
    /// Host paths shared in (`--share`), in order.
    pub shares: Vec<Share>,
    /// `--root host`: the host's system as `/` (a VM's over virtio-fs).
    pub root_host: bool,
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
    /// `--display WxH`.
    pub display: Option<(u32, u32)>,
    /// Under `--root host`, the shares of the copies of the host's `/etc`
    /// files, once made (before the helper enters its view, which has no
    /// `/etc`).
    pub etc: Option<Vec<boxdesk_vmm::mounts::VmShare>>,
}

/// Why the helper could not start or run its sandbox.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The name could not be claimed (runtime dir, name, lock, control
    /// socket, state dir).
    #[error(transparent)]
    Claim(#[from] KeeperError),
    /// The backend cannot run here.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// The sandbox could not start, or its agent never answered.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The VM helper could not enter its own view of the file system.
    #[cfg(target_os = "linux")]
    #[error(
        "cannot jail the VM helper (BOXDESK_JAIL=off runs it unjailed, which is not recommended)"
    )]
    View(#[source] boxdesk_vmm::jail::view::ViewError),
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

/// Runs the helper; returns only on a startup failure (after cleaning up
/// what it made). Once running, it ends the process itself.
pub fn run(opts: HelperOptions) -> Result<std::convert::Infallible, HelperError> {
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

    let on_stop = Box::new(|| std::process::exit(0));
    let (keeper, control) = Keeper::claim(&opts.name, opts.keep, opts.reuse, on_stop)?;
    // A VM helper's view of the file system, while it has one thread (it
    // pins the image it finds in `opts`).
    #[cfg(target_os = "linux")]
    let mut opts = opts;
    #[cfg(target_os = "linux")]
    if opts.vm.is_some() && !view::jail_off() {
        if let Err(e) = view::enter(&mut opts, &keeper) {
            return Err(fail(&keeper, e));
        }
    }
    let k = Arc::clone(&keeper);
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                tracing::info!("{sig}: stopping");
            }
            end(&k, 0, End::Stop)
        })
        .and_then(|_| keeper.serve(control));
    if let Err(e) = spawned {
        return Err(fail(&keeper, os("starting a thread")(e)));
    }

    let sandbox: Arc<dyn Sandbox> = match start(&opts, &keeper) {
        Ok(s) => Arc::from(s),
        Err(e) => return Err(fail(&keeper, e)),
    };
    keeper.hold(Arc::clone(&sandbox));
    if let Err(e) = sandbox.wait_ready() {
        return Err(fail(&keeper, e.into()));
    }
    keeper.ready();
    // Kept open (not dropped) until the process exits.
    let _ready = opts.ready.map(|fd| {
        let mut f = File::from(fd);
        let _ = f.write_all(b"R");
        f
    });

    let ended = sandbox.wait();
    if !keeper.ending() {
        match ended {
            Ended::Stopped | Ended::PoweredOff => end(&keeper, 0, End::Stop),
            Ended::Died(why) => end(&keeper, 1, End::Died(why)),
        }
    }
    loop {
        std::thread::park();
    }
}

/// Starts the sandbox of `opts` over `keeper`'s claim: the one place that
/// picks a backend's implementation.
fn start(opts: &HelperOptions, keeper: &Keeper) -> Result<Box<dyn Sandbox>, HelperError> {
    let mut spec: SandboxSpec = keeper.spec();
    spec.resources.cpus = opts.cpus;
    spec.resources.mem_mib = opts.mem_mib;
    spec.resources.limits_required = true;
    spec.resources.pids = opts.pids;
    spec.resources.tmp_bytes = opts.tmp_bytes;
    spec.net = if opts.net { Net::Host } else { Net::None };
    spec.shares.clone_from(&opts.shares);
    if opts.root_host {
        spec.rootfs = Rootfs::Host;
    }
    let paths = keeper.paths();
    if let Some(v) = &opts.vm {
        spec.display = v.display;
        if let Some((path, writable)) = &v.rootfs {
            spec.rootfs = Rootfs::Image {
                path: path.clone(),
                writable: *writable,
            };
        }
        let etc = match (&v.etc, opts.root_host) {
            (Some(made), _) => made.clone(),
            (None, true) => etc_copies(keeper)?,
            (None, false) => Vec::new(),
        };
        let boot = boxdesk_vmm::sandbox::Boot {
            kernel: v.kernel.clone(),
            initrd: v.initrd.clone(),
            jail: jail(),
            etc,
        };
        let vm = boxdesk_vmm::sandbox::VmSandbox::start(
            &spec,
            boot,
            paths.agent.clone(),
            paths.log.clone(),
        )?;
        return Ok(Box::new(vm));
    }
    namespace(&spec, keeper)
}

/// The shares of a `--root host` VM's copies of the host's `/etc` files,
/// written into the sandbox's state dir.
fn etc_copies(keeper: &Keeper) -> Result<Vec<boxdesk_vmm::mounts::VmShare>, HelperError> {
    boxdesk_vmm::mounts::VmMounts::etc_copies(std::path::Path::new("/"), &keeper.state().etc())
        .map_err(|e| {
            HelperError::from(boxdesk_sandbox::running::StartError::backend(
                boxdesk_vmm::sandbox::VmSandboxError::from(e),
            ))
        })
}

/// Whether a VM helper jails itself (`BOXDESK_JAIL=off` says not).
fn jail() -> bool {
    #[cfg(target_os = "linux")]
    return !view::jail_off();
    #[cfg(not(target_os = "linux"))]
    return true;
}

/// The namespace backend: the agent's socket in the state dir (never
/// inside the sandbox), `<name>.agent` forwarded to it.
#[cfg(target_os = "linux")]
fn namespace(spec: &SandboxSpec, keeper: &Keeper) -> Result<Box<dyn Sandbox>, HelperError> {
    use boxdesk_sandbox::namespace::running::{NamespaceSandbox, Places};
    let places = Places {
        agent_sock: keeper.state().agent_sock(),
        front: Some(keeper.paths().agent.clone()),
        log: keeper.paths().log.clone(),
        etc: keeper.state().etc(),
    };
    Ok(Box::new(NamespaceSandbox::start(spec, places)?))
}

/// Off Linux there is no namespace backend:
/// [`crate::backend::Backend::resolve`] refuses it before a helper starts,
/// and a helper asked anyway says so.
#[cfg(not(target_os = "linux"))]
fn namespace(_: &SandboxSpec, _: &Keeper) -> Result<Box<dyn Sandbox>, HelperError> {
    use crate::backend::{Backend, BackendError};
    Err(BackendError::NeedsLinux(Backend::Namespace).into())
}

/// Ends the sandbox by `how` and exits with `code`; a second caller waits
/// for the first to exit the process.
fn end(keeper: &Keeper, code: i32, how: End) -> ! {
    if keeper.end(how) {
        std::process::exit(code)
    }
    loop {
        std::thread::park();
    }
}

/// Undoes the claim after a failed start and hands the error back. If a
/// stop or signal already began an end, that one finishes and exits
/// instead.
fn fail(keeper: &Keeper, e: HelperError) -> HelperError {
    if !keeper.abandon() {
        loop {
            std::thread::park();
        }
    }
    e
}
