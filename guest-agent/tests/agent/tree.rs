//! An exec's whole process tree ends with it: every process of its session,
//! in its process group or another, is gone once Exit or TimedOut arrives,
//! whatever ended the exec — and a fork bomb too, under a task limit, in a
//! pid namespace.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_channel::{Exec, Frame, WinSize};

use crate::support::{collect, have, marker, pids_with, sh, skip, stat, wait_for, Agent};

/// A script that starts `sleep MARK` in a process group of its own (as
/// shell job control does; out of reach of a process-group kill) and in
/// the exec's own group, prints `up`, then runs `rest`. Only the two
/// sleeps have `sleep MARK` in their command line.
fn two_groups(mark: &str, rest: &str) -> String {
    format!(
        "m={mark}; export m; python3 -c 'import os; os.setpgid(0, 0); \
         os.execvp(\"sleep\", [\"sleep\", os.environ[\"m\"]])' >/dev/null 2>&1 & \
         sleep $m >/dev/null 2>&1 & echo up; {rest}"
    )
}

/// Waits until both sleeps run, one of them leading a group of its own.
fn both_groups_up(sleeps: &str) -> bool {
    wait_for(Duration::from_secs(10), || {
        let pids = pids_with(sleeps);
        pids.len() == 2 && pids.iter().any(|&p| stat(p).is_some_and(|s| s.pgrp == p))
    })
}

#[derive(Debug, Clone, Copy)]
enum End {
    Exit,
    Pty,
    Timeout,
    Signal,
    Disconnect,
}

#[test]
fn whatever_ends_an_exec_every_process_of_its_session_is_gone_when_the_last_frame_arrives() {
    if !have("python3") {
        skip("needs python3 to put a process in a group of its own");
        return;
    }
    let agent = Agent::start();
    for (n, end) in [
        End::Exit,
        End::Pty,
        End::Timeout,
        End::Signal,
        End::Disconnect,
    ]
    .into_iter()
    .enumerate()
    {
        let mark = marker(40 + n as u32);
        let sleeps = format!("sleep {mark}");
        let rest = match end {
            End::Exit | End::Pty => "read go; exit 3",
            _ => "sleep 60",
        };
        let mut exec = sh(&two_groups(&mark, rest));
        if matches!(end, End::Timeout) {
            // Long enough for python to start on a loaded machine.
            exec.timeout_ms = 4000;
        }
        let mut s = agent.session();
        match end {
            End::Pty => s
                .send(&Frame::ExecPty(exec, WinSize { cols: 80, rows: 24 }))
                .unwrap(),
            _ => s.send(&Frame::Exec(exec)).unwrap(),
        }
        // Wait for "up" (on a PTY: within the terminal's output).
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("up") {
            match s.recv().unwrap() {
                Some(Frame::Stdout(d)) | Some(Frame::Stderr(d)) => seen.extend_from_slice(&d),
                other => panic!("{end:?}: before up: {other:?}"),
            }
        }
        assert!(
            both_groups_up(&sleeps),
            "{end:?}: {:?} after {:?}",
            pids_with(&sleeps),
            String::from_utf8_lossy(&seen)
        );
        match end {
            End::Exit | End::Pty => {
                s.send(&Frame::Stdin("go\n".into())).unwrap();
                let r = collect(&mut s);
                assert_eq!(r.exit, Some(3), "{end:?}: {r:?}");
            }
            End::Timeout => assert!(collect(&mut s).timed_out, "{end:?}"),
            End::Signal => {
                s.send(&Frame::Signal(libc::SIGKILL)).unwrap();
                assert_eq!(collect(&mut s).exit, Some(-libc::SIGKILL), "{end:?}");
            }
            End::Disconnect => {
                drop(s);
                assert!(
                    wait_for(Duration::from_secs(10), || pids_with(&sleeps).is_empty()),
                    "{end:?}: left {:?}",
                    pids_with(&sleeps)
                );
                continue;
            }
        }
        // No waiting: gone before the last frame was sent.
        assert_eq!(pids_with(&sleeps), Vec::<u32>::new(), "{end:?}: survivors");
    }
}

#[test]
fn a_thousand_processes_in_five_hundred_groups_are_gone_when_exit_arrives() {
    if !have("perl") {
        skip("needs perl to start the processes");
        return;
    }
    let agent = Agent::start();
    let mark = marker(60);
    let sleeps = format!("sleep {mark}");
    // Every other one in a process group of its own, one every 2 ms.
    let script = "perl -e 'for my $i (1..1000) { my $p = fork; \
                  if (defined $p && $p == 0) { setpgrp(0, 0) if $i % 2; exec \"sleep\", $ARGV[0] } \
                  select(undef, undef, undef, 0.002) }' \"$0\"; echo up; sleep 60";
    let mut exec = Exec::new("sh", ["-c", script, &mark]);
    exec.timeout_ms = 30_000;
    let mut s = agent.session();
    s.send(&Frame::Exec(exec)).unwrap();
    assert_eq!(s.recv().unwrap(), Some(Frame::Stdout(b"up\n".to_vec())));
    assert!(
        wait_for(Duration::from_secs(20), || pids_with(&sleeps).len() == 1000),
        "started {}",
        pids_with(&sleeps).len()
    );
    let start = Instant::now();
    s.send(&Frame::Signal(libc::SIGKILL)).unwrap();
    let r = collect(&mut s);
    let took = start.elapsed();
    let left = pids_with(&sleeps);
    eprintln!("1000 processes in 500 groups: Exit {took:?} after the Signal");
    assert_eq!(r.exit, Some(-libc::SIGKILL), "{r:?}");
    assert_eq!(left.len(), 0, "survivors: {left:?}");
}

