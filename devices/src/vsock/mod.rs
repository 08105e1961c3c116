//! virtio-vsock (device type 19) with Firecracker's hybrid Unix-socket
//! muxer: the guest's AF_VSOCK streams to CID 2 become Unix sockets on the
//! host, and host clients reach guest ports through one Unix socket.
//!
//! * [`Vsock`] — the [`VirtioDevice`]: config (`guest_cid`), features,
//!   queues rx/tx/event; it binds the host socket and starts or stops the
//!   event thread. It never touches a socket or a queue itself.
//! * `worker` — the event thread: poller, TX and RX queue processing.
//! * `muxer` — listener, `CONNECT <port>` clients, streams, RX order.
//! * `conn` — one stream: state, credit, shutdown.
//! * `packet` — the header and every guest-memory access.
//!
//! Threads: `activate` starts one thread that owns the queues, guest
//! memory and every host socket; `queue_notify` (on a vCPU thread) only
//! wakes it; `reset` and `Drop` stop and join it, closing every stream.

mod conn;
#[cfg(all(target_os = "linux", any(test, feature = "fuzzing")))]
pub mod fuzzing;
mod muxer;
mod packet;
mod worker;

use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use boxdesk_platform::socket::{self, SocketError};
use virtio_queue::{Queue, QueueT};

use crate::virtio::{ActivateError, Interrupt, Memory, VirtioDevice, VIRTIO_F_VERSION_1};

pub use conn::{BUF_ALLOC, CONNECT_TIMEOUT, SHUTDOWN_TIMEOUT};
pub use muxer::MAX_CONNECTIONS;

/// The virtio device id of vsock.
pub const DEVICE_TYPE: u32 = 19;
/// Size of each of the three queues (rx, tx, event).
pub const QUEUE_SIZE: u16 = 256;
const QUEUE_SIZES: [u16; 3] = [QUEUE_SIZE; 3];

/// Why a vsock device cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The CID is reserved (0–2) or does not fit the 32 bits guests use.
    #[error("guest cid {0} is reserved or out of range")]
    InvalidCid(u64),
    /// The host socket cannot be bound: a live server answers on it,
    /// something that is not a stale socket is there, or `bind` failed.
    #[error(transparent)]
    Socket(#[from] SocketError),
}

/// The virtio-vsock device.
#[derive(Debug)]
pub struct Vsock {
    guest_cid: u64,
    uds_path: PathBuf,
    listener: UnixListener,
    /// (device, inode) of the socket file we bound: removed on drop only
    /// if it is still ours.
    bound: Option<(u64, u64)>,
    worker: Option<worker::Worker>,
}

impl Vsock {
    /// A device for a guest with CID `guest_cid`, its host side bound at
    /// `uds_path` (`<name>.agent`, mode 0600): a stale socket there is
    /// replaced, a live one, a symlink or any other file refused
    /// (`boxdesk_platform::socket::bind_exclusive`). Host clients may connect at once; they are served
    /// once the driver activates the device.
    pub fn new(guest_cid: u64, uds_path: &Path) -> Result<Vsock, VsockError> {
        if !(3..u64::from(u32::MAX)).contains(&guest_cid) {
            return Err(VsockError::InvalidCid(guest_cid));
        }
        let listener = socket::bind_exclusive(uds_path)?;
        let bound = std::fs::symlink_metadata(uds_path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        Ok(Vsock {
            guest_cid,
            uds_path: uds_path.to_path_buf(),
            listener,
            bound,
            worker: None,
        })
    }

    /// The guest's CID.
    pub fn guest_cid(&self) -> u64 {
        self.guest_cid
    }

    /// The host socket it serves.
    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// Whether the event thread runs (the device is active and healthy or
    /// has not noticed otherwise yet).
    pub fn is_active(&self) -> bool {
        self.worker.is_some()
    }
}

impl VirtioDevice for Vsock {
    fn device_type(&self) -> u32 {
        DEVICE_TYPE
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::virtio::read_config_bytes(&self.guest_cid.to_le_bytes(), offset, data);
    }

    fn activate(
        &mut self,
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != QUEUE_SIZES.len() {
            return Err(ActivateError::Queues(format!(
                "vsock needs 3 queues, got {}",
                queues.len()
            )));
        }
        if let Some(i) = queues.iter().position(|q| !q.is_valid(&mem)) {
            return Err(ActivateError::Queues(format!("queue {i} is not usable")));
        }
        self.worker = None;
        let mut queues = queues.into_iter();
        let (Some(rx), Some(tx)) = (queues.next(), queues.next()) else {
            return Err(ActivateError::Queues("vsock needs 3 queues".into()));
        };
        let listener = self
            .listener
            .try_clone()
            .map_err(|e| ActivateError::Backend(format!("vsock listener: {e}")))?;
        let setup = worker::Setup {
            mem,
            interrupt,
            rx,
            tx,
            guest_cid: self.guest_cid,
        };
        let w = worker::Worker::spawn(setup, listener, &self.uds_path)
            .map_err(|e| ActivateError::Backend(format!("vsock event thread: {e}")))?;
        self.worker = Some(w);
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        // The event queue carries nothing from the driver.
        if index < 2 {
            if let Some(w) = &self.worker {
                w.kick();
            }
        }
    }

    fn reset(&mut self) {
        self.worker = None;
    }
}

impl Drop for Vsock {
    /// Stops the event thread and removes the host socket if it is still
    /// the one this device bound.
    fn drop(&mut self) {
        self.worker = None;
        let now = std::fs::symlink_metadata(&self.uds_path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if now.is_some() && now == self.bound {
            let _ = std::fs::remove_file(&self.uds_path);
        }
    }
}

#[cfg(test)]
mod tests;
