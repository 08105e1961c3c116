//! Starting the real agent binary and driving sessions against it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use boxdesk_channel::{Exec, Frame, Session};

pub const BIN: &str = env!("CARGO_BIN_EXE_boxdesk-guest-agent");

/// One agent process with its own socket, root and results dirs, killed on
/// drop.
pub struct Agent {
    child: Child,
    _dir: tempfile::TempDir,
    pub base: PathBuf,
    pub sock: PathBuf,
    pub root: PathBuf,
    pub results: PathBuf,
    pub log: PathBuf,
}

impl Agent {
    /// An agent in a fresh temp dir.
    pub fn start() -> Agent {
        Agent::launch(tempfile::tempdir().expect("tempdir"), &[], &[])
    }

    /// An agent whose command line is `wrapper… agent-args`, with extra env.
    pub fn launch(dir: tempfile::TempDir, wrapper: &[&str], env: &[(&str, &str)]) -> Agent {
        Agent::launch_with(dir, wrapper, env, &[], None)
    }

    /// [`Agent::launch`] with more agent arguments, and, when `inherit` is
    /// given, that listening socket (bound at `<dir>/agent.sock`) passed
    /// as descriptor 3 with `--listen fd:3` instead of a path.
    pub fn launch_with(
        dir: tempfile::TempDir,
        wrapper: &[&str],
        env: &[(&str, &str)],
        args: &[&str],
        inherit: Option<std::os::unix::net::UnixListener>,
    ) -> Agent {
        use std::os::fd::{AsRawFd, OwnedFd};
        let base = dir.path().to_path_buf();
        let (sock, root, results, log) = (
            base.join("agent.sock"),
            base.join("root"),
            base.join("results"),
            base.join("agent.log"),
        );
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&results).unwrap();
        let logf = std::fs::File::create(&log).unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        let inherit: Option<OwnedFd> = inherit.map(Into::into);
        match &inherit {
            Some(fd) => {
                cmd.arg("--listen").arg("fd:3");
                inherit_as_fd3(&mut cmd, fd.as_raw_fd());
            }
            None => {
                cmd.arg("--listen").arg(format!("unix:{}", sock.display()));
            }
        }
        cmd.arg("--root")
            .arg(&root)
            .arg("--results")
            .arg(&results)
            .args(args)
            .env("AGENT_ONLY_VARIABLE", "must-not-leak")
            .env_remove("BOXDESK_NAMESPACE")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf);
        let child = cmd.spawn().expect("start the agent");
        drop(inherit);
        let mut agent = Agent {
            child,
            _dir: dir,
            base,
            sock,
            root,
            results,
            log,
        };
        agent.wait_ready();
        agent
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.log_text().contains("boxdesk-guest-agent ready ") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("agent exited with {status}: {}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("agent never became ready: {}", self.log_text());
    }

    /// What the agent printed on stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The agent's resident memory (`VmRSS`) in KiB; `pid` is the agent's
    /// own pid (not a wrapper's).
    pub fn rss_kib(pid: u32) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// The pid of the process started (the agent, or its wrapper).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A connected, handshaken session.
    pub fn session(&self) -> Session {
        Session::connect_unix(&self.sock).expect("connect to the agent")
    }

    /// Runs `exec` on a new session and collects everything until close.
    pub fn run(&self, exec: Exec) -> Run {
        let mut s = self.session();
        s.send(&Frame::Exec(exec)).unwrap();
        collect(&mut s)
    }

    /// Waits (up to `timeout`) for the agent process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sh -c script`.
pub fn sh(script: &str) -> Exec {
    Exec::new("sh", ["-c", script])
}

/// A file that came back as File frames.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Got {
    pub mode: u32,
    pub total: u64,
    pub data: Vec<u8>,
}

/// Everything one session sent until it closed.
#[derive(Debug, Default)]
pub struct Run {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: Option<i32>,
    pub timed_out: bool,
    pub errors: Vec<String>,
    pub files: BTreeMap<String, Got>,
    /// `None` for a clean EOF, else the receive error.
    pub end: Option<String>,
    /// Frame kinds in arrival order, repeats collapsed.
    pub order: Vec<&'static str>,
}

