//! Downloading one URL to a file, with the system's `curl`.
//!
//! Why curl and not an HTTP client in process: boxdesk has none (nothing
//! else in it speaks HTTP), and the release binaries are static (musl,
//! and glibc static-pie), built for x86_64 and aarch64. An in-process
//! HTTPS client means a TLS stack: rustls with its crypto provider (ring or
//! aws-lc-rs, C and assembly to cross-compile for every target, plus a
//! root-certificate bundle to keep current) or OpenSSL (which does not link
//! statically without a vendored build). curl is on practically every
//! machine that would run a VM, uses the system's certificate store and
//! proxy settings (`https_proxy`, `no_proxy`), and speaks HTTP/2 and
//! whatever GitHub's release CDN asks for next. The cost is a clear error
//! where it is missing, which says what to install or how to download by
//! hand. Integrity does not rest on the transport anyway: the caller checks
//! the archive's sha256 before unpacking anything.
//!
//! This module owns running curl: `-q` (no `~/.curlrc`), `--fail` (an HTTP
//! error is an error, with its status from `--write-out`), `--proto`
//! `=https,http` and, once started on https, redirects to https only;
//! `--max-filesize` and a watch on the file's size while it grows (curl
//! checks only the announced length), connect and stall timeouts. Progress
//! comes from polling the output file's size against the `Content-Length`
//! of the last response in the header dump (`-D`), which curl writes and
//! flushes as the headers arrive; the caller draws it.

use std::fs::{self, File};
use std::io::{self, Read as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How often the file's size is looked at.
const POLL: Duration = Duration::from_millis(100);

/// The most bytes of curl's stderr or header dump read back.
const MAX_TEXT: u64 = 64 << 10;

/// Why a download failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// No curl on `$PATH`.
    #[error("curl is not installed (boxdesk downloads with it): install curl, or download {url} by hand (docs/INSTALL.md)")]
    NoCurl {
        /// The URL.
        url: String,
    },
    /// curl could not be started for another reason.
    #[error("cannot run curl")]
    Spawn(#[source] io::Error),
    /// HTTP 404.
    #[error("{url}: not found (HTTP 404)")]
    NotFound {
        /// The URL.
        url: String,
    },
    /// Another HTTP error status.
    #[error("{url}: HTTP {status}")]
    Http {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
    },
    /// curl failed on its own (connection, TLS, a cut transfer…).
    #[error("{url}: {message}")]
    Curl {
        /// The URL.
        url: String,
        /// What curl said (or its exit status).
        message: String,
    },
    /// More bytes than allowed.
    #[error("{url}: larger than {max} bytes; refused")]
    TooLarge {
        /// The URL.
        url: String,
        /// The cap.
        max: u64,
    },
    /// Waiting for curl or reading its output failed.
    #[error("downloading {url}")]
    Io {
        /// The URL.
        url: String,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

/// One download.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `http://` or `https://`.
    pub url: &'a str,
    /// The file to write (created or truncated).
    pub dest: &'a Path,
    /// The most bytes accepted.
    pub max_bytes: u64,
    /// Where curl may write its header dump (a file beside `dest`).
    pub headers: &'a Path,
}

/// Downloads `req.url` to `req.dest`, calling `progress(bytes so far,
/// total when known)` about every 100 ms and once at the end; returns the
/// file's size.
pub fn download(
    req: &Request<'_>,
    progress: &mut dyn FnMut(u64, Option<u64>),
) -> Result<u64, DownloadError> {
    let url = req.url.to_owned();
    let io_err = |source| DownloadError::Io {
        url: url.clone(),
        source,
    };
    let redirects = if req.url.starts_with("https://") {
        "=https"
    } else {
        "=https,http"
    };
    let mut child = Command::new("curl")
        .arg("-q")
        .args(["--fail", "--location", "--silent", "--show-error"])
        .args(["--proto", "=https,http", "--proto-redir", redirects])
        .args(["--max-redirs", "10", "--connect-timeout", "30"])
        // A transfer slower than 1 KiB/s for a minute has stalled.
        .args(["--speed-limit", "1024", "--speed-time", "60"])
        .arg("--max-filesize")
        .arg(req.max_bytes.to_string())
        .arg("--dump-header")
        .arg(req.headers)
        .arg("--output")
        .arg(req.dest)
        .args(["--write-out", "%{http_code}"])
        .arg("--url")
        .arg(req.url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => DownloadError::NoCurl { url: url.clone() },
            _ => DownloadError::Spawn(e),
        })?;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(io_err)? {
            break status;
        }
        let size = file_size(req.dest);
        if size > req.max_bytes {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DownloadError::TooLarge {
                url,
                max: req.max_bytes,
            });
        }
        progress(size, content_length(req.headers));
        std::thread::sleep(POLL);
    };
    let stdout = read_capped(child.stdout.take());
    let stderr = read_capped(child.stderr.take());
    let http: u16 = stdout.trim().parse().unwrap_or(0);
    if !status.success() {
        return Err(match (status.code(), http) {
            (_, 404) => DownloadError::NotFound { url },
            (_, s @ 400..) => DownloadError::Http { url, status: s },
            (Some(63), _) => DownloadError::TooLarge {
                url,
                max: req.max_bytes,
            },
            (code, _) => DownloadError::Curl {
                url,
                message: curl_message(&stderr, code),
            },
        });
    }
    let size = fs::metadata(req.dest).map_err(io_err)?.len();
    if size > req.max_bytes {
        return Err(DownloadError::TooLarge {
            url,
            max: req.max_bytes,
        });
    }
    progress(size, Some(size));
    Ok(size)
}

