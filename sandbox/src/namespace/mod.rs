//! The namespace backend (Linux only): the bubblewrap command line that
//! builds the sandbox of docs/DESIGN.md's "Namespace sandbox layout", and
//! starting it. One builder ([`Spec::new`]) makes the spec of every
//! namespace sandbox, `boxdesk run`'s and cowork's alike, so none of them
//! can miss a protection.
//!
//! Layout inside: bwrap's own tmpfs as `/`, read-only once built; read-only
//! binds of `/usr`, `/bin`, `/sbin`, `/lib*` and `/etc` where they exist
//! (symlinks such as `/bin → usr/bin` recreated as symlinks); a private,
//! read-only `/dev` with a sized `/dev/shm`; a private `/proc` whose `/sys`
//! is read-only; sized tmpfs `/tmp` and `/run`; the spec's binds (a `run`
//! sandbox: `/root` (HOME), `/work` (cwd), `/results` from its state dir);
//! the boxdesk binary read-only at [`EXE_INSIDE`]. New user, pid, ipc, uts,
//! cgroup and (without `--net`) net namespaces. Root inside is uid 0 of
//! the sandbox's own user namespace — the invoking user outside, or an
//! unprivileged subordinate id when boxdesk runs as root ([`ids`]) — with
//! every capability dropped (bounding set too) and no_new_privs. The agent
//! is PID 1 (`--as-pid-1`), in a new session, under the seccomp filter of
//! [`crate::seccomp`], dies with the helper, and gets its listening socket
//! as an inherited descriptor: no path inside the sandbox leads to it.
//! Its stdout and stderr are a pipe the caller reads: nothing inside can
//! reach a host file through them.
//!
//! This module owns that command line. It must never bind anything from the
//! host's `/home`, `/root`, `/tmp` or `/run` into the sandbox unless a spec
//! asks for it, never share the host network unless asked, and never start
//! a sandbox whose root is the host's root.

pub mod child;
pub mod container;
pub mod idmap;
pub mod ids;
pub mod running;

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::seccomp;
use crate::state::StateDir;
use crate::{DEFAULT_PIDS, DEFAULT_TMP_BYTES};
use child::ChildSetup;
pub use ids::IdMap;

/// Where the boxdesk binary is bound, inside the sandbox.
pub const EXE_INSIDE: &str = "/run/boxdesk-exe/boxdesk";
/// The `PATH` of the agent (its execs get the same default from the agent).
pub const PATH_INSIDE: &str = crate::running::AGENT_PATH;
/// The descriptor the agent finds its listening socket on.
pub const LISTEN_FD: RawFd = 3;
/// The first descriptor bwrap reads a seccomp program from.
const SECCOMP_FD: RawFd = 4;
/// Where a container's sandbox finds the boxdesk binary it runs the agent
/// from (`/proc/self/fd/N`): after its seccomp programs, which are fewer
/// than this.
pub const EXE_FD: RawFd = 20;
/// Size of `/run`.
const RUN_BYTES: u64 = 16 << 20;

