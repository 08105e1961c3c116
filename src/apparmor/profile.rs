//! boxdesk's AppArmor profile as text: the shipped file
//! (`dist/apparmor/boxdesk`, embedded) and the copy `boxdesk apparmor
//! install` writes, which is the shipped text plus one `@{boxdesk_exe} +=`
//! line naming the real paths of the binaries it was installed for.
//!
//! This module owns that text and never touches a file. It must never put
//! a path into the profile that AppArmor would read as more than that one
//! path (a glob character, a space, a variable).

use std::path::{Path, PathBuf};

/// The shipped profile, byte for byte.
pub const SHIPPED: &str = include_str!("../../dist/apparmor/boxdesk");

/// The profile's name, as `/sys/kernel/security/apparmor/profiles` and a
/// process's label show it.
pub const NAME: &str = "boxdesk";

/// The shipped list of places boxdesk is installed (`@{boxdesk_exe} = …`).
const SHIPPED_LIST: &str = "@{boxdesk_exe} = ";
/// What an install adds after it.
const ADDED_LIST: &str = "@{boxdesk_exe} += ";
/// The comment above the added line.
const ADDED_COMMENT: &str =
    "# Added by `boxdesk apparmor install`: the real paths of the boxdesk binaries it ran as.";

/// Why a path cannot go into the profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// Not an absolute path.
    #[error("{0}: not an absolute path")]
    NotAbsolute(PathBuf),
    /// A character AppArmor reads as syntax (a glob, a variable, a
    /// separator), or one that is not plain ASCII.
    #[error(
        "{path}: AppArmor would read {ch:?} in this path as more than a character; \
         install boxdesk at a plain path (such as /usr/local/bin/boxdesk) and run that one"
    )]
    Unplain {
        /// The path.
        path: PathBuf,
        /// The first character that is not plain.
        ch: char,
    },
}

/// Whether `text` is a profile boxdesk wrote (or shipped): its first line
/// is the shipped file's.
pub fn is_ours(text: &str) -> bool {
    text.lines().next() == SHIPPED.lines().next()
}

/// The paths on the `+=` lines of an installed copy, in order.
pub fn added_paths(installed: &str) -> Vec<PathBuf> {
    installed
        .lines()
        .filter_map(|l| l.strip_prefix(ADDED_LIST))
        .flat_map(str::split_whitespace)
        .map(PathBuf::from)
        .collect()
}

/// The entries of the shipped list, as written (globs and variables too).
pub fn shipped_entries() -> Vec<&'static str> {
    SHIPPED
        .lines()
        .find_map(|l| l.strip_prefix(SHIPPED_LIST))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default()
}

/// The profile attached to the shipped places and to `exes` too: each
/// path the shipped list does not already name literally is added once,
/// in order, on a `+=` line right after the list.
pub fn render(exes: &[PathBuf]) -> Result<String, ProfileError> {
    let shipped = shipped_entries();
    let mut added: Vec<&str> = Vec::new();
    for exe in exes {
        let word = plain(exe)?;
        if !shipped.contains(&word) && !added.contains(&word) {
            added.push(word);
        }
    }
    if added.is_empty() {
        return Ok(SHIPPED.to_owned());
    }
    let mut out = String::with_capacity(SHIPPED.len() + 128);
    for line in SHIPPED.split_inclusive('\n') {
        out.push_str(line);
        if line.starts_with(SHIPPED_LIST) {
            out.push_str(ADDED_COMMENT);
            out.push('\n');
            out.push_str(ADDED_LIST);
            out.push_str(&added.join(" "));
            out.push('\n');
        }
    }
    Ok(out)
}

/// `path` as one profile word: absolute, and only characters AppArmor
/// takes literally (ASCII letters, digits and `/._+-`).
fn plain(path: &Path) -> Result<&str, ProfileError> {
    if !path.is_absolute() {
        return Err(ProfileError::NotAbsolute(path.to_owned()));
    }
    let unplain = |ch| ProfileError::Unplain {
        path: path.to_owned(),
        ch,
    };
    let Some(s) = path.to_str() else {
        return Err(unplain(char::REPLACEMENT_CHARACTER));
    };
    match s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/._+-".contains(*c)))
    {
        Some(ch) => Err(unplain(ch)),
        None => Ok(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_profile_is_boxdesk_unconfined_with_the_userns_rule() {
        assert!(SHIPPED.starts_with("# boxdesk's AppArmor profile"));
        let rules: Vec<&str> = SHIPPED
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert_eq!(
            rules,
            [
                "abi <abi/4.0>,",
                "include <tunables/global>",
                "@{boxdesk_exe} = /usr/bin/boxdesk /usr/local/bin/boxdesk /opt/boxdesk/{,**/}boxdesk @{HOME}/.cargo/bin/boxdesk",
                "profile boxdesk @{boxdesk_exe} flags=(unconfined) {",
                "userns,",
                "include if exists <local/boxdesk>",
                "}",
            ]
        );
    }

    #[test]
    fn a_binary_at_a_shipped_path_leaves_the_profile_as_shipped() {
        let text = render(&[PathBuf::from("/usr/local/bin/boxdesk")]).unwrap();
        assert_eq!(text, SHIPPED);
        assert!(added_paths(&text).is_empty());
    }

    #[test]
    fn a_binary_elsewhere_is_added_once_right_after_the_shipped_list() {
        let exe = PathBuf::from("/home/ann/src/boxdesk/target/release/boxdesk");
        let text = render(&[exe.clone(), exe.clone()]).unwrap();
        assert_eq!(added_paths(&text), [exe]);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(SHIPPED_LIST))
            .unwrap();
        assert_eq!(lines[at + 1], ADDED_COMMENT);
        assert_eq!(
            lines[at + 2],
            "@{boxdesk_exe} += /home/ann/src/boxdesk/target/release/boxdesk"
        );
        assert_eq!(lines.len(), SHIPPED.lines().count() + 2);
        assert!(is_ours(&text));
    }

    #[test]
    fn paths_added_before_are_kept_in_order_with_the_new_one_after_them() {
        let first = render(&[PathBuf::from("/srv/a/boxdesk")]).unwrap();
        let mut exes = added_paths(&first);
        exes.push(PathBuf::from("/srv/b/boxdesk"));
        let second = render(&exes).unwrap();
        assert_eq!(
            added_paths(&second),
            [
                PathBuf::from("/srv/a/boxdesk"),
                PathBuf::from("/srv/b/boxdesk")
            ]
        );
    }

    #[test]
    fn a_path_with_a_glob_space_or_variable_character_is_refused() {
        for (p, ch) in [
            ("/opt/my tools/boxdesk", ' '),
            ("/opt/*/boxdesk", '*'),
            ("/opt/@{x}/boxdesk", '@'),
            ("/opt/a,b/boxdesk", ','),
            ("/opt/ünï/boxdesk", 'ü'),
        ] {
            assert_eq!(
                render(&[PathBuf::from(p)]),
                Err(ProfileError::Unplain { path: p.into(), ch }),
                "{p}"
            );
        }
        assert_eq!(
            render(&[PathBuf::from("boxdesk")]),
            Err(ProfileError::NotAbsolute("boxdesk".into()))
        );
    }

    #[test]
    fn a_profile_someone_else_wrote_is_not_taken_for_ours() {
        assert!(is_ours(SHIPPED));
        assert!(!is_ours(
            "abi <abi/4.0>,\nprofile boxdesk /usr/bin/boxdesk flags=(unconfined) { userns, }\n"
        ));
        assert!(!is_ours(""));
    }
}
