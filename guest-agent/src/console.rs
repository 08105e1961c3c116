//! The agent's only channel to a human: stderr, which is `/dev/console`
//! when the agent is a VM's init. Owns the log line format, the ready line
//! and the boot clock. It must never write to a session's socket, never
//! panic when stderr is gone (unlike `eprintln!`), and never print secrets
//! (callers pass sanitised, secret-free text).

use std::fmt;
use std::io::Write as _;

/// Writes one log line to stderr, ignoring failures.
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::console::line(format_args!($($arg)*))
    };
}

/// Writes `boxdesk-guest-agent: <args>` and a newline to stderr.
pub fn line(args: fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(format_args!("boxdesk-guest-agent: {args}\n"));
}

/// The line printed once the socket listens: `boxdesk-guest-agent ready
/// <listen> <ms since boot>`. Hosts and tests wait for it.
pub fn ready(listen: &crate::Listen) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "boxdesk-guest-agent ready {listen} {}",
        ms_since_boot()
    );
}

/// Milliseconds since the machine booted (`CLOCK_BOOTTIME`, which keeps
/// counting through suspend); 0 if the clock cannot be read.
pub fn ms_since_boot() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}
