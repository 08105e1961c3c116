//! How an exec ended, and the one mapping from that to an exit status.
//!
//! Every host front end shows an exec's end through [`Outcome::exit_code`]:
//!
//! | the exec… | exit status |
//! |---|---|
//! | exited with status `S` (0–255) | `S` |
//! | was killed by signal `N` | `128 + N` |
//! | ran past its timeout (the agent killed it) | [`EXIT_TIMEOUT`] (124) |
//! | did not start: the agent said `ENOENT: …` | [`EXIT_NOT_FOUND`] (127) |
//! | did not start: `EACCES`, `EPERM`, `ENOEXEC`, `EISDIR`, `ENOTDIR`, `ELOOP`, `ENAMETOOLONG`, `ETXTBSY`, `E2BIG` | [`EXIT_CANNOT_RUN`] (126) |
//! | failed for any other reason the agent gave | [`EXIT_BOXDESK`] (125) |
//!
//! and every failure of boxdesk itself (no sandbox, a lost or stalled
//! session, an [`AgentError`](super::AgentError)) is [`EXIT_BOXDESK`].
//! 126 and 127 follow the shell (bash's `execve` failure: `ENOENT` is "not
//! found", every other reason the kernel refuses to run a file is "cannot
//! execute"); an errno that is not about running a file (`EINVAL` for a
//! malformed Exec, `EIO` for a PTY, `EAGAIN` for a full agent) is boxdesk
//! failing, not the command. Cowork shows a signal by its name rather than
//! as `128 + N` (docs/CHANNEL.md), and a timeout as the SIGKILL it was; every
//! number it shows comes from here.
//!
//! This module is pure: no I/O, no policy about what a front end prints.

/// Exit status when `--timeout` expired and the agent killed the command.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when boxdesk itself failed (not the command).
pub const EXIT_BOXDESK: i32 = 125;
/// Exit status when the command exists but could not be run.
pub const EXIT_CANNOT_RUN: i32 = 126;
/// Exit status when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// Errno names that mean "found, but the kernel would not run it".
const CANNOT_RUN: &[&str] = &[
    "EACCES",
    "EPERM",
    "ENOEXEC",
    "EISDIR",
    "ENOTDIR",
    "ELOOP",
    "ENAMETOOLONG",
    "ETXTBSY",
    "E2BIG",
];

/// How one exec ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited with this status.
    Exited(u8),
    /// The command was killed by this signal (1–127).
    Signaled(i32),
    /// The command ran past its timeout; the agent killed its process group.
    TimedOut,
    /// The agent answered with this Error and closed without an Exit: the
    /// command did not start (or the session failed). The message starts
    /// with an errno name (`ENOENT: …`), as docs/CHANNEL.md requires.
    Refused(String),
}

impl Outcome {
    /// The Outcome of an Exit frame's status: 0–255 as is, −N for signal
    /// N. `None` for a status no process can have.
    pub fn from_status(status: i32) -> Option<Outcome> {
        match status {
            0..=255 => Some(Outcome::Exited(status as u8)),
            -127..=-1 => Some(Outcome::Signaled(-status)),
            _ => None,
        }
    }

    /// The exit status a shell (and `boxdesk exec`) shows for this end:
    /// the one mapping of the module docs.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited(s) => i32::from(*s),
            Outcome::Signaled(n) => 128 + n,
            Outcome::TimedOut => EXIT_TIMEOUT,
            Outcome::Refused(msg) => match msg.split_once(':').map(|(errno, _)| errno) {
                Some("ENOENT") => EXIT_NOT_FOUND,
                Some(e) if CANNOT_RUN.contains(&e) => EXIT_CANNOT_RUN,
                _ => EXIT_BOXDESK,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(msg: &str) -> i32 {
        Outcome::Refused(msg.into()).exit_code()
    }

    #[test]
    fn an_exit_status_is_shown_as_it_is() {
        for s in [0, 1, 3, 42, 255] {
            assert_eq!(Outcome::from_status(s).unwrap().exit_code(), s);
        }
    }

    #[test]
    fn a_signal_n_is_shown_as_128_plus_n() {
        assert_eq!(Outcome::from_status(-9), Some(Outcome::Signaled(9)));
        assert_eq!(Outcome::from_status(-9).unwrap().exit_code(), 137);
        assert_eq!(Outcome::from_status(-15).unwrap().exit_code(), 143);
        assert_eq!(Outcome::from_status(-1).unwrap().exit_code(), 129);
        assert_eq!(Outcome::from_status(-127).unwrap().exit_code(), 255);
    }

    #[test]
    fn a_status_no_process_can_have_is_refused() {
        for s in [256, 1000, i32::MAX, -128, -1000, i32::MIN] {
            assert_eq!(Outcome::from_status(s), None, "{s}");
        }
    }

    #[test]
    fn a_timeout_is_124() {
        assert_eq!(Outcome::TimedOut.exit_code(), 124);
    }

    #[test]
    fn a_missing_program_is_127_as_in_a_shell() {
        assert_eq!(refused("ENOENT: cannot run \"nope\": No such file"), 127);
        assert_eq!(refused("ENOENT: cwd \"/nope\": No such file"), 127);
    }

    #[test]
    fn a_program_the_kernel_will_not_run_is_126_as_in_a_shell() {
        for errno in [
            "EACCES",
            "EPERM",
            "ENOEXEC",
            "EISDIR",
            "ENOTDIR",
            "ELOOP",
            "ENAMETOOLONG",
            "ETXTBSY",
            "E2BIG",
        ] {
            assert_eq!(refused(&format!("{errno}: cannot run \"x\": why")), 126);
        }
    }

    #[test]
    fn any_other_agent_error_is_boxdesk_failing_125() {
        for msg in [
            "EINVAL: bad env key \"\"",
            "EIO: pty: no pty",
            "EAGAIN: too many connections",
            "EUNKNOWN: what",
            "the agent had no errno to give",
            "",
            "ENOENTX: not quite",
            "eacces: lower case is not an errno name",
        ] {
            assert_eq!(refused(msg), 125, "{msg:?}");
        }
    }
}
