//! What AppArmor does to user namespaces here, read and never changed:
//! whether the kernel restricts them
//! (`/proc/sys/kernel/apparmor_restrict_unprivileged_userns`), which
//! profile this process runs under (`/proc/self/attr/apparmor/current`:
//! `boxdesk (unconfined)` once boxdesk's profile attaches to this binary),
//! and whether boxdesk's profile is loaded at all
//! (`/sys/kernel/security/apparmor/profiles`, which only root may read).
//!
//! Each file has a parse function over its contents, so every answer is
//! testable without AppArmor; a file that cannot be read is "cannot tell",
//! with the reason, never a guess.

use std::fmt;
use std::io;
use std::path::Path;

use super::profile::NAME;

/// The sysctl, under `/proc/sys`.
pub const RESTRICT_KNOB: &str = "kernel/apparmor_restrict_unprivileged_userns";
/// AppArmor's list of loaded profiles, under securityfs.
pub const PROFILES: &str = "/sys/kernel/security/apparmor/profiles";
/// This process's AppArmor label.
pub const LABEL: &str = "/proc/self/attr/apparmor/current";

/// `kernel.apparmor_restrict_unprivileged_userns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restriction {
    /// 1: a user namespace made by an unconfined program has no
    /// capabilities.
    On,
    /// 0.
    Off,
    /// The kernel has no such knob (Debian's, any kernel before it).
    Absent,
    /// The knob could not be read, or held something else.
    CannotTell(String),
}

/// The knob's value from its file's contents.
pub fn parse_restriction(text: &str) -> Restriction {
    match text.trim() {
        "1" => Restriction::On,
        "0" => Restriction::Off,
        other => Restriction::CannotTell(format!("it holds {other:?}")),
    }
}

/// The knob under `proc_sys` (`/proc/sys` on a live system).
pub fn read_restriction(proc_sys: &Path) -> Restriction {
    match std::fs::read_to_string(proc_sys.join(RESTRICT_KNOB)) {
        Ok(t) => parse_restriction(&t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Restriction::Absent,
        Err(e) => Restriction::CannotTell(e.to_string()),
    }
}

impl fmt::Display for Restriction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let knob = "kernel.apparmor_restrict_unprivileged_userns";
        match self {
            Restriction::On => write!(f, "restricts user namespaces ({knob} = 1)"),
            Restriction::Off => write!(f, "does not restrict user namespaces ({knob} = 0)"),
            Restriction::Absent => write!(
                f,
                "does not restrict user namespaces on this kernel (it has no {knob})"
            ),
            Restriction::CannotTell(why) => write!(f, "{knob}: cannot tell ({why})"),
        }
    }
}

/// The AppArmor profile a process runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// No AppArmor here (not in the kernel, or not enabled).
    NoAppArmor,
    /// No profile: what the restriction applies to.
    Unconfined,
    /// A profile, and its mode (`enforce`, `complain`, `unconfined`, …).
    Profile {
        /// Its name (`boxdesk`, or a stack `a//&b`).
        name: String,
        /// Its mode.
        mode: String,
    },
    /// The label could not be read.
    CannotTell(String),
}

impl Label {
    /// Whether this is boxdesk's profile.
    pub fn is_boxdesk(&self) -> bool {
        matches!(self, Label::Profile { name, .. } if name == NAME)
    }
}

/// A label from `/proc/PID/attr/apparmor/current`'s contents
/// (`unconfined`, `boxdesk (unconfined)`).
pub fn parse_label(text: &str) -> Label {
    let t = text.trim_end_matches(['\n', '\0']).trim();
    if t == "unconfined" {
        return Label::Unconfined;
    }
    match t.rsplit_once(" (") {
        Some((name, mode)) if mode.ends_with(')') && !name.is_empty() => Label::Profile {
            name: name.to_owned(),
            mode: mode.trim_end_matches(')').to_owned(),
        },
        _ => Label::CannotTell(format!("{LABEL} holds {t:?}")),
    }
}

/// This process's label.
pub fn read_label() -> Label {
    match std::fs::read_to_string(LABEL) {
        Ok(t) => parse_label(&t),
        // No AppArmor directory under attr/ (not built in), or AppArmor
        // is not the LSM answering it.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::EINVAL) => {
            Label::NoAppArmor
        }
        Err(e) => Label::CannotTell(format!("{LABEL}: {e}")),
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Label::NoAppArmor => write!(f, "no AppArmor label"),
            Label::Unconfined => write!(f, "unconfined"),
            Label::Profile { name, mode } => write!(f, "the profile `{name}` ({mode})"),
            Label::CannotTell(why) => write!(f, "cannot tell ({why})"),
        }
    }
}

