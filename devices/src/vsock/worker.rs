//! The vsock device's event thread: one `mio::Poll` over the muxer's
//! listener and host sockets plus a waker that the vCPU side pokes on
//! every queue notification. Each turn it drains the TX queue into the
//! muxer and fills RX buffers from it.
//!
//! The thread owns the virtqueues and guest memory while the device is
//! active; nothing else touches them. It never blocks on anything but the
//! poller. A malformed chain or ring ends it after `needs_reset()`.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use boxdesk_platform::threads::{self, Class};
use mio::{Events, Poll, Token, Waker};
use virtio_queue::{Queue, QueueOwnedT, QueueT};

use super::muxer::{Muxer, LISTENER};
use super::packet::{read_tx, ChainError, RxBuffer, TxRead, MAX_PAYLOAD};
use crate::virtio::{Interrupt, Memory};

const WAKER: Token = Token(0);

/// Why the event thread gave up on the driver.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A descriptor chain is unusable.
    #[error("bad descriptor chain")]
    Chain(#[from] ChainError),
    /// A ring is unusable (index past the queue size, memory).
    #[error("bad virtqueue")]
    Queue(#[from] virtio_queue::Error),
}

/// What the event thread needs.
#[derive(Debug)]
pub struct Setup {
    /// Guest memory.
    pub mem: Memory,
    /// The device's interrupt.
    pub interrupt: Interrupt,
    /// The RX queue (device → guest).
    pub rx: Queue,
    /// The TX queue (guest → device).
    pub tx: Queue,
    /// The guest's CID.
    pub guest_cid: u64,
}

/// A running event thread.
#[derive(Debug)]
pub struct Worker {
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread, serving `listener` (bound at `uds_path`).
    pub fn spawn(
        setup: Setup,
        listener: std::os::unix::net::UnixListener,
        uds_path: &Path,
    ) -> io::Result<Worker> {
        let (mut ev, waker) = EventLoop::new(setup, listener, uds_path)?;
        let stop = ev.stop.clone();
        let handle = threads::spawn("vsock".into(), Class::Device, move || ev.run())?;
        Ok(Worker {
            waker,
            stop,
            handle: Some(handle),
        })
    }

    /// Wakes the thread: a queue has news.
    pub fn kick(&self) {
        if let Err(e) = self.waker.wake() {
            tracing::warn!("vsock: cannot wake the event thread: {e}");
        }
    }
}

impl Drop for Worker {
    /// Stops the thread and waits for it; its connections close with it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kick();
        if let Some(h) = self.handle.take() {
            if h.join().is_err() {
                tracing::error!("vsock: the event thread panicked");
            }
        }
    }
}

/// The event loop: the poller, the muxer, the queues.
pub(super) struct EventLoop {
    poll: Poll,
    muxer: Muxer,
    mem: Memory,
    interrupt: Interrupt,
    rx: Queue,
    tx: Queue,
    stop: Arc<AtomicBool>,
    /// One TX packet's payload.
    payload: Vec<u8>,
    /// One RX packet's payload.
    scratch: Vec<u8>,
    /// The last TX pass stopped at its limit: poll without sleeping.
    more_tx: bool,
}

