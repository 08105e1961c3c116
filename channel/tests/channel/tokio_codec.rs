//! The tokio codec decodes what the blocking writer wrote, and the other
//! way round, over a real socket pair.

use boxdesk_channel::codec::handshake;
use boxdesk_channel::{
    AgchCodec, ChannelError, Frame, FrameError, FrameReader, FrameWriter, SecretBytes,
};
use futures_util::SinkExt;
use tokio_stream_shim::next;
use tokio_util::codec::{Decoder, Framed};

mod tokio_stream_shim {
    use std::future::poll_fn;
    use std::pin::Pin;

    use futures_util::Stream;

    /// `StreamExt::next` without pulling in the whole of futures-util.
    pub async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
        poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
    }
}

#[tokio::test]
async fn frames_cross_between_the_tokio_codec_and_the_blocking_codec() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let blocking = std::thread::spawn(move || {
        let mut b = b;
        boxdesk_channel::handshake(&mut b).unwrap();
        let mut r = FrameReader::new(b.try_clone().unwrap());
        let mut w = FrameWriter::new(b);
        while let Some(f) = r.read_frame().unwrap() {
            w.write_frame(&f).unwrap();
        }
    });
    a.set_nonblocking(true).unwrap();
    let mut a = tokio::net::UnixStream::from_std(a).unwrap();
    handshake(&mut a).await.unwrap();
    let mut framed = Framed::new(a, AgchCodec);
    let frames = [
        Frame::Stdin(SecretBytes::from("pw")),
        Frame::Stdout(vec![3; 1 << 20]),
        Frame::Exit(-9),
    ];
    for f in &frames {
        framed.send(f).await.unwrap();
        assert_eq!(next(&mut framed).await.unwrap().unwrap(), *f);
    }
    framed.get_mut().shutdown().await.unwrap();
    assert!(next(&mut framed).await.is_none());
    blocking.join().unwrap();
}

use tokio::io::AsyncWriteExt;

#[test]
fn the_tokio_decoder_refuses_an_oversized_length_before_reserving_it() {
    let mut buf = bytes::BytesMut::from(&[2u8, 0xff, 0xff, 0xff, 0xff][..]);
    let err = AgchCodec.decode(&mut buf).unwrap_err();
    assert!(matches!(
        err,
        ChannelError::Frame(FrameError::TooLarge { .. })
    ));
    assert!(
        buf.capacity() < 1024,
        "reserved {} bytes for a refused frame",
        buf.capacity()
    );
}

#[test]
fn the_tokio_decoder_waits_for_a_whole_frame_and_reports_a_truncated_one_at_eof() {
    let mut buf = bytes::BytesMut::from(&[4u8, 4, 0, 0, 0, 1][..]);
    assert_eq!(AgchCodec.decode(&mut buf).unwrap(), None);
    assert!(matches!(
        AgchCodec.decode_eof(&mut buf),
        Err(ChannelError::UnexpectedEof(_))
    ));
}
