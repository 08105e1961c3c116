//! The root filesystem of a VM started with `--rootfs IMG`: the VMM attaches
//! the image as virtio-blk and puts `boxdesk.rootfs=/dev/vda` (and, for
//! `--rootfs-rw`, `boxdesk.rootfs_rw=1`) on the kernel command line. As a
//! VM's init, after `/proc` and the other init mounts exist and before the
//! agent listens, [`switch_if_asked`] reads `/proc/cmdline` and, when asked:
//!
//! 1. waits (up to [`DEVICE_WAIT`]) for the device node in devtmpfs and
//!    mounts it at `/mnt/lower` (ext4, then squashfs; read-only), or
//!    read-write as ext4 when `boxdesk.rootfs_rw=1`;
//! 2. read-only: tmpfs at `/mnt/rw` and an overlay of the two at
//!    `/mnt/newroot`, so the guest can write (writes vanish at power-off);
//!    read-write: the disk itself is the new root;
//! 3. creates the mount points and `/results`, `/work` in the new root,
//!    moves `/dev`, `/proc`, `/sys`, `/tmp`, `/run` (those mounted, with
//!    their sub-mounts) into it, and switches root the way busybox's
//!    `switch_root` does (`chdir`, `MS_MOVE` onto `/`, `chroot(".")`).
//!
//! The initramfs contents are left in memory (a few MB): deleting them
//! would need a recursive delete that must not cross into the mounts just
//! made, and would leave nothing to fall back on.
//!
//! Owns the command-line parsing, the mount plan ([`plan`], data, so it is
//! testable without privileges) and its execution with rollback
//! ([`execute`]). It must never run outside a VM's init (the namespace
//! backend and tests never call it), never make the agent exit or stop it
//! from serving: on any failure it undoes what it did, logs one line,
//! writes the reason to [`ERROR_FILE`] and the agent serves from the
//! initramfs, so the host can still reach it and report the error. It must
//! never mount a device path that is not under `/dev`, and never delete
//! anything.

use std::fmt;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// The command-line parameter naming the root device.
pub const PARAM_DEVICE: &str = "boxdesk.rootfs";
/// The command-line parameter that makes the root device writable (`1`).
pub const PARAM_RW: &str = "boxdesk.rootfs_rw";
/// Where the reason goes when the root filesystem could not be switched to
/// (in the initramfs's `/run`, which the agent then serves from).
pub const ERROR_FILE: &str = "/run/boxdesk-rootfs-error";
/// How long the device node may take to appear in devtmpfs.
pub const DEVICE_WAIT: Duration = Duration::from_secs(2);

/// Where the device is mounted (and, read-write, the new root itself).
const LOWER: &str = "/mnt/lower";
/// The tmpfs holding the overlay's upper and work directories.
const RW: &str = "/mnt/rw";
/// The overlay, the new root of a read-only rootfs.
const NEW_ROOT: &str = "/mnt/newroot";
/// The init mounts carried into the new root, in this order.
pub const MOVED: [&str; 5] = ["/dev", "/proc", "/sys", "/tmp", "/run"];
/// Directories the agent needs in the new root.
pub(crate) const ENSURED: [&str; 2] = ["/results", "/work"];

/// Why there is no new root (logged and written to [`ERROR_FILE`]).
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// `/proc/cmdline` could not be read.
    #[error("cannot read /proc/cmdline: {0}")]
    Cmdline(io::Error),
    /// `boxdesk.rootfs=` names no device under `/dev`.
    #[error("`{0}` on the kernel command line: not a device path under /dev")]
    BadDevice(String),
    /// `boxdesk.rootfs_rw=` is neither `0` nor `1`.
    #[error("`{0}` on the kernel command line: the value must be 0 or 1")]
    BadRw(String),
    /// A step of the plan failed (everything before it was undone).
    #[error("{step}: {err}")]
    Step {
        /// The failed step.
        step: Step,
        /// Why.
        err: io::Error,
    },
}

