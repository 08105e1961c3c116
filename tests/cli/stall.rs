//! Clients facing a peer that stalls: a listener in the runtime dir that
//! never accepts, one that accepts and never answers, and one that speaks
//! the handshake and then nothing. Each client ends with a message naming
//! the sandbox within a bounded time (exit 125), and SIGTERM ends a
//! client at once.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::{self, KillOnDrop, TestEnv};

/// `CONNECT_TIMEOUT` of the client, and what a bounded wait may add.
const LIMIT: Duration = Duration::from_secs(10);
const SLACK: Duration = Duration::from_secs(6);

fn runtime(env: &TestEnv) {
    fs::create_dir(env.runtime()).unwrap();
    fs::set_permissions(env.runtime(), fs::Permissions::from_mode(0o700)).unwrap();
}

/// A listener that never accepts, its backlog already full.
fn never_accepts(path: &Path) -> UnixListener {
    let l = UnixListener::bind(path).unwrap();
    // SAFETY: listen on a descriptor we own; it only changes the backlog.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
    for _ in 0..4 {
        assert!(boxdesk_platform::socket::is_live(path));
    }
    l
}

/// A listener that accepts every connection, reads what comes, and answers
/// with `answer` (the connection then stays open and silent).
fn accepts_then(path: &Path, answer: &'static [u8]) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            if !answer.is_empty() {
                let mut line = [0u8; 13];
                let _ = s.read_exact(&mut line);
                let _ = s.write_all(answer);
                let mut hdr = [0u8; 6];
                let _ = s.read_exact(&mut hdr);
            }
            held.push(s);
        }
    });
}

fn spawn(env: &TestEnv, args: &[&str]) -> KillOnDrop {
    let mut c = env.cmd(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    KillOnDrop(c.spawn().unwrap())
}

/// Waits for `child` at most `limit`; its exit code and stderr.
fn finish(mut child: KillOnDrop, limit: Duration) -> (Option<i32>, String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut err = String::new();
            let _ = child.0.stderr.take().unwrap().read_to_string(&mut err);
            return (status.code(), err, start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "still running after {limit:?}: {:?}",
            child.0.id()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_listener_that_never_accepts_ends_each_client_within_the_connect_timeout() {
    let env = TestEnv::new();
    runtime(&env);
    let _sock = never_accepts(&env.sock("ghost"));
    let _agent = never_accepts(&env.agent("ghost"));
    let started = Instant::now();
    let children: Vec<(&str, KillOnDrop)> = [
        ("exec", vec!["exec", "ghost", "--", "true"]),
        ("cp", vec!["cp", "ghost:/etc/hostname", "/dev/null"]),
        ("info", vec!["info", "ghost"]),
        ("stop", vec!["stop", "ghost"]),
        ("ls", vec!["ls"]),
    ]
    .into_iter()
    .map(|(what, args)| (what, spawn(&env, &args)))
    .collect();
    for (what, child) in children {
        let (code, err, _) = finish(child, LIMIT + SLACK);
        if what == "ls" {
            // ls lists it, state unknown, and goes on.
            assert_eq!(code, Some(0), "{what}: {err}");
            continue;
        }
        assert_eq!(code, Some(125), "{what}: {err}");
        assert!(
            err.contains("sandbox ghost did not answer"),
            "{what}: {err}"
        );
    }
    assert!(started.elapsed() < LIMIT + SLACK);
}

#[test]
fn a_listener_that_accepts_and_never_answers_ends_each_client_with_a_clear_message() {
    let env = TestEnv::new();
    runtime(&env);
    accepts_then(&env.sock("mute"), b"");
    accepts_then(&env.agent("mute"), b"");
    let children: Vec<(&str, KillOnDrop)> = [
        ("exec", vec!["exec", "mute", "--", "true"]),
        ("cp", vec!["cp", "/etc/hostname", "mute:/tmp/x"]),
        ("info", vec!["info", "mute"]),
    ]
    .into_iter()
    .map(|(what, args)| (what, spawn(&env, &args)))
    .collect();
    for (what, child) in children {
        let (code, err, _) = finish(child, LIMIT + SLACK);
        assert_eq!(code, Some(125), "{what}: {err}");
        assert!(
            err.contains("sandbox mute did not answer on its"),
            "{what}: {err}"
        );
    }
}

#[test]
fn sigterm_ends_a_client_waiting_on_a_stalled_peer_at_once() {
    let env = TestEnv::new();
    runtime(&env);
    accepts_then(&env.sock("hush"), b"");
    accepts_then(&env.agent("hush"), b"");
    for args in [
        vec!["exec", "hush", "--", "true"],
        vec!["cp", "hush:/etc/hostname", "/dev/null"],
        vec!["info", "hush"],
        vec!["stop", "hush"],
        vec!["ls"],
    ] {
        let child = spawn(&env, &args);
        std::thread::sleep(Duration::from_millis(500));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
        let (_, err, took) = finish(child, Duration::from_secs(3));
        assert!(took < Duration::from_secs(2), "{args:?}: {took:?} {err}");
    }
}

#[test]
fn an_agent_that_handshakes_then_falls_silent_cannot_hold_exec_past_sigterm() {
    let env = TestEnv::new();
    runtime(&env);
    accepts_then(&env.agent("husk"), b"OK 1\nAGCH\x03\x00");
    let child = spawn(&env, &["exec", "husk", "--", "sleep", "1000"]);
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.0.id();
    assert!(support::pid_alive(pid), "exec ended before the signal");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let (code, err, took) = finish(child, LIMIT + SLACK);
    assert_eq!(code, Some(125), "{err}");
    assert!(
        err.contains("sandbox husk did not answer within 10 s of SIGTERM"),
        "{err}"
    );
    assert!(took >= LIMIT - Duration::from_secs(1), "{took:?}");
}

/// `exec NAME -- sh -c SCRIPT` with stdin fed by a thread until it fails;
/// the child once SCRIPT has printed `ready`.
fn exec_fed(env: &TestEnv, name: &str, script: &str) -> KillOnDrop {
    use std::io::{BufRead, BufReader};
    let mut c = env.cmd(["exec", name, "--", "sh", "-c", script]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let chunk = vec![b'x'; 64 * 1024];
        while stdin.write_all(&chunk).is_ok() {}
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    child.stdout = Some(out.into_inner());
    KillOnDrop(child)
}

#[test]
fn a_signal_reaches_a_command_while_stdin_streams_to_it() {
    let env = TestEnv::new();
    let sb = env.start("flow", &[]);
    let child = exec_fed(
        &env,
        &sb.name,
        "trap 'exit 7' TERM; echo ready; while :; do head -c 65536 >/dev/null; done",
    );
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let (code, err, took) = finish(child, Duration::from_secs(8));
    assert!(code == Some(7) || code == Some(143), "{code:?}: {err}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn sigterm_ends_exec_even_when_stdin_is_stuck_behind_a_command_that_never_reads_it() {
    let env = TestEnv::new();
    let sb = env.start("stuck", &[]);
    let child = exec_fed(&env, &sb.name, "trap '' TERM; echo ready; sleep 1000");
    // Let the socket and the agent's pipe fill: the stdin thread now waits.
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let (code, err, took) = finish(child, LIMIT + SLACK);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("sandbox stuck did not answer"), "{err}");
    assert!(took <= LIMIT + Duration::from_secs(2), "{took:?}");
}