/// curl's own words, without its `curl: ` prefix.
fn curl_message(stderr: &str, code: Option<i32>) -> String {
    let line = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().trim_start_matches("curl: ").to_owned());
    match (line, code) {
        (Some(l), _) => l,
        (None, Some(c)) => format!("curl failed (exit status {c})"),
        (None, None) => "curl was killed by a signal".to_owned(),
    }
}

fn file_size(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// At most [`MAX_TEXT`] bytes of a pipe, lossily as text.
fn read_capped(pipe: Option<impl io::Read>) -> String {
    let mut bytes = Vec::new();
    if let Some(p) = pipe {
        let _ = p.take(MAX_TEXT).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The `Content-Length` of the last response in curl's header dump, when
/// that response is a 2xx.
fn content_length(headers: &Path) -> Option<u64> {
    let mut bytes = Vec::new();
    File::open(headers)
        .ok()?
        .take(MAX_TEXT)
        .read_to_end(&mut bytes)
        .ok()?;
    parse_content_length(&String::from_utf8_lossy(&bytes))
}

/// See [`content_length`]: the dump holds every response of a redirect
/// chain, each starting with its `HTTP/` status line.
fn parse_content_length(dump: &str) -> Option<u64> {
    let mut ok = false;
    let mut len = None;
    for line in dump.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(rest) = line.strip_prefix("HTTP/") {
            let status = rest.split_whitespace().nth(1).unwrap_or("");
            ok = status.len() == 3 && status.starts_with('2');
            len = None;
        } else if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok();
            }
        }
    }
    len.filter(|_| ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_is_the_last_responses_after_redirects_and_only_for_a_success() {
        let dump = "HTTP/1.1 302 Found\r\nLocation: https://x/\r\nContent-Length: 5\r\n\r\n\
                    HTTP/2 200\r\ncontent-length: 1234\r\n\r\n";
        assert_eq!(parse_content_length(dump), Some(1234));
        assert_eq!(
            parse_content_length("HTTP/1.1 200 OK\r\nContent-Type: x\r\n\r\n"),
            None
        );
        assert_eq!(
            parse_content_length("HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\n"),
            None
        );
        assert_eq!(parse_content_length(""), None);
        // Still arriving: the redirect's length is not the file's.
        assert_eq!(
            parse_content_length(
                "HTTP/1.1 302 Found\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\n"
            ),
            None
        );
    }

    #[test]
    fn curls_last_words_are_kept_without_its_prefix() {
        assert_eq!(
            curl_message("curl: (7) Failed to connect\n", Some(7)),
            "(7) Failed to connect"
        );
        assert_eq!(curl_message("", Some(6)), "curl failed (exit status 6)");
    }
}