/// Why the namespace sandbox cannot be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// bubblewrap is not installed.
    #[error("the namespace backend needs bubblewrap: bwrap is not on PATH (apt-get install bubblewrap; `boxdesk doctor` checks)")]
    NoBwrap,
    /// The seccomp programs cannot be built (or not for this architecture).
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    /// The state dir could not be made.
    #[error("cannot prepare the sandbox state dir {}", path.display())]
    State {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Locating the boxdesk binary or reading `/` failed.
    #[error("cannot inspect {what}")]
    Inspect {
        /// What was being inspected.
        what: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// Spawning bwrap failed.
    #[error("cannot start bwrap")]
    Spawn(#[source] io::Error),
}

pub use crate::host_system::HostEntry;

/// The host's system entries the sandbox shares ([`crate::host_system`]).
pub fn scan_host(root: &Path) -> io::Result<Vec<HostEntry>> {
    crate::host_system::scan(root)
}

/// A writable or extra mount inside the sandbox, after the host's
/// read-only entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    /// A host directory bound read-write.
    Rw {
        /// The host directory.
        host: PathBuf,
        /// Where it appears inside.
        inside: PathBuf,
    },
    /// A host path bound read-only.
    Ro {
        /// The host path.
        host: PathBuf,
        /// Where it appears inside.
        inside: PathBuf,
    },
    /// A `--share`: like the others, but id-mapped when boxdesk runs as
    /// root ([`idmap`]), so the sandbox's root may write where root may.
    Share {
        /// The host path.
        host: PathBuf,
        /// Where it appears inside.
        inside: PathBuf,
        /// Whether it is bound read-write.
        writable: bool,
    },
}

impl StateDir {
    /// The binds of a `boxdesk run` sandbox: `/root` (HOME), `/work` (cwd)
    /// and `/results`, read-write.
    pub fn binds(&self) -> Vec<Bind> {
        [
            (self.root(), "/root"),
            (self.work(), "/work"),
            (self.results(), "/results"),
        ]
        .into_iter()
        .map(|(host, inside)| Bind::Rw {
            host,
            inside: inside.into(),
        })
        .collect()
    }
}

impl Bind {
    fn host(&self) -> &Path {
        match self {
            Bind::Rw { host, .. } | Bind::Ro { host, .. } | Bind::Share { host, .. } => host,
        }
    }
}

/// What the bwrap command line is built from. Make one with [`Spec::new`].
#[derive(Debug, Clone)]
pub struct Spec {
    /// The sandbox's name, also its hostname.
    pub name: String,
    /// Share the host's network (`--net`) instead of a private one.
    pub net: bool,
    /// The host entries to share read-only (see [`scan_host`]).
    pub host: Vec<HostEntry>,
    /// The sandbox's own mounts, in order (a `boxdesk run` sandbox:
    /// [`StateDir::binds`]).
    pub binds: Vec<Bind>,
    /// `HOME` of the agent (and the default of its execs).
    pub home: PathBuf,
    /// The agent's working directory.
    pub cwd: PathBuf,
    /// The host path of the boxdesk binary, bound at [`EXE_INSIDE`].
    pub exe: PathBuf,
    /// `RUST_LOG` for the agent, if any.
    pub rust_log: Option<OsString>,
    /// Who root inside is outside.
    pub ids: IdMap,
    /// Size of `/tmp` and of `/dev/shm`, bytes.
    pub tmp_bytes: u64,
    /// Most processes and threads the sandbox may hold at once.
    pub pids_max: u64,
    /// An OCI container's layout: its root and mounts replace the host's
    /// system and the fixed `/dev`, `/proc`, `/tmp`, `/run`.
    pub container: Option<crate::container::Layout>,
}

impl Spec {
    /// The spec every namespace sandbox starts from: this host's read-only
    /// system, this boxdesk binary, the ids of [`IdMap::for_this_process`],
    /// the default `/tmp` size and pids cap, no network, no binds, HOME and
    /// cwd `/`. Callers add their binds and paths.
    pub fn new(name: impl Into<String>) -> Result<Self, NamespaceError> {
        let exe = std::env::current_exe().map_err(|source| NamespaceError::Inspect {
            what: "the boxdesk binary".into(),
            source,
        })?;
        let host = scan_host(Path::new("/")).map_err(|source| NamespaceError::Inspect {
            what: "/".into(),
            source,
        })?;
        Ok(Spec {
            name: name.into(),
            net: false,
            host,
            binds: Vec::new(),
            home: "/".into(),
            cwd: "/".into(),
            exe,
            rust_log: std::env::var_os("BOXDESK_AGENT_LOG"),
            ids: IdMap::for_this_process(),
            tmp_bytes: DEFAULT_TMP_BYTES,
            pids_max: DEFAULT_PIDS,
            container: None,
        })
    }

    /// The spec of a `boxdesk run` sandbox over `state`: its binds, HOME
    /// `/root`, cwd `/work`.
    pub fn for_state(name: &str, state: &StateDir) -> Result<Self, NamespaceError> {
        let mut spec = Spec::new(name)?;
        spec.binds = state.binds();
        spec.home = "/root".into();
        spec.cwd = "/work".into();
        Ok(spec)
    }

    /// The host paths staged for bwrap when it runs as the subordinate id
    /// ([`child`]): the binary, then every bind's source. Empty when
    /// boxdesk runs as a user, who can reach them all itself.
    /// Each with whether it is a share, staged id-mapped.
    fn staged_sources(&self) -> Vec<(PathBuf, bool)> {
        if !self.ids.drop_from_root {
            return Vec::new();
        }
        std::iter::once((self.exe.clone(), false))
            .chain(
                self.binds
                    .iter()
                    .map(|b| (b.host().to_owned(), matches!(b, Bind::Share { .. }))),
            )
            .chain(self.container.iter().flat_map(container::sources))
            .collect()
    }
}

/// The bwrap arguments (after `bwrap` itself) for `spec`, with
/// `seccomp_programs` seccomp programs on descriptors from [`SECCOMP_FD`]
/// on and the agent's listening socket on [`LISTEN_FD`].
pub fn bwrap_args(spec: &Spec, seccomp_programs: usize) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::with_capacity(96);
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(items.iter().map(|i| i.as_ref().to_owned()));
    };
    push(&[&"--die-with-parent", &"--as-pid-1", &"--new-session"]);
    push(&[&"--unshare-user", &"--uid", &"0", &"--gid", &"0"]);
    match &spec.container {
        Some(layout) => a.extend(container::cap_args(layout)),
        None => a.extend(["--cap-drop".into(), "ALL".into()]),
    }
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(items.iter().map(|i| i.as_ref().to_owned()));
    };
    // A joined namespace (entered before bwrap runs) is kept, not new.
    let joins = spec.container.as_ref().map_or(&[][..], |c| &c.joins[..]);
    let joined = |f: fn(&crate::container::Join) -> bool| joins.iter().any(f);
    use crate::container::Join;
    push(&[&"--unshare-pid"]);
    if !joined(|j| matches!(j, Join::Ipc(_))) {
        push(&[&"--unshare-ipc"]);
    }
    let own_uts = !joined(|j| matches!(j, Join::Uts(_)));
    if own_uts {
        push(&[&"--unshare-uts"]);
    }
    push(&[&"--unshare-cgroup-try"]);
    if !spec.net && !joined(|j| matches!(j, Join::Net(_))) {
        push(&[&"--unshare-net"]);
    }
    let hostname = spec
        .container
        .as_ref()
        .and_then(|c| c.hostname.as_deref())
        .unwrap_or(&spec.name);
    if own_uts {
        push(&[&"--hostname", &hostname]);
    }
    // Staged paths stand in for the host's when bwrap runs as the
    // subordinate id (see `child`): source 0 is the binary, then the binds,
    // then a container's root and binds.
    let staged = spec.ids.drop_from_root;
    let source = |i: usize, host: &Path| -> PathBuf {
        if staged {
            child::staged_path(i)
        } else {
            host.to_owned()
        }
    };
    if let Some(layout) = &spec.container {
        a.extend(container::tree_args(layout, 1 + spec.binds.len(), &source));
    }
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(items.iter().map(|i| i.as_ref().to_owned()));
    };
    if spec.container.is_none() {
        // bwrap's new root is already a fresh tmpfs: nothing of the host's
        // `/` is visible unless bound below.
        for entry in spec.host.iter().filter(|e| !e.in_run()) {
            match entry {
                HostEntry::Dir(p) => push(&[&"--ro-bind", p, p]),
                HostEntry::Symlink { path, target } => push(&[&"--symlink", target, path]),
            }
        }
        let tmp = spec.tmp_bytes.to_string();
        push(&[&"--dev", &"/dev", &"--size", &tmp, &"--tmpfs", &"/dev/shm"]);
        push(&[
            &"--proc",
            &"/proc",
            &"--ro-bind",
            &"/proc/sys",
            &"/proc/sys",
        ]);
        push(&[&"--size", &tmp, &"--tmpfs", &"/tmp"]);
        push(&[&"--size", &RUN_BYTES.to_string(), &"--tmpfs", &"/run"]);
        // NixOS's profile links live in the fresh /run.
        for entry in spec.host.iter().filter(|e| e.in_run()) {
            if let HostEntry::Symlink { path, target } = entry {
                push(&[&"--symlink", target, path]);
            }
        }
    }
    for (i, bind) in spec.binds.iter().enumerate() {
        let (flag, inside) = match bind {
            Bind::Rw { inside, .. }
            | Bind::Share {
                inside,
                writable: true,
                ..
            } => ("--bind", inside),
            Bind::Ro { inside, .. }
            | Bind::Share {
                inside,
                writable: false,
                ..
            } => ("--ro-bind", inside),
        };
        push(&[&flag, &source(i + 1, bind.host()), inside]);
    }
    if spec.container.is_none() {
        push(&[&"--ro-bind", &source(0, &spec.exe), &EXE_INSIDE]);
        push(&[&"--remount-ro", &"/dev", &"--remount-ro", &"/"]);
    }
    push(&[&"--chdir", &spec.cwd, &"--clearenv"]);
    push(&[
        &"--setenv",
        &"PATH",
        &PATH_INSIDE,
        &"--setenv",
        &"HOME",
        &spec.home,
    ]);
    push(&[&"--setenv", &"BOXDESK_NAMESPACE", &"1"]);
    if let Some(log) = &spec.rust_log {
        push(&[&"--setenv", &"RUST_LOG", log]);
    }
    for i in 0..seccomp_programs {
        push(&[&"--add-seccomp-fd", &(SECCOMP_FD + i as RawFd).to_string()]);
    }
    let exe_fd = format!("/proc/self/fd/{EXE_FD}");
    let exe = if spec.container.is_some() {
        exe_fd.as_str()
    } else {
        EXE_INSIDE
    };
    push(&[&"--", &exe, &"__agent"]);
    push(&[&"--listen", &format!("fd:{LISTEN_FD}")]);
    // Only this user's connections are served: the socket file is in this
    // user's state dir, which root could still reach.
    push(&[&"--peer-uid", &nix::unistd::geteuid().as_raw().to_string()]);
    // Sealed from the host's processes and abstract sockets (Landlock
    // scopes, Linux 6.12+): it shares the host's kernel, and with --net its
    // network namespace. Not an OCI container: a pod's containers may talk
    // over abstract sockets across their sandboxes.
    if spec.container.is_none() {
        push(&[&"--scope", &"host"]);
    }
    push(&[&"--root", &"/", &"--results", &"/results"]);
    push(&[&"--pids-max", &spec.pids_max.to_string()]);
    a
}

