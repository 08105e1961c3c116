//! Which agent binary a container's sandbox runs. It runs from a
//! descriptor inside the container's own root, where the host's libraries
//! are not: it must be a static executable (no ELF interpreter). In
//! order: `$BOXDESK_OCI_AGENT`; this boxdesk, when it is static (the
//! release builds are); the guest image's `boxdesk-guest-agent` (static
//! musl), wherever the image lookup finds one.
//!
//! This module owns that choice; it must never pick a dynamic binary.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::bail;

/// The agent to run (either binary takes `__agent …`).
pub fn find() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("BOXDESK_OCI_AGENT") {
        let p = PathBuf::from(p);
        if !is_static(&p) {
            bail!("BOXDESK_OCI_AGENT={}: not a static executable", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe()?;
    if is_static(&exe) {
        return Ok(exe);
    }
    for dir in boxdesk_vmm::image::candidates(std::env::consts::ARCH) {
        let p = dir.join("boxdesk-guest-agent");
        if is_static(&p) {
            return Ok(p);
        }
    }
    bail!(
        "a container's agent must be a static executable: this boxdesk ({}) is dynamically linked and no guest image with boxdesk-guest-agent was found (set BOXDESK_OCI_AGENT, or use a release build)",
        exe.display()
    )
}

/// Whether `path` is an ELF executable without a `PT_INTERP` header.
pub fn is_static(path: &Path) -> bool {
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut head = [0u8; 64];
    if f.read_exact(&mut head).is_err() || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return false;
    }
    let le = head[5] == 1;
    let u16_at = |b: &[u8], o: usize| {
        let v = [b[o], b[o + 1]];
        if le {
            u16::from_le_bytes(v)
        } else {
            u16::from_be_bytes(v)
        }
    };
    let u64_at = |b: &[u8], o: usize| {
        let mut v = [0u8; 8];
        v.copy_from_slice(&b[o..o + 8]);
        if le {
            u64::from_le_bytes(v)
        } else {
            u64::from_be_bytes(v)
        }
    };
    let (phoff, phentsize, phnum) = (u64_at(&head, 32), u16_at(&head, 54), u16_at(&head, 56));
    if phentsize < 4 || phnum == 0 || phnum > 256 {
        return false;
    }
    let mut table = vec![0u8; usize::from(phentsize) * usize::from(phnum)];
    use std::io::Seek as _;
    if f.seek(std::io::SeekFrom::Start(phoff)).is_err() || f.read_exact(&mut table).is_err() {
        return false;
    }
    const PT_INTERP: u32 = 3;
    !table.chunks(usize::from(phentsize)).any(|h| {
        let t = [h[0], h[1], h[2], h[3]];
        (if le {
            u32::from_le_bytes(t)
        } else {
            u32::from_be_bytes(t)
        }) == PT_INTERP
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_binary_is_not_static_and_garbage_is_neither() {
        // The test binary itself is a dynamic (glibc) executable.
        assert!(!is_static(&std::env::current_exe().unwrap()));
        assert!(!is_static(Path::new("/etc/passwd")));
        assert!(!is_static(Path::new("/no/such/file")));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("short");
        std::fs::write(&f, b"\x7fELF\x02\x01").unwrap();
        assert!(!is_static(&f));
    }

    #[test]
    fn the_guest_images_agent_is_static_where_built() {
        let found = boxdesk_vmm::image::candidates(std::env::consts::ARCH)
            .into_iter()
            .map(|d| d.join("boxdesk-guest-agent"))
            .find(|p| p.exists());
        match found {
            Some(p) => assert!(is_static(&p), "{}", p.display()),
            None => println!("skipped: no guest image with boxdesk-guest-agent is built here"),
        }
    }
}
