//! Shared test plumbing: the binary under test, a private environment per
//! test, running commands with a deadline, and sandboxes that stop
//! themselves when dropped.

#![allow(dead_code)]

pub mod shares;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long any one command may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How long `run --detach` may take: longer than the VM backend's own wait
/// for its agent, so a slow boot (nested TCG on a loaded machine) or a
/// stuck one ends in boxdesk's own report, with the guest console's tail,
/// rather than being cut short here.
pub const START_DEADLINE: Duration = Duration::from_secs(150);
const _: () =
    assert!(START_DEADLINE.as_secs() > boxdesk_vmm::sandbox::READY_TIMEOUT.as_secs() + 10);

/// The binary under test.
pub fn bin() -> PathBuf {
    std::env::var_os("BOXDESK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_boxdesk")))
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// True (after printing why) when the test must be skipped as non-root.
pub fn skip_unless_root(why: &str) -> bool {
    if is_root() {
        return false;
    }
    println!("skipped: needs root ({why})");
    true
}

/// A private environment: runtime, state and home dirs of one test.
pub struct TestEnv {
    dir: tempfile::TempDir,
    /// `$XDG_RUNTIME_DIR`.
    pub xdg_runtime: PathBuf,
    /// `$XDG_STATE_HOME`.
    pub xdg_state: PathBuf,
    /// `$HOME`.
    pub home: PathBuf,
}

impl TestEnv {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("bxt")
            .tempdir_in(std::env::temp_dir())
            .expect("temp dir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let mk = |name: &str| {
            let p = dir.path().join(name);
            fs::create_dir(&p).unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o700)).unwrap();
            p
        };
        let xdg_runtime = mk("run");
        let xdg_state = mk("state");
        let home = mk("home");
        TestEnv {
            dir,
            xdg_runtime,
            xdg_state,
            home,
        }
    }

    /// The temp dir holding everything.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The runtime dir boxdesk uses (`$XDG_RUNTIME_DIR/boxdesk`).
    pub fn runtime(&self) -> PathBuf {
        self.xdg_runtime.join("boxdesk")
    }

    /// The state dir of sandbox `name`.
    pub fn state_of(&self, name: &str) -> PathBuf {
        self.xdg_state.join("boxdesk").join(name)
    }

    /// The control socket of `name`.
    pub fn sock(&self, name: &str) -> PathBuf {
        self.runtime().join(format!("{name}.sock"))
    }

    /// The agent socket of `name`.
    pub fn agent(&self, name: &str) -> PathBuf {
        self.runtime().join(format!("{name}.agent"))
    }

    /// `boxdesk ARGS` in this environment.
    pub fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = Command::new(bin());
        c.args(args)
            .env("XDG_RUNTIME_DIR", &self.xdg_runtime)
            .env("XDG_STATE_HOME", &self.xdg_state)
            .env("HOME", &self.home)
            .env_remove("BOXDESK_BACKEND")
            .env_remove("RUST_LOG")
            .env_remove("XDG_DATA_HOME")
            .stdin(Stdio::null());
        c
    }

    /// Runs `boxdesk ARGS` to completion (stdin empty).
    pub fn run<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output(self.cmd(args))
    }

    /// The last `max` bytes of sandbox `name`'s host log (`NAME.log` in
    /// the runtime dir): what its helper said, for a failure's report.
    pub fn log_tail(&self, name: &str, max: usize) -> String {
        let path = self.runtime().join(format!("{name}.log"));
        match fs::read(&path) {
            Ok(bytes) => {
                let tail = &bytes[bytes.len().saturating_sub(max)..];
                format!("{}:\n{}", path.display(), String::from_utf8_lossy(tail))
            }
            Err(e) => format!("({}: {e})", path.display()),
        }
    }

    /// Starts a detached sandbox named `name` with extra `run` flags
    /// (within [`START_DEADLINE`]).
    pub fn start(&self, name: &str, flags: &[&str]) -> Started<'_> {
        let mut args = vec!["run", "--detach", "--name", name];
        args.extend_from_slice(flags);
        let out = output_or_report(self.cmd(&args), START_DEADLINE, || {
            format!("run --detach {name}; {}", self.log_tail(name, 8192))
        });
        assert_eq!(out.code(), 0, "run --detach failed: {out}");
        assert_eq!(out.stdout.trim(), name, "{out}");
        let pid = self.info(name)["pid"].parse().ok();
        Started {
            env: self,
            name: name.to_owned(),
            pid,
        }
    }

    /// `info NAME` as a map, straight from the control socket.
    pub fn info(&self, name: &str) -> HashMap<String, String> {
        let mut s = self.control(name);
        s.write_all(b"info\n").unwrap();
        let reply = read_reply(&mut s);
        assert!(reply.starts_with("ok\n"), "{reply}");
        reply
            .lines()
            .skip(1)
            .take_while(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once(' ').unwrap();
                (k.to_owned(), v.to_owned())
            })
            .collect()
    }

    /// A connection to the control socket of `name`.
    pub fn control(&self, name: &str) -> UnixStream {
        let s = UnixStream::connect(self.sock(name)).expect("control socket");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }
}

