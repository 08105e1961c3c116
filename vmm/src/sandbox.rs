//! A running VM sandbox: [`VmSandbox`], the VM backend's
//! [`boxdesk_sandbox::Sandbox`] (`kvm` on Linux, `hvf` on macOS). Its
//! constructor takes the common [`SandboxSpec`], what only a VM needs
//! ([`Boot`]: the kernel and initramfs, else the image lookup of
//! [`crate::image`]) and where its hybrid vsock socket and console log go;
//! it starts the VM. Readiness is the agent's "guest-agent ready" line on
//! the console, confirmed by a handshake through the vsock muxer; the end
//! is how the guest ended ([`VmEnd`]) turned into the reason its owner
//! records.
//!
//! This module owns a VM sandbox's life on the host and its ready timeout.
//! It must never report anything but a VM (`isolation vm`), and never
//! remove the hybrid socket while the VM's muxer may still serve it.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, Session, AGENT_PORT};
use boxdesk_platform::screen::{InputSink, Screen};
use boxdesk_platform::socket::{self, SocketError, Staleness};
use boxdesk_sandbox::keeper::{Keeper, Starter};
use boxdesk_sandbox::running::{
    Ended, Endpoint, Info, InsideListener, Net, Rootfs, Sandbox, SandboxSpec, Share, StartError,
    Unsupported,
};
use boxdesk_sandbox::state::Owner;

use crate::image::{self, ImageError};
use crate::mounts::{MountsError, VmMounts, VmShare};
use crate::oom::OomCounter;
use crate::{RunningVm, VmEnd, VmSpec, VmmError};

/// vCPUs of a VM when the spec sets none.
pub const DEFAULT_VCPUS: u32 = 1;
/// RAM of a VM in MiB when the spec sets none.
pub const DEFAULT_MEM_MIB: u32 = 512;
/// How long a VM's agent may take to answer (a boot under nested TCG in
/// CI takes seconds).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What a VM boots, where it differs from the image lookup.
#[derive(Debug, Clone, Default)]
pub struct Boot {
    /// The kernel, else the image's.
    pub kernel: Option<PathBuf>,
    /// The initramfs, else the image's.
    pub initrd: Option<PathBuf>,
    /// Jail this process once the VM is built (`jail`): the helper's,
    /// whose only work is the VM; never a process that does other work
    /// too (cowork).
    pub jail: bool,
    /// Under `--root host`, the shares of the copies of the host's `/etc`
    /// files ([`VmMounts::etc_copies`]), made by the caller while it still
    /// sees the host's `/etc` (a helper before it enters its view).
    pub etc: Vec<VmShare>,
}

