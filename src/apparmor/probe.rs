//! The real test of what AppArmor's restriction takes away: a child of
//! this process makes a user and a mount namespace, maps its ids into the
//! user namespace, and mounts a tmpfs in the mount namespace — what bwrap
//! and the VM helper's jail do first. Under the restriction, without a
//! profile granting `userns`, the namespace is made but a later step (the
//! id maps, a mount) is refused: the `unprivileged_userns` profile denies
//! every capability.
//!
//! As root, the child first becomes the unprivileged id a root-started
//! sandbox runs as (`boxdesk_sandbox::namespace::IdMap`), since that is who
//! makes a namespace sandbox's namespaces. The child exits right after; it
//! changes nothing the host can see.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use boxdesk_sandbox::namespace::IdMap;

/// The child's steps, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Step {
    /// Becoming the sandbox's unprivileged id (as root only).
    Drop = 1,
    /// `unshare(CLONE_NEWUSER | CLONE_NEWNS)`.
    Unshare,
    /// `deny` to `/proc/self/setgroups`.
    Setgroups,
    /// `/proc/self/uid_map`.
    UidMap,
    /// `/proc/self/gid_map`.
    GidMap,
    /// Making `/` a private mount (needs `CAP_SYS_ADMIN` in the namespace).
    Private,
    /// Mounting a tmpfs.
    Mount,
}

impl Step {
    const ALL: [Step; 7] = [
        Step::Drop,
        Step::Unshare,
        Step::Setgroups,
        Step::UidMap,
        Step::GidMap,
        Step::Private,
        Step::Mount,
    ];
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::Drop => "becoming the sandbox's unprivileged id",
            Step::Unshare => "making a user and a mount namespace",
            Step::Setgroups => "denying setgroups in it",
            Step::UidMap => "writing its uid_map",
            Step::GidMap => "writing its gid_map",
            Step::Private => "making / private in it",
            Step::Mount => "mounting a tmpfs in it",
        })
    }
}

/// Why the namespace did not work.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// A pipe or the child could not be made.
    #[error("cannot start the child that tries: {0}")]
    Start(io::Error),
    /// A step failed in the child.
    #[error("{step} failed: {errno}")]
    Step {
        /// Which.
        step: Step,
        /// What the kernel said.
        errno: io::Error,
    },
    /// The child ended without reporting.
    #[error("the child that tries ended without a report ({0})")]
    Lost(String),
}

/// Who the child was when it made the namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Made {
    /// Its uid outside.
    pub uid: u32,
    /// Whether it dropped from root to that id first.
    pub dropped: bool,
}

