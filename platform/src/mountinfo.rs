//! `/proc/self/mountinfo`: its fields' octal escapes, and the mount points
//! of this process's mount namespace.
//!
//! Owns reading the text only; what a caller does with a mount point (check
//! it through a descriptor before touching it) is the caller's.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a
/// backslash); anything else is kept as it is.
pub fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The mount points in `text` (mountinfo's fifth field), in its order:
/// a mount is listed after the one it sits on.
pub fn mount_points(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(OsString::from_vec(unescape(p))))
        .collect()
}

/// This process's mount points ([`mount_points`] of its mountinfo).
pub fn own_mount_points() -> std::io::Result<Vec<PathBuf>> {
    Ok(mount_points(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_undone_and_everything_else_kept() {
        assert_eq!(unescape(r"/a\040b\134c\011d"), b"/a b\\c\td");
        assert_eq!(unescape(r"/x\04"), b"/x\\04");
        assert_eq!(unescape(r"/x\999"), b"/x\\999");
        assert_eq!(unescape(r"\777"), b"\\777");
    }

    #[test]
    fn mount_points_are_the_fifth_field_in_order() {
        let text = "22 1 0:21 / / rw - ext4 /dev/vda rw\n\
                    30 22 0:30 / /home/u/my\\040dir rw,relatime - tmpfs tmpfs rw\n\
                    31 30 0:31 /sub /home/u/my\\040dir/in rw - tmpfs tmpfs rw\n";
        assert_eq!(
            mount_points(text),
            [
                PathBuf::from("/"),
                PathBuf::from("/home/u/my dir"),
                PathBuf::from("/home/u/my dir/in")
            ]
        );
    }
}
