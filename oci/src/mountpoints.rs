//! Mount points in a container's root, made before its sandbox starts.
//!
//! A bundle's root is the image's: anything in it may be a symlink, and
//! the sandbox's bwrap resolves a mount's destination as a path. So every
//! destination in the root is resolved here first the way the container
//! itself will see it — symlinks followed but never out of the root
//! (`openat2` with `RESOLVE_IN_ROOT`, Linux 5.6) — and replaced by that
//! canonical path, which holds no symlink; a missing one is created as the
//! mount needs (directories 0755, an empty 0644 file for a bound file),
//! without following a symlink at the new name. Destinations beneath an
//! earlier mount of the sandbox's own (a tmpfs, `/dev`, `/proc`, `/sys`)
//! are left to bwrap, which makes them there.
//!
//! Made as the runtime's caller (root for rootful podman): a root the
//! sandbox cannot write to (an overlay that cannot be id-mapped) still
//! gets its mount points.
//!
//! This module owns that preparation. It must never create or open
//! anything outside the root.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Component, Path, PathBuf};

use boxdesk_sandbox::container::{Layout, Mount};
use nix::errno::Errno;

/// Why a mount point cannot be made, or the program is not there.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {why}")]
pub struct MountpointError {
    /// What is wrong (`mounts: /etc/hosts`, `process.args[0]`).
    pub field: String,
    /// Why.
    pub why: String,
}

fn err(dest: &Path, why: impl Into<String>) -> MountpointError {
    MountpointError {
        field: format!("mounts: {}", dest.display()),
        why: why.into(),
    }
}

/// Makes the mount points of `layout` in its root and rewrites their
/// destinations to the canonical paths.
pub fn prepare(layout: &mut Layout) -> Result<(), MountpointError> {
    let root = open_dir(&layout.root).map_err(|e| err(&layout.root, e.to_string()))?;
    // Destinations mounted by the sandbox itself, beneath which bwrap
    // makes the mount points.
    let mut own: Vec<PathBuf> = Vec::new();
    for m in &mut layout.mounts {
        let (dest, file) = match m {
            Mount::Bind { source, dest, .. } => {
                let file = !source.is_dir();
                (dest, file)
            }
            Mount::Proc { dest }
            | Mount::Dev { dest }
            | Mount::Mqueue { dest }
            | Mount::Sysfs { dest }
            | Mount::Tmpfs { dest, .. } => (dest, false),
        };
        if own.iter().any(|o| dest.starts_with(o)) {
            continue;
        }
        let canonical = make(&root, &layout.root, dest, file)?;
        *dest = canonical;
        if !matches!(m, Mount::Bind { .. }) {
            own.push(match m {
                Mount::Proc { dest }
                | Mount::Dev { dest }
                | Mount::Mqueue { dest }
                | Mount::Sysfs { dest }
                | Mount::Tmpfs { dest, .. }
                | Mount::Bind { dest, .. } => dest.clone(),
            });
        }
    }
    Ok(())
}

/// Resolves `dest` in the root, creating what is missing; returns its
/// canonical path inside.
fn make(
    root: &OwnedFd,
    root_path: &Path,
    dest: &Path,
    file: bool,
) -> Result<PathBuf, MountpointError> {
    let mut names: Vec<&std::ffi::OsStr> = Vec::new();
    for c in dest.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(n) => names.push(n),
            _ => return Err(err(dest, "must be absolute, without . or ..")),
        }
    }
    if names.is_empty() {
        return Err(err(dest, "the root itself cannot be a mount point"));
    }
    // Each prefix is resolved from the root (so a symlink met anywhere is
    // taken relative to the root, as the container will), and made when
    // missing, in its canonical parent.
    let mut prefix = PathBuf::new();
    let mut parent = root.try_clone().map_err(|e| err(dest, e.to_string()))?;
    for (i, name) in names.iter().enumerate() {
        prefix.push(name);
        let is_file = file && i + 1 == names.len();
        parent = step(root, &parent, &prefix, name, dest, is_file)?;
    }
    canonical(&parent, root_path).ok_or_else(|| err(dest, "resolves outside the root"))
}

