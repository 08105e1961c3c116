//! The data dir's `images/` as a place to install into: one fetch at a
//! time, a temporary directory beside `images/` (so everything unpacked is
//! on the same file system and one `rename` puts it in place), and the
//! swap itself.
//!
//! This module owns the on-disk protocol. The data dir
//! (`${XDG_DATA_HOME:-~/.local/share}/boxdesk`) is created 0700 when
//! missing and must be ours and not writable by others (what is in it is
//! booted). An exclusive `flock` on it serialises fetches; under it, any
//! `.images-fetch-*` left by a fetch that was killed is removed before a
//! new one is made. The temporary directory is removed when its guard is
//! dropped, on success and on every error. An image is put in place with
//! `renameat2(RENAME_EXCHANGE)` where the kernel and file system have it
//! (Linux), so `images/<arch>` is at every instant the old image or the
//! new one; elsewhere the old one is renamed aside into the temporary
//! directory, the new one renamed in (and the old one back should that
//! fail). Either way the old image ends in the temporary directory and is
//! removed with it.

use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The prefix of a fetch's temporary directory in the data dir.
pub const TEMP_PREFIX: &str = ".images-fetch-";

/// Why the data dir cannot take an image.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// An OS call on `path` failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done ("cannot create", …).
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The data dir is not a directory.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The data dir.
        path: PathBuf,
    },
    /// Someone else owns the data dir.
    #[error("{} is owned by uid {owner}, not by you (uid {euid}); boxdesk boots what is in it", path.display())]
    WrongOwner {
        /// The data dir.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Our effective uid.
        euid: u32,
    },
    /// Others may write the data dir.
    #[error("{} has mode {mode:04o}: others may write to it, and boxdesk boots what is in it; fix it with chmod go-w {}", path.display(), path.display())]
    Writable {
        /// The data dir.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// `images/` is on another file system than the data dir.
    #[error("cannot move the image into {}: it is on another file system than {} (a link or a mount); point BOXDESK_IMAGE_DIR at the image instead", images.display(), data.display())]
    CrossDevice {
        /// `<data>/images`.
        images: PathBuf,
        /// The data dir.
        data: PathBuf,
    },
}

/// The data dir, locked for one fetch.
pub struct Store {
    data: PathBuf,
    _lock: Flock<File>,
}

impl Store {
    /// Creates (0700, when missing) and checks the data dir, then takes
    /// its lock, calling `waiting()` once if another fetch holds it.
    pub fn open(data: &Path, waiting: impl FnOnce()) -> Result<Self, InstallError> {
        let io_err = |what, path: &Path| {
            let path = path.to_owned();
            move |source| InstallError::Io { what, path, source }
        };
        if let Some(parent) = data.parent() {
            fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
        }
        match DirBuilder::new().mode(0o700).create(data) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("cannot create", data)(e)),
        }
        // A link to a directory of ours is fine (users move data dirs).
        let meta = fs::metadata(data).map_err(io_err("cannot inspect", data))?;
        check_meta(data, &meta, boxdesk_platform::euid())?;
        let dir = File::open(data).map_err(io_err("cannot open", data))?;
        let lock = match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((dir, nix::errno::Errno::EWOULDBLOCK)) => {
                waiting();
                Flock::lock(dir, FlockArg::LockExclusive)
                    .map_err(|(_, e)| io_err("cannot lock", data)(e.into()))?
            }
            Err((_, e)) => return Err(io_err("cannot lock", data)(e.into())),
        };
        Ok(Store {
            data: data.to_owned(),
            _lock: lock,
        })
    }

    /// `<data>/images`.
    pub fn images(&self) -> PathBuf {
        self.data.join("images")
    }

    /// Removes what killed fetches left (every `.images-fetch-*`: none is
    /// in use while we hold the lock); returns how many.
    pub fn sweep(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.data) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            if !e.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
                continue;
            }
            let p = e.path();
            let gone = match e.file_type() {
                Ok(t) if t.is_dir() => fs::remove_dir_all(&p),
                _ => fs::remove_file(&p),
            };
            removed += usize::from(gone.is_ok());
        }
        removed
    }

    /// A fresh temporary directory in the data dir (0700), removed when
    /// the guard is dropped.
    pub fn temp(&self) -> Result<TempDir, InstallError> {
        let path = self
            .data
            .join(format!("{TEMP_PREFIX}{}", std::process::id()));
        DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| InstallError::Io {
                what: "cannot create",
                path: path.clone(),
                source,
            })?;
        Ok(TempDir { path })
    }

    /// Puts `staged` (a directory in `tmp`) in place as `images/<name>`,
    /// replacing what is there; the old one is left in `tmp`.
    pub fn install(
        &self,
        staged: &Path,
        name: &str,
        tmp: &TempDir,
    ) -> Result<PathBuf, InstallError> {
        let images = self.images();
        match DirBuilder::new().mode(0o755).create(&images) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(InstallError::Io {
                    what: "cannot create",
                    path: images,
                    source,
                })
            }
        }
        let target = images.join(name);
        let exists = fs::symlink_metadata(&target).is_ok();
        let cross = |e: &io::Error| e.raw_os_error() == Some(libc::EXDEV);
        let fail = |source: io::Error| {
            if cross(&source) {
                InstallError::CrossDevice {
                    images: self.images(),
                    data: self.data.clone(),
                }
            } else {
                InstallError::Io {
                    what: "cannot move the image into",
                    path: target.clone(),
                    source,
                }
            }
        };
        if exists && exchange(staged, &target)? {
            sync_dir(&images);
            return Ok(target);
        }
        let aside = tmp.path().join("old");
        if exists {
            fs::rename(&target, &aside).map_err(fail)?;
        }
        if let Err(e) = fs::rename(staged, &target) {
            if exists {
                let _ = fs::rename(&aside, &target);
            }
            return Err(fail(e));
        }
        sync_dir(&images);
        Ok(target)
    }
}

