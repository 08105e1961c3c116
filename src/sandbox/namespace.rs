//! The namespace backend (Linux only): the bubblewrap command line that
//! builds the sandbox of DESIGN.md's "Namespace sandbox layout" over the
//! per-sandbox state dir ([`super::state`]), and starting it.
//!
//! Layout inside: bwrap's own tmpfs as `/`; read-only binds of `/usr`,
//! `/bin`, `/sbin`, `/lib*` and `/etc` where they exist (symlinks such as
//! `/bin → usr/bin` recreated as symlinks); a private `/dev` and `/proc`;
//! tmpfs `/tmp`; `/root` (HOME), `/work` (cwd) and `/results` bound
//! read-write from `<state>/{root,work,results}`; `<state>/run` bound at
//! `/run/boxdesk`, where the agent listens; the boxdesk binary read-only at
//! [`EXE_INSIDE`]. New pid, ipc, uts, cgroup and (without `--net`) net
//! namespaces, and a user namespace when not root (bwrap adds it itself);
//! the agent is PID 1 (`--as-pid-1`), in a new session, under the seccomp
//! filter of [`super::seccomp`], and dies with the helper.
//!
//! This module owns that command line and the state dir's shape. It must
//! never bind anything from the host's `/home`, `/root`, `/tmp` or `/run`
//! into the sandbox, and never share the host network unless asked.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::seccomp;
use super::state::StateDir;

/// Where the agent listens, inside the sandbox.
pub const AGENT_SOCK_INSIDE: &str = "/run/boxdesk/agent.sock";
/// Where the state dir's `run/` is bound, inside the sandbox.
pub const RUN_INSIDE: &str = "/run/boxdesk";
/// Where the boxdesk binary is bound, inside the sandbox.
pub const EXE_INSIDE: &str = "/run/boxdesk-exe/boxdesk";
/// The `PATH` of the agent (its execs get the same default from the agent).
pub const PATH_INSIDE: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The descriptor number bwrap reads the seccomp program from.
const SECCOMP_FD: i32 = 3;

/// Why the namespace sandbox cannot be prepared or started.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// bubblewrap is not installed.
    #[error("the namespace backend needs bubblewrap: bwrap is not on PATH (apt-get install bubblewrap; `boxdesk doctor` checks)")]
    NoBwrap,
    /// This architecture has no seccomp filter.
    #[error("the namespace backend supports x86_64 and aarch64 hosts, not {0}")]
    UnsupportedArch(&'static str),
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

/// One top-level host entry the sandbox gets read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// A directory, bound read-only at the same path.
    Dir(PathBuf),
    /// A symlink, recreated with the same target.
    Symlink {
        /// Where it is (`/bin`).
        path: PathBuf,
        /// What it points to (`usr/bin`).
        target: PathBuf,
    },
}

/// The top-level entries of `root` the sandbox shares: `usr`, `bin`,
/// `sbin`, `etc` and every `lib*`, in that order, those that exist.
pub fn scan_host(root: &Path) -> io::Result<Vec<HostEntry>> {
    let mut names: Vec<OsString> = ["usr", "bin", "sbin", "etc"].map(OsString::from).into();
    let mut libs: Vec<OsString> = fs::read_dir(root)?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n.as_encoded_bytes().starts_with(b"lib"))
        .collect();
    libs.sort();
    names.extend(libs);
    let mut out = Vec::new();
    for name in names {
        let host = root.join(&name);
        let inside = Path::new("/").join(&name);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            out.push(HostEntry::Symlink {
                path: inside,
                target: fs::read_link(&host)?,
            });
        } else if meta.is_dir() {
            out.push(HostEntry::Dir(inside));
        }
    }
    Ok(out)
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

/// What the bwrap command line is built from.
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
    /// The host directory bound at [`RUN_INSIDE`], where the agent listens.
    pub run_dir: PathBuf,
    /// `HOME` and the working directory of the agent (and the default of
    /// its execs).
    pub home: PathBuf,
    /// The agent's working directory.
    pub cwd: PathBuf,
    /// The host path of the boxdesk binary, bound at [`EXE_INSIDE`].
    pub exe: PathBuf,
    /// `RUST_LOG` for the agent, if any.
    pub rust_log: Option<OsString>,
}

impl Spec {
    /// The spec of a `boxdesk run` sandbox over `state`: HOME `/root`,
    /// cwd `/work`.
    pub fn for_state(
        name: String,
        net: bool,
        host: Vec<HostEntry>,
        state: &StateDir,
        exe: PathBuf,
    ) -> Self {
        Spec {
            name,
            net,
            host,
            binds: state.binds(),
            run_dir: state.run(),
            home: "/root".into(),
            cwd: "/work".into(),
            exe,
            rust_log: std::env::var_os("BOXDESK_AGENT_LOG"),
        }
    }
}