/// Opens `prefix` from the root (symlinks followed within it), creating
/// its last part `name` in `parent` (a directory, or an empty file when
/// `file`) when missing.
fn step(
    root: &OwnedFd,
    parent: &OwnedFd,
    prefix: &Path,
    name: &std::ffi::OsStr,
    dest: &Path,
    file: bool,
) -> Result<OwnedFd, MountpointError> {
    let full =
        CString::new(prefix.as_os_str().as_bytes()).map_err(|_| err(dest, "NUL in the path"))?;
    match open_in_root(root, &full) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(err(dest, e.to_string())),
    }
    let c = CString::new(name.as_bytes()).map_err(|_| err(dest, "NUL in the path"))?;
    let dir = parent;
    let made = if file {
        // SAFETY: openat on a directory descriptor and a NUL-terminated
        // name we own; O_EXCL|O_NOFOLLOW never follow a symlink there.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            )
        };
        if fd >= 0 {
            // SAFETY: a new descriptor nothing else owns, closed here.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            Ok(())
        } else {
            Err(Errno::last())
        }
    } else {
        nix::sys::stat::mkdirat(
            Some(dir.as_raw_fd()),
            c.as_c_str(),
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        )
    };
    match made {
        Ok(()) => {}
        // A dangling symlink: creating through it could write anywhere.
        Err(Errno::EEXIST) => return Err(err(dest, "a dangling symlink is in the way")),
        Err(e) => return Err(err(dest, format!("cannot create: {e}"))),
    }
    open_in_root(root, &full).map_err(|e| err(dest, e.to_string()))
}

/// Refuses, as runc does at create, a program the container's root does
/// not hold: `args[0]` itself when it has a `/`, else in a `PATH` dir of
/// `env` (the agent's default `PATH` without one), each looked up in the
/// root as the container will (symlinks within it). A dir a bind mount
/// covers is not judged: its files are not in the root. The message is
/// runc's, which engines turn into exit 127.
pub fn check_program(
    layout: &Layout,
    program: &str,
    env: &[String],
) -> Result<(), MountpointError> {
    let root = open_dir(&layout.root).map_err(|e| err(&layout.root, e.to_string()))?;
    let covered = |dir: &Path| {
        layout.mounts.iter().any(|m| match m {
            Mount::Bind { dest, .. } | Mount::Tmpfs { dest, .. } => dir.starts_with(dest),
            _ => false,
        })
    };
    let found = |path: &Path| -> bool {
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        open_in_root(&root, &c).is_ok()
    };
    let missing = || MountpointError {
        field: "process.args[0]".into(),
        why: format!("exec: {program:?}: executable file not found in $PATH"),
    };
    if program.contains('/') {
        let path = Path::new("/").join(program);
        let dir = path.parent().unwrap_or(Path::new("/"));
        return if covered(dir) || found(&path) {
            Ok(())
        } else {
            Err(missing())
        };
    }
    let path_var = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(boxdesk_sandbox::running::AGENT_PATH);
    for dir in path_var.split(':').filter(|d| d.starts_with('/')) {
        if covered(Path::new(dir)) || found(&Path::new(dir).join(program)) {
            return Ok(());
        }
    }
    Err(missing())
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::File::open(path)?;
    Ok(f.into())
}

/// `openat2(dir, name, O_PATH, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`:
/// `dir` as the root of every symlink met.
fn open_in_root(dir: &OwnedFd, name: &CString) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsFd as _;
    boxdesk_platform::beneath::openat2_resolve(
        dir.as_fd(),
        name,
        libc::O_PATH | libc::O_CLOEXEC,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )
}

