//! The virtio-fs request path as a guest drives it, from arbitrary bytes:
//! the fuzz target `virtio_fs` (`fuzz/`) and the replay of its
//! regressions in `cargo test` both call [`run`].
//!
//! Layout of an input: byte 0 picks a read-only or writable share (bit 0),
//! how many chains are on the ring (1–4, bits 1–2) and whether the device
//! has a DAX window (bit 3: `SETUPMAPPING` maps the share's files into a
//! real reservation, chains may point into it); the rest is the ring and guest
//! memory as [`crate::virtio::fuzz_ring`] lays them out, the FUSE messages
//! in that memory. The descriptor table, the rings and the messages
//! are all the fuzzer's: every chain shape a driver can build, through the
//! real device code, over a fresh temporary directory.

use std::sync::Arc;
use std::time::Duration;

use fuse_backend_rs::api::server::Server;

use vm_memory::GuestAddress;

use super::dax::{self, Window};
use super::guard::{Guard, Identity, Policy};
use super::{worker, Fs, FsShare};
use crate::irq::CountingIrq;
use crate::virtio::{fuzz_ring, Interrupt};

/// Feeds one input through the device; panics only on a bug.
pub fn run(data: &[u8]) {
    let Some(&first) = data.first() else {
        return;
    };
    let Ok(dir) = tempfile::tempdir() else {
        return;
    };
    let _ = std::fs::write(dir.path().join("file"), b"contents\n");
    let _ = std::fs::create_dir(dir.path().join("sub"));
    let share = FsShare {
        tag: "fz".into(),
        root: dir.path().to_path_buf(),
        policy: Policy {
            writable: first & 1 == 1,
            identity: Identity::Invoker,
        },
        cache: Duration::ZERO,
    };
    let Ok(mut fs) = Fs::new(share) else {
        return;
    };
    if first & 8 != 0 {
        let Ok(window) = Window::new(GuestAddress(1 << 36), dax::MIN_WINDOW) else {
            return;
        };
        fs = fs.with_window(window);
    }
    let chains = u16::from(first >> 1) % 4 + 1;
    let Some((mem, queue)) = fuzz_ring::build(&data[1..], chains) else {
        return;
    };
    let status = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let interrupt = Interrupt::new(status.clone(), status, Arc::new(CountingIrq::default()));
    let server: Arc<Server<Guard<_>>> = fs.server.clone();
    worker::serve_here(mem, interrupt, queue, server, fs.window.clone());
}

#[cfg(test)]
mod tests {
    /// The fuzz target's saved inputs (`fuzz/regressions/virtio_fs`),
    /// replayed on every `cargo test`.
    #[test]
    fn every_saved_fuzz_input_runs_through_the_device_without_a_panic() {
        assert!(crate::virtio::fuzz_ring::replay("virtio_fs", super::run) > 0);
    }
}
