//! Runs commands inside an L1 Linux guest under qemu TCG, where `/dev/kvm` is
//! a real, complete KVM (AMD SVM with nested paging on x86_64, EL2 on
//! aarch64), so tests can drive every KVM path of boxdesk for real on hosts
//! whose own `/dev/kvm` cannot boot Linux, and on an x86_64 host for aarch64.
//!
//! This module is a thin client of `tests/nested/run.sh`, which owns booting,
//! deadlines, caching and the console protocol; see `tests/nested/README.md`.
//! It never decides a run passed without the guest's end marker: a run that
//! lost it is [`Status::Failed`], a command killed at its deadline is
//! [`Status::TimedOut`].
//!
//! ```ignore
//! if !nested::ready(Arch::Aarch64) {
//!     return; // prints the skip line, or fails under BOXDESK_NESTED=1
//! }
//! let out = nested::run(Arch::Aarch64, &[(bin, "/bin/t")], &["/bin/t", "--quiet"]);
//! out.assert_exit(0);
//! ```

mod cgroup;
mod selftest;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The guest architecture of L1 (and of whatever runs inside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// `qemu-system-x86_64 -cpu EPYC,+svm,+npt`, KVM from `kvm-amd`.
    X86_64,
    /// `qemu-system-aarch64 -M virt,virtualization=on,gic-version=3 -cpu max`.
    Aarch64,
}

impl Arch {
    /// The name the scripts and Rust target triples use.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

/// How one command runs inside L1; `Default` is what [`run`] uses.
#[derive(Clone, Debug)]
pub struct Options {
    /// The command's deadline, counted inside L1 from just before it starts.
    pub deadline: Duration,
    /// Share the host's `/` read-only (9p) at `/run/host`, and at `/host`
    /// with L1's own `/proc`, `/sys`, `/dev`, `/tmp`, `/run` over it so
    /// `chroot /host PROG` runs host programs (in an x86_64 L1: they are
    /// x86_64 binaries).
    pub hostroot: bool,
    /// Extra environment for the command.
    pub env: Vec<(String, String)>,
    /// Extra kernel modules to load first (`vhost_vsock` is available).
    pub modprobe: Vec<String>,
    /// Working directory inside L1 (default `/`).
    pub cwd: Option<String>,
    /// How long L1 may go without its heartbeat (one a minute) before it
    /// counts as frozen, is examined and killed (run.sh's default: 5 min).
    pub stall: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            deadline: Duration::from_secs(600),
            hostroot: false,
            env: Vec::new(),
            modprobe: Vec::new(),
            cwd: None,
            stall: None,
        }
    }
}

/// How the command ended, as L1's end marker (or its absence) says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// The command exited with this status (128 + N when killed by signal N).
    Exited(i32),
    /// The command was still running at its deadline and was killed.
    TimedOut,
    /// The harness failed: not set up, L1 did not boot, qemu died, or no end
    /// marker came back in time. The string says which.
    Failed(String),
}

/// What came back from one run.
#[derive(Clone, Debug)]
pub struct Output {
    /// How the command ended.
    pub status: Status,
    /// The command's stdout and stderr, merged as they reached the console.
    pub output: String,
    /// Host wall time from the harness starting qemu to the command starting
    /// in L1 (the start marker seen on the console), when it started.
    pub cmd_started_after: Option<Duration>,
    /// L1's whole output port: the markers, the command's output and, after
    /// a failure, the tail of L1's dmesg.
    pub console: String,
    /// L1's kernel log (its own port: boot warnings, sysrq dumps, panics).
    pub kernel: String,
    /// What run.sh saw of an L1 it found frozen (`freeze.txt`), if it did.
    pub freeze: String,
}