/// What the kernel command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rootfs {
    /// The block device, a path under `/dev`.
    pub device: PathBuf,
    /// `boxdesk.rootfs_rw=1`: mount read-write, no overlay.
    pub writable: bool,
}

/// The parameters of a kernel command line, split and unquoted as the
/// kernel's `next_arg` does: `(name, value)`, the value `None` for a bare
/// word.
pub(crate) fn kernel_params(cmdline: &str) -> Vec<(&str, Option<&str>)> {
    let mut out = Vec::new();
    let mut rest = cmdline;
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace());
        if rest.is_empty() {
            return out;
        }
        let quoted = rest.starts_with('"');
        let body = if quoted { &rest[1..] } else { rest };
        let mut in_quote = quoted;
        let mut end = body.len();
        for (i, b) in body.bytes().enumerate() {
            if b.is_ascii_whitespace() && !in_quote {
                end = i;
                break;
            }
            if b == b'"' {
                in_quote = !in_quote;
            }
        }
        let token = &body[..end];
        rest = &body[end..];
        // The kernel treats `=` at offset 0 as no `=` at all.
        let (name, value) = match token.find('=') {
            Some(i) if i > 0 => (&token[..i], Some(&token[i + 1..])),
            _ => (token, None),
        };
        let (name, value) = match value {
            Some(v) if v.starts_with('"') => (name, Some(strip_end(&v[1..]))),
            Some(v) if quoted => (name, Some(strip_end(v))),
            Some(v) => (name, Some(v)),
            None if quoted => (strip_end(name), None),
            None => (name, None),
        };
        out.push((name, value));
    }
}

/// `s` without one trailing `"`.
fn strip_end(s: &str) -> &str {
    s.strip_suffix('"').unwrap_or(s)
}

/// Parameter names compare like the kernel's: `-` and `_` are the same.
pub(crate) fn param_is(name: &str, want: &str) -> bool {
    name.len() == want.len()
        && name
            .bytes()
            .zip(want.bytes())
            .all(|(a, b)| a == b || (a == b'-' && b == b'_') || (a == b'_' && b == b'-'))
}

/// A device path the agent will mount: `/dev/` and then non-empty
/// components of `[A-Za-z0-9._:+@-]`, none `.` or `..`.
fn is_device_path(v: &str) -> bool {
    let Some(rest) = v.strip_prefix("/dev/") else {
        return false;
    };
    v.len() <= 255
        && rest.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:+@-".contains(&b))
        })
}

/// Reads `boxdesk.rootfs=DEV` and `boxdesk.rootfs_rw=0|1` from a kernel
/// command line (the last of each wins, as for kernel parameters).
/// `Ok(None)`: no rootfs asked for (`rootfs_rw` alone is ignored).
pub fn parse_cmdline(cmdline: &str) -> Result<Option<Rootfs>, RootfsError> {
    let mut device = None;
    let mut rw = None;
    for (name, value) in kernel_params(cmdline) {
        if param_is(name, PARAM_DEVICE) {
            device = Some((name, value));
        } else if param_is(name, PARAM_RW) {
            rw = Some((name, value));
        }
    }
    let Some((name, value)) = device else {
        return Ok(None);
    };
    let shown = |name: &str, value: Option<&str>| match value {
        Some(v) => format!("{name}={v}"),
        None => name.to_owned(),
    };
    let device = match value {
        Some(v) if is_device_path(v) => PathBuf::from(v),
        _ => return Err(RootfsError::BadDevice(shown(name, value))),
    };
    let writable = match rw {
        None | Some((_, Some("0"))) => false,
        Some((_, Some("1"))) => true,
        Some((name, value)) => return Err(RootfsError::BadRw(shown(name, value))),
    };
    Ok(Some(Rootfs { device, writable }))
}

