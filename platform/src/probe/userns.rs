//! Whether unprivileged user namespaces can be made, which the namespace
//! backend needs whoever runs it: every sandbox has one, and a root-started
//! one is made by bwrap running as the sandbox's unprivileged subordinate
//! id.
//!
//! Must never write a sysctl: it reads `/proc/sys` and says which knob
//! is in the way.

use super::Probe;

/// Whether unprivileged user namespaces are usable, from
/// `user.max_user_namespaces`, `kernel.unprivileged_userns_clone` (Debian)
/// and `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu), for any
/// user root included (root's sandboxes are made by an unprivileged id).
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn user_namespaces() -> Probe {
    linux::userns_in(std::path::Path::new("/proc/sys"), crate::euid())
}

/// User namespaces are a Linux feature.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn user_namespaces() -> Probe {
    Probe::missing("user namespaces exist only on Linux", None)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
mod linux {
    use std::fs;
    use std::io;
    use std::path::Path;

    use super::Probe;

    const MAX: &str = "user/max_user_namespaces";
    const CLONE: &str = "kernel/unprivileged_userns_clone";
    const APPARMOR: &str = "kernel/apparmor_restrict_unprivileged_userns";

    /// The probe against a `/proc/sys`-shaped tree at `proc_sys`.
    pub(crate) fn userns_in(proc_sys: &Path, euid: u32) -> Probe {
        let knob = |rel| read_knob(&proc_sys.join(rel));
        let max = match knob(MAX) {
            Ok(max) => max,
            Err(why) => return Probe::missing(why, None),
        };
        match max {
            None => {
                return Probe::missing(
                    format!(
                        "this kernel has no user namespaces (no {})",
                        proc_sys.join(MAX).display()
                    ),
                    Some("use a kernel built with CONFIG_USER_NS"),
                )
            }
            Some(0) => {
                return Probe::missing(
                    "user namespaces are disabled (user.max_user_namespaces = 0)",
                    Some("sudo sysctl -w user.max_user_namespaces=15000"),
                )
            }
            Some(_) => {}
        }
        let (clone, apparmor) = match (knob(CLONE), knob(APPARMOR)) {
            (Ok(c), Ok(a)) => (c, a),
            (Err(why), _) | (_, Err(why)) => return Probe::missing(why, None),
        };
        if clone == Some(0) {
            return Probe::missing(
                "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)",
                Some("sudo sysctl -w kernel.unprivileged_userns_clone=1"),
            );
        }
        if apparmor == Some(1) {
            return Probe::missing(
                "unprivileged user namespaces are restricted by AppArmor \
                 (kernel.apparmor_restrict_unprivileged_userns = 1): one made by a program \
                 without a profile granting `userns` has no capabilities",
                Some(
                    "sudo boxdesk apparmor install (boxdesk's profile, for boxdesk and the bwrap \
                     it starts), or sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 \
                     (for every program)",
                ),
            );
        }
        Probe::Available {
            detail: format!(
                "unprivileged user namespaces allowed (user.max_user_namespaces = {}){}",
                max.unwrap_or_default(),
                if euid == 0 {
                    "; as root, sandboxes are made by their unprivileged subordinate id"
                } else {
                    ""
                }
            ),
        }
    }

    /// A numeric sysctl: `Ok(None)` when the knob does not exist on this kernel.
    fn read_knob(path: &Path) -> Result<Option<u64>, String> {
        let text = match fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        text.trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{} holds {:?}, not a number", path.display(), text.trim()))
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::path::PathBuf;

        /// A fake `/proc/sys` holding the given knobs.
        fn proc_sys(knobs: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
            let dir = tempfile::tempdir().unwrap();
            for (rel, value) in knobs {
                let path = dir.path().join(rel);
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(&path, format!("{value}\n")).unwrap();
            }
            let root = dir.path().to_owned();
            (dir, root)
        }

        fn why(probe: Probe) -> String {
            match probe {
                Probe::Missing { why, .. } => why,
                Probe::Available { detail } => panic!("unexpectedly available: {detail}"),
            }
        }

        #[test]
        fn max_user_namespaces_of_zero_means_unavailable() {
            let (_d, root) = proc_sys(&[(MAX, "0")]);
            assert!(why(userns_in(&root, 1000)).contains("max_user_namespaces = 0"));
        }

        #[test]
        fn unprivileged_userns_clone_of_zero_means_unavailable_for_a_user() {
            let (_d, root) = proc_sys(&[(MAX, "63704"), (CLONE, "0")]);
            assert!(why(userns_in(&root, 1000)).contains("unprivileged_userns_clone = 0"));
        }

        #[test]
        fn an_apparmor_restriction_is_named_as_such() {
            let (_d, root) = proc_sys(&[(MAX, "63704"), (CLONE, "1"), (APPARMOR, "1")]);
            assert!(why(userns_in(&root, 1000)).contains("restricted by AppArmor"));
        }

        #[test]
        fn root_needs_unprivileged_user_namespaces_too() {
            let (_d, root) = proc_sys(&[(MAX, "63704"), (CLONE, "0")]);
            assert!(why(userns_in(&root, 0)).contains("unprivileged_userns_clone = 0"));
            let (_d, root) = proc_sys(&[(MAX, "63704")]);
            assert!(userns_in(&root, 0).is_available());
        }

        #[test]
        fn absent_debian_and_ubuntu_knobs_leave_user_namespaces_available() {
            let (_d, root) = proc_sys(&[(MAX, "63704")]);
            let probe = userns_in(&root, 1000);
            assert_eq!(
                probe,
                Probe::Available {
                    detail:
                        "unprivileged user namespaces allowed (user.max_user_namespaces = 63704)"
                            .into()
                }
            );
        }

        #[test]
        fn a_kernel_without_max_user_namespaces_has_no_user_namespaces() {
            let (_d, root) = proc_sys(&[]);
            assert!(why(userns_in(&root, 1000)).contains("no user namespaces"));
        }

        #[test]
        fn a_garbled_knob_is_reported_with_its_contents() {
            let (_d, root) = proc_sys(&[(MAX, "lots")]);
            assert!(why(userns_in(&root, 1000)).contains("\"lots\", not a number"));
        }
    }
}
