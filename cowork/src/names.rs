//! The one check of a name the client chose that becomes a single path
//! component: a session (`/sessions/<name>`), a mount (`…/mnt/<mount>`),
//! a `readFile` process name, an SDK version.
//!
//! Session dirs and mount points used to be checked by two functions with
//! the same rules; this is both. A name is refused when it is empty, `.`
//! or `..`, holds `/` or NUL, or is longer than 255 bytes (`NAME_MAX`).
//! Anything else is a valid file name and is accepted as it is: any
//! UTF-8, a leading `.` (mounts such as `.skills`) and a leading `-` (every
//! name is opened relative to a directory descriptor, never handed to a
//! command line). This module only judges; it never touches the file
//! system.

/// Longest name in bytes (Linux's `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// Why a name is not one plain path component. The message is the reason
/// alone; callers say whose name it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("empty")]
    Empty,
    /// The name is `.` or `..`.
    #[error("dot or dot-dot")]
    Dot,
    /// The name is over [`NAME_MAX`] bytes.
    #[error("longer than 255 bytes")]
    TooLong,
    /// The name holds a `/`.
    #[error("contains a slash")]
    Slash,
    /// The name holds a NUL byte.
    #[error("contains a nul byte")]
    Nul,
}

/// Checks that `name` is one plain path component.
pub fn check(name: &str) -> Result<(), NameError> {
    match name {
        "" => Err(NameError::Empty),
        "." | ".." => Err(NameError::Dot),
        n if n.len() > NAME_MAX => Err(NameError::TooLong),
        n if n.contains('/') => Err(NameError::Slash),
        n if n.contains('\0') => Err(NameError::Nul),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_dot_and_dot_dot_are_refused() {
        assert_eq!(check(""), Err(NameError::Empty));
        assert_eq!(check("."), Err(NameError::Dot));
        assert_eq!(check(".."), Err(NameError::Dot));
    }

    #[test]
    fn a_slash_anywhere_is_refused() {
        for bad in ["/", "a/b", "/a", "a/", "../x"] {
            assert_eq!(check(bad), Err(NameError::Slash), "{bad:?}");
        }
    }

    #[test]
    fn a_nul_byte_anywhere_is_refused() {
        for bad in ["\0", "a\0b", "a\0"] {
            assert_eq!(check(bad), Err(NameError::Nul), "{bad:?}");
        }
    }

    #[test]
    fn the_length_limit_counts_bytes_not_characters() {
        check(&"x".repeat(NAME_MAX)).unwrap();
        assert_eq!(check(&"x".repeat(NAME_MAX + 1)), Err(NameError::TooLong));
        // 85 three-byte characters are 255 bytes; one more is over.
        check(&"€".repeat(85)).unwrap();
        assert_eq!(check(&"€".repeat(86)), Err(NameError::TooLong));
    }

    #[test]
    fn utf8_dots_inside_and_a_leading_dash_or_dot_are_plain_names() {
        for good in [
            "s1",
            "séance-é",
            "日本",
            "a b",
            "...",
            ".skills",
            "-rf",
            "a.b",
            "--",
        ] {
            check(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
    }

    #[test]
    fn the_reason_is_said_without_the_name() {
        assert_eq!(NameError::Slash.to_string(), "contains a slash");
        assert_eq!(NameError::TooLong.to_string(), "longer than 255 bytes");
    }
}
