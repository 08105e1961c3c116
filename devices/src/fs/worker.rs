//! The threads serving one virtio-fs device: a small pool shared by its
//! two queues (hiprio, then the request queue), so a vCPU's `QueueNotify`
//! only sets a bit and wakes a thread — no FUSE request ever runs on a
//! vCPU thread — and a slow request (a big write, a cold directory) holds
//! up one worker, not the share.
//!
//! A worker takes one chain off a queue under that queue's lock, wakes
//! another worker when more are waiting, serves the request without any
//! lock held and puts the reply on the used ring. A request the FUSE
//! server fails on gets an `EIO` reply (the guest sees an error for that
//! request, the device goes on); a chain outside guest memory or a ring
//! the driver broke marks the device `NEEDS_RESET`, as every device here
//! does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use boxdesk_platform::sync::lock;
use boxdesk_platform::threads::{self, Class};
use fuse_backend_rs::abi::fuse_abi::{InHeader, Opcode, OutHeader};
use fuse_backend_rs::api::server::Server;
use fuse_backend_rs::transport::{FsCacheReqHandler, Reader, VirtioFsWriter};
use tracing::debug;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestMemory};

use super::dax::{Requests, Window};
use super::guard::{Identity, NOBODY};
use super::Served;
use crate::virtio::{Interrupt, Memory};

/// Worker threads per device.
pub const WORKERS: usize = 4;

/// What the workers share.
struct Shared {
    mem: Memory,
    interrupt: Interrupt,
    queues: Vec<Mutex<Queue>>,
    server: Arc<Server<Served>>,
    window: Option<Arc<Window>>,
    state: Mutex<State>,
    wake: Condvar,
    broken: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Queues notified and not yet found empty, one bit each.
    pending: u32,
    stop: bool,
}

