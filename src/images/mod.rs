//! Guest images from a release: `boxdesk images fetch` downloads this
//! boxdesk's own release's `boxdesk-images-<arch>.tar.gz` and installs it
//! where the VM backends look (`vmm::image`: the data dir's
//! `images/<arch>`), so a VM runs without building a kernel.
//!
//! One fetch, in order: the data dir is locked ([`install`]); an image
//! already there for this arch and version is kept unless forced; the
//! release's sums are fetched (`<archive>.sha256`, else `sha256.sum`) and
//! read ([`sums`]); the archive is downloaded with curl ([`download`],
//! which says why curl) into a temporary directory beside `images/`, with
//! progress ([`progress`]); its sha256 is checked against the sum **before
//! anything is unpacked**; it is unpacked and checked entry by entry
//! ([`archive`], the manifest by [`manifest`]) into that same temporary
//! directory, and only a whole, checked image is renamed into place. Any
//! refusal leaves `images/` as it was and removes the temporary directory.
//!
//! This module owns the order of those steps and what is said; the
//! command line (`cli::images`) only parses flags.

pub mod archive;
pub mod download;
pub mod install;
pub mod manifest;
pub mod progress;
pub mod sums;

use std::fmt;
use std::fs::File;
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use self::archive::ArchiveError;
use self::download::DownloadError;
use self::install::{InstallError, Store};
use self::manifest::Manifest;
use self::sums::SumsError;

/// This boxdesk's version: the release whose images it fetches.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The most bytes an image archive may have.
pub const MAX_ARCHIVE_BYTES: u64 = 512 << 20;

/// A guest arch an image exists for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// x86_64.
    X86_64,
    /// aarch64 (arm64).
    Aarch64,
}

