//! A running sandbox, whatever backs it: the [`Sandbox`] trait its owner
//! holds one of (the helper process `boxdesk __vmm`, cowork's server), the
//! [`SandboxSpec`] every backend starts from, what `info` says of it
//! ([`Info`]), how a client reaches its agent ([`Endpoint`]), how it
//! ended ([`Ended`]) and why it could not start ([`StartError`]).
//!
//! Two backends implement it: `crate::namespace::running::NamespaceSandbox`
//! (bubblewrap, Linux) in this crate, and `boxdesk_vmm::sandbox::VmSandbox`
//! (a microVM) in the VMM crate, which this crate never depends on. Each is
//! made by a constructor of its own from the common spec plus what only it
//! needs (a VM's kernel; where a namespace sandbox's agent listens), and
//! returns as soon as the sandbox is started; [`Sandbox::wait_ready`] then
//! waits for its agent. From there on its owner sees only this trait.
//!
//! Lifecycle: started → ready ([`Sandbox::wait_ready`]) → ended, by
//! [`Sandbox::stop`] (the agent is asked to shut down, then the sandbox is
//! killed after a grace), [`Sandbox::kill`], or on its own; every end undoes
//! what the backend made on the host (its sockets, its cgroup) before
//! [`Sandbox::wait`] returns.
//!
//! This module owns that contract and no backend: it must never name a
//! backend's types, and an owner holding a `dyn Sandbox` must never need to
//! know which backend it holds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use boxdesk_platform::screen::{InputSink, Screen};

use crate::state::StateDir;
use crate::{DEFAULT_PIDS, DEFAULT_TMP_BYTES};

/// The `PATH` the agent runs with and gives its execs by default, on
/// every backend (the agent is the same program in each).
pub const AGENT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long a sandbox may take to end after its agent was asked to shut
/// down before it is killed (and how long a killed one may take to go).
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// What a sandbox may use. What a backend cannot hold a sandbox to, it
/// says in [`Info`] (a namespace sandbox's `limits unenforced`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    /// CPUs: a VM's vCPUs (its backend's default when `None`), a namespace
    /// sandbox's CPU quota (none when `None`).
    pub cpus: Option<u32>,
    /// Memory in MiB: a VM's RAM (its backend's default when `None`), a
    /// namespace sandbox's memory limit (half the host's RAM when `None`,
    /// where a cgroup can hold it).
    pub mem_mib: Option<u32>,
    /// Most processes and threads inside at once.
    pub pids: u64,
    /// Size of `/tmp` and `/dev/shm`, bytes, where the backend sizes them.
    pub tmp_bytes: u64,
    /// A namespace sandbox refuses to start when `cpus` or `mem_mib` cannot
    /// be enforced here, instead of recording them in `info` only. The
    /// CLI's `--cpus`/`--mem` ask for this: a limit the user typed must
    /// hold or be refused.
    pub limits_required: bool,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: None,
            mem_mib: None,
            pids: DEFAULT_PIDS,
            tmp_bytes: DEFAULT_TMP_BYTES,
            limits_required: false,
        }
    }
}

/// The network a sandbox gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Net {
    /// None but its own loopback.
    #[default]
    None,
    /// The host's network, shared.
    Host,
}

impl Net {
    /// The word `info` shows for it.
    pub fn word(self) -> &'static str {
        match self {
            Net::None => "none",
            Net::Host => "host",
        }
    }
}

/// A host directory (or file) that appears inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The host path.
    pub host: PathBuf,
    /// Where it appears inside.
    pub inside: PathBuf,
    /// Whether the sandbox may write to it.
    pub writable: bool,
    /// Whether what is mounted beneath `host` later, while the sandbox
    /// runs, appears inside too (a folder attached to a running cowork
    /// sandbox). A backend that cannot follow the host's mounts refuses
    /// the share rather than start without them.
    pub follows_mounts: bool,
}

