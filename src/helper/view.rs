//! A VM helper's own view of the file system (Linux): what it lists for
//! [`boxdesk_vmm::jail::view`], and the reaper that finishes its end
//! outside that view.
//!
//! The view: the guest image (kernel, initramfs, `--rootfs` disk), the
//! shares, under `--root host` the host's system dirs (read-only), the
//! sandbox's own state dir, boxdesk's runtime dir (its sockets and log,
//! and the `<name>.agent_<port>` listeners the guest's connections go to,
//! which appear while it runs), `/dev/kvm`, `/dev/null`, `/dev/zero`,
//! `/dev/urandom`. Nothing else of the host: no home, no `/etc`, no other
//! sandbox's state.
//!
//! The reaper: inside the view the state dir is a mount point, which the
//! helper can empty but not remove, and the name's lock must outlast the
//! helper until then. So before it enters, the helper forks a process that
//! keeps only the lock (inherited), the readiness pipe (its starter sees
//! the end once both are gone) and a pipe of its own; when that pipe ends
//! (the helper exited, however), it removes the state dir if the helper
//! left it empty, removes the lock file and exits.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use boxdesk_sandbox::keeper::{Handover, Keeper};
use boxdesk_vmm::jail::view::View;

use super::{HelperError, HelperOptions};

/// `BOXDESK_JAIL=off`: no view and no seccomp filter (for a host without
/// user namespaces; not recommended).
pub fn jail_off() -> bool {
    std::env::var_os("BOXDESK_JAIL").is_some_and(|v| v == "off")
}

/// The view of the helper of `opts` over `keeper`'s claim. The image is
/// found here, before the search paths go, and pinned in `opts`.
fn view(opts: &mut HelperOptions, keeper: &Keeper) -> View {
    let mut view = View::new();
    for dev in ["/dev/kvm", "/dev/null", "/dev/zero", "/dev/urandom"] {
        view.bind(dev, true);
    }
    if let Some(runtime) = keeper.paths().sock.parent() {
        view.bind(runtime, true);
    }
    view.bind(&keeper.state().dir, true);
    if let Some(vm) = opts.vm.as_mut() {
        // Absolute: inside the view the helper's working directory is `/`.
        let arch = std::env::consts::ARCH;
        if let Ok(image) = boxdesk_vmm::image::find(arch, vm.kernel.clone(), vm.initrd.clone()) {
            let (kernel, initrd) = (absolute(image.kernel), absolute(image.initrd));
            view.bind(&kernel, false).bind(&initrd, false);
            vm.kernel = Some(kernel);
            vm.initrd = Some(initrd);
        }
        if let Some((disk, writable)) = vm.rootfs.as_mut() {
            *disk = absolute(std::mem::take(disk));
            view.bind(&*disk, *writable);
        }
    }
    for share in &opts.shares {
        view.bind(&share.host, share.writable);
    }
    if opts.root_host {
        use boxdesk_sandbox::host_system::{self, HostEntry};
        for entry in host_system::scan(Path::new("/")).unwrap_or_default() {
            match entry {
                HostEntry::Dir(dir) => {
                    view.bind(&dir, false);
                }
                // NixOS's /run links too: the VM's mounts are read from
                // inside the view, so what the guest gets is what is here.
                HostEntry::Symlink { path, target } => {
                    view.link(&path, target);
                }
            }
        }
        // The copies of /etc files, made now: inside the view there is no
        // host /etc to read them from (they are in the state dir, which
        // the view has).
        if let Some(vm) = opts.vm.as_mut() {
            vm.etc = Some(super::etc_copies(keeper).unwrap_or_else(|e| {
                tracing::warn!("a --root host VM without copies of the host's /etc files: {e}");
                Vec::new()
            }));
        }
    }
    view
}

/// `path` made absolute against the working directory (symlinks kept).
fn absolute(path: std::path::PathBuf) -> std::path::PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

/// Forks the reaper, then enters the view; call it while the helper has
/// one thread.
pub fn enter(opts: &mut HelperOptions, keeper: &Keeper) -> Result<(), HelperError> {
    let view = view(opts, keeper);
    let handover = keeper.hand_over();
    if let Some(h) = handover {
        let ready = opts.ready.as_ref().map(AsRawFd::as_raw_fd);
        reaper(&h, ready)?;
    }
    view.enter().map_err(HelperError::View)
}

/// Forks the reaper of the module doc; returns in the helper.
fn reaper(h: &Handover, ready: Option<RawFd>) -> Result<(), HelperError> {
    let (gone_r, gone_w) =
        nix::unistd::pipe().map_err(|e| super::os("making the reaper's pipe")(e.into()))?;
    // SAFETY: the helper has one thread here (the view needs that too),
    // so the child inherits no lock another thread held.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(super::os("forking the reaper")(e.into())),
        Ok(nix::unistd::ForkResult::Parent { .. }) => {
            drop(gone_r);
            // Held, never written, until the helper exits.
            std::mem::forget(gone_w);
            Ok(())
        }
        Ok(nix::unistd::ForkResult::Child) => {
            drop(gone_w);
            let keep = [Some(gone_r.as_raw_fd()), Some(h.lock_fd), ready, Some(2)];
            close_all_but(&keep);
            reap(h, gone_r)
        }
    }
}

/// The reaper's whole life; never returns.
fn reap(h: &Handover, gone: OwnedFd) -> ! {
    // SAFETY: prctl with a NUL-terminated name that outlives the call.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"boxdesk-reaper".as_ptr(), 0, 0, 0) };
    let mut b = [0u8; 1];
    // Ends at end-of-file (the helper is gone) or an error; nothing
    // writes to it.
    while matches!(
        nix::unistd::read(gone.as_raw_fd(), &mut b),
        Err(nix::errno::Errno::EINTR)
    ) {}
    let _ = std::fs::remove_dir(&h.state_dir);
    if same_file(&h.lock_file, h.lock_fd) {
        let _ = std::fs::remove_file(&h.lock_file);
    }
    // SAFETY: ends the reaper without the helper's destructors or exit
    // handlers (they belong to the helper's process).
    unsafe { libc::_exit(0) }
}

/// Whether `path` is the file open at `fd`.
fn same_file(path: &Path, fd: RawFd) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(st) = nix::sys::stat::fstat(fd) else {
        return false;
    };
    std::fs::symlink_metadata(path).is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino)
}

/// Closes every descriptor but `keep`'s (the control socket among them:
/// it must refuse connections once the helper is gone).
fn close_all_but(keep: &[Option<RawFd>]) {
    let open: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => (0..1024).collect(),
    };
    for fd in open {
        if !keep.contains(&Some(fd)) {
            // SAFETY: closing a descriptor this fresh process owns (its
            // copies are the helper's own, unaffected); a closed one fails.
            unsafe { libc::close(fd) };
        }
    }
}
