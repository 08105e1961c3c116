//! Starting an exec's process: argv, the fixed default environment plus
//! the Exec's, the working directory, a new session and process group, a
//! clean signal state, and stdio on pipes or a PTY slave. Owns turning a
//! failure into an `ENAME: …` message that hosts map to exit codes.
//!
//! Two ways in, both registered under the reaper's lock:
//!
//! * pipe execs go through `posix_spawn` (`fastspawn`: vfork-style, no
//!   page tables copied, every attribute we need is a spawn flag);
//! * PTY execs (which need `TIOCSCTTY`), and pipe execs where libc cannot
//!   start a session in `posix_spawn`, go through std's `Command` with a
//!   `pre_exec` hook. std reports a failed `exec` or `chdir` through a
//!   close-on-exec pipe, so a missing program is an error here, promptly,
//!   never a hang. std resets SIGPIPE but not the signal mask (it keeps the
//!   parent's), so the hook resets every disposition and the mask itself.
//!
//! Never: inherit the agent's environment, wait for a child (the reaper
//! does), leave a descriptor of the child's stdio open in the agent beyond
//! the ends it reads and writes, or allocate between fork and exec.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use boxdesk_channel::{Exec, WinSize};
use nix::errno::Errno;

use crate::reaper::{ExitSlot, Registry};

/// `PATH` of every exec unless its env sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why an exec did not start. The message starts with the errno name and
/// a colon (`ENOENT: …`), as docs/CHANNEL.md requires.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The system refused: no such program, bad cwd, no permission…
    #[error("{}: {what}: {}", errno_name(*.errno), .errno.desc())]
    Os {
        /// The error number.
        errno: Errno,
        /// What was being started, for the message.
        what: String,
    },
    /// The Exec frame itself is unusable (NUL bytes, a bad env key).
    #[error("EINVAL: {0}")]
    Invalid(String),
    /// The PTY could not be opened.
    #[error("EIO: {0}")]
    Pty(crate::pty::PtyError),
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<crate::pty::PtyError> for SpawnError {
    fn from(e: crate::pty::PtyError) -> Self {
        SpawnError::Pty(e)
    }
}

/// `ENOENT` for `Errno::ENOENT`; `E<n>` for numbers nix does not name.
pub fn errno_name(e: Errno) -> String {
    match e {
        Errno::UnknownErrno => "EUNKNOWN".into(),
        e => format!("{e:?}"),
    }
}

fn os_error(err: io::Error, what: impl FnOnce() -> String) -> SpawnError {
    let errno = Errno::from_raw(err.raw_os_error().unwrap_or(libc::EIO));
    SpawnError::Os {
        errno,
        what: what(),
    }
}

/// The agent's ends of a running child's stdio.
pub enum ChildIo {
    /// An Exec: stdin (write end), stdout and stderr (read ends), all
    /// non-blocking.
    Pipes {
        /// The child's stdin.
        stdin: OwnedFd,
        /// The child's stdout.
        stdout: OwnedFd,
        /// The child's stderr.
        stderr: OwnedFd,
    },
    /// An ExecPty: the master side, non-blocking.
    Pty(OwnedFd),
}

/// A started child: its pid (also its process group and session id) and
/// its stdio.
pub struct Spawned {
    /// The child's pid.
    pub pid: i32,
    /// A pidfd for the child (readable once it exited), where the kernel
    /// has `pidfd_open` (5.3+); the reaper's wake-up pipe works without.
    pub pidfd: Option<OwnedFd>,
    /// The agent's ends of its stdio.
    pub io: ChildIo,
}

/// Starts `exec` (on a PTY of size `pty` if given), registered in
/// `registry` under `slot` before anything can reap it.
pub fn spawn(
    exec: &Exec,
    pty: Option<WinSize>,
    registry: &Registry,
    slot: &Arc<ExitSlot>,
) -> Result<Spawned, SpawnError> {
    validate(exec)?;
    let cwd: &[u8] = if exec.cwd.is_empty() { b"/" } else { &exec.cwd };
    check_cwd(cwd)?;
    let env = environment(exec, pty.is_some());
    // An isolated exec enters its domain between fork and exec: the std
    // path's hook, which posix_spawn has no place for.
    let isolated = exec.flags & Exec::ISOLATE != 0;
    let fast = match pty {
        None if !isolated => spawn_fast(exec, cwd, &env, registry, slot)?,
        _ => None,
    };
    let spawned = match fast {
        Some(spawned) => spawned,
        None => spawn_std(exec, cwd, &env, pty, registry, slot)?,
    };
    let fds: Vec<_> = match &spawned.io {
        ChildIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => vec![stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
        ChildIo::Pty(m) => vec![m.as_fd()],
    };
    for fd in fds {
        crate::fdio::set_nonblocking(fd, true).map_err(|e| os_error(e, || "stdio".into()))?;
    }
    Ok(spawned)
}

/// The exec's whole environment: the fixed defaults, overridden and
/// extended by the Exec's list (a later duplicate wins).
fn environment(exec: &Exec, tty: bool) -> Vec<(&[u8], &[u8])> {
    let mut env: Vec<(&[u8], &[u8])> =
        vec![(b"PATH", DEFAULT_PATH.as_bytes()), (b"HOME", b"/root")];
    if tty {
        env.push((b"TERM", b"xterm-256color"));
    }
    for (key, value) in &exec.env {
        match env.iter_mut().find(|(k, _)| *k == key.as_slice()) {
            Some(entry) => entry.1 = value,
            None => env.push((key, value)),
        }
    }
    env
}

fn cannot_run(exec: &Exec) -> impl FnOnce() -> String + '_ {
    || format!("cannot run {:?}", String::from_utf8_lossy(&exec.command))
}

