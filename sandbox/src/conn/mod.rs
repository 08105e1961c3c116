//! Admission to boxdesk's host servers — the helper's control socket, the
//! hybrid forwarder in front of the agent, and the cowork server: a cap on
//! concurrent connections with a clear refusal past it ([`Admission`]), the
//! deadline for a peer's first request ([`STALL_TIMEOUT`]), and one
//! rate-limited warning for a flood instead of one line per connection.
//!
//! [`lobby`] holds the connections of the two thread-per-connection
//! servers until their first request is complete — on one thread, with no
//! buffer until a byte arrives — so a flood of idle peers costs descriptors
//! and nothing else; [`workers`] are the threads connections get after
//! that; [`stall`] is the same deadline for the cowork server's tokio
//! framing; [`dial`] is the other end, a client reaching a sandbox's
//! sockets, and the error it answers with.
//!
//! This module owns counting, refusing and dropping. It must never block
//! an accept loop on a peer, log once per refused connection, or look
//! inside what a peer sends beyond finding where its first request ends.

pub mod dial;
pub mod lobby;
pub mod stall;
pub mod workers;

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boxdesk_platform::sync::lock;

/// Most connections one server holds at once (requests in progress and
/// idle peers together); the next is refused until one closes.
pub const MAX_CONNECTIONS: usize = 1024;

/// How long a peer may take to send its first complete request (a control
/// line, the hybrid preamble, a cowork frame), and how long a request it
/// has begun may take to complete. A connection idle between complete
/// requests is not stalled: each server says what idle means for it.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// At most one flood warning per server this often; the next one says how
/// many events it stands for.
pub const FLOOD_WARN_EVERY: Duration = Duration::from_secs(60);

/// A crowd of at least this many connections is a flood whose memory is
/// handed back to the system once it has thinned out ([`Admission`]).
pub const TRIM_AFTER: usize = 256;

/// The connections one server holds, and its flood log.
pub struct Admission {
    server: &'static str,
    max: usize,
    active: AtomicUsize,
    /// Most connections held since memory was last handed back.
    peak: AtomicUsize,
    /// Memory was handed back while a flood thinned; once more at zero.
    flooded: AtomicBool,
    flood: FloodLog,
}

/// One admitted connection's place under the cap, given back on drop.
pub struct Slot(Arc<Admission>);

impl Drop for Slot {
    fn drop(&mut self) {
        let a = &self.0;
        let left = a.active.fetch_sub(1, Ordering::AcqRel) - 1;
        // A flood that has thinned to a quarter of its peak, and again once
        // its last connection is gone: the allocator keeps what the crowd
        // freed (per-thread arenas) until told.
        let peak = a.peak.load(Ordering::Relaxed);
        let thinned = peak >= TRIM_AFTER
            && left <= peak / 4
            && a.peak
                .compare_exchange(peak, left, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        if thinned {
            a.flooded.store(left > 0, Ordering::Relaxed);
            release_free_memory();
        } else if left == 0 && a.flooded.swap(false, Ordering::Relaxed) {
            release_free_memory();
        }
    }
}

/// Hands the allocator's free pages back to the system (glibc keeps them
/// in its arenas otherwise); elsewhere the allocator does it on its own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() {
    // SAFETY: malloc_trim only walks and trims the allocator's own heaps;
    // it takes the arena locks itself and has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Hands the allocator's free pages back to the system (glibc keeps them
/// in its arenas otherwise); elsewhere the allocator does it on its own.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}

/// Most glibc malloc arenas for a server whose threads mostly wait on
/// sockets. By default glibc gives threads up to 8 per core, and each one
/// keeps a part of what a crowd of connection threads freed: after 900
/// relays the helper kept 3.3 MiB more than before with the default, 1.8
/// MiB with 2 (measured).
pub const MALLOC_ARENAS: i32 = 2;

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]; call once at start,
/// before threads. Elsewhere nothing to do.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn few_malloc_arenas() {
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX is a
    // valid one and any positive value is accepted.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Caps glibc's malloc arenas at [`MALLOC_ARENAS`]; call once at start,
/// before threads. Elsewhere nothing to do.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn few_malloc_arenas() {}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Slot({})", self.0.server)
    }
}

impl Admission {
    /// The admission of `server` (named in logs: `control socket`…), at
    /// most `max` connections at once.
    pub fn new(server: &'static str, max: usize) -> Arc<Self> {
        Arc::new(Admission {
            server,
            max,
            active: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            flooded: AtomicBool::new(false),
            flood: FloodLog::default(),
        })
    }

    /// A slot, or `None` past the cap (logged as a flood, rate-limited).
    pub fn try_admit(self: &Arc<Self>) -> Option<Slot> {
        let admitted = self
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            let now = self.active.load(Ordering::Relaxed);
            self.peak.fetch_max(now, Ordering::Relaxed);
            return Some(Slot(Arc::clone(self)));
        }
        self.flood(format_args!(
            "{} connections open, refusing new ones until some close",
            self.max
        ));
        None
    }

    /// Connections held now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::Acquire)
    }

    /// Logs `what` as part of a flood: at most one warning per
    /// [`FLOOD_WARN_EVERY`] for this server, counting the rest.
    pub fn flood(&self, what: fmt::Arguments<'_>) {
        self.flood.warn(self.server, what);
    }
}

/// One warning per period; the events in between are counted.
#[derive(Default)]
struct FloodLog {
    last: Mutex<Option<Instant>>,
    since: AtomicU64,
}

impl FloodLog {
    fn warn(&self, server: &str, what: fmt::Arguments<'_>) {
        let mut last = lock(&self.last);
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < FLOOD_WARN_EVERY) {
            self.since.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *last = Some(now);
        let since = self.since.swap(0, Ordering::Relaxed);
        let every = FLOOD_WARN_EVERY.as_secs();
        if since == 0 {
            tracing::warn!("{server}: {what} (a flood? logged at most once every {every} s)");
        } else {
            tracing::warn!(
                "{server}: {what} ({since} more such events since the last warning; logged at most once every {every} s)"
            );
        }
    }
}

/// Errors after which `accept` can succeed again (a peer that vanished,
/// descriptors or memory short for a moment).
pub(crate) fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::EPERM
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_admission_is_refused_until_a_slot_is_given_back() {
        let a = Admission::new("test", 2);
        let one = a.try_admit().unwrap();
        let _two = a.try_admit().unwrap();
        assert!(a.try_admit().is_none());
        assert_eq!(a.active(), 2);
        drop(one);
        assert_eq!(a.active(), 1);
        assert!(a.try_admit().is_some());
    }

    #[test]
    fn a_flood_is_one_warning_and_a_count() {
        let log = FloodLog::default();
        for _ in 0..1000 {
            log.warn("test", format_args!("refused"));
        }
        assert!(lock(&log.last).is_some());
        assert_eq!(log.since.load(Ordering::Relaxed), 999);
    }
}
