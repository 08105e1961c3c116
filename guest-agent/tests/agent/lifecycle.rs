//! Process lifetimes: kills, disconnects, timeouts, orphans, concurrency.

use std::time::Duration;

use boxdesk_channel::{Frame, WinSize};

use crate::support::{collect, marker, pids_with, sh, wait_for, zombies_of, Agent};

/// Starts `script` (which must print `up` once running), then ends it with
/// `end`; asserts nothing whose command line has `marker` survives.
fn no_survivor(script: &str, n: u32, end: impl FnOnce(&mut boxdesk_channel::Session)) {
    let marker = &marker(n);
    let script = script.replace("MARK", marker);
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(sh(&script))).unwrap();
    assert_eq!(s.recv().unwrap(), Some(Frame::Stdout(b"up\n".to_vec())));
    assert!(wait_for(Duration::from_secs(5), || !pids_with(marker).is_empty()));
    end(&mut s);
    let gone = wait_for(Duration::from_secs(5), || pids_with(marker).is_empty());
    assert!(gone, "survivors: {:?}", pids_with(marker));
}

#[test]
fn sigkill_to_a_shell_running_sleep_leaves_no_survivor() {
    no_survivor("echo up; sleep MARK; echo x", 1, |s| {
        s.send(&Frame::Signal(libc::SIGKILL)).unwrap();
        assert_eq!(collect(s).exit, Some(-9));
    });
}

#[test]
fn sigkill_to_a_shell_waiting_for_a_background_sleep_leaves_no_survivor() {
    no_survivor("sleep MARK & echo up; wait", 2, |s| {
        s.send(&Frame::Signal(libc::SIGKILL)).unwrap();
        assert_eq!(collect(s).exit, Some(-9));
    });
}

#[test]
fn a_client_disconnect_mid_stream_kills_the_process_group() {
    let marker = &marker(3);
    let agent = Agent::start();
    let mut s = agent.session();
    let script = format!("sleep {marker} & echo up; while :; do echo tick; sleep 0.01; done");
    s.send(&Frame::Exec(sh(&script))).unwrap();
    match s.recv().unwrap() {
        Some(Frame::Stdout(d)) => assert!(d.starts_with(b"up\n"), "{d:?}"),
        other => panic!("{other:?}"),
    }
    assert!(wait_for(Duration::from_secs(5), || !pids_with(marker).is_empty()));
    drop(s);
    let gone = wait_for(Duration::from_secs(5), || pids_with(marker).is_empty());
    assert!(gone, "survivors: {:?}", pids_with(marker));
    // And the agent keeps serving.
    assert_eq!(agent.run(sh("exit 3")).exit, Some(3));
}

#[test]
fn a_half_close_after_exec_is_a_disconnect() {
    no_survivor("echo up; sleep MARK", 4, |s| {
        s.close_write().unwrap();
        let r = collect(s);
        assert_eq!((r.exit, r.timed_out), (None, false));
    });
}

#[test]
fn a_timeout_sends_timed_out_and_kills_the_whole_group() {
    let marker = &marker(5);
    let agent = Agent::start();
    let mut exec = sh(&format!("sleep {marker} & echo up; sleep {marker}9"));
    exec.timeout_ms = 500;
    let start = std::time::Instant::now();
    let r = agent.run(exec);
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit, None);
    assert!(start.elapsed() >= Duration::from_millis(500));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(r.stdout_text(), "up\n");
    let gone = wait_for(Duration::from_secs(5), || pids_with(marker).is_empty());
    assert!(gone, "survivors: {:?}", pids_with(marker));
}

#[test]
fn a_hundred_orphaned_grandchildren_leave_no_zombies() {
    let agent = Agent::start();
    let r = agent.run(sh("for i in $(seq 100); do (sleep 0.2 &) ; done"));
    assert_eq!(r.exit, Some(0));
    let clean = wait_for(Duration::from_secs(10), || {
        zombies_of(agent.pid()).is_empty() && crate::support::children_of(agent.pid()).is_empty()
    });
    assert!(clean, "zombies left: {:?}", zombies_of(agent.pid()));
}

#[test]
fn sixteen_concurrent_sessions_each_get_their_own_exit_code_and_output() {
    let agent = std::sync::Arc::new(Agent::start());
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let agent = std::sync::Arc::clone(&agent);
            std::thread::spawn(move || {
                let script = format!("for j in 1 2 3; do echo s{i}-$j; sleep 0.05; done; exit {i}");
                let mut s = agent.session();
                if i % 2 == 0 {
                    s.send(&Frame::ExecPty(sh(&script), WinSize { cols: 80, rows: 24 }))
                        .unwrap();
                } else {
                    s.send(&Frame::Exec(sh(&script))).unwrap();
                }
                (i, collect(&mut s))
            })
        })
        .collect();
    for t in threads {
        let (i, r) = t.join().unwrap();
        assert_eq!(r.exit, Some(i), "session {i}: {r:?}");
        let out = r.stdout_text().replace('\r', "");
        assert_eq!(out, format!("s{i}-1\ns{i}-2\ns{i}-3\n"), "session {i}");
    }
}

#[test]
fn shutdown_kills_running_execs_and_the_agent_exits_zero() {
    let mut agent = Agent::start();
    let mut busy = agent.session();
    let marker = marker(6);
    busy.send(&Frame::Exec(sh(&format!("echo up; sleep {marker}"))))
        .unwrap();
    assert_eq!(busy.recv().unwrap(), Some(Frame::Stdout(b"up\n".to_vec())));
    let mut s = agent.session();
    s.send(&Frame::Shutdown).unwrap();
    let status = agent
        .wait_exit(Duration::from_secs(10))
        .expect("agent exits");
    assert!(status.success(), "{status}");
    let gone = wait_for(Duration::from_secs(5), || pids_with(&marker).is_empty());
    assert!(gone);
}