impl Arch {
    /// Every arch.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// `x86_64`, `aarch64`: the image directory's name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The host's arch, when images exist for it.
    pub fn host() -> Option<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == std::env::consts::ARCH)
    }

    /// The kernel files an image of this arch may hold, preferred first
    /// (the release archive holds the first).
    pub fn kernels(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["vmlinux", "bzImage"],
            Arch::Aarch64 => &["Image"],
        }
    }

    /// Every file an image of this arch may hold.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["vmlinux", "bzImage", "initramfs.cpio.gz", "manifest"],
            Arch::Aarch64 => &["Image", "initramfs.cpio.gz", "manifest"],
        }
    }

    /// `boxdesk-images-<arch>.tar.gz`, the release asset.
    pub fn archive_name(self) -> String {
        format!("boxdesk-images-{}.tar.gz", self.name())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "x86_64" | "amd64" => Ok(Arch::X86_64),
            "aarch64" | "arm64" => Ok(Arch::Aarch64),
            _ => Err(format!("{s:?} is not a guest arch (x86_64 or aarch64)")),
        }
    }
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// `--from` / `$BOXDESK_RELEASE_URL` is not a usable base URL.
    #[error("{url:?} is not a release URL: {why}")]
    BadUrl {
        /// What was given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No data dir can be located.
    #[error("cannot locate the data dir")]
    DataDir(#[source] boxdesk_platform::DirError),
    /// Neither sums file exists.
    #[error("the release at {base} publishes no checksum for {name} (neither {name}.sha256 nor sha256.sum is there); refusing an image that cannot be checked")]
    NoSums {
        /// The base URL.
        base: String,
        /// The archive's name.
        name: String,
    },
    /// The sums file cannot be used.
    #[error("the checksums at {url}")]
    BadSums {
        /// Where they came from.
        url: String,
        /// What is wrong.
        #[source]
        source: SumsError,
    },
    /// A download failed.
    #[error(transparent)]
    Download(#[from] DownloadError),
    /// The downloaded archive does not match its sum.
    #[error("{name} does not match its published sha256 (expected {expected}, downloaded {actual}): the download is corrupt or was tampered with; nothing was unpacked")]
    Checksum {
        /// The archive's name.
        name: String,
        /// The published sum.
        expected: String,
        /// The downloaded file's.
        actual: String,
    },
    /// The archive was refused while unpacking.
    #[error("{name} was refused, nothing was installed")]
    Archive {
        /// The archive's name.
        name: String,
        /// Why.
        #[source]
        source: ArchiveError,
    },
    /// Reading the downloaded archive failed.
    #[error("cannot read the downloaded {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// The data dir cannot take the image.
    #[error(transparent)]
    Install(#[from] InstallError),
}

/// What `fetch` is asked to do.
#[derive(Debug, Clone)]
pub struct FetchRequest {
    /// The guest arch.
    pub arch: Arch,
    /// The release's base URL (ends in `/` once checked).
    pub base: String,
    /// Replace an image that is already there.
    pub force: bool,
    /// Draw progress for a terminal.
    pub tty: bool,
}

/// What `fetch` did.
#[derive(Debug)]
pub enum Fetched {
    /// A good image was there already.
    Kept {
        /// Its directory.
        dir: PathBuf,
    },
    /// The image was installed.
    Installed {
        /// Its directory.
        dir: PathBuf,
        /// The kernel file.
        kernel: &'static str,
        /// The files' bytes.
        bytes: u64,
        /// `kernel_version=` of its manifest.
        kernel_version: Option<String>,
    },
}

/// The release's default base URL: this version's GitHub release.
pub fn default_base() -> String {
    format!(
        "{}/releases/download/v{VERSION}/",
        env!("CARGO_PKG_REPOSITORY")
    )
}

/// Checks a base URL (`http://` or `https://`, nothing to confuse a
/// file name appended to it) and gives it a trailing `/`.
pub fn base_url(url: &str) -> Result<String, FetchError> {
    let bad = |why| FetchError::BadUrl {
        url: url.to_owned(),
        why,
    };
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("https://")
        .or_else(|| lower.strip_prefix("http://"))
        .ok_or_else(|| bad("only http:// and https:// are fetched from"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(bad("it names no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("it holds white space or control characters"));
    }
    if url.contains(['?', '#']) {
        return Err(bad("it must be a directory's URL, without ? or #"));
    }
    let mut base = url.to_owned();
    if !base.ends_with('/') {
        base.push('/');
    }
    Ok(base)
}

/// Whether `base` is plain http to a host other than this one's loopback.
pub fn insecure(base: &str) -> bool {
    let Some(rest) = base
        .to_ascii_lowercase()
        .strip_prefix("http://")
        .map(str::to_owned)
    else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    !(host == "localhost" || host == "::1" || host.starts_with("127."))
}

/// How an image directory already there stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Existing {
    /// Nothing there.
    None,
    /// A whole image of this arch, of this version or of none named.
    Good,
    /// A whole image of another boxdesk version.
    OtherVersion(String),
    /// Something, but not a usable image of this arch.
    Broken(String),
}

/// How `dir` stands as the image of `arch` for boxdesk `version`.
pub fn existing(dir: &Path, arch: Arch, version: &str) -> Existing {
    if std::fs::symlink_metadata(dir).is_err() {
        return Existing::None;
    }
    if boxdesk_vmm::image::in_dir(dir).is_none() {
        return Existing::Broken("it has no kernel and initramfs".to_owned());
    }
    let m = match Manifest::read(&dir.join("manifest")) {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return Existing::Broken(e.to_string()),
        Err(e) => return Existing::Broken(format!("its manifest: {e}")),
    };
    if m.arch() != Some(arch.name()) {
        return Existing::Broken(format!("its manifest says arch={}", m.arch().unwrap_or("")));
    }
    match m.boxdesk_version() {
        Some(v) if v != version => Existing::OtherVersion(v.to_owned()),
        _ => Existing::Good,
    }
}

/// Fetches and installs the image `req` asks for; `say` gets each line
/// worth telling the user (stderr).
pub fn fetch(req: &FetchRequest, say: &mut dyn FnMut(&str)) -> Result<Fetched, FetchError> {
    let data = boxdesk_platform::dirs::data_dir().map_err(FetchError::DataDir)?;
    fetch_into(&data, VERSION, req, say)
}

/// [`fetch`] into the data dir `data`, for boxdesk `version`.
pub fn fetch_into(
    data: &Path,
    version: &str,
    req: &FetchRequest,
    say: &mut dyn FnMut(&str),
) -> Result<Fetched, FetchError> {
    let arch = req.arch;
    let name = arch.archive_name();
    let store = Store::open(data, || {
        say(&format!(
            "waiting for another `boxdesk images fetch` ({} is locked)",
            data.display()
        ))
    })?;
    let target = store.images().join(arch.name());
    match existing(&target, arch, version) {
        Existing::Good if !req.force => return Ok(Fetched::Kept { dir: target }),
        Existing::Good | Existing::None => {}
        Existing::OtherVersion(v) => say(&format!(
            "{} holds the image of boxdesk {v}; fetching {version}'s",
            target.display()
        )),
        Existing::Broken(why) => say(&format!(
            "{} is not a whole {arch} image ({why}); fetching it again",
            target.display()
        )),
    }
    let swept = store.sweep();
    if swept > 0 {
        say(&format!(
            "removed {swept} temporary director{} an interrupted fetch left",
            if swept == 1 { "y" } else { "ies" }
        ));
    }
    if insecure(&req.base) {
        say(&format!(
            "warning: {} is plain http: the archive and its checksum both come over it unauthenticated",
            req.base
        ));
    }
    let tmp = store.temp()?;

    let expected = published_sum(&req.base, &name, tmp.path())?;

    let url = format!("{}{name}", req.base);
    let file = tmp.path().join(&name);
    say(&format!("fetching {url}"));
    let mut bar = progress::Progress::new(&name, req.tty);
    let got = download::download(
        &download::Request {
            url: &url,
            dest: &file,
            max_bytes: MAX_ARCHIVE_BYTES,
            headers: &tmp.path().join("archive.headers"),
        },
        &mut |done, total| bar.update(done, total),
    );
    bar.finish(*got.as_ref().unwrap_or(&0), got.is_ok());
    got?;

    let actual = sha256_file(&file)?;
    if actual != expected {
        return Err(FetchError::Checksum {
            name,
            expected: sums::to_hex(&expected),
            actual: sums::to_hex(&actual),
        });
    }

    let stage = tmp.path().join("stage");
    std::fs::create_dir(&stage).map_err(|source| FetchError::Read {
        path: stage.clone(),
        source,
    })?;
    let src = File::open(&file).map_err(|source| FetchError::Read {
        path: file.clone(),
        source,
    })?;
    let unpacked = archive::unpack(
        io::BufReader::new(src),
        arch,
        version,
        &stage,
        &archive::LIMITS,
    )
    .map_err(|source| FetchError::Archive {
        name: name.clone(),
        source,
    })?;
    let dir = store.install(&unpacked.dir, arch.name(), &tmp)?;
    drop(tmp);
    Ok(Fetched::Installed {
        dir,
        kernel: unpacked.kernel,
        bytes: unpacked.bytes,
        kernel_version: unpacked.manifest.get("kernel_version").map(str::to_owned),
    })
}

/// The sum the release publishes for `name`: `<name>.sha256`, else the
/// release's `sha256.sum`.
fn published_sum(base: &str, name: &str, tmp: &Path) -> Result<sums::Digest, FetchError> {
    for (i, sums_name) in [format!("{name}.sha256"), "sha256.sum".to_owned()]
        .into_iter()
        .enumerate()
    {
        let url = format!("{base}{sums_name}");
        let dest = tmp.join(format!("sums-{i}"));
        let req = download::Request {
            url: &url,
            dest: &dest,
            max_bytes: sums::MAX_SUMS_BYTES,
            headers: &tmp.join(format!("sums-{i}.headers")),
        };
        match download::download(&req, &mut |_, _| {}) {
            Ok(_) => {}
            Err(DownloadError::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
        let mut text = Vec::new();
        File::open(&dest)
            .and_then(|f| f.take(sums::MAX_SUMS_BYTES).read_to_end(&mut text))
            .map_err(|source| FetchError::Read {
                path: dest.clone(),
                source,
            })?;
        return sums::lookup(&text, name).map_err(|source| FetchError::BadSums { url, source });
    }
    Err(FetchError::NoSums {
        base: base.to_owned(),
        name: name.to_owned(),
    })
}

/// The sha256 of the file at `path`, read in pieces.
fn sha256_file(path: &Path) -> Result<sums::Digest, FetchError> {
    let read_err = |source| FetchError::Read {
        path: path.to_owned(),
        source,
    };
    let mut f = File::open(path).map_err(read_err)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = f.read(&mut buf).map_err(read_err)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(hash.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_is_http_or_https_with_a_host_and_gets_its_trailing_slash() {
        assert_eq!(
            base_url("https://example.com/r/v1").unwrap(),
            "https://example.com/r/v1/"
        );
        assert_eq!(
            base_url("http://127.0.0.1:8000/").unwrap(),
            "http://127.0.0.1:8000/"
        );
        for bad in [
            "file:///etc/",
            "ftp://x/",
            "https://",
            "https:///x",
            "https://x/a b/",
            "https://x/?q=1",
            "-o/etc/passwd",
        ] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
        assert!(default_base().starts_with("https://github.com/"));
        assert!(default_base().ends_with(&format!("/v{VERSION}/")));
    }

    #[test]
    fn plain_http_is_insecure_unless_it_stays_on_loopback() {
        assert!(insecure("http://example.com/"));
        assert!(insecure("http://10.0.0.1:80/x/"));
        assert!(!insecure("http://127.0.0.1:8000/"));
        assert!(!insecure("http://localhost/"));
        assert!(!insecure("http://[::1]:80/"));
        assert!(!insecure("https://example.com/"));
    }

    #[test]
    fn an_arch_is_named_as_the_image_directory_is() {
        assert_eq!("arm64".parse::<Arch>().unwrap(), Arch::Aarch64);
        assert_eq!(Arch::X86_64.archive_name(), "boxdesk-images-x86_64.tar.gz");
        assert!("riscv64".parse::<Arch>().is_err());
        for a in Arch::ALL {
            for k in a.kernels() {
                assert!(boxdesk_vmm::image::KERNEL_NAMES.contains(k));
                assert!(a.files().contains(k));
            }
        }
    }

    #[test]
    fn an_image_already_there_is_judged_by_its_files_and_manifest() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("x86_64");
        assert_eq!(existing(&dir, Arch::X86_64, "1.0.0"), Existing::None);
        std::fs::create_dir(&dir).unwrap();
        assert!(matches!(
            existing(&dir, Arch::X86_64, "1.0.0"),
            Existing::Broken(_)
        ));
        std::fs::write(dir.join("vmlinux"), b"k").unwrap();
        std::fs::write(dir.join("initramfs.cpio.gz"), b"i").unwrap();
        assert!(matches!(
            existing(&dir, Arch::X86_64, "1.0.0"),
            Existing::Broken(_)
        ));
        std::fs::write(dir.join("manifest"), b"arch=aarch64\n").unwrap();
        assert!(matches!(
            existing(&dir, Arch::X86_64, "1.0.0"),
            Existing::Broken(_)
        ));
        std::fs::write(dir.join("manifest"), b"arch=x86_64\n").unwrap();
        assert_eq!(existing(&dir, Arch::X86_64, "1.0.0"), Existing::Good);
        std::fs::write(
            dir.join("manifest"),
            b"arch=x86_64\nboxdesk_version=0.9.0\n",
        )
        .unwrap();
        assert_eq!(
            existing(&dir, Arch::X86_64, "1.0.0"),
            Existing::OtherVersion("0.9.0".into())
        );
    }
}
