//! `boxdesk run`: start a helper (`boxdesk __vmm`) for a new sandbox, wait
//! for its readiness byte, then run the command in it and stop it, open a
//! shell, or leave it running (`--detach`).
//!
//! Readiness is a pipe: the helper writes one byte once the agent answered
//! a channel handshake, and the pipe closes without a byte if it fails, so
//! nothing here polls. A foreground helper is in its own process group (the
//! terminal's ^C reaches only this process, which forwards it to the
//! command) and gets SIGTERM if this process dies. This module must never
//! leave a foreground sandbox running when it returns.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use boxdesk_platform::{names, socket, SandboxPaths};
use boxdesk_sandbox::control::ControlClient;

use super::{exec, tty, ExecOpts};

/// The descriptor the helper finds its readiness pipe on.
const READY_FD: i32 = 3;
/// How long `stop` waits for a helper before killing it.
pub const STOP_WAIT: Duration = Duration::from_secs(10);

/// `boxdesk run`'s arguments.
pub struct RunRequest {
    pub name: Option<String>,
    pub backend: Option<String>,
    pub cpus: Option<u32>,
    pub mem_mib: Option<u32>,
    pub net: bool,
    pub keep: bool,
    pub reuse: bool,
    pub pids: u64,
    pub tmp_bytes: u64,
    pub detach: bool,
    pub vm: VmFlags,
    /// `--share`s, parsed.
    pub shares: Vec<boxdesk_sandbox::running::Share>,
    /// `--root host`.
    pub root_host: bool,
    pub exec: ExecOpts,
    pub command: Vec<OsString>,
}

/// The VM-only flags of `run`, passed on to the helper.
#[derive(Debug, Clone, Default)]
pub struct VmFlags {
    pub kernel: Option<std::path::PathBuf>,
    pub initrd: Option<std::path::PathBuf>,
    pub rootfs: Option<std::path::PathBuf>,
    pub rootfs_rw: bool,
    /// `--display WxH`.
    pub display: Option<(u32, u32)>,
}

/// `boxdesk run`.
pub fn run(req: RunRequest) -> anyhow::Result<i32> {
    let backend = super::chosen_backend(req.backend.as_deref())?;
    backend.refuse(crate::backend::Asks {
        net: req.net,
        boot: req.vm.kernel.is_some() || req.vm.initrd.is_some() || req.vm.rootfs.is_some(),
        shares: !req.shares.is_empty() || req.root_host,
        display: req.vm.display.is_some(),
    })?;
    let runtime = boxdesk_platform::dirs::runtime_dir()?;
    let generated = req.name.is_none();
    let name = match req.name.clone() {
        Some(n) => {
            names::validate_name(&n)?;
            n
        }
        None => free_name(&runtime)?,
    };
    let paths = SandboxPaths::new(&runtime, &name)?;
    if !req.reuse && !generated {
        if let Some(state) = super::ls::leftover(&name) {
            if !boxdesk_sandbox::lock::NameLock::is_held(&runtime, &name) {
                return Err(boxdesk_sandbox::state::StateError::Leftover {
                    name,
                    dir: state.dir,
                }
                .into());
            }
        }
    }
    // Build the exec first so a bad --timeout or -e fails before starting.
    let exec_frame = match (&req.command[..], req.detach) {
        ([], true) => None,
        ([], false) => {
            let shell = ["/bin/sh".into()];
            let mut opts = req.exec.clone();
            opts.tty = opts.tty || tty::is_tty(tty::stdin_fd());
            Some((exec::build_exec(&opts, &shell)?, opts.tty))
        }
        (cmd, _) => Some((exec::build_exec(&req.exec, cmd)?, req.exec.tty)),
    };

    let mut helper = Helper::spawn(&req, &name, &backend.to_string(), &paths)?;
    if let Err(e) = helper.wait_ready() {
        return Err(e.context(format!("sandbox {name} failed to start")));
    }
    let Some((exec, pty)) = exec_frame else {
        // Detached: check the way a user will reach it, then let it go.
        ControlClient::connect(&paths.sock, &name)?
            .info()
            .context("the new sandbox does not answer info")?;
        exec::connect(&paths, &name).context("the new sandbox's agent does not answer")?;
        if generated {
            eprintln!("boxdesk: started sandbox {name}");
        }
        println!("{name}");
        helper.detached = true;
        return Ok(0);
    };
    if generated && req.command.is_empty() {
        eprintln!("boxdesk: sandbox {name} (exit the shell to stop it)");
    }
    let outcome = exec::connect(&paths, &name).and_then(|s| exec::run_session(s, exec, pty, &name));
    if let Some(why) = helper.stop(&paths, &name).and_then(jailed_death) {
        return Err(anyhow::anyhow!("{why}").context(format!("sandbox {name} failed")));
    }
    outcome
}

