//! Byte vectors written by hand from docs/CHANNEL.md, one or more per tag: a
//! change of byte order or field order fails here.

use boxdesk_channel::{Exec, Frame, FrameReader, SecretBytes, WinSize};

fn check(frame: Frame, wire: &[u8]) {
    let mut out = Vec::new();
    frame.encode(&mut out).unwrap();
    assert_eq!(out, wire, "encoding of {frame:?}");
    let mut r = FrameReader::new(wire);
    assert_eq!(r.read_frame().unwrap(), Some(frame));
    assert_eq!(r.read_frame().unwrap(), None);
}

#[test]
fn exec_is_command_args_cwd_env_and_timeout_in_that_order() {
    let exec = Exec {
        command: b"sh".to_vec(),
        args: vec![b"-c".to_vec(), b"x".to_vec()],
        cwd: b"/w".to_vec(),
        env: vec![(b"K".to_vec(), SecretBytes::from("v"))],
        timeout_ms: 0x0102_0304,
        flags: 0,
    };
    #[rustfmt::skip]
    let wire = [
        1, 45, 0, 0, 0,             // tag 1, len 45
        2, 0, 0, 0, b's', b'h',     // command
        2, 0, 0, 0,                 // 2 args
        2, 0, 0, 0, b'-', b'c',
        1, 0, 0, 0, b'x',
        2, 0, 0, 0, b'/', b'w',     // cwd
        1, 0, 0, 0,                 // 1 env pair
        1, 0, 0, 0, b'K',
        1, 0, 0, 0, b'v',
        4, 3, 2, 1,                 // timeout_ms LE
    ];
    check(Frame::Exec(exec), &wire);
}

#[test]
fn flags_follow_an_exec_and_a_pty_execs_window_size_only_when_set() {
    let exec = Exec {
        command: b"x".to_vec(),
        flags: Exec::ISOLATE,
        ..Exec::default()
    };
    #[rustfmt::skip]
    let wire = [
        1, 25, 0, 0, 0,             // tag 1, len 25
        1, 0, 0, 0, b'x',           // command
        0, 0, 0, 0,                 // no args
        0, 0, 0, 0,                 // cwd
        0, 0, 0, 0,                 // no env
        0, 0, 0, 0,                 // timeout_ms
        1, 0, 0, 0,                 // flags: ISOLATE
    ];
    check(Frame::Exec(exec.clone()), &wire);
    #[rustfmt::skip]
    let pty = [
        9, 29, 0, 0, 0,             // tag 9, len 29
        1, 0, 0, 0, b'x',
        0, 0, 0, 0,
        0, 0, 0, 0,
        0, 0, 0, 0,
        0, 0, 0, 0,
        80, 0, 24, 0,               // cols, rows
        1, 0, 0, 0,                 // flags: ISOLATE
    ];
    check(Frame::ExecPty(exec, WinSize { cols: 80, rows: 24 }), &pty);
}

#[test]
fn stdout_and_stderr_are_raw_bytes() {
    check(
        Frame::Stdout(b"hi\n".to_vec()),
        &[2, 3, 0, 0, 0, b'h', b'i', b'\n'],
    );
    check(Frame::Stderr(vec![0xff]), &[3, 1, 0, 0, 0, 0xff]);
}

#[test]
fn exit_is_a_little_endian_i32_and_negative_means_a_signal() {
    check(Frame::Exit(42), &[4, 4, 0, 0, 0, 42, 0, 0, 0]);
    check(Frame::Exit(-15), &[4, 4, 0, 0, 0, 0xf1, 0xff, 0xff, 0xff]);
}

#[test]
fn error_is_utf8_text() {
    check(
        Frame::Error("ENOENT: x".into()),
        &[
            5, 9, 0, 0, 0, b'E', b'N', b'O', b'E', b'N', b'T', b':', b' ', b'x',
        ],
    );
}

#[test]
fn putfile_is_path_mode_offset_then_data() {
    #[rustfmt::skip]
    let wire = [
        6, 20, 0, 0, 0,
        3, 0, 0, 0, b'/', b'a', b'b',  // path
        0xed, 1, 0, 0,                 // mode 0o755
        5, 0, 0, 0, 0, 0, 0, 0,        // offset 5
        b'x',                          // data
    ];
    check(
        Frame::PutFile {
            path: b"/ab".to_vec(),
            mode: 0o755,
            offset: 5,
            data: SecretBytes::from("x"),
        },
        &wire,
    );
}

#[test]
fn file_is_path_mode_offset_total_size_then_data() {
    #[rustfmt::skip]
    let wire = [
        7, 27, 0, 0, 0,
        1, 0, 0, 0, b'r',              // path
        0xa4, 1, 0, 0,                 // mode 0o644
        0, 0, 0, 0, 0, 0, 0, 0,        // offset 0
        2, 0, 0, 0, 0, 0, 0, 0,        // total_size 2
        b'o', b'k',
    ];
    check(
        Frame::File {
            path: b"r".to_vec(),
            mode: 0o644,
            offset: 0,
            total_size: 2,
            data: b"ok".to_vec(),
        },
        &wire,
    );
}

#[test]
fn timed_out_and_shutdown_are_empty() {
    check(Frame::TimedOut, &[8, 0, 0, 0, 0]);
    check(Frame::Shutdown, &[14, 0, 0, 0, 0]);
}

#[test]
fn execpty_is_an_exec_then_cols_then_rows() {
    #[rustfmt::skip]
    let wire = [
        9, 27, 0, 0, 0,
        3, 0, 0, 0, b'c', b'a', b't',  // command
        0, 0, 0, 0,                    // no args
        0, 0, 0, 0,                    // cwd empty
        0, 0, 0, 0,                    // no env
        0, 0, 0, 0,                    // no timeout
        80, 0, 24, 0,                  // cols 80, rows 24
    ];
    check(
        Frame::ExecPty(
            Exec::new("cat", Vec::<Vec<u8>>::new()),
            WinSize { cols: 80, rows: 24 },
        ),
        &wire,
    );
}

#[test]
fn stdin_is_raw_bytes_and_empty_stdin_is_eof() {
    check(
        Frame::Stdin(SecretBytes::from("y")),
        &[10, 1, 0, 0, 0, b'y'],
    );
    check(Frame::Stdin(SecretBytes::default()), &[10, 0, 0, 0, 0]);
}

#[test]
fn resize_is_cols_then_rows() {
    check(
        Frame::Resize(WinSize {
            cols: 0x0102,
            rows: 0x0304,
        }),
        &[11, 4, 0, 0, 0, 2, 1, 4, 3],
    );
}

#[test]
fn signal_is_a_little_endian_i32() {
    check(Frame::Signal(9), &[12, 4, 0, 0, 0, 9, 0, 0, 0]);
}

#[test]
fn getfile_is_one_bytes_path() {
    check(
        Frame::GetFile(b"/e".to_vec()),
        &[13, 6, 0, 0, 0, 2, 0, 0, 0, b'/', b'e'],
    );
}

#[test]
fn the_session_header_is_agch_then_version_3_little_endian() {
    assert_eq!(
        boxdesk_channel::session_header(),
        [b'A', b'G', b'C', b'H', 3, 0]
    );
}