/// Finds `bwrap` on an absolute `PATH` entry.
pub fn find_bwrap() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join("bwrap"))
        .find(|p| {
            use std::os::unix::fs::PermissionsExt;
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// A started sandbox: bwrap's monitor process (the agent is its child, PID 1
/// of the sandbox) and the read end of the pipe its stdout and stderr go to.
#[derive(Debug)]
pub struct Started {
    /// bwrap.
    pub child: Child,
    /// What the sandbox prints; the caller must keep reading it (see
    /// [`crate::log::pump`]) or the agent blocks on a full pipe.
    pub output: File,
}

/// Starts bwrap for `spec`. The agent listens on `listener` (bound by the
/// caller outside the sandbox); the child joins the cgroups whose
/// `cgroup.procs` are open as `cgroup_procs` before it drops any privilege.
pub fn spawn(
    spec: &Spec,
    listener: &OwnedFd,
    cgroup_procs: Vec<RawFd>,
) -> Result<Started, NamespaceError> {
    let bwrap = find_bwrap().ok_or(NamespaceError::NoBwrap)?;
    let mut programs = seccomp_programs()?;
    if let Some(layout) = &spec.container {
        programs.extend(layout.seccomp.iter().cloned());
    }
    if SECCOMP_FD + programs.len() as RawFd > EXE_FD {
        return Err(NamespaceError::Seccomp(seccomp::SeccompError::TooMany(
            programs.len(),
        )));
    }
    let mut keep: Vec<OwnedFd> = Vec::with_capacity(programs.len() + 1);
    let mut place = vec![(listener.as_raw_fd(), LISTEN_FD)];
    if let Some(layout) = &spec.container {
        // bwrap runs the agent from this descriptor: nothing of boxdesk is
        // bound into the container's tree.
        let path = layout.agent.as_ref().unwrap_or(&spec.exe);
        let exe = sealed_copy(path).map_err(|source| NamespaceError::Inspect {
            what: format!("the agent binary {}", path.display()),
            source,
        })?;
        place.push((exe.as_raw_fd(), EXE_FD));
        keep.push(exe.into());
    }
    for (i, program) in programs.iter().enumerate() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| NamespaceError::Spawn(e.into()))?;
        // A program is a few KiB at most, far below a pipe's capacity.
        File::from(write)
            .write_all(program)
            .map_err(NamespaceError::Spawn)?;
        place.push((read.as_raw_fd(), SECCOMP_FD + i as RawFd));
        keep.push(read);
    }
    let (out_read, out_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| NamespaceError::Spawn(e.into()))?;
    let out_write = File::from(out_write);
    let drop_to = spec
        .ids
        .drop_from_root
        .then_some((spec.ids.uid, spec.ids.gid));
    let sources = spec.staged_sources();
    // Held until bwrap is started: the child stages through it.
    let userns = if sources.iter().any(|(_, share)| *share) {
        match idmap::userns_mapping_root_to(spec.ids.uid, spec.ids.gid) {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::warn!("shares are bound without an id map (the sandbox's root cannot write where only root may): {e}");
                None
            }
        }
    } else {
        None
    };
    let mut setup = ChildSetup::new(
        cgroup_procs,
        &sources,
        userns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
        drop_to,
        place,
    )
    .map_err(|source| NamespaceError::Inspect {
        what: "the sandbox's bind sources".into(),
        source,
    })?;
    // Held until bwrap is started: the child enters them.
    let mut join_fds: Vec<File> = Vec::new();
    if let Some(layout) = &spec.container {
        setup.set_limits(&layout.rlimits, layout.oom_score_adj);
        for j in &layout.joins {
            use std::os::unix::fs::OpenOptionsExt as _;
            // Never blocking on whatever is there (its caller checked it is
            // a namespace).
            let f = File::options()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(j.path())
                .map_err(|source| NamespaceError::Inspect {
                    what: format!("the namespace to join at {}", j.path().display()),
                    source,
                })?;
            let kind = match j {
                crate::container::Join::Net(_) => libc::CLONE_NEWNET,
                crate::container::Join::Ipc(_) => libc::CLONE_NEWIPC,
                crate::container::Join::Uts(_) => libc::CLONE_NEWUTS,
            };
            setup.join(f.as_raw_fd(), kind);
            join_fds.push(f);
        }
    }
    let mut cmd = Command::new(bwrap);
    cmd.args(bwrap_args(spec, programs.len()))
        .stdin(Stdio::null())
        .stdout(out_write.try_clone().map_err(NamespaceError::Spawn)?)
        .stderr(out_write)
        .env_clear()
        .env("PATH", PATH_INSIDE)
        // Readable by the subordinate id bwrap may run as.
        .current_dir("/");
    // SAFETY: `ChildSetup::run` is written for exactly this: it runs in the
    // forked child before exec and only makes system calls on memory
    // prepared here.
    unsafe {
        cmd.pre_exec(move || setup.run());
    }
    let child = cmd.spawn().map_err(NamespaceError::Spawn)?;
    drop(keep);
    drop(join_fds);
    Ok(Started {
        child,
        output: File::from(out_read),
    })
}

