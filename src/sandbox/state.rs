//! The per-sandbox state dir `$XDG_STATE_HOME/boxdesk/<name>/`: what backs
//! a sandbox's writable paths (`root/`, `work/`, `results/`) and its agent
//! socket (`run/`), whichever backend runs it.
//!
//! This module owns the state dir's shape and its removal. It must never
//! follow a sandbox's leftovers out of the directory when removing it.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Why a state dir cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state dir (or a directory or marker in it) could not be made.
    #[error("cannot prepare the sandbox state dir {}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The private state root failed its checks.
    #[error(transparent)]
    Root(#[from] boxdesk_platform::DirError),
}

/// The per-sandbox state dir `$XDG_STATE_HOME/boxdesk/<name>/`.
#[derive(Debug, Clone)]
pub struct StateDir {
    /// The directory itself.
    pub dir: PathBuf,
}

/// File in a state dir that marks it as `--keep`.
const KEEP_MARKER: &str = "keep";

impl StateDir {
    /// Creates (or reuses, after `--keep`) the state dir of `name` under the
    /// private boxdesk state root, with `root/`, `work/`, `results/` and
    /// `run/` inside. With `keep`, a `keep` marker says so to a `boxdesk
    /// stop` that has to kill an unanswering helper and clean up for it.
    pub fn prepare(state_root: &Path, name: &str, keep: bool) -> Result<Self, StateError> {
        boxdesk_platform::dirs::ensure_private_dir(state_root)?;
        let dir = state_root.join(name);
        let mk = |path: &Path, mode| match DirBuilder::new().mode(mode).create(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
            Err(source) => Err(StateError::Dir {
                path: path.to_owned(),
                source,
            }),
        };
        mk(&dir, 0o700)?;
        let s = StateDir { dir };
        mk(&s.root(), 0o700)?;
        mk(&s.work(), 0o755)?;
        mk(&s.results(), 0o755)?;
        mk(&s.run(), 0o700)?;
        let marker = s.dir.join(KEEP_MARKER);
        let marked = if keep {
            fs::write(&marker, b"")
        } else {
            fs::remove_file(&marker).or_else(|e| match e.kind() {
                io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
        };
        marked.map_err(|source| StateError::Dir {
            path: marker,
            source,
        })?;
        Ok(s)
    }

    /// The state dir of `name` if it exists and was not started with
    /// `--keep`: what a helper killed before its own clean-up leaves behind.
    pub fn left_behind(state_root: &Path, name: &str) -> Option<Self> {
        let dir = state_root.join(name);
        (dir.is_dir() && !dir.join(KEEP_MARKER).exists()).then_some(StateDir { dir })
    }

    /// Backs `/root`.
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    /// Backs `/work`.
    pub fn work(&self) -> PathBuf {
        self.dir.join("work")
    }
    /// Backs `/results`.
    pub fn results(&self) -> PathBuf {
        self.dir.join("results")
    }
    /// Backs `/run/boxdesk`: the agent's socket lives here.
    pub fn run(&self) -> PathBuf {
        self.dir.join("run")
    }
    /// The agent's socket as seen from the host.
    pub fn agent_sock(&self) -> PathBuf {
        self.run().join("agent.sock")
    }

    /// Removes the whole state dir, making directories the sandbox left
    /// unwritable writable first so nothing is left behind.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(_) => {
                make_writable(&self.dir);
                fs::remove_dir_all(&self.dir)
            }
        }
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}