/// One step of switching root; each mount and move is undone if a later
/// step fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Poll until the device node exists and is a block device.
    WaitForDevice(PathBuf),
    /// `mkdir -p` (an existing entry of any type is fine).
    MakeDir(PathBuf),
    /// Mount the device at `target`, trying each type in turn.
    MountDevice {
        /// The block device.
        device: PathBuf,
        /// The mount point.
        target: PathBuf,
        /// The filesystem types tried, in order.
        fstypes: &'static [&'static str],
        /// Read-write (else `MS_RDONLY`).
        writable: bool,
    },
    /// A tmpfs (mode 0755).
    MountTmpfs(PathBuf),
    /// An overlay of `lower` under `upper` (with `work`) at `target`.
    MountOverlay {
        /// `lowerdir=`.
        lower: PathBuf,
        /// `upperdir=`.
        upper: PathBuf,
        /// `workdir=`.
        work: PathBuf,
        /// The mount point.
        target: PathBuf,
    },
    /// Mount virtio-fs `tag` at `target` (`nosuid,nodev`).
    MountVirtiofs {
        /// The device's tag.
        tag: String,
        /// The mount point.
        target: PathBuf,
        /// Read-write (else `MS_RDONLY`).
        writable: bool,
        /// Through the device's DAX window (`dax=always`) where it has one;
        /// without DAX where it has none.
        dax: bool,
    },
    /// A symlink at `path` to `target`.
    Symlink {
        /// The link.
        path: PathBuf,
        /// What it points to.
        target: PathBuf,
    },
    /// `MS_MOVE` a mount (with its sub-mounts).
    MoveMount {
        /// The mount point now.
        from: PathBuf,
        /// Its new place.
        to: PathBuf,
    },
    /// `chdir(new)`, `MS_MOVE` it onto `/`, `chroot(".")`, `chdir("/")`.
    /// Always last; once the move onto `/` is done it cannot be undone.
    SwitchRoot(PathBuf),
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::WaitForDevice(d) => write!(f, "wait for {}", d.display()),
            Step::MakeDir(d) => write!(f, "mkdir {}", d.display()),
            Step::MountDevice {
                device,
                target,
                fstypes,
                writable,
            } => write!(
                f,
                "mount {} at {} as {} ({})",
                device.display(),
                target.display(),
                fstypes.join(" or "),
                if *writable { "read-write" } else { "read-only" }
            ),
            Step::MountTmpfs(t) => write!(f, "mount tmpfs at {}", t.display()),
            Step::MountVirtiofs {
                tag,
                target,
                writable,
                ..
            } => write!(
                f,
                "mount virtio-fs {tag} at {} ({})",
                target.display(),
                if *writable { "read-write" } else { "read-only" }
            ),
            Step::Symlink { path, target } => {
                write!(f, "symlink {} -> {}", path.display(), target.display())
            }
            Step::MountOverlay { target, .. } => write!(f, "mount overlay at {}", target.display()),
            Step::MoveMount { from, to } => {
                write!(f, "move mount {} to {}", from.display(), to.display())
            }
            Step::SwitchRoot(r) => write!(f, "switch root to {}", r.display()),
        }
    }
}

/// `root` + absolute `path`.
pub(crate) fn under(root: &str, path: &str) -> PathBuf {
    Path::new(root).join(path.trim_start_matches('/'))
}

/// The steps that make `rootfs` the root, moving those of [`MOVED`] that
/// are in `mounted` (mount points, checked by the caller) into it.
pub fn plan(rootfs: &Rootfs, mounted: &[&str]) -> Vec<Step> {
    let mut steps = vec![
        Step::WaitForDevice(rootfs.device.clone()),
        Step::MakeDir(LOWER.into()),
        Step::MountDevice {
            device: rootfs.device.clone(),
            target: LOWER.into(),
            // squashfs is never writable: --rootfs-rw needs ext4.
            fstypes: if rootfs.writable {
                &["ext4"]
            } else {
                &["ext4", "squashfs"]
            },
            writable: rootfs.writable,
        },
    ];
    let new_root = if rootfs.writable {
        LOWER
    } else {
        steps.extend([
            Step::MakeDir(RW.into()),
            Step::MountTmpfs(RW.into()),
            Step::MakeDir(under(RW, "upper")),
            Step::MakeDir(under(RW, "work")),
            Step::MakeDir(NEW_ROOT.into()),
            Step::MountOverlay {
                lower: LOWER.into(),
                upper: under(RW, "upper"),
                work: under(RW, "work"),
                target: NEW_ROOT.into(),
            },
        ]);
        NEW_ROOT
    };
    let moved: Vec<&str> = MOVED.into_iter().filter(|m| mounted.contains(m)).collect();
    for dir in moved.iter().chain(&ENSURED) {
        steps.push(Step::MakeDir(under(new_root, dir)));
    }
    for m in moved {
        steps.push(Step::MoveMount {
            from: m.into(),
            to: under(new_root, m),
        });
    }
    steps.push(Step::SwitchRoot(new_root.into()));
    steps
}