/// A running pool; dropping it stops and joins its threads.
pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts [`WORKERS`] threads serving `queues` (at most 32) with
    /// `server`, as `identity`.
    pub fn start(
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
        server: Arc<Server<Served>>,
        window: Option<Arc<Window>>,
        identity: Identity,
        name: &str,
    ) -> std::io::Result<Workers> {
        let shared = Arc::new(Shared {
            mem,
            interrupt,
            queues: queues.into_iter().map(Mutex::new).collect(),
            server,
            window,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            broken: AtomicBool::new(false),
        });
        let mut workers = Workers {
            shared: shared.clone(),
            threads: Vec::new(),
        };
        for i in 0..WORKERS {
            let shared = shared.clone();
            let thread = threads::spawn(format!("{name}-{i}"), Class::FileServer, move || {
                if identity == Identity::Nobody {
                    if let Err(e) = become_nobody() {
                        debug!("virtio-fs: cannot serve as nobody: {e}");
                        shared.broken.store(true, Ordering::SeqCst);
                        shared.interrupt.needs_reset();
                        return;
                    }
                }
                run(&shared)
            })?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// The driver notified queue `index`.
    pub fn notify(&self, index: u16) {
        if usize::from(index) >= self.shared.queues.len() {
            return;
        }
        lock(&self.shared.state).pending |= 1 << index;
        self.shared.wake.notify_one();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Serves every chain on `queue` on the calling thread, the same way a
/// worker does (the fuzz target's path); whether the device broke.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn serve_here(
    mem: Memory,
    interrupt: Interrupt,
    queue: Queue,
    server: Arc<Server<Served>>,
    window: Option<Arc<Window>>,
) -> bool {
    let shared = Shared {
        mem,
        interrupt,
        queues: vec![Mutex::new(queue)],
        server,
        window,
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        broken: AtomicBool::new(false),
    };
    serve(&shared, 0);
    shared.broken.load(Ordering::SeqCst)
}

/// Drops the calling thread (only: raw syscalls, not libc's process-wide
/// wrappers) to `nobody`, supplementary groups included.
fn become_nobody() -> std::io::Result<()> {
    let keep = u32::MAX; // -1: leave that id as it is
    for (nr, args) in [
        (libc::SYS_setgroups, [0, 0, 0]),
        (libc::SYS_setresgid, [keep, NOBODY, keep]),
        (libc::SYS_setresuid, [keep, NOBODY, keep]),
    ] {
        // SAFETY: these take integers (setgroups: a count of 0 and a null
        // list) and change only this thread's credentials.
        let r = unsafe {
            libc::syscall(
                nr,
                libc::c_long::from(args[0] as i32),
                libc::c_long::from(args[1] as i32),
                libc::c_long::from(args[2] as i32),
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn run(shared: &Shared) {
    loop {
        let queue = {
            let mut state = lock(&shared.state);
            loop {
                if state.stop {
                    return;
                }
                if state.pending != 0 {
                    let q = state.pending.trailing_zeros();
                    state.pending &= !(1 << q);
                    break q as usize;
                }
                state = shared.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        };
        serve(shared, queue);
    }
}

/// Serves queue `q` until it is empty or the device broke.
fn serve(shared: &Shared, q: usize) {
    while !shared.broken.load(Ordering::SeqCst) {
        let (chain, more) = {
            let mut queue = lock(&shared.queues[q]);
            let chain = match queue.iter(&shared.mem) {
                Ok(mut avail) => avail.next(),
                Err(e) => return broke(shared, &format!("available ring: {e}")),
            };
            // Whether the driver has made more available than this one.
            let more = queue
                .avail_idx(&shared.mem, std::sync::atomic::Ordering::Acquire)
                .map_or(true, |idx| idx.0 != queue.next_avail());
            (chain, more)
        };
        let Some(chain) = chain else {
            return;
        };
        // More are waiting: let another worker take the next. (Waking one
        // for nothing costs a thread switch per request.)
        if more {
            lock(&shared.state).pending |= 1 << q;
            shared.wake.notify_one();
        }

        let head = chain.head_index();
        let Some(len) = handle(shared, chain) else {
            return broke(shared, "a descriptor outside guest memory");
        };
        let mut queue = lock(&shared.queues[q]);
        if let Err(e) = queue.add_used(&shared.mem, head, len) {
            drop(queue);
            return broke(shared, &format!("used ring: {e}"));
        }
        if queue.needs_notification(&shared.mem).unwrap_or(true) {
            shared.interrupt.signal_used();
        }
    }
}

/// Serves one request; the length of the reply written, `None` when the
/// chain itself is bad. A request the server fails on is answered `EIO`
/// where it expects an answer, so no guest process waits for a reply that
/// will not come.
fn handle(shared: &Shared, chain: DescriptorChain<&Memory>) -> Option<u32> {
    let (Ok(reader), Ok(writer)) = (
        Reader::from_descriptor_chain(&shared.mem, chain.clone()),
        VirtioFsWriter::new(&shared.mem, chain.clone()),
    ) else {
        return window_fault(shared, chain);
    };
    let mut window = shared.window.clone().map(Requests);
    let window = window.as_mut().map(|w| w as &mut dyn FsCacheReqHandler);
    match shared
        .server
        .handle_message(reader, writer.into(), window, None)
    {
        Ok(n) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        Err(e) => {
            debug!("virtio-fs: a request that could not be served: {e}");
            Some(reply_error(&shared.mem, chain, libc::EIO))
        }
    }
}

/// A chain whose data buffers lie in the device's DAX window (direct I/O
/// from or into a DAX mapping of a share's file), where the server does
/// not reach: that request gets `EFAULT` and the device goes on. `None`
/// (the device breaks) when a buffer is neither in RAM nor in the window,
/// or the header or the reply's place is not in RAM.
fn window_fault(shared: &Shared, chain: DescriptorChain<&Memory>) -> Option<u32> {
    let window = shared.window.as_ref()?;
    let (mut header, mut reply) = (None, None);
    for d in chain.clone() {
        let in_ram = shared.mem.check_range(d.addr(), d.len() as usize);
        if !in_ram && !window.contains(d.addr().0, u64::from(d.len())) {
            return None;
        }
        let first = if d.is_write_only() {
            &mut reply
        } else {
            &mut header
        };
        if first.is_none() {
            *first = Some((d, in_ram));
        }
    }
    let (head, true) = header? else { return None };
    if (head.len() as usize) < std::mem::size_of::<InHeader>() {
        return None;
    }
    let inh: InHeader = shared.mem.read_obj(head.addr()).ok()?;
    if inh.opcode == Opcode::Forget as u32 || inh.opcode == Opcode::BatchForget as u32 {
        return Some(0);
    }
    let (out, true) = reply? else { return None };
    let len = std::mem::size_of::<OutHeader>() as u32;
    if out.len() < len {
        return None;
    }
    let header = OutHeader {
        len,
        error: -libc::EFAULT,
        unique: inh.unique,
    };
    shared.mem.write_obj(header, out.addr()).ok()?;
    Some(len)
}

/// Writes a bare FUSE error reply (`errno`) for the request on `chain`;
/// the bytes written: none for a request without a reply (`FORGET`,
/// `BATCH_FORGET`) or one whose header cannot be read.
fn reply_error(mem: &Memory, chain: DescriptorChain<&Memory>, errno: i32) -> u32 {
    let Ok(mut reader) = Reader::from_descriptor_chain(mem, chain.clone()) else {
        return 0;
    };
    let Ok(inh) = reader.read_obj::<InHeader>() else {
        return 0;
    };
    if inh.opcode == Opcode::Forget as u32 || inh.opcode == Opcode::BatchForget as u32 {
        return 0;
    }
    let Ok(mut writer) = VirtioFsWriter::new(mem, chain) else {
        return 0;
    };
    let out = OutHeader {
        len: std::mem::size_of::<OutHeader>() as u32,
        error: -errno,
        unique: inh.unique,
    };
    match writer.write_obj(out) {
        Ok(()) => out.len,
        Err(_) => 0,
    }
}

fn broke(shared: &Shared, why: &str) {
    if !shared.broken.swap(true, Ordering::SeqCst) {
        debug!("virtio-fs: device needs reset: {why}");
        shared.interrupt.needs_reset();
    }
}
