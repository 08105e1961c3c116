//! The bwrap arguments of a container's sandbox ([`Layout`]): the bundle's
//! root bound as `/` (id-mapped when boxdesk runs as root, through the
//! staging of [`super::child`]), the container's mounts in its order, its
//! capabilities in the sandbox's own user namespace, masked and read-only
//! paths. The namespaces, the agent as PID 1, boxdesk's own seccomp
//! programs, no_new_privs and the inherited agent socket are the same as
//! every namespace sandbox's ([`super::bwrap_args`] writes those).
//!
//! The agent is not bound into the container: bwrap runs it from a
//! descriptor ([`super::EXE_FD`]'s `/proc/self/fd/N`), and the agent marks
//! every inherited descriptor close-on-exec at its start, so nothing of
//! boxdesk appears in the container's tree or reaches its processes.
//!
//! This module owns turning a layout into arguments. It must never bind a
//! host path the layout does not name, nor leave the root writable when
//! the layout says read-only.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::container::{Layout, Mount};

/// The arguments that build the container's tree, after the namespace
/// options and before the agent's command; `source(i, host)` is what bwrap
/// binds for staged source `i` (see [`super::Spec::staged_sources`]), the
/// root being `first_source` and each bind mount the next.
pub fn tree_args(
    layout: &Layout,
    first_source: usize,
    source: &dyn Fn(usize, &Path) -> PathBuf,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::with_capacity(8 + 6 * layout.mounts.len());
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(items.iter().map(|i| i.as_ref().to_owned()));
    };
    // Writable while the mounts' points are made; read-only after, if asked.
    push(&[&"--bind", &source(first_source, &layout.root), &"/"]);
    let mut next = first_source + 1;
    for m in &layout.mounts {
        match m {
            Mount::Proc { dest } => push(&[&"--proc", dest]),
            Mount::Dev { dest } => push(&[&"--dev", dest]),
            Mount::Mqueue { dest } => push(&[&"--mqueue", dest]),
            Mount::Sysfs { dest } => push(&[&"--ro-bind", &"/sys", dest]),
            Mount::Tmpfs {
                dest,
                size,
                mode,
                readonly,
            } => {
                if let Some(mode) = mode {
                    push(&[&"--perms", &format!("{mode:04o}")]);
                }
                if let Some(size) = size {
                    push(&[&"--size", &size.to_string()]);
                }
                push(&[&"--tmpfs", dest]);
                if *readonly {
                    push(&[&"--remount-ro", dest]);
                }
            }
            Mount::Bind {
                source: host,
                dest,
                writable,
            } => {
                let flag = if *writable { "--bind" } else { "--ro-bind" };
                push(&[&flag, &source(next, host), dest]);
                next += 1;
            }
        }
    }
    for path in &layout.masked {
        match host_kind(path) {
            Some(true) => push(&[&"--tmpfs", path, &"--remount-ro", path]),
            Some(false) => push(&[&"--ro-bind", &"/dev/null", path]),
            None => {}
        }
    }
    for path in &layout.readonly {
        if host_kind(path).is_some() {
            push(&[&"--ro-bind", path, path]);
        }
    }
    if !layout.root_writable {
        push(&[&"--remount-ro", &"/"]);
    }
    a
}

/// The capability options: every capability dropped, then the layout's
/// kept (in the sandbox's user namespace only).
pub fn cap_args(layout: &Layout) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["--cap-drop".into(), "ALL".into()];
    for cap in &layout.caps {
        a.push("--cap-add".into());
        a.push(cap.into());
    }
    a
}

/// The host sources a container binds, in staging order: the root (an
/// id-mapped stage, as a share's), then each bind mount's.
pub fn sources(layout: &Layout) -> Vec<(PathBuf, bool)> {
    std::iter::once((layout.root.clone(), true))
        .chain(layout.mounts.iter().filter_map(|m| match m {
            Mount::Bind { source, .. } => Some((source.clone(), true)),
            _ => None,
        }))
        .collect()
}

