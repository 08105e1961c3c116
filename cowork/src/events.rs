//! One profile's event stream: a bounded queue between the processes that
//! emit events and the one subscriber connection that delivers them.
//!
//! Every event goes through the queue, subscriber or not, so one code path
//! gives replay (events emitted while nobody is subscribed wait here, in
//! order) and back-pressure (when the queue is full, output producers wait
//! in [`Events::push_output`] — the process blocks on its pipe — instead of
//! anything being dropped). Exit, error and status events are always
//! queued. An event leaves the queue only after it was written to a
//! subscriber's socket in full, so a subscriber that drops loses nothing
//! the next one will not get.
//!
//! This module owns ordering and the caps. It never drops an event.

use boxdesk_platform::sync::lock;
use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

/// Events held for a profile before output producers have to wait.
pub const MAX_EVENTS: usize = 1024;
/// Bytes held for a profile before output producers have to wait.
pub const MAX_BYTES: usize = 4 << 20;
/// Events written to the socket per batch.
const BATCH: usize = 64;

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Bytes>,
    bytes: usize,
}

impl Queue {
    fn has_room(&self) -> bool {
        // An empty queue always takes one event, however large, so a
        // single big event cannot wedge its producer.
        self.items.is_empty() || (self.items.len() < MAX_EVENTS && self.bytes < MAX_BYTES)
    }
}

/// A profile's queued events and its current subscriber.
#[derive(Debug, Default)]
pub struct Events {
    queue: Mutex<Queue>,
    /// Woken when an event is queued.
    queued: Notify,
    /// Woken when events leave the queue.
    room: Notify,
    /// Held while a subscriber writes, so two never interleave.
    drain: tokio::sync::Mutex<()>,
    /// The task serving the current subscriber.
    subscriber: Mutex<Option<AbortHandle>>,
}

impl Events {
    /// Queues an event that must never wait or be dropped (exit, error,
    /// status). `frame` is a whole frame, length prefix included.
    pub fn push(&self, frame: Bytes) {
        let mut q = lock(&self.queue);
        q.bytes += frame.len();
        q.items.push_back(frame);
        drop(q);
        self.queued.notify_one();
    }

    /// Queues an output event, first waiting while the queue is full.
    pub async fn push_output(&self, frame: Bytes) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut q = lock(&self.queue);
                if q.has_room() {
                    q.bytes += frame.len();
                    q.items.push_back(frame);
                    drop(q);
                    self.queued.notify_one();
                    return;
                }
            }
            room.await;
        }
    }

    /// Events waiting for a subscriber, and their bytes.
    pub fn backlog(&self) -> (usize, usize) {
        let q = lock(&self.queue);
        (q.items.len(), q.bytes)
    }

    /// Makes `task` the subscriber, ending the previous one.
    pub fn replace_subscriber(&self, task: AbortHandle) {
        if let Some(old) = lock(&self.subscriber).replace(task) {
            old.abort();
        }
    }

    /// Writes queued events to `out`, oldest first, until writing fails.
    /// Each event is removed once it was written whole.
    pub async fn deliver<W: AsyncWrite + Unpin>(&self, out: &mut W) -> std::io::Result<()> {
        let mut batch: Vec<Bytes> = Vec::with_capacity(BATCH);
        loop {
            let queued = self.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            let guard = self.drain.lock().await;
            batch.clear();
            batch.extend(lock(&self.queue).items.iter().take(BATCH).cloned());
            if batch.is_empty() {
                drop(guard);
                queued.await;
                continue;
            }
            for frame in &batch {
                out.write_all(frame).await?;
                // Popped as soon as it is written, so a write that fails
                // later in the batch replays nothing twice.
                let mut q = lock(&self.queue);
                if let Some(f) = q.items.pop_front() {
                    q.bytes -= f.len();
                }
            }
            drop(guard);
            self.room.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn ev(n: usize) -> Bytes {
        Bytes::from(format!("{n:08}"))
    }

    #[tokio::test]
    async fn events_queued_without_a_subscriber_are_delivered_in_order_later() {
        let e = Events::default();
        for n in 0..10 {
            e.push(ev(n));
        }
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 80];
            tokio::io::AsyncReadExt::read_exact(&mut b, &mut buf)
                .await
                .unwrap();
            buf
        });
        tokio::select! {
            _ = e.deliver(&mut a) => unreachable!(),
            got = task => {
                let want: String = (0..10).map(|n| format!("{n:08}")).collect();
                assert_eq!(String::from_utf8(got.unwrap()).unwrap(), want);
            }
        }
    }

    #[tokio::test]
    async fn output_waits_when_the_queue_is_full_and_resumes_when_it_drains() {
        let e = Arc::new(Events::default());
        for n in 0..MAX_EVENTS {
            e.push_output(ev(n)).await;
        }
        let e2 = e.clone();
        let blocked = tokio::spawn(async move { e2.push_output(ev(MAX_EVENTS)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !blocked.is_finished(),
            "a full queue must hold the producer"
        );
        assert_eq!(e.backlog().0, MAX_EVENTS);
        // A status event is never held back.
        e.push(ev(0));
        assert_eq!(e.backlog().0, MAX_EVENTS + 1);
        let (mut a, _b) = tokio::io::duplex(1 << 20);
        let e3 = e.clone();
        let drain = tokio::spawn(async move { e3.deliver(&mut a).await });
        tokio::time::timeout(Duration::from_secs(5), blocked)
            .await
            .expect("the producer resumes once the queue drains")
            .unwrap();
        drain.abort();
    }

    #[tokio::test]
    async fn an_event_whose_write_failed_stays_for_the_next_subscriber() {
        let e = Events::default();
        e.push(ev(1));
        let (mut a, b) = tokio::io::duplex(4);
        drop(b);
        assert!(e.deliver(&mut a).await.is_err());
        assert_eq!(e.backlog(), (1, 8));
    }
}
