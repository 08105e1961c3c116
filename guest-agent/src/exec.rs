//! One Exec or ExecPty from start to the session's end: start the process
//! (`spawn`), pump it (`pump`), then send Exit or TimedOut followed by the
//! `/results` files (`files`).
//!
//! Owns the order of the last frames and the exec's registration and end:
//! once the pump is done the pid is forgotten (a process still dying is
//! reaped as an orphan) and the exec's whole session is killed (`sweep`)
//! before Exit or TimedOut is sent, whatever ended it. It must never send
//! Exit for a process that has not exited, and never anything after an
//! Error that ends the session.

use boxdesk_channel::{Exec, Frame, WinSize};

use crate::agent::Agent;
use crate::conn::Conn;
use crate::pump::{Outcome, Pump};
use crate::reaper::ExitSlot;

/// Why an exec could not even be started on the agent's side.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The wake-up pipe for the reaper could not be created.
    #[error("EMFILE: cannot create the exit notification pipe: {0}")]
    WakePipe(std::io::Error),
}

/// What the session does after the exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Close the session.
    Close,
    /// Shut the agent down.
    Shutdown,
}

/// Runs `exec` (on a PTY of size `pty` when given) over `conn`.
pub fn run(conn: &mut Conn, agent: &Agent, exec: Exec, pty: Option<WinSize>) -> After {
    let (slot, wake) = match ExitSlot::new() {
        Ok(s) => s,
        Err(e) => {
            let _ = conn.queue(&Frame::error(ExecError::WakePipe(e).to_string()));
            return After::Close;
        }
    };
    let spawned = crate::spawn::spawn(&exec, pty, &agent.registry, &slot);
    let timeout_ms = exec.timeout_ms;
    // The env may hold secrets: wipe our copy as soon as the child has it.
    drop(exec);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = conn.queue(&Frame::error(e.to_string()));
            return After::Close;
        }
    };
    let pid = child.pid;
    let outcome = Pump::new(conn, child, &agent.registry, &slot, wake, timeout_ms).run();
    agent.registry.forget(pid);
    crate::sweep::end_session(pid, &agent.registry, agent.adopts_orphans);
    let last = match outcome {
        Outcome::Exit(code) => Frame::Exit(code),
        Outcome::TimedOut => Frame::TimedOut,
        Outcome::Ended => return After::Close,
        Outcome::Shutdown => return After::Shutdown,
    };
    if conn.send_blocking(&last).is_ok() {
        let _ = crate::files::send_results(conn, &agent.results);
    }
    After::Close
}