/// False once libc has said it cannot start a new session in posix_spawn.
static FAST_SPAWN: AtomicBool = AtomicBool::new(true);

/// A pipe exec through `posix_spawn` (see `fastspawn`); `None` when this
/// libc cannot, and the std path must be used.
fn spawn_fast(
    exec: &Exec,
    cwd: &[u8],
    env: &[(&[u8], &[u8])],
    registry: &Registry,
    slot: &Arc<ExitSlot>,
) -> Result<Option<Spawned>, SpawnError> {
    if !FAST_SPAWN.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let mut prepared = match crate::fastspawn::Prepared::new(exec, cwd, env) {
        Ok(p) => p,
        Err(Errno::ENOSYS) => {
            FAST_SPAWN.store(false, Ordering::Relaxed);
            return Ok(None);
        }
        Err(errno) => {
            return Err(SpawnError::Os {
                errno,
                what: cannot_run(exec)(),
            })
        }
    };
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| os_error(e.into(), || "pipe".into()))
    };
    let ((in_r, in_w), (out_r, out_w), (err_r, err_w)) = (pipe()?, pipe()?, pipe()?);
    let (pidfd, pid) = registry
        .spawn(slot, || {
            let pid = prepared
                .spawn([in_r.as_fd(), out_w.as_fd(), err_w.as_fd()])
                .map_err(|e| io::Error::from_raw_os_error(e as i32))?;
            // Under the registry lock the child cannot have been reaped
            // yet, so the pid is still this child's.
            Ok((pidfd_open(pid), pid))
        })
        .map_err(|e| os_error(e, cannot_run(exec)))?;
    for fd in [&out_r, &err_r] {
        grow_pipe(fd);
    }
    Ok(Some(Spawned {
        pid,
        pidfd,
        io: ChildIo::Pipes {
            stdin: in_w,
            stdout: out_r,
            stderr: err_r,
        },
    }))
}

/// An exec through std's `Command` (fork, then the child setup below):
/// every PTY exec (it needs `TIOCSCTTY`), and pipe execs where
/// `posix_spawn` cannot start a session.
fn spawn_std(
    exec: &Exec,
    cwd: &[u8],
    env: &[(&[u8], &[u8])],
    pty: Option<WinSize>,
    registry: &Registry,
    slot: &Arc<ExitSlot>,
) -> Result<Spawned, SpawnError> {
    match spawn_std_once(exec, cwd, env, pty, registry, slot) {
        // glibc's execvp runs a script without `#!` with /bin/sh; musl's
        // does not. Do it here so both libcs (and both paths) agree.
        Err(SpawnError::Os {
            errno: Errno::ENOEXEC,
            what,
        }) => {
            let path_var = env
                .iter()
                .rev()
                .find(|(k, _)| *k == b"PATH")
                .map_or(&b""[..], |(_, v)| v);
            let script = crate::fastspawn::resolve(&exec.command, path_var, cwd)
                .map_err(|errno| SpawnError::Os { errno, what })?;
            let mut via_sh = Exec::new("/bin/sh", [script]);
            via_sh.args.extend(exec.args.iter().cloned());
            via_sh.flags = exec.flags;
            spawn_std_once(&via_sh, cwd, env, pty, registry, slot)
        }
        r => r,
    }
}

