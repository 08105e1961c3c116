//! Paths as one word: percent-encoding of every byte outside
//! `[A-Za-z0-9/._+@=~-]`, so a path with spaces, colons, commas or quotes
//! survives a kernel command line (the VMM → agent share contract) and a
//! comma-separated `info` value. [`decode`] is its exact inverse and
//! refuses anything [`encode`] could not have written.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"/._+@=~-".contains(&b)
}

/// `p` as one word.
pub fn encode(p: &Path) -> String {
    let mut out = String::new();
    for &b in p.as_os_str().as_bytes() {
        if plain(b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The path `s` encodes; `None` for a byte [`encode`] would have escaped,
/// or a bad or truncated `%XX`.
pub fn decode(s: &str) -> Option<PathBuf> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b if plain(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    Some(PathBuf::from(OsString::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_bytes_are_escaped_and_decoding_gives_the_path_back() {
        for p in [
            "/mnt/d",
            "/home/u/My Documents:x\"%,",
            "/a\u{e9}b",
            "/t\tn\n",
        ] {
            let e = encode(Path::new(p));
            assert!(!e.contains([' ', ':', ',', '"', '\t', '\n']), "{e}");
            assert_eq!(decode(&e).unwrap(), Path::new(p));
        }
        assert_eq!(encode(Path::new("/My Docs:1")), "/My%20Docs%3A1");
    }

    #[test]
    fn words_encode_could_not_have_written_are_refused() {
        for bad in ["/a b", "/a%2", "/a%zz", "/a:b", "%"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