impl Output {
    /// Panics, showing the end of the console, unless the command exited with
    /// `code`.
    #[track_caller]
    pub fn assert_exit(&self, code: i32) -> &Self {
        assert_eq!(
            self.status,
            Status::Exited(code),
            "nested run did not exit {code}; output:\n{}\n--- console (end) ---\n{}",
            self.output,
            tail(&self.console, 60)
        );
        self
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nested")
        .join(name)
}

/// Whether nested runs for `arch` can happen here. When not, prints
/// `skipped: nested harness not set up (run tests/nested/setup.sh)` and
/// returns false — unless `BOXDESK_NESTED=1`, where it panics instead, so CI
/// never mistakes a missing harness for a pass. `BOXDESK_NESTED=0` skips
/// nested runs even where the harness is set up (a CI step that runs them
/// separately).
pub fn ready(arch: Arch) -> bool {
    if std::env::var_os("BOXDESK_NESTED").is_some_and(|v| v == "0") {
        println!("skipped: BOXDESK_NESTED=0");
        return false;
    }
    let check = Command::new("bash")
        .arg(script("run.sh"))
        .args([arch.name(), "--check"])
        .stdout(Stdio::null())
        .output();
    match check {
        Ok(out) if out.status.success() => true,
        Ok(out) => unavailable(String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) => unavailable(&format!("cannot run bash: {e}")),
    }
}

/// Reports a missing prerequisite the way [`ready`] does; returns false.
pub fn unavailable(why: &str) -> bool {
    if std::env::var_os("BOXDESK_NESTED").is_some_and(|v| v == "1") {
        panic!("BOXDESK_NESTED=1 but the nested harness cannot run: {why}");
    }
    println!("skipped: nested harness not set up (run tests/nested/setup.sh)");
    false
}

/// Runs `cmd` (exec'd, no shell) inside a fresh L1 of `arch`, with each
/// `(host path, L1 path)` of `files` copied in first. Blocks until L1 powers
/// off; only one L1 runs at a time on a host.
pub fn run(arch: Arch, files: &[(&Path, &str)], cmd: &[&str]) -> Output {
    run_with(arch, files, cmd, &Options::default())
}

/// [`run`] with [`Options`].
pub fn run_with(arch: Arch, files: &[(&Path, &str)], cmd: &[&str], opts: &Options) -> Output {
    let out_dir = tempfile::Builder::new()
        .prefix("boxdesk-nested-")
        .tempdir()
        .expect("temporary directory for the nested run");
    let mut c = Command::new("bash");
    c.arg(script("run.sh"))
        .arg(arch.name())
        .arg("--quiet")
        .arg("--out")
        .arg(out_dir.path())
        .arg("--timeout")
        .arg(opts.deadline.as_secs().max(1).to_string());
    for (src, dst) in files {
        let mut spec = src.as_os_str().to_owned();
        spec.push(":");
        spec.push(dst);
        c.arg("--file").arg(spec);
    }
    if opts.hostroot {
        c.arg("--hostroot");
    }
    for (k, v) in &opts.env {
        c.arg("--env").arg(format!("{k}={v}"));
    }
    for m in &opts.modprobe {
        c.args(["--modprobe", m]);
    }
    if let Some(cwd) = &opts.cwd {
        c.args(["--cwd", cwd]);
    }
    if let Some(stall) = opts.stall {
        c.arg("--stall").arg(stall.as_secs().max(1).to_string());
    }
    c.arg("--").args(cmd);
    c.stdin(Stdio::null()).stdout(Stdio::null());
    kill_with_this_thread(&mut c);

    let done = match c.output() {
        Ok(done) => done,
        Err(e) => return failed(format!("cannot run run.sh: {e}")),
    };
    let read = |name: &str| std::fs::read_to_string(out_dir.path().join(name)).unwrap_or_default();
    let result: HashMap<String, String> = read("result")
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let field = |k: &str| result.get(k).map(String::as_str).unwrap_or("");
    let stderr = String::from_utf8_lossy(&done.stderr).trim().to_owned();
    let status = match field("status") {
        "exited" => match field("rc").parse() {
            Ok(rc) => Status::Exited(rc),
            Err(_) => Status::Failed(format!("bad rc in result: {:?}", field("rc"))),
        },
        "timeout" => Status::TimedOut,
        "failed" => Status::Failed(field("reason").to_owned()),
        _ => Status::Failed(format!(
            "run.sh wrote no result ({}): {stderr}",
            done.status
        )),
    };
    Output {
        status,
        output: read("output"),
        cmd_started_after: field("cmd_started_ms")
            .parse()
            .ok()
            .map(Duration::from_millis),
        console: read("console.log"),
        kernel: read("kernel.log"),
        freeze: read("freeze.txt"),
    }
}

fn failed(why: String) -> Output {
    Output {
        status: Status::Failed(why),
        output: String::new(),
        cmd_started_after: None,
        console: String::new(),
        kernel: String::new(),
        freeze: String::new(),
    }
}

/// If the test thread dies (a killed test binary), run.sh gets SIGTERM and
/// takes qemu down with it instead of leaving an L1 running to its deadline.
fn kill_with_this_thread(c: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls only
    // prctl, which is async-signal-safe; it touches no memory of the parent.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
