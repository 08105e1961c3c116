//! A copy of the helper's own log in the app's log directory: `configure
//! {logDir}` names the directory, and from then on every log line the
//! server writes to stderr also goes to `<logDir>/`[`FILE_NAME`], a log of
//! `boxdesk_sandbox::log`'s (created 0600, never through a symlink, ours,
//! rotated at [`boxdesk_sandbox::log::LOG_CAP`] with one `.1`).
//!
//! Owns where the copy goes and writing lines into it. The binary's
//! logger writes through [`LogCopy::writer`]; this module never logs while
//! it holds its lock (a line about the copy would come back into it), and
//! a copy that cannot be written drops the line, never the server.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use boxdesk_platform::sync::lock;
use boxdesk_sandbox::log::{Appender, LOG_CAP};

/// The copy's file name in the app's log directory.
pub const FILE_NAME: &str = "boxdesk-cowork.log";

/// Why the copy could not go where it was asked to.
#[derive(Debug, thiserror::Error)]
pub enum LogCopyError {
    /// `logDir` is not an absolute path.
    #[error("logDir {0:?} is not an absolute path")]
    NotAbsolute(String),
    /// The log in it could not be opened.
    #[error("cannot copy the log to {}: {reason}", path.display())]
    Open {
        /// The log's path.
        path: PathBuf,
        /// What the OS (or the log's checks) said.
        reason: io::Error,
    },
}

/// Where the log is copied, shared by the server and the logger: cheap to
/// clone; no copy until [`LogCopy::set_dir`].
#[derive(Debug, Clone, Default)]
pub struct LogCopy {
    current: Arc<Mutex<Option<Appender>>>,
}

impl LogCopy {
    /// Copies the log into `<dir>/`[`FILE_NAME`] from now on (replacing an
    /// earlier directory); the same directory again changes nothing.
    /// Returns the log's path.
    pub fn set_dir(&self, dir: &str) -> Result<PathBuf, LogCopyError> {
        let dir = Path::new(dir);
        if !dir.is_absolute() {
            return Err(LogCopyError::NotAbsolute(dir.display().to_string()));
        }
        let path = dir.join(FILE_NAME);
        if lock(&self.current)
            .as_ref()
            .is_some_and(|a| a.path() == path)
        {
            return Ok(path);
        }
        let appender = Appender::open(&path, LOG_CAP).map_err(|reason| LogCopyError::Open {
            path: path.clone(),
            reason,
        })?;
        *lock(&self.current) = Some(appender);
        Ok(path)
    }

    /// Where the log is copied now.
    pub fn path(&self) -> Option<PathBuf> {
        lock(&self.current).as_ref().map(|a| a.path().to_owned())
    }

    /// A writer for one log line (what a `tracing` writer factory returns).
    pub fn writer(&self) -> LineWriter {
        LineWriter { copy: self.clone() }
    }
}

/// Writes what it is given into the copy, when there is one; never fails.
#[derive(Debug)]
pub struct LineWriter {
    copy: LogCopy,
}

impl io::Write for LineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(a) = lock(&self.copy.current).as_mut() {
            // A line that cannot be written (a full disk, a failed
            // rotation) is dropped: stderr still has it.
            if a.rotate_if_full().is_ok() {
                let _ = a.write(buf);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn lines_go_to_the_latest_log_dir_only_once_one_is_set() {
        let d = tempfile::tempdir().unwrap();
        let copy = LogCopy::default();
        copy.writer().write_all(b"before\n").unwrap();
        let a = d.path().join("a");
        let b = d.path().join("b");
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let pa = copy.set_dir(a.to_str().unwrap()).unwrap();
        copy.writer().write_all(b"one\n").unwrap();
        assert_eq!(copy.set_dir(a.to_str().unwrap()).unwrap(), pa);
        copy.set_dir(b.to_str().unwrap()).unwrap();
        copy.writer().write_all(b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&pa).unwrap(), "one\n");
        assert_eq!(std::fs::read_to_string(b.join(FILE_NAME)).unwrap(), "two\n");
        let mode = std::fs::metadata(&pa).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_relative_dir_or_a_symlinked_log_is_refused_and_the_old_copy_kept() {
        let d = tempfile::tempdir().unwrap();
        let copy = LogCopy::default();
        copy.set_dir(d.path().to_str().unwrap()).unwrap();
        assert!(matches!(
            copy.set_dir("logs"),
            Err(LogCopyError::NotAbsolute(_))
        ));
        let other = d.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let victim = d.path().join("victim");
        std::os::unix::fs::symlink(&victim, other.join(FILE_NAME)).unwrap();
        let e = copy.set_dir(other.to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(!victim.exists());
        assert_eq!(copy.path(), Some(d.path().join(FILE_NAME)));
    }
}