/// What a helper's death by `SIGSYS` means: its seccomp jail stopped a
/// forbidden system call (the helper wrote the `SECCOMP` line naming the
/// thread and the call to its stderr: the terminal, or the log).
fn jailed_death(status: std::process::ExitStatus) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    (status.signal() == Some(libc::SIGSYS)).then(|| {
        "the VM helper was killed by its seccomp jail (SECCOMP: a thread made a system call \
         its allowlist forbids; the SECCOMP line names the thread and the call)"
            .to_owned()
    })
}

/// A free generated name, `bx-` and 4 hex digits.
fn free_name(runtime: &std::path::Path) -> anyhow::Result<String> {
    let mut seed = std::process::id() as u64 ^ nanos();
    for _ in 0..64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let name = format!("bx-{:04x}", (seed >> 48) as u16);
        let sock = runtime.join(format!("{name}.sock"));
        if !socket::is_live(&sock)
            && !runtime.join(format!("{name}.lock")).exists()
            && super::ls::leftover(&name).is_none()
        {
            return Ok(name);
        }
    }
    bail!("no free sandbox name found; pass --name")
}

fn nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A helper process this command started.
struct Helper {
    child: Child,
    ready: Option<File>,
    log: std::path::PathBuf,
    /// Where this run's part of the log starts (detached helpers only).
    log_start: Option<u64>,
    detached: bool,
}

