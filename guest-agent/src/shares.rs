//! Host folders in a VM (virtio-fs): the VMM puts one
//! `boxdesk.share=TAG:PATH:MODE` per device and `boxdesk.link=PATH:TARGET`
//! per symlink on the kernel command line (paths percent-encoded,
//! `boxdesk_platform::pathcode`). `MODE` is `rw` or `ro`, or `sys`: part of
//! the host's system as the new root (`--root host`).
//!
//! As a VM's init, after the `--rootfs` switch (which a `--root host` VM
//! never asks for), [`mount_asked`]:
//!
//! 1. with `sys` shares: a tmpfs at `/mnt/hostroot`, each `sys` share
//!    mounted read-only at its path there, the links made, `/tmp`, `/dev`,
//!    `/proc`, `/sys`, `/run` moved in and root switched — the plan and its
//!    rollback are [`crate::rootfs`]'s;
//! 2. each `rw`/`ro` share at its path (directories made as needed), in
//!    order, `nosuid,nodev`.
//!
//! Unlike a `--rootfs` failure, a share that cannot be mounted is fatal:
//! a sandbox must not start without a folder it was given (its writes
//! would go nowhere the user looks); the console line says why and the
//! host's start fails with it.

use std::path::PathBuf;

use boxdesk_platform::pathcode;

use crate::rootfs::{self, execute, under, Kernel, RootfsError, Step, MOVED};

/// The command-line parameter of one share.
pub const PARAM_SHARE: &str = "boxdesk.share";
/// The command-line parameter of one link in the new root.
pub const PARAM_LINK: &str = "boxdesk.link";
/// Where the host's system is assembled before the switch.
const HOST_ROOT: &str = "/mnt/hostroot";

/// One virtio-fs share to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The device's tag.
    pub tag: String,
    /// Where it goes (in the final root).
    pub path: PathBuf,
    /// `rw`.
    pub writable: bool,
}

/// What the command line asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asked {
    /// The host's system (`sys`), mounted before the switch of root.
    pub system: Vec<Mount>,
    /// Links in the new root.
    pub links: Vec<(PathBuf, PathBuf)>,
    /// The shares, in order.
    pub shares: Vec<Mount>,
}

