//! virtio-input (device type 18): a keyboard ([`Input::keyboard`]) and an
//! absolute pointer, a tablet in pixels ([`Input::tablet`]), fed by the
//! host through an [`InputHandle`] (or both at once through [`Inputs`], the
//! control socket's [`InputSink`]).
//!
//! Owns: the configuration space (`config` — what the device advertises),
//! the event queue (0) and the status queue (1) once activated, and a
//! bounded queue of events the guest has not posted buffers for yet
//! ([`PENDING_EVENTS`]; when full, the oldest whole event + `SYN_REPORT`
//! pairs are dropped). Each accepted event reaches the guest followed by
//! a `SYN_REPORT`, in the order sent.
//!
//! No thread of its own: the host's [`InputHandle::send`] and the vCPU's
//! `queue_notify` both do their (small) work under the one mutex they
//! share, and raise the interrupt from whichever thread they are on.
//!
//! Must never: send the guest an event it was not told about (type, code
//! and range are checked first); block the sender or let the pending queue
//! grow past its bound; read or write outside guest memory; panic or loop
//! on a guest's descriptor chain. A bad chain — a descriptor outside
//! memory, a device-readable one on the event queue, a buffer shorter than
//! one event, a broken link — marks the device `NEEDS_RESET` through
//! [`Interrupt::needs_reset`], and its queues and pending events are
//! dropped until the driver resets it.

mod config;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use boxdesk_platform::screen::{InputDevice, InputError, InputEvent, InputSink, EV_SYN};
use boxdesk_platform::sync::lock;
use tracing::debug;
use virtio_bindings::virtio_ids::VIRTIO_ID_INPUT;
use virtio_bindings::virtio_input::virtio_input_event;
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

use crate::virtio::{ActivateError, Interrupt, Memory, VirtioDevice, VIRTIO_F_VERSION_1};
use config::Caps;

pub use config::{
    ABS_X, ABS_Y, BTN_EXTRA, BTN_LEFT, BTN_MIDDLE, BTN_RIGHT, BTN_SIDE, CONFIG_BYTES, EV_LED,
    EV_REP, KEY_LAST, LED_CAPSL, LED_NUML, LED_SCROLLL, REL_HWHEEL, REL_WHEEL, SYN_REPORT,
};

/// The size of each queue (event, status).
pub const QUEUE_SIZE: u16 = 64;
const QUEUE_SIZES: [u16; 2] = [QUEUE_SIZE; 2];
/// The most events held for a guest that has not posted buffers.
pub const PENDING_EVENTS: usize = 1024;
/// The bytes of one event: le16 type, le16 code, le32 value.
pub const EVENT_BYTES: usize = std::mem::size_of::<virtio_input_event>();

/// Why the device gave up on its queues (logged; the guest sees
/// `NEEDS_RESET`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum QueueError {
    /// The available ring index is beyond what the queue can hold.
    #[error("bad available ring: {0}")]
    AvailRing(String),
    /// A descriptor points outside guest memory.
    #[error("descriptor {addr:#x}+{len:#x} is outside guest memory")]
    OutsideMemory { addr: u64, len: u32 },
    /// A device-readable descriptor on the event queue.
    #[error("device-readable descriptor on the event queue")]
    ReadOnly,
    /// An event buffer shorter than one event.
    #[error("event buffer of {0} bytes is shorter than one event")]
    TooShort(u64),
    /// The chain is empty or ends early: a bad index or a loop.
    #[error("descriptor chain is empty or ends early")]
    Truncated,
    /// The used ring could not be written.
    #[error("cannot update the used ring: {0}")]
    UsedRing(String),
    /// A checked guest memory access failed.
    #[error("guest memory access failed: {0}")]
    Memory(String),
}

/// One event as the guest reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    kind: u16,
    code: u16,
    value: i32,
}

impl Event {
    const SYN_REPORT: Event = Event {
        kind: EV_SYN,
        code: SYN_REPORT,
        value: 0,
    };

    fn bytes(self) -> [u8; EVENT_BYTES] {
        let mut b = [0u8; EVENT_BYTES];
        b[0..2].copy_from_slice(&self.kind.to_le_bytes());
        b[2..4].copy_from_slice(&self.code.to_le_bytes());
        b[4..8].copy_from_slice(&self.value.to_le_bytes());
        b
    }
}