/// The wrapper that runs the agent as root of a fresh user namespace mapped
/// to an unprivileged uid (so `RLIMIT_NPROC` applies) and as PID 1 of a new
/// pid namespace; `None` (with the reason said) where that cannot be made.
fn unprivileged_pid_namespace() -> Option<Vec<&'static str>> {
    let unshare = [
        "unshare",
        "--map-root-user",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "--",
    ];
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut wrapper: Vec<&str> = Vec::new();
    if root {
        if !have("setpriv") {
            skip("needs setpriv to become nobody");
            return None;
        }
        wrapper.extend([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]);
    }
    wrapper.extend(unshare);
    if !have("unshare") {
        skip("needs unshare");
        return None;
    }
    let ok = std::process::Command::new(wrapper[0])
        .args(&wrapper[1..])
        .args(["sh", "-c", "grep -q '^ *0 *[1-9]' /proc/self/uid_map"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip("cannot make a user namespace mapped to an unprivileged uid here");
        return None;
    }
    Some(wrapper)
}

/// A temp dir the unprivileged agent can use: its root and results dirs
/// are nobody's when we are root.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for sub in ["root", "results"] {
        let p = dir.path().join(sub);
        std::fs::create_dir(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap_or(());
    }
    dir
}

const PIDS_MAX: usize = 5000;

#[test]
fn a_fork_bomb_held_by_the_task_limit_is_gone_when_timed_out_arrives() {
    if !have("perl") {
        skip("needs perl for a bomb that keeps forking");
        return;
    }
    let Some(wrapper) = unprivileged_pid_namespace() else {
        return;
    };
    let dir = shared_dir();
    let listener = std::os::unix::net::UnixListener::bind(dir.path().join("agent.sock")).unwrap();
    let max = PIDS_MAX.to_string();
    let agent = Agent::launch_with(
        dir,
        &wrapper,
        &[("BOXDESK_NAMESPACE", "1")],
        &["--pids-max", &max],
        Some(listener),
    );
    // Never let the bomb loose: the limit must be in force, for a uid
    // that is not the host's root.
    let check = agent.run(sh(
        "tr '\\0' ' ' </proc/1/cmdline; echo; grep 'Max processes' /proc/self/limits; \
         cat /proc/self/uid_map",
    ));
    let text = check.stdout_text();
    let mut lines = text.lines();
    assert!(
        lines
            .next()
            .is_some_and(|l| l.contains("boxdesk-guest-agent")),
        "the agent is PID 1 of a pid namespace: {text}"
    );
    let limits: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(limits.get(2), Some(&max.as_str()), "{text}");
    let map: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert!(map.get(1).is_some_and(|outer| *outer != "0"), "{text}");

    let mark = format!("bomb-{}", marker(50));
    // Every process forks for ever, failures included: the bomb stays at
    // the limit while it is killed (a shell bomb exits at its first
    // failed fork and collapses by itself).
    let mut exec = Exec::new(
        "sh",
        ["-c", "perl -e 'fork while 1' \"$0\" & exec sleep 30", &mark],
    );
    exec.timeout_ms = 2000;
    let (peak, late) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let sampler = {
        let (peak, late, done) = (Arc::clone(&peak), Arc::clone(&late), Arc::clone(&done));
        let mark = mark.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let n = pids_with(&mark).len();
                peak.fetch_max(n, Ordering::Relaxed);
                if start.elapsed() > Duration::from_millis(1200)
                    && start.elapsed() < Duration::from_millis(2000)
                {
                    late.fetch_max(n, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut s = agent.session();
    s.send(&Frame::Exec(exec)).unwrap();
    let r = collect(&mut s);
    let took = start.elapsed();
    let left = pids_with(&mark);
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let (peak, late) = (peak.load(Ordering::Relaxed), late.load(Ordering::Relaxed));
    eprintln!(
        "fork bomb: peak {peak} processes (limit {PIDS_MAX}), {late} just before its timeout, \
         TimedOut after {took:?}"
    );
    assert!(r.timed_out, "{r:?}");
    assert_eq!(left, Vec::<u32>::new(), "bomb processes outlived TimedOut");
    assert!(peak <= PIDS_MAX, "the task limit did not hold: peak {peak}");
    if late < 100 {
        // Some machines stop fork bombs from outside (a watchdog killing
        // them): then the agent had nothing left to end.
        skip(&format!(
            "the fork bomb was stopped from outside before its timeout (peak {peak}, \
             {late} left at 1.2-2 s): the end of a live bomb was not checked"
        ));
    }
    // The agent serves on.
    let r = agent.run(sh("echo alive"));
    assert_eq!(r.stdout_text(), "alive\n", "{r:?}");
}
