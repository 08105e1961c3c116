//! Property tests: decode(encode(f)) == f for arbitrary frames, and
//! decoding arbitrary bytes never panics.

use boxdesk_channel::{Exec, Frame, FrameReader, SecretBytes, WinSize};
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn exec() -> impl Strategy<Value = Exec> {
    (
        bytes(16),
        prop::collection::vec(bytes(8), 0..4),
        bytes(16),
        prop::collection::vec((bytes(8), bytes(8)), 0..4),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(command, args, cwd, env, timeout_ms, flags)| Exec {
            command,
            args,
            cwd,
            env: env
                .into_iter()
                .map(|(k, v)| (k, SecretBytes::new(v)))
                .collect(),
            timeout_ms,
            flags,
        })
}

fn winsize() -> impl Strategy<Value = WinSize> {
    (any::<u16>(), any::<u16>()).prop_map(|(cols, rows)| WinSize { cols, rows })
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        exec().prop_map(Frame::Exec),
        bytes(256).prop_map(Frame::Stdout),
        bytes(256).prop_map(Frame::Stderr),
        any::<i32>().prop_map(Frame::Exit),
        // Error text is sanitised on the way: generate what survives it.
        "[a-zA-Z0-9 :é€]{0,64}".prop_map(Frame::Error),
        (bytes(16), any::<u32>(), any::<u64>(), bytes(64)).prop_map(|(path, mode, offset, d)| {
            Frame::PutFile {
                path,
                mode,
                offset,
                data: SecretBytes::new(d),
            }
        }),
        (
            bytes(16),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            bytes(64)
        )
            .prop_map(|(path, mode, offset, total_size, data)| Frame::File {
                path,
                mode,
                offset,
                total_size,
                data
            }),
        Just(Frame::TimedOut),
        (exec(), winsize()).prop_map(|(e, w)| Frame::ExecPty(e, w)),
        bytes(64).prop_map(|d| Frame::Stdin(SecretBytes::new(d))),
        winsize().prop_map(Frame::Resize),
        any::<i32>().prop_map(Frame::Signal),
        bytes(16).prop_map(Frame::GetFile),
        Just(Frame::Shutdown),
    ]
}

proptest! {
    #[test]
    fn any_sequence_of_frames_decodes_to_itself(frames in prop::collection::vec(frame(), 0..8)) {
        let mut wire = Vec::new();
        for f in &frames {
            f.encode(&mut wire).unwrap();
        }
        let mut r = FrameReader::new(&wire[..]);
        for f in &frames {
            let got = r.read_frame().unwrap();
            prop_assert_eq!(got.as_ref(), Some(f));
        }
        prop_assert_eq!(r.read_frame().unwrap(), None);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(wire in bytes(512)) {
        let mut r = FrameReader::new(&wire[..]);
        while let Ok(Some(_)) = r.read_frame() {}
    }

    #[test]
    fn decoding_mutated_valid_frames_never_panics(f in frame(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let mut wire = Vec::new();
        f.encode(&mut wire).unwrap();
        for (i, b) in flips {
            let n = wire.len();
            wire[i % n] ^= b;
        }
        let mut r = FrameReader::new(&wire[..]);
        while let Ok(Some(_)) = r.read_frame() {}
    }
}