/// What the device holds between `DRIVER_OK` and reset.
struct Active {
    mem: Memory,
    interrupt: Interrupt,
    eventq: Queue,
    statusq: Queue,
}

/// The state the device and its handles share.
#[derive(Default)]
struct Shared {
    active: Option<Active>,
    /// Events not yet in a guest buffer, oldest first: whole event + SYN
    /// pairs, but for a leading SYN whose event is already delivered.
    pending: VecDeque<Event>,
    /// Event + SYN pairs dropped because the guest took none, since reset.
    dropped: u64,
    /// Why the queues were given up (until reset).
    broken: Option<QueueError>,
}

impl Shared {
    /// Queues `event` + SYN, dropping the oldest whole pairs past the bound.
    fn push(&mut self, event: Event, name: &str) {
        // A leading SYN completes a report the guest already holds part of.
        let start = usize::from(self.pending.front().is_some_and(|e| e.kind == EV_SYN));
        let mut dropped = 0u64;
        while self.pending.len() + 2 > PENDING_EVENTS && self.pending.len() >= start + 2 {
            self.pending.drain(start..start + 2);
            dropped += 1;
        }
        if dropped > 0 {
            self.dropped += dropped;
            debug!(
                "virtio-input {name}: the guest takes no events; dropped {dropped} (in all {})",
                self.dropped
            );
        }
        self.pending.push_back(event);
        self.pending.push_back(Event::SYN_REPORT);
    }

    /// Moves pending events into the guest's event buffers, in order,
    /// until either runs out.
    fn deliver(&mut self, name: &str) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let mut used_any = false;
        let result = loop {
            let Some(&event) = self.pending.front() else {
                break Ok(());
            };
            let chain = match active.eventq.iter(&active.mem) {
                Ok(mut chains) => chains.next(),
                Err(e) => break Err(QueueError::AvailRing(e.to_string())),
            };
            let Some(chain) = chain else {
                break Ok(());
            };
            let written = write_event(&active.mem, chain, event).and_then(|head| {
                active
                    .eventq
                    .add_used(&active.mem, head, EVENT_BYTES as u32)
                    .map_err(|e| QueueError::UsedRing(e.to_string()))
            });
            if let Err(e) = written {
                break Err(e);
            }
            self.pending.pop_front();
            used_any = true;
        };
        if used_any
            && active
                .eventq
                .needs_notification(&active.mem)
                .unwrap_or(true)
        {
            active.interrupt.signal_used();
        }
        if let Err(e) = result {
            self.fail(name, e);
        }
    }

    /// Completes every status chain (LED state from the guest) unread but
    /// for a debug log.
    fn drain_status(&mut self, name: &str) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let mut used_any = false;
        let result = loop {
            let chain = match active.statusq.iter(&active.mem) {
                Ok(mut chains) => chains.next(),
                Err(e) => break Err(QueueError::AvailRing(e.to_string())),
            };
            let Some(chain) = chain else {
                break Ok(());
            };
            let done = read_status(&active.mem, chain, name).and_then(|head| {
                active
                    .statusq
                    .add_used(&active.mem, head, 0)
                    .map_err(|e| QueueError::UsedRing(e.to_string()))
            });
            if let Err(e) = done {
                break Err(e);
            }
            used_any = true;
        };
        if used_any
            && active
                .statusq
                .needs_notification(&active.mem)
                .unwrap_or(true)
        {
            active.interrupt.signal_used();
        }
        if let Err(e) = result {
            self.fail(name, e);
        }
    }

    /// Gives up the queues: `NEEDS_RESET` until the driver resets.
    fn fail(&mut self, name: &str, e: QueueError) {
        debug!("virtio-input {name}: device needs reset: {e}");
        if let Some(active) = self.active.take() {
            active.interrupt.needs_reset();
        }
        self.pending.clear();
        self.broken = Some(e);
    }

    fn reset(&mut self) {
        *self = Shared::default();
    }
}

/// One checked, contiguous guest buffer.
#[derive(Debug, Clone, Copy)]
struct Segment {
    addr: GuestAddress,
    len: u64,
}

