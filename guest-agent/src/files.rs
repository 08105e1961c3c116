//! Files going back to the host as File frames: the answer to a GetFile,
//! and after every exec the regular files under the results directory.
//!
//! Owns chunking ([`FILE_CHUNK`] bytes of data per frame, offsets from 0,
//! an empty file as one frame with no data) and the results walk: sorted,
//! recursive, through directory descriptors so no symlink is followed;
//! symlinks, FIFOs, sockets and devices are skipped with an Error naming
//! them. It must never modify or clear the results directory and never
//! open anything that is not a regular file.

use std::ffi::{CStr, CString};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use boxdesk_channel::Frame;
use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode};

use crate::conn::{Conn, ConnError};
use boxdesk_platform::beneath::{components, kind, open_raw, open_regular, Beneath, Regular};

/// Data bytes per File frame: well under `MAX_PAYLOAD` with room for the
/// path and the fixed fields.
pub const FILE_CHUNK: usize = 512 * 1024;
/// Directories deeper than this under the results dir are skipped.
const MAX_DEPTH: usize = 64;

/// Why a file could not be sent (the session continues after its Error).
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The file shrank while it was read.
    #[error("EIO: {0:?} shrank while it was read")]
    Shrank(String),
    /// Reading failed.
    #[error("EIO: reading {0:?}: {1}")]
    Read(String, std::io::Error),
}

/// Answers a GetFile: File frames for the regular file `path` names
/// beneath the root, or one Error. Only a failing socket is an error here.
pub fn get_file(conn: &mut Conn, root: &Beneath, path: &[u8]) -> Result<(), ConnError> {
    let opened = components(path).and_then(|comps| root.regular(&comps));
    match opened {
        Ok(regular) => send_file(conn, path, regular),
        Err(e) => conn.send_blocking(&Frame::error(format!(
            "GetFile {:?}: {e}",
            String::from_utf8_lossy(path)
        ))),
    }
}

/// Sends one opened file as File frames carrying `name`.
fn send_file(conn: &mut Conn, name: &[u8], mut r: Regular) -> Result<(), ConnError> {
    let shown = || String::from_utf8_lossy(name).into_owned();
    let mut offset = 0u64;
    let mut buf = vec![0u8; FILE_CHUNK.min(r.size as usize).max(1)];
    loop {
        let want = (r.size - offset).min(buf.len() as u64) as usize;
        let n = match read_full(&mut r.file, &mut buf[..want]) {
            Ok(n) => n,
            Err(e) => {
                return conn.send_blocking(&Frame::error(FilesError::Read(shown(), e).to_string()))
            }
        };
        if n < want {
            return conn.send_blocking(&Frame::error(FilesError::Shrank(shown()).to_string()));
        }
        conn.send_blocking(&Frame::File {
            path: name.to_vec(),
            mode: r.mode,
            offset,
            total_size: r.size,
            data: buf[..n].to_vec(),
        })?;
        offset += n as u64;
        if offset >= r.size {
            return Ok(());
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Sends every regular file under `results` (paths relative to it, joined
/// with `/`). A missing results directory sends nothing.
pub fn send_results(conn: &mut Conn, results: &Path) -> Result<(), ConnError> {
    let Ok(c) = CString::new(results.as_os_str().as_bytes()) else {
        return Ok(());
    };
    let Ok(dir) = open_raw(None, &c, libc::O_RDONLY | libc::O_DIRECTORY) else {
        return Ok(());
    };
    walk(conn, dir, &mut Vec::new(), 0)
}

fn walk(
    conn: &mut Conn,
    dirfd: OwnedFd,
    prefix: &mut Vec<u8>,
    depth: usize,
) -> Result<(), ConnError> {
    let names = match list(&dirfd) {
        Ok(names) => names,
        Err(e) => return skip(conn, prefix, &format!("cannot list: {e}")),
    };
    for name in names {
        let len = prefix.len();
        if !prefix.is_empty() {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(name.to_bytes());
        let r = entry(conn, dirfd.as_fd(), &name, prefix, depth);
        prefix.truncate(len);
        r?;
    }
    Ok(())
}

fn entry(
    conn: &mut Conn,
    dir: BorrowedFd<'_>,
    name: &CStr,
    rel: &mut Vec<u8>,
    depth: usize,
) -> Result<(), ConnError> {
    let st = match fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return skip(conn, rel, &e.desc().to_lowercase()),
    };
    match kind(&st) {
        "directory" if depth + 1 >= MAX_DEPTH => skip(conn, rel, "too deep"),
        "directory" => {
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            match open_raw(Some(dir), name, flags) {
                Ok(sub) => walk(conn, sub, rel, depth + 1),
                Err(e) => skip(conn, rel, &e.desc().to_lowercase()),
            }
        }
        "regular file" => {
            let opened = open_regular(dir, name, |d, n, f| {
                open_raw(Some(d), n, f | libc::O_NOFOLLOW)
            });
            match opened {
                Ok(regular) => send_file(conn, rel, regular),
                Err(e) => skip(conn, rel, &e.to_string()),
            }
        }
        other => skip(conn, rel, &format!("{other}, not a regular file")),
    }
}

/// The entry names of a directory, sorted, without `.` and `..`.
fn list(dir: &OwnedFd) -> nix::Result<Vec<CString>> {
    let mut d = Dir::openat(
        Some(dir.as_raw_fd()),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for e in d.iter() {
        let e = e?;
        let n = e.file_name();
        if n.to_bytes() != b"." && n.to_bytes() != b".." {
            names.push(n.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// One Error naming a results entry that is not sent; the session goes on.
fn skip(conn: &mut Conn, rel: &[u8], why: &str) -> Result<(), ConnError> {
    let shown = String::from_utf8_lossy(rel);
    conn.send_blocking(&Frame::error(format!("results: skipped {shown:?}: {why}")))
}
