//! Threads for admitted connections: a job goes to an idle thread when
//! there is one (a condvar wake, no thread start on the hot path), else to
//! a new thread; a thread whose job ends waits for the next one unless
//! enough are idle already, then exits. Idle threads are few and bounded,
//! busy ones as many as the server's connection cap allows.
//!
//! This module owns the threads and nothing of what they run. It must
//! never queue a job with no thread to take it.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex};

use boxdesk_platform::sync::lock;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A small pool of reusable threads.
pub struct Workers {
    name: &'static str,
    stack: usize,
    idle_max: usize,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// Threads waiting for a job, less the jobs already queued for them.
    idle: usize,
    jobs: VecDeque<Job>,
}

impl Workers {
    /// Threads named `name` with `stack` bytes of stack; at most
    /// `idle_max` wait idle.
    pub fn new(name: &'static str, stack: usize, idle_max: usize) -> Arc<Self> {
        Arc::new(Workers {
            name,
            stack,
            idle_max,
            state: Mutex::default(),
            wake: Condvar::new(),
        })
    }

    /// Runs `job` on an idle thread, or on a new one. Fails only when a
    /// thread cannot be started (the job is dropped).
    pub fn run(self: &Arc<Self>, job: impl FnOnce() + Send + 'static) -> io::Result<()> {
        let mut state = lock(&self.state);
        if state.idle > 0 {
            state.idle -= 1;
            state.jobs.push_back(Box::new(job));
            drop(state);
            self.wake.notify_one();
            return Ok(());
        }
        drop(state);
        let pool = Arc::clone(self);
        std::thread::Builder::new()
            .name(self.name.into())
            .stack_size(self.stack)
            .spawn(move || {
                job();
                pool.serve();
            })
            .map(drop)
    }

    /// Waits for jobs and runs them, until enough threads are idle.
    fn serve(&self) {
        loop {
            let mut state = lock(&self.state);
            if state.idle + state.jobs.len() >= self.idle_max {
                return;
            }
            state.idle += 1;
            let job = loop {
                if let Some(job) = state.jobs.pop_front() {
                    break job;
                }
                state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            };
            drop(state);
            job();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_run_and_a_finished_thread_takes_the_next_job() {
        let w = Workers::new("t", 64 * 1024, 2);
        let (tx, rx) = mpsc::channel();
        for i in 0..50 {
            let tx = tx.clone();
            w.run(move || {
                tx.send((i, std::thread::current().id())).unwrap();
            })
            .unwrap();
            // Let the thread go idle, so the next job reuses it.
            std::thread::sleep(Duration::from_millis(2));
        }
        let got: Vec<_> = (0..50)
            .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
            .collect();
        let mut ids: Vec<_> = got.iter().map(|(_, id)| *id).collect();
        ids.sort_by_key(|id| format!("{id:?}"));
        ids.dedup();
        assert!(
            ids.len() <= 3,
            "{} threads for 50 sequential jobs",
            ids.len()
        );
    }

    #[test]
    fn concurrent_jobs_each_get_a_thread() {
        let w = Workers::new("t", 64 * 1024, 1);
        let (tx, rx) = mpsc::channel::<()>();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        for _ in 0..8 {
            let (tx, b) = (tx.clone(), Arc::clone(&barrier));
            w.run(move || {
                b.wait();
                tx.send(()).unwrap();
            })
            .unwrap();
        }
        for _ in 0..8 {
            rx.recv_timeout(Duration::from_secs(5)).unwrap();
        }
    }
}
