//! Whether `/dev/kvm` is a character device we can open read-write.
//!
//! Must never issue KVM ioctls: whether a VM really runs is the hypervisor
//! crate's probe, not this one.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::Probe;

/// Whether `/dev/kvm` exists, is a character device and opens `O_RDWR`;
/// a miss says which of the three failed.
pub fn dev_kvm() -> Probe {
    char_device_rw(Path::new("/dev/kvm"))
}

pub(crate) fn char_device_rw(path: &Path) -> Probe {
    let shown = path.display();
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Probe::missing(
                format!("{shown} does not exist"),
                Some(
                    "enable virtualisation in firmware (or nested virtualisation in a VM) \
                     and load kvm_intel or kvm_amd",
                ),
            )
        }
        Err(e) => return Probe::missing(format!("cannot inspect {shown}: {e}"), None),
    };
    if !meta.file_type().is_char_device() {
        return Probe::missing(format!("{shown} is not a character device"), None);
    }
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => Probe::Available {
            detail: format!("{shown} is a character device and opens read-write"),
        },
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Probe::missing(
            format!(
                "{shown} exists but uid {} cannot open it read-write",
                crate::euid()
            ),
            Some("add yourself to the kvm group (sudo usermod -aG kvm $USER) and log in again"),
        ),
        Err(e) => Probe::missing(format!("cannot open {shown} read-write: {e}"), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(probe: Probe) -> String {
        match probe {
            Probe::Missing { why, .. } => why,
            Probe::Available { detail } => panic!("unexpectedly available: {detail}"),
        }
    }

    #[test]
    fn a_missing_device_is_reported_as_not_existing() {
        let dir = tempfile::tempdir().unwrap();
        let why = why(char_device_rw(&dir.path().join("kvm")));
        assert!(why.ends_with("kvm does not exist"), "{why}");
    }

    #[test]
    fn a_regular_file_is_not_a_character_device() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let why = why(char_device_rw(file.path()));
        assert!(why.ends_with("is not a character device"), "{why}");
    }

    #[test]
    fn dev_null_counts_as_an_openable_character_device() {
        assert!(char_device_rw(Path::new("/dev/null")).is_available());
    }
}