/// Why the shares are not mounted.
#[derive(Debug, thiserror::Error)]
pub enum SharesError {
    /// A parameter the VMM would not have written.
    #[error("`{0}` on the kernel command line: expected TAG:PATH:rw|ro|sys or PATH:TARGET")]
    Bad(String),
    /// A step failed (what came before it was undone).
    #[error(transparent)]
    Step(#[from] RootfsError),
}

fn absolute(word: &str) -> Option<PathBuf> {
    pathcode::decode(word).filter(|p| p.is_absolute())
}

/// Reads the shares and links off a kernel command line, in order.
pub fn parse_cmdline(cmdline: &str) -> Result<Asked, SharesError> {
    let mut asked = Asked::default();
    for (name, value) in rootfs::kernel_params(cmdline) {
        let is_share = rootfs::param_is(name, PARAM_SHARE);
        if !is_share && !rootfs::param_is(name, PARAM_LINK) {
            continue;
        }
        let bad = || SharesError::Bad(format!("{name}={}", value.unwrap_or("")));
        let parts: Vec<&str> = value.unwrap_or("").split(':').collect();
        if is_share {
            let [tag, path, mode] = parts[..] else {
                return Err(bad());
            };
            let tag_ok = !tag.is_empty()
                && tag.len() <= 36
                && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            let path = absolute(path).filter(|_| tag_ok).ok_or_else(bad)?;
            let m = |writable| Mount {
                tag: tag.to_owned(),
                path,
                writable,
            };
            match mode {
                "rw" => asked.shares.push(m(true)),
                "ro" => asked.shares.push(m(false)),
                "sys" => asked.system.push(m(false)),
                _ => return Err(bad()),
            }
        } else {
            let [path, target] = parts[..] else {
                return Err(bad());
            };
            let path = absolute(path).ok_or_else(bad)?;
            let target = pathcode::decode(target).ok_or_else(bad)?;
            asked.links.push((path, target));
        }
    }
    Ok(asked)
}

/// The steps that make the host's system the root, moving those of
/// [`MOVED`] in `mounted` into it.
pub fn plan_host_root(asked: &Asked, mounted: &[&str]) -> Vec<Step> {
    let mut steps = vec![
        Step::MakeDir(HOST_ROOT.into()),
        Step::MountTmpfs(HOST_ROOT.into()),
    ];
    for m in &asked.system {
        let target = under(HOST_ROOT, &m.path.to_string_lossy());
        steps.push(Step::MakeDir(target.clone()));
        steps.push(Step::MountVirtiofs {
            tag: m.tag.clone(),
            target,
            writable: false,
            dax: false,
        });
    }
    let moved: Vec<&str> = MOVED.into_iter().filter(|m| mounted.contains(m)).collect();
    // A link in a directory moved in (NixOS's `/run/current-system`) is
    // made once that directory is in place.
    let (late, early): (Vec<_>, Vec<_>) = asked
        .links
        .iter()
        .partition(|(path, _)| moved.iter().any(|m| path.starts_with(m)));
    for (path, target) in early {
        steps.push(Step::Symlink {
            path: under(HOST_ROOT, &path.to_string_lossy()),
            target: target.clone(),
        });
    }
    for dir in moved.iter().chain(&rootfs::ENSURED).chain(&["/root"]) {
        steps.push(Step::MakeDir(under(HOST_ROOT, dir)));
    }
    for m in moved {
        steps.push(Step::MoveMount {
            from: m.into(),
            to: under(HOST_ROOT, m),
        });
    }
    for (path, target) in late {
        steps.push(Step::Symlink {
            path: under(HOST_ROOT, &path.to_string_lossy()),
            target: target.clone(),
        });
    }
    steps.push(Step::SwitchRoot(HOST_ROOT.into()));
    steps
}

/// The steps that mount the shares where they go.
pub fn plan_shares(asked: &Asked) -> Vec<Step> {
    let mut steps = Vec::new();
    for m in &asked.shares {
        steps.push(Step::MakeDir(m.path.clone()));
        steps.push(Step::MountVirtiofs {
            tag: m.tag.clone(),
            target: m.path.clone(),
            writable: m.writable,
            dax: true,
        });
    }
    steps
}

/// A VM's init, after the init mounts: switches to the host's system when
/// asked and mounts the shares; returns the share mount points (unmounted
/// at shutdown). A failure is fatal: the VM powers off with the reason on
/// the console.
pub fn mount_asked() -> Vec<PathBuf> {
    match try_mount() {
        Ok(points) => points,
        Err(e) => crate::power::fatal(&format_args!("shares: {e}"), 1),
    }
}

fn try_mount() -> Result<Vec<PathBuf>, SharesError> {
    let cmdline =
        std::fs::read("/proc/cmdline").map_err(|e| SharesError::Step(RootfsError::Cmdline(e)))?;
    let asked = parse_cmdline(&String::from_utf8_lossy(&cmdline))?;
    let mut kernel = Kernel::default();
    if !asked.system.is_empty() {
        let mounted: Vec<&str> = MOVED
            .into_iter()
            .filter(|m| crate::init::is_mounted(m))
            .collect();
        execute(&plan_host_root(&asked, &mounted), &mut kernel)?;
        log!(
            "shares: / is the host's system ({} shares)",
            asked.system.len()
        );
    }
    execute(&plan_shares(&asked), &mut kernel)?;
    Ok(asked.shares.iter().map(|m| m.path.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_links_are_read_in_order_with_their_paths_decoded() {
        let c = "console=ttyS0 boxdesk.share=fs0:/usr:sys boxdesk.link=/bin:usr/bin \
                 boxdesk.share=fs1:/mnt/My%20Docs:rw boxdesk.share=fs2:/mnt/b:ro\n";
        let a = parse_cmdline(c).unwrap();
        assert_eq!(
            a.system,
            [Mount {
                tag: "fs0".into(),
                path: "/usr".into(),
                writable: false
            }]
        );
        assert_eq!(a.links, [(PathBuf::from("/bin"), PathBuf::from("usr/bin"))]);
        let paths: Vec<_> = a
            .shares
            .iter()
            .map(|m| (m.path.clone(), m.writable))
            .collect();
        assert_eq!(
            paths,
            [
                (PathBuf::from("/mnt/My Docs"), true),
                (PathBuf::from("/mnt/b"), false)
            ]
        );
        assert_eq!(parse_cmdline("console=ttyS0").unwrap(), Asked::default());
    }

    #[test]
    fn a_share_parameter_the_vmm_would_not_write_is_an_error() {
        for bad in [
            "boxdesk.share=fs0:/mnt",
            "boxdesk.share=fs0:mnt:rw",
            "boxdesk.share=fs0:/mnt:rx",
            "boxdesk.share=:/mnt:rw",
            "boxdesk.share=f/0:/mnt:rw",
            "boxdesk.share=fs0:/a b:rw",
            "boxdesk.share",
            "boxdesk.link=/bin",
            "boxdesk.link=bin:usr/bin",
        ] {
            assert!(parse_cmdline(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_link_in_run_is_made_after_the_guests_run_is_moved_in() {
        let a = parse_cmdline(
            "boxdesk.share=fs0:/nix:sys boxdesk.link=/run/current-system:/nix/store/x-system",
        )
        .unwrap();
        let steps = plan_host_root(&a, &["/dev", "/proc", "/run"]);
        let shown: Vec<String> = steps.iter().map(ToString::to_string).collect();
        let link = shown
            .iter()
            .position(|s| s == "symlink /mnt/hostroot/run/current-system -> /nix/store/x-system")
            .expect("the link is made");
        let moved = shown
            .iter()
            .position(|s| s == "move mount /run to /mnt/hostroot/run")
            .unwrap();
        assert!(link > moved, "{shown:?}");
    }

    #[test]
    fn the_host_root_plan_mounts_the_system_then_moves_the_init_mounts_and_switches() {
        let a = parse_cmdline("boxdesk.share=fs0:/usr:sys boxdesk.link=/bin:usr/bin").unwrap();
        let steps = plan_host_root(&a, &["/dev", "/proc", "/tmp"]);
        let shown: Vec<String> = steps.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown[..4],
            [
                "mkdir /mnt/hostroot",
                "mount tmpfs at /mnt/hostroot",
                "mkdir /mnt/hostroot/usr",
                "mount virtio-fs fs0 at /mnt/hostroot/usr (read-only)",
            ]
        );
        assert_eq!(shown[4], "symlink /mnt/hostroot/bin -> usr/bin");
        assert!(shown.contains(&"move mount /tmp to /mnt/hostroot/tmp".to_owned()));
        assert!(shown.contains(&"mkdir /mnt/hostroot/work".to_owned()));
        assert_eq!(shown.last().unwrap(), "switch root to /mnt/hostroot");
    }
}
