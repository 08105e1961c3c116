//! virtio-gpu, 2D only (virtio id 16): one scanout the size of the
//! sandbox's [`Screen`], the control queue and the cursor queue, served by
//! a thread of its own so a full-frame transfer never runs on a vCPU or
//! the VM's notification thread.
//!
//! Owns: the queues once activated, the request chains (readable request
//! bytes, at most [`MAX_REQUEST`], then writable response buffers) and the
//! configuration space (`events_read`, `events_clear`, `num_scanouts` = 1,
//! `num_capsets` = 0). The commands are [`protocol`]'s, their effect
//! [`state`]'s; a `RESOURCE_FLUSH` of the scanout's resource is a present.
//!
//! Must never: panic or loop on a guest's chain (a descriptor outside
//! memory, a readable one after a writable one, a request past
//! [`MAX_REQUEST`] mark the device `NEEDS_RESET` and it stops until reset);
//! read or write outside guest memory; block on the leaseholder (the
//! screen coalesces).

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod protocol;
pub mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use boxdesk_platform::screen::Screen;
use boxdesk_platform::sync::lock;
use boxdesk_platform::threads::{self, Class};
use tracing::debug;
use virtio_bindings::virtio_ids::VIRTIO_ID_GPU;
use virtio_queue::{Queue, QueueOwnedT, QueueT};

use self::protocol::{Command, Response};
use self::state::Gpu2d;
use crate::virtio::chain::{self, Limits};
use crate::virtio::{ActivateError, Interrupt, Memory, VirtioDevice, VIRTIO_F_VERSION_1};

/// Queue sizes: control, cursor.
const QUEUE_SIZES: [u16; 2] = [256, 16];
/// The largest request (an `ATTACH_BACKING` with every entry allowed).
pub const MAX_REQUEST: usize =
    protocol::HEADER_LEN + 8 + protocol::MAX_ENTRIES as usize * protocol::ENTRY_LEN;
/// Most descriptors in one chain.
const MAX_DESCRIPTORS: usize = 256;

/// What one request chain may hold: the request's bytes at most
/// [`MAX_REQUEST`]; the response buffers are only written.
const LIMITS: Limits = Limits {
    descriptors: MAX_DESCRIPTORS,
    readable: MAX_REQUEST as u64,
    total: u64::MAX,
};

/// Serves one request: the response bytes. The cursor queue's commands
/// are consumed without a response body (the cursor is not drawn).
pub fn serve(gpu: &mut Gpu2d, mem: &Memory, bytes: &[u8], cursor: bool) -> Vec<u8> {
    if cursor {
        return Vec::new();
    }
    match protocol::parse(bytes) {
        // A cursor command belongs on the cursor queue.
        Ok((h, Command::Cursor)) => Response::Unspec.encode(&h),
        Ok((h, cmd)) => gpu.execute(mem, cmd).encode(&h),
        Err(e) => {
            debug!("virtio-gpu: {e}");
            let h = protocol::parse_header(bytes).unwrap_or_default();
            Response::from(e).encode(&h)
        }
    }
}

/// What the worker thread and the device share.
struct Shared {
    mem: Memory,
    interrupt: Interrupt,
    queues: Vec<Mutex<Queue>>,
    gpu: Arc<Mutex<Gpu2d>>,
    pending: Mutex<(u32, bool)>,
    wake: Condvar,
    broken: AtomicBool,
}

impl Shared {
    /// Drains queue `index`; false once the device is broken.
    fn drain(&self, index: usize) -> bool {
        let cursor = index == 1;
        let mut queue = lock(&self.queues[index]);
        let mut used = false;
        let result = loop {
            let next = match queue.iter(&self.mem) {
                Ok(mut it) => it.next(),
                Err(e) => break Err(format!("queue: {e}")),
            };
            let Some(chain) = next else {
                break Ok(());
            };
            let walked = chain::walk(&self.mem, chain, LIMITS);
            let (chain, bytes) = match walked.and_then(|c| {
                let bytes = c.read_readable(&self.mem)?;
                Ok((c, bytes))
            }) {
                Ok(r) => r,
                Err(e) => break Err(e.to_string()),
            };
            let out = serve(&mut lock(&self.gpu), &self.mem, &bytes, cursor);
            // A response is at most a few hundred bytes.
            let n = u32::try_from(chain.respond(&self.mem, &out)).unwrap_or(u32::MAX);
            if let Err(e) = queue.add_used(&self.mem, chain.head, n) {
                break Err(format!("queue: {e}"));
            }
            used = true;
        };
        if used && queue.needs_notification(&self.mem).unwrap_or(true) {
            self.interrupt.signal_used();
        }
        match result {
            Ok(()) => true,
            Err(e) => {
                debug!("virtio-gpu: device needs reset: {e}");
                self.broken.store(true, Ordering::SeqCst);
                self.interrupt.needs_reset();
                false
            }
        }
    }
}

/// The device's thread; dropping it stops and joins the thread.
struct Worker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn notify(&self, index: u16) {
        if usize::from(index) >= self.shared.queues.len() {
            return;
        }
        lock(&self.shared.pending).0 |= 1 << index;
        self.shared.wake.notify_one();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        lock(&self.shared.pending).1 = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared) {
    loop {
        let bits = {
            let mut p = lock(&shared.pending);
            while p.0 == 0 && !p.1 {
                p = shared.wake.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            if p.1 {
                return;
            }
            std::mem::take(&mut p.0)
        };
        if shared.broken.load(Ordering::SeqCst) {
            continue;
        }
        for index in 0..shared.queues.len() {
            if bits & (1 << index) != 0 && !shared.drain(index) {
                break;
            }
        }
    }
}

/// A virtio-gpu device presenting into a [`Screen`].
pub struct Gpu {
    gpu: Arc<Mutex<Gpu2d>>,
    config: [u8; 16],
    worker: Option<Worker>,
}

impl Gpu {
    /// A device whose one scanout is `screen`.
    pub fn new(screen: Arc<Screen>) -> Self {
        let mut config = [0u8; 16];
        config[8..12].copy_from_slice(&1u32.to_le_bytes());
        Gpu {
            gpu: Arc::new(Mutex::new(Gpu2d::new(screen))),
            config,
            worker: None,
        }
    }
}

impl VirtioDevice for Gpu {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_GPU
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

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // `events_clear` (offset 4) clears bits of `events_read`; no event
        // is ever raised, so there is nothing to clear.
        debug!(
            "virtio-gpu: {}-byte config write at {offset:#x} ignored",
            data.len()
        );
    }

    fn activate(
        &mut self,
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        if queues.len() != QUEUE_SIZES.len() {
            return Err(ActivateError::Queues(format!(
                "virtio-gpu has {} queues, got {}",
                QUEUE_SIZES.len(),
                queues.len()
            )));
        }
        let shared = Arc::new(Shared {
            mem,
            interrupt,
            queues: queues.into_iter().map(Mutex::new).collect(),
            gpu: self.gpu.clone(),
            pending: Mutex::new((0, false)),
            wake: Condvar::new(),
            broken: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = threads::spawn("virtio-gpu".into(), Class::Device, move || run(&s))
            .map_err(|e| ActivateError::Backend(format!("cannot start its thread: {e}")))?;
        self.worker = Some(Worker {
            shared,
            thread: Some(thread),
        });
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        if let Some(w) = &self.worker {
            w.notify(index);
        }
    }

    fn reset(&mut self) {
        // Joins the thread: nothing touches the old rings afterwards.
        self.worker = None;
        lock(&self.gpu).reset();
    }
}

#[cfg(test)]
mod tests;