/// Whether boxdesk's profile is loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// Loaded, in this mode.
    Yes(String),
    /// Not loaded.
    No,
    /// The list could not be read (it is root's only).
    CannotTell(String),
}

/// Whether `profiles` (the contents of securityfs's `profiles`: one
/// `name (mode)` a line) lists boxdesk's profile.
pub fn parse_loaded(profiles: &str) -> Loaded {
    profiles
        .lines()
        .find_map(|l| {
            let (name, mode) = l.trim().rsplit_once(" (")?;
            (name == NAME).then(|| Loaded::Yes(mode.trim_end_matches(')').to_owned()))
        })
        .unwrap_or(Loaded::No)
}

/// Whether the profile is loaded, from the list at `profiles`.
pub fn read_loaded(profiles: &Path) -> Loaded {
    match std::fs::read_to_string(profiles) {
        Ok(t) => parse_loaded(&t),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            Loaded::CannotTell(format!("{} is readable by root only", profiles.display()))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Loaded::CannotTell(format!("no {}: AppArmor is not active", profiles.display()))
        }
        Err(e) => Loaded::CannotTell(format!("{}: {e}", profiles.display())),
    }
}

/// Everything above, for this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The knob.
    pub restriction: Restriction,
    /// This process's label.
    pub label: Label,
    /// Whether boxdesk's profile is loaded.
    pub loaded: Loaded,
}

impl Status {
    /// This machine's.
    pub fn read() -> Self {
        Status {
            restriction: read_restriction(Path::new("/proc/sys")),
            label: read_label(),
            loaded: read_loaded(Path::new(PROFILES)),
        }
    }

    /// Whether boxdesk, as `exe`, still needs its profile installed: the
    /// kernel restricts user namespaces and this binary runs under no
    /// profile.
    pub fn needs_profile(&self) -> bool {
        self.restriction == Restriction::On && self.label == Label::Unconfined
    }

    /// One line for `boxdesk doctor`: the restriction, what this binary
    /// (`exe`, its real path) runs under, whether the profile is loaded,
    /// and what to do.
    pub fn describe(&self, exe: &Path) -> String {
        let exe = exe.display();
        let fix = format!("sudo {exe} apparmor install");
        let mut s = self.restriction.to_string();
        if self.restriction != Restriction::On {
            if self.label.is_boxdesk() {
                s.push_str(&format!("; this boxdesk runs under {}", self.label));
            }
            return s;
        }
        match &self.label {
            l if l.is_boxdesk() => s.push_str(&format!(
                "; this boxdesk runs under {l}, which grants them"
            )),
            Label::Unconfined => {
                s.push_str(&format!(
                    "; this boxdesk ({exe}) runs unconfined, so its namespaces get no capabilities; "
                ));
                s.push_str(&match &self.loaded {
                    Loaded::Yes(_) => format!(
                        "the profile `{NAME}` is loaded but does not attach to {exe}: `{fix}` adds it"
                    ),
                    Loaded::No => format!("the profile `{NAME}` is not loaded: `{fix}`"),
                    Loaded::CannotTell(why) => format!(
                        "whether the profile `{NAME}` is loaded: cannot tell ({why}); either way `{fix}` attaches it"
                    ),
                });
            }
            l @ Label::Profile { .. } => s.push_str(&format!(
                "; this boxdesk runs under {l}, not boxdesk's: whether it may make user namespaces is that profile's"
            )),
            l => s.push_str(&format!("; this boxdesk's AppArmor label: {l}")),
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_knob_reads_as_on_off_or_garbled() {
        assert_eq!(parse_restriction("1\n"), Restriction::On);
        assert_eq!(parse_restriction("0\n"), Restriction::Off);
        assert_eq!(
            parse_restriction("yes\n"),
            Restriction::CannotTell("it holds \"yes\"".into())
        );
    }

    #[test]
    fn a_kernel_without_the_knob_does_not_restrict() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_restriction(d.path()), Restriction::Absent);
        std::fs::create_dir_all(d.path().join("kernel")).unwrap();
        std::fs::write(d.path().join(RESTRICT_KNOB), "1\n").unwrap();
        assert_eq!(read_restriction(d.path()), Restriction::On);
    }