impl Helper {
    fn spawn(
        req: &RunRequest,
        name: &str,
        backend: &str,
        paths: &SandboxPaths,
    ) -> anyhow::Result<Helper> {
        let exe = std::env::current_exe().context("locating the boxdesk binary")?;
        let (read, write) = tty::cloexec_pipe().context("creating the readiness pipe")?;
        let mut cmd = Command::new(exe);
        cmd.arg("__vmm")
            .args(["--name", name, "--backend", backend])
            .args(["--ready-fd", &READY_FD.to_string()])
            // Holding the caller's cwd would keep it busy for the
            // sandbox's whole life.
            .current_dir("/")
            .stdin(Stdio::null());
        if req.net {
            cmd.arg("--net");
        }
        if let Some(c) = req.cpus {
            cmd.args(["--cpus", &c.to_string()]);
        }
        if let Some(m) = req.mem_mib {
            cmd.args(["--mem", &m.to_string()]);
        }
        if req.keep {
            cmd.arg("--keep");
        }
        if req.reuse {
            cmd.arg("--reuse");
        }
        cmd.args(["--pids", &req.pids.to_string()])
            .args(["--tmp", &req.tmp_bytes.to_string()]);
        for (flag, path) in [
            ("--kernel", &req.vm.kernel),
            ("--initrd", &req.vm.initrd),
            ("--rootfs", &req.vm.rootfs),
        ] {
            if let Some(p) = path {
                // Absolute: the helper runs with `/` as its cwd.
                let p =
                    std::path::absolute(p).with_context(|| format!("{flag} {}", p.display()))?;
                cmd.arg(flag).arg(p);
            }
        }
        if req.vm.rootfs_rw {
            cmd.arg("--rootfs-rw");
        }
        for s in &req.shares {
            cmd.arg("--share")
                .arg(boxdesk_sandbox::share_arg::to_helper(s));
        }
        if req.root_host {
            cmd.arg("--root-host");
        }
        if let Some((w, h)) = req.vm.display {
            cmd.arg("--display").arg(format!("{w}x{h}"));
        }
        let mut log_start = None;
        let write_raw = write.as_raw_fd();
        if req.detach {
            let log = boxdesk_sandbox::log::open(&paths.log)
                .with_context(|| format!("opening {}", paths.log.display()))?;
            log_start = Some(log.metadata().map_or(0, |m| m.len()));
            cmd.stdout(log.try_clone()?).stderr(log);
            // SAFETY: the hook only calls async-signal-safe functions
            // (setsid, dup2, fcntl) on descriptors open in the parent.
            unsafe {
                cmd.pre_exec(move || {
                    tty::child_detached()?;
                    tty::place_fd(write_raw, READY_FD)
                });
            }
        } else {
            cmd.arg("--foreground").stdout(Stdio::null());
            let parent = std::process::id() as libc::pid_t;
            // SAFETY: as above; setpgid, prctl and getppid are
            // async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    tty::child_of_foreground(parent)?;
                    tty::place_fd(write_raw, READY_FD)
                });
            }
        }
        let child = cmd.spawn().context("starting the sandbox helper")?;
        drop::<OwnedFd>(write);
        Ok(Helper {
            child,
            ready: Some(File::from(read)),
            log: paths.log.clone(),
            log_start,
            detached: false,
        })
    }

    /// Blocks until the helper's readiness byte, or its failure.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let mut byte = [0u8; 1];
        let ready = self.ready.as_mut().context("no readiness pipe")?;
        loop {
            match ready.read(&mut byte) {
                Ok(1) => return Ok(()),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading the readiness pipe"),
            }
        }
        let status = self.child.wait()?;
        self.detached = true;
        if let Some(start) = self.log_start {
            // A detached helper's errors are in its log, not on our stderr.
            let text = log_since(&self.log, start);
            if !text.is_empty() {
                eprintln!("{text}");
            }
        }
        if let Some(why) = jailed_death(status) {
            bail!("{why}, before the sandbox was ready");
        }
        bail!("the helper exited ({status}) before the sandbox was ready")
    }

    /// Asks the helper to stop and waits for it (killing it after
    /// [`STOP_WAIT`]).
    fn stop(&mut self, paths: &SandboxPaths, name: &str) -> Option<std::process::ExitStatus> {
        if let Err(e) = ControlClient::connect(&paths.sock, name).and_then(|mut c| c.stop()) {
            tracing::warn!("stopping sandbox {name}: {e}");
            let _ = self.child.kill();
        }
        // The helper holds its end of the readiness pipe until it exits.
        if !self.wait_pipe_closed(STOP_WAIT) {
            tracing::warn!("sandbox {name} did not stop within {STOP_WAIT:?}; killing its helper");
            let _ = self.child.kill();
        }
        self.detached = true;
        self.child.wait().ok()
    }

    /// Waits for end-of-file on the readiness pipe, at most `limit`.
    fn wait_pipe_closed(&mut self, limit: Duration) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Some(pipe) = self.ready.as_mut() else {
            return false;
        };
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = PollTimeout::try_from(left.as_millis().min(60_000) as i32)
                .unwrap_or(PollTimeout::NONE);
            let mut fds = [PollFd::new(
                std::os::fd::AsFd::as_fd(pipe),
                PollFlags::POLLIN,
            )];
            match poll(&mut fds, ms) {
                Ok(0) => return false,
                Ok(_) => {
                    let mut b = [0u8; 16];
                    match pipe.read(&mut b) {
                        Ok(0) | Err(_) => return true,
                        Ok(_) => {}
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return false,
            }
            if left.is_zero() {
                return false;
            }
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if !self.detached {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What was appended to the log since `start`, at most its last 4 KiB,
/// sanitised.
fn log_since(path: &std::path::Path, start: u64) -> String {
    use std::io::{Seek, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(start.max(len.saturating_sub(4096))));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.trim_end()
        .lines()
        .map(|l| boxdesk_channel::sanitize_error(l).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The times of one `boxdesk bench boot` run.
#[derive(Debug, Clone, Copy)]
pub struct BootTimes {
    /// From spawning the helper to its readiness byte (the agent answered).
    pub ready: Duration,
    /// From spawning to the end of `true`'s exec (the whole `run -- true`
    /// before its stop).
    pub first_exec: Duration,
    /// The helper's resident memory outside the guest's RAM mapping, KiB
    /// (Linux: from /proc/PID/smaps; `None` elsewhere).
    pub helper_rss_kib: Option<u64>,
}

/// Starts a foreground sandbox for `req`, runs `true` in it, stops it, and
/// says how long each step took.
pub fn timed_start(req: &RunRequest) -> anyhow::Result<BootTimes> {
    let backend = super::chosen_backend(req.backend.as_deref())?;
    let runtime = boxdesk_platform::dirs::runtime_dir()?;
    let name = free_name(&runtime)?;
    let paths = SandboxPaths::new(&runtime, &name)?;
    let exec = exec::build_exec(&req.exec, &["true".into()])?;
    let t0 = Instant::now();
    let mut helper = Helper::spawn(req, &name, &backend.to_string(), &paths)?;
    helper
        .wait_ready()
        .with_context(|| format!("sandbox {name} failed to start"))?;
    let ready = t0.elapsed();
    let code = exec::connect(&paths, &name).and_then(|s| exec::run_session(s, exec, false, &name));
    let first_exec = t0.elapsed();
    let helper_rss_kib = helper_rss_kib(
        helper.child.id(),
        u64::from(req.mem_mib.unwrap_or(crate::helper::DEFAULT_MEM_MIB)) << 10,
    );
    helper.stop(&paths, &name);
    match code? {
        0 => Ok(BootTimes {
            ready,
            first_exec,
            helper_rss_kib,
        }),
        c => bail!("`true` exited {c} in sandbox {name}"),
    }
}

/// The resident KiB of `pid`'s mappings except the guest RAM one (the
/// mapping of exactly `guest_kib`), where /proc says.
fn helper_rss_kib(pid: u32, guest_kib: u64) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let (mut size, mut rss) = (0u64, 0u64);
    for line in smaps.lines() {
        let kib = || line.split_whitespace().nth(1)?.parse::<u64>().ok();
        if line.starts_with("Size:") {
            size = kib().unwrap_or(0);
        } else if line.starts_with("Rss:") && size != guest_kib {
            rss += kib().unwrap_or(0);
        }
    }
    Some(rss)
}
