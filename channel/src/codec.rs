//! The tokio codec: `tokio_util::codec::{Decoder, Encoder}` over the same
//! decoder core as the blocking reader ([`decode_slice`]), plus the async
//! session handshake.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::{Decoder, Encoder};
use zeroize::Zeroize;

use crate::blocking::check_header;
use crate::frame::{decode_slice, Decoded, Frame};
use crate::{session_header, ChannelError, HEADER_LEN};

/// Frames of an AGCH session, after the handshake, for `Framed`.
#[derive(Debug, Default, Clone, Copy)]
pub struct AgchCodec;

impl Decoder for AgchCodec {
    type Item = Frame;
    type Error = ChannelError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, ChannelError> {
        match decode_slice(src)? {
            Decoded::Frame(frame, used) => {
                if frame.tag().may_hold_secret() {
                    src[..used].zeroize();
                }
                src.advance(used);
                Ok(Some(frame))
            }
            Decoded::NeedMore(total) => {
                // `total` is at most header + MAX_PAYLOAD: parse checked it.
                src.reserve(total - src.len());
                Ok(None)
            }
        }
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, ChannelError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(ChannelError::UnexpectedEof("a frame")),
        }
    }
}

impl Encoder<&Frame> for AgchCodec {
    type Error = ChannelError;

    fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), ChannelError> {
        let mut prefix = Vec::with_capacity(64);
        let data = frame.encode_parts(&mut prefix)?;
        dst.reserve(prefix.len() + data.len());
        dst.extend_from_slice(&prefix);
        dst.extend_from_slice(data);
        if frame.tag().may_hold_secret() {
            prefix.zeroize();
        }
        Ok(())
    }
}

impl Encoder<Frame> for AgchCodec {
    type Error = ChannelError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), ChannelError> {
        self.encode(&frame, dst)
    }
}

/// The async session handshake: write our header, read and check theirs.
pub async fn handshake<S>(stream: &mut S) -> Result<(), ChannelError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // As the blocking handshake: what a peer said before hanging up beats
    // the EPIPE our write met.
    let wrote = match stream.write_all(&session_header()).await {
        Ok(()) => stream.flush().await,
        Err(e) => Err(e),
    };
    let mut peer = [0u8; HEADER_LEN];
    let read = stream
        .read_exact(&mut peer)
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => ChannelError::UnexpectedEof("the session header"),
            _ => ChannelError::Io(e),
        });
    match (wrote, read) {
        (_, Ok(_)) => check_header(peer),
        (Err(e), Err(_)) => Err(e.into()),
        (Ok(()), Err(e)) => Err(e),
    }
}
