//! The stall deadline for a tokio framed reader (the cowork server): a
//! peer's first frame must be whole within [`STALL_TIMEOUT`] of its
//! connecting, and a frame it has begun within [`STALL_TIMEOUT`] of its
//! first byte. Between whole frames a connection may be idle as long as it
//! likes: a persistent pipe and an event subscription live for hours.
//!
//! [`Timed`] wraps the connection's decoder and notes when a frame began
//! (it sees every byte as it arrives); [`next_frame`] waits for the next
//! frame no longer than that allows. This module owns only the clock, not
//! the framing.

use std::io;
use tokio::time::Instant;

use bytes::BytesMut;
use futures_util::StreamExt;
use tokio::io::AsyncRead;
use tokio_util::codec::{Decoder, FramedRead};

use super::STALL_TIMEOUT;

/// A decoder that knows since when a frame is owed.
#[derive(Debug)]
pub struct Timed<D> {
    inner: D,
    /// When the frame now owed began: the connection itself for the first
    /// one, its first byte for later ones; `None` between frames.
    began: Option<Instant>,
}

impl<D> Timed<D> {
    /// Wraps `inner` for a connection that has just been accepted: its
    /// first frame is owed from now.
    pub fn new(inner: D) -> Self {
        Timed {
            inner,
            began: Some(Instant::now()),
        }
    }

    /// When the frame owed must be whole, if one is owed.
    pub fn deadline(&self) -> Option<Instant> {
        self.began.map(|t| t + STALL_TIMEOUT)
    }
}

impl<D: Decoder> Decoder for Timed<D> {
    type Item = D::Item;
    type Error = D::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<D::Item>, D::Error> {
        // Before the inner decoder consumes a length prefix.
        if !src.is_empty() && self.began.is_none() {
            self.began = Some(Instant::now());
        }
        let out = self.inner.decode(src)?;
        if out.is_some() {
            self.began = (!src.is_empty()).then(Instant::now);
        }
        Ok(out)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<D::Item>, D::Error> {
        self.inner.decode_eof(src)
    }
}

/// The next frame of `frames`, or a `TimedOut` error once a frame owed is
/// overdue. `None` at a clean end of stream.
pub async fn next_frame<T, D>(
    frames: &mut FramedRead<T, Timed<D>>,
) -> Option<Result<D::Item, D::Error>>
where
    T: AsyncRead + Unpin,
    D: Decoder,
    D::Error: From<io::Error>,
{
    loop {
        // Idle: look again after a while, in case a frame began meanwhile.
        let wait = frames.decoder().deadline().map_or(STALL_TIMEOUT, |at| {
            at.saturating_duration_since(Instant::now())
        });
        if let Ok(next) = tokio::time::timeout(wait, frames.next()).await {
            return next;
        }
        if frames
            .decoder()
            .deadline()
            .is_some_and(|at| at <= Instant::now())
        {
            let why = format!("no complete frame within {} s", STALL_TIMEOUT.as_secs());
            return Some(Err(io::Error::new(io::ErrorKind::TimedOut, why).into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio_util::codec::LengthDelimitedCodec;

    #[tokio::test(start_paused = true)]
    async fn a_silent_new_peer_and_a_half_sent_frame_time_out_but_idle_between_frames_does_not() {
        // A silent new peer.
        let (a, _keep) = tokio::io::duplex(1024);
        let mut frames = FramedRead::new(a, Timed::new(LengthDelimitedCodec::new()));
        let err = next_frame(&mut frames).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);

        // One whole frame, an hour idle, then a frame cut after its length.
        let (a, mut b) = tokio::io::duplex(1024);
        let mut frames = FramedRead::new(a, Timed::new(LengthDelimitedCodec::new()));
        b.write_all(&[0, 0, 0, 2, b'h', b'i']).await.unwrap();
        assert_eq!(&next_frame(&mut frames).await.unwrap().unwrap()[..], b"hi");
        let idle = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            b.write_all(&[0, 0, 0, 9]).await.unwrap();
            b
        });
        let started = Instant::now();
        let err = next_frame(&mut frames).await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(
            took >= std::time::Duration::from_secs(3600) + STALL_TIMEOUT,
            "{took:?}"
        );
        assert!(
            took <= std::time::Duration::from_secs(3600) + 2 * STALL_TIMEOUT,
            "{took:?}"
        );
        drop(idle);
    }
}
