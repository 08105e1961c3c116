//! `boxdesk_sandbox::client` against the real agent (`boxdesk __agent`,
//! listening on a Unix socket in a temp dir, with its own root and
//! results dirs): every way an exec ends and the exit status it maps to,
//! stdin, signals, a PTY and its resize, PutFile/GetFile series through a
//! hybrid socket (the namespace forwarder in front of the agent), and the
//! tokio flavour cowork uses. No sandbox, no bwrap: these run as root and
//! as nobody alike.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_channel::{Exec, SecretBytes, WinSize, AGENT_PORT};
use boxdesk_sandbox::client::{
    self, AgentError, Connection, Control, Endpoint, Event, Fetched, Outcome, Output,
};
use boxdesk_sandbox::forward::{self, AgentAddr};

use crate::support::bin;

/// One `boxdesk __agent`, killed on drop.
struct Agent {
    child: Child,
    dir: tempfile::TempDir,
    sock: PathBuf,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("bxc")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let (sock, root, results) = (
            dir.path().join("a.sock"),
            dir.path().join("root"),
            dir.path().join("results"),
        );
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&results).unwrap();
        let child = Command::new(bin())
            .arg("__agent")
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--root")
            .arg(&root)
            .arg("--results")
            .arg(&results)
            .env_remove("BOXDESK_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start boxdesk __agent");
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < deadline, "the agent never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        Agent { child, dir, sock }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Unix(self.sock.clone())
    }

    fn connect(&self) -> Connection {
        client::connect(&self.endpoint(), "t").expect("connect to the agent")
    }

    /// A hybrid `CONNECT` socket in front of the agent, as a namespace
    /// sandbox's helper serves it.
    fn hybrid(&self) -> Endpoint {
        let path = self.dir.path().join("h.agent");
        let listener = UnixListener::bind(&path).unwrap();
        let addr = Arc::new(AgentAddr::new(&self.sock).unwrap());
        std::thread::spawn(move || forward::serve(listener, addr));
        Endpoint::Hybrid {
            path,
            port: AGENT_PORT,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(script: &str) -> Exec {
    Exec::new("sh", ["-c", script])
}

/// Reads `output` to its end: (stdout, stderr, errors, outcome).
fn drain(output: &mut Output) -> (String, String, Vec<String>, Outcome) {
    let (mut out, mut err, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        match output.next_event().expect("the exec's events") {
            Event::Stdout(d) => out.extend_from_slice(&d),
            Event::Stderr(d) => err.extend_from_slice(&d),
            Event::Error(m) => errors.push(m),
            Event::Ended(o) => {
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    String::from_utf8_lossy(&err).into_owned(),
                    errors,
                    o,
                )
            }
        }
    }
}

fn ended(agent: &Agent, exec: Exec) -> Outcome {
    let (mut output, mut input) = agent.connect().exec(exec, None).unwrap();
    input.send(Control::EndOfStdin).unwrap();
    drain(&mut output).3
}

#[test]
fn a_command_s_output_and_exit_status_come_back_as_they_are() {
    let agent = Agent::start();
    let got = agent
        .connect()
        .capture(sh("echo out; echo err >&2; exit 3"))
        .unwrap();
    assert_eq!(got.outcome, Outcome::Exited(3));
    assert_eq!(got.outcome.exit_code(), 3);
    assert_eq!(got.stdout, b"out\n");
    assert_eq!(got.stderr, b"err\n");
    assert_eq!(ended(&agent, Exec::new("true", [""; 0])).exit_code(), 0);
}

#[test]
fn a_command_killed_by_signal_n_exits_128_plus_n() {
    let agent = Agent::start();
    let outcome = ended(&agent, sh("kill -TERM $$"));
    assert_eq!(outcome, Outcome::Signaled(libc::SIGTERM));
    assert_eq!(outcome.exit_code(), 128 + libc::SIGTERM);
}

#[test]
fn a_signal_sent_through_the_client_reaches_the_command() {
    let agent = Agent::start();
    let (mut output, mut input) = agent
        .connect()
        .exec(sh("echo up; exec sleep 30"), None)
        .unwrap();
    assert_eq!(
        output.next_event().unwrap(),
        Event::Stdout(b"up\n".to_vec())
    );
    input.send(Control::Signal(libc::SIGKILL)).unwrap();
    let outcome = drain(&mut output).3;
    assert_eq!(outcome, Outcome::Signaled(libc::SIGKILL));
    assert_eq!(outcome.exit_code(), 137);
}

#[test]
fn a_command_past_its_timeout_exits_124() {
    let agent = Agent::start();
    let mut exec = Exec::new("sleep", ["30"]);
    exec.timeout_ms = 200;
    let started = Instant::now();
    let outcome = ended(&agent, exec);
    assert_eq!(outcome, Outcome::TimedOut);
    assert_eq!(outcome.exit_code(), 124);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_missing_program_exits_127_and_one_that_cannot_run_126_as_in_a_shell() {
    let agent = Agent::start();
    let (mut output, mut input) = agent
        .connect()
        .exec(Exec::new("boxdesk-no-such-program", [""; 0]), None)
        .unwrap();
    input.send(Control::EndOfStdin).unwrap();
    let (_, _, errors, outcome) = drain(&mut output);
    assert!(
        matches!(&outcome, Outcome::Refused(m) if m.starts_with("ENOENT:")),
        "{outcome:?}"
    );
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(outcome.exit_code(), 127);

    // A directory and a file without the execute bit: the kernel refuses
    // them (EACCES), as a shell's 126.
    let plain = agent.dir.path().join("plain");
    std::fs::write(&plain, "echo no\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    for cmd in [Path::new("/tmp"), plain.as_path()] {
        let outcome = ended(&agent, Exec::new(cmd.to_str().unwrap(), [""; 0]));
        assert!(
            matches!(&outcome, Outcome::Refused(m) if m.starts_with("EACCES:")),
            "{cmd:?}: {outcome:?}"
        );
        assert_eq!(outcome.exit_code(), 126, "{cmd:?}");
    }
    // A refused command is an error for a captured exec.
    let r = agent
        .connect()
        .capture(Exec::new("boxdesk-no-such-program", [""; 0]));
    assert!(matches!(r, Err(AgentError::Refused(_))), "{r:?}");
}

#[test]
fn stdin_sent_in_pieces_and_its_end_reach_the_command() {
    let agent = Agent::start();
    let (mut output, mut input) = agent.connect().exec(Exec::new("wc", ["-c"]), None).unwrap();
    // More than one frame's worth, then nothing (no accidental EOF), then
    // the end.
    let big = vec![b'x'; boxdesk_channel::MAX_PAYLOAD as usize + 10];
    input.send(Control::Stdin(SecretBytes::new(big))).unwrap();
    input.send(Control::Stdin(SecretBytes::default())).unwrap();
    input
        .send(Control::Stdin(SecretBytes::copy_from(b"tail")))
        .unwrap();
    input.send(Control::EndOfStdin).unwrap();
    let (out, _, _, outcome) = drain(&mut output);
    assert_eq!(outcome, Outcome::Exited(0));
    let want = boxdesk_channel::MAX_PAYLOAD as usize + 14;
    assert_eq!(out.trim(), want.to_string());
}

#[test]
fn a_pty_exec_gets_its_size_and_a_resize() {
    let agent = Agent::start();
    let size = WinSize { cols: 77, rows: 33 };
    let (mut output, mut input) = agent
        .connect()
        .exec(sh("stty size; read x; stty size"), Some(size))
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("33 77") {
        match output.next_event().unwrap() {
            Event::Stdout(d) => seen.push_str(&String::from_utf8_lossy(&d)),
            other => panic!("{other:?} before the first size: {seen:?}"),
        }
    }
    input
        .send(Control::Resize(WinSize {
            cols: 100,
            rows: 40,
        }))
        .unwrap();
    input
        .send(Control::Stdin(SecretBytes::copy_from(b"\n")))
        .unwrap();
    let (out, _, errors, outcome) = drain(&mut output);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(outcome, Outcome::Exited(0));
    assert!(out.contains("40 100"), "{out:?}");
}

#[test]
fn files_go_in_and_come_back_whole_through_a_hybrid_socket() {
    let agent = Agent::start();
    let endpoint = agent.hybrid();
    let big: Vec<u8> = (0..client::PUT_CHUNK * 2 + 12345)
        .map(|i| (i % 251) as u8)
        .collect();
    let mut upload = client::connect(&endpoint, "t").unwrap().upload().unwrap();
    upload.file(b"/d/big", 0o640, &mut big.as_slice()).unwrap();
    upload.file(b"/d/empty", 0o755, &mut &b""[..]).unwrap();
    upload.file(b"/../escape", 0o644, &mut &b"x"[..]).unwrap();
    let refusals = upload.finish();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(std::fs::read(agent.root().join("d/big")).unwrap(), big);

    // One session, several files, a refusal in the middle: it goes on.
    let mut conn = client::connect(&endpoint, "t").unwrap();
    let host = agent.dir.path().join("back");
    std::fs::create_dir(&host).unwrap();
    let fetch = |conn: &mut Connection, path: &[u8], to: &str| {
        let to = host.join(to);
        conn.get_file(path, |_| {
            std::fs::File::create(&to).map_err(|e| e.to_string())
        })
        .unwrap()
    };
    assert!(matches!(
        fetch(&mut conn, b"/d/big", "big"),
        Fetched::Copied
    ));
    let missing = fetch(&mut conn, b"/d/nope", "nope");
    assert!(
        matches!(&missing, Fetched::Refused(m) if m.contains("ENOENT")),
        "{missing:?}"
    );
    assert!(matches!(
        fetch(&mut conn, b"/d/empty", "empty"),
        Fetched::Copied
    ));
    assert_eq!(std::fs::read(host.join("big")).unwrap(), big);
    let mode = |p: &str| {
        std::fs::metadata(host.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("big"), 0o640);
    assert_eq!(mode("empty"), 0o755);
    assert!(std::fs::read(host.join("empty")).unwrap().is_empty());
    assert!(!host.join("nope").exists());
}

#[test]
fn a_put_whose_source_fails_midway_leaves_no_partial_file() {
    struct Failing(usize);
    impl std::io::Read for Failing {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("disk on fire"));
            }
            let n = buf.len().min(self.0);
            buf[..n].fill(b'a');
            self.0 -= n;
            Ok(n)
        }
    }
    let agent = Agent::start();
    let mut upload = agent.connect().upload().unwrap();
    let r = upload.file(b"/half", 0o644, &mut Failing(client::PUT_CHUNK + 1));
    assert!(matches!(r, Err(AgentError::Source(_))), "{r:?}");
    upload.file(b"/next", 0o644, &mut &b"ok"[..]).unwrap();
    upload.finish();
    assert!(!agent.root().join("half").exists());
    assert_eq!(std::fs::read(agent.root().join("next")).unwrap(), b"ok");
}

