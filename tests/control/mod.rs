//! The control socket `<name>.sock` and the agent socket `<name>.agent` of
//! a running helper, spoken to byte by byte.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::support::{self, read_reply, TestEnv};

mod flood;

#[test]
fn an_unknown_request_is_answered_with_what_this_vm_speaks() {
    let env = TestEnv::new();
    let _sb = env.start("c1", &[]);
    let mut s = env.control("c1");
    s.write_all(b"frobnicate\n").unwrap();
    assert_eq!(
        read_reply(&mut s),
        "err unknown request frobnicate; speaks: info stop display input\n"
    );
    // The connection stays open for the next word.
    s.write_all(b"info\n").unwrap();
    let reply = read_reply(&mut s);
    assert!(reply.starts_with("ok\nproto 1\n"), "{reply}");
    assert!(reply.ends_with("\n\n"), "{reply}");
}

#[test]
fn an_unknown_word_is_echoed_with_control_bytes_escaped_and_cut_to_64_bytes() {
    let env = TestEnv::new();
    let _sb = env.start("c2", &[]);
    let mut s = env.control("c2");
    s.write_all(b"\x1b[31mred\x07\n").unwrap();
    assert_eq!(
        read_reply(&mut s),
        "err unknown request \\x1b[31mred\\x07; speaks: info stop display input\n"
    );
    let mut word = vec![b'w'; 300];
    word.push(b'\n');
    s.write_all(&word).unwrap();
    let reply = read_reply(&mut s);
    let echoed = reply
        .strip_prefix("err unknown request ")
        .and_then(|r| r.strip_suffix("; speaks: info stop display input\n"))
        .unwrap_or_else(|| panic!("{reply}"));
    assert_eq!(echoed, "w".repeat(64));
}

#[test]
fn info_reports_a_namespace_sandbox_and_never_a_vm() {
    let env = TestEnv::new();
    // (Limits, and their refusal where they cannot hold, are the
    // hardening tests'.)
    let _sb = env.start("c3", &["--pids", "300"]);
    let info = env.info("c3");
    for (k, v) in [
        ("proto", "1"),
        ("pids_max", "300"),
        ("net", "none"),
        ("rootfs", "host"),
        ("channel", "unix"),
        ("name", "c3"),
        ("backend", "namespace"),
        ("isolation", "namespaces"),
        ("arch", std::env::consts::ARCH),
        ("state", "running"),
    ] {
        assert_eq!(info.get(k).map(String::as_str), Some(v), "{k} in {info:?}");
    }
    let pid: u32 = info["pid"].parse().unwrap();
    assert!(support::pid_alive(pid));
    assert!(info["uptime_ms"].parse::<u64>().is_ok(), "{info:?}");
    assert!(!info
        .values()
        .any(|v| v == "vm" || v == "kvm" || v == "vsock"));
}

#[test]
fn stop_answers_ok_before_the_process_exits() {
    let env = TestEnv::new();
    let sb = env.start("c4", &[]);
    let pid: u32 = env.info("c4")["pid"].parse().unwrap();
    let mut s = env.control("c4");
    s.write_all(b"stop\n").unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert_eq!(all, "ok\n");
    assert!(support::wait_gone(pid), "helper {pid} still running");
    assert!(!env.sock("c4").exists(), "control socket left behind");
    assert!(!env.agent("c4").exists(), "agent socket left behind");
    std::mem::forget(sb);
}

#[test]
fn a_line_over_4096_bytes_gets_err_and_closes_only_that_connection() {
    let env = TestEnv::new();
    let _sb = env.start("c5", &[]);
    let mut s = env.control("c5");
    s.write_all(&vec![b'a'; 5000]).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("err ") && reply.contains("4096"),
        "{reply}"
    );
    // The helper is alive and serves a new connection.
    assert_eq!(env.info("c5")["state"], "running");
}

#[test]
fn a_line_of_exactly_4096_bytes_is_still_a_request() {
    let env = TestEnv::new();
    let _sb = env.start("c5b", &[]);
    let mut s = env.control("c5b");
    let mut line = vec![b'a'; 4095];
    line.push(b'\n');
    s.write_all(&line).unwrap();
    let reply = read_reply(&mut s);
    assert!(reply.starts_with("err unknown request aaaa"), "{reply}");
}

#[test]
fn a_line_with_nul_gets_err_and_closes_only_that_connection() {
    let env = TestEnv::new();
    let _sb = env.start("c6", &[]);
    let mut s = env.control("c6");
    s.write_all(b"in\0fo\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(
        reply.starts_with("err ") && reply.contains("NUL"),
        "{reply}"
    );
    assert_eq!(reply.lines().count(), 1, "connection not closed: {reply}");
    assert_eq!(env.info("c6")["state"], "running");
}

#[test]
fn display_and_input_are_refused_without_a_display() {
    let env = TestEnv::new();
    let _sb = env.start("c7", &[]);
    let mut s = env.control("c7");
    s.write_all(b"display\n").unwrap();
    assert_eq!(read_reply(&mut s), "err no display\n");
    s.write_all(b"input\n").unwrap();
    assert_eq!(read_reply(&mut s), "err no display\n");
}

