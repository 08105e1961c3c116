//! Starts a helper exactly as the app does (`HELPER -socket PATH`) and asks
//! it one thing, one-shot: `{"method":"isRunning"}` in one frame, the
//! write side closed, one reply back. `boxdesk cowork install` runs it on
//! what it installed.
//!
//! The helper runs with a private `HOME` and `XDG_*` dirs in a fresh 0700
//! temporary directory (removed after), so the check leaves nothing in the
//! user's own; it is stopped with SIGTERM (SIGKILL after a grace) whatever
//! happens.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Why the check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The helper could not be started.
    #[error("cannot start {}: {reason}", path.display())]
    Spawn {
        /// The helper.
        path: PathBuf,
        /// What the OS said.
        reason: io::Error,
    },
    /// It exited before it answered.
    #[error("it exited ({status}) before answering; it said: {said}")]
    Exited {
        /// How it ended.
        status: std::process::ExitStatus,
        /// The end of what it printed.
        said: String,
    },
    /// It did not bind its socket in time.
    #[error("no socket within {0:?}; it said: {1}")]
    NoSocket(Duration, String),
    /// Talking to it failed.
    #[error("{op}: {reason}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// What the OS said.
        reason: io::Error,
    },
    /// Its reply is not the success the app expects.
    #[error("unexpected reply {0}")]
    Reply(String),
}

fn io(op: &'static str) -> impl FnOnce(io::Error) -> CheckError {
    move |reason| CheckError::Io { op, reason }
}

/// A private scratch dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> io::Result<Scratch> {
        let base = std::env::temp_dir();
        // A socket path must fit in 108 bytes.
        let base = if base.as_os_str().len() > 60 {
            PathBuf::from("/tmp")
        } else {
            base
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("boxdesk-check-{}-{nanos}", std::process::id()));
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        for sub in ["run", "home", "data", "state", "config"] {
            fs::DirBuilder::new().mode(0o700).create(dir.join(sub))?;
        }
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Ends the helper however the check ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let pid = self.0.id() as libc::pid_t;
        // SAFETY: kill with plain integers; the child is ours and not yet
        // reaped, so the pid is still its own.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The end of what the helper printed.
fn said(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    let joined: Vec<&str> = tail.into_iter().rev().collect();
    crate::logged(joined.join(" | "))
}

/// Starts `helper -socket <scratch>/run/s.sock`, sends one one-shot
/// `isRunning` and returns its `result` (`{"running": …}`), within
/// `timeout`.
pub fn one_shot_is_running(helper: &Path, timeout: Duration) -> Result<Value, CheckError> {
    let scratch = Scratch::new().map_err(io("making a scratch dir"))?;
    let d = &scratch.0;
    let sock = d.join("run/s.sock");
    let log = d.join("helper.log");
    let out = fs::File::create(&log).map_err(io("making the helper's log"))?;
    let err = out.try_clone().map_err(io("making the helper's log"))?;
    let child = Command::new(helper)
        .arg("-socket")
        .arg(&sock)
        .env("HOME", d.join("home"))
        .env("XDG_RUNTIME_DIR", d.join("run"))
        .env("XDG_DATA_HOME", d.join("data"))
        .env("XDG_STATE_HOME", d.join("state"))
        .env("XDG_CONFIG_HOME", d.join("config"))
        .env_remove("BOXDESK_BACKEND")
        .env_remove("RUST_LOG")
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|reason| CheckError::Spawn {
            path: helper.to_owned(),
            reason,
        })?;
    let mut running = Running(child);
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        if let Ok(s) = UnixStream::connect(&sock) {
            break s;
        }
        if let Ok(Some(status)) = running.0.try_wait() {
            return Err(CheckError::Exited {
                status,
                said: said(&log),
            });
        }
        if Instant::now() >= deadline {
            return Err(CheckError::NoSocket(timeout, said(&log)));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let left = deadline.saturating_duration_since(Instant::now());
    s.set_read_timeout(Some(left.max(Duration::from_secs(1))))
        .map_err(io("setting a timeout"))?;
    let body = json!({"method": "isRunning"}).to_string();
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body.as_bytes());
    s.write_all(&frame).map_err(io("sending isRunning"))?;
    s.shutdown(std::net::Shutdown::Write)
        .map_err(io("closing the write side"))?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).map_err(io("reading the reply"))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > crate::envelope::MAX_BODY {
        return Err(CheckError::Reply(format!("of {len} bytes")));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(io("reading the reply"))?;
    let reply: Value = serde_json::from_slice(&body)
        .map_err(|_| CheckError::Reply(crate::logged(String::from_utf8_lossy(&body))))?;
    match (&reply["success"], &reply["result"]["running"]) {
        (Value::Bool(true), Value::Bool(_)) if reply.get("id").is_none() => {
            Ok(reply["result"].clone())
        }
        _ => Err(CheckError::Reply(crate::logged(&reply))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_helper_that_exits_at_once_fails_with_what_it_said() {
        let d = tempfile::tempdir().unwrap();
        let h = d.path().join("cowork-linux-helper");
        fs::write(&h, "#!/bin/sh\necho \"no such flag $1\" >&2\nexit 3\n").unwrap();
        fs::set_permissions(&h, fs::Permissions::from_mode(0o755)).unwrap();
        let e = one_shot_is_running(&h, Duration::from_secs(10)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, CheckError::Exited { .. }), "{text}");
        assert!(text.contains("no such flag -socket"), "{text}");
    }

    #[test]
    fn a_helper_that_never_binds_times_out_and_is_stopped() {
        let d = tempfile::tempdir().unwrap();
        let h = d.path().join("cowork-linux-helper");
        fs::write(&h, "#!/bin/sh\nexec sleep 30\n").unwrap();
        fs::set_permissions(&h, fs::Permissions::from_mode(0o755)).unwrap();
        let t = Instant::now();
        let e = one_shot_is_running(&h, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, CheckError::NoSocket(..)), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
