//! Removing a state dir without holding its name: `stop` moves the dir
//! into `<state root>/.trash/` (one `rename`, however deep the tree the
//! sandbox left), releases the name at once, and only then removes the
//! tree, with nothing racing it.
//!
//! Each moved tree is `flock`ed by the process removing it. A tree whose
//! remover died (killed mid-removal) is unlocked, so [`sweep`] knows it is
//! nobody's and finishes it; one still locked is left to its remover. This
//! module must never remove a tree another process holds, and never remove
//! anything but entries of `.trash` (through [`crate::state::remove_tree`]:
//! no symlink followed, no mount point crossed).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};

use crate::state::remove_tree;

/// The trash dir's name in the state root (never a valid sandbox name).
pub const TRASH: &str = ".trash";

/// A state dir moved into the trash, locked until [`Trashed::remove`]
/// has removed it (or this process has died).
#[derive(Debug)]
pub struct Trashed {
    path: PathBuf,
    _lock: Flock<File>,
}

impl Trashed {
    /// Where the tree now is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the tree, then unlocks it.
    pub fn remove(self) -> io::Result<()> {
        remove_tree(&self.path)
    }
}

/// Moves `dir` (a state dir, a child of the state root) into the state
/// root's trash under a name of its own, locked. Fails, leaving `dir` where
/// it is, where it cannot be moved (a mount point, another file system).
pub fn move_to_trash(dir: &Path) -> io::Result<Trashed> {
    let (Some(root), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a state dir has a parent",
        ));
    };
    let trash = root.join(TRASH);
    match DirBuilder::new().mode(0o700).create(&trash) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    if !fs::symlink_metadata(&trash)?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            trash.display()
        )));
    }
    let lock = lock_dir(dir, FlockArg::LockExclusiveNonblock)?;
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut moved = name.to_owned();
    moved.push(format!(
        ".{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let path = trash.join(moved);
    fs::rename(dir, &path)?;
    Ok(Trashed { path, _lock: lock })
}

/// Removes the trees in `state_root`'s trash that nobody is removing
/// (their remover died); returns how many. Trees still locked are left.
pub fn sweep(state_root: &Path) -> usize {
    let Ok(entries) = fs::read_dir(state_root.join(TRASH)) else {
        return 0;
    };
    let mut swept = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(lock) = lock_dir(&path, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        match remove_tree(&path) {
            Ok(()) => swept += 1,
            Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
        }
        drop(lock);
    }
    swept
}

/// Opens the directory `dir` itself (never through a symlink) and locks
/// it.
fn lock_dir(dir: &Path, how: FlockArg) -> io::Result<Flock<File>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)?;
    Flock::lock(file, how).map_err(|(_, e)| e.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deep(dir: &Path, levels: usize) {
        let mut p = dir.to_owned();
        for _ in 0..levels {
            p.push("d");
        }
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("f"), "x").unwrap();
    }

    #[test]
    fn a_moved_tree_leaves_its_name_free_at_once_and_is_removed_after() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("sb");
        deep(&dir, 50);
        let trashed = move_to_trash(&dir).unwrap();
        assert!(!dir.exists(), "the name must be free before the removal");
        assert!(trashed.path().starts_with(root.path().join(TRASH)));
        fs::create_dir(&dir).unwrap();
        trashed.remove().unwrap();
        assert_eq!(fs::read_dir(root.path().join(TRASH)).unwrap().count(), 0);
        assert!(dir.exists(), "a new dir of the same name is not touched");
    }

    #[test]
    fn a_sweep_leaves_a_tree_being_removed_and_finishes_one_whose_remover_is_gone() {
        let root = tempfile::tempdir().unwrap();
        for name in ["held", "orphan"] {
            deep(&root.path().join(name), 20);
        }
        let held = move_to_trash(&root.path().join("held")).unwrap();
        let orphan = move_to_trash(&root.path().join("orphan")).unwrap();
        let orphan_path = orphan.path().to_owned();
        // A remover that died: its lock went with it, its tree stayed.
        drop(orphan);
        assert_eq!(sweep(root.path()), 1);
        assert!(!orphan_path.exists());
        assert!(held.path().exists(), "a locked tree is its remover's");
        held.remove().unwrap();
    }
}