/// Walks `chain`, checking every descriptor lies in guest memory (and, on
/// the event queue, is device-writable); returns the head and segments.
fn walk(
    mem: &Memory,
    chain: DescriptorChain<&Memory>,
    writable_only: bool,
) -> Result<(u16, Vec<Segment>), QueueError> {
    let head = chain.head_index();
    let mut segs = Vec::new();
    // An empty chain "ends early" too.
    let mut last_has_next = true;
    // The iterator stops after a queue's worth of descriptors (a loop).
    for desc in chain {
        last_has_next = desc.has_next();
        if writable_only && !desc.is_write_only() {
            return Err(QueueError::ReadOnly);
        }
        let (addr, len) = (desc.addr(), desc.len());
        if len == 0 {
            continue;
        }
        if !mem.check_range(addr, len as usize) {
            return Err(QueueError::OutsideMemory { addr: addr.0, len });
        }
        segs.push(Segment {
            addr,
            len: u64::from(len),
        });
    }
    if last_has_next {
        return Err(QueueError::Truncated);
    }
    Ok((head, segs))
}

/// Writes `event` at the start of the device-writable `chain`; returns its head.
fn write_event(
    mem: &Memory,
    chain: DescriptorChain<&Memory>,
    event: Event,
) -> Result<u16, QueueError> {
    let (head, segs) = walk(mem, chain, true)?;
    let total: u64 = segs.iter().map(|s| s.len).sum();
    if total < EVENT_BYTES as u64 {
        return Err(QueueError::TooShort(total));
    }
    let bytes = event.bytes();
    let mut done = 0usize;
    for seg in segs {
        if done == bytes.len() {
            break;
        }
        let n = (bytes.len() - done).min(usize::try_from(seg.len).unwrap_or(usize::MAX));
        mem.write_slice(&bytes[done..done + n], seg.addr)
            .map_err(|e| QueueError::Memory(e.to_string()))?;
        done += n;
    }
    Ok(head)
}

/// Checks a status chain and logs the event at its start; returns its head.
fn read_status(
    mem: &Memory,
    chain: DescriptorChain<&Memory>,
    name: &str,
) -> Result<u16, QueueError> {
    let (head, segs) = walk(mem, chain, false)?;
    let mut bytes = [0u8; EVENT_BYTES];
    let mut done = 0usize;
    for seg in segs {
        if done == bytes.len() {
            break;
        }
        let n = (bytes.len() - done).min(usize::try_from(seg.len).unwrap_or(usize::MAX));
        mem.read_slice(&mut bytes[done..done + n], seg.addr)
            .map_err(|e| QueueError::Memory(e.to_string()))?;
        done += n;
    }
    if done == bytes.len() {
        let [t0, t1, c0, c1, v @ ..] = bytes;
        debug!(
            "virtio-input {name}: status type {} code {} value {}",
            u16::from_le_bytes([t0, t1]),
            u16::from_le_bytes([c0, c1]),
            i32::from_le_bytes(v)
        );
    }
    Ok(head)
}

/// A virtio-input device: a keyboard or a tablet.
pub struct Input {
    caps: Arc<Caps>,
    shared: Arc<Mutex<Shared>>,
    select: u8,
    subsel: u8,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Input")
            .field("device", &self.caps.device)
            .field("select", &self.select)
            .field("subsel", &self.subsel)
            .finish_non_exhaustive()
    }
}

impl Input {
    fn new(caps: Caps) -> Input {
        Input {
            caps: Arc::new(caps),
            shared: Arc::new(Mutex::new(Shared::default())),
            select: 0,
            subsel: 0,
        }
    }

    /// A keyboard ("boxdesk keyboard"): key codes 1..=[`KEY_LAST`], the
    /// guest's own key repeat, the NumLock, CapsLock and ScrollLock LEDs.
    pub fn keyboard() -> Input {
        Input::new(Caps::keyboard())
    }

    /// A tablet ("boxdesk tablet") over a `width` x `height` screen:
    /// `ABS_X` in `0..width` and `ABS_Y` in `0..height` (pixels), buttons
    /// left, right, middle, side and extra, the two wheels.
    pub fn tablet(width: u32, height: u32) -> Input {
        Input::new(Caps::tablet(width, height))
    }

