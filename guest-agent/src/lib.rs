//! boxdesk-guest-agent: the process that runs inside every sandbox. In a VM
//! it is PID 1 of the initramfs (mounts, hostname, loopback, reaping,
//! power-off); in the namespace backend it is PID 1 of a pid namespace; in
//! tests it is an ordinary child process. In every case it serves the AGCH
//! v3 protocol of `docs/CHANNEL.md`: files in (PutFile), files out (GetFile and
//! `/results`), and one exec or PTY exec per connection.
//!
//! # Threads, not tokio
//!
//! The agent is a static musl binary that must stay small and start in a
//! few milliseconds, and it owns `waitpid(-1)`: as PID 1 (or as a child
//! subreaper) it must reap every orphan, and exactly one place in the
//! process may call `waitpid(-1)`. tokio's child-process support reaps its
//! own children through a SIGCHLD driver and would race that reaper for
//! statuses. So the agent uses plain blocking threads:
//!
//! * the main thread accepts connections, caps them and reads their
//!   session headers (`gate`; [`run`]), so a connection gets a thread of
//!   its own only once its header is in (or an idle one finishes it);
//! * one reaper thread (`reaper`) is the only caller of `waitid(P_ALL)`
//!   that reaps (`sweep` only peeks whether any child is left);
//!   children are spawned while its registry lock is held, so an exit is
//!   never seen before the pid is registered (an exec may also reap its
//!   own registered child by pid, under the same lock, when its pidfd
//!   fires);
//! * one thread per connection (`session`; idle threads are reused by
//!   `workers`), which runs a `poll(2)` loop over the socket, the child's
//!   pipes or PTY master, its pidfd, and a wake-up pipe the reaper writes
//!   when the child exits (`pump`).
//!
//! # Module map
//!
//! `cli` (arguments) → `agent` (startup, with `limits` and `landlock`'s
//! own domain; shutdown) →
//! `gate` (accept loop, cap, session headers) → `workers` → `session` (one
//! connection) → `putfile` / `files` (file frames, paths via `beneath`)
//! and `exec` + `pump` + `stdin` (one process, started by `spawn` through
//! `fastspawn` (posix_spawn) or std's `Command` (an isolated exec entering
//! its own `landlock` domain), with `pty` and `reaper`;
//! its whole session killed at the end by `sweep`). `conn` is one
//! session's buffered, non-blocking socket and its framing; `fdio` holds
//! raw-fd helpers; `init`, `rootfs` (`--rootfs`: mount the image
//! and switch root into it), `loopback`, `relay` (a VM's loopback ports
//! carried to the host over vsock), `power` and `console` are the
//! PID-1 side.
//!
//! The library is Linux-only; on other targets it is empty.
#![cfg(target_os = "linux")]
#![deny(missing_docs)]

#[macro_use]
mod console;

mod agent;
mod cli;
mod conn;
mod exec;
mod fastspawn;
mod fdio;
mod files;
mod gate;
mod init;
mod landlock;
mod limits;
mod listen;
mod loopback;
mod power;
mod pty;
mod pump;
mod putfile;
mod reaper;
mod relay;
mod rootfs;
mod session;
mod shares;
mod spawn;
mod stdin;
mod sweep;
mod workers;

pub use agent::{run, AgentError};
pub use cli::{parse_args, CliError, Config, Listen, USAGE};

/// The entry point of the `boxdesk-guest-agent` binary (and of any binary
/// that embeds the agent, such as `boxdesk __agent`): parses the process
/// arguments after argv\[0\], runs the agent, and exits. As the init of a
/// VM it never exits: a fatal error is printed to the console and the VM
/// is powered off.
pub fn main_entry() -> ! {
    // `__agent` first, as `boxdesk __agent` takes it, is accepted too: a
    // container's sandbox runs either binary with the same arguments.
    let mut args = std::env::args_os().skip(1).peekable();
    if args.peek().is_some_and(|a| a == "__agent") {
        args.next();
    }
    main_with_args(args)
}

/// [`main_entry`] with explicit arguments (those after the program name
/// and, for an embedding binary, after its own sub-command word).
pub fn main_with_args(args: impl Iterator<Item = std::ffi::OsString>) -> ! {
    let config = match parse_args(args) {
        Ok(config) => config,
        Err(CliError::Help) => {
            use std::io::Write as _;
            let _ = writeln!(std::io::stdout(), "{USAGE}");
            std::process::exit(0)
        }
        Err(e) => power::fatal(&e, 2),
    };
    match run(config) {
        Ok(()) => std::process::exit(0),
        Err(e) => power::fatal(&e, 1),
    }
}
