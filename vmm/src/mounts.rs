//! Host folders in a VM: the virtio-fs devices a VM gets for its shares and
//! for `--root host`, and the agent's command-line contract for mounting
//! them (read by the agent's `shares` module):
//!
//! * `boxdesk.share=TAG:PATH:MODE` — mount virtio-fs `TAG` at `PATH`;
//!   `MODE` is `rw`, `ro`, or `sys`: part of the new root (`--root host`),
//!   read-only, mounted before the agent switches root;
//! * `boxdesk.link=PATH:TARGET` — a symlink in the new root (a merged-/usr
//!   host's `/bin -> usr/bin`).
//!
//! `PATH` and `TARGET` are percent-encoded (`boxdesk_platform::pathcode`),
//! so spaces, colons and quotes survive the kernel's parameter splitting. Tags are `fs0`, `fs1`, … in device order.
//!
//! `--root host` shares the host's system as
//! [`boxdesk_sandbox::host_system`] says (`/usr`, `/etc`, the `/bin`,
//! `/sbin`, `/lib*` that are directories, `/opt`, `/nix`, `/snap`; links
//! recreated); read-only, cached for an hour, served as `nobody` when the
//! VMM is root; and copies of the host's `/etc` files whose links would
//! dangle in the guest ([`VmMounts::etc_copies`]). It is refused when
//! the host's `/bin/sh` is not the guest's arch.

use std::path::{Path, PathBuf};
use std::time::Duration;

use boxdesk_platform::pathcode::encode;
use boxdesk_sandbox::host_system::{self, HostEntry, Placement};

#[cfg(target_os = "linux")]
use boxdesk_devices::fs::{
    guard::{Identity, Policy},
    FsShare,
};

/// Why a VM on this host cannot have shares (no virtio-fs server here).
pub const NO_SERVER: &str = "host folders in a VM (--share, --root host) need boxdesk's virtio-fs \
     server, which runs on Linux hosts only: it needs Linux's O_PATH and /proc/self/fd";

/// How long the guest caches names and attributes of a share.
pub const SHARE_CACHE: Duration = Duration::from_secs(1);
/// The same for the host's system under `--root host` (it rarely changes
/// while a sandbox runs; an upgrade on the host shows within the hour).
pub const SYSTEM_CACHE: Duration = Duration::from_secs(3600);

/// A host directory in a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmShare {
    /// The host directory.
    pub host: PathBuf,
    /// Where the guest mounts it (absolute).
    pub guest: PathBuf,
    /// Whether the guest may write.
    pub writable: bool,
}

/// What the guest's `/` is made of besides the initramfs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmMounts {
    /// The host's system as the guest's root (`--root host`).
    pub system: Vec<PathBuf>,
    /// Symlinks in that root: (path, target).
    pub links: Vec<(PathBuf, PathBuf)>,
    /// Shares, in mount order (after the switch of root, if any).
    pub shares: Vec<VmShare>,
}

/// Why `--root host` cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum MountsError {
    /// The host's system is not the guest's arch.
    #[error("--root host needs a {want} host system, but /bin/sh is {found}")]
    Arch {
        /// The guest's arch.
        want: &'static str,
        /// What the host's `/bin/sh` is.
        found: String,
    },
    /// A system dir could not be read.
    #[error("--root host: cannot read {}: {error}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
}

impl VmMounts {
    /// The guest root of the host's system under `root` (`/` but in tests),
    /// for a guest of `arch` (`std::env::consts::ARCH` names): the entries
    /// of [`host_system::scan`], the one rule the namespace backend follows
    /// too. A link in `/run` (NixOS's profile links) is made once the
    /// guest's own `/run` is in place.
    pub fn host_root(root: &Path, arch: &'static str) -> Result<VmMounts, MountsError> {
        check_arch(&root.join("bin/sh"), arch)?;
        let entries = host_system::scan(root).map_err(|error| MountsError::Read {
            path: root.to_owned(),
            error,
        })?;
        let mut m = VmMounts::default();
        for e in entries {
            match e {
                HostEntry::Dir(p) => m.system.push(root.join(p.strip_prefix("/").unwrap_or(&p))),
                HostEntry::Symlink { path, target } => m.links.push((path, target)),
            }
        }
        Ok(m)
    }

