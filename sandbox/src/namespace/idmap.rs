//! Id-mapped mounts for sandboxes of a root-started boxdesk: root inside
//! such a sandbox is a subordinate id outside ([`super::ids`]), so a host
//! folder of root's would be closed to it. Through a mount id-mapped with
//! a user namespace whose 0 is that subordinate id, the files root owns on
//! disk are the sandbox root's, and what it creates lands as root's — the
//! share behaves as it does for a user, who is root inside their own
//! sandbox. (The seccomp filter refuses set-id bits, so nothing created
//! this way is a setuid-root program on the host.)
//!
//! Used by the namespace backend's `--share` staging ([`super::child`])
//! and by cowork's folder attachments.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// `MOUNT_ATTR_IDMAP`.
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MountAttr {
    /// Attributes to set.
    pub attr_set: u64,
    /// Attributes to clear.
    pub attr_clr: u64,
    /// Propagation type.
    pub propagation: u64,
    /// The user namespace of `MOUNT_ATTR_IDMAP`.
    pub userns_fd: u64,
}

/// `mount_setattr` on the whole detached tree `tree`.
pub fn setattr(tree: &OwnedFd, attr: &MountAttr) -> io::Result<()> {
    // SAFETY: `attr` is a valid mount_attr of the size passed; the path is
    // empty and `tree` a valid descriptor.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A user namespace whose 0 is `uid`/`gid` outside: a child made only to
/// hold it unshares it; we write its maps and keep a descriptor of it.
pub fn userns_mapping_root_to(uid: u32, gid: u32) -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (hold_r, hold_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (rw, hr, hw) = (ready_w.as_raw_fd(), hold_r.as_raw_fd(), hold_w.as_raw_fd());
    // SAFETY: the child makes only async-signal-safe system calls (unshare,
    // write, read, _exit) on descriptors it inherited, so forking from
    // this multi-threaded process is sound.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; the child never returns.
        unsafe {
            // Its copy of the write end would keep the read below from
            // ever seeing end-of-file.
            libc::close(hw);
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                libc::_exit(1);
            }
            libc::write(rw, b"u".as_ptr().cast(), 1);
            let mut b = 0u8;
            // Blocks until the parent closes its end.
            libc::read(hr, (&mut b as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(hold_r);
    let outcome = (|| {
        let mut b = [0u8; 1];
        if nix::unistd::read(ready_r.as_raw_fd(), &mut b)? != 1 {
            return Err(io::Error::other("the namespace holder could not unshare"));
        }
        std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1"))?;
        std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
        std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1"))?;
        Ok(OwnedFd::from(std::fs::File::open(format!(
            "/proc/{pid}/ns/user"
        ))?))
    })();
    drop(hold_w);
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    outcome
}