/// Whether a masked or read-only path (of `/proc` or `/sys`, which the
/// sandbox shares with the host's kernel) is a directory (`Some(true)`),
/// another file (`Some(false)`), or absent here (`None`: nothing to do).
fn host_kind(path: &Path) -> Option<bool> {
    std::fs::symlink_metadata(path).ok().map(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(args: &[OsString]) -> String {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn layout() -> Layout {
        Layout {
            root: "/b/rootfs".into(),
            root_writable: false,
            hostname: Some("c1".into()),
            mounts: vec![
                Mount::Proc {
                    dest: "/proc".into(),
                },
                Mount::Dev {
                    dest: "/dev".into(),
                },
                Mount::Bind {
                    source: "/h/hosts".into(),
                    dest: "/etc/hosts".into(),
                    writable: false,
                },
                Mount::Tmpfs {
                    dest: "/run".into(),
                    size: Some(65536),
                    mode: Some(0o755),
                    readonly: false,
                },
                Mount::Bind {
                    source: "/h/data".into(),
                    dest: "/data".into(),
                    writable: true,
                },
            ],
            caps: vec!["CAP_CHOWN".into(), "CAP_KILL".into()],
            masked: vec!["/proc/version".into(), "/proc/no-such-thing".into()],
            readonly: vec!["/proc/sys".into()],
            ..Layout::default()
        }
    }

    #[test]
    fn the_root_is_bound_first_mounts_follow_in_order_and_it_ends_read_only() {
        let plain = |_: usize, p: &Path| p.to_owned();
        let a = joined(&tree_args(&layout(), 1, &plain));
        assert!(
            a.starts_with("--bind /b/rootfs / --proc /proc --dev /dev"),
            "{a}"
        );
        assert!(a.contains("--ro-bind /h/hosts /etc/hosts"), "{a}");
        assert!(a.contains("--perms 0755 --size 65536 --tmpfs /run"), "{a}");
        assert!(a.contains("--bind /h/data /data"), "{a}");
        assert!(a.ends_with("--remount-ro /"), "{a}");
        assert!(a.find("/etc/hosts") < a.find("/run"), "{a}");
    }

    #[test]
    fn a_writable_root_is_never_remounted_read_only() {
        let mut l = layout();
        l.root_writable = true;
        let a = joined(&tree_args(&l, 1, &|_, p| p.to_owned()));
        assert!(!a.contains("--remount-ro / "), "{a}");
        assert!(!a.ends_with("--remount-ro /"), "{a}");
    }

    #[test]
    fn staged_sources_stand_in_for_the_root_and_each_bind_in_turn() {
        let staged = |i: usize, _: &Path| PathBuf::from(format!("/stage/{i}"));
        let a = joined(&tree_args(&layout(), 4, &staged));
        assert!(a.starts_with("--bind /stage/4 /"), "{a}");
        assert!(a.contains("--ro-bind /stage/5 /etc/hosts"), "{a}");
        assert!(a.contains("--bind /stage/6 /data"), "{a}");
        assert!(!a.contains("/b/rootfs") && !a.contains("/h/"), "{a}");
        assert_eq!(
            sources(&layout()),
            vec![
                (PathBuf::from("/b/rootfs"), true),
                ("/h/hosts".into(), true),
                ("/h/data".into(), true)
            ]
        );
    }

    #[test]
    fn masked_paths_are_covered_only_where_they_exist_and_caps_start_from_none() {
        let a = joined(&tree_args(&layout(), 1, &|_, p| p.to_owned()));
        assert!(a.contains("--ro-bind /dev/null /proc/version"), "{a}");
        assert!(!a.contains("no-such-thing"), "{a}");
        assert!(a.contains("--ro-bind /proc/sys /proc/sys"), "{a}");
        let c = joined(&cap_args(&layout()));
        assert_eq!(c, "--cap-drop ALL --cap-add CAP_CHOWN --cap-add CAP_KILL");
    }
}
