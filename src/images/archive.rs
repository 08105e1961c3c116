//! Unpacking an image archive (`boxdesk-images-<arch>.tar.gz`, as
//! `dist/images.sh` packs it: `<arch>/{vmlinux|Image, initramfs.cpio.gz,
//! manifest}`) into a fresh directory, checking every entry before a byte
//! of it is written.
//!
//! This module owns what an archive may hold. Only regular files named
//! `<arch>/<one of the image's file names>` are unpacked, each once, and
//! an optional `<arch>/` directory entry is allowed; anything else — an
//! absolute path, `..`, `.`, another directory, a link (symbolic or hard),
//! a device, a FIFO, a GNU long name, an unknown file — refuses the whole
//! archive. Sizes are checked against [`Limits`] from the entry's header
//! before it is written, and the decompressed stream as a whole is capped,
//! so a gzip bomb ends in an error, not a full disk. pax headers (GNU tar's
//! `posix` format writes them for times) are read, at most 64 KiB, and
//! refused when they would change an entry's name, link or size. Files are
//! written with `O_EXCL`, mode 0644, whatever the archive says. The whole
//! gzip stream is read to its end, so its CRC is checked too.
//!
//! After the last entry the image must be whole: a kernel, the initramfs
//! and the manifest, the manifest saying this arch, and this boxdesk's
//! version where it names one, and listing the sha256 of every unpacked
//! file, which must match. The caller unpacks into a temporary directory
//! and removes it on any error; nothing here is installed.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use super::manifest::{Manifest, ManifestError, MAX_MANIFEST_BYTES};
use super::sums::{self, Digest};
use super::Arch;

/// Size caps of one archive.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes one file may have.
    pub max_file: u64,
    /// The most bytes all files together may have.
    pub max_total: u64,
}

/// A release image's caps: a kernel is tens of MiB, an initramfs a few.
pub const LIMITS: Limits = Limits {
    max_file: 512 << 20,
    max_total: 1 << 30,
};

/// The most bytes a pax header may have.
const MAX_PAX_BYTES: u64 = 64 << 10;

/// Decompressed bytes allowed beyond the files' own: headers, padding and
/// the end-of-archive records (GNU tar pads to 10 KiB records).
const STREAM_OVERHEAD: u64 = 4 << 20;

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// gzip or tar could not be read: truncated, corrupt, not a .tar.gz.
    #[error("the archive is truncated or corrupt (not a readable .tar.gz)")]
    Read(#[source] io::Error),
    /// The decompressed stream is larger than the files could be.
    #[error("the archive unpacks to more than {max} bytes")]
    Bomb {
        /// The cap.
        max: u64,
    },
    /// Unpacking failed on our side.
    #[error("cannot write {}", path.display())]
    Write {
        /// What was being written.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// An absolute path, `..`, `.`, an empty component, or a directory
    /// other than `<arch>/`.
    #[error(
        "entry {path:?} is not {arch}/NAME; absolute paths, `..` and other directories are refused"
    )]
    BadPath {
        /// The entry's name, lossily.
        path: String,
        /// The arch wanted.
        arch: &'static str,
    },
    /// Not a regular file.
    #[error("entry {path:?} is a {kind}; only regular files are unpacked")]
    NotRegular {
        /// The entry's name, lossily.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// A name no image has.
    #[error("entry {path:?} is not one of an {arch} image's files ({})", .expected.join(", "))]
    Unexpected {
        /// The entry's name.
        path: String,
        /// The arch wanted.
        arch: &'static str,
        /// The names an image of it may have.
        expected: Vec<&'static str>,
    },
    /// The archive holds another arch's image.
    #[error("this is an archive of the {found} image, not of {want}'s")]
    OtherArch {
        /// The arch its entries name.
        found: &'static str,
        /// The arch wanted.
        want: &'static str,
    },
    /// The same name twice.
    #[error("entry {path:?} appears twice")]
    Duplicate {
        /// The entry's name.
        path: String,
    },
    /// One file over its cap.
    #[error("entry {path:?} is {size} bytes, more than the {max} an image file may have")]
    TooLarge {
        /// The entry's name.
        path: String,
        /// Its size.
        size: u64,
        /// The cap.
        max: u64,
    },
    /// All files together over the cap.
    #[error("the archive's files add up to more than {max} bytes")]
    TooMuch {
        /// The cap.
        max: u64,
    },
    /// A pax header that would rename or resize an entry.
    #[error("a pax header sets {key:?}, which an image archive never does")]
    Pax {
        /// The pax key.
        key: String,
    },
    /// A file the image needs is missing.
    #[error("the archive has no {arch}/{name}")]
    Missing {
        /// The arch.
        arch: &'static str,
        /// The file.
        name: &'static str,
    },
    /// The manifest cannot be read.
    #[error("its manifest cannot be read")]
    Manifest(#[from] ManifestError),
    /// The manifest names another arch (or none).
    #[error("its manifest says arch={found:?}, not {want}")]
    ManifestArch {
        /// What it says (empty: nothing).
        found: String,
        /// The arch wanted.
        want: &'static str,
    },
    /// The manifest belongs to another boxdesk release.
    #[error("it is the image of boxdesk {found}, not of this boxdesk ({want}); fetch the archive of the {want} release")]
    WrongVersion {
        /// `boxdesk_version=` in the manifest.
        found: String,
        /// This boxdesk's version.
        want: String,
    },
    /// The manifest lists no sum for a file.
    #[error("its manifest lists no {key} for {name}")]
    NoFileSum {
        /// The file.
        name: &'static str,
        /// The key looked for.
        key: String,
    },
    /// A file does not match the sum its manifest lists.
    #[error(
        "{name} does not match the sha256 its manifest lists ({expected}; the file's is {actual})"
    )]
    FileSum {
        /// The file.
        name: &'static str,
        /// The manifest's.
        expected: String,
        /// The file's.
        actual: String,
    },
}

