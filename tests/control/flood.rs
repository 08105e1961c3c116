//! A flood of idle connections against a running sandbox's `<name>.sock`
//! and `<name>.agent`: the ones past the cap (1024 per socket) are refused
//! with a clear line, the idle ones are dropped after the stall timeout
//! (10 s), a normal exec works while the flood's sockets are still open on
//! this side, the helper logs one warning per socket, and its memory
//! returns to where it was.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::TestEnv;

const FLOOD: usize = 2000;
const CAP: usize = 1024;
/// How far above its resting `VmRSS` the helper may stay after the flood
/// (measured: +0.1 MiB, as root and as nobody).
const HELPER_MARGIN_KIB: u64 = 2048;
/// The same for the cowork server (measured: +1.1 to +1.9 MiB after its
/// first flood, about half of it code pages the flood touched first, none
/// more after a second flood).
const COWORK_MARGIN_KIB: u64 = 4096;

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A `/proc/PID/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Raises this process's soft open-file limit so it can hold the flood;
/// false (after saying so) when the hard limit is too low.
fn room_for(fds: u64) -> bool {
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    if hard < fds {
        println!("skipped: the hard open-file limit is {hard}, the flood needs {fds}");
        return false;
    }
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    true
}

/// What one flood connection has been sent so far, without waiting.
fn said(s: &UnixStream) -> Option<String> {
    let mut buf = [0u8; 128];
    match (&*s).read(&mut buf) {
        Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
        Err(e) => Some(format!("error: {e}")),
    }
}

/// Opens `FLOOD` idle connections to `path`.
fn flood(path: &Path) -> Vec<UnixStream> {
    (0..FLOOD)
        .map(|_| {
            let s = UnixStream::connect(path).unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

/// Splits the flood into the refused (each told `refusal`) and the held.
fn refused_and_held(flood: &[UnixStream], refusal: &str) -> (usize, Vec<usize>) {
    let mut refused = 0;
    let mut held = Vec::new();
    for (i, s) in flood.iter().enumerate() {
        match said(s) {
            Some(m) => {
                assert_eq!(m, refusal, "connection {i}");
                refused += 1;
            }
            None => held.push(i),
        }
    }
    (refused, held)
}

#[test]
fn two_thousand_idle_connections_are_refused_past_the_cap_dropped_when_idle_and_leave_no_trace() {
    if !room_for(2 * FLOOD as u64 + 256) {
        return;
    }
    let env = TestEnv::new();
    let sb = env.start("flood", &[]);
    let pid = sb.pid.unwrap();
    for _ in 0..3 {
        assert_eq!(sb.exec(&["true"]).code(), 0);
    }
    // At rest: the warm-up execs' relays have ended and given back their slots.
    std::thread::sleep(Duration::from_millis(300));
    let before = rss_kib(pid);

    let started = Instant::now();
    let sock = flood(&env.sock("flood"));
    let agent = flood(&env.agent("flood"));
    std::thread::sleep(Duration::from_millis(500));
    let during = rss_kib(pid);
    let (refused, held) = refused_and_held(&sock, "err too many connections\n");
    assert_eq!((refused, held.len()), (FLOOD - CAP, CAP));
    let (refused, held_agent) = refused_and_held(&agent, "ERR too many connections\n");
    assert_eq!((refused, held_agent.len()), (FLOOD - CAP, CAP));

    // The held ones are told, then dropped, once the stall timeout is up.
    let mut waits = Vec::new();
    for (flood, held, told) in [
        (&sock, &held, "err no complete request line within 10 s\n"),
        (&agent, &held_agent, "ERR no preamble in time\n"),
    ] {
        for &i in held {
            let s = &flood[i];
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut got = String::new();
            (&*s).read_to_string(&mut got).unwrap();
            assert_eq!(got, told, "connection {i}");
            waits.push(started.elapsed());
        }
    }
    let last = waits.iter().max().unwrap();
    assert!(
        *last >= Duration::from_secs(9) && *last < Duration::from_secs(25),
        "dropped after {last:?}"
    );

    // Every flood socket is still open on this side: a normal exec works.
    assert_eq!(sb.exec(&["true"]).code(), 0);
    assert_eq!(env.info("flood")["state"], "running");
    let held_open = rss_kib(pid);
    drop(sock);
    drop(agent);
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib(pid);
    println!(
        "helper VmRSS KiB: before {before}, during the flood {during}, after the drops {held_open}, after closing {after} (RssAnon {})",
        status_kib(pid, "RssAnon:")
    );
    assert!(
        after <= before + HELPER_MARGIN_KIB,
        "RSS {before} KiB before, {after} KiB after"
    );

    let log = fs::read_to_string(env.runtime().join("flood.log")).unwrap();
    for server in ["control socket", "agent socket"] {
        let warnings = log
            .lines()
            .filter(|l| l.contains(&format!("{server}: {CAP} connections open")))
            .count();
        assert_eq!(warnings, 1, "{server} in:\n{log}");
    }
}

/// The JSON body of each whole frame in `bytes` (the cowork framing).
fn frames(mut bytes: &[u8]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        let Some(body) = bytes.get(4..4 + len) else {
            break;
        };
        out.push(serde_json::from_slice(body).unwrap());
        bytes = &bytes[4 + len..];
    }
    out
}

/// Everything a flood connection is sent until the server closes it.
fn read_to_close(s: &UnixStream) -> Vec<u8> {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    (&*s).read_to_end(&mut got).unwrap();
    got
}

#[test]
fn the_cowork_server_refuses_past_the_cap_with_an_error_frame_and_drops_idle_peers() {
    if !room_for(FLOOD as u64 + 256) {
        return;
    }
    let env = TestEnv::new();
    let sock = env.xdg_runtime.join("cw.sock");
    let log = env.root().join("cowork.log");
    let logf = fs::File::create(&log).unwrap();
    let child = env
        .cmd(["cowork", "--socket"])
        .arg(&sock)
        .env("XDG_DATA_HOME", env.root().join("data"))
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .unwrap();
    let server = crate::support::KillOnDrop(child);
    let pid = server.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "cowork did not bind");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_kib(pid);

    let started = Instant::now();
    let flood = flood(&sock);
    std::thread::sleep(Duration::from_millis(500));
    let during = rss_kib(pid);
    let mut refused = 0;
    let mut held = Vec::new();
    for s in &flood {
        match said(s) {
            Some(m) => {
                let f = frames(m.as_bytes());
                assert_eq!(f.len(), 1, "{m:?}");
                assert_eq!(f[0]["success"], false);
                assert_eq!(f[0]["error"], "too many connections");
                refused += 1;
            }
            None => held.push(s),
        }
    }
    assert_eq!((refused, held.len()), (FLOOD - CAP, CAP));
    for s in held {
        let f = frames(&read_to_close(s));
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0]["error"], "bad frame: no complete frame within 10 s");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(25),
        "dropped after {took:?}"
    );

    // The flood's sockets still open here, a one-shot request is answered.
    let s = UnixStream::connect(&sock).unwrap();
    let body = br#"{"method":"isRunning","params":{}}"#;
    (&s).write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    (&s).write_all(body).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let f = frames(&read_to_close(&s));
    assert_eq!(f[0]["success"], true, "{f:?}");
    drop(flood);
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kib(pid);
    println!(
        "cowork VmRSS KiB: before {before}, during the flood {during}, after {after} (RssAnon {})",
        status_kib(pid, "RssAnon:")
    );
    assert!(
        after <= before + COWORK_MARGIN_KIB,
        "RSS {before} KiB before, {after} KiB after"
    );
    let text = fs::read_to_string(&log).unwrap();
    let warnings = text
        .lines()
        .filter(|l| l.contains("cowork socket: 1024 connections open"))
        .count();
    assert_eq!(warnings, 1, "{text}");
}
