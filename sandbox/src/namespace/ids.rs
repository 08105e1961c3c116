//! Who root inside a namespace sandbox is on the host.
//!
//! Every namespace sandbox has its own user namespace in which its
//! processes are uid and gid 0, with no capabilities. Outside, that root
//! is the invoking user when boxdesk runs as a user, and an unprivileged
//! *subordinate* id when boxdesk runs as root — never the host's root, so
//! a file the sandbox writes, a process it runs and every permission check
//! it meets on the host are those of a nobody.
//!
//! The subordinate id is the first id of the `boxdesk` entries in
//! `/etc/subuid` and `/etc/subgid` when an administrator set them (the
//! same files podman and shadow's `useradd` use), else [`DEFAULT_SUBID`].
//! This module must never hand out id 0 as the outside id of a sandbox.

use std::fmt;
use std::path::Path;

/// The outside uid and gid of a root-started sandbox when `/etc/subuid`
/// and `/etc/subgid` name none for `boxdesk`: `0x70000000`, above the
/// ranges systemd hands to containers (`0x80000–0x6FFFFFFF`) and below its
/// own special ids, and far from any login user's.
pub const DEFAULT_SUBID: u32 = 0x7000_0000;

/// The user whose `/etc/subuid` and `/etc/subgid` entries are used.
pub const SUBID_USER: &str = "boxdesk";

/// Root inside the sandbox is `uid`/`gid` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    /// The host uid of root inside.
    pub uid: u32,
    /// The host gid of root inside.
    pub gid: u32,
    /// Whether the helper runs as root and must become `uid`/`gid` before
    /// it starts bubblewrap (which then maps them to 0 inside).
    pub drop_from_root: bool,
}

impl IdMap {
    /// The map for a sandbox this process starts: its own real ids, or the
    /// subordinate ones when it runs as root.
    pub fn for_this_process() -> Self {
        // SAFETY: these getters cannot fail and touch no memory.
        let (euid, uid, gid) = unsafe { (libc::geteuid(), libc::getuid(), libc::getgid()) };
        if euid == 0 {
            let uid = first_subid(Path::new("/etc/subuid")).unwrap_or(DEFAULT_SUBID);
            let gid = first_subid(Path::new("/etc/subgid")).unwrap_or(DEFAULT_SUBID);
            IdMap {
                uid,
                gid,
                drop_from_root: true,
            }
        } else {
            IdMap {
                uid,
                gid,
                drop_from_root: false,
            }
        }
    }
}

impl fmt::Display for IdMap {
    /// `uid 0:1879048192:1 gid 0:1879048192:1`: inside, outside, count.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid 0:{}:1 gid 0:{}:1", self.uid, self.gid)
    }
}

/// The first id of the [`SUBID_USER`] range in a subuid/subgid file, if
/// it names one that is not 0.
fn first_subid(file: &Path) -> Option<u32> {
    parse_subid(&std::fs::read_to_string(file).ok()?)
}

fn parse_subid(text: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (user, start, count) = (f.next()?, f.next()?, f.next()?);
        let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
        (user == SUBID_USER && start != 0 && count > 0).then_some(start)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boxdesk_entry_of_a_subid_file_gives_the_outside_id() {
        let text = "alice:100000:65536\nboxdesk:300000:65536\n";
        assert_eq!(parse_subid(text), Some(300_000));
        assert_eq!(parse_subid("alice:100000:65536\n"), None);
        assert_eq!(parse_subid("boxdesk:0:65536\n"), None, "never host root");
        assert_eq!(parse_subid("boxdesk:5:0\nboxdesk:x:1\n"), None);
    }

    #[test]
    fn root_maps_to_a_subordinate_id_and_a_user_to_itself() {
        let ids = IdMap::for_this_process();
        // SAFETY: getters without preconditions.
        let (euid, uid) = unsafe { (libc::geteuid(), libc::getuid()) };
        if euid == 0 {
            assert!(ids.drop_from_root);
            assert_ne!(ids.uid, 0);
            assert_ne!(ids.gid, 0);
        } else {
            assert!(!ids.drop_from_root);
            assert_eq!(ids.uid, uid);
        }
        assert!(ids.to_string().starts_with("uid 0:"), "{ids}");
    }
}