impl EventLoop {
    /// The loop over `listener` (bound at `uds_path`) and the waker that
    /// interrupts its poll.
    pub(super) fn new(
        setup: Setup,
        listener: std::os::unix::net::UnixListener,
        uds_path: &Path,
    ) -> io::Result<(EventLoop, Arc<Waker>)> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let muxer = Muxer::new(
            setup.guest_cid,
            uds_path,
            listener,
            poll.registry().try_clone()?,
        )?;
        let ev = EventLoop {
            poll,
            muxer,
            mem: setup.mem,
            interrupt: setup.interrupt,
            rx: setup.rx,
            tx: setup.tx,
            stop: Arc::new(AtomicBool::new(false)),
            payload: Vec::with_capacity(MAX_PAYLOAD),
            scratch: vec![0u8; MAX_PAYLOAD],
            more_tx: false,
        };
        Ok((ev, waker))
    }

    fn run(&mut self) {
        let mut events = Events::with_capacity(256);
        loop {
            let timeout = if self.more_tx {
                Some(Duration::ZERO)
            } else {
                self.muxer
                    .next_deadline()
                    .map(|d| d.saturating_duration_since(Instant::now()))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("vsock: poll failed, event thread stops: {e}");
                return;
            }
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            if let Err(e) = self.turn(&events, Instant::now()) {
                tracing::warn!(
                    "vsock: {}; the device needs a reset",
                    boxdesk_platform::report::chain(&e)
                );
                self.interrupt.needs_reset();
                return;
            }
        }
    }

    /// One turn after a poll: host sockets, expired deadlines, then the
    /// guest's TX chains and RX buffers.
    pub(super) fn turn(&mut self, events: &Events, now: Instant) -> Result<(), WorkerError> {
        for ev in events.iter() {
            match ev.token() {
                WAKER => {}
                LISTENER => self.muxer.accept(now),
                _ => self.muxer.on_event(ev, now),
            }
        }
        self.muxer.expire(now);
        self.process_tx(now)?;
        self.process_rx(now)
    }

    /// Polls without waiting, then takes one [`EventLoop::turn`] (the fuzz
    /// target's step: `super::fuzzing`).
    #[cfg(all(target_os = "linux", any(test, feature = "fuzzing")))]
    pub(super) fn poll_once(
        &mut self,
        events: &mut Events,
        now: Instant,
    ) -> Result<(), WorkerError> {
        // A failed poll is an empty one here: the turn still runs.
        let _ = self.poll.poll(events, Some(Duration::ZERO));
        self.turn(events, now)
    }

    /// Hands available TX chains to the muxer, at most one queue's worth
    /// per turn so that RX and host sockets get their turn too.
    fn process_tx(&mut self, now: Instant) -> Result<(), WorkerError> {
        let mut used = false;
        let mut budget = self.tx.size();
        self.more_tx = false;
        loop {
            if budget == 0 {
                self.more_tx = true;
                break;
            }
            budget -= 1;
            let Some(chain) = self.tx.iter(&self.mem)?.next() else {
                break;
            };
            let head = chain.head_index();
            match read_tx(&self.mem, chain, &mut self.payload)? {
                TxRead::Packet(hdr) => self.muxer.on_guest(&hdr, &self.payload, now),
                TxRead::Rejected(hdr) => {
                    tracing::debug!("vsock: rejected a packet with len {}", hdr.len);
                    self.muxer.reject(&hdr);
                }
                TxRead::Unreadable => {
                    tracing::debug!("vsock: dropped a packet shorter than its header")
                }
            }
            self.tx.add_used(&self.mem, head, 0)?;
            used = true;
        }
        if used && self.tx.needs_notification(&self.mem)? {
            self.interrupt.signal_used();
        }
        Ok(())
    }

    /// Fills RX buffers while the muxer has packets.
    fn process_rx(&mut self, now: Instant) -> Result<(), WorkerError> {
        let mut used = false;
        while self.muxer.has_pending_rx() {
            let Some(chain) = self.rx.iter(&self.mem)?.next() else {
                break;
            };
            let head = chain.head_index();
            let buf = RxBuffer::from_chain(&self.mem, chain)?;
            let Some(hdr) = self
                .muxer
                .next_packet(buf.payload_capacity(), &mut self.scratch, now)
            else {
                // Nothing after all: the buffer goes back for next time.
                self.rx.set_next_avail(self.rx.next_avail().wrapping_sub(1));
                break;
            };
            let payload = self
                .scratch
                .get(..hdr.len as usize)
                .ok_or(ChainError::Memory)?;
            let len = buf.write(&self.mem, &hdr, payload)?;
            self.rx.add_used(&self.mem, head, len)?;
            used = true;
        }
        if used && self.rx.needs_notification(&self.mem)? {
            self.interrupt.signal_used();
        }
        Ok(())
    }
}
