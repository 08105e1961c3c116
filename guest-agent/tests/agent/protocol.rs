//! Bad input: every kind ends only its own connection.

use std::io::{Read, Write};

use boxdesk_channel::{Frame, FrameReader};

use crate::support::{raw_connect, sh, Agent};

/// Sends our header and `bytes`, then returns every frame received until
/// the agent closes.
fn send_raw(agent: &Agent, bytes: &[u8]) -> Vec<Frame> {
    let mut s = raw_connect(&agent.sock);
    s.write_all(b"AGCH\x03\x00").unwrap();
    s.write_all(bytes).unwrap();
    let mut reader = FrameReader::new(s);
    let mut frames = Vec::new();
    while let Ok(Some(f)) = reader.read_frame() {
        frames.push(f);
    }
    frames
}

fn assert_one_error_and_still_serving(agent: &Agent, frames: &[Frame], needle: &str) {
    assert_eq!(frames.len(), 1, "{frames:?}");
    match &frames[0] {
        Frame::Error(m) => assert!(m.contains(needle), "{m}"),
        other => panic!("expected an Error, got {other:?}"),
    }
    assert_eq!(
        agent.run(sh("exit 7")).exit,
        Some(7),
        "a new session still works"
    );
}

#[test]
fn an_unknown_tag_gets_an_error_and_the_agent_serves_the_next_session() {
    let agent = Agent::start();
    let frames = send_raw(&agent, &[200, 0, 0, 0, 0]);
    assert_one_error_and_still_serving(&agent, &frames, "unknown frame tag 200");
}

#[test]
fn a_length_over_max_payload_gets_an_error_before_any_allocation() {
    let agent = Agent::start();
    let frames = send_raw(&agent, &[6, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    assert_one_error_and_still_serving(&agent, &frames, "over the 1 MiB limit");
}

#[test]
fn a_truncated_frame_gets_an_error() {
    let agent = Agent::start();
    let mut s = raw_connect(&agent.sock);
    s.write_all(b"AGCH\x03\x00").unwrap();
    s.write_all(&[13, 100, 0, 0, 0, b'a']).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reader = FrameReader::new(s);
    let f = reader.read_frame().unwrap();
    assert!(
        matches!(f, Some(Frame::Error(ref m)) if m.contains("middle of a frame")),
        "{f:?}"
    );
}

#[test]
fn garbage_fields_inside_a_frame_get_an_error() {
    let agent = Agent::start();
    // An Exec whose command length runs past the payload.
    let frames = send_raw(&agent, &[1, 4, 0, 0, 0, 0xff, 0xff, 0, 0]);
    assert_one_error_and_still_serving(&agent, &frames, "ends inside");
}

#[test]
fn a_bad_magic_header_is_closed_without_any_frame() {
    let agent = Agent::start();
    let mut s = raw_connect(&agent.sock);
    s.write_all(b"HTTP/1.1 GET /\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    // A clean EOF or a reset: either way, not one byte of frames.
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(agent.run(sh("exit 1")).exit, Some(1));
}

#[test]
fn a_wrong_version_is_closed_without_any_frame() {
    let agent = Agent::start();
    let mut s = raw_connect(&agent.sock);
    s.write_all(b"AGCH\x02\x00").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_guest_frame_or_stdin_before_exec_is_an_error_and_a_close() {
    let agent = Agent::start();
    for frame in [Frame::Exit(0), Frame::Stdin("x".into())] {
        let mut s = agent.session();
        s.send(&frame).unwrap();
        let r = crate::support::collect(&mut s);
        assert_eq!(r.errors.len(), 1, "{r:?}");
        assert!(r.errors[0].contains("before an Exec"), "{:?}", r.errors);
    }
}

#[test]
fn a_host_that_sends_nothing_and_half_closes_gets_a_clean_close() {
    let agent = Agent::start();
    let mut s = agent.session();
    s.close_write().unwrap();
    assert_eq!(s.recv().unwrap(), None);
}

#[test]
fn a_session_header_split_across_writes_is_accepted() {
    let agent = Agent::start();
    let mut s = raw_connect(&agent.sock);
    for part in [&b"AGCH\x03"[..], b"\x00"] {
        s.write_all(part).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut frame = Vec::new();
    Frame::Exec(sh("exit 4")).encode(&mut frame).unwrap();
    // The frame itself in two pieces too, split inside its header.
    s.write_all(&frame[..3]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    s.write_all(&frame[3..]).unwrap();
    let mut reader = FrameReader::new(s);
    assert_eq!(reader.read_frame().unwrap(), Some(Frame::Exit(4)));
}