/// Carries out steps; the kernel ([`Kernel`]) or, in tests, a recorder.
pub trait Ops {
    /// Does one step.
    fn apply(&mut self, step: &Step) -> io::Result<()>;
    /// Undoes a step that succeeded (best effort; a no-op for most).
    fn undo(&mut self, step: &Step);
}

/// Applies the steps in order; when one fails, undoes those done, newest
/// first, and returns the failure.
pub fn execute(steps: &[Step], ops: &mut impl Ops) -> Result<(), RootfsError> {
    for (i, step) in steps.iter().enumerate() {
        if let Err(err) = ops.apply(step) {
            for done in steps[..i].iter().rev() {
                ops.undo(done);
            }
            return Err(RootfsError::Step {
                step: step.clone(),
                err,
            });
        }
    }
    Ok(())
}

/// [`Ops`] by system calls. Remembers which filesystem type mounted.
#[derive(Default)]
pub(crate) struct Kernel {
    fstype: Option<&'static str>,
}

const NONE: Option<&str> = None;

impl Ops for Kernel {
    fn apply(&mut self, step: &Step) -> io::Result<()> {
        match step {
            Step::WaitForDevice(dev) => wait_for_block_device(dev, DEVICE_WAIT),
            Step::MakeDir(dir) => match std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
            {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            },
            Step::MountDevice {
                device,
                target,
                fstypes,
                writable,
            } => {
                let mut flags = MsFlags::MS_SILENT;
                if !writable {
                    flags |= MsFlags::MS_RDONLY;
                }
                let mut why = Vec::new();
                for fstype in *fstypes {
                    match mount(Some(device), target, Some(*fstype), flags, NONE) {
                        Ok(()) => {
                            self.fstype = Some(fstype);
                            return Ok(());
                        }
                        Err(e) => why.push(format!("{fstype}: {e}")),
                    }
                }
                Err(io::Error::other(why.join(", ")))
            }
            Step::MountTmpfs(target) => Ok(mount(
                Some("tmpfs"),
                target,
                Some("tmpfs"),
                MsFlags::empty(),
                Some("mode=0755"),
            )?),
            Step::MountOverlay {
                lower,
                upper,
                work,
                target,
            } => {
                let data = format!(
                    "lowerdir={},upperdir={},workdir={}",
                    lower.display(),
                    upper.display(),
                    work.display()
                );
                Ok(mount(
                    Some("overlay"),
                    target,
                    Some("overlay"),
                    MsFlags::empty(),
                    Some(data.as_str()),
                )?)
            }
            Step::MountVirtiofs {
                tag,
                target,
                writable,
                dax,
            } => {
                let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
                if !writable {
                    flags |= MsFlags::MS_RDONLY;
                }
                let (src, fs) = (Some(tag.as_str()), Some("virtiofs"));
                match dax.then(|| mount(src, target, fs, flags, Some("dax=always"))) {
                    Some(Ok(())) => {}
                    // EINVAL: the device has no DAX window (or the kernel
                    // no FUSE_DAX): the same mount without it.
                    None | Some(Err(nix::errno::Errno::EINVAL)) => {
                        mount(src, target, fs, flags, NONE)?
                    }
                    Some(Err(e)) => return Err(e.into()),
                }
                widen_readahead(target);
                Ok(())
            }
            Step::Symlink { path, target } => std::os::unix::fs::symlink(target, path),
            Step::MoveMount { from, to } => {
                Ok(mount(Some(from), to, NONE, MsFlags::MS_MOVE, NONE)?)
            }
            Step::SwitchRoot(new_root) => {
                nix::unistd::chdir(new_root)?;
                if let Err(e) = mount(Some("."), "/", NONE, MsFlags::MS_MOVE, NONE) {
                    let _ = nix::unistd::chdir("/");
                    return Err(e.into());
                }
                // Past the move there is no way back; these do not fail
                // for root in practice.
                nix::unistd::chroot(".")?;
                nix::unistd::chdir("/")?;
                Ok(())
            }
        }
    }

