//! Finding the guest image (kernel + initramfs) of an arch, in docs/DESIGN.md's
//! order: `--kernel`/`--initrd`, `$BOXDESK_IMAGE_DIR`, `target/images/<arch>`
//! of a source checkout (found from the binary's path or the current
//! directory), `$XDG_DATA_HOME/boxdesk/images/<arch>`, then `images/<arch>`
//! next to the binary. A directory counts only when it has both files.
//! `boxdesk images fetch` installs a release's image into the data dir's
//! `images/<arch>`; the error for none found says so.

use std::path::{Path, PathBuf};

/// The kernel and initramfs to boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `vmlinux` (preferred on x86_64: no decompression), `bzImage`, or the
    /// arm64 `Image`.
    pub kernel: PathBuf,
    /// `initramfs.cpio.gz`.
    pub initrd: PathBuf,
}

/// Why no image was found.
#[derive(Debug, thiserror::Error)]
#[error("no {arch} guest image found; looked in: {}. Fetch this release's with `boxdesk images fetch --arch {arch}`, build one with `bash images/build.sh {arch}`, or pass --kernel and --initrd", .searched.join(", "))]
pub struct ImageError {
    /// The guest arch.
    pub arch: &'static str,
    /// Where it looked.
    pub searched: Vec<String>,
}

/// The kernel file names an image directory may hold, preferred first
/// (`images/build.sh` writes `vmlinux` + `bzImage` on x86_64, `Image` on
/// aarch64).
pub const KERNEL_NAMES: [&str; 3] = ["vmlinux", "bzImage", "Image"];

/// The image in `dir`, if it has a kernel and an initramfs.
pub fn in_dir(dir: &Path) -> Option<Image> {
    let initrd = dir.join("initramfs.cpio.gz");
    let kernel = KERNEL_NAMES
        .iter()
        .map(|k| dir.join(k))
        .find(|k| k.is_file())?;
    initrd.is_file().then_some(Image { kernel, initrd })
}

/// The candidate directories, in order.
pub fn candidates(arch: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os("BOXDESK_IMAGE_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let exe = std::env::current_exe().ok();
    // A source checkout: <root>/target/{debug,release}/boxdesk, or tests'
    // <root>/target/debug/deps.
    if let Some(exe) = &exe {
        for up in exe.ancestors().skip(1).take(4) {
            if up.file_name().is_some_and(|n| n == "target") {
                dirs.push(up.join("images").join(arch));
                break;
            }
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        dirs.push(cwd.join("target/images").join(arch));
    }
    if let Ok(data) = boxdesk_platform::dirs::data_dir() {
        dirs.push(data.join("images").join(arch));
    }
    if let Some(dir) = exe.as_deref().and_then(Path::parent) {
        dirs.push(dir.join("images").join(arch));
    }
    dirs.dedup();
    dirs
}

/// Finds the image for `arch`; explicit paths win.
pub fn find(
    arch: &'static str,
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
) -> Result<Image, ImageError> {
    if let (Some(kernel), Some(initrd)) = (kernel.clone(), initrd.clone()) {
        return Ok(Image { kernel, initrd });
    }
    let dirs = candidates(arch);
    for d in &dirs {
        if let Some(mut img) = in_dir(d) {
            if let Some(k) = kernel {
                img.kernel = k;
            }
            if let Some(i) = initrd {
                img.initrd = i;
            }
            return Ok(img);
        }
    }
    Err(ImageError {
        arch,
        searched: dirs.iter().map(|d| d.display().to_string()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_counts_only_with_a_kernel_and_an_initramfs_and_vmlinux_wins() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(in_dir(t.path()), None);
        std::fs::write(t.path().join("bzImage"), b"k").unwrap();
        assert_eq!(in_dir(t.path()), None);
        std::fs::write(t.path().join("initramfs.cpio.gz"), b"i").unwrap();
        assert_eq!(in_dir(t.path()).unwrap().kernel, t.path().join("bzImage"));
        std::fs::write(t.path().join("vmlinux"), b"k").unwrap();
        assert_eq!(in_dir(t.path()).unwrap().kernel, t.path().join("vmlinux"));
    }

    #[test]
    fn no_image_offers_the_command_that_fetches_one() {
        let e = ImageError {
            arch: "aarch64",
            searched: vec!["/a".into(), "/b".into()],
        };
        let msg = e.to_string();
        assert!(msg.contains("looked in: /a, /b"), "{msg}");
        assert!(
            msg.contains("`boxdesk images fetch --arch aarch64`"),
            "{msg}"
        );
    }

    #[test]
    fn explicit_kernel_and_initrd_win_over_any_search() {
        let img = find("x86_64", Some("/k".into()), Some("/i".into())).unwrap();
        assert_eq!(
            img,
            Image {
                kernel: "/k".into(),
                initrd: "/i".into()
            }
        );
    }
}
