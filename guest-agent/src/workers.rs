//! Session threads, kept for reuse: a connection goes to an idle worker if
//! there is one, else to a new thread; a worker waits [`IDLE`] for the next
//! connection before it exits. Creating a thread (stack mapping, clone, a
//! fresh malloc arena) is a visible part of a short exec's round trip.
//!
//! Owns the hand-off queue only. It must never run more than one session
//! on a thread at a time, and never hold a connection while no worker is
//! waiting for it.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::agent::{Agent, SESSION_THREAD};

/// How long an idle worker waits for another connection.
const IDLE: Duration = Duration::from_secs(30);
/// Stack of a session thread: its buffers live on the heap.
const STACK: usize = 256 * 1024;

/// Why a connection could not be handed to a thread.
#[derive(Debug, thiserror::Error)]
pub enum WorkersError {
    /// No thread could be created.
    #[error("cannot start a session thread: {0}")]
    Spawn(io::Error),
}

#[derive(Default)]
struct State {
    queue: VecDeque<OwnedFd>,
    idle: usize,
    serial: u64,
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

    /// Serves `conn` on an idle worker or a new thread.
    pub fn dispatch(
        self: &Arc<Self>,
        conn: OwnedFd,
        agent: &Arc<Agent>,
    ) -> Result<(), WorkersError> {
        let mut st = self.lock();
        if st.idle > st.queue.len() {
            st.queue.push_back(conn);
            drop(st);
            self.more.notify_one();
            return Ok(());
        }
        st.serial += 1;
        let name = format!("{SESSION_THREAD}-{}", st.serial);
        drop(st);
        let (workers, agent) = (Arc::clone(self), Arc::clone(agent));
        std::thread::Builder::new()
            .name(name)
            .stack_size(STACK)
            .spawn(move || workers.work(conn, agent))
            .map(drop)
            .map_err(WorkersError::Spawn)
    }

    fn work(&self, first: OwnedFd, agent: Arc<Agent>) {
        let mut conn = first;
        loop {
            crate::session::serve(conn, Arc::clone(&agent));
            match self.next() {
                Some(next) => conn = next,
                None => return,
            }
        }
    }

    /// Waits for the next connection; `None` after [`IDLE`] without one.
    fn next(&self) -> Option<OwnedFd> {
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
                return None;
            }
        }
    }
}
