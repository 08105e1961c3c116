//! `<name>.lock`: the one-helper-per-name lock, an `flock` held for the
//! helper's whole life.
//!
//! Binding `<name>.sock` alone leaves a window: between another helper's
//! `bind` and its `listen`, a connect is refused and the socket looks
//! stale. Taking this lock first closes it. This module must never block
//! (a held lock is an error within milliseconds) and never leave a lock that a dead
//! helper's file could shadow: after locking, the file must still be the
//! one at the path.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// Why the name could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another helper holds the lock: the sandbox is running or starting.
    #[error("a sandbox named {0} is already running or starting")]
    Held(String),
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

/// A held name lock; released (and its file removed) by [`NameLock::release`]
/// or by the process's death.
#[derive(Debug)]
pub struct NameLock {
    path: PathBuf,
    _lock: Flock<File>,
}

impl NameLock {
    /// Takes the lock on `<dir>/<name>.lock` without blocking (a holder
    /// that lets go within a few milliseconds, a [`NameLock::sweep`] or an
    /// [`NameLock::is_held`] probe, is waited for).
    pub fn acquire(dir: &Path, name: &str) -> Result<Self, LockError> {
        let mut tries = 0;
        loop {
            match Self::acquire_once(dir, name) {
                Err(LockError::Held(_)) if tries < 5 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                r => return r,
            }
        }
    }

    fn acquire_once(dir: &Path, name: &str) -> Result<Self, LockError> {
        let path = dir.join(format!("{name}.lock"));
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io_err)?;
            let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => lock,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(LockError::Held(name.to_owned()))
                }
                Err((_, e)) => return Err(io_err(e.into())),
            };
            // The holder before us may have removed the file between our
            // open and our flock; then we locked an orphan and must retry.
            let ours = lock.metadata().map_err(io_err)?;
            match fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {
                    return Ok(Self { path, _lock: lock })
                }
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(e)),
            }
        }
    }

    /// Removes the lock files in `dir` that no live process holds (their
    /// helper was killed before it could release them); returns how many.
    /// Each is removed while locked by this call, so a helper starting
    /// meanwhile either gets the name after us or sees the file gone and
    /// retries ([`NameLock::acquire`]).
    pub fn sweep(dir: &Path) -> usize {
        let Ok(entries) = fs::read_dir(dir) else {
            return 0;
        };
        let mut swept = 0;
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|f| f.strip_suffix(".lock")) else {
                continue;
            };
            if boxdesk_platform::names::validate_name(name).is_err() {
                continue;
            }
            if let Ok(lock) = Self::acquire_once(dir, name) {
                lock.release();
                swept += 1;
            }
        }
        swept
    }

    /// Whether a live helper holds `<dir>/<name>.lock` now (a probe: takes
    /// and drops a shared lock, never blocks, never creates the file).
    pub fn is_held(dir: &Path, name: &str) -> bool {
        let path = dir.join(format!("{name}.lock"));
        let Ok(file) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        else {
            return false;
        };
        matches!(
            Flock::lock(file, FlockArg::LockSharedNonblock),
            Err((_, nix::errno::Errno::EWOULDBLOCK))
        )
    }

    /// Removes the lock file, then unlocks.
    pub fn release(self) {
        let _ = fs::remove_file(&self.path);
    }

    /// Leaves the lock and its file to another process that inherited the
    /// descriptor (a jailed helper's reaper): held until this process
    /// exits, then by that one alone, which removes the file and releases
    /// it after its own work. (Dropping the lock would unlock it for both:
    /// an `flock` belongs to the open file, which they share.)
    pub fn leave(self) {
        std::mem::forget(self);
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The locked descriptor (for a process that inherits the lock).
    pub fn as_raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&*self._lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_name_is_refused_until_the_first_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let a = NameLock::acquire(dir.path(), "x").unwrap();
        assert!(matches!(
            NameLock::acquire(dir.path(), "x"),
            Err(LockError::Held(n)) if n == "x"
        ));
        a.release();
        NameLock::acquire(dir.path(), "x").unwrap().release();
    }

    #[test]
    fn a_sweep_removes_the_lock_files_of_dead_holders_and_leaves_held_ones() {
        let dir = tempfile::tempdir().unwrap();
        let held = NameLock::acquire(dir.path(), "live").unwrap();
        // What a helper killed by SIGKILL leaves: the file, unlocked.
        fs::write(dir.path().join("dead.lock"), "").unwrap();
        fs::write(dir.path().join("not a name.lock"), "").unwrap();
        assert_eq!(NameLock::sweep(dir.path()), 1);
        assert!(!dir.path().join("dead.lock").exists());
        assert!(dir.path().join("not a name.lock").exists());
        assert!(held.path().exists());
        assert!(NameLock::is_held(dir.path(), "live"));
    }
}