/// An unpacked, checked image.
#[derive(Debug)]
pub struct Unpacked {
    /// `<dest>/<arch>`.
    pub dir: PathBuf,
    /// The kernel file it holds (`vmlinux` preferred).
    pub kernel: &'static str,
    /// The files' bytes together.
    pub bytes: u64,
    /// Its manifest.
    pub manifest: Manifest,
}

/// Unpacks the `.tar.gz` read from `src` into `dest/<arch>` (`dest` must
/// exist; `dest/<arch>` must not) and checks the image; see the module's
/// doc. On error, what was written stays in `dest` for the caller to
/// remove.
pub fn unpack(
    src: impl Read,
    arch: Arch,
    version: &str,
    dest: &Path,
    limits: &Limits,
) -> Result<Unpacked, ArchiveError> {
    let out = dest.join(arch.name());
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&out)
        .map_err(|source| ArchiveError::Write {
            path: out.clone(),
            source,
        })?;
    let cap = limits.max_total.saturating_add(STREAM_OVERHEAD);
    let stream = Capped {
        inner: flate2::read::GzDecoder::new(src),
        left: cap,
    };
    let mut tar = tar::Archive::new(stream);
    let mut written: Vec<(&'static str, Digest)> = Vec::new();
    let mut total = 0u64;
    {
        let entries = tar.entries().map_err(|e| read_error(e, cap))?.raw(true);
        for entry in entries {
            let mut entry = entry.map_err(|e| read_error(e, cap))?;
            let raw = entry.path_bytes().into_owned();
            let shown = String::from_utf8_lossy(&raw).into_owned();
            let ty = entry.header().entry_type();
            if ty.is_pax_local_extensions() || ty.is_pax_global_extensions() {
                check_pax(&mut entry, cap)?;
                continue;
            }
            if ty.is_dir() {
                let trimmed = raw.strip_suffix(b"/").unwrap_or(&raw);
                if trimmed == arch.name().as_bytes() {
                    continue;
                }
                // `aarch64/` in an archive wanted for x86_64 says more
                // than "a directory".
                if let Some(found) = Arch::ALL.iter().find(|a| trimmed == a.name().as_bytes()) {
                    return Err(ArchiveError::OtherArch {
                        found: found.name(),
                        want: arch.name(),
                    });
                }
                return Err(ArchiveError::BadPath {
                    path: shown,
                    arch: arch.name(),
                });
            }
            if !ty.is_file() {
                return Err(ArchiveError::NotRegular {
                    path: shown,
                    kind: kind(ty),
                });
            }
            let name = file_name(&raw, &shown, arch)?;
            if written.iter().any(|(n, _)| *n == name) {
                return Err(ArchiveError::Duplicate { path: shown });
            }
            let size = entry.size();
            let max = if name == "manifest" {
                MAX_MANIFEST_BYTES
            } else {
                limits.max_file
            };
            if size > max {
                return Err(ArchiveError::TooLarge {
                    path: shown,
                    size,
                    max,
                });
            }
            total = total.saturating_add(size);
            if total > limits.max_total {
                return Err(ArchiveError::TooMuch {
                    max: limits.max_total,
                });
            }
            let digest = write_file(&mut entry, size, &out.join(name), cap)?;
            written.push((name, digest));
        }
    }
    // The rest of the stream (the end-of-archive records, padding): read
    // to gzip's end, which checks its CRC and length.
    let mut rest = tar.into_inner();
    io::copy(&mut rest, &mut io::sink()).map_err(|e| read_error(e, cap))?;

    let has = |n: &str| written.iter().any(|(w, _)| *w == n);
    for name in ["manifest", "initramfs.cpio.gz"] {
        if !has(name) {
            return Err(ArchiveError::Missing {
                arch: arch.name(),
                name,
            });
        }
    }
    let kernel = arch
        .kernels()
        .iter()
        .copied()
        .find(|k| has(k))
        .ok_or(ArchiveError::Missing {
            arch: arch.name(),
            name: arch.kernels()[0],
        })?;
    let manifest_path = out.join("manifest");
    let manifest = Manifest::read(&manifest_path).map_err(|source| ArchiveError::Write {
        path: manifest_path,
        source,
    })??;
    check_manifest(&manifest, arch, version, &written)?;
    Ok(Unpacked {
        dir: out,
        kernel,
        bytes: total,
        manifest,
    })
}

