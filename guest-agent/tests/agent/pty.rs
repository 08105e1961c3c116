//! ExecPty: size, resize, VEOF, the controlling terminal.

use boxdesk_channel::{Exec, Frame, SecretBytes, WinSize};

use crate::support::{collect, sh, Agent};

fn pty_available() -> bool {
    if std::fs::metadata("/dev/ptmx").is_ok() {
        return true;
    }
    crate::support::skip("no /dev/ptmx here");
    false
}

fn read_until(s: &mut boxdesk_channel::Session, needle: &str) -> String {
    let mut seen = String::new();
    while !seen.contains(needle) {
        match s.recv().unwrap() {
            Some(Frame::Stdout(d)) => seen.push_str(&String::from_utf8_lossy(&d)),
            other => panic!("waiting for {needle:?} after {seen:?}, got {other:?}"),
        }
    }
    seen
}

#[test]
fn stty_size_matches_the_execpty_size_and_follows_a_resize() {
    if !pty_available() {
        return;
    }
    let agent = Agent::start();
    let mut s = agent.session();
    let script = "stty size; read x; stty size";
    s.send(&Frame::ExecPty(
        sh(script),
        WinSize {
            cols: 100,
            rows: 30,
        },
    ))
    .unwrap();
    read_until(&mut s, "30 100");
    s.send(&Frame::Resize(WinSize {
        cols: 120,
        rows: 40,
    }))
    .unwrap();
    s.send(&Frame::Stdin("go\n".into())).unwrap();
    let r = collect(&mut s);
    assert_eq!(r.exit, Some(0));
    assert!(r.stdout_text().contains("40 120"), "{:?}", r.stdout_text());
    assert!(r.stderr.is_empty(), "PTY output is all Stdout");
}

#[test]
fn the_veof_byte_ends_cat_on_a_pty() {
    if !pty_available() {
        return;
    }
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::ExecPty(
        Exec::new("cat", Vec::<&str>::new()),
        WinSize { cols: 80, rows: 24 },
    ))
    .unwrap();
    s.send(&Frame::Stdin("hello\n".into())).unwrap();
    read_until(&mut s, "hello\r\nhello\r\n");
    s.send(&Frame::Stdin(SecretBytes::default())).unwrap();
    let r = collect(&mut s);
    assert_eq!(r.exit, Some(0), "{:?}", r.errors);
}

#[test]
fn a_pty_exec_has_a_controlling_terminal_term_and_merged_output() {
    if !pty_available() {
        return;
    }
    let agent = Agent::start();
    let mut s = agent.session();
    let script = "tty; echo \"$TERM\"; echo to-stderr >&2; test -t 0 && echo stdin-is-tty";
    s.send(&Frame::ExecPty(sh(script), WinSize { cols: 80, rows: 24 }))
        .unwrap();
    let r = collect(&mut s);
    let out = r.stdout_text();
    assert_eq!(r.exit, Some(0));
    assert!(out.contains("/dev/pts/"), "{out:?}");
    assert!(out.contains("xterm-256color"), "{out:?}");
    assert!(out.contains("to-stderr"), "{out:?}");
    assert!(out.contains("stdin-is-tty"), "{out:?}");
    assert!(r.stderr.is_empty());
}

#[test]
fn a_signal_reaches_the_foreground_job_on_a_pty() {
    if !pty_available() {
        return;
    }
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::ExecPty(
        sh("echo ready; exec sleep 30"),
        WinSize { cols: 80, rows: 24 },
    ))
    .unwrap();
    read_until(&mut s, "ready");
    s.send(&Frame::Signal(libc::SIGINT)).unwrap();
    assert_eq!(collect(&mut s).exit, Some(-libc::SIGINT));
}
