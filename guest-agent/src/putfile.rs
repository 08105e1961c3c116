//! PutFile series: the chunks of one file, written to a temporary file in
//! the target's directory and renamed into place when the series ends (a
//! frame for another path, an offset-0 frame, any other frame, or EOF).
//!
//! Owns the temporary file and the offset check: a gap or overlap, a first
//! chunk not at offset 0, or a refused path is one error, the temporary
//! file is removed and later chunks of that series are dropped silently.
//! Never: write outside the root (paths go through `beneath`), write to
//! the target in place (a reader never sees half a file), follow a symlink
//! at the target (rename replaces the link itself), leave a temporary
//! file behind, or set a setuid, setgid or sticky bit (the mode is
//! `mode & 0o777`).

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::renameat;
use nix::sys::stat::{fchmod, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::spawn::errno_name;
use boxdesk_platform::beneath::{components, open_raw_mode, Beneath, PathError};

/// Why a PutFile series failed (one Error frame; the session continues).
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// The path was refused or a directory on the way could not be made.
    #[error("PutFile {path:?}: {err}")]
    Path {
        /// The requested path, for the message.
        path: String,
        /// Why.
        err: PathError,
    },
    /// A chunk's offset is not where the previous one ended.
    #[error(
        "PutFile {path:?}: EINVAL: chunk at offset {got}, expected {expected}; file discarded"
    )]
    Gap {
        /// The requested path.
        path: String,
        /// Bytes written so far.
        expected: u64,
        /// The chunk's offset.
        got: u64,
    },
    /// Writing, renaming or setting the mode failed.
    #[error("PutFile {path:?}: {}: {} ({what})", errno_name(*.errno), .errno.desc())]
    Os {
        /// The requested path.
        path: String,
        /// The step that failed.
        what: &'static str,
        /// The system error.
        errno: Errno,
    },
}

struct Writing {
    path: Vec<u8>,
    dir: OwnedFd,
    name: CString,
    tmp: CString,
    file: File,
    next: u64,
    mode: u32,
}

enum Series {
    Writing(Writing),
    /// Failed: further chunks of this path are dropped until a new series.
    Failed(Vec<u8>),
}

/// The PutFile series in progress on one session, if any.
#[derive(Default)]
pub struct Puts {
    cur: Option<Series>,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

impl Puts {
    /// True when a chunk for `path` at `offset` continues the current
    /// series; otherwise the caller ends it with [`Puts::finish`] first.
    pub fn continues(&self, path: &[u8], offset: u64) -> bool {
        let cur = match &self.cur {
            Some(Series::Writing(w)) => &w.path,
            Some(Series::Failed(p)) => p,
            None => return false,
        };
        cur == path && offset != 0
    }

    /// Takes one chunk. Call [`Puts::finish`] first unless
    /// [`Puts::continues`] said yes.
    pub fn chunk(
        &mut self,
        root: &Beneath,
        path: Vec<u8>,
        mode: u32,
        offset: u64,
        data: &[u8],
    ) -> Result<(), PutError> {
        match self.cur.take() {
            Some(Series::Failed(p)) => {
                self.cur = Some(Series::Failed(p));
                Ok(())
            }
            Some(Series::Writing(mut w)) => {
                if offset != w.next {
                    let err = PutError::Gap {
                        path: shown(&w.path),
                        expected: w.next,
                        got: offset,
                    };
                    self.cur = Some(Series::Failed(std::mem::take(&mut w.path)));
                    discard(w);
                    return Err(err);
                }
                self.write(w, data)
            }
            None if offset != 0 => {
                let err = PutError::Gap {
                    path: shown(&path),
                    expected: 0,
                    got: offset,
                };
                self.cur = Some(Series::Failed(path));
                Err(err)
            }
            None => match start(root, &path, mode) {
                Ok(w) => self.write(w, data),
                Err(err) => {
                    self.cur = Some(Series::Failed(path));
                    Err(err)
                }
            },
        }
    }

    fn write(&mut self, mut w: Writing, data: &[u8]) -> Result<(), PutError> {
        match w.file.write_all(data) {
            Ok(()) => {
                w.next += data.len() as u64;
                self.cur = Some(Series::Writing(w));
                Ok(())
            }
            Err(e) => {
                let err = os(
                    &w.path,
                    "write",
                    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
                );
                self.cur = Some(Series::Failed(std::mem::take(&mut w.path)));
                discard(w);
                Err(err)
            }
        }
    }

    /// Ends the current series: the file gets its mode and is renamed over
    /// the target.
    pub fn finish(&mut self) -> Result<(), PutError> {
        let Some(Series::Writing(w)) = self.cur.take() else {
            return Ok(());
        };
        // Permission bits only: a file put into the sandbox never becomes
        // setuid, setgid or sticky (a 0o7777 request lands as 0o777).
        let mode = Mode::from_bits_truncate(w.mode & 0o777);
        if let Err(e) = fchmod(w.file.as_raw_fd(), mode) {
            let err = os(&w.path, "chmod", e);
            discard(w);
            return Err(err);
        }
        let dir = w.dir.as_raw_fd();
        if let Err(e) = renameat(Some(dir), w.tmp.as_c_str(), Some(dir), w.name.as_c_str()) {
            let err = os(&w.path, "rename into place", e);
            discard(w);
            return Err(err);
        }
        Ok(())
    }
}

impl Drop for Puts {
    /// A session that dies mid-series (a protocol error) leaves no
    /// temporary file behind and nothing renamed.
    fn drop(&mut self) {
        if let Some(Series::Writing(w)) = self.cur.take() {
            discard(w);
        }
    }
}

fn os(path: &[u8], what: &'static str, errno: Errno) -> PutError {
    PutError::Os {
        path: shown(path),
        what,
        errno,
    }
}

fn start(root: &Beneath, path: &[u8], mode: u32) -> Result<Writing, PutError> {
    let refuse = |err| PutError::Path {
        path: shown(path),
        err,
    };
    let comps = components(path).map_err(refuse)?;
    let Some((name, parent)) = comps.split_last() else {
        return Err(refuse(PathError::IsRoot));
    };
    let dir = root.dir(parent, true).map_err(refuse)?;
    let name = CString::new(*name).map_err(|_| refuse(PathError::Nul))?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    let mut tries = 0;
    loop {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = CString::new(format!(".boxdesk-put.{}.{n}", std::process::id()))
            .map_err(|_| refuse(PathError::Nul))?;
        match open_raw_mode(Some(std::os::fd::AsFd::as_fd(&dir)), &tmp, flags, 0o600) {
            Ok(fd) => {
                return Ok(Writing {
                    path: path.to_vec(),
                    dir,
                    name,
                    tmp,
                    file: File::from(fd),
                    next: 0,
                    mode,
                })
            }
            Err(Errno::EEXIST) if tries < 8 => tries += 1,
            Err(e) => return Err(os(path, "create temporary file", e)),
        }
    }
}

/// Removes a series' temporary file.
fn discard(w: Writing) {
    let _ = unlinkat(
        Some(w.dir.as_raw_fd()),
        w.tmp.as_c_str(),
        UnlinkatFlags::NoRemoveDir,
    );
}