    fn undo(&mut self, step: &Step) {
        let result = match step {
            Step::MountDevice { target, .. }
            | Step::MountTmpfs(target)
            | Step::MountOverlay { target, .. }
            | Step::MountVirtiofs { target, .. } => umount2(target, MntFlags::MNT_DETACH),
            Step::Symlink { path, .. } => nix::unistd::unlink(path.as_path()),
            Step::MoveMount { from, to } => mount(Some(to), from, NONE, MsFlags::MS_MOVE, NONE),
            Step::WaitForDevice(_) | Step::MakeDir(_) | Step::SwitchRoot(_) => Ok(()),
        };
        if let Err(e) = result {
            log!("rootfs: undo {step}: {e}");
        }
    }
}

/// Read-ahead of a virtio-fs mount, KiB: the 1 MiB the file server grants
/// per request (its `MAX_PAGES`). The kernel starts a FUSE mount at
/// 128 KiB, which splits a sequential read into eight times as many round
/// trips to the host.
pub const VIRTIOFS_READAHEAD_KB: u32 = 1024;

/// Sets the read-ahead of the file system mounted at `target` (its
/// backing device's `/sys/class/bdi/MAJ:MIN/read_ahead_kb`) to
/// [`VIRTIOFS_READAHEAD_KB`]. Only speed depends on it: a failure is logged.
fn widen_readahead(target: &Path) {
    let set = || -> io::Result<()> {
        let dev = std::fs::metadata(target)?.dev();
        let bdi = format!(
            "/sys/class/bdi/{}:{}/read_ahead_kb",
            nix::sys::stat::major(dev),
            nix::sys::stat::minor(dev)
        );
        std::fs::write(bdi, VIRTIOFS_READAHEAD_KB.to_string())
    };
    if let Err(e) = set() {
        log!("rootfs: read-ahead of {}: {e}", target.display());
    }
}

