//! What the agent sets up before serving: an inherited listening socket
//! (`--listen fd:N`) and its checks, the task limit (`--pids-max`), and a
//! non-dumpable agent.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, have, sh, skip, Agent, BIN};

fn inherited() -> (tempfile::TempDir, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("agent.sock")).unwrap();
    (dir, listener)
}

#[test]
fn an_inherited_listening_socket_is_served_and_never_reaches_an_exec() {
    let (dir, listener) = inherited();
    let agent = Agent::launch_with(dir, &[], &[], &[], Some(listener));
    assert!(
        agent.log_text().contains("boxdesk-guest-agent ready fd:3"),
        "{}",
        agent.log_text()
    );
    // The exec's descriptor 3 is not the agent's socket: it is
    // close-on-exec in the agent.
    let r = agent.run(sh("readlink /proc/$$/fd/3 || echo closed"));
    assert_eq!(
        (r.exit, r.stdout_text().trim()),
        (Some(0), "closed"),
        "{r:?}"
    );
    // And it keeps serving, one session after another.
    for _ in 0..3 {
        let r = agent.run(sh("echo again"));
        assert_eq!(r.stdout_text(), "again\n");
    }
}

/// Starts the agent with `fd` as descriptor 3 and `--listen fd:3` (or
/// `listen` when given); returns its exit status and stderr, killing it if
/// it is still running after 10 s.
fn start_with(fd: Option<OwnedFd>, listen: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", listen, "--root"])
        .arg(dir.path())
        .arg("--results")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(fd) = &fd {
        support::inherit_as_fd3(&mut cmd, fd.as_raw_fd());
    }
    let mut child = cmd.spawn().unwrap();
    drop(fd);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

#[test]
fn a_descriptor_that_is_not_a_listening_unix_stream_socket_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file: OwnedFd = std::fs::File::create(dir.path().join("f")).unwrap().into();
    let (stream, _peer) = UnixStream::pair().unwrap();
    let datagram = UnixDatagram::bind(dir.path().join("dgram")).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cases: [(Option<OwnedFd>, &str, &str); 7] = [
        (None, "fd:7", "--listen fd:7: Bad file descriptor"),
        // Not inherited, and not mistaken for a descriptor the agent opens
        // itself at start (its root directory's, say).
        (None, "fd:3", "--listen fd:3: Bad file descriptor"),
        (Some(file), "fd:3", "--listen fd:3: not a socket"),
        (Some(stream.into()), "fd:3", "not listening"),
        (Some(datagram.into()), "fd:3", "not a stream socket"),
        (Some(tcp.into()), "fd:3", "not a Unix socket"),
        (None, "fd:x", "bad descriptor number"),
    ];
    for (fd, listen, needle) in cases {
        let (status, err) = start_with(fd, listen);
        assert!(
            matches!(status, Some(c) if c != 0),
            "{listen} ({needle}): the agent did not refuse to start: {status:?} {err}"
        );
        assert!(
            err.contains(needle),
            "{listen}: wanted {needle:?} in {err:?}"
        );
    }
}

#[test]
fn pids_max_sets_the_task_limit_every_exec_inherits() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::launch_with(dir, &[], &[], &["--pids-max", "777"], None);
    let r = agent.run(sh("grep 'Max processes' /proc/self/limits"));
    let line = r.stdout_text();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.get(2..4), Some(&["777", "777"][..]), "{line:?}");
    // Without the flag, the agent leaves the limit alone.
    let agent = Agent::start();
    let r = agent.run(sh("grep 'Max processes' /proc/self/limits"));
    assert!(!r.stdout_text().contains(" 777 "), "{}", r.stdout_text());
}

#[test]
fn a_process_of_the_same_uid_cannot_open_the_agents_descriptors_or_environment() {
    // Inside a sandbox neither the agent nor its execs hold capabilities
    // (a capable root would pass the kernel's check through its
    // capabilities whatever the agent does): as root, run the agent
    // without any, as the sandbox does, so that its being dumpable or not
    // is what decides.
    // SAFETY: geteuid has no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if root && !have("setpriv") {
        skip("needs setpriv to run the agent without capabilities as root");
        return;
    }
    let wrapper: &[&str] = if root {
        &["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    } else {
        &[]
    };
    let agent = Agent::launch(tempfile::tempdir().unwrap(), wrapper, &[]);
    // setpriv execs the agent: same pid.
    let pid = agent.pid();
    let probe = format!(
        "p() {{ if \"$@\" >/dev/null 2>&1; then echo open; else echo refused; fi; }}; \
         echo fd $(p sh -c 'exec 3>>/proc/{pid}/fd/2'); \
         echo link $(p readlink /proc/{pid}/fd/2); \
         echo environ $(p sh -c 'exec 3</proc/{pid}/environ'); \
         echo mem $(p sh -c 'exec 3</proc/{pid}/mem'); \
         echo own $(p readlink /proc/$$/fd/2)"
    );
    let r = agent.run(sh(&probe));
    assert_eq!(r.exit, Some(0), "{r:?}");
    assert_eq!(
        r.stdout_text(),
        "fd refused\nlink refused\nenviron refused\nmem refused\nown open\n",
        "the agent's /proc/{pid} files as seen by a process of its uid"
    );
    // The agent's own /proc use still works (the sweep reads /proc/self).
    let again = agent.run(sh("sleep 0.1 & echo still"));
    assert_eq!(again.stdout_text(), "still\n");
}