/// The agent a container runs, as a sealed in-memory copy (as runc runs
/// itself): its `/proc/1/exe` then leads to no host file a process in it
/// could open for writing, whoever owns the binary. Where the kernel
/// forbids executing memfds (`vm.memfd_noexec` = 2), the file itself.
fn sealed_copy(path: &Path) -> io::Result<File> {
    use std::os::fd::FromRawFd as _;
    let noexec = fs::read_to_string("/proc/sys/vm/memfd_noexec").is_ok_and(|v| v.trim() == "2");
    if noexec {
        return File::open(path);
    }
    // SAFETY: memfd_create reads a NUL-terminated name; flags only.
    let fd = unsafe {
        libc::memfd_create(
            c"boxdesk-agent".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let mut mem = unsafe { File::from_raw_fd(fd) };
    io::copy(&mut File::open(path)?, &mut mem)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS on a memfd we own, an int argument.
    if unsafe { libc::fcntl(mem.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(mem)
}

/// The seccomp programs of this host's architecture, as bytes.
fn seccomp_programs() -> Result<Vec<Vec<u8>>, NamespaceError> {
    Ok(seccomp::programs()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(net: bool, ids: IdMap) -> Spec {
        let state = StateDir {
            dir: "/s/t1".into(),
        };
        Spec {
            name: "t1".into(),
            net,
            host: vec![
                HostEntry::Dir("/usr".into()),
                HostEntry::Symlink {
                    path: "/bin".into(),
                    target: "usr/bin".into(),
                },
            ],
            binds: state.binds(),
            home: "/root".into(),
            cwd: "/work".into(),
            exe: "/opt/boxdesk".into(),
            rust_log: None,
            ids,
            tmp_bytes: 1 << 20,
            pids_max: 77,
            container: None,
        }
    }

    const USER: IdMap = IdMap {
        uid: 1000,
        gid: 1000,
        drop_from_root: false,
    };
    const ROOT: IdMap = IdMap {
        uid: ids::DEFAULT_SUBID,
        gid: ids::DEFAULT_SUBID,
        drop_from_root: true,
    };

    fn joined(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn without_net_the_sandbox_gets_its_own_network_namespace() {
        let a = joined(&bwrap_args(&spec(false, USER), 1));
        assert!(a.contains("--unshare-net"), "{a}");
        let a = joined(&bwrap_args(&spec(true, USER), 1));
        assert!(!a.contains("--unshare-net"), "{a}");
    }

    #[test]
    fn the_agent_runs_as_pid_1_without_privilege_dies_with_the_helper_and_is_filtered() {
        for ids in [USER, ROOT] {
            let a = joined(&bwrap_args(&spec(false, ids), 2));
            for want in [
                "--die-with-parent",
                "--as-pid-1",
                "--new-session",
                "--unshare-user --uid 0 --gid 0",
                "--cap-drop ALL",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--hostname t1",
                "--add-seccomp-fd 4 --add-seccomp-fd 5 --",
                "--setenv BOXDESK_NAMESPACE 1",
                "-- /run/boxdesk-exe/boxdesk __agent --listen fd:3 --peer-uid ",
                "--root / --results /results --pids-max 77",
            ] {
                assert!(a.contains(want), "missing {want:?} in {a}");
            }
            // Only this process's user is served by the agent.
            let me = nix::unistd::geteuid().as_raw();
            assert!(a.contains(&format!("--peer-uid {me} ")), "{a}");
        }
    }

    #[test]
    fn proc_sys_dev_and_the_root_are_read_only_and_tmpfs_are_sized() {
        let a = joined(&bwrap_args(&spec(false, USER), 1));
        for want in [
            "--ro-bind /proc/sys /proc/sys",
            "--size 1048576 --tmpfs /tmp",
            "--size 1048576 --tmpfs /dev/shm",
            "--size 16777216 --tmpfs /run",
            "--remount-ro /dev --remount-ro /",
        ] {
            assert!(a.contains(want), "missing {want:?} in {a}");
        }
        // Nothing is mounted after the root is made read-only.
        let ro = a.find("--remount-ro /").unwrap();
        assert!(!a[ro..].contains("--bind"), "{a}");
    }

    #[test]
    fn host_dirs_are_read_only_and_symlinks_stay_symlinks() {
        let a = joined(&bwrap_args(&spec(false, USER), 1));
        assert!(a.contains("--ro-bind /usr /usr"), "{a}");
        assert!(a.contains("--symlink usr/bin /bin"), "{a}");
        assert!(a.contains("--bind /s/t1/work /work"), "{a}");
        assert!(a.contains("--bind /s/t1/root /root"), "{a}");
        assert!(a.contains("--bind /s/t1/results /results"), "{a}");
        assert!(
            a.contains("--ro-bind /opt/boxdesk /run/boxdesk-exe/boxdesk"),
            "{a}"
        );
        assert!(!a.contains("/home"), "{a}");
    }

    #[test]
    fn as_root_every_bind_source_is_staged_and_nothing_of_roots_paths_is_named() {
        let mut s = spec(false, ROOT);
        s.binds.push(Bind::Share {
            host: "/srv/data".into(),
            inside: "/mnt/d".into(),
            writable: false,
        });
        assert_eq!(
            s.staged_sources(),
            vec![
                (PathBuf::from("/opt/boxdesk"), false),
                ("/s/t1/root".into(), false),
                ("/s/t1/work".into(), false),
                ("/s/t1/results".into(), false),
                ("/srv/data".into(), true),
            ],
            "only the share is id-mapped"
        );
        let a = joined(&bwrap_args(&s, 1));
        assert!(
            a.contains("--ro-bind /run/boxdesk-stage/0 /run/boxdesk-exe/boxdesk"),
            "{a}"
        );
        assert!(a.contains("--bind /run/boxdesk-stage/1 /root"), "{a}");
        assert!(a.contains("--bind /run/boxdesk-stage/2 /work"), "{a}");
        assert!(a.contains("--bind /run/boxdesk-stage/3 /results"), "{a}");
        assert!(a.contains("--ro-bind /run/boxdesk-stage/4 /mnt/d"), "{a}");
        assert!(!a.contains("/s/t1"), "{a}");
        assert!(spec(false, USER).staged_sources().is_empty());
    }

    #[test]
    fn scanning_a_root_finds_dirs_symlinks_and_every_lib_entry_only() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        fs::create_dir(r.join("usr")).unwrap();
        fs::create_dir(r.join("etc")).unwrap();
        fs::create_dir(r.join("home")).unwrap();
        fs::create_dir(r.join("lib32")).unwrap();
        std::os::unix::fs::symlink("usr/bin", r.join("bin")).unwrap();
        std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
        fs::write(r.join("libfile"), b"").unwrap();
        let found = scan_host(r).unwrap();
        assert_eq!(
            found,
            vec![
                HostEntry::Dir("/usr".into()),
                HostEntry::Symlink {
                    path: "/bin".into(),
                    target: "usr/bin".into()
                },
                HostEntry::Dir("/etc".into()),
                HostEntry::Symlink {
                    path: "/lib".into(),
                    target: "usr/lib".into()
                },
                HostEntry::Dir("/lib32".into()),
            ]
        );
    }
}