    /// The shares that give a `--root host` guest regular copies of
    /// the host's `/etc` files whose links would dangle there (its `/run`
    /// is its own: systemd-resolved's and NetworkManager's resolv.conf),
    /// written into `dir` now: a guest's copy is the host's at its start.
    /// A copy that would have to be bound as a single file (its directory
    /// is `/run` itself or shared) is left out: a VM shares directories.
    pub fn etc_copies(root: &Path, dir: &Path) -> Result<Vec<VmShare>, MountsError> {
        let read = |error| MountsError::Read {
            path: root.join("etc"),
            error,
        };
        let entries = host_system::scan(root).map_err(read)?;
        let copies = host_system::etc_copies(root, &entries, None);
        let files = host_system::EtcFiles::prepare(root, dir, &entries, copies).map_err(read)?;
        let mut shares = Vec::new();
        for p in files.placements() {
            match p {
                Placement::Dir { host, inside } => shares.push(VmShare {
                    host: host.clone(),
                    guest: inside.clone(),
                    writable: false,
                }),
                Placement::File { inside, .. } => tracing::warn!(
                    "{}: a VM shares directories, so its copy of the host's file is not placed there",
                    inside.display()
                ),
            }
        }
        Ok(shares)
    }

    /// For each share, the index among the shares of the one whose device
    /// it uses: its own, or that of the first share of the same host
    /// directory and mode. One device (one server, one inode table) per
    /// directory keeps the guest's views of it consistent: the guest mounts
    /// the same tag again, which shares the first mount's superblock.
    fn share_devices(&self) -> Vec<usize> {
        let mut first = Vec::with_capacity(self.shares.len());
        for (i, s) in self.shares.iter().enumerate() {
            let same = self.shares[..i]
                .iter()
                .position(|e| e.host == s.host && e.writable == s.writable);
            first.push(same.unwrap_or(i));
        }
        first
    }

    /// Each share's tag: `fs<n>`, numbered over the devices in order
    /// (system dirs, then one per distinct share).
    fn share_tags(&self) -> Vec<String> {
        let devices = self.share_devices();
        let mut tags: Vec<String> = Vec::with_capacity(devices.len());
        let mut next = self.system.len();
        for (i, &d) in devices.iter().enumerate() {
            if d == i {
                tags.push(format!("fs{next}"));
                next += 1;
            } else {
                let tag = tags[d].clone();
                tags.push(tag);
            }
        }
        tags
    }

    /// The devices' shares, tagged `fs0`… in order: system dirs, then one
    /// per distinct share.
    #[cfg(target_os = "linux")]
    pub fn fs_shares(&self) -> Vec<FsShare> {
        // SAFETY: geteuid cannot fail and touches no memory.
        let root = unsafe { libc::geteuid() } == 0;
        let system = self.system.iter().map(|host| {
            (
                host.clone(),
                Policy {
                    writable: false,
                    identity: if root {
                        Identity::Nobody
                    } else {
                        Identity::Invoker
                    },
                },
                SYSTEM_CACHE,
            )
        });
        let devices = self.share_devices();
        let shares = (self.shares.iter().enumerate())
            .filter(|&(i, _)| devices[i] == i)
            .map(|(_, s)| {
                (
                    s.host.clone(),
                    Policy {
                        writable: s.writable,
                        identity: Identity::Invoker,
                    },
                    SHARE_CACHE,
                )
            });
        system
            .chain(shares)
            .enumerate()
            .map(|(i, (root, policy, cache))| FsShare {
                tag: format!("fs{i}"),
                root,
                policy,
                cache,
            })
            .collect()
    }

    /// The agent's part of the kernel command line (each parameter after a
    /// space).
    pub fn agent_args(&self) -> String {
        let mut out = String::new();
        for (tag, host) in self.system.iter().enumerate() {
            // The guest path of a system dir is its host path under `/`.
            let guest = Path::new("/").join(host.file_name().unwrap_or_default());
            out.push_str(&format!(" boxdesk.share=fs{tag}:{}:sys", encode(&guest)));
        }
        for (path, target) in &self.links {
            out.push_str(&format!(
                " boxdesk.link={}:{}",
                encode(path),
                encode(target)
            ));
        }
        for (s, tag) in self.shares.iter().zip(self.share_tags()) {
            let mode = if s.writable { "rw" } else { "ro" };
            out.push_str(&format!(" boxdesk.share={tag}:{}:{mode}", encode(&s.guest)));
        }
        out
    }

    /// Whether there is nothing to mount.
    pub fn is_empty(&self) -> bool {
        self.system.is_empty() && self.links.is_empty() && self.shares.is_empty()
    }
}

