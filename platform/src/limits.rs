//! The descriptor limit of a server process. `boxdesk __vmm` and `boxdesk
//! cowork` raise their soft `RLIMIT_NOFILE` to the hard limit before they
//! accept anything, so a burst of connections meets boxdesk's own
//! per-socket connection cap (and its clear refusal) long before `EMFILE`
//! — a soft limit of 1024 is the common default for users.
//!
//! A VM helper that serves virtio-fs needs more: the passthrough file
//! server holds an `O_PATH` descriptor for every host inode the guest
//! kernel keeps cached (dropped at its `FORGET`), so a guest listing
//! 10,000 files holds 10,000 descriptors. [`raise_nofile_for_files`] also
//! raises the hard limit, to [`FILE_SERVER_NOFILE`] or the kernel's
//! `fs.nr_open` if lower, where the process may (`CAP_SYS_RESOURCE`: root),
//! as `virtiofsd` does; elsewhere it is the soft raise alone, and the
//! guest meets `EMFILE` from the server once the hard limit is spent.
//!
//! Apart from that one case this module never touches the hard limit
//! (raising it needs privilege and is the administrator's call), and a
//! failure to raise is reported, never fatal: the server still runs, only
//! with less room.

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Why the soft limit could not be raised.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// `getrlimit` or `setrlimit` failed.
    #[error("cannot raise the open-file limit (soft {soft}, hard {hard}): {}", .errno.desc())]
    Raise {
        /// The soft limit before.
        soft: u64,
        /// The hard limit.
        hard: u64,
        /// What the OS said.
        errno: nix::errno::Errno,
    },
}

/// The soft open-file limit before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
}

/// Most descriptors one process may have on macOS (`OPEN_MAX`), whatever
/// the hard limit says: `setrlimit` refuses more.
#[cfg(target_vendor = "apple")]
const APPLE_OPEN_MAX: u64 = 10_240;

/// The open-file limit a helper serving virtio-fs asks for: `virtiofsd`'s
/// default (1 Mi), room for a million cached guest inodes.
pub const FILE_SERVER_NOFILE: u64 = 1 << 20;

/// [`raise_nofile`], after raising the hard limit too (soft and hard to
/// [`FILE_SERVER_NOFILE`], at most `fs.nr_open`) where the process may;
/// refused (`EPERM`, a user) it is the soft raise alone.
pub fn raise_nofile_for_files() -> Result<Nofile, LimitError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|errno| LimitError::Raise {
        soft: 0,
        hard: 0,
        errno,
    })?;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(FILE_SERVER_NOFILE);
    let want = FILE_SERVER_NOFILE.min(nr_open);
    if cfg!(target_os = "linux")
        && want > hard
        && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok()
    {
        return Ok(Nofile {
            before: soft,
            now: want,
        });
    }
    raise_nofile()
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (on macOS at most
/// `OPEN_MAX`). Already there: nothing changes.
pub fn raise_nofile() -> Result<Nofile, LimitError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|errno| LimitError::Raise {
        soft: 0,
        hard: 0,
        errno,
    })?;
    #[cfg(target_vendor = "apple")]
    let target = hard.min(APPLE_OPEN_MAX).max(soft);
    #[cfg(not(target_vendor = "apple"))]
    let target = hard;
    if target <= soft {
        return Ok(Nofile {
            before: soft,
            now: soft,
        });
    }
    setrlimit(Resource::RLIMIT_NOFILE, target, hard).map_err(|errno| LimitError::Raise {
        soft,
        hard,
        errno,
    })?;
    Ok(Nofile {
        before: soft,
        now: target,
    })
}
