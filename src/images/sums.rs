//! The release's checksum files: `boxdesk-images-<arch>.tar.gz.sha256`
//! (one line) and `sha256.sum` (every asset), both as GNU `sha256sum`
//! writes them: `HEX  NAME` (text mode) or `HEX *NAME` (binary mode), one
//! file per line.
//!
//! This module owns reading such a file strictly. Any line that is not a
//! sum is an error, not skipped: what came back may be an HTML error page
//! served with 200, or a truncated file, and neither may pass for "no sum
//! for this name". A name listed twice with different sums is an error too.
//! `sha256sum`'s escaped lines (a leading `\`, for names holding a newline
//! or a backslash) are read with their escapes undone; the asset names
//! boxdesk looks up have neither.

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The most bytes a sums file may have (`sha256.sum` lists a few dozen
/// assets; 1 MiB is far more than any release has).
pub const MAX_SUMS_BYTES: u64 = 1 << 20;

/// Why a sums file cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SumsError {
    /// Not UTF-8: not a sums file.
    #[error("not a sha256sum file (it is not text)")]
    NotText,
    /// A line that is not `HEX  NAME`.
    #[error("not a sha256sum file: line {line} is not `SHA256  NAME`")]
    Malformed {
        /// 1-based.
        line: usize,
    },
    /// The same name with two different sums.
    #[error("{name} is listed twice, with different sums")]
    Conflict {
        /// The name.
        name: String,
    },
    /// The name looked up is not listed.
    #[error("it lists no sum for {name}")]
    Missing {
        /// The name.
        name: String,
    },
}

/// Every `(name, digest)` of `text`, in order.
pub fn parse(text: &[u8]) -> Result<Vec<(String, Digest)>, SumsError> {
    let text = std::str::from_utf8(text).map_err(|_| SumsError::NotText)?;
    let mut out: Vec<(String, Digest)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let (name, digest) = parse_line(line).ok_or(SumsError::Malformed { line: i + 1 })?;
        match out.iter().find(|(n, _)| *n == name) {
            Some((_, d)) if *d != digest => return Err(SumsError::Conflict { name }),
            Some(_) => {}
            None => out.push((name, digest)),
        }
    }
    Ok(out)
}

/// The digest `text` lists for `name`.
pub fn lookup(text: &[u8], name: &str) -> Result<Digest, SumsError> {
    parse(text)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, d)| d)
        .ok_or_else(|| SumsError::Missing {
            name: name.to_owned(),
        })
}

/// `HEX  NAME`, `HEX *NAME`, or `\HEX  ESCAPED-NAME`.
fn parse_line(line: &str) -> Option<(String, Digest)> {
    let (escaped, line) = match line.strip_prefix('\\') {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let hex = line.get(..64)?;
    let digest = from_hex(hex)?;
    let rest = line.get(64..)?;
    let name = rest
        .strip_prefix("  ")
        .or_else(|| rest.strip_prefix(" *"))?;
    if name.is_empty() {
        return None;
    }
    let name = if escaped {
        unescape(name)?
    } else {
        name.to_owned()
    };
    Some((name, digest))
}

/// `sha256sum`'s escapes: `\\` and `\n` (and `\r`, newer coreutils).
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '\\' => out.push('\\'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            _ => return None,
        }
    }
    Some(out)
}

/// 64 hex digits, either case.
pub fn from_hex(hex: &str) -> Option<Digest> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut d = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let nib = |b: u8| (b as char).to_digit(16);
        let (hi, lo) = (nib(pair[0])?, nib(pair[1])?);
        // Two hex digits: at most 0xff.
        d[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(d)
}

