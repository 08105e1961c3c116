//! A sandbox's host log `<name>.log`: opening it safely, copying what the
//! sandbox prints into it under a cap, and reading its tail for errors.
//!
//! The sandbox never holds a descriptor of a host file: its stdout and
//! stderr are a pipe, and [`pump`] (a helper thread) appends what comes out
//! of it to the log. After [`LOG_CAP`] bytes the log is rotated once
//! (`<name>.log` → `<name>.log.1`, replacing an older one), so a sandbox
//! that prints without end costs the host at most twice the cap on disk.
//!
//! [`Appender`] is that capped, rotated log for any writer (cowork's copy
//! of its own log into the app's `logDir` is one).
//!
//! This module owns those rules. It must never open a log through a
//! symlink, never create one readable by others, and never let the
//! sandbox's output block on a full disk or a slow log (it drops instead).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bytes of sandbox output a log holds before it is rotated.
pub const LOG_CAP: u64 = 8 << 20;

/// Opens the log at `path` for appending: created `0600`; never through a
/// symlink; an existing one must be a regular file of ours and is
/// tightened to `0600` (older versions made some `0644`); a FIFO or other
/// special file in its place is refused at once instead of blocking.
pub fn open(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENXIO | libc::EISDIR) => io::Error::other(format!(
                "{} is not a regular file (a symlink or something else is in its place)",
                path.display()
            )),
            _ => e,
        })?;
    let meta = file.metadata()?;
    let euid = boxdesk_platform::euid();
    if meta.uid() != euid || !meta.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file of uid {euid}: refusing to write to it",
            path.display()
        )));
    }
    if meta.mode() & 0o7777 != 0o600 {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    // Appends are short; blocking mode for them.
    // SAFETY: fcntl on a descriptor we own, flags only.
    unsafe {
        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    Ok(file)
}

/// The rotated log beside `path`: `<path>.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// A log opened by [`open`] that is rotated once it holds `cap` bytes:
/// `<path>` → `<path>.1` (replacing an older one) and a fresh `<path>`, so
/// it costs at most about twice the cap on disk. Sandbox output and
/// cowork's copy of its own log for the app both append through one.
#[derive(Debug)]
pub struct Appender {
    path: PathBuf,
    file: File,
    written: u64,
    cap: u64,
}

impl Appender {
    /// Opens (or creates) the log at `path`, as [`open`] does, to be
    /// rotated every `cap` bytes; what it already holds counts.
    pub fn open(path: &Path, cap: u64) -> io::Result<Appender> {
        let file = open(path)?;
        let written = file.metadata().map_or(0, |m| m.len());
        Ok(Appender {
            path: path.to_owned(),
            file,
            written,
            cap,
        })
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rotates the log when it holds its cap; a failure leaves it as it
    /// was (and full).
    pub fn rotate_if_full(&mut self) -> io::Result<()> {
        if self.written >= self.cap {
            self.file = rotate(&self.path, &self.file)?;
            self.written = 0;
        }
        Ok(())
    }

    /// Appends `buf` whole, or nothing counts.
    pub fn write(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)?;
        self.written += buf.len() as u64;
        Ok(())
    }
}

/// Copies `output` (the sandbox's stdout and stderr) into the log at
/// `path` until end of file, rotating after every [`LOG_CAP`] bytes. When
/// this process's own stdout/stderr are that log (a detached helper), they
/// follow it into the new file at each rotation.
pub fn pump(mut output: File, path: &Path) {
    let mut log = match Appender::open(path, LOG_CAP) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(
                "cannot open {}: {e}; the sandbox's output is dropped",
                path.display()
            );
            let _ = io::copy(&mut output, &mut io::sink());
            return;
        }
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match output.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if let Err(e) = log.rotate_if_full() {
            tracing::warn!(
                "cannot rotate {}: {e}; dropping sandbox output",
                path.display()
            );
            continue;
        }
        // A failed write (disk full) drops this chunk; the sandbox never
        // waits on the host's disk.
        let _ = log.write(&buf[..n]);
    }
}

/// Renames the log to `<path>.1` and opens a new one; moves this process's
/// stdout and stderr along when they were the old log.
fn rotate(path: &Path, old: &File) -> io::Result<File> {
    std::fs::rename(path, rotated(path))?;
    let new = OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let old_id = old.metadata().map(|m| (m.dev(), m.ino()))?;
    for fd in [1, 2] {
        // Borrowed only for the look: 1 and 2 stay open.
        // SAFETY: `fd` is 1 or 2, open for this process's whole life.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let same = borrowed
            .try_clone_to_owned()
            .map(File::from)
            .and_then(|f| f.metadata())
            .is_ok_and(|m| (m.dev(), m.ino()) == old_id);
        if same {
            // SAFETY: dup2 onto 1/2 from a descriptor we own; atomic for
            // every other thread writing there.
            unsafe { libc::dup2(new.as_raw_fd(), fd) };
        }
    }
    Ok(new)
}

/// The last lines of the log, at most 2 KiB, escaped for a terminal.
pub fn tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::from("(no log)");
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(2048)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    boxdesk_channel::sanitize_error(text.trim_end()).replace("\\x0a", "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn an_existing_open_log_is_tightened_and_a_fifo_in_its_place_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.log");
        std::fs::write(&p, b"old\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let fifo = d.path().join("fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = open(&fifo).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_log_is_private_and_never_opened_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.log");
        open(&p).unwrap();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let target = d.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = d.path().join("link.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open(&link).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn endless_output_is_rotated_once_and_stays_under_twice_the_cap() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.log");
        let (r, w) = nix::unistd::pipe().unwrap();
        let path = p.clone();
        let t = std::thread::spawn(move || pump(File::from(r), &path));
        let mut w = File::from(w);
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..(3 * LOG_CAP / (1 << 20)) {
            w.write_all(&chunk).unwrap();
        }
        w.write_all(b"\nlast line\n").unwrap();
        drop(w);
        t.join().unwrap();
        let now = std::fs::metadata(&p).unwrap().len();
        let old = std::fs::metadata(rotated(&p)).unwrap().len();
        assert!(now <= LOG_CAP + (1 << 20), "{now}");
        assert!(old <= LOG_CAP + (1 << 20), "{old}");
        assert!(tail(&p).ends_with("last line"), "{}", tail(&p));
        let entries = std::fs::read_dir(d.path()).unwrap().count();
        assert_eq!(entries, 2, "only the log and one rotation");
    }

    #[test]
    fn an_appender_rotates_at_its_cap_keeping_one_older_log() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("copy.log");
        std::fs::write(&p, b"from before\n").unwrap();
        let mut a = Appender::open(&p, 32).unwrap();
        for i in 0..10 {
            a.rotate_if_full().unwrap();
            a.write(format!("line {i:02} of the log\n").as_bytes())
                .unwrap();
        }
        let now = std::fs::read_to_string(&p).unwrap();
        let old = std::fs::read_to_string(rotated(&p)).unwrap();
        assert_eq!(now, "line 08 of the log\nline 09 of the log\n");
        assert_eq!(old, "line 06 of the log\nline 07 of the log\n");
        for f in [&p, &rotated(&p)] {
            let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }
}
