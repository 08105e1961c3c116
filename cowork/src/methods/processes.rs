//! The methods on a running process: `kill`, `writeStdin` and
//! `isProcessRunning`, each one call into the profile's process table.
//! Starting a process is [`super::spawn`]; these handlers never start one.

use serde_json::{json, Value};

use super::params::{IdParams, KillParams, StdinParams};
use super::{MethodError, Outcome};
use crate::process::{Ended, ProcError, Status};
use crate::profile::Profile;
use crate::signals::{parse_signal, signal_name};

/// `kill`: SIGTERM unless the client names another signal.
pub(super) fn kill(p: &Profile, k: KillParams) -> Outcome {
    let sig = match &k.signal {
        None | Some(Value::Null) => libc::SIGTERM,
        Some(v) => parse_signal(v).ok_or_else(|| MethodError::UnknownSignal(v.clone()))?,
    };
    match p.procs.signal(&k.id.key(), sig) {
        // Killing a process that already ended is not an error.
        Ok(()) | Err(ProcError::Exited(_)) => Ok(json!({})),
        Err(e) => Err(e.into()),
    }
}

/// `writeStdin`: queued, never waited for.
pub(super) fn write_stdin(p: &Profile, w: StdinParams) -> Outcome {
    if w.data.is_empty() {
        // An empty Stdin frame would be EOF; empty data is nothing.
        return Ok(json!({}));
    }
    p.procs.write_stdin(&w.id.key(), w.data.0.as_bytes())?;
    Ok(json!({}))
}

/// `isProcessRunning`, with how it ended once it has.
pub(super) fn is_running(p: &Profile, i: IdParams) -> Outcome {
    Ok(match p.procs.status(&i.id.key()) {
        Status::Unknown => json!({"running": false}),
        Status::Running => json!({"running": true}),
        Status::Exited(Ended::Code(c)) => json!({"running": false, "exitCode": c}),
        Status::Exited(Ended::Signal(s)) => {
            json!({"running": false, "exitCode": null, "signal": signal_name(s)})
        }
    })
}
