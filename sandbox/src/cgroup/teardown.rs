//! Taking a sandbox's cgroup down: SIGKILL to everything listed in it
//! (v2 `cgroup.kill` first where the kernel has it), then `rmdir` deepest
//! first. It must never signal a pid the cgroup no longer lists (pids are
//! pinned with a pidfd and checked again) and never go anywhere but the
//! directories below the cgroup it was given.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{write_file, CgroupError, Version};

/// How long removal keeps killing before it gives up on a process that
/// does not die (uninterruptible sleep).
const REMOVE_DEADLINE: Duration = Duration::from_secs(5);
/// Cgroups below a sandbox's own that removal walks at most.
const MAX_DESCENDANTS: usize = 4096;

/// The pids in `dir`'s `cgroup.procs`; none when the directory is gone.
pub(super) fn read_pids(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    let path = dir.join("cgroup.procs");
    match fs::read_to_string(&path) {
        Ok(t) => Ok(t
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|&p: &i32| p > 0)
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CgroupError::Read {
            path,
            error: source,
        }),
    }
}

/// SIGKILL to every process `dir` lists. A pid is pinned with a pidfd
/// first and signalled only if the cgroup still lists it afterwards, so a
/// pid that exited and was reused by a process elsewhere is never hit.
/// Returns who was still listed.
fn kill_listed(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    let pids = read_pids(dir)?;
    if pids.is_empty() {
        return Ok(pids);
    }
    let pinned: Vec<(i32, io::Result<OwnedFd>)> =
        pids.iter().map(|&p| (p, pidfd_open(p))).collect();
    let still = read_pids(dir)?;
    for (pid, fd) in pinned {
        if !still.contains(&pid) {
            continue;
        }
        match fd {
            Ok(fd) => {
                // SAFETY: a plain syscall on a pidfd we own; no memory is
                // passed (the siginfo pointer is null).
                unsafe {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    );
                }
            }
            // Kernels before 5.3: no pidfds, the plain (racy) kill.
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                // SAFETY: kill(2) takes no memory.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            Err(_) => {} // gone already
        }
    }
    Ok(still)
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags, no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Kills everything in `top` and below and removes the directories,
/// deepest first. Only directories below `top` are visited, each taken by
/// its own entry type (never followed).
pub(super) fn remove_tree(top: &Path, version: Version) -> Result<(), CgroupError> {
    match fs::symlink_metadata(top) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: top.to_owned(),
                error: source,
            })
        }
        Ok(m) if !m.is_dir() => return Err(CgroupError::NotACgroup(top.to_owned())),
        Ok(_) => {}
    }
    if version == Version::V2 {
        let kill = top.join("cgroup.kill");
        if kill.exists() {
            // Best effort: the loop below kills one by one if this fails.
            let _ = write_file(&kill, "1");
        }
    }
    let dirs = subtree(top)?;
    let deadline = Instant::now() + REMOVE_DEADLINE;
    for d in dirs.iter().rev() {
        loop {
            let left = kill_listed(d)?;
            match fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    if Instant::now() >= deadline {
                        return Err(CgroupError::Stuck {
                            path: d.clone(),
                            pids: left,
                            secs: REMOVE_DEADLINE.as_secs(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(source) => {
                    return Err(CgroupError::Remove {
                        path: d.clone(),
                        error: source,
                    })
                }
            }
        }
    }
    Ok(())
}

/// `top` and every cgroup below it, parents before children.
fn subtree(top: &Path) -> Result<Vec<PathBuf>, CgroupError> {
    let mut dirs = vec![top.to_owned()];
    let mut i = 0;
    while i < dirs.len() {
        let entries = match fs::read_dir(&dirs[i]) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                i += 1;
                continue;
            }
            Err(source) => {
                return Err(CgroupError::Read {
                    path: dirs[i].clone(),
                    error: source,
                })
            }
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if dirs.len() > MAX_DESCENDANTS {
                    return Err(CgroupError::TooMany {
                        path: top.to_owned(),
                        max: MAX_DESCENDANTS,
                    });
                }
                dirs.push(entry.path());
            }
        }
        i += 1;
    }
    Ok(dirs)
}