/// The path of `fd` inside the root at `root_path`.
fn canonical(fd: &OwnedFd, root_path: &Path) -> Option<PathBuf> {
    let host = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()?;
    let inside = host.strip_prefix(root_path).ok()?;
    Some(Path::new("/").join(inside))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn layout(root: &Path, mounts: Vec<Mount>) -> Layout {
        Layout {
            root: root.canonicalize().unwrap(),
            mounts,
            ..Layout::default()
        }
    }

    fn bind(source: &Path, dest: &str) -> Mount {
        Mount::Bind {
            source: source.to_owned(),
            dest: dest.into(),
            writable: false,
        }
    }

    #[test]
    fn missing_mount_points_are_made_as_files_or_dirs_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let file = t.path().join("hosts");
        std::fs::write(&file, b"x").unwrap();
        let mut l = layout(
            &root,
            vec![bind(&file, "/etc/hosts"), bind(t.path(), "/data/in")],
        );
        prepare(&mut l).unwrap();
        assert!(root.join("etc/hosts").is_file());
        assert!(root.join("data/in").is_dir());
        assert_eq!(
            l.mounts,
            vec![bind(&file, "/etc/hosts"), bind(t.path(), "/data/in")]
        );
    }

    #[test]
    fn symlinks_resolve_within_the_root_and_the_canonical_path_is_used() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("run")).unwrap();
        std::fs::create_dir(root.join("var")).unwrap();
        // Absolute and climbing symlinks both stay inside.
        symlink("/run", root.join("var/run")).unwrap();
        symlink("../../../../../../etc", root.join("escape")).unwrap();
        std::fs::create_dir(root.join("etc")).unwrap();
        let mut l = layout(
            &root,
            vec![
                bind(t.path(), "/var/run/secrets"),
                bind(t.path(), "/escape/boxdesk-test-x"),
            ],
        );
        prepare(&mut l).unwrap();
        assert!(root.join("run/secrets").is_dir());
        assert!(
            root.join("etc/boxdesk-test-x").is_dir(),
            "made inside the root"
        );
        assert!(!Path::new("/etc/boxdesk-test-x").exists());
        assert_eq!(
            l.mounts,
            vec![
                bind(t.path(), "/run/secrets"),
                bind(t.path(), "/etc/boxdesk-test-x")
            ]
        );
        // A link whose target is missing in the root is not created through.
        symlink("../../../../../../no-such-dir", root.join("dangling")).unwrap();
        let mut l = layout(&root, vec![bind(t.path(), "/dangling/x")]);
        assert!(prepare(&mut l)
            .unwrap_err()
            .to_string()
            .contains("dangling"));
        assert!(!Path::new("/no-such-dir").exists());
    }

    #[test]
    fn a_dangling_symlink_at_the_mount_point_is_refused_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let target = t.path().join("created-outside");
        symlink(&target, root.join("etc/hosts")).unwrap();
        let file = t.path().join("hosts");
        std::fs::write(&file, b"x").unwrap();
        let mut l = layout(&root, vec![bind(&file, "/etc/hosts")]);
        // In the root, the absolute target is `<root>/<target>`: missing,
        // so the link dangles there.
        let e = prepare(&mut l).unwrap_err();
        assert!(e.to_string().contains("dangling symlink"), "{e}");
        assert!(!target.exists());
    }

    #[test]
    fn a_program_the_root_does_not_hold_is_refused_as_runc_words_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join("bin/busybox"), b"").unwrap();
        symlink("busybox", root.join("bin/sh")).unwrap();
        let l = layout(&root, vec![bind(t.path(), "/opt/tools")]);
        let env = ["PATH=/usr/bin:/bin".to_owned()];
        check_program(&l, "sh", &env).unwrap();
        check_program(&l, "/bin/sh", &env).unwrap();
        check_program(&l, "/opt/tools/anything", &env).unwrap();
        let e = check_program(&l, "nope", &env).unwrap_err();
        assert!(
            e.to_string().contains("executable file not found in $PATH"),
            "{e}"
        );
        assert!(check_program(&l, "/usr/bin/nope", &env).is_err());
    }

    #[test]
    fn mount_points_under_the_sandboxs_own_mounts_are_left_to_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let mut l = layout(
            &root,
            vec![
                Mount::Dev {
                    dest: "/dev".into(),
                },
                Mount::Mqueue {
                    dest: "/dev/mqueue".into(),
                },
                bind(t.path(), "/dev/shm"),
            ],
        );
        prepare(&mut l).unwrap();
        assert!(root.join("dev").is_dir());
        assert!(!root.join("dev/mqueue").exists() && !root.join("dev/shm").exists());
    }
}
