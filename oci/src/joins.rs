//! The namespaces a container joins by path (`linux.namespaces[].path`),
//! checked and, where they name another container, made to name that
//! container's sandbox.
//!
//! Engines join a pod's containers to its first one (the pause container)
//! by `/proc/<its pid>/ns/<kind>`. Here that pid is the first container's
//! monitor, a host process; its sandbox's namespaces are its agent's. So a
//! path `/proc/<pid>/ns/<kind>` whose pid is a live monitor under the same
//! runtime root becomes `/proc/<agent>/ns/<kind>`. Then every path must be
//! a namespace handle (nsfs), opened without blocking and never a device
//! or FIFO, and must not be the host's own namespace: joining that would
//! hand the container the host's network.
//!
//! This module owns that check. It must never let a container join a
//! namespace of the process that runs it.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use boxdesk_sandbox::container::Join;

use crate::state::{self, Root};

/// Why a namespace cannot be joined.
#[derive(Debug, thiserror::Error)]
#[error("linux.namespaces: {}: {why}", path.display())]
pub struct JoinError {
    /// The path given.
    pub path: PathBuf,
    /// Why.
    pub why: String,
}

const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Resolves and checks `joins` for a container under `root`.
pub fn resolve(joins: &mut [Join], root: &Root) -> Result<(), JoinError> {
    for j in joins.iter_mut() {
        let kind = match j {
            Join::Net(_) => "net",
            Join::Ipc(_) => "ipc",
            Join::Uts(_) => "uts",
        };
        let given = j.path().to_owned();
        let err = |why: String| JoinError {
            path: given.clone(),
            why,
        };
        if let Some(agent) = proc_pid(&given).and_then(|pid| monitors_agent(root, pid)) {
            let path = PathBuf::from(format!("/proc/{agent}/ns/{kind}"));
            *j = match j {
                Join::Net(_) => Join::Net(path),
                Join::Ipc(_) => Join::Ipc(path),
                Join::Uts(_) => Join::Uts(path),
            };
        }
        let path = j.path();
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        let t = meta.file_type();
        if t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket() || t.is_dir() {
            return Err(err("not a namespace".into()));
        }
        let f = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| err(e.to_string()))?;
        let fs = nix::sys::statfs::fstatfs(&f).map_err(|e| err(e.to_string()))?;
        if fs.filesystem_type().0 as i64 != NSFS_MAGIC {
            return Err(err("not a namespace".into()));
        }
        let ours =
            std::fs::metadata(format!("/proc/self/ns/{kind}")).map_err(|e| err(e.to_string()))?;
        let theirs = f.metadata().map_err(|e| err(e.to_string()))?;
        if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
            return Err(err(format!(
                "is the host's own {kind} namespace: a container never joins it"
            )));
        }
    }
    Ok(())
}

/// `PID` of a `/proc/PID/ns/...` path.
fn proc_pid(path: &Path) -> Option<i32> {
    let rest = path.strip_prefix("/proc").ok()?;
    let mut parts = rest.components();
    let pid = parts.next()?.as_os_str().to_str()?.parse().ok()?;
    (parts.next()?.as_os_str() == "ns").then_some(pid)
}

/// The agent of the live container whose monitor is `pid`, under `root`.
fn monitors_agent(root: &Root, pid: i32) -> Option<i32> {
    root.ids().into_iter().find_map(|id| {
        let r = state::read(root, &id).ok()?;
        (r.pid == pid && r.ns_pid > 0 && state::alive(r.pid, r.pid_start)).then_some(r.ns_pid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_namespace_is_never_joined() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root(dir.path().to_owned());
        let me = std::process::id();
        let mut joins = vec![Join::Net(format!("/proc/{me}/ns/net").into())];
        let e = resolve(&mut joins, &root).unwrap_err();
        assert!(e.to_string().contains("host's own net namespace"), "{e}");
    }

    #[test]
    fn a_path_that_is_not_a_namespace_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root(dir.path().to_owned());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        for p in [fifo, file, "/dev/null".into(), "/nonexistent".into()] {
            let mut joins = vec![Join::Ipc(p.clone())];
            assert!(resolve(&mut joins, &root).is_err(), "{}", p.display());
        }
    }

    #[test]
    fn a_monitors_proc_path_means_its_sandboxs_namespace() {
        assert_eq!(proc_pid(Path::new("/proc/42/ns/net")), Some(42));
        assert_eq!(proc_pid(Path::new("/proc/self/ns/net")), None);
        assert_eq!(proc_pid(Path::new("/run/netns/x")), None);
    }
}