/// The manifest names this arch, this version (when it names one), and
/// the sum of every file unpacked.
fn check_manifest(
    m: &Manifest,
    arch: Arch,
    version: &str,
    written: &[(&'static str, Digest)],
) -> Result<(), ArchiveError> {
    if m.arch() != Some(arch.name()) {
        return Err(ArchiveError::ManifestArch {
            found: m.arch().unwrap_or_default().to_owned(),
            want: arch.name(),
        });
    }
    if let Some(found) = m.boxdesk_version() {
        if found != version {
            return Err(ArchiveError::WrongVersion {
                found: found.to_owned(),
                want: version.to_owned(),
            });
        }
    }
    for (name, digest) in written.iter().filter(|(n, _)| *n != "manifest") {
        let key = Manifest::sum_key(name);
        let listed = m.get(&key).ok_or_else(|| ArchiveError::NoFileSum {
            name,
            key: key.clone(),
        })?;
        if sums::from_hex(listed.trim()) != Some(*digest) {
            return Err(ArchiveError::FileSum {
                name,
                expected: listed.to_owned(),
                actual: sums::to_hex(digest),
            });
        }
    }
    Ok(())
}

/// The image file an entry's path names: exactly `<arch>/<name>`.
fn file_name(raw: &[u8], shown: &str, arch: Arch) -> Result<&'static str, ArchiveError> {
    let bad = || ArchiveError::BadPath {
        path: shown.to_owned(),
        arch: arch.name(),
    };
    let path = std::str::from_utf8(raw).map_err(|_| bad())?;
    let parts: Vec<&str> = path.split('/').collect();
    if path.starts_with('/') || parts.iter().any(|p| matches!(*p, "" | "." | "..")) {
        return Err(bad());
    }
    let [dir, name] = parts[..] else {
        return Err(bad());
    };
    if dir != arch.name() {
        return Err(match Arch::ALL.iter().find(|a| a.name() == dir) {
            Some(found) => ArchiveError::OtherArch {
                found: found.name(),
                want: arch.name(),
            },
            None => bad(),
        });
    }
    arch.files()
        .iter()
        .copied()
        .find(|f| *f == name)
        .ok_or_else(|| ArchiveError::Unexpected {
            path: shown.to_owned(),
            arch: arch.name(),
            expected: arch.files().to_vec(),
        })
}

/// A pax header: small, and changing no name, link or size.
fn check_pax<R: Read>(entry: &mut tar::Entry<'_, R>, cap: u64) -> Result<(), ArchiveError> {
    if entry.size() > MAX_PAX_BYTES {
        return Err(ArchiveError::TooLarge {
            path: "(pax header)".to_owned(),
            size: entry.size(),
            max: MAX_PAX_BYTES,
        });
    }
    let Some(exts) = entry.pax_extensions().map_err(|e| read_error(e, cap))? else {
        return Ok(());
    };
    for ext in exts {
        let ext = ext.map_err(|e| read_error(e, cap))?;
        let key = String::from_utf8_lossy(ext.key_bytes()).into_owned();
        if matches!(key.as_str(), "path" | "linkpath" | "size") || key.starts_with("GNU.sparse") {
            return Err(ArchiveError::Pax { key });
        }
    }
    Ok(())
}

/// Writes `size` bytes of `entry` to a new file at `path` (0644,
/// `O_EXCL`, synced); returns their sha256.
fn write_file<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    size: u64,
    path: &Path,
    cap: u64,
) -> Result<Digest, ArchiveError> {
    let werr = |source| ArchiveError::Write {
        path: path.to_owned(),
        source,
    };
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(werr)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = entry
            .read(&mut buf[..want])
            .map_err(|e| read_error(e, cap))?;
        if n == 0 {
            return Err(ArchiveError::Read(io::Error::from(
                io::ErrorKind::UnexpectedEof,
            )));
        }
        hash.update(&buf[..n]);
        f.write_all(&buf[..n]).map_err(werr)?;
        left -= n as u64;
    }
    f.sync_all().map_err(werr)?;
    Ok(hash.finalize().into())
}