fn spawn_std_once(
    exec: &Exec,
    cwd: &[u8],
    env: &[(&[u8], &[u8])],
    pty: Option<WinSize>,
    registry: &Registry,
    slot: &Arc<ExitSlot>,
) -> Result<Spawned, SpawnError> {
    let mut cmd = Command::new(OsStr::from_bytes(&exec.command));
    cmd.args(exec.args.iter().map(|a| OsStr::from_bytes(a)))
        .current_dir(OsStr::from_bytes(cwd))
        .env_clear()
        .envs(
            env.iter()
                .map(|(k, v)| (OsStr::from_bytes(k), OsStr::from_bytes(v))),
        );
    let with_tty = pty.is_some();
    // Made (once) before the fork: the child only applies it. Without
    // Landlock an isolated exec runs unsealed (the agent said so once).
    let domain = if exec.flags & Exec::ISOLATE != 0 {
        crate::landlock::exec_domain()
    } else {
        None
    };
    // SAFETY: the closure runs in the forked child before exec; it calls
    // only async-signal-safe functions (rt_sigaction, sigprocmask, setsid,
    // ioctl, landlock_restrict_self) and allocates nothing.
    unsafe { cmd.pre_exec(move || child_setup(with_tty, domain)) };

    let master = match pty {
        Some(ws) => {
            let (master, slave) = crate::pty::open(ws)?;
            let dup = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
            let err = |e| os_error(e, || "pty".into());
            cmd.stdin(dup(&slave).map_err(err)?)
                .stdout(dup(&slave).map_err(err)?)
                .stderr(Stdio::from(slave));
            Some(master)
        }
        None => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            None
        }
    };

    let spawned = registry.spawn(slot, || {
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        // Opened under the registry lock: the child cannot have been reaped
        // yet, so the pid is still this child's.
        Ok(((child, pidfd_open(pid)), pid))
    });
    // The Command holds the PTY slave copies until it is dropped; the end
    // of a PTY session (EIO on the master) needs them closed.
    drop(cmd);
    let ((mut child, pidfd), pid) = spawned.map_err(|e| os_error(e, cannot_run(exec)))?;

    let io = match master {
        Some(master) => ChildIo::Pty(master),
        None => {
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err(SpawnError::Invalid("child stdio missing".into()));
            };
            ChildIo::Pipes {
                stdin: stdin.into(),
                stdout: stdout.into(),
                stderr: stderr.into(),
            }
        }
    };
    // Dropping `child` neither waits nor kills: the reaper owns its status.
    drop(child);
    Ok(Spawned { pid, pidfd, io })
}

/// Output pipes get [`PIPE_SIZE`] of buffer where the system allows it
/// (the default 64 KiB makes a fast writer stop and wait for the agent
/// every few writes). Best effort: a refusal leaves the default.
fn grow_pipe(fd: &OwnedFd) {
    // SAFETY: F_SETPIPE_SZ takes an int and only resizes the pipe buffer.
    unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            libc::F_SETPIPE_SZ,
            PIPE_SIZE,
        )
    };
}

/// Buffer of an exec's stdout and stderr pipes.
const PIPE_SIZE: libc::c_int = 1 << 20;

/// `pidfd_open(2)` (close-on-exec by definition); `None` where the kernel
/// lacks it.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a non-negative result is a new descriptor nothing else owns.
    (fd >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) })
}

/// Refuses what the kernel cannot carry: NUL bytes, empty or `=` keys.
fn validate(exec: &Exec) -> Result<(), SpawnError> {
    if exec.flags & !Exec::KNOWN_FLAGS != 0 {
        return Err(SpawnError::Invalid(format!(
            "unknown exec flags {:#x}",
            exec.flags & !Exec::KNOWN_FLAGS
        )));
    }
    let nul = |b: &[u8]| b.contains(&0);
    if nul(&exec.command) || exec.args.iter().any(|a| nul(a)) || nul(&exec.cwd) {
        return Err(SpawnError::Invalid(
            "command, args and cwd must not contain NUL bytes".into(),
        ));
    }
    for (key, value) in &exec.env {
        if key.is_empty() || key.contains(&b'=') || nul(key) || nul(value) {
            return Err(SpawnError::Invalid(format!(
                "bad env key {:?}",
                String::from_utf8_lossy(key)
            )));
        }
    }
    Ok(())
}

/// The cwd is checked before forking so that its error names the cwd; the
/// child's own `chdir` still catches a race.
fn check_cwd(cwd: &[u8]) -> Result<(), SpawnError> {
    let shown = || format!("cwd {:?}", String::from_utf8_lossy(cwd));
    match std::fs::metadata(OsStr::from_bytes(cwd)) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SpawnError::Os {
            errno: Errno::ENOTDIR,
            what: shown(),
        }),
        Err(e) => Err(os_error(e, shown)),
    }
}

/// In the child, between fork and exec: default dispositions for every
/// signal (an ignored one would survive exec), an empty mask, a new
/// session (so the child leads its own process group), the PTY as
/// controlling terminal, and for an isolated exec a Landlock domain of its
/// own.
fn child_setup(with_tty: bool, domain: Option<&crate::landlock::Domain>) -> io::Result<()> {
    // The raw syscall, not libc's sigaction: glibc refuses to touch the
    // two real-time signals it reserves (32, 33), yet an ignored one is
    // inherited through exec like any other. An all-zero kernel sigaction
    // is SIG_DFL with no flags and an empty mask on every architecture.
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads one kernel sigaction from `dfl`, which
        // is large enough and outlives the call; the old action is not
        // asked for; the sigset size is the kernel's 8 bytes. A raw
        // syscall is async-signal-safe.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                dfl.as_ptr(),
                std::ptr::null_mut::<u8>(),
                8usize,
            );
        }
    }
    // SAFETY: `set` is a valid sigset_t emptied before use; sigprocmask is
    // async-signal-safe (the child has one thread).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    // SAFETY: setsid has no memory arguments.
    if unsafe { libc::setsid() } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: TIOCSCTTY on fd 0 (the PTY slave std just installed) takes an
    // int argument; 0 means do not steal another session's terminal.
    if with_tty && unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if let Some(domain) = domain {
        domain.enter()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