impl Run {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// Receives until the session ends, with `on_output` seeing each Stdout
/// (true) or Stderr (false) chunk instead of it being stored when given.
/// Sees each output chunk: `true` for Stdout, `false` for Stderr.
pub type OutputSink<'a> = &'a mut dyn FnMut(bool, &[u8]);

pub fn collect_with(s: &mut Session, mut on_output: Option<OutputSink<'_>>) -> Run {
    let mut run = Run::default();
    loop {
        let frame = match s.recv() {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                run.end = Some(e.to_string());
                break;
            }
        };
        let kind = match frame {
            Frame::Stdout(d) if on_output.is_some() => {
                if let Some(f) = on_output.as_mut() {
                    f(true, &d);
                }
                "out"
            }
            Frame::Stderr(d) if on_output.is_some() => {
                if let Some(f) = on_output.as_mut() {
                    f(false, &d);
                }
                "out"
            }
            Frame::Stdout(d) => {
                run.stdout.extend_from_slice(&d);
                "out"
            }
            Frame::Stderr(d) => {
                run.stderr.extend_from_slice(&d);
                "out"
            }
            Frame::Exit(c) => {
                run.exit = Some(c);
                "exit"
            }
            Frame::TimedOut => {
                run.timed_out = true;
                "timedout"
            }
            Frame::Error(m) => {
                run.errors.push(m);
                "error"
            }
            Frame::File {
                path,
                mode,
                offset,
                total_size,
                data,
            } => {
                let got = run
                    .files
                    .entry(String::from_utf8_lossy(&path).into_owned())
                    .or_default();
                assert_eq!(offset, got.data.len() as u64, "contiguous File offsets");
                got.mode = mode;
                got.total = total_size;
                got.data.extend_from_slice(&data);
                "file"
            }
            other => panic!("agent sent a host frame: {other:?}"),
        };
        if run.order.last() != Some(&kind) {
            run.order.push(kind);
        }
    }
    run
}

/// Receives until the session ends, storing output.
pub fn collect(s: &mut Session) -> Run {
    collect_with(s, None)
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pids of live processes whose command line contains `marker`.
pub fn pids_with(marker: &str) -> Vec<u32> {
    let me = std::process::id();
    procs()
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(marker)
                })
                .unwrap_or(false)
        })
        .filter(|&pid| stat(pid).is_some_and(|s| s.state != 'Z'))
        .collect()
}

fn procs() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// The fields of `/proc/PID/stat` the tests look at.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub state: char,
    pub ppid: u32,
    pub pgrp: u32,
    pub session: u32,
}

pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a `/proc/PID/stat` line (the comm field may hold spaces).
pub fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    Some(Stat {
        state: f.next()?.chars().next()?,
        ppid: f.next()?.parse().ok()?,
        pgrp: f.next()?.parse().ok()?,
        session: f.next()?.parse().ok()?,
    })
}

/// Zombies whose parent is `ppid`.
pub fn zombies_of(ppid: u32) -> Vec<u32> {
    procs()
        .filter(|&pid| stat(pid).is_some_and(|s| s.state == 'Z' && s.ppid == ppid))
        .collect()
}

/// Children of `ppid`.
pub fn children_of(ppid: u32) -> Vec<u32> {
    procs()
        .filter(|&pid| stat(pid).is_some_and(|s| s.ppid == ppid))
        .collect()
}

/// Writes raw bytes to a fresh connection after reading the agent's
/// header; returns the stream for reading what comes back.
pub fn raw_connect(sock: &Path) -> std::os::unix::net::UnixStream {
    use std::io::Read;
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut header = [0u8; 6];
    s.read_exact(&mut header).unwrap();
    assert_eq!(&header, b"AGCH\x03\x00");
    s
}

/// True when `tool` is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null")])
        .status()
        .is_ok_and(|s| s.success())
}

/// A `sleep` duration unique to this test run and `n`, e.g. `30.412307`,
/// so leftover processes of another run never count as survivors.
pub fn marker(n: u32) -> String {
    format!("30.{}{n:02}", std::process::id())
}

/// Says that a test did not run, and why, in the test's own captured
/// output, where `scripts/tally.sh` finds it under the test's name and
/// counts the test as skipped.
pub fn skip(why: &str) {
    println!("skipped: {why}");
}

/// Makes `raw` the child's descriptor 3 (close-on-exec cleared); `raw`
/// must stay open in this process until the command is spawned.
pub fn inherit_as_fd3(cmd: &mut Command, raw: std::os::fd::RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs between fork and exec and calls only dup2 and
    // fcntl, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec.
            let rc = if raw == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
