//! virtio-fs (virtio device id 26): one host directory, shared into the
//! guest under a tag, served in-process by `fuse-backend-rs`'s passthrough
//! file system behind a [`guard::Guard`] — no external `virtiofsd`, no
//! `/dev/vhost-*`. Two queues (hiprio, one request queue), no notification
//! queue, and, given one ([`Fs::with_window`]), a DAX window as
//! shared-memory region 0 ([`dax`]); the guest mounts it with
//! `mount -t virtiofs -o dax=always TAG DIR` (or without DAX).
//!
//! [`Fs::new`] opens the share and fails if it cannot be served (so a VM
//! with a bad share never starts); requests are served on the device's own
//! threads ([`worker`]), started at `DRIVER_OK` and stopped at reset.
//!
//! This module owns the device's config space and its life; what a request
//! may do is [`guard`]'s.

pub mod dax;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod guard;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::passthrough::{CachePolicy, Config, PassthroughFs};
use virtio_queue::Queue;

use self::dax::Window;
use self::guard::{Guard, Identity, Policy};
use crate::virtio::{ActivateError, Interrupt, Memory, VirtioDevice, VIRTIO_F_VERSION_1};

/// The virtio device id of a file system device.
pub const VIRTIO_ID_FS: u32 = 26;
/// The longest tag the config space holds.
pub const TAG_LEN: usize = 36;
/// The size of each queue.
pub const QUEUE_SIZE: u16 = 1024;
const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE, QUEUE_SIZE];
/// Config space: `tag[36]`, `num_request_queues` (le32).
const CONFIG_LEN: usize = TAG_LEN + 4;

/// What one virtio-fs device serves.
#[derive(Debug, Clone)]
pub struct FsShare {
    /// The tag the guest mounts it by (1 to [`TAG_LEN`] bytes, no NUL).
    pub tag: String,
    /// The host directory.
    pub root: PathBuf,
    /// What the guest may do there.
    pub policy: Policy,
    /// How long the guest may cache names and attributes.
    pub cache: Duration,
}

/// Why a share cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The tag is empty, too long or holds a NUL.
    #[error("virtio-fs tag {0:?}: 1 to 36 bytes, no NUL")]
    Tag(String),
    /// The directory cannot be served (missing, not a directory, not UTF-8).
    #[error("cannot share {}: {why}", path.display())]
    Root {
        /// The directory.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// `nobody` was asked of a server that is not root.
    #[error("serving {} as nobody needs root", .0.display())]
    Nobody(PathBuf),
}

/// The file system every device serves: the passthrough behind its guard.
pub type Served = Guard<PassthroughFs<()>>;

/// A virtio-fs device.
pub struct Fs {
    config: [u8; CONFIG_LEN],
    share: FsShare,
    server: Arc<Server<Served>>,
    window: Option<Arc<Window>>,
    workers: Option<worker::Workers>,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("share", &self.share)
            .field("active", &self.workers.is_some())
            .finish()
    }
}

impl Fs {
    /// A device serving `share`; fails when the directory cannot be served.
    pub fn new(share: FsShare) -> Result<Fs, FsError> {
        let tag = share.tag.as_bytes();
        if tag.is_empty() || tag.len() > TAG_LEN || tag.contains(&0) {
            return Err(FsError::Tag(share.tag.clone()));
        }
        let bad = |why: String| FsError::Root {
            path: share.root.clone(),
            why,
        };
        if share.policy.identity == Identity::Nobody {
            // SAFETY: geteuid cannot fail and touches no memory.
            if unsafe { libc::geteuid() } != 0 {
                return Err(FsError::Nobody(share.root.clone()));
            }
        }
        let meta = std::fs::metadata(&share.root).map_err(|e| bad(e.to_string()))?;
        if !meta.is_dir() {
            return Err(bad("not a directory".into()));
        }
        let root_dir = (share.root.to_str())
            .ok_or_else(|| bad("the path is not UTF-8".into()))?
            .to_owned();
        let fs = PassthroughFs::<()>::new(Config {
            root_dir,
            attr_timeout: share.cache,
            entry_timeout: share.cache,
            cache_policy: CachePolicy::Auto,
            writeback: false,
            xattr: false,
            do_import: true,
            inode_file_handles: false,
            ..Config::default()
        })
        .map_err(|e| bad(e.to_string()))?;
        fs.import().map_err(|e| bad(e.to_string()))?;

        let mut config = [0u8; CONFIG_LEN];
        config[..tag.len()].copy_from_slice(tag);
        config[TAG_LEN..].copy_from_slice(&1u32.to_le_bytes());
        Ok(Fs {
            config,
            server: Arc::new(Server::new(Guard::new(fs, share.policy))),
            share,
            window: None,
            workers: None,
        })
    }

    /// The device with `window` as its DAX window (the caller maps the
    /// window's region into the guest).
    pub fn with_window(mut self, window: Arc<Window>) -> Fs {
        self.window = Some(window);
        self
    }

    /// What it serves.
    pub fn share(&self) -> &FsShare {
        &self.share
    }
}

impl VirtioDevice for Fs {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_FS
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.config, offset, data);
    }

    fn activate(
        &mut self,
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != QUEUE_SIZES.len() {
            return Err(ActivateError::Queues(format!(
                "virtio-fs has {} queues, got {}",
                QUEUE_SIZES.len(),
                queues.len()
            )));
        }
        let workers = worker::Workers::start(
            mem,
            interrupt,
            queues,
            self.server.clone(),
            self.window.clone(),
            self.share.policy.identity,
            &format!("virtio-fs-{}", self.share.tag),
        )
        .map_err(|e| ActivateError::Backend(e.to_string()))?;
        self.workers = Some(workers);
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        if let Some(w) = &self.workers {
            w.notify(index);
        }
    }

    fn reset(&mut self) {
        // Joins the workers: none may touch the old rings afterwards.
        self.workers = None;
        // The next driver starts with a bare window.
        if let Some(w) = &self.window {
            w.clear();
        }
    }

    fn shm_region(&self, id: u32) -> Option<(u64, u64)> {
        // Region 0 is the cache (VIRTIO_FS_SHMCAP_ID_CACHE).
        (id == 0).then_some(self.window.as_ref()?.guest_range())
    }
}

#[cfg(test)]
mod tests;