/// Swaps `a` and `b` in one step; `Ok(false)` where this kernel or file
/// system cannot (the caller renames in two steps).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> Result<bool, InstallError> {
    use std::os::unix::ffi::OsStrExt;
    let io = |source: std::io::Error| InstallError::Io {
        what: "cannot swap the image into",
        path: b.to_owned(),
        source,
    };
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io(std::io::ErrorKind::InvalidInput.into()))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // The raw system call: glibc and musl alike (nix and libc wrap it for
    // glibc only, and the static release builds are musl).
    // SAFETY: two valid C strings relative to the working directory, no
    // memory is written.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EXDEV) => Ok(false),
        _ => Err(io(e)),
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> Result<bool, InstallError> {
    Ok(false)
}

/// Makes a rename in `dir` durable (best effort: losing it in a crash
/// leaves the old image or the new one, both whole).
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Ours, a directory, and not writable by group or others.
fn check_meta(path: &Path, meta: &fs::Metadata, euid: u32) -> Result<(), InstallError> {
    let path = path.to_owned();
    if !meta.is_dir() {
        return Err(InstallError::NotADirectory { path });
    }
    if meta.uid() != euid {
        return Err(InstallError::WrongOwner {
            path,
            owner: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(InstallError::Writable { path, mode });
    }
    Ok(())
}

/// A temporary directory, removed with everything in it when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn staged(tmp: &TempDir, content: &[u8]) -> PathBuf {
        let s = tmp.path().join("stage");
        fs::create_dir(&s).unwrap();
        fs::write(s.join("vmlinux"), content).unwrap();
        s
    }

    #[test]
    fn an_image_is_put_in_place_and_a_second_one_replaces_it_leaving_nothing_behind() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("share/boxdesk");
        let store = Store::open(&data, || {}).unwrap();
        assert_eq!(
            fs::metadata(&data).unwrap().permissions().mode() & 0o777,
            0o700
        );
        for content in [&b"one"[..], b"two"] {
            let tmp = store.temp().unwrap();
            let s = staged(&tmp, content);
            let target = store.install(&s, "x86_64", &tmp).unwrap();
            assert_eq!(target, data.join("images/x86_64"));
            drop(tmp);
            assert_eq!(fs::read(target.join("vmlinux")).unwrap(), content);
        }
        let names: Vec<_> = fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["images"]);
    }

    #[test]
    fn a_data_dir_others_can_write_is_refused_and_a_killed_fetchs_leftovers_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("boxdesk");
        fs::create_dir(&data).unwrap();
        fs::set_permissions(&data, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            Store::open(&data, || {}),
            Err(InstallError::Writable { .. })
        ));
        fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir_all(data.join(".images-fetch-1/stage")).unwrap();
        fs::write(data.join(".images-fetch-2"), b"").unwrap();
        let store = Store::open(&data, || {}).unwrap();
        assert_eq!(store.sweep(), 2);
        assert_eq!(fs::read_dir(&data).unwrap().count(), 0);
    }

    #[test]
    fn a_second_fetch_waits_for_the_first_ones_lock() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("boxdesk");
        let first = Store::open(&data, || {}).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = data.clone();
        let second = std::thread::spawn(move || {
            let s = Store::open(&d, || tx.send(()).unwrap()).unwrap();
            drop(s);
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the second fetch said it waits");
        drop(first);
        second.join().unwrap();
    }
}