/// Why a VM sandbox could not start (inside [`StartError::Backend`]).
#[derive(Debug, thiserror::Error)]
pub enum VmSandboxError {
    /// No guest image could be found.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The VM could not be built or started.
    #[error("cannot start the VM: {0}")]
    Vmm(VmmError),
    /// The hybrid socket is held by a live server, or cannot be cleared.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The console log could not be opened.
    #[error("opening the console log")]
    Log(#[source] std::io::Error),
    /// A share a VM cannot have.
    #[error("cannot share {} into a VM: {why}", path.display())]
    Share {
        /// The host path.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// `--root host` cannot be had here.
    #[error(transparent)]
    Mounts(#[from] MountsError),
    /// A VM has no network device yet.
    #[error("the VM backend has no network device yet: a VM cannot have the host's network")]
    Net,
    /// An OCI container's layout: the VM backend does not run containers.
    #[error("the VM backend does not run OCI containers yet: use the namespace backend (annotation io.boxdesk.backend=namespace)")]
    Container,
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<VmmError> for VmSandboxError {
    fn from(e: VmmError) -> Self {
        VmSandboxError::Vmm(e)
    }
}

/// A started VM sandbox. Dropping it kills the VM.
#[derive(Debug)]
pub struct VmSandbox {
    vm: RunningVm,
    agent: PathBuf,
    log: PathBuf,
    net: &'static str,
    rootfs: String,
    shares: String,
    vcpus: u32,
    mem_mib: u32,
    relays: Vec<u16>,
    /// `--root host`: the host's system dirs shared and where the copies of
    /// its /etc files are (`info`'s `host_system`, `etc_copies`).
    host_info: Vec<(&'static str, String)>,
    oom_kills: Arc<AtomicU64>,
    stopping: AtomicBool,
    ended: OnceLock<Ended>,
}

impl VmSandbox {
    /// Boots the VM of `spec` (its workspace is not shared: a VM keeps its
    /// writable dirs in the guest), its vsock muxer on `agent`, its console
    /// into `log`. Returns once the vCPUs run, before the agent answers
    /// ([`Sandbox::wait_ready`]).
    pub fn start(
        spec: &SandboxSpec,
        boot: Boot,
        agent: PathBuf,
        log: PathBuf,
    ) -> Result<Self, StartError> {
        Self::start_inner(spec, boot, agent, log).map_err(StartError::backend)
    }

    fn start_inner(
        spec: &SandboxSpec,
        boot: Boot,
        agent: PathBuf,
        log: PathBuf,
    ) -> Result<Self, VmSandboxError> {
        if spec.container.is_some() {
            return Err(VmSandboxError::Container);
        }
        let mut mounts = vm_mounts(spec)?;
        let mut host_info = Vec::new();
        if spec.rootfs == Rootfs::Host {
            mounts.shares.extend(boot.etc.iter().cloned());
            let words = |paths: Vec<String>| {
                if paths.is_empty() {
                    "none".to_owned()
                } else {
                    paths.join(",")
                }
            };
            let system = mounts
                .system
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            let etc = boot
                .etc
                .iter()
                .map(|s| s.guest.display().to_string())
                .collect();
            host_info.push(("host_system", words(system)));
            host_info.push(("etc_copies", words(etc)));
        }
        if spec.net != Net::None {
            return Err(VmSandboxError::Net);
        }
        // The vsock device binds `agent` itself: make sure no live server
        // holds it.
        if socket::clear_if_stale(&agent)? == Staleness::Live {
            return Err(SocketError::InUse(agent).into());
        }
        let image = image::find(std::env::consts::ARCH, boot.kernel, boot.initrd)?;
        let oom_kills = Arc::new(AtomicU64::new(0));
        let console = OomCounter::new(
            boxdesk_sandbox::log::open(&log).map_err(VmSandboxError::Log)?,
            oom_kills.clone(),
        );
        let vcpus = spec.resources.cpus.unwrap_or(DEFAULT_VCPUS);
        let mem_mib = spec.resources.mem_mib.unwrap_or(DEFAULT_MEM_MIB);
        let (rootfs, disk) = match &spec.rootfs {
            Rootfs::Default => ("initramfs".to_owned(), None),
            Rootfs::Host => ("host".to_owned(), None),
            Rootfs::Image { path, writable } => {
                (path.display().to_string(), Some((path.clone(), *writable)))
            }
        };
        let vm = RunningVm::start(VmSpec {
            kernel: image.kernel,
            initrd: image.initrd,
            mem_mib,
            vcpus,
            vsock_uds: agent.clone(),
            console: Box::new(console),
            rootfs: disk,
            mounts,
            relays: spec.relays.clone(),
            display: spec.display,
            jail: boot.jail,
        });
        let vm = match vm {
            Ok(vm) => vm,
            Err(e) => {
                let _ = std::fs::remove_file(&agent);
                return Err(e.into());
            }
        };
        Ok(VmSandbox {
            vm,
            agent,
            log,
            net: spec.net.word(),
            rootfs,
            shares: Share::info_word(&spec.shares),
            vcpus,
            mem_mib,
            relays: spec.relays.clone(),
            host_info,
            oom_kills,
            stopping: AtomicBool::new(false),
            ended: OnceLock::new(),
        })
    }

    /// Where the muxer hands the guest's connections to host port `port`.
    fn relay_socket(&self, port: u16) -> PathBuf {
        relay_socket(&self.agent, port)
    }

    /// Removes the VM's sockets: the hybrid one and its relays'.
    fn remove_sockets(&self) {
        let _ = std::fs::remove_file(&self.agent);
        for &port in &self.relays {
            let _ = std::fs::remove_file(self.relay_socket(port));
        }
    }

    /// How the VM's end reads to its owner, logged once.
    fn ended_as(&self, end: VmEnd) -> &Ended {
        self.ended.get_or_init(|| {
            // The muxer is down with the VM: its sockets can go.
            self.remove_sockets();
            if self.stopping.load(Ordering::SeqCst) {
                return Ended::Stopped;
            }
            let tail = self.vm.serial_tail();
            match end {
                VmEnd::Reset if tail.contains("Kernel panic") => {
                    tracing::error!("the guest kernel panicked; console tail:\n{tail}");
                    Ended::Died("the guest kernel panicked".to_owned())
                }
                VmEnd::Reset => {
                    tracing::error!(
                        "the guest rebooted itself (a VM cannot reboot: stopping); console tail:\n{tail}"
                    );
                    Ended::Died("the guest rebooted itself".to_owned())
                }
                VmEnd::Poweroff => {
                    tracing::info!("the guest powered off; the sandbox stops");
                    Ended::PoweredOff
                }
                VmEnd::Killed => Ended::Died("the VM was killed".to_owned()),
                VmEnd::Crash { reason, serial } => {
                    tracing::error!("the VM crashed: {reason}; console tail:\n{serial}");
                    Ended::Died(format!("the VM crashed: {reason}"))
                }
            }
        })
    }
}

/// `info`'s `display`: `WxH` (the largest mode) or `none`.
fn display_word(display: Option<&crate::Display>) -> String {
    match display {
        Some(d) => {
            let (w, h) = d.screen.max_size();
            format!("{w}x{h}")
        }
        None => "none".to_owned(),
    }
}

/// The muxer's convention (Firecracker's): a guest connection to host
/// vsock port `port` goes to `<agent>_<port>`.
fn relay_socket(agent: &Path, port: u16) -> PathBuf {
    let mut p = agent.as_os_str().to_owned();
    p.push(format!("_{port}"));
    PathBuf::from(p)
}

/// The VM's shares and root of `spec`. A VM shares directories (a file's
/// share is a namespace bind only). A share follows what is mounted
/// beneath its host directory later in the VMM's own mount namespace:
/// the file server opens each name when the guest looks it up (within the
/// share's cache time of it appearing). Under `--root host` the workspace's `root/`, `work/` and
/// `results/` back `/root`, `/work`, `/results`, as in the namespace
/// backend; the user's shares come after, so they may sit beneath those.
fn vm_mounts(spec: &SandboxSpec) -> Result<VmMounts, VmSandboxError> {
    let mut mounts = match spec.rootfs {
        Rootfs::Host => VmMounts::host_root(std::path::Path::new("/"), std::env::consts::ARCH)?,
        _ => VmMounts::default(),
    };
    if spec.rootfs == Rootfs::Host {
        if let Some(ws) = &spec.workspace {
            for (host, guest) in [
                (ws.root(), "/root"),
                (ws.work(), "/work"),
                (ws.results(), "/results"),
            ] {
                mounts.shares.push(VmShare {
                    host,
                    guest: guest.into(),
                    writable: true,
                });
            }
        }
    }
    for s in &spec.shares {
        let refuse = |why| VmSandboxError::Share {
            path: s.host.clone(),
            why,
        };
        if !s.host.is_dir() {
            return Err(refuse(
                "a VM shares directories only (a file can be shared into a namespace sandbox)",
            ));
        }
        mounts.shares.push(VmShare {
            host: s.host.clone(),
            guest: s.inside.clone(),
            writable: s.writable,
        });
    }
    Ok(mounts)
}

impl Sandbox for VmSandbox {
    fn wait_ready(&self) -> Result<(), StartError> {
        // The agent prints its ready line on the console once it listens:
        // watch for it on the host side (free for the guest) and only then
        // connect; a connect attempt before that costs the booting guest a
        // vsock REQUEST and its RST. Attempts every 50 ms anyway, in case
        // the line was missed.
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_try = Instant::now();
        loop {
            if let Some(end) = self.vm.wait_timeout(Duration::from_millis(1)) {
                self.remove_sockets();
                return Err(StartError::Died {
                    how: format!("the VM ended ({end:?})"),
                    log: self.log.clone(),
                    tail: self.vm.serial_tail(),
                });
            }
            let announced = self.vm.serial_tail().contains("guest-agent ready");
            if announced || last_try.elapsed() >= Duration::from_millis(50) {
                last_try = Instant::now();
                if Session::connect_hybrid(&self.agent, AGENT_PORT).is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                self.kill();
                self.remove_sockets();
                return Err(StartError::NotReady {
                    within: READY_TIMEOUT,
                    log: self.log.clone(),
                    tail: self.vm.serial_tail(),
                });
            }
        }
    }

    fn agent(&self) -> Endpoint {
        Endpoint::Hybrid {
            path: self.agent.clone(),
            port: AGENT_PORT,
        }
    }

    fn listen_inside(&self, port: u16) -> Result<InsideListener, StartError> {
        if !self.relays.contains(&port) {
            return Err(StartError::backend(Unsupported(format!(
                "this VM relays no connections to 127.0.0.1:{port}: a VM's relays are set when it starts"
            ))));
        }
        let path = self.relay_socket(port);
        let live = socket::clear_if_stale(&path).map_err(StartError::backend)?;
        if live == Staleness::Live {
            return Err(StartError::backend(SocketError::InUse(path)));
        }
        UnixListener::bind(&path)
            .map(InsideListener::Unix)
            .map_err(|e| {
                StartError::backend(Unsupported(format!("binding {}: {e}", path.display())))
            })
    }

    fn oom_kills(&self) -> Option<u64> {
        Some(self.oom_kills.load(Ordering::SeqCst))
    }

    fn screen(&self) -> Option<Arc<Screen>> {
        Some(self.vm.display()?.screen.clone())
    }

    fn input(&self) -> Option<Arc<dyn InputSink>> {
        Some(self.vm.display()?.input.clone())
    }

    fn info(&self) -> Info {
        Info {
            backend: if cfg!(target_os = "macos") {
                "hvf"
            } else {
                "kvm"
            },
            isolation: "vm",
            channel: "vsock",
            net: self.net,
            rootfs: self.rootfs.clone(),
            ready_key: "boot_ms",
            more: vec![
                ("vcpus", self.vcpus.to_string()),
                ("mem_mib", self.mem_mib.to_string()),
                ("shares", self.shares.clone()),
                ("display", display_word(self.vm.display())),
            ]
            .into_iter()
            .chain((self.vm.display()).map(|d| ("presents", d.screen.presents().to_string())))
            .chain(self.host_info.iter().cloned())
            .collect(),
        }
    }

    fn stop(&self, grace: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(end) = self.vm.wait_timeout(Duration::ZERO) {
            self.ended_as(end);
            return;
        }
        // Through the VM's vsock muxer: CONNECT, OK, handshake, then the
        // Shutdown frame; held open until the VM has ended.
        let _conn = Session::connect_hybrid(&self.agent, AGENT_PORT)
            .ok()
            .map(|mut s| {
                let _ = s.send(&Frame::Shutdown);
                s
            });
        let end = match self.vm.wait_timeout(grace) {
            Some(end) => end,
            None => {
                tracing::warn!(
                    "the sandbox did not exit within {}s of Shutdown; killing it",
                    grace.as_secs()
                );
                self.vm.kill();
                self.vm.wait()
            }
        };
        self.ended_as(end);
    }

    fn kill(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.vm.kill();
    }

    fn wait(&self) -> Ended {
        let end = self.vm.wait();
        self.ended_as(end).clone()
    }

    fn log_tail(&self) -> String {
        self.vm.serial_tail()
    }
}

/// The VM backend's [`Starter`]: a kept sandbox's vsock muxer on the
/// claim's `<name>.agent`, the VM run by this process's threads (so its
/// shares follow the mounts this process makes beneath them). `resources`
/// fills in what a spec leaves unset (its owner's defaults).
#[derive(Debug, Clone, Default)]
pub struct VmStarter {
    /// vCPUs and memory where a spec sets none.
    pub defaults: boxdesk_sandbox::running::Resources,
}

impl Starter for VmStarter {
    fn start(
        &self,
        spec: &SandboxSpec,
        keeper: &Keeper,
        log: &Path,
    ) -> Result<Box<dyn Sandbox>, StartError> {
        let mut spec = spec.clone();
        spec.resources.cpus = spec.resources.cpus.or(self.defaults.cpus);
        spec.resources.mem_mib = spec.resources.mem_mib.or(self.defaults.mem_mib);
        let etc = match spec.rootfs {
            Rootfs::Host => VmMounts::etc_copies(Path::new("/"), &keeper.state().etc())
                .map_err(|e| StartError::backend(VmSandboxError::from(e)))?,
            _ => Vec::new(),
        };
        let vm = VmSandbox::start(
            &spec,
            Boot {
                etc,
                ..Boot::default()
            },
            keeper.paths().agent.clone(),
            log.to_owned(),
        )?;
        Ok(Box::new(vm))
    }

    /// Root inside a VM reaches the host only through the file server,
    /// which runs as this process.
    fn inside_owner(&self) -> Owner {
        Owner::us()
    }

    fn backend(&self) -> &'static str {
        if cfg!(target_os = "macos") {
            "hvf"
        } else {
            "kvm"
        }
    }
}
