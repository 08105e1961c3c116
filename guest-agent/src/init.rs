//! The init duties of a VM's PID 1, done once before serving: mount
//! `/proc`, `/sys`, devtmpfs `/dev`, devpts `/dev/pts` (`ptmxmode=666`)
//! with `/dev/ptmx`, tmpfs `/dev/shm`, `/tmp`, `/run`; make sure fds 0–2
//! are open (on the console); set the hostname; bring `lo` up; then, when
//! the kernel command line asks for one, switch to the root filesystem
//! (`rootfs`, which carries these mounts into it).
//!
//! Owns the list of what it mounted, so shutdown can unmount exactly that.
//! Every step is best effort: something already mounted (or `EBUSY`, or
//! `EPERM` in a namespace) is skipped and the agent serves anyway. It must
//! never mount over something already mounted, and never replace an
//! existing `/dev/ptmx` (a devtmpfs can be shared with a host).

use std::os::fd::{AsRawFd, IntoRawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};

/// Why an init step failed (logged; init goes on).
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A mount failed for a reason other than "already there".
    #[error("mount {target}: {err}")]
    Mount {
        /// The mount point.
        target: &'static str,
        /// The system error.
        err: Errno,
    },
    /// The hostname could not be set.
    #[error("sethostname: {0}")]
    Hostname(Errno),
    /// `lo` could not be brought up.
    #[error(transparent)]
    Loopback(#[from] crate::loopback::LoopbackError),
}

/// The hostname every sandbox gets.
pub const HOSTNAME: &str = "boxdesk";

struct Fs {
    target: &'static str,
    fstype: &'static str,
    flags: MsFlags,
    data: &'static str,
    mode: u32,
}

const NOSUID_NODEV: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);
const NOSUID_NODEV_NOEXEC: MsFlags = NOSUID_NODEV.union(MsFlags::MS_NOEXEC);

const MOUNTS: [Fs; 7] = [
    Fs {
        target: "/proc",
        fstype: "proc",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
        mode: 0o555,
    },
    Fs {
        target: "/sys",
        fstype: "sysfs",
        flags: NOSUID_NODEV_NOEXEC,
        data: "",
        mode: 0o555,
    },
    Fs {
        target: "/dev",
        fstype: "devtmpfs",
        flags: MsFlags::MS_NOSUID,
        data: "mode=0755",
        mode: 0o755,
    },
    Fs {
        target: "/dev/pts",
        fstype: "devpts",
        flags: MsFlags::MS_NOSUID.union(MsFlags::MS_NOEXEC),
        data: "newinstance,ptmxmode=666,mode=620",
        mode: 0o755,
    },
    Fs {
        target: "/dev/shm",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=1777",
        mode: 0o1777,
    },
    Fs {
        target: "/tmp",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=1777",
        mode: 0o1777,
    },
    Fs {
        target: "/run",
        fstype: "tmpfs",
        flags: NOSUID_NODEV,
        data: "mode=0755",
        mode: 0o755,
    },
];

/// Does the init duties; returns the mount points it mounted, in order.
pub fn vm_init() -> Vec<PathBuf> {
    let mut mounted = Vec::new();
    for fs in &MOUNTS {
        match mount_one(fs) {
            Ok(true) => mounted.push(PathBuf::from(fs.target)),
            Ok(false) => {}
            Err(e) => log!("init: {e}"),
        }
        if fs.target == "/dev" {
            ensure_stdio();
        }
        if fs.target == "/dev/pts" {
            ptmx_link();
        }
    }
    if let Err(e) = nix::unistd::sethostname(HOSTNAME) {
        log!("init: {}", InitError::Hostname(e));
    }
    if let Err(e) = crate::loopback::up() {
        log!("init: {}", InitError::from(e));
    }
    // Moves the mounts above into the new root under the same paths, so
    // `mounted` stays right for shutdown either way.
    crate::rootfs::switch_if_asked();
    // The host's system as `/` (the same moves), then the shares.
    mounted.extend(crate::shares::mount_asked());
    mounted
}

/// Mounts `fs` unless something is mounted there; `Ok(false)` = skipped.
fn mount_one(fs: &Fs) -> Result<bool, InitError> {
    if is_mounted(fs.target) {
        return Ok(false);
    }
    let _ = std::fs::create_dir_all(fs.target);
    let data = (!fs.data.is_empty()).then_some(fs.data);
    match mount(Some(fs.fstype), fs.target, Some(fs.fstype), fs.flags, data) {
        Ok(()) => {
            let _ = nix::sys::stat::fchmodat(
                None,
                fs.target,
                nix::sys::stat::Mode::from_bits_truncate(fs.mode),
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            );
            Ok(true)
        }
        Err(Errno::EBUSY | Errno::EPERM | Errno::EACCES) => Ok(false),
        Err(err) => Err(InitError::Mount {
            target: fs.target,
            err,
        }),
    }
}

/// True when `target` is a mount point: `/proc` by its contents (there is
/// no mount table before it), the others by `/proc/self/mountinfo`.
pub(crate) fn is_mounted(target: &str) -> bool {
    if target == "/proc" {
        return Path::new("/proc/self/stat").exists();
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mount_point| mount_point == target)
}

/// The kernel starts init with fds 0–2 on `/dev/console` only if that node
/// existed; otherwise they are closed, and the first sockets opened would
/// become a child's stdio. Open the console (or `/dev/null`) on any gap.
fn ensure_stdio() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD on any number has no side effects.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 {
            continue;
        }
        let open = |path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
        };
        let Ok(file) = open("/dev/console").or_else(|_| open("/dev/null")) else {
            return;
        };
        // Lower numbers are open (checked in order), so the new descriptor
        // is normally `fd` itself and is kept; otherwise it is copied there.
        if file.as_raw_fd() == fd {
            let _ = file.into_raw_fd();
        } else {
            // SAFETY: dup2 onto a closed stdio number; `file` stays valid
            // until it is dropped after the call.
            unsafe { libc::dup2(file.as_raw_fd(), fd) };
        }
    }
}

/// `/dev/ptmx` → `pts/ptmx` when the devtmpfs has no ptmx node. An existing
/// node is kept: since Linux 4.7 it opens the devpts mounted beside it.
fn ptmx_link() {
    if std::fs::symlink_metadata("/dev/ptmx").is_err() {
        let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    }
}