#[test]
fn the_tokio_flavour_maps_the_same_ends_and_caps_a_file_from_its_size() {
    let agent = Agent::start();
    std::fs::write(agent.root().join("f"), vec![b'z'; 5000]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let connect = || client::connect_async(&agent.sock, "t");
        let got = client::get_file_async(connect().await.unwrap(), b"/f", 5000)
            .await
            .unwrap();
        assert_eq!(got, vec![b'z'; 5000]);
        let r = client::get_file_async(connect().await.unwrap(), b"/f", 4999).await;
        assert!(
            matches!(r, Err(AgentError::TooLarge { size: 5000, .. })),
            "{r:?}"
        );
        let r = client::get_file_async(connect().await.unwrap(), b"/none", 10).await;
        assert!(matches!(r, Err(AgentError::Refused(_))), "{r:?}");

        for (exec, code) in [
            (sh("cat; exit 7"), 7),
            (sh("kill -KILL $$"), 137),
            (Exec::new("boxdesk-no-such-program", [""; 0]), 127),
            (Exec::new("/tmp", [""; 0]), 126),
        ] {
            let (mut output, mut input) = client::exec_async(connect().await.unwrap(), exec, None)
                .await
                .unwrap();
            input
                .send(Control::Stdin(SecretBytes::copy_from(b"in")))
                .await
                .unwrap();
            input.send(Control::EndOfStdin).await.unwrap();
            let mut out = Vec::new();
            let outcome = loop {
                match output.next_event().await.unwrap() {
                    Event::Stdout(d) => out.extend_from_slice(&d),
                    Event::Ended(o) => break o,
                    _ => {}
                }
            };
            assert_eq!(outcome.exit_code(), code, "{outcome:?}");
            if code == 7 {
                assert_eq!(out, b"in");
            }
        }
    });
    let r = rt.block_on(client::connect_async(
        &agent.dir.path().join("none.sock"),
        "gone",
    ));
    assert!(matches!(r, Err(AgentError::Connect(_))), "{r:?}");
}