/// Lower-case hex, as `sha256sum` prints it.
pub fn to_hex(d: &Digest) -> String {
    use std::fmt::Write as _;
    d.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const B: &str = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

    #[test]
    fn text_and_binary_mode_lines_are_read_and_crlf_and_blank_lines_are_allowed() {
        let text = format!("{A}  boxdesk-images-x86_64.tar.gz\r\n\n{B} *sha256.sum\n");
        let sums = parse(text.as_bytes()).unwrap();
        assert_eq!(sums.len(), 2);
        assert_eq!(sums[0].0, "boxdesk-images-x86_64.tar.gz");
        assert_eq!(to_hex(&sums[0].1), A);
        assert_eq!(sums[1].0, "sha256.sum");
        assert_eq!(
            lookup(text.as_bytes(), "sha256.sum").unwrap(),
            from_hex(B).unwrap()
        );
    }

    #[test]
    fn upper_case_hex_is_the_same_digest() {
        let text = format!("{}  x\n", A.to_uppercase());
        assert_eq!(lookup(text.as_bytes(), "x").unwrap(), from_hex(A).unwrap());
    }

    #[test]
    fn anything_that_is_not_a_sum_line_makes_the_whole_file_unusable() {
        for bad in [
            "<html><body>Not Found</body></html>".to_owned(),
            format!("{A} one-space-only\n"),
            format!("{}  short\n", &A[..63]),
            format!("{}g  nothex\n", &A[..63]),
            format!("{A}  \n"),
            format!("{A}  ok\ngarbage\n"),
        ] {
            assert!(
                matches!(parse(bad.as_bytes()), Err(SumsError::Malformed { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(parse(&[0xff, 0xfe]), Err(SumsError::NotText));
    }

    #[test]
    fn a_name_listed_twice_with_different_sums_is_refused_and_a_missing_one_said() {
        let text = format!("{A}  x\n{B}  x\n");
        assert_eq!(
            parse(text.as_bytes()),
            Err(SumsError::Conflict { name: "x".into() })
        );
        let same = format!("{A}  x\n{A}  x\n");
        assert_eq!(parse(same.as_bytes()).unwrap().len(), 1);
        assert_eq!(
            lookup(same.as_bytes(), "y"),
            Err(SumsError::Missing { name: "y".into() })
        );
    }

    #[test]
    fn escaped_lines_have_their_escapes_undone() {
        let text = format!("\\{A}  a\\nb\\\\c\n");
        assert_eq!(parse(text.as_bytes()).unwrap()[0].0, "a\nb\\c");
        let bad = format!("\\{A}  a\\qb\n");
        assert!(parse(bad.as_bytes()).is_err());
    }

    /// A name as `sha256sum` writes it: escaped (with a leading `\` on the
    /// line) when it holds a newline or a backslash.
    fn line(name: &str, d: &Digest, binary: bool) -> String {
        let mode = if binary { '*' } else { ' ' };
        if name.contains(['\n', '\\', '\r']) {
            let esc = name
                .replace('\\', "\\\\")
                .replace('\n', "\\n")
                .replace('\r', "\\r");
            format!("\\{} {mode}{esc}\n", to_hex(d))
        } else {
            format!("{} {mode}{name}\n", to_hex(d))
        }
    }

    proptest! {
        #[test]
        fn whatever_sha256sum_writes_reads_back(
            entries in proptest::collection::btree_map(
                "[^\u{0}]{1,40}".prop_filter("no blank names", |n| !n.trim().is_empty() && !n.starts_with(char::is_whitespace)),
                any::<[u8; 32]>(),
                0..8,
            ),
            binary in any::<bool>(),
        ) {
            let text: String = entries.iter().map(|(n, d)| line(n, d, binary)).collect();
            let parsed = parse(text.as_bytes()).unwrap();
            prop_assert_eq!(parsed.len(), entries.len());
            for (name, d) in &entries {
                prop_assert_eq!(&lookup(text.as_bytes(), name).unwrap(), d);
            }
        }

        #[test]
        fn any_bytes_are_read_or_refused_without_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse(&bytes);
        }

        #[test]
        fn a_sum_line_with_any_one_byte_changed_in_its_hex_never_reads_as_the_same_digest(
            d in any::<[u8; 32]>(), at in 0usize..64, by in any::<u8>(),
        ) {
            let good = line("f", &d, false);
            let mut bytes = good.into_bytes();
            if !bytes[at].eq_ignore_ascii_case(&by) {
                bytes[at] = by;
                if let Ok(v) = parse(&bytes) {
                    prop_assert!(v.iter().all(|(_, got)| *got != d));
                }
            }
        }
    }
}
