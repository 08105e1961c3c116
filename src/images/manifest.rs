//! An image's `manifest`: the `key=value` lines `images/build.sh` writes
//! beside the kernel and initramfs (`arch`, `kernel_version`,
//! `<file>_sha256` of each kernel file, `initramfs_sha256`, …), plus the
//! `boxdesk_version` line `dist/images.sh` adds when it packs a release's
//! archive (an image built from source has none).
//!
//! This module owns reading it: small, UTF-8, every non-blank line a
//! `key=value` with a plain key, each key once.

/// The most bytes a manifest may have (a real one is under 1 KiB).
pub const MAX_MANIFEST_BYTES: u64 = 64 << 10;

/// Why a manifest cannot be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not UTF-8.
    #[error("the manifest is not text")]
    NotText,
    /// Larger than [`MAX_MANIFEST_BYTES`].
    #[error("the manifest is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
    /// A line that is not `key=value`.
    #[error("manifest line {line} is not `key=value`")]
    Malformed {
        /// 1-based.
        line: usize,
    },
    /// A key given twice.
    #[error("the manifest gives {key} twice")]
    Repeated {
        /// The key.
        key: String,
    },
}

/// A parsed manifest, its lines in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    entries: Vec<(String, String)>,
}

impl Manifest {
    /// Parses a manifest's bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, ManifestError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge);
        }
        let text = std::str::from_utf8(bytes).map_err(|_| ManifestError::NotText)?;
        let mut entries: Vec<(String, String)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let bad = || ManifestError::Malformed { line: i + 1 };
            let (key, value) = line.split_once('=').ok_or_else(bad)?;
            let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-';
            if key.is_empty() || !key.chars().all(plain) {
                return Err(bad());
            }
            if entries.iter().any(|(k, _)| k == key) {
                return Err(ManifestError::Repeated {
                    key: key.to_owned(),
                });
            }
            entries.push((key.to_owned(), value.to_owned()));
        }
        Ok(Manifest { entries })
    }

    /// Reads and parses the manifest at `path`, refusing one larger than
    /// [`MAX_MANIFEST_BYTES`] before reading it.
    pub fn read(path: &std::path::Path) -> std::io::Result<Result<Self, ManifestError>> {
        use std::io::Read as _;
        let f = std::fs::File::open(path)?;
        let mut bytes = Vec::new();
        f.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut bytes)?;
        Ok(Self::parse(&bytes))
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `arch=`.
    pub fn arch(&self) -> Option<&str> {
        self.get("arch")
    }

    /// `boxdesk_version=`: the boxdesk release the image was packed for.
    pub fn boxdesk_version(&self) -> Option<&str> {
        self.get("boxdesk_version")
    }

    /// The key holding `file`'s sha256 (`initramfs.cpio.gz` is
    /// `initramfs_sha256`; a kernel file `NAME` is `NAME_sha256`).
    pub fn sum_key(file: &str) -> String {
        match file {
            "initramfs.cpio.gz" => "initramfs_sha256".to_owned(),
            f => format!("{f}_sha256"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_images_build_sh_writes_is_read() {
        let text =
            "arch=x86_64\nkernel_version=6.1.0\nlinux_source_package=linux-source-6.1=6.1.1\n\
                    vmlinux_sha256=ab\nbzImage_sha256=cd\ninitramfs_sha256=ef\n\
                    build_date=2024-01-01T00:00:00Z\nboxdesk_version=0.1.0\n";
        let m = Manifest::parse(text.as_bytes()).unwrap();
        assert_eq!(m.arch(), Some("x86_64"));
        assert_eq!(m.boxdesk_version(), Some("0.1.0"));
        assert_eq!(
            m.get("linux_source_package"),
            Some("linux-source-6.1=6.1.1")
        );
        assert_eq!(m.get(&Manifest::sum_key("vmlinux")), Some("ab"));
        assert_eq!(m.get(&Manifest::sum_key("initramfs.cpio.gz")), Some("ef"));
    }

    #[test]
    fn lines_that_are_not_key_value_repeated_keys_and_big_or_binary_files_are_refused() {
        assert_eq!(
            Manifest::parse(b"arch=x86_64\nno equals\n"),
            Err(ManifestError::Malformed { line: 2 })
        );
        assert_eq!(
            Manifest::parse(b"=x\n"),
            Err(ManifestError::Malformed { line: 1 })
        );
        assert_eq!(
            Manifest::parse(b"a b=x\n"),
            Err(ManifestError::Malformed { line: 1 })
        );
        assert_eq!(
            Manifest::parse(b"arch=x86_64\narch=aarch64\n"),
            Err(ManifestError::Repeated { key: "arch".into() })
        );
        assert_eq!(Manifest::parse(&[0xff]), Err(ManifestError::NotText));
        let big = vec![b'a'; MAX_MANIFEST_BYTES as usize + 1];
        assert_eq!(Manifest::parse(&big), Err(ManifestError::TooLarge));
    }
}