/// The bwrap arguments (after `bwrap` itself) for `spec`, with the seccomp
/// program on descriptor `seccomp_fd`.
pub fn bwrap_args(spec: &Spec, seccomp_fd: i32) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::with_capacity(64);
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(items.iter().map(|i| i.as_ref().to_owned()));
    };
    push(&[&"--die-with-parent", &"--as-pid-1", &"--new-session"]);
    push(&[
        &"--unshare-pid",
        &"--unshare-ipc",
        &"--unshare-uts",
        &"--unshare-cgroup-try",
    ]);
    if !spec.net {
        push(&[&"--unshare-net"]);
    }
    push(&[&"--hostname", &spec.name]);
    // bwrap's new root is already a fresh tmpfs: nothing of the host's `/`
    // is visible unless bound below.
    for entry in &spec.host {
        match entry {
            HostEntry::Dir(p) => push(&[&"--ro-bind", p, p]),
            HostEntry::Symlink { path, target } => push(&[&"--symlink", target, path]),
        }
    }
    push(&[&"--dev", &"/dev", &"--proc", &"/proc", &"--tmpfs", &"/tmp"]);
    for bind in &spec.binds {
        match bind {
            Bind::Rw { host, inside } => push(&[&"--bind", host, inside]),
            Bind::Ro { host, inside } => push(&[&"--ro-bind", host, inside]),
        }
    }
    push(&[&"--bind", &spec.run_dir, &RUN_INSIDE]);
    push(&[&"--ro-bind", &spec.exe, &EXE_INSIDE]);
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
    push(&[&"--seccomp", &seccomp_fd.to_string()]);
    push(&[&"--", &EXE_INSIDE, &"__agent"]);
    push(&[&"--listen", &format!("unix:{AGENT_SOCK_INSIDE}")]);
    push(&[&"--root", &"/", &"--results", &"/results"]);
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

/// Starts bwrap for `spec`; its stdout and stderr go to `log`. The child is
/// bwrap's monitor process; the agent is its child, PID 1 of the sandbox.
pub fn spawn(spec: &Spec, log: &File) -> Result<Child, NamespaceError> {
    let bwrap = find_bwrap().ok_or(NamespaceError::NoBwrap)?;
    let arch =
        seccomp::Arch::host().ok_or(NamespaceError::UnsupportedArch(std::env::consts::ARCH))?;
    let program = seccomp::to_bytes(&seccomp::build(arch));
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| NamespaceError::Spawn(e.into()))?;
    // The program is a few hundred bytes, far below a pipe's capacity.
    File::from(write)
        .write_all(&program)
        .map_err(NamespaceError::Spawn)?;
    let read: OwnedFd = read;
    let read_raw = read.as_raw_fd();
    let mut cmd = Command::new(bwrap);
    cmd.args(bwrap_args(spec, SECCOMP_FD))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(NamespaceError::Spawn)?)
        .stderr(log.try_clone().map_err(NamespaceError::Spawn)?)
        .env_clear()
        .env("PATH", PATH_INSIDE);
    // SAFETY: the hook runs in the forked child before exec and calls only
    // async-signal-safe functions (sigprocmask, dup2, fcntl) on
    // descriptors that stay open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // The helper blocks SIGTERM/SIGINT/SIGHUP for its signal
            // thread; the sandbox must not inherit that mask.
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            if libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) == -1 {
                return Err(io::Error::last_os_error());
            }
            if read_raw == SECCOMP_FD {
                if libc::fcntl(SECCOMP_FD, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(read_raw, SECCOMP_FD) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(NamespaceError::Spawn)?;
    drop(read);
    Ok(child)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(net: bool) -> Spec {
        let host = vec![
            HostEntry::Dir("/usr".into()),
            HostEntry::Symlink {
                path: "/bin".into(),
                target: "usr/bin".into(),
            },
        ];
        let state = StateDir {
            dir: "/s/t1".into(),
        };
        Spec::for_state("t1".into(), net, host, &state, "/opt/boxdesk".into())
    }

    fn joined(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn without_net_the_sandbox_gets_its_own_network_namespace() {
        let a = joined(&bwrap_args(&spec(false), 3));
        assert!(a.contains("--unshare-net"), "{a}");
        let a = joined(&bwrap_args(&spec(true), 3));
        assert!(!a.contains("--unshare-net"), "{a}");
    }

    #[test]
    fn the_agent_runs_as_pid_1_dies_with_the_helper_and_is_filtered() {
        let a = joined(&bwrap_args(&spec(false), 3));
        for want in [
            "--die-with-parent",
            "--as-pid-1",
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname t1",
            "--seccomp 3",
            "--setenv BOXDESK_NAMESPACE 1",
            "-- /run/boxdesk-exe/boxdesk __agent --listen unix:/run/boxdesk/agent.sock",
        ] {
            assert!(a.contains(want), "missing {want:?} in {a}");
        }
    }

    #[test]
    fn host_dirs_are_read_only_and_symlinks_stay_symlinks() {
        let a = joined(&bwrap_args(&spec(false), 3));
        assert!(a.contains("--ro-bind /usr /usr"), "{a}");
        assert!(a.contains("--symlink usr/bin /bin"), "{a}");
        assert!(a.contains("--bind /s/t1/work /work"), "{a}");
        assert!(a.contains("--bind /s/t1/root /root"), "{a}");
        assert!(a.contains("--bind /s/t1/results /results"), "{a}");
        assert!(!a.contains("/home"), "{a}");
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
