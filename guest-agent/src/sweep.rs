//! The end of an exec's process tree: when an exec is over (its command
//! exited and the drain is done, its timeout fired, its host went away, or
//! a Signal killed it), every process still in the exec's session — the
//! exec's child called `setsid`, so the session id is the child's pid — is
//! SIGKILLed before Exit or TimedOut goes out, round after round until no
//! live one is left, because a fork bomb keeps forking while it is killed.
//!
//! Each round kills the exec's process group with one `kill(-sid)` (the
//! kernel makes that atomic against a fork in progress), then scans
//! `/proc` for the session's other groups (`setpgid`, shell job control)
//! by `getsid(2)` and kills each member. It ends when a scan finds no
//! member that is not a zombie, or after [`GIVE_UP`] (a process stuck in
//! the kernel), which is logged.
//!
//! The normal path costs one syscall: when the agent adopts every orphan
//! (it is PID 1 or a child subreaper), every process left of the exec is a
//! descendant of the agent, so `waitid(WNOHANG | WNOWAIT)` answering
//! `ECHILD` (no child at all) proves there is nothing to kill, without a
//! scan. It only peeks: reaping stays the reaper's.
//!
//! Limits, by design: a process that left the session with its own
//! `setsid()` is out of reach (it is no longer told apart from any other
//! process of the sandbox); the sandbox's pids and memory limits still hold
//! it, and it dies with the sandbox. The scan needs a `/proc` of the
//! agent's own pid namespace; with another one (or none) only the process
//! group is killed, and that is logged once.
//!
//! Never: signal a session that is now a newer exec's (the pid is checked
//! against the registry with spawns held off, so a recycled pid is never
//! swept), signal the agent itself, or reap anything.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::wait::{waitid, Id, WaitPidFlag};

use crate::reaper::Registry;

/// How long the rounds may go on before the survivors are logged and left.
const GIVE_UP: Duration = Duration::from_secs(10);
/// First pause between rounds (doubling up to [`MAX_PAUSE`]): a killed
/// process needs to run once to die.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
/// Longest pause between rounds.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// Set once the "/proc is not ours" line was logged.
static TOLD_NO_PROC: AtomicBool = AtomicBool::new(false);

/// SIGKILLs every process of session `sid` until none is left alive (see
/// the module doc). `adopts_orphans`: the agent is PID 1 or a child
/// subreaper, so it having no child at all means nothing is left.
pub fn end_session(sid: i32, registry: &Registry, adopts_orphans: bool) {
    if adopts_orphans && !has_children() {
        return;
    }
    let own = proc_is_ours();
    let deadline = Instant::now() + GIVE_UP;
    let mut pause = FIRST_PAUSE;
    loop {
        let live = registry.with_spawns_held(sid, |sid_is_an_exec| {
            if sid_is_an_exec {
                return 0; // the pid was recycled for a newer exec
            }
            // SAFETY: kill has no memory arguments; -sid is the exec's own
            // process group (its leader called setsid).
            unsafe { libc::kill(-sid, libc::SIGKILL) };
            if own {
                kill_members(sid)
            } else {
                0
            }
        });
        if live == 0 {
            return;
        }
        if Instant::now() >= deadline {
            log!("exec {sid}: {live} process(es) of its session survive SIGKILL; leaving them");
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Whether the agent has any child, exited or not.
fn has_children() -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    loop {
        match waitid(Id::All, flags) {
            Err(Errno::EINTR) => continue,
            Err(Errno::ECHILD) => return false,
            _ => return true,
        }
    }
}

/// Whether `/proc` is the procfs of the agent's pid namespace (its `self`
/// is our pid); says once when it is not.
fn proc_is_ours() -> bool {
    let ours = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id());
    if !ours && !TOLD_NO_PROC.swap(true, Ordering::Relaxed) {
        log!("/proc is not this pid namespace's: an exec's end kills its process group only");
    }
    ours
}

/// Kills every process of session `sid` found in `/proc`; returns how many
/// of them were not zombies yet.
fn kill_members(sid: i32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let me = std::process::id() as i32;
    let mut live = 0;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: getsid has no memory arguments; it fails for a pid that
        // is gone.
        if pid == me || unsafe { libc::getsid(pid) } != sid {
            continue;
        }
        // SAFETY: kill has no memory arguments; the pid is in the session
        // being ended (a pid in use is never recycled, and a session's id
        // stays in use while it has a member).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        if !is_zombie(pid) {
            live += 1;
        }
    }
    live
}

/// Whether `pid` is a zombie (or gone): the state field of its stat line.
fn is_zombie(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The command name may hold spaces and parentheses: the state is the
    // first field after the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    matches!(state, Some('Z' | 'X') | None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_stat_line_with_parentheses_in_the_name_is_read_for_its_state() {
        // The agent's own stat line: running, not a zombie.
        assert!(!is_zombie(std::process::id() as i32));
        assert!(
            is_zombie(i32::MAX),
            "a pid that does not exist counts as gone"
        );
    }

    #[test]
    fn the_test_processes_proc_is_its_own() {
        assert!(proc_is_ours());
    }

    #[test]
    fn a_session_with_a_second_process_group_is_ended_whole() {
        // A new session whose leader starts a sleep in a process group of
        // its own (as job control does), then exits: the group kill alone
        // would miss the sleep.
        let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
        if !have("setsid") || !have("python3") {
            eprintln!("skipped: needs the setsid and python3 tools");
            return;
        }
        let script = "python3 -c 'import os; os.setpgid(0, 0); \
                      os.execvp(\"sleep\", [\"sleep\", \"31.5\"])' >/dev/null 2>&1 & \
                      echo $!; echo $$";
        let out = Command::new("setsid")
            .args(["-w", "sh", "-c", script])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text.lines().map(|l| l.trim().parse::<i32>().unwrap());
        let (sleep, sid) = (lines.next().unwrap(), lines.next().unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        // SAFETY: getpgid has no memory arguments.
        while unsafe { libc::getpgid(sleep) } != sleep {
            assert!(
                Instant::now() < deadline,
                "the sleep never got its own group"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: getsid has no memory arguments.
        assert_eq!(unsafe { libc::getsid(sleep) }, sid, "still in the session");
        end_session(sid, &Registry::default(), false);
        assert!(is_zombie(sleep), "the sleep in its own group was killed");
    }
}