/// Reads one reply: up to an empty line for `ok` with lines after it, else
/// one line.
pub fn read_reply(s: &mut UnixStream) -> String {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) => got.push(b[0]),
            Err(e) => panic!(
                "reading a reply: {e}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
        if got.ends_with(b"\n\n") || (got.ends_with(b"\n") && !got.starts_with(b"ok\n")) {
            break;
        }
        if got == b"ok\n" {
            // `ok` alone (stop) or `ok` + info lines: peek for more.
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            match s.read(&mut b) {
                Ok(1) => got.push(b[0]),
                _ => break,
            }
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            if got.ends_with(b"\n\n") {
                break;
            }
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// A sandbox a test started (or adopted), stopped on drop (its helper killed if `stop` fails,
/// so a failing test leaves nothing running).
pub struct Started<'a> {
    pub env: &'a TestEnv,
    pub name: String,
    pub pid: Option<u32>,
}

impl<'a> Started<'a> {
    /// Adopts a sandbox some other command started.
    pub fn adopt(env: &'a TestEnv, name: &str) -> Self {
        let pid = std::panic::catch_unwind(|| env.info(name)["pid"].parse().ok())
            .ok()
            .flatten();
        Started {
            env,
            name: name.to_owned(),
            pid,
        }
    }
}

impl Started<'_> {
    /// `boxdesk exec NAME -- ARGS`.
    pub fn exec(&self, args: &[&str]) -> Out {
        let mut v = vec!["exec", self.name.as_str(), "--"];
        v.extend_from_slice(args);
        output_or_report(self.env.cmd(&v), DEADLINE, || {
            format!("exec {args:?} in {}; {}", self.name, self.log_tail(8192))
        })
    }

    /// `sh -c SCRIPT` in the sandbox.
    pub fn sh(&self, script: &str) -> Out {
        self.exec(&["sh", "-c", script])
    }

    /// The last `max` bytes of the sandbox's host log (`NAME.log` in the
    /// runtime dir): what its helper said, for a failure's report.
    pub fn log_tail(&self, max: usize) -> String {
        self.env.log_tail(&self.name, max)
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        let _ = self.env.run(["stop", self.name.as_str()]);
        if let Some(pid) = self.pid {
            if pid_alive(pid) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                wait_gone(pid);
            }
        }
    }
}

/// A finished command.
pub struct Out {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The exit code (-1 when killed by a signal).
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `cmd` to completion within [`DEADLINE`], collecting its output.
pub fn output(cmd: Command) -> Out {
    output_or_report(cmd, DEADLINE, String::new)
}

/// Runs `cmd` to completion within `limit`; past it, the child is killed
/// and the test fails with `report()` (what the sandbox's log says, say).
pub fn output_or_report(mut cmd: Command, limit: Duration, report: impl FnOnce() -> String) -> Out {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn boxdesk");
    wait_output_until(child, limit).unwrap_or_else(|| {
        let report = report();
        let sep = if report.is_empty() { "" } else { ": " };
        panic!("command did not finish within {limit:?}{sep}{report}")
    })
}

/// Waits for a spawned child with piped output, within [`DEADLINE`].
pub fn wait_output(child: Child) -> Out {
    wait_output_within(child, DEADLINE)
}

/// Waits for a spawned child with piped output, within `limit`.
pub fn wait_output_within(child: Child, limit: Duration) -> Out {
    wait_output_until(child, limit)
        .unwrap_or_else(|| panic!("command did not finish within {limit:?}"))
}

/// Waits for a spawned child with piped output, within `limit`; `None`
/// (the child killed) when it took longer.
pub fn wait_output_until(mut child: Child, limit: Duration) -> Option<Out> {
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // A process the child left behind may hold its pipes open: wait for
    // them within `limit` (and 10 s more), not for ever.
    while !(t1.is_finished() && t2.is_finished()) {
        assert!(
            start.elapsed() < limit + Duration::from_secs(10),
            "the command exited ({status}) but its output pipes stayed open \
             past {limit:?}: a process it left behind holds them"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let Output { stdout, stderr, .. } = Output {
        status,
        stdout: t1.join().unwrap(),
        stderr: t2.join().unwrap(),
    };
    Some(Out {
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// `/proc/<pid>` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .chars()
                .next();
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Waits up to 10 s for `pid` to be gone.
pub fn wait_gone(pid: u32) -> bool {
    wait_gone_within(pid, Duration::from_secs(10))
}

/// Whether `pid` exits within `limit`.
pub fn wait_gone_within(pid: u32, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !pid_alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Pids of live processes whose command line contains `marker`.
pub fn pids_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = fs::read(format!("/proc/{pid}/cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(marker) && pid_alive(pid) {
                out.push(pid);
            }
        }
    }
    out
}

/// A marker unique to this test process and call.
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{tag}{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A spawned child killed and reaped on drop, so a failing test leaves no
/// process behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to [`DEADLINE`] for `child` to exit.
pub fn wait_exit(child: &mut Child) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "command did not finish within {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The Landlock ABI of this kernel (6 and up scope signals and abstract
/// sockets); 0 without Landlock.
pub fn landlock_abi() -> i64 {
    // SAFETY: with a null attribute and size 0 the call only returns the
    // ABI version; no memory is touched.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    abi.max(0)
}