    #[test]
    fn labels_read_as_unconfined_or_a_profile_and_its_mode() {
        assert_eq!(parse_label("unconfined\n"), Label::Unconfined);
        let l = parse_label("boxdesk (unconfined)\n");
        assert!(l.is_boxdesk());
        assert_eq!(
            l,
            Label::Profile {
                name: "boxdesk".into(),
                mode: "unconfined".into()
            }
        );
        assert_eq!(
            parse_label("bwrap//&unpriv_bwrap (enforce)\0"),
            Label::Profile {
                name: "bwrap//&unpriv_bwrap".into(),
                mode: "enforce".into()
            }
        );
        assert!(!parse_label("/usr/bin/boxdesk-old (enforce)").is_boxdesk());
        assert!(matches!(parse_label("???"), Label::CannotTell(_)));
    }

    #[test]
    fn the_profile_list_says_whether_boxdesk_is_loaded() {
        let list = "/usr/bin/man (enforce)\nboxdesk (unconfined)\nunprivileged_userns (enforce)\n";
        assert_eq!(parse_loaded(list), Loaded::Yes("unconfined".into()));
        assert_eq!(
            parse_loaded("boxdesk-x (enforce)\nman (enforce)\n"),
            Loaded::No
        );
        assert_eq!(parse_loaded(""), Loaded::No);
    }

    #[test]
    fn a_profile_list_that_cannot_be_read_is_cannot_tell_with_the_reason() {
        let d = tempfile::tempdir().unwrap();
        let missing = d.path().join("profiles");
        assert!(
            matches!(read_loaded(&missing), Loaded::CannotTell(why) if why.contains("not active"))
        );
        // As root the mode bits do not keep us out; the EACCES case is the
        // match arm above, its words checked through `describe`.
        let status = Status {
            restriction: Restriction::On,
            label: Label::Unconfined,
            loaded: Loaded::CannotTell(format!("{PROFILES} is readable by root only")),
        };
        let line = status.describe(Path::new("/usr/bin/boxdesk"));
        assert!(line.contains("cannot tell"), "{line}");
        assert!(line.contains("readable by root only"), "{line}");
        assert!(
            line.contains("`sudo /usr/bin/boxdesk apparmor install`"),
            "{line}"
        );
    }

    #[test]
    fn a_restricted_unconfined_boxdesk_is_told_the_one_command() {
        let status = |loaded| Status {
            restriction: Restriction::On,
            label: Label::Unconfined,
            loaded,
        };
        let exe = Path::new("/home/ann/.cargo/bin/boxdesk");
        let not_loaded = status(Loaded::No);
        assert!(not_loaded.needs_profile());
        let line = not_loaded.describe(exe);
        assert!(
            line.starts_with(
                "restricts user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1)"
            ),
            "{line}"
        );
        assert!(
            line.contains("not loaded: `sudo /home/ann/.cargo/bin/boxdesk apparmor install`"),
            "{line}"
        );
        let elsewhere = status(Loaded::Yes("unconfined".into())).describe(exe);
        assert!(
            elsewhere.contains("loaded but does not attach to /home/ann/.cargo/bin/boxdesk"),
            "{elsewhere}"
        );
    }

    #[test]
    fn a_boxdesk_under_its_profile_or_without_the_restriction_needs_nothing() {
        let attached = Status {
            restriction: Restriction::On,
            label: parse_label("boxdesk (unconfined)"),
            loaded: Loaded::CannotTell("root only".into()),
        };
        assert!(!attached.needs_profile());
        let line = attached.describe(Path::new("/usr/bin/boxdesk"));
        assert!(
            line.ends_with("runs under the profile `boxdesk` (unconfined), which grants them"),
            "{line}"
        );
        let debian = Status {
            restriction: Restriction::Absent,
            label: Label::NoAppArmor,
            loaded: Loaded::CannotTell("no AppArmor".into()),
        };
        assert!(!debian.needs_profile());
        assert_eq!(
            debian.describe(Path::new("/usr/bin/boxdesk")),
            "does not restrict user namespaces on this kernel (it has no kernel.apparmor_restrict_unprivileged_userns)"
        );
    }
}