impl Share {
    /// The `info` word of shares: `HOST:INSIDE:rw|ro` each, paths
    /// percent-encoded (`boxdesk_platform::pathcode`), comma-separated;
    /// `none` when there are none.
    pub fn info_word(shares: &[Share]) -> String {
        use boxdesk_platform::pathcode::encode;
        if shares.is_empty() {
            return "none".into();
        }
        let one = |s: &Share| {
            let mode = if s.writable { "rw" } else { "ro" };
            format!("{}:{}:{mode}", encode(&s.host), encode(&s.inside))
        };
        shares.iter().map(one).collect::<Vec<_>>().join(",")
    }
}

/// What the sandbox's `/` is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Rootfs {
    /// The backend's own: the host's system, read-only (namespace); the
    /// guest image's initramfs (VM).
    #[default]
    Default,
    /// The host's own system, read-only (`--root host`): the namespace
    /// backend's default; a VM gets the host's `/usr`, `/etc`, … over
    /// virtio-fs.
    Host,
    /// A disk image (a VM's virtio-blk), under a writable overlay unless
    /// `writable`, in which case writes reach the image.
    Image {
        /// The image file.
        path: PathBuf,
        /// Whether writes go to the image itself.
        writable: bool,
    },
}

/// What a sandbox is started from. A backend refuses what it cannot honour
/// ([`StartError::Backend`]) rather than start something else.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The sandbox's name: its hostname inside and the name of what the
    /// backend makes for it on the host (a cgroup).
    pub name: String,
    /// What it may use.
    pub resources: Resources,
    /// Its network.
    pub net: Net,
    /// Host paths shared into it, in order.
    pub shares: Vec<Share>,
    /// A `boxdesk run` sandbox's state dir, whose `root/`, `work/` and
    /// `results/` back its `/root`, `/work` and `/results` where the
    /// backend keeps them on the host (namespace); a VM keeps its writable
    /// dirs in the guest, and `/results` comes back through its agent.
    pub workspace: Option<StateDir>,
    /// `HOME` of the agent and the default of its execs, where the backend
    /// sets it (a VM's agent has its own).
    pub home: PathBuf,
    /// The agent's working directory, where the backend sets it.
    pub cwd: PathBuf,
    /// Its `/`.
    pub rootfs: Rootfs,
    /// Ports whose connections inside to `127.0.0.1:<port>` its owner
    /// will take with [`Sandbox::listen_inside`]. A backend that can
    /// relay any port at any time (namespace) ignores it; one that must
    /// set its relays up at start (a VM's agent) relays only these.
    pub relays: Vec<u16>,
    /// A display of this width and height (a virtio-gpu scanout, keyboard
    /// and tablet), where the backend has one; `None`: no display.
    pub display: Option<(u32, u32)>,
    /// An OCI container's own layout (its root, mounts, capabilities, …):
    /// the sandbox is that container. A backend that cannot honour one
    /// refuses the spec.
    pub container: Option<crate::container::Layout>,
    /// The `/etc/resolv.conf` of a private network whose owner answers DNS
    /// inside ([`Sandbox::dns_sockets`]), placed wherever the host's
    /// `/etc/resolv.conf` leads; `None`: the host's resolver, as on the
    /// host ([`crate::host_system`]).
    pub resolv_conf: Option<String>,
}

impl SandboxSpec {
    /// A sandbox named `name` with the default resources, no network, no
    /// shares, no workspace, the backend's own root, HOME and cwd `/`.
    pub fn new(name: impl Into<String>) -> Self {
        SandboxSpec {
            name: name.into(),
            resources: Resources::default(),
            net: Net::None,
            shares: Vec::new(),
            workspace: None,
            home: "/".into(),
            cwd: "/".into(),
            rootfs: Rootfs::Default,
            relays: Vec::new(),
            display: None,
            container: None,
            resolv_conf: None,
        }
    }

    /// A `boxdesk run` sandbox over `state`: its workspace, HOME `/root`,
    /// cwd `/work`.
    pub fn for_state(name: impl Into<String>, state: &StateDir) -> Self {
        SandboxSpec {
            workspace: Some(state.clone()),
            home: "/root".into(),
            cwd: "/work".into(),
            ..SandboxSpec::new(name)
        }
    }
}

/// Where its owner accepts the connections made inside a sandbox to
/// `127.0.0.1:<port>` ([`Sandbox::listen_inside`]): the socket type is the
/// backend's.
#[derive(Debug)]
pub enum InsideListener {
    /// A TCP listener in the sandbox's own network namespace.
    Tcp(std::net::TcpListener),
    /// A Unix socket its relay hands each connection to (a VM's agent
    /// carries them over vsock).
    Unix(std::os::unix::net::UnixListener),
}