    /// The host's side of this device; it keeps working once the device is
    /// boxed into its transport.
    pub fn handle(&self) -> InputHandle {
        InputHandle {
            caps: Arc::clone(&self.caps),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl VirtioDevice for Input {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_INPUT
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &QUEUE_SIZES
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let cfg = self.caps.config_space(self.select, self.subsel);
        crate::virtio::read_config_bytes(&cfg, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        for (i, &b) in data.iter().enumerate() {
            match offset.checked_add(i as u64) {
                Some(0) => self.select = b,
                Some(1) => self.subsel = b,
                _ => debug!("virtio-input: config write at {offset:#x}+{i} ignored"),
            }
        }
    }

    fn activate(
        &mut self,
        mem: Memory,
        interrupt: Interrupt,
        queues: Vec<Queue>,
    ) -> Result<(), ActivateError> {
        let count = queues.len();
        let mut queues = queues.into_iter();
        let (Some(eventq), Some(statusq), None) = (queues.next(), queues.next(), queues.next())
        else {
            return Err(ActivateError::Queues(format!(
                "virtio-input has two queues, got {count}"
            )));
        };
        let mut shared = lock(&self.shared);
        shared.reset();
        shared.active = Some(Active {
            mem,
            interrupt,
            eventq,
            statusq,
        });
        Ok(())
    }

    fn queue_notify(&mut self, index: u16) {
        let name = self.caps.short_name();
        let mut shared = lock(&self.shared);
        match index {
            0 => shared.deliver(name),
            1 => shared.drain_status(name),
            _ => debug!("virtio-input {name}: notify of queue {index} ignored"),
        }
    }

    fn reset(&mut self) {
        lock(&self.shared).reset();
        self.select = 0;
        self.subsel = 0;
    }
}

/// The host's side of one [`Input`] device: sends it events. Cheap to
/// clone; every clone feeds the same device.
#[derive(Clone)]
pub struct InputHandle {
    caps: Arc<Caps>,
    shared: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for InputHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputHandle")
            .field("device", &self.caps.device)
            .finish_non_exhaustive()
    }
}

impl InputHandle {
    /// Which device this is.
    pub fn device(&self) -> InputDevice {
        self.caps.device
    }

    /// Sends one event, followed by a `SYN_REPORT`, to the guest — now if
    /// it has posted buffers, else when it does (the oldest held events
    /// are dropped past [`PENDING_EVENTS`]). Never blocks on the guest.
    ///
    /// Refused, with nothing sent: a type or code the device does not
    /// advertise (`EV_SYN` included: the device adds the `SYN_REPORT`) —
    /// [`InputError::Unsupported`]; a key value other than 0, 1, 2 or an
    /// absolute value outside its axis — [`InputError::Value`]; any event
    /// while the driver has not started the device, or after it was reset
    /// or broken (also when this very send met the bad chain) —
    /// [`InputError::NotReady`].
    pub fn send(&self, kind: u16, code: u16, value: i32) -> Result<(), InputError> {
        self.caps.check(kind, code, value)?;
        let name = self.caps.short_name();
        let mut shared = lock(&self.shared);
        if shared.active.is_none() {
            return Err(InputError::NotReady);
        }
        shared.push(Event { kind, code, value }, name);
        shared.deliver(name);
        // A bad chain met on the way broke the device: the event is lost.
        if shared.active.is_none() {
            return Err(InputError::NotReady);
        }
        Ok(())
    }
}

/// A sandbox's keyboard and tablet as one [`InputSink`]: each event goes
/// to the handle its [`InputEvent::device`] names.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The keyboard's handle ([`InputDevice::Keyboard`]).
    pub keyboard: InputHandle,
    /// The tablet's handle ([`InputDevice::Pointer`]).
    pub pointer: InputHandle,
}

impl InputSink for Inputs {
    fn send(&self, event: InputEvent) -> Result<(), InputError> {
        let handle = match event.device {
            InputDevice::Keyboard => &self.keyboard,
            InputDevice::Pointer => &self.pointer,
        };
        handle.send(event.kind, event.code, event.value)
    }
}

#[cfg(test)]
mod tests;
