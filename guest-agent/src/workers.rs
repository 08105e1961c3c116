//! Session threads, kept for reuse: a connection goes to an idle worker if
//! there is one, else to a new thread; a worker waits [`IDLE`] for the next
//! connection before it exits. Creating a thread (stack mapping, clone) is
//! a visible part of a short exec's round trip. A worker first finishes
//! reading its connection's session header (the gate hands over one still
//! owing part of it only to a worker that was idle anyway). After a burst
//! of threads, memory they freed is handed back as they go.
//!
//! Owns the hand-off queue and the thread count only. It must never run
//! more than one session on a thread at a time, never hold a connection
//! while no worker is waiting for it, never start a thread for a
//! connection whose header is not in, and never lose a connection it could
//! not hand over (it goes back to the caller, who tells the peer).

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::agent::{Agent, SESSION_THREAD};
use crate::gate::Conn;

/// How long an idle worker waits for another connection.
const IDLE: Duration = Duration::from_secs(30);
/// Stack of a session thread: its buffers live on the heap.
const STACK: usize = 256 * 1024;
/// After a burst of at least this many session threads, free heap memory
/// is handed back to the system as the threads go (see [`give_back`]).
const TRIM_PEAK: usize = 64;
/// How long a thread that gives memory back waits for the threads that
/// exited just before it.
const TRIM_DELAY: Duration = Duration::from_millis(200);

/// Why a connection could not be handed to a thread.
#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    /// No thread could be created.
    #[error("cannot start a session thread: {0}")]
    Spawn(io::Error),
}

#[derive(Default)]
struct State {
    queue: VecDeque<Conn>,
    idle: usize,
    serial: u64,
    /// Session threads alive, busy or idle.
    threads: usize,
    /// Most threads alive since memory was last given back.
    peak: usize,
}

/// The session threads of one agent.
#[derive(Default)]
pub struct Workers {
    state: Mutex<State>,
    more: Condvar,
}

impl Workers {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `conn` on an idle worker or a new thread; gives it back when
    /// no thread could be started (at a task limit, say).
    pub fn dispatch(
        self: &Arc<Self>,
        conn: Conn,
        agent: &Arc<Agent>,
    ) -> Result<(), (Conn, WorkersError)> {
        let mut st = self.lock();
        if st.idle > st.queue.len() {
            st.queue.push_back(conn);
            drop(st);
            self.more.notify_one();
            return Ok(());
        }
        st.serial += 1;
        st.threads += 1;
        st.peak = st.peak.max(st.threads);
        let name = format!("{SESSION_THREAD}-{}", st.serial);
        drop(st);
        // The connection travels in a cell both sides hold, so a failed
        // spawn (which drops the closure) leaves it with us.
        let cell = Arc::new(Mutex::new(Some(conn)));
        let theirs = Arc::clone(&cell);
        let (workers, agent) = (Arc::clone(self), Arc::clone(agent));
        let spawned = std::thread::Builder::new()
            .name(name)
            .stack_size(STACK)
            .spawn(move || {
                let conn = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(conn) = conn {
                    workers.work(conn, agent);
                }
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => {
                self.lock().threads -= 1;
                match cell.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    Some(conn) => Err((conn, WorkersError::Spawn(e))),
                    None => Ok(()),
                }
            }
        }
    }

    /// Hands `conn` to a worker that is idle now, never to a new thread;
    /// gives it back when none is idle.
    pub fn hand_to_idle(&self, conn: Conn) -> Result<(), Conn> {
        let mut st = self.lock();
        if st.idle <= st.queue.len() {
            return Err(conn);
        }
        st.queue.push_back(conn);
        drop(st);
        self.more.notify_one();
        Ok(())
    }

    fn work(&self, first: Conn, agent: Arc<Agent>) {
        let mut conn = first;
        loop {
            // The connection's place under the cap is held until the
            // session is over, not while this worker waits for the next.
            let ok = conn.header_blocking();
            let (fd, slot) = conn.into_parts();
            if ok {
                crate::session::serve(fd, Arc::clone(&agent));
            } else {
                drop(fd); // now, not after waiting for the next one
            }
            drop(slot);
            match self.next() {
                Some(next) => conn = next,
                None => return,
            }
        }
    }

    /// Waits for the next connection; `None` after [`IDLE`] without one.
    fn next(&self) -> Option<Conn> {
        let mut st = self.lock();
        st.idle += 1;
        loop {
            if let Some(conn) = st.queue.pop_front() {
                st.idle -= 1;
                return Some(conn);
            }
            let (guard, wait) = self
                .more
                .wait_timeout(st, IDLE)
                .unwrap_or_else(|p| p.into_inner());
            st = guard;
            if wait.timed_out() && st.queue.is_empty() {
                st.idle -= 1;
                st.threads -= 1;
                // At each quarter of the way down from a burst's peak, and
                // once more when the last thread of a burst goes.
                let trim = st.peak >= TRIM_PEAK && st.threads * 4 <= st.peak
                    || st.peak > 1 && st.threads == 0;
                if trim {
                    st.peak = st.threads;
                }
                drop(st);
                if trim {
                    // Let the threads that went just before this one finish
                    // going: what they free on the way out is freed by then.
                    std::thread::sleep(TRIM_DELAY);
                    give_back();
                }
                return None;
            }
        }
    }
}

/// Hands free heap memory back to the system. glibc keeps what a burst of
/// threads freed (about 1.2 MiB after 1,024 idle sessions, with the one
/// arena of `limits::one_malloc_arena`) until `malloc_trim`; it runs each
/// time the session threads drop to a quarter of a burst's peak and when
/// the last one goes, so a handful of times per flood. musl's allocator
/// returns memory by itself.
fn give_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes a size and touches only the allocator's
    // own state, under its own locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