/// A DNS server's sockets inside a sandbox ([`Sandbox::dns_inside`]),
/// non-blocking.
#[derive(Debug)]
pub struct DnsSockets {
    /// Bound to 127.0.0.1:53.
    pub udp: std::net::UdpSocket,
    /// Listening on 127.0.0.1:53.
    pub tcp: std::net::TcpListener,
}

/// How a client reaches a sandbox's agent: the agent client's own type (a
/// Unix socket the agent answers on, or a hybrid-vsock socket and port).
pub use crate::client::Endpoint;

/// What `info` says of a sandbox: the keys every backend reports, then the
/// backend's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Info {
    /// `backend`: `namespace`, `kvm` or `hvf`.
    pub backend: &'static str,
    /// `isolation`: `namespaces` or `vm` — never a VM's for a namespace
    /// sandbox.
    pub isolation: &'static str,
    /// `channel`: how the agent is reached, `unix` or `vsock`.
    pub channel: &'static str,
    /// `net`: `host` or `none`.
    pub net: &'static str,
    /// `rootfs`: `host`, `initramfs` or the image's path.
    pub rootfs: String,
    /// The key its owner reports the time to ready under: `ready_ms`, a
    /// VM's `boot_ms`.
    pub ready_key: &'static str,
    /// The rest, in order: sizes (`vcpus`, `mem_mib`), limits and ids,
    /// `sandbox_pid`.
    pub more: Vec<(&'static str, String)>,
}

/// How a sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// [`Sandbox::stop`] or [`Sandbox::kill`] ended it.
    Stopped,
    /// It ended on its own the way a stop ends it (a guest that powered
    /// off): nothing went wrong.
    PoweredOff,
    /// It ended on its own; why, in one line (what `ls` shows as the
    /// reason of a `dead` sandbox).
    Died(String),
}

/// Why a sandbox could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The backend could not make or start it (a missing bwrap or image,
    /// a refused limit, something the backend cannot honour).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// It ended before its agent answered.
    #[error("{how} before its agent answered; log {}:\n{tail}", log.display())]
    Died {
        /// How it ended (`the sandbox exited (exit status: 1)`).
        how: String,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
    /// Its agent did not answer in time; it has been killed.
    #[error("the agent did not answer within {}s; log {}:\n{tail}", within.as_secs(), log.display())]
    NotReady {
        /// How long it was given.
        within: Duration,
        /// Its log.
        log: PathBuf,
        /// The log's last lines.
        tail: String,
    },
}

/// What a backend cannot do (inside [`StartError::Backend`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsupported(pub String);

impl StartError {
    /// A backend's own error.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StartError::Backend(Box::new(e))
    }
}

/// A started sandbox, whatever backs it.
///
/// Every method may be called from any thread. Dropping one that is still
/// running kills it.
pub trait Sandbox: Send + Sync {
    /// Waits until the agent answers a channel handshake. On an error the
    /// sandbox has ended and what it made on the host is undone.
    fn wait_ready(&self) -> Result<(), StartError>;

    /// How a client reaches the agent.
    fn agent(&self) -> Endpoint;

    /// How the process holding the sandbox reaches the agent: where the
    /// backend has a shorter way for its owner than [`Sandbox::agent`]
    /// (a namespace sandbox's own agent socket, without the forwarding of
    /// the hybrid socket in front of it), that one.
    fn owner_agent(&self) -> Endpoint {
        self.agent()
    }

    /// A listener that accepts, in the owner's process, the TCP
    /// connections made inside the sandbox to `127.0.0.1:port` (how a
    /// sandbox without a network gets one way out the owner controls, such
    /// as a filtering proxy). Call it once the sandbox is ready, once per
    /// port; a backend that sets relays up at start takes only the
    /// [`SandboxSpec::relays`] ports. A backend that cannot relay such
    /// connections refuses.
    fn listen_inside(&self, port: u16) -> Result<InsideListener, StartError> {
        Err(StartError::backend(Unsupported(format!(
            "the {} backend cannot relay connections to 127.0.0.1:{port} inside a sandbox",
            self.info().backend
        ))))
    }