/// Checks that the ELF at `sh` (followed) is for `arch`.
fn check_arch(sh: &Path, arch: &'static str) -> Result<(), MountsError> {
    use std::io::Read;
    let mut head = [0u8; 20];
    std::fs::File::open(sh)
        .and_then(|mut f| f.read_exact(&mut head))
        .map_err(|error| MountsError::Read {
            path: sh.to_path_buf(),
            error,
        })?;
    let found = if &head[..4] != b"\x7fELF" {
        "not an ELF file".to_owned()
    } else {
        match u16::from_le_bytes([head[18], head[19]]) {
            62 => "x86_64".to_owned(),
            183 => "aarch64".to_owned(),
            3 => "x86 (32-bit)".to_owned(),
            40 => "arm (32-bit)".to_owned(),
            m => format!("ELF machine {m}"),
        }
    };
    if found == arch {
        Ok(())
    } else {
        Err(MountsError::Arch { want: arch, found })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_args_name_every_share_in_device_order() {
        let m = VmMounts {
            system: vec!["/usr".into(), "/etc".into()],
            links: vec![("/bin".into(), "usr/bin".into())],
            shares: vec![
                VmShare {
                    host: "/h/a".into(),
                    guest: "/mnt/a b".into(),
                    writable: true,
                },
                VmShare {
                    host: "/h/b".into(),
                    guest: "/mnt/b".into(),
                    writable: false,
                },
            ],
        };
        assert_eq!(
            m.agent_args(),
            " boxdesk.share=fs0:/usr:sys boxdesk.share=fs1:/etc:sys boxdesk.link=/bin:usr/bin \
             boxdesk.share=fs2:/mnt/a%20b:rw boxdesk.share=fs3:/mnt/b:ro"
        );
        #[cfg(target_os = "linux")]
        {
            let tags: Vec<_> = m.fs_shares().into_iter().map(|s| s.tag).collect();
            assert_eq!(tags, ["fs0", "fs1", "fs2", "fs3"]);
            let shares = m.fs_shares();
            assert!(!shares[0].policy.writable && shares[2].policy.writable);
            assert!(!shares[3].policy.writable);
        }
    }

    #[test]
    fn two_shares_of_one_directory_and_mode_are_one_device_mounted_twice() {
        let share = |host: &str, guest: &str, writable| VmShare {
            host: host.into(),
            guest: guest.into(),
            writable,
        };
        let m = VmMounts {
            system: vec!["/usr".into()],
            links: Vec::new(),
            shares: vec![
                share("/h/s", "/sessions", true),
                share("/h/home", "/home/u", true),
                share("/h/s", "/work", true),
                share("/h/s", "/ro", false),
            ],
        };
        assert_eq!(
            m.agent_args(),
            " boxdesk.share=fs0:/usr:sys boxdesk.share=fs1:/sessions:rw \
             boxdesk.share=fs2:/home/u:rw boxdesk.share=fs1:/work:rw boxdesk.share=fs3:/ro:ro"
        );
        #[cfg(target_os = "linux")]
        {
            let devices: Vec<_> = (m.fs_shares().into_iter())
                .map(|s| (s.tag, s.root, s.policy.writable))
                .collect();
            assert_eq!(
                devices,
                [
                    ("fs0".to_owned(), PathBuf::from("/usr"), false),
                    ("fs1".to_owned(), PathBuf::from("/h/s"), true),
                    ("fs2".to_owned(), PathBuf::from("/h/home"), true),
                    ("fs3".to_owned(), PathBuf::from("/h/s"), false),
                ]
            );
        }
    }

    #[test]
    fn host_root_shares_the_system_dirs_and_recreates_merged_usr_links() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("usr/bin")).unwrap();
        std::fs::create_dir_all(r.join("etc")).unwrap();
        std::fs::copy("/bin/sh", r.join("usr/bin/sh")).unwrap();
        std::os::unix::fs::symlink("usr/bin", r.join("bin")).unwrap();
        std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
        let m = VmMounts::host_root(r, std::env::consts::ARCH).unwrap();
        assert_eq!(m.system, vec![r.join("usr"), r.join("etc")]);
        assert_eq!(
            m.links,
            vec![
                (PathBuf::from("/bin"), PathBuf::from("usr/bin")),
                (PathBuf::from("/lib"), PathBuf::from("usr/lib")),
            ]
        );
    }

    #[test]
    fn host_root_is_refused_when_the_hosts_sh_is_another_arch() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("bin")).unwrap();
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[18..20].copy_from_slice(&183u16.to_le_bytes());
        std::fs::write(root.path().join("bin/sh"), &elf).unwrap();
        let e = VmMounts::host_root(root.path(), "x86_64").unwrap_err();
        assert_eq!(
            e.to_string(),
            "--root host needs a x86_64 host system, but /bin/sh is aarch64"
        );
        assert!(VmMounts::host_root(root.path(), "aarch64").is_ok());
    }
}
