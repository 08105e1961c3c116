//! Every frame type survives encode → decode, including empty and
//! maximum-size payloads and non-UTF-8 bytes.

use boxdesk_channel::{
    Exec, Frame, FrameError, FrameReader, FrameWriter, SecretBytes, WinSize, MAX_PAYLOAD,
};

fn roundtrip(frames: &[Frame]) {
    let mut wire = Vec::new();
    let mut w = FrameWriter::new(&mut wire);
    for f in frames {
        w.write_frame(f).unwrap();
    }
    drop(w);
    let mut r = FrameReader::new(&wire[..]);
    for f in frames {
        assert_eq!(r.read_frame().unwrap().as_ref(), Some(f));
    }
    assert_eq!(r.read_frame().unwrap(), None);
}

fn non_utf8_exec() -> Exec {
    Exec {
        command: b"/bin/\xff\xfe".to_vec(),
        args: vec![vec![], b"\x00\x80".to_vec(), vec![0xc3]],
        cwd: b"/tmp/\xe9".to_vec(),
        env: vec![(b"K\xff".to_vec(), SecretBytes::new(vec![0, 0xff, 0xc0]))],
        timeout_ms: u32::MAX,
        flags: Exec::ISOLATE,
    }
}

#[test]
fn every_frame_type_round_trips() {
    roundtrip(&[
        Frame::Exec(non_utf8_exec()),
        Frame::Exec(Exec::default()),
        Frame::Stdout(vec![]),
        Frame::Stdout(b"\xff\x00out".to_vec()),
        Frame::Stderr(b"err".to_vec()),
        Frame::Exit(0),
        Frame::Exit(255),
        Frame::Exit(-9),
        Frame::Error(String::new()),
        Frame::Error("EACCES: é".into()),
        Frame::PutFile {
            path: b"/a/\xff".to_vec(),
            mode: 0o4755,
            offset: u64::MAX,
            data: SecretBytes::default(),
        },
        Frame::File {
            path: vec![],
            mode: 0,
            offset: 1,
            total_size: 2,
            data: vec![0xff; 3],
        },
        Frame::TimedOut,
        Frame::ExecPty(
            non_utf8_exec(),
            WinSize {
                cols: u16::MAX,
                rows: 0,
            },
        ),
        Frame::Stdin(SecretBytes::default()),
        Frame::Stdin(SecretBytes::from("secret")),
        Frame::Resize(WinSize { cols: 1, rows: 2 }),
        Frame::Signal(i32::MIN),
        Frame::GetFile(b"\xff".to_vec()),
        Frame::Shutdown,
    ]);
}

#[test]
fn maximum_size_payloads_round_trip() {
    let max = MAX_PAYLOAD as usize;
    let put_prefix = 4 + 1 + 4 + 8;
    let file_prefix = 4 + 1 + 4 + 8 + 8;
    roundtrip(&[
        Frame::Stdout(vec![7; max]),
        Frame::Stderr(vec![8; max]),
        Frame::Stdin(SecretBytes::new(vec![9; max])),
        Frame::PutFile {
            path: b"p".to_vec(),
            mode: 0o644,
            offset: 0,
            data: SecretBytes::new(vec![1; max - put_prefix]),
        },
        Frame::File {
            path: b"p".to_vec(),
            mode: 0o644,
            offset: 0,
            total_size: 9,
            data: vec![2; max - file_prefix],
        },
    ]);
}

#[test]
fn a_frame_one_byte_over_the_limit_is_refused_before_anything_is_written() {
    let mut wire = Vec::new();
    let err = FrameWriter::new(&mut wire)
        .write_frame(&Frame::Stdout(vec![0; MAX_PAYLOAD as usize + 1]))
        .unwrap_err();
    assert!(matches!(
        err,
        boxdesk_channel::ChannelError::Frame(FrameError::TooLarge { tag: 2, .. })
    ));
    assert!(wire.is_empty());
}

#[test]
fn an_error_frame_is_sanitised_when_sent_and_when_received() {
    let mut wire = Vec::new();
    Frame::Error("\u{202E}evil\x1b[31m".into())
        .encode(&mut wire)
        .unwrap();
    assert_eq!(&wire[5..], b"\\u{202e}evil\\x1b[31m");

    let raw: &[u8] = &[5, 3, 0, 0, 0, b'a', 0x1b, b'b'];
    let got = FrameReader::new(raw).read_frame().unwrap();
    assert_eq!(got, Some(Frame::Error("a\\x1bb".into())));
}

#[test]
fn a_ten_thousand_byte_error_is_cut_to_the_cap() {
    let f = Frame::error("x".repeat(10_000));
    let Frame::Error(msg) = &f else {
        unreachable!()
    };
    assert_eq!(msg.len(), boxdesk_channel::ERROR_MSG_CAP);
}

#[test]
fn many_small_frames_arriving_one_byte_at_a_time_decode_in_order() {
    struct Trickle<'a>(&'a [u8]);
    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some((&b, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            buf[0] = b;
            self.0 = rest;
            Ok(1)
        }
    }
    let frames: Vec<Frame> = (0..200)
        .map(|i| Frame::Stdout(vec![i as u8; i % 37]))
        .collect();
    let mut wire = Vec::new();
    for f in &frames {
        f.encode(&mut wire).unwrap();
    }
    let mut r = FrameReader::new(Trickle(&wire));
    for f in &frames {
        assert_eq!(r.read_frame().unwrap().as_ref(), Some(f));
    }
    assert_eq!(r.read_frame().unwrap(), None);
}