/// A read error, or the stream cap's.
fn read_error(e: io::Error, cap: u64) -> ArchiveError {
    if e.get_ref().is_some_and(|i| i.is::<BombError>()) {
        ArchiveError::Bomb { max: cap }
    } else {
        ArchiveError::Read(e)
    }
}

/// An entry type's name, for the error.
fn kind(ty: tar::EntryType) -> &'static str {
    use tar::EntryType as T;
    match ty {
        T::Symlink => "symbolic link",
        T::Link => "hard link",
        T::Char => "character device",
        T::Block => "block device",
        T::Fifo => "FIFO",
        T::Continuous => "contiguous file",
        T::GNULongName | T::GNULongLink => "GNU long-name record",
        T::GNUSparse => "sparse file",
        _ => "special entry",
    }
}

/// The decompressed stream went past its cap.
#[derive(Debug, thiserror::Error)]
#[error("the decompressed stream is over its cap")]
struct BombError;

/// A reader that fails once it has given `left` bytes.
struct Capped<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // One more byte means over the cap; none means the end.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(io::Error::other(BombError)),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const V: &str = "1.2.3";

    /// A `.tar.gz` of `entries` (path, type, data), as GNU tar writes it.
    pub(crate) fn targz(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut b = tar::Builder::new(gz);
        for (path, ty, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*ty);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if ty.is_symlink() || *ty == tar::EntryType::Link {
                h.set_size(0);
                h.set_link_name("/etc/passwd").unwrap();
            }
            // Set the name bytes directly: `set_path` refuses `..`.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            let data: &[u8] = if h.size().unwrap() == 0 { &[] } else { data };
            b.append(&h, data).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap()
    }

    fn sha(data: &[u8]) -> String {
        sums::to_hex(&Sha256::digest(data).into())
    }

    /// A good image's files for `arch` (its manifest naming `manifest_arch`
    /// and `version`).
    pub(crate) fn good_files(
        arch: &str,
        manifest_arch: &str,
        version: Option<&str>,
    ) -> Vec<(String, Vec<u8>)> {
        let kernel = if arch == "aarch64" {
            "Image"
        } else {
            "vmlinux"
        };
        let k = format!("{arch} kernel").into_bytes();
        let i = b"initramfs".to_vec();
        let mut m = format!(
            "arch={manifest_arch}\nkernel_version=6.1.0-test\n{kernel}_sha256={}\ninitramfs_sha256={}\n",
            sha(&k),
            sha(&i)
        );
        if let Some(v) = version {
            m.push_str(&format!("boxdesk_version={v}\n"));
        }
        vec![
            (format!("{arch}/{kernel}"), k),
            (format!("{arch}/initramfs.cpio.gz"), i),
            (format!("{arch}/manifest"), m.into_bytes()),
        ]
    }

    fn pack(files: &[(String, Vec<u8>)]) -> Vec<u8> {
        let e: Vec<_> = files
            .iter()
            .map(|(p, d)| (p.as_str(), tar::EntryType::Regular, d.as_slice()))
            .collect();
        targz(&e)
    }

    fn try_unpack(bytes: &[u8], arch: Arch) -> (tempfile::TempDir, Result<Unpacked, ArchiveError>) {
        let t = tempfile::tempdir().unwrap();
        let r = unpack(bytes, arch, V, t.path(), &LIMITS);
        (t, r)
    }

    #[test]
    fn a_good_archive_unpacks_with_the_files_checked_against_the_manifest() {
        let (t, r) = try_unpack(
            &pack(&good_files("x86_64", "x86_64", Some(V))),
            Arch::X86_64,
        );
        let u = r.unwrap();
        assert_eq!(u.dir, t.path().join("x86_64"));
        assert_eq!(u.kernel, "vmlinux");
        assert_eq!(fs::read(u.dir.join("vmlinux")).unwrap(), b"x86_64 kernel");
        assert_eq!(
            fs::read(u.dir.join("initramfs.cpio.gz")).unwrap(),
            b"initramfs"
        );
        assert_eq!(u.manifest.boxdesk_version(), Some(V));
        let (_t, r) = try_unpack(
            &pack(&good_files("aarch64", "aarch64", None)),
            Arch::Aarch64,
        );
        assert_eq!(r.unwrap().kernel, "Image");
    }

    #[test]
    fn a_directory_entry_for_the_arch_is_allowed() {
        let files = good_files("x86_64", "x86_64", Some(V));
        let mut e = vec![("x86_64/", tar::EntryType::Directory, &b""[..])];
        e.extend(
            files
                .iter()
                .map(|(p, d)| (p.as_str(), tar::EntryType::Regular, d.as_slice())),
        );
        let (_t, r) = try_unpack(&targz(&e), Arch::X86_64);
        r.unwrap();
    }

    #[test]
    fn links_devices_and_fifos_are_refused() {
        for ty in [
            tar::EntryType::Symlink,
            tar::EntryType::Link,
            tar::EntryType::Fifo,
            tar::EntryType::Char,
            tar::EntryType::Block,
        ] {
            let bytes = targz(&[("x86_64/vmlinux", ty, b"")]);
            let (t, r) = try_unpack(&bytes, Arch::X86_64);
            assert!(
                matches!(r, Err(ArchiveError::NotRegular { .. })),
                "{ty:?}: {r:?}"
            );
            assert_eq!(fs::read_dir(t.path().join("x86_64")).unwrap().count(), 0);
        }
    }

    #[test]
    fn absolute_paths_dot_dot_and_other_directories_are_refused() {
        for path in [
            "/x86_64/vmlinux",
            "x86_64/../vmlinux",
            "../x86_64/vmlinux",
            "./x86_64/vmlinux",
            "x86_64//vmlinux",
            "x86_64/sub/vmlinux",
            "vmlinux",
            "other/vmlinux",
            "x86_64/vmlinux/",
        ] {
            let bytes = targz(&[(path, tar::EntryType::Regular, b"k")]);
            let (t, r) = try_unpack(&bytes, Arch::X86_64);
            assert!(
                matches!(r, Err(ArchiveError::BadPath { .. })),
                "{path}: {r:?}"
            );
            assert_eq!(fs::read_dir(t.path().join("x86_64")).unwrap().count(), 0);
        }
        let bytes = targz(&[("etc/", tar::EntryType::Directory, b"")]);
        assert!(matches!(
            try_unpack(&bytes, Arch::X86_64).1,
            Err(ArchiveError::BadPath { .. })
        ));
    }

    #[test]
    fn unknown_and_repeated_files_are_refused() {
        let bytes = targz(&[("x86_64/evil.sh", tar::EntryType::Regular, b"k")]);
        assert!(matches!(
            try_unpack(&bytes, Arch::X86_64).1,
            Err(ArchiveError::Unexpected { .. })
        ));
        // An aarch64 kernel name is not an x86_64 image's.
        let bytes = targz(&[("x86_64/Image", tar::EntryType::Regular, b"k")]);
        assert!(matches!(
            try_unpack(&bytes, Arch::X86_64).1,
            Err(ArchiveError::Unexpected { .. })
        ));
        let bytes = targz(&[
            ("x86_64/vmlinux", tar::EntryType::Regular, b"k"),
            ("x86_64/vmlinux", tar::EntryType::Regular, b"k"),
        ]);
        assert!(matches!(
            try_unpack(&bytes, Arch::X86_64).1,
            Err(ArchiveError::Duplicate { .. })
        ));
    }

    #[test]
    fn the_other_arch_is_refused_by_its_paths_or_by_its_manifest() {
        let bytes = pack(&good_files("aarch64", "aarch64", Some(V)));
        let (_t, r) = try_unpack(&bytes, Arch::X86_64);
        assert!(
            matches!(
                r,
                Err(ArchiveError::OtherArch {
                    found: "aarch64",
                    want: "x86_64"
                })
            ),
            "{r:?}"
        );
        let bytes = pack(&good_files("x86_64", "aarch64", Some(V)));
        let (_t, r) = try_unpack(&bytes, Arch::X86_64);
        assert!(matches!(r, Err(ArchiveError::ManifestArch { .. })), "{r:?}");
    }

    #[test]
    fn another_boxdesk_versions_image_is_refused_and_one_without_a_version_taken() {
        let bytes = pack(&good_files("x86_64", "x86_64", Some("9.9.9")));
        let (_t, r) = try_unpack(&bytes, Arch::X86_64);
        let e = r.unwrap_err();
        assert!(matches!(e, ArchiveError::WrongVersion { .. }), "{e:?}");
        assert!(e.to_string().contains("boxdesk 9.9.9"), "{e}");
        let bytes = pack(&good_files("x86_64", "x86_64", None));
        try_unpack(&bytes, Arch::X86_64).1.unwrap();
    }

    #[test]
    fn a_missing_file_or_a_file_that_does_not_match_its_manifest_sum_is_refused() {
        let mut files = good_files("x86_64", "x86_64", Some(V));
        files.remove(1);
        let (_t, r) = try_unpack(&pack(&files), Arch::X86_64);
        assert!(
            matches!(
                r,
                Err(ArchiveError::Missing {
                    name: "initramfs.cpio.gz",
                    ..
                })
            ),
            "{r:?}"
        );
        let mut files = good_files("x86_64", "x86_64", Some(V));
        files[0].1 = b"another kernel".to_vec();
        let (_t, r) = try_unpack(&pack(&files), Arch::X86_64);
        assert!(
            matches!(
                r,
                Err(ArchiveError::FileSum {
                    name: "vmlinux",
                    ..
                })
            ),
            "{r:?}"
        );
        let mut files = good_files("x86_64", "x86_64", Some(V));
        files[2].1 = b"arch=x86_64\n".to_vec();
        let (_t, r) = try_unpack(&pack(&files), Arch::X86_64);
        assert!(matches!(r, Err(ArchiveError::NoFileSum { .. })), "{r:?}");
    }

    #[test]
    fn a_truncated_or_garbage_stream_is_refused() {
        let bytes = pack(&good_files("x86_64", "x86_64", Some(V)));
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 4] {
            let (_t, r) = try_unpack(&bytes[..cut], Arch::X86_64);
            assert!(
                matches!(r, Err(ArchiveError::Read(_))),
                "cut at {cut}: {r:?}"
            );
        }
        let (_t, r) = try_unpack(b"<html>404</html>", Arch::X86_64);
        assert!(matches!(r, Err(ArchiveError::Read(_))), "{r:?}");
    }

    #[test]
    fn sizes_are_checked_from_the_header_before_writing_and_the_stream_is_capped() {
        let small = Limits {
            max_file: 8,
            max_total: 12,
        };
        let bytes = targz(&[("x86_64/vmlinux", tar::EntryType::Regular, &[0u8; 9])]);
        let t = tempfile::tempdir().unwrap();
        let r = unpack(&bytes[..], Arch::X86_64, V, t.path(), &small);
        assert!(
            matches!(r, Err(ArchiveError::TooLarge { size: 9, .. })),
            "{r:?}"
        );
        assert!(!t.path().join("x86_64/vmlinux").exists());
        let bytes = targz(&[
            ("x86_64/vmlinux", tar::EntryType::Regular, &[0u8; 8]),
            ("x86_64/bzImage", tar::EntryType::Regular, &[0u8; 8]),
        ]);
        let t = tempfile::tempdir().unwrap();
        let r = unpack(&bytes[..], Arch::X86_64, V, t.path(), &small);
        assert!(matches!(r, Err(ArchiveError::TooMuch { .. })), "{r:?}");

        // Zeros past the tar's end: a tiny gzip that unpacks to more than
        // the cap is cut off, not read to its end.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let tar_bytes = {
            let good = pack(&good_files("x86_64", "x86_64", Some(V)));
            let mut d = flate2::read::GzDecoder::new(&good[..]);
            let mut v = Vec::new();
            d.read_to_end(&mut v).unwrap();
            v
        };
        gz.write_all(&tar_bytes).unwrap();
        gz.write_all(&vec![0u8; (STREAM_OVERHEAD + (1 << 20)) as usize])
            .unwrap();
        let bomb = gz.finish().unwrap();
        let t = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_file: 1 << 20,
            max_total: 1 << 20,
        };
        let r = unpack(&bomb[..], Arch::X86_64, V, t.path(), &limits);
        assert!(matches!(r, Err(ArchiveError::Bomb { .. })), "{r:?}");
    }

    #[test]
    fn a_pax_header_that_renames_an_entry_is_refused_and_a_harmless_one_allowed() {
        let pax = |records: &[(&str, &str)]| -> Vec<u8> {
            let mut out = Vec::new();
            for (k, v) in records {
                // "LEN key=value\n", LEN counting itself.
                let body = format!(" {k}={v}\n");
                let mut len = body.len() + 1;
                while format!("{len}{body}").len() != len {
                    len += 1;
                }
                out.extend_from_slice(format!("{len}{body}").as_bytes());
            }
            out
        };
        let files = good_files("x86_64", "x86_64", Some(V));
        let harmless = pax(&[("mtime", "0.0"), ("atime", "1.5")]);
        let mut e = vec![(
            "PaxHeaders/vmlinux",
            tar::EntryType::XHeader,
            harmless.as_slice(),
        )];
        e.extend(
            files
                .iter()
                .map(|(p, d)| (p.as_str(), tar::EntryType::Regular, d.as_slice())),
        );
        try_unpack(&targz(&e), Arch::X86_64).1.unwrap();

        let rename = pax(&[("path", "../../etc/passwd")]);
        let e = vec![
            (
                "PaxHeaders/vmlinux",
                tar::EntryType::XHeader,
                rename.as_slice(),
            ),
            ("x86_64/vmlinux", tar::EntryType::Regular, &b"k"[..]),
        ];
        let (_t, r) = try_unpack(&targz(&e), Arch::X86_64);
        assert!(matches!(r, Err(ArchiveError::Pax { .. })), "{r:?}");
    }
}