/// Polls for `dev` to exist as a block device, up to `limit`.
fn wait_for_block_device(dev: &Path, limit: Duration) -> io::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        match std::fs::metadata(dev) {
            Ok(m) if m.file_type().is_block_device() => return Ok(()),
            Ok(_) => return Err(io::Error::other("not a block device")),
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no such device after {} ms", limit.as_millis()),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A VM's init, once `/proc` is mounted and before listening: switches
/// root when the kernel command line asks for a rootfs. Never fails: on an
/// error everything is undone, the reason is logged and written to
/// [`ERROR_FILE`], and the agent serves from the initramfs.
pub fn switch_if_asked() {
    let asked = match std::fs::read("/proc/cmdline") {
        Ok(bytes) => parse_cmdline(&String::from_utf8_lossy(&bytes)),
        Err(e) => Err(RootfsError::Cmdline(e)),
    };
    let rootfs = match asked {
        Ok(Some(rootfs)) => rootfs,
        Ok(None) => return,
        Err(e) => return report(&e),
    };
    let mounted: Vec<&str> = MOVED
        .into_iter()
        .filter(|m| crate::init::is_mounted(m))
        .collect();
    let mut kernel = Kernel::default();
    match execute(&plan(&rootfs, &mounted), &mut kernel) {
        Ok(()) => log!(
            "rootfs: / is {} ({}, {})",
            rootfs.device.display(),
            kernel.fstype.unwrap_or("?"),
            if rootfs.writable {
                "read-write"
            } else {
                "read-only under a tmpfs overlay"
            }
        ),
        Err(e) => report(&e),
    }
}

/// Logs the failure and leaves it in [`ERROR_FILE`] for the host.
fn report(err: &RootfsError) {
    log!("rootfs: {err}; serving from the initramfs");
    let _ = std::fs::create_dir_all("/run");
    if let Err(e) = std::fs::write(ERROR_FILE, format!("{err}\n")) {
        log!("rootfs: cannot write {ERROR_FILE}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs(dev: &str, writable: bool) -> Option<Rootfs> {
        Some(Rootfs {
            device: dev.into(),
            writable,
        })
    }

    #[test]
    fn no_rootfs_parameter_means_no_rootfs() {
        for cmdline in [
            "",
            "\n",
            "console=ttyS0 reboot=k panic=-1 virtio_mmio.device=4K@0xd0000000:5\n",
            "boxdesk.rootfs_rw=1",
            "boxdesk.rootfs_rw=maybe",
            "xboxdesk.rootfs=/dev/vda boxdesk.rootfsx=/dev/vda boxdesk.rootfs.rw=1",
            "BOXDESK.ROOTFS=/dev/vda",
        ] {
            assert_eq!(parse_cmdline(cmdline).unwrap(), None, "{cmdline:?}");
        }
    }

    #[test]
    fn the_device_and_the_rw_flag_are_read() {
        let base = "console=ttyS0 reboot=k virtio_mmio.device=4K@0xd0001000:6";
        let cases = [
            (format!("{base} boxdesk.rootfs=/dev/vda\n"), false),
            (format!("boxdesk.rootfs=/dev/vda {base}"), false),
            (
                format!("{base} boxdesk.rootfs=/dev/vda boxdesk.rootfs_rw=0"),
                false,
            ),
            (
                format!("{base} boxdesk.rootfs=/dev/vda boxdesk.rootfs_rw=1\n"),
                true,
            ),
            (
                "boxdesk.rootfs_rw=1\tboxdesk.rootfs=/dev/vda".to_owned(),
                true,
            ),
            (
                "boxdesk.rootfs=/dev/vda boxdesk.rootfs-rw=1".to_owned(),
                true,
            ),
        ];
        for (cmdline, rw) in cases {
            assert_eq!(
                parse_cmdline(&cmdline).unwrap(),
                rootfs("/dev/vda", rw),
                "{cmdline:?}"
            );
        }
    }

    #[test]
    fn quotes_are_stripped_and_quoted_spaces_do_not_split() {
        for cmdline in [
            r#"boxdesk.rootfs="/dev/vda""#,
            r#""boxdesk.rootfs=/dev/vda""#,
            r#"a="x y" boxdesk.rootfs="/dev/vda" b"#,
        ] {
            assert_eq!(
                parse_cmdline(cmdline).unwrap(),
                rootfs("/dev/vda", false),
                "{cmdline:?}"
            );
        }
        // A quoted value with a space inside is one parameter, not two.
        let cmdline = r#"init_args="x boxdesk.rootfs=/dev/vdb" boxdesk.rootfs=/dev/vda"#;
        assert_eq!(parse_cmdline(cmdline).unwrap(), rootfs("/dev/vda", false));
        let cmdline = r#"boxdesk.rootfs=/dev/vda init_args="x boxdesk.rootfs_rw=1""#;
        assert_eq!(parse_cmdline(cmdline).unwrap(), rootfs("/dev/vda", false));
    }

    #[test]
    fn the_last_of_a_repeated_parameter_wins() {
        let cmdline = "boxdesk.rootfs=/dev/vdb boxdesk.rootfs_rw=1 boxdesk.rootfs=/dev/vda boxdesk.rootfs_rw=0";
        assert_eq!(parse_cmdline(cmdline).unwrap(), rootfs("/dev/vda", false));
    }

    #[test]
    fn other_device_paths_under_dev_are_accepted() {
        for dev in [
            "/dev/vdb",
            "/dev/vda1",
            "/dev/disk/by-label/root_fs.v2",
            "/dev/mapper/a-b:c+d@e",
        ] {
            let cmdline = format!("boxdesk.rootfs={dev}");
            assert_eq!(
                parse_cmdline(&cmdline).unwrap(),
                rootfs(dev, false),
                "{dev}"
            );
        }
    }

    #[test]
    fn a_device_that_is_not_a_plain_path_under_dev_is_refused() {
        for bad in [
            "boxdesk.rootfs",
            "boxdesk.rootfs=",
            r#"boxdesk.rootfs="""#,
            "boxdesk.rootfs=vda",
            "boxdesk.rootfs=dev/vda",
            "boxdesk.rootfs=/tmp/vda",
            "boxdesk.rootfs=/devx/vda",
            "boxdesk.rootfs=/dev",
            "boxdesk.rootfs=/dev/",
            "boxdesk.rootfs=/dev//vda",
            "boxdesk.rootfs=/dev/vda/",
            "boxdesk.rootfs=/dev/./vda",
            "boxdesk.rootfs=/dev/../etc/shadow",
            "boxdesk.rootfs=/dev/disk/../../root/img",
            r#"boxdesk.rootfs="/dev/v da""#,
            "boxdesk.rootfs=/dev/vda,upperdir=/x",
            "boxdesk.rootfs=/dev/vd\u{e9}",
        ] {
            match parse_cmdline(bad) {
                Err(e @ RootfsError::BadDevice(_)) => {
                    assert!(
                        e.to_string().contains("not a device path under /dev"),
                        "{e}"
                    );
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let long = format!("boxdesk.rootfs=/dev/{}", "a".repeat(300));
        assert!(matches!(
            parse_cmdline(&long),
            Err(RootfsError::BadDevice(_))
        ));
    }

    #[test]
    fn a_rw_flag_other_than_0_or_1_is_refused() {
        for bad in ["", "=", "=yes", "=true", "=2", "= 1", "=01"] {
            let cmdline = format!("boxdesk.rootfs=/dev/vda boxdesk.rootfs_rw{bad}");
            match parse_cmdline(&cmdline) {
                Err(e @ RootfsError::BadRw(_)) => {
                    assert!(e.to_string().contains("must be 0 or 1"), "{e}");
                    assert!(e.to_string().contains("boxdesk.rootfs_rw"), "{e}");
                }
                other => panic!("{cmdline:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn kernel_style_splitting() {
        assert_eq!(
            kernel_params(" a=1  b \"c=d e\" f=\"g h\" =x \"i\"\n"),
            [
                ("a", Some("1")),
                ("b", None),
                ("c", Some("d e")),
                ("f", Some("g h")),
                ("=x", None),
                ("i", None),
            ]
        );
    }

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn a_read_only_rootfs_goes_under_a_tmpfs_overlay() {
        let steps = plan(&rootfs("/dev/vda", false).unwrap(), &MOVED);
        let mut want = vec![
            Step::WaitForDevice(p("/dev/vda")),
            Step::MakeDir(p("/mnt/lower")),
            Step::MountDevice {
                device: p("/dev/vda"),
                target: p("/mnt/lower"),
                fstypes: &["ext4", "squashfs"],
                writable: false,
            },
            Step::MakeDir(p("/mnt/rw")),
            Step::MountTmpfs(p("/mnt/rw")),
            Step::MakeDir(p("/mnt/rw/upper")),
            Step::MakeDir(p("/mnt/rw/work")),
            Step::MakeDir(p("/mnt/newroot")),
            Step::MountOverlay {
                lower: p("/mnt/lower"),
                upper: p("/mnt/rw/upper"),
                work: p("/mnt/rw/work"),
                target: p("/mnt/newroot"),
            },
        ];
        for d in ["dev", "proc", "sys", "tmp", "run", "results", "work"] {
            want.push(Step::MakeDir(Path::new("/mnt/newroot").join(d)));
        }
        for d in ["dev", "proc", "sys", "tmp", "run"] {
            want.push(Step::MoveMount {
                from: Path::new("/").join(d),
                to: Path::new("/mnt/newroot").join(d),
            });
        }
        want.push(Step::SwitchRoot(p("/mnt/newroot")));
        assert_eq!(steps, want);
    }

    #[test]
    fn a_writable_rootfs_is_the_new_root_itself_and_must_be_ext4() {
        let steps = plan(
            &rootfs("/dev/vdb", true).unwrap(),
            &["/run", "/proc", "/dev"],
        );
        let mut want = vec![
            Step::WaitForDevice(p("/dev/vdb")),
            Step::MakeDir(p("/mnt/lower")),
            Step::MountDevice {
                device: p("/dev/vdb"),
                target: p("/mnt/lower"),
                fstypes: &["ext4"],
                writable: true,
            },
        ];
        // Only what is mounted moves, always in MOVED's order.
        for d in ["dev", "proc", "run", "results", "work"] {
            want.push(Step::MakeDir(Path::new("/mnt/lower").join(d)));
        }
        for d in ["dev", "proc", "run"] {
            want.push(Step::MoveMount {
                from: Path::new("/").join(d),
                to: Path::new("/mnt/lower").join(d),
            });
        }
        want.push(Step::SwitchRoot(p("/mnt/lower")));
        assert_eq!(steps, want);
    }

    #[test]
    fn steps_read_well_in_a_log_line() {
        let steps = plan(&rootfs("/dev/vda", false).unwrap(), &[]);
        assert_eq!(
            steps[2].to_string(),
            "mount /dev/vda at /mnt/lower as ext4 or squashfs (read-only)"
        );
        assert_eq!(
            steps.last().unwrap().to_string(),
            "switch root to /mnt/newroot"
        );
        let err = RootfsError::Step {
            step: steps[0].clone(),
            err: io::Error::new(io::ErrorKind::TimedOut, "no such device after 2000 ms"),
        };
        assert_eq!(
            err.to_string(),
            "wait for /dev/vda: no such device after 2000 ms"
        );
    }

    /// Records what was applied and undone; fails the step `fail_at`.
    struct Recorder {
        fail_at: Option<usize>,
        applied: Vec<Step>,
        undone: Vec<Step>,
    }

    impl Ops for Recorder {
        fn apply(&mut self, step: &Step) -> io::Result<()> {
            if self.fail_at == Some(self.applied.len()) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            self.applied.push(step.clone());
            Ok(())
        }
        fn undo(&mut self, step: &Step) {
            self.undone.push(step.clone());
        }
    }

    #[test]
    fn a_failed_step_undoes_every_earlier_step_newest_first() {
        let steps = plan(&rootfs("/dev/vda", false).unwrap(), &MOVED);
        let mut ok = Recorder {
            fail_at: None,
            applied: Vec::new(),
            undone: Vec::new(),
        };
        execute(&steps, &mut ok).unwrap();
        assert_eq!(ok.applied, steps);
        assert!(ok.undone.is_empty());

        for fail_at in 0..steps.len() {
            let mut r = Recorder {
                fail_at: Some(fail_at),
                applied: Vec::new(),
                undone: Vec::new(),
            };
            let err = execute(&steps, &mut r).unwrap_err();
            let RootfsError::Step { step, .. } = &err else {
                panic!("{err:?}");
            };
            assert_eq!(step, &steps[fail_at]);
            assert_eq!(r.applied, steps[..fail_at]);
            let mut undone = r.undone.clone();
            undone.reverse();
            assert_eq!(undone, steps[..fail_at], "fail at {fail_at}");
        }
    }

    #[test]
    fn waiting_for_a_missing_device_gives_up_and_a_non_block_device_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("vda");
        let t = Instant::now();
        let err = wait_for_block_device(&missing, Duration::from_millis(50)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_millis(50));
        std::fs::write(&missing, b"").unwrap();
        let err = wait_for_block_device(&missing, Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("not a block device"), "{err}");
    }
}
