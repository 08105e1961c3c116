//! Landlock domains: the agent's own (`--scope`, on a host kernel shared
//! with the host: no abstract socket and no process outside the sandbox
//! can be reached) and one per isolated exec ([`Exec::ISOLATE`]: sessions
//! cannot read, trace or signal each other, nor reach each other's abstract
//! sockets).
//!
//! A domain here restricts no file access: what a process may touch is
//! the sandbox's mounts' business. What it brings is Landlock's process
//! rules: a process in a domain cannot ptrace-access (so not read
//! `/proc/PID/environ`, `mem`, `fd/`…) a process outside it or in a sibling
//! domain, on every kernel with Landlock (5.13+); with ABI 6 (Linux 6.12)
//! the scopes add signals and abstract Unix sockets. A ruleset must handle
//! some access, so it handles making block devices, which no sandbox needs
//! (and the seccomp filters refuse anyway).
//!
//! The three system calls are made here, not through the `landlock` crate:
//! one ruleset is created once and applied in each forked child between
//! fork and exec, where only a raw system call is safe, and the crate's
//! rulesets are consumed by the process that applies them.
//!
//! [`Exec::ISOLATE`]: boxdesk_channel::Exec::ISOLATE

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// `struct landlock_ruleset_attr` as of ABI 6; the kernel takes a longer
/// struct than it knows as long as the unknown tail is zero.
#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

const CREATE_RULESET_VERSION: u32 = 1;
const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with scopes.
const ABI_SCOPES: i64 = 6;

/// What this kernel's Landlock can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// No Landlock (not built, not in `lsm=`, or `ENOSYS` in a sandbox).
    None,
    /// Domains seal ptrace access; signals and abstract sockets are not
    /// scoped (ABI 1–5).
    Ptrace(i64),
    /// Ptrace access, signals and abstract sockets are all sealed (ABI 6+).
    Scoped(i64),
}

impl Support {
    /// This kernel's, asked once.
    pub fn here() -> Support {
        static ABI: OnceLock<Support> = OnceLock::new();
        *ABI.get_or_init(|| {
            // SAFETY: with a null attribute and size 0 the call only
            // returns the ABI version (or an error); no memory is touched.
            let abi = unsafe {
                libc::syscall(
                    libc::SYS_landlock_create_ruleset,
                    std::ptr::null::<RulesetAttr>(),
                    0usize,
                    CREATE_RULESET_VERSION,
                )
            };
            match abi {
                n if n >= ABI_SCOPES => Support::Scoped(n),
                n if n >= 1 => Support::Ptrace(n),
                _ => Support::None,
            }
        })
    }

    /// For `info` and logs.
    pub fn describe(self) -> String {
        match self {
            Support::None => "none".into(),
            Support::Ptrace(n) => format!("abi {n}: ptrace access"),
            Support::Scoped(n) => format!("abi {n}: ptrace access, signals, abstract sockets"),
        }
    }
}

/// A ruleset whose every application makes a new, sealed domain.
#[derive(Debug)]
pub struct Domain {
    ruleset: OwnedFd,
}

impl Domain {
    /// The ruleset this kernel supports: ptrace sealing, plus signal and
    /// abstract-socket scopes where it has them. `None` without Landlock.
    pub fn new() -> io::Result<Option<Domain>> {
        let scoped = match Support::here() {
            Support::None => return Ok(None),
            Support::Ptrace(_) => 0,
            Support::Scoped(_) => SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
        };
        Self::with_scopes(scoped).map(Some)
    }

    /// The scopes alone, for the agent's own domain; `None` where the
    /// kernel has no scopes (ABI < 6).
    pub fn scopes_only() -> io::Result<Option<Domain>> {
        match Support::here() {
            Support::Scoped(_) => {
                Self::with_scopes(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL).map(Some)
            }
            _ => Ok(None),
        }
    }

    fn with_scopes(scoped: u64) -> io::Result<Domain> {
        let attr = RulesetAttr {
            handled_access_fs: ACCESS_FS_MAKE_BLOCK,
            handled_access_net: 0,
            scoped,
        };
        // SAFETY: `attr` is a valid ruleset attribute of the size passed
        // and outlives the call; the kernel returns a new descriptor.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                std::mem::size_of::<RulesetAttr>(),
                0u32,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this descriptor (close-on-exec)
        // and nothing else owns it.
        let ruleset = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Domain { ruleset })
    }

    /// Puts the calling thread (and what it forks and runs from now on) in
    /// a new domain of this ruleset; a whole process only while it has one
    /// thread. Allocates nothing, raw system calls only: safe between fork
    /// and exec. Sets `no_new_privs` first where the caller lacks
    /// `CAP_SYS_ADMIN` (Landlock's rule).
    pub fn enter(&self) -> io::Result<()> {
        let restrict = || {
            // SAFETY: landlock_restrict_self takes a ruleset descriptor and
            // flags, no memory.
            unsafe {
                libc::syscall(
                    libc::SYS_landlock_restrict_self,
                    self.ruleset.as_raw_fd(),
                    0u32,
                )
            }
        };
        if restrict() == 0 {
            return Ok(());
        }
        // Without CAP_SYS_ADMIN a domain needs no_new_privs (a namespace
        // sandbox has it already; an agent run as a user's child may not).
        if io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 || restrict() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The ruleset isolated execs get, made once; `None` where the kernel has
/// no Landlock (isolated execs then run unsealed, as `info` says).
pub fn exec_domain() -> Option<&'static Domain> {
    static DOMAIN: OnceLock<Option<Domain>> = OnceLock::new();
    DOMAIN
        .get_or_init(|| match Domain::new() {
            Ok(Some(d)) => Some(d),
            Ok(None) => {
                log!("no Landlock in this kernel: isolated execs are not sealed from each other");
                None
            }
            Err(e) => {
                log!("no Landlock ruleset for isolated execs: {e}");
                None
            }
        })
        .as_ref()
}