    /// A DNS server's sockets on 127.0.0.1:53 inside a sandbox with a
    /// private network, for its owner to answer on (the resolver its
    /// [`SandboxSpec::resolv_conf`] names). A backend that cannot make
    /// them refuses.
    fn dns_inside(&self) -> Result<DnsSockets, StartError> {
        Err(StartError::backend(Unsupported(format!(
            "the {} backend cannot serve DNS inside a sandbox",
            self.info().backend
        ))))
    }

    /// Processes killed inside for want of memory so far, where the
    /// backend counts them (a namespace sandbox whose limits a cgroup
    /// enforces).
    fn oom_kills(&self) -> Option<u64> {
        None
    }

    /// Its screen, where it has a display (a VM started with one).
    fn screen(&self) -> Option<Arc<Screen>> {
        None
    }

    /// Where its keyboard and pointer events go, where it has a display.
    fn input(&self) -> Option<Arc<dyn InputSink>> {
        None
    }

    /// What `info` says of it now.
    fn info(&self) -> Info;

    /// Ends it: asks its agent to shut down (every process inside is
    /// killed), kills it if it has not ended within `grace`, and undoes what
    /// it made on the host. Returns once that is done (or, for one that does
    /// not die, `grace` after the kill). Calling it again is harmless.
    fn stop(&self, grace: Duration);

    /// Ends it now, without asking its agent; what it made is undone by
    /// the time [`Sandbox::wait`] returns.
    fn kill(&self);

    /// Waits until it has ended and what it made is undone; how it ended.
    /// Any number of threads may wait.
    fn wait(&self) -> Ended;

    /// The last lines of its log (what it printed; a VM's console).
    fn log_tail(&self) -> String;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_spec_keeps_its_state_dir_as_workspace_with_home_root_and_cwd_work() {
        let state = StateDir {
            dir: "/s/n1".into(),
        };
        let spec = SandboxSpec::for_state("n1", &state);
        assert_eq!(spec.workspace.unwrap().dir, state.dir);
        assert_eq!(spec.home, PathBuf::from("/root"));
        assert_eq!(spec.cwd, PathBuf::from("/work"));
        assert_eq!(spec.net, Net::None);
        assert!(spec.shares.is_empty());
        assert_eq!(spec.rootfs, Rootfs::Default);
        assert_eq!(spec.resources.pids, DEFAULT_PIDS);
    }

    /// A backend that implements only what every backend must.
    struct Bare;

    impl Sandbox for Bare {
        fn wait_ready(&self) -> Result<(), StartError> {
            Ok(())
        }
        fn agent(&self) -> Endpoint {
            Endpoint::Hybrid {
                path: "/b.agent".into(),
                port: 1024,
            }
        }
        fn info(&self) -> Info {
            Info {
                backend: "bare",
                isolation: "vm",
                channel: "vsock",
                net: "none",
                rootfs: "initramfs".into(),
                ready_key: "boot_ms",
                more: Vec::new(),
            }
        }
        fn stop(&self, _: Duration) {}
        fn kill(&self) {}
        fn wait(&self) -> Ended {
            Ended::Stopped
        }
        fn log_tail(&self) -> String {
            String::new()
        }
    }

    #[test]
    fn a_backend_without_relays_refuses_to_listen_inside_and_its_owner_uses_the_common_address() {
        let e = Bare.listen_inside(3128).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the bare backend cannot relay connections to 127.0.0.1:3128 inside a sandbox"
        );
        assert_eq!(Bare.owner_agent(), Bare.agent());
        assert_eq!(Bare.oom_kills(), None);
    }

    #[test]
    fn a_start_error_of_a_backend_says_only_what_the_backend_said() {
        let e = StartError::backend(std::io::Error::other("no bwrap here"));
        assert_eq!(e.to_string(), "no bwrap here");
        let e = StartError::NotReady {
            within: Duration::from_secs(20),
            log: "/l".into(),
            tail: "t".into(),
        };
        assert_eq!(
            e.to_string(),
            "the agent did not answer within 20s; log /l:\nt"
        );
    }
}