#[test]
fn several_clients_are_served_at_once() {
    let env = TestEnv::new();
    let _sb = env.start("c8", &[]);
    // Three idle connections open, then each asked in reverse order.
    let mut conns: Vec<UnixStream> = (0..3).map(|_| env.control("c8")).collect();
    for s in conns.iter_mut().rev() {
        s.write_all(b"info\n").unwrap();
        assert!(read_reply(s).starts_with("ok\n"));
    }
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let sock = env.sock("c8");
            std::thread::spawn(move || {
                let mut s = UnixStream::connect(sock).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                for _ in 0..5 {
                    s.write_all(b"info\n").unwrap();
                    assert!(read_reply(&mut s).contains("backend namespace"));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_client_that_vanishes_mid_reply_does_not_hurt_the_helper() {
    let env = TestEnv::new();
    let _sb = env.start("c9", &[]);
    for _ in 0..20 {
        let mut s = env.control("c9");
        let _ = s.write_all(&b"info\n".repeat(200));
        drop(s); // closed without reading: the helper's writes hit EPIPE
    }
    let mut s = env.control("c9");
    s.write_all(b"info").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("err "), "unterminated line: {reply}");
    assert_eq!(env.info("c9")["state"], "running");
}

#[test]
fn the_agent_socket_refuses_a_port_other_than_1024() {
    let env = TestEnv::new();
    let _sb = env.start("c10", &[]);
    let mut s = UnixStream::connect(env.agent("c10")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"CONNECT 52\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(
        reply.starts_with("ERR ") && reply.ends_with('\n'),
        "{reply}"
    );
    let mut s = UnixStream::connect(env.agent("c10")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"HELLO\n").unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("ERR "), "{reply}");
}

#[test]
fn the_agent_socket_speaks_agch_after_connect_1024() {
    use boxdesk_channel::{Exec, Frame, Session};
    let env = TestEnv::new();
    let _sb = env.start("c11", &[]);
    let mut session = Session::connect_hybrid(env.agent("c11"), 1024).unwrap();
    session
        .send(&Frame::Exec(Exec::new("sh", ["-c", "echo via-agent"])))
        .unwrap();
    session.send(&Frame::Stdin(Default::default())).unwrap();
    let mut out = Vec::new();
    loop {
        match session.recv().unwrap() {
            Some(Frame::Stdout(d)) => out.extend(d),
            Some(Frame::Exit(code)) => {
                assert_eq!(code, 0);
                break;
            }
            Some(_) => {}
            None => panic!("closed before Exit"),
        }
    }
    assert_eq!(out, b"via-agent\n");
}

/// Run by [`a_peer_of_another_uid_is_refused`] in a child process that
/// runs as uid 65534; does nothing otherwise.
#[test]
fn foreign_uid_probe_does_nothing_unless_spawned_by_its_test() {
    let Some(sock) = std::env::var_os("BOXDESK_TEST_PEER_SOCK") else {
        return;
    };
    let mut s = UnixStream::connect(sock).expect("connect as another uid");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(b"info\n");
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    println!("REPLY<{}>", String::from_utf8_lossy(&reply));
    let agent = std::env::var_os("BOXDESK_TEST_PEER_AGENT").unwrap();
    let mut s = UnixStream::connect(agent).expect("connect to the agent socket");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(b"CONNECT 1024\n");
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    println!("AGENT<{}>", String::from_utf8_lossy(&reply));
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    if support::skip_unless_root("connecting as uid 65534 needs setuid") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let env = TestEnv::new();
    let _sb = env.start("c12", &[]);
    // Loosen the path so uid 65534 can reach the socket at all: what must
    // refuse it then is the helper's SO_PEERCRED check.
    let chmod = |p: &std::path::Path, m| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    let mut p = env.sock("c12");
    chmod(&p, 0o666);
    chmod(&env.agent("c12"), 0o666);
    while p.pop() && p.starts_with(env.root()) {
        chmod(&p, 0o711);
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "control::foreign_uid_probe_does_nothing_unless_spawned_by_its_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BOXDESK_TEST_PEER_SOCK", env.sock("c12"))
        .env("BOXDESK_TEST_PEER_AGENT", env.agent("c12"))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    // Back to private modes, or the stop on drop would (rightly) refuse
    // the loosened runtime dir.
    let mut p = env.sock("c12");
    chmod(&p, 0o600);
    chmod(&env.agent("c12"), 0o600);
    while p.pop() && p.starts_with(env.root()) {
        chmod(&p, 0o700);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let reply = text
        .split("REPLY<")
        .nth(1)
        .and_then(|r| r.split('>').next())
        .unwrap_or_else(|| {
            panic!(
                "probe did not run: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        !reply.starts_with("ok"),
        "a foreign peer got an answer: {reply}"
    );
    assert!(reply.is_empty() || reply.starts_with("err "), "{reply}");
    let agent = text
        .split("AGENT<")
        .nth(1)
        .and_then(|r| r.split('>').next())
        .unwrap_or_else(|| panic!("probe did not reach the agent socket: {text}"));
    println!(
        "a foreign peer got {reply:?} from the control socket, {agent:?} from the agent socket"
    );
    assert!(
        !agent.starts_with("OK"),
        "a foreign peer reached the agent: {agent}"
    );
    assert!(agent.is_empty() || agent.starts_with("ERR "), "{agent}");
    // The helper is unharmed.
    let start = Instant::now();
    assert_eq!(env.info("c12")["state"], "running");
    assert!(start.elapsed() < Duration::from_secs(5));
}
