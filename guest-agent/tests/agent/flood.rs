//! Connections: the cap and its refusal, the session-header deadline, the
//! stalled-frame deadline, an idle session that stays, and the agent's
//! memory through a flood.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use boxdesk_channel::{Frame, Session};

use crate::support::{collect, marker, pids_with, raw_connect, sh, wait_for, Agent};

const FLOOD: usize = 2000;
/// The agent's cap (`gate::MAX_CONNECTIONS`).
const CAP: usize = 1024;

/// Lets this test process hold a few thousand sockets.
fn raise_open_files() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for both calls.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// What a client socket has received so far, without waiting.
#[derive(Debug, Default)]
struct Got {
    bytes: Vec<u8>,
    eof: bool,
}

fn take(s: &mut UnixStream, got: &mut Got) {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => {
                got.eof = true;
                return;
            }
            Ok(n) => got.bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(_) => {
                got.eof = true;
                return;
            }
        }
    }
}

/// The frames after the agent's 6-byte header.
fn frames(bytes: &[u8]) -> Vec<Frame> {
    let mut rest = bytes.get(6..).unwrap_or_default();
    let mut out = Vec::new();
    while rest.len() >= 5 {
        let len = u32::from_le_bytes(rest[1..5].try_into().unwrap()) as usize;
        if rest.len() < 5 + len {
            break;
        }
        let header = boxdesk_channel::FrameHeader::parse(rest[..5].try_into().unwrap()).unwrap();
        out.push(Frame::decode_payload(header.tag, rest[5..5 + len].to_vec()).unwrap());
        rest = &rest[5 + len..];
    }
    out
}

fn log_lines(agent: &Agent, needle: &str) -> usize {
    agent
        .log_text()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[test]
fn two_thousand_idle_connections_are_capped_dropped_after_ten_seconds_and_leave_no_memory_behind() {
    raise_open_files();
    let agent = Agent::start();
    let pid = agent.pid();
    // Warm up: a session thread and its buffers exist in the baseline.
    assert_eq!(agent.run(sh("true")).exit, Some(0));
    std::thread::sleep(Duration::from_millis(200));
    let before = Agent::rss_kib(pid);

    let t0 = Instant::now();
    let mut socks: Vec<UnixStream> = (0..FLOOD)
        .map(|_| UnixStream::connect(&agent.sock).expect("connect"))
        .collect();
    let mut got: Vec<Got> = (0..FLOOD).map(|_| Got::default()).collect();
    let is_refusal = |g: &Got| {
        g.eof
            && matches!(&frames(&g.bytes)[..],
                [Frame::Error(m)] if m.starts_with("EAGAIN: too many connections"))
    };
    let all_in = wait_for(Duration::from_secs(8), || {
        for (s, g) in socks.iter_mut().zip(got.iter_mut()) {
            take(s, g);
        }
        got.iter().filter(|g| is_refusal(g)).count() == FLOOD - CAP
            && got.iter().all(|g| g.bytes.len() >= 6)
    });
    let refused = got.iter().filter(|g| is_refusal(g)).count();
    assert!(all_in, "{refused} refused, want {}", FLOOD - CAP);
    // The first ones in are waiting for their header, with the agent's.
    let waiting = got
        .iter()
        .filter(|g| !g.eof && g.bytes == b"AGCH\x03\x00")
        .count();
    assert_eq!(waiting, CAP);
    let during = Agent::rss_kib(pid);

    // A normal client meanwhile is told why, not cut off. (After the
    // refusals' short linger, so it does not meet a closed socket.)
    std::thread::sleep(Duration::from_millis(2500));
    let mut s = Session::connect_unix(&agent.sock).unwrap();
    s.send(&Frame::Exec(sh("echo refused?"))).unwrap();
    let r = collect(&mut s);
    assert_eq!(r.exit, None, "{r:?}");
    assert!(
        r.errors.len() == 1 && r.errors[0].contains("too many connections"),
        "{r:?}"
    );

    // About 10 s after they connected, the silent ones are closed...
    let closed = wait_for(Duration::from_secs(15), || {
        for (s, g) in socks.iter_mut().zip(got.iter_mut()) {
            take(s, g);
        }
        got.iter().all(|g| g.eof)
    });
    let after_s = t0.elapsed();
    assert!(closed, "not all silent connections were closed");
    assert!(
        after_s >= Duration::from_secs(9),
        "closed after only {after_s:?}"
    );
    // ...and, with all 2,000 client sockets still open here, a normal exec
    // works again.
    let r = agent.run(sh("echo works"));
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "works\n"));
    std::thread::sleep(Duration::from_millis(200));
    let after = Agent::rss_kib(pid);
    eprintln!(
        "agent VmRSS: {before} KiB before, {during} KiB with {FLOOD} idle connections, \
         {after} KiB after (closed after {after_s:?})"
    );
    drop(socks);
    // One warning for the flood, not one per connection.
    assert_eq!(
        log_lines(&agent, "too many connections"),
        1,
        "{}",
        agent.log_text()
    );
    assert!(log_lines(&agent, "sent no session header") <= 2);
    assert!(
        during <= before + 2048,
        "{FLOOD} idle connections cost {} KiB",
        during - before
    );
    assert!(
        after <= before + 1024,
        "memory stayed up: {before} → {after} KiB"
    );
}

#[test]
fn a_frame_stopped_half_way_is_dropped_after_ten_seconds_while_an_idle_session_stays() {
    let agent = Agent::start();
    let mark = marker(70);
    // Established and idle between frames: normal, however long.
    let mut idle = agent.session();
    // Half a PutFile frame in the file phase.
    let mut files = raw_connect(&agent.sock);
    files.write_all(b"AGCH\x03\x00").unwrap();
    files.write_all(&[6, 100, 0, 0, 0, 1, 2, 3]).unwrap();
    // Half a Stdin frame during an exec.
    let mut exec = raw_connect(&agent.sock);
    let mut bytes = b"AGCH\x03\x00".to_vec();
    Frame::Exec(sh(&format!("echo up; sleep {mark}")))
        .encode(&mut bytes)
        .unwrap();
    bytes.extend_from_slice(&[10, 100, 0, 0, 0, b'x']);
    exec.write_all(&bytes).unwrap();
    let t0 = Instant::now();
    let read_all = |s: &mut UnixStream| {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = b"AGCH\x03\x00".to_vec();
        s.read_to_end(&mut b).unwrap();
        frames(&b)
    };
    let got = read_all(&mut files);
    let took = t0.elapsed();
    assert!(
        matches!(&got[..], [Frame::Error(m)] if m.starts_with("ETIMEDOUT")),
        "{got:?}"
    );
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(15),
        "{took:?}"
    );
    let got = read_all(&mut exec);
    assert!(
        matches!(&got[..], [Frame::Stdout(o), Frame::Error(m)]
            if o == b"up\n" && m.starts_with("ETIMEDOUT")),
        "{got:?}"
    );
    assert!(
        pids_with(&format!("sleep {mark}")).is_empty(),
        "the exec ended"
    );
    // The idle session is still served, long past 10 s.
    idle.send(&Frame::Exec(sh("echo still here"))).unwrap();
    let r = collect(&mut idle);
    assert_eq!(
        (r.exit, r.stdout_text().as_str()),
        (Some(0), "still here\n")
    );
}
