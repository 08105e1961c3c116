//! A container's own layout: what an OCI bundle asks of a sandbox beyond
//! the common [`crate::running::SandboxSpec`] — its root directory, its
//! mounts in order, capabilities, rlimits, extra seccomp programs, masked
//! and read-only paths. Pure data: `boxdesk-oci` fills it from a bundle's
//! `config.json` (after refusing what cannot be honoured), and the
//! namespace backend builds its bwrap command line from it
//! (`crate::namespace::container`). A backend that cannot honour a layout
//! refuses the spec that carries one.
//!
//! This module owns the shape of that contract and no policy: whether a
//! field may be honoured is decided by whoever fills it in.

use std::path::PathBuf;

/// One mount inside the container, in `config.json`'s order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A fresh `proc` for the container's pid namespace.
    Proc {
        /// Where (`/proc`).
        dest: PathBuf,
    },
    /// A fresh `/dev` (a tmpfs with the standard nodes bound from the
    /// host, `pts` (newinstance), `shm`, and the standard symlinks).
    Dev {
        /// Where (`/dev`).
        dest: PathBuf,
    },
    /// A POSIX message queue file system.
    Mqueue {
        /// Where (`/dev/mqueue`).
        dest: PathBuf,
    },
    /// A tmpfs.
    Tmpfs {
        /// Where.
        dest: PathBuf,
        /// Its size in bytes, if given.
        size: Option<u64>,
        /// Its root's mode, if given.
        mode: Option<u32>,
        /// Read-only once mounted.
        readonly: bool,
    },
    /// A host path bound in.
    Bind {
        /// The host path (absolute).
        source: PathBuf,
        /// Where.
        dest: PathBuf,
        /// Whether the container may write through it.
        writable: bool,
    },
    /// The host's `/sys`, read-only (a fresh sysfs needs privileges the
    /// sandbox does not have).
    Sysfs {
        /// Where (`/sys`).
        dest: PathBuf,
    },
}

/// One resource limit, set before the sandbox starts, so every process
/// in it inherits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    /// `RLIMIT_*` (as `libc` numbers it).
    pub resource: i32,
    /// The soft limit.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
}

/// A namespace a container joins instead of getting a new one (a pod's,
/// an engine's network): its kind and the path of its handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Join {
    /// A network namespace (`/run/netns/…`, `/proc/PID/ns/net`).
    Net(PathBuf),
    /// An IPC namespace.
    Ipc(PathBuf),
    /// A UTS namespace (its hostname is that namespace's).
    Uts(PathBuf),
}

impl Join {
    /// The handle's path.
    pub fn path(&self) -> &std::path::Path {
        match self {
            Join::Net(p) | Join::Ipc(p) | Join::Uts(p) => p,
        }
    }
}

/// What a container's sandbox is made of beyond the common spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    /// The container's root directory (the bundle's rootfs), absolute.
    pub root: PathBuf,
    /// Whether the container may write to its root.
    pub root_writable: bool,
    /// Its hostname.
    pub hostname: Option<String>,
    /// Its mounts, in order, over the root.
    pub mounts: Vec<Mount>,
    /// The capabilities its processes keep (`CAP_CHOWN`, …), in the
    /// sandbox's own user namespace; every other one is dropped.
    pub caps: Vec<String>,
    /// Resource limits.
    pub rlimits: Vec<Rlimit>,
    /// Seccomp programs (`struct sock_filter[]` bytes) installed besides
    /// boxdesk's own.
    pub seccomp: Vec<Vec<u8>>,
    /// Paths made unreadable (a directory covered by an empty read-only
    /// tmpfs, a file by `/dev/null`), where they exist.
    pub masked: Vec<PathBuf>,
    /// Paths made read-only, where they exist.
    pub readonly: Vec<PathBuf>,
    /// The sandbox's OOM score adjustment.
    pub oom_score_adj: Option<i32>,
    /// A CPU quota in CPUs (a fraction allowed), over the spec's whole
    /// ones.
    pub cpu_quota: Option<f64>,
    /// A relative CPU weight, in cgroup v1 shares.
    pub cpu_shares: Option<u64>,
    /// Namespaces joined rather than made new (entered before the sandbox
    /// drops its privileges: root only, in practice).
    pub joins: Vec<Join>,
    /// The agent to run (`boxdesk` or `boxdesk-guest-agent`, either takes
    /// `__agent …`): a static executable, since it runs inside the
    /// container's root without the host's libraries. `None`: the boxdesk
    /// binary the spec names (which must then be static).
    pub agent: Option<PathBuf>,
}
