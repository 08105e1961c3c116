//! `boxdesk images fetch | ls | path`: the guest images the VM backends
//! boot.
//!
//! This module owns the flags and what is printed; fetching and checking
//! are `crate::images`'. Progress and notes go to stderr; the one line
//! saying where the image is goes to stdout.

use std::io::IsTerminal as _;
use std::path::Path;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::images::{self, Arch, FetchRequest, Fetched};

/// `boxdesk images …`.
#[derive(Debug, Subcommand)]
pub enum ImagesCmd {
    /// Download this boxdesk release's guest image (kernel + initramfs
    /// with the agent) and install it where the VM backends look:
    /// ${XDG_DATA_HOME:-~/.local/share}/boxdesk/images/ARCH. The archive's
    /// sha256 is checked before anything is unpacked; a refused archive
    /// leaves what was installed as it was. Needs curl.
    Fetch(FetchArgs),
    /// List the guest image each arch would boot, and where it is.
    Ls,
    /// Print the directory of the guest image ARCH would boot (exit 1 when
    /// there is none).
    Path {
        /// The guest arch [default: the host's].
        #[arg(long, value_parser = parse_arch)]
        arch: Option<Arch>,
    },
}

/// `boxdesk images fetch`'s flags.
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// The guest arch [default: the host's].
    #[arg(long, value_parser = parse_arch)]
    arch: Option<Arch>,
    /// The release's base URL, holding boxdesk-images-ARCH.tar.gz and its
    /// .sha256 (or sha256.sum) [default: $BOXDESK_RELEASE_URL, else this
    /// version's GitHub release].
    #[arg(long, value_name = "URL")]
    from: Option<String>,
    /// Fetch and replace the image even when a good one is installed.
    #[arg(long)]
    force: bool,
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    s.parse()
}

/// Runs `boxdesk images …`; returns the exit code.
pub fn images(cmd: ImagesCmd) -> anyhow::Result<i32> {
    match cmd {
        ImagesCmd::Fetch(a) => fetch(a),
        ImagesCmd::Ls => ls(),
        ImagesCmd::Path { arch } => path(arch),
    }
}

fn host_arch(flag: Option<Arch>) -> anyhow::Result<Arch> {
    flag.or_else(Arch::host).with_context(|| {
        format!(
            "there are no guest images for this host's arch ({}); pass --arch x86_64 or aarch64",
            std::env::consts::ARCH
        )
    })
}

fn fetch(a: FetchArgs) -> anyhow::Result<i32> {
    let arch = host_arch(a.arch)?;
    let base = match a.from {
        Some(url) => url,
        None => match std::env::var("BOXDESK_RELEASE_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => images::default_base(),
        },
    };
    let req = FetchRequest {
        arch,
        base: images::base_url(&base)?,
        force: a.force,
        tty: std::io::stderr().is_terminal(),
    };
    let fetched = images::fetch(&req, &mut |line| eprintln!("boxdesk: {line}"))?;
    let dir = match fetched {
        Fetched::Kept { dir } => {
            println!(
                "the {arch} image is already installed at {} (--force fetches it again)",
                dir.display()
            );
            dir
        }
        Fetched::Installed {
            dir,
            kernel,
            bytes,
            kernel_version,
        } => {
            let kv = kernel_version
                .map(|v| format!(", Linux {v}"))
                .unwrap_or_default();
            println!(
                "installed the {arch} image of boxdesk {} at {} ({kernel}{kv}, {})",
                images::VERSION,
                dir.display(),
                images::progress::human(bytes)
            );
            dir
        }
    };
    // An image found earlier in the search order wins over this one.
    if let Ok(img) = boxdesk_vmm::image::find(arch.name(), None, None) {
        let used = img.kernel.parent().unwrap_or(Path::new("/"));
        if used != dir {
            eprintln!(
                "boxdesk: note: VMs boot the image in {} instead, which is looked in first ($BOXDESK_IMAGE_DIR, a source checkout's target/images)",
                used.display()
            );
        }
    }
    Ok(0)
}

fn ls() -> anyhow::Result<i32> {
    for arch in Arch::ALL {
        match boxdesk_vmm::image::find(arch.name(), None, None) {
            Ok(img) => {
                let dir = img.kernel.parent().unwrap_or(Path::new("/"));
                let m = images::manifest::Manifest::read(&dir.join("manifest"))
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                let about: Vec<String> = [
                    m.boxdesk_version().map(|v| format!("boxdesk {v}")),
                    m.get("kernel_version").map(|v| format!("Linux {v}")),
                ]
                .into_iter()
                .flatten()
                .collect();
                let about = if about.is_empty() {
                    String::new()
                } else {
                    format!("  ({})", about.join(", "))
                };
                println!("{:<8} {}{about}", arch.name(), dir.display());
            }
            Err(_) => println!(
                "{:<8} none (boxdesk images fetch --arch {arch})",
                arch.name()
            ),
        }
    }
    Ok(0)
}

fn path(arch: Option<Arch>) -> anyhow::Result<i32> {
    let arch = host_arch(arch)?;
    match boxdesk_vmm::image::find(arch.name(), None, None) {
        Ok(img) => {
            println!(
                "{}",
                img.kernel.parent().unwrap_or(Path::new("/")).display()
            );
            Ok(0)
        }
        Err(e) => {
            eprintln!("boxdesk: {e}");
            Ok(1)
        }
    }
}
