//! A flood of idle connections against a running sandbox's `<name>.sock`
//! and `<name>.agent`: the ones past the cap (1024 per socket) are refused
//! with a clear line, the idle ones are dropped after the stall timeout
//! (10 s), a normal exec works while the flood's sockets are still open on
//! this side, the helper logs one warning per socket, and its memory
//! returns to where it was.

use std::fs;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::TestEnv;

const FLOOD: usize = 2000;
const CAP: usize = 1024;
/// How far above its resting RSS the helper may stay after the flood.
const RSS_MARGIN_KIB: u64 = 2048;

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
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
        "helper VmRSS KiB: before {before}, during the flood {during}, after the drops {held_open}, after closing {after}"
    );
    assert!(
        after <= before + RSS_MARGIN_KIB,
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