/// Runs the test (see the module doc).
pub fn userns_with_capabilities() -> Result<Made, ProbeError> {
    let ids = IdMap::for_this_process();
    // The ids the child makes its namespace as.
    let (euid, egid) = if ids.drop_from_root {
        (ids.uid, ids.gid)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    // Everything the child writes, made before it exists: after fork it
    // may only make system calls.
    let text = |s: String| CString::new(s).expect("no NUL in a number");
    let uid_map = text(format!("0 {euid} 1"));
    let gid_map = text(format!("0 {egid} 1"));
    let mut fds = [0; 2];
    // SAFETY: `fds` is two ints, as pipe2 wants.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(ProbeError::Start(io::Error::last_os_error()));
    }
    // SAFETY: pipe2 just made these two descriptors, and nothing else owns them.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child makes only async-signal-safe system calls on
    // memory prepared above and exits with _exit, so forking from a
    // process that may have threads is sound.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ProbeError::Start(io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: see above; never returns.
        unsafe { child(ids, &uid_map, &gid_map, wr.as_raw_fd()) }
    }
    drop(wr);
    let mut report = [0u8; 8];
    let mut got = 0;
    while got < report.len() {
        // SAFETY: reads into the unfilled tail of `report`.
        let n = unsafe {
            libc::read(
                rd.as_raw_fd(),
                report[got..].as_mut_ptr().cast(),
                report.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child, writing its status into `status`.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    let made = Made {
        uid: euid,
        dropped: ids.drop_from_root,
    };
    match got {
        0 if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 => Ok(made),
        8 => {
            let step = u32::from_ne_bytes(report[..4].try_into().expect("4 bytes"));
            let errno = i32::from_ne_bytes(report[4..].try_into().expect("4 bytes"));
            let step = Step::ALL
                .into_iter()
                .find(|s| *s as u32 == step)
                .ok_or_else(|| ProbeError::Lost(format!("it reported step {step}")))?;
            Err(ProbeError::Step {
                step,
                errno: io::Error::from_raw_os_error(errno),
            })
        }
        _ => Err(ProbeError::Lost(format!("wait status {status:#x}"))),
    }
}

/// The child: each step in turn; the first failure is written to `report`
/// (the step, then errno) and ends it.
///
/// # Safety
///
/// Only in a child just forked: it ends the process.
unsafe fn child(ids: IdMap, uid_map: &CString, gid_map: &CString, report: i32) -> ! {
    let fail = |step: Step| -> ! {
        // SAFETY: errno of this thread, then a write of 8 bytes from a
        // local array and _exit: async-signal-safe.
        unsafe {
            let errno = *libc::__errno_location();
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&(step as u32).to_ne_bytes());
            b[4..].copy_from_slice(&errno.to_ne_bytes());
            libc::write(report, b.as_ptr().cast(), b.len());
            libc::_exit(1)
        }
    };
    let write_file = |path: &std::ffi::CStr, text: &[u8]| -> bool {
        // SAFETY: a NUL-terminated path, a buffer of its length, a
        // descriptor closed after.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return false;
            }
            let ok = libc::write(fd, text.as_ptr().cast(), text.len()) == text.len() as isize;
            libc::close(fd);
            ok
        }
    };
    // SAFETY: system calls on prepared arguments only (see `fail`).
    unsafe {
        if ids.drop_from_root
            && (libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(ids.gid, ids.gid, ids.gid) != 0
                || libc::setresuid(ids.uid, ids.uid, ids.uid) != 0
                // A changed uid made /proc/self root's; make it ours again
                // so the maps can be written.
                || libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
        {
            fail(Step::Drop);
        }
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
            fail(Step::Unshare);
        }
        if !write_file(c"/proc/self/setgroups", b"deny") {
            fail(Step::Setgroups);
        }
        if !write_file(c"/proc/self/uid_map", uid_map.as_bytes()) {
            fail(Step::UidMap);
        }
        if !write_file(c"/proc/self/gid_map", gid_map.as_bytes()) {
            fail(Step::GidMap);
        }
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            fail(Step::Private);
        }
        if libc::mount(
            c"boxdesk-probe".as_ptr(),
            c"/".as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"size=4k".as_ptr().cast(),
        ) != 0
        {
            fail(Step::Mount);
        }
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_of_this_process_makes_a_user_namespace_and_mounts_in_it_here() {
        let allowed = boxdesk_platform::probe::user_namespaces();
        if !allowed.is_available() {
            println!("skipped: user namespaces are not allowed here: {allowed}");
            return;
        }
        let made = userns_with_capabilities().unwrap();
        let ids = IdMap::for_this_process();
        assert_eq!(made.dropped, ids.drop_from_root);
        if ids.drop_from_root {
            assert_eq!(made.uid, ids.uid);
        } else {
            assert_eq!(made.uid, nix::unistd::geteuid().as_raw());
        }
    }

    #[test]
    fn a_failed_step_is_named_with_the_kernels_reason() {
        let e = ProbeError::Step {
            step: Step::Private,
            errno: io::Error::from_raw_os_error(libc::EPERM),
        };
        assert!(e
            .to_string()
            .starts_with("making / private in it failed: Operation not permitted"));
    }
}
