//! Sandbox names and the per-sandbox paths derived from them.
//!
//! This module owns the name grammar `[A-Za-z0-9][A-Za-z0-9_.-]{0,63}` and
//! the OS limit on Unix socket paths. It must never touch the filesystem:
//! it only says whether a name, and the paths built from it, can be used.

use std::path::{Path, PathBuf};

/// Size of `sockaddr_un.sun_path` on this OS, including the terminating
/// NUL: a socket path may be at most `SUN_PATH_MAX - 1` bytes.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub const SUN_PATH_MAX: usize = 108;
/// Size of `sockaddr_un.sun_path` on this OS, including the terminating
/// NUL: a socket path may be at most `SUN_PATH_MAX - 1` bytes.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub const SUN_PATH_MAX: usize = 104;

/// The longest sandbox name, in bytes.
pub const NAME_MAX: usize = 64;

/// Why a sandbox name, or a path built from it, cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("sandbox name is empty")]
    Empty,
    /// The name is longer than [`NAME_MAX`] bytes.
    #[error("sandbox name {name:?} is {len} bytes, at most 64 are allowed")]
    TooLong {
        /// The name as given.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The name does not start with an ASCII letter or digit.
    #[error("sandbox name {name:?} must start with a letter or digit")]
    BadStart {
        /// The name as given.
        name: String,
    },
    /// The name holds a character outside `A-Za-z0-9_.-`.
    #[error("sandbox name {name:?} contains {ch:?}; only A-Z a-z 0-9 _ . - are allowed")]
    BadChar {
        /// The name as given.
        name: String,
        /// The first offending character.
        ch: char,
    },
    /// A socket path built from the name does not fit in `sun_path`.
    #[error(
        "socket path {} is {len} bytes, over this OS's limit of {max}; \
         use a shorter name or a shorter runtime dir",
        path.display()
    )]
    PathTooLong {
        /// The path that does not fit.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The most bytes a socket path may have here (`SUN_PATH_MAX - 1`).
        max: usize,
    },
}

/// Checks `name` against `[A-Za-z0-9][A-Za-z0-9_.-]{0,63}`.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let owned = || name.to_owned();
    let Some(first) = name.chars().next() else {
        return Err(NameError::Empty);
    };
    if name.len() > NAME_MAX {
        return Err(NameError::TooLong {
            name: owned(),
            len: name.len(),
        });
    }
    if !first.is_ascii_alphanumeric() {
        return Err(NameError::BadStart { name: owned() });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    match name.chars().find(|&c| !allowed(c)) {
        Some(ch) => Err(NameError::BadChar { name: owned(), ch }),
        None => Ok(()),
    }
}

/// The files of one sandbox in the runtime dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPaths {
    /// `<name>.sock`: the helper's control socket.
    pub sock: PathBuf,
    /// `<name>.agent`: the agent socket (hybrid vsock or plain Unix).
    pub agent: PathBuf,
    /// `<name>.log`: the detached helper's log.
    pub log: PathBuf,
}

impl SandboxPaths {
    /// Builds the paths for `name` under `runtime_dir`, refusing a bad name
    /// or a socket path that would not fit in `sun_path`.
    pub fn new(runtime_dir: &Path, name: &str) -> Result<Self, NameError> {
        validate_name(name)?;
        let paths = SandboxPaths {
            sock: runtime_dir.join(format!("{name}.sock")),
            agent: runtime_dir.join(format!("{name}.agent")),
            log: runtime_dir.join(format!("{name}.log")),
        };
        check_socket_path(&paths.sock)?;
        check_socket_path(&paths.agent)?;
        Ok(paths)
    }
}

/// Refuses a path that cannot be bound or connected to as a Unix socket
/// because it is longer than `SUN_PATH_MAX - 1` bytes.
pub fn check_socket_path(path: &Path) -> Result<(), NameError> {
    let len = path.as_os_str().len();
    let max = SUN_PATH_MAX - 1;
    if len > max {
        return Err(NameError::PathTooLong {
            path: path.to_owned(),
            len,
            max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sun_path_max_matches_the_sockaddr_un_of_this_os() {
        // SAFETY: sockaddr_un is plain old data; all-zero bytes are a valid value.
        let addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        assert_eq!(addr.sun_path.len(), SUN_PATH_MAX);
    }
}
