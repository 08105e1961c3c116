//! `boxdesk oci …` (also boxdesk started as `boxdesk-oci`): the OCI runtime
//! command line as runc has it, so podman and containerd run boxdesk
//! sandboxes (CRI-O takes the same command line; it is not tested here). Global flags come before the command (`--root`,
//! `--log`, `--log-format`, and the ones engines pass that change nothing
//! here: `--debug`, `--systemd-cgroup`, `--rootless`).
//!
//! A container is a boxdesk sandbox (`boxdesk ls` lists it as
//! `oci-<id>`) kept by its **monitor** ([`monitor`]): the process `create`
//! starts and names in `--pid-file`. The monitor starts the sandbox, waits
//! for `start`, runs the container's process through the agent, relays its
//! stdio (or its terminal, through the console socket), forwards the
//! signals `kill` sends it, and exits with the process's status once it
//! has stopped the sandbox — what an engine waits for. `exec` runs another
//! process the same way (`--detach`: in a monitor of its own, named in its
//! `--pid-file`).
//!
//! This module owns the command line and what each command prints and
//! returns; the checks of a bundle and the state files are `boxdesk_oci`'s.
//! Errors go to stderr and, with `--log`, to the log (one JSON object per
//! line with `--log-format json`, as engines read it back); exit 1.

mod agent;
mod console;
mod monitor;

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use boxdesk_oci::config;
use boxdesk_oci::state::{self, Record, Root, Status};
use clap::{Parser, Subcommand};
use nix::sys::signal::Signal;

/// The name boxdesk answers to as a runtime binary.
pub const RUNTIME_NAME: &str = "boxdesk-oci";

/// boxdesk as an OCI runtime (runtime-spec 1.2, runc's command line).
#[derive(Debug, Parser)]
#[command(name = "boxdesk-oci", version, long_version = env!("BOXDESK_LONG_VERSION"))]
struct OciCli {
    /// Where container state is kept [default: /run/boxdesk-oci as root,
    /// else $XDG_RUNTIME_DIR/boxdesk-oci].
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    /// Also write errors to this file.
    #[arg(long, global = true)]
    log: Option<PathBuf>,
    /// text or json.
    #[arg(long, global = true, default_value = "text")]
    log_format: String,
    /// Accepted for compatibility; no effect.
    #[arg(long, global = true)]
    debug: bool,
    /// Accepted for compatibility: boxdesk places a sandbox's cgroup itself.
    #[arg(long, global = true)]
    systemd_cgroup: bool,
    /// Accepted for compatibility: boxdesk is rootless whenever its user is.
    #[arg(long, global = true, num_args = 0..=1, default_missing_value = "true")]
    rootless: Option<String>,
    #[command(subcommand)]
    cmd: OciCmd,
}

#[derive(Debug, Subcommand)]
enum OciCmd {
    /// Create a container from a bundle: its sandbox runs, its process
    /// waits for `start`.
    Create(CreateArgs),
    /// Create and start a container; without --detach, wait for its process
    /// and exit with its status.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        /// Return once started.
        #[arg(short, long)]
        detach: bool,
    },
    /// Start a created container's process.
    Start {
        /// The container.
        id: String,
    },
    /// Print a container's state (JSON).
    State {
        /// The container.
        id: String,
    },
    /// Send a signal to a container's process [default: TERM].
    Kill {
        /// Also every other process (the same here: the sandbox is one).
        #[arg(short, long)]
        all: bool,
        /// The container.
        id: String,
        /// A name (TERM, SIGTERM) or a number.
        signal: Option<String>,
    },
    /// Delete a stopped container and everything it left.
    Delete {
        /// Kill it first if it still runs.
        #[arg(short, long)]
        force: bool,
        /// The container.
        id: String,
    },
    /// Run another process in a running container.
    Exec(ExecArgs),
    /// List containers.
    List {
        /// table or json.
        #[arg(short, long, default_value = "table")]
        format: String,
        /// Only ids.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Print what this runtime supports (the spec's features document).
    Features,
    /// Write a default config.json (a shell on no terminal, the rootfs
    /// dir beside it) into the bundle dir.
    Spec {
        /// The bundle dir [default: .].
        #[arg(short, long, default_value = ".")]
        bundle: PathBuf,
    },
    /// Not supported: a sandbox cannot be frozen.
    Pause {
        /// The container.
        id: String,
    },
    /// Not supported: a sandbox cannot be frozen.
    Resume {
        /// The container.
        id: String,
    },
    /// Not supported: a sandbox's limits are set at create.
    Update {
        /// Anything.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The monitor of one container's process (internal).
    #[command(name = "__monitor", hide = true)]
    Monitor(monitor::MonitorArgs),
    /// Sets sysctls in a sandbox's namespaces (internal).
    #[command(name = "__sysctl", hide = true)]
    Sysctl {
        #[arg(long)]
        pid: i32,
        #[arg(long)]
        outside: bool,
        sysctls: Vec<String>,
    },
}

#[derive(Debug, Clone, clap::Args)]
struct CreateArgs {
    /// The bundle dir (config.json and its root) [default: .].
    #[arg(short, long, default_value = ".")]
    bundle: PathBuf,
    /// Write the container's pid (its monitor's) here.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// With process.terminal: send the terminal's master end here.
    #[arg(long)]
    console_socket: Option<PathBuf>,
    /// Accepted for compatibility.
    #[arg(long)]
    no_pivot: bool,
    /// Accepted for compatibility.
    #[arg(long)]
    no_new_keyring: bool,
    /// Not supported unless 0.
    #[arg(long, default_value_t = 0)]
    preserve_fds: u32,
    /// The container id.
    id: String,
}

#[derive(Debug, clap::Args)]
struct ExecArgs {
    /// The process (a runtime-spec `process` object) to run.
    #[arg(short, long)]
    process: Option<PathBuf>,
    /// On a terminal (sent to --console-socket).
    #[arg(short, long)]
    tty: bool,
    /// Return once started; the process's monitor is named in --pid-file.
    #[arg(short, long)]
    detach: bool,
    /// Write the process's monitor's pid here.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// With --tty: send the terminal's master end here.
    #[arg(long)]
    console_socket: Option<PathBuf>,
    /// Working directory [default: /].
    #[arg(long)]
    cwd: Option<String>,
    /// K=V.
    #[arg(short, long)]
    env: Vec<String>,
    /// Not supported unless 0.
    #[arg(long, default_value_t = 0)]
    preserve_fds: u32,
    /// Not supported unless 0 or 0:0.
    #[arg(short, long)]
    user: Option<String>,
    /// Accepted: every process already has no_new_privs.
    #[arg(long)]
    no_new_privs: bool,
    /// The container.
    id: String,
    /// The command, without --process.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Whether boxdesk was started under the runtime's name.
pub fn started_as_runtime(argv0: &std::ffi::OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == RUNTIME_NAME)
}

/// Runs `boxdesk-oci ARGS…` (`args` without the program or `oci`);
/// returns the exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> i32 {
    let argv = std::iter::once(OsString::from(RUNTIME_NAME)).chain(args);
    let cli = match OciCli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => 1,
            };
        }
    };
    let log = Log {
        path: cli.log.clone(),
        json: cli.log_format == "json",
    };
    let root = match cli.root.clone().map_or_else(Root::default_path, Ok) {
        Ok(path) => Root(path),
        Err(e) => {
            log.error(&e.to_string());
            return 1;
        }
    };
    if let Err(e) = pin_dirs(&root) {
        log.error(&format!("{e:#}"));
        return 1;
    }
    let outcome = match cli.cmd {
        OciCmd::Create(a) => create(&root, &a).map(|_| 0),
        OciCmd::Run { create: a, detach } => run(&root, &a, detach),
        OciCmd::Start { id } => start(&root, &id).map(|()| 0),
        OciCmd::State { id } => print_state(&root, &id).map(|()| 0),
        OciCmd::Kill { id, signal, .. } => kill(&root, &id, signal.as_deref()).map(|()| 0),
        OciCmd::Delete { id, force } => delete(&root, &id, force).map(|()| 0),
        OciCmd::Exec(a) => exec(&root, a),
        OciCmd::List { format, quiet } => list(&root, &format, quiet).map(|()| 0),
        OciCmd::Spec { bundle } => write_spec(&bundle).map(|()| 0),
        OciCmd::Features => {
            println!("{:#}", boxdesk_oci::features::document());
            Ok(0)
        }
        OciCmd::Pause { .. } | OciCmd::Resume { .. } => Err(anyhow::anyhow!(
            "pause and resume are not supported: a boxdesk sandbox cannot be frozen"
        )),
        OciCmd::Update { .. } => Err(anyhow::anyhow!(
            "update is not supported: a boxdesk sandbox's limits are set at create"
        )),
        OciCmd::Monitor(a) => Ok(monitor::run(a)),
        OciCmd::Sysctl {
            pid,
            outside,
            sysctls,
        } => monitor::sysctl_main(pid, outside, &sysctls).map(|()| 0),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            log.error(&format!("{e:#}"));
            1
        }
    }
}

/// Puts the containers' sandboxes (their sockets, logs, state dirs)
/// under the runtime's root, whatever the environment: engines start the
/// runtime with few variables, and not the same ones for each command
/// (podman's cleanup runs `delete` with another environment than
/// `create`). `boxdesk ls` sees them with `XDG_RUNTIME_DIR=<root>/.run
/// XDG_STATE_HOME=<root>/.state`. Before any thread exists.
fn pin_dirs(root: &Root) -> anyhow::Result<()> {
    root.ensure()?;
    let run = root.0.join(".run");
    let state = root.0.join(".state");
    for d in [&run, &state] {
        use std::os::unix::fs::DirBuilderExt as _;
        match std::fs::DirBuilder::new().mode(0o700).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("making {}", d.display())),
        }
    }
    std::env::set_var("XDG_RUNTIME_DIR", run);
    std::env::set_var("XDG_STATE_HOME", state);
    Ok(())
}

/// Where errors go besides stderr.
struct Log {
    path: Option<PathBuf>,
    json: bool,
}

impl Log {
    fn error(&self, msg: &str) {
        eprintln!("boxdesk-oci: {msg}");
        let Some(path) = &self.path else {
            return;
        };
        let line = if self.json {
            serde_json::json!({"level": "error", "msg": msg, "time": state::now_rfc3339()})
                .to_string()
        } else {
            format!("{} error: {msg}", state::now_rfc3339())
        };
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The boxdesk sandbox name of container `id` under runtime root `root`:
/// `oci-<r>-<id>`, `<r>` four hex digits of the root (two engines' roots
/// each have a container `c1`; their sandboxes, and cgroups, must not
/// meet), when that is a valid name of at most 36 bytes; else `<id>` is
/// cut to 12 characters for a hex engine id (its short form, as `podman
/// ps` shows it) or replaced by 12 of its hash.
pub fn sandbox_name(root: &Path, id: &str) -> String {
    use std::hash::{Hash as _, Hasher as _};
    let hash = |x: &dyn Fn(&mut std::collections::hash_map::DefaultHasher)| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        x(&mut h);
        h.finish()
    };
    let r = hash(&|h| root.hash(h)) & 0xffff;
    let plain = format!("oci-{r:04x}-{id}");
    if plain.len() <= 36 && boxdesk_platform::names::validate_name(&plain).is_ok() {
        return plain;
    }
    if id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return format!("oci-{r:04x}-{}", &id[..12]);
    }
    format!(
        "oci-{r:04x}-{:012x}",
        hash(&|h| id.hash(h)) & 0xffff_ffff_ffff
    )
}

/// `create`: checks the bundle, claims the id, starts the monitor and
/// waits until its sandbox is ready; writes the pid file. Returns the
/// monitor's process (the caller of `run` waits for it).
fn create(root: &Root, a: &CreateArgs) -> anyhow::Result<std::process::Child> {
    if a.preserve_fds != 0 {
        bail!("--preserve-fds is not supported");
    }
    let bundle = std::path::absolute(&a.bundle)
        .with_context(|| format!("--bundle {}", a.bundle.display()))?;
    let plan = config::load(&bundle)?;
    if plan.process.terminal && a.console_socket.is_none() {
        bail!("process.terminal is set but no --console-socket was given");
    }
    if plan.backend == config::BackendChoice::Vm {
        bail!("annotation io.boxdesk.backend=vm: the VM backend does not run OCI containers yet (its root over virtio-fs is planned); use namespace or auto");
    }
    let dir = root.claim(&a.id)?;
    state::mark_creating(&dir)?;
    let started = monitor::spawn(&monitor::Spawn {
        root: &root.0,
        id: &a.id,
        bundle: &bundle,
        console_socket: a.console_socket.as_deref(),
        exec: None,
    });
    let (child, pid) = match started {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    if let Some(f) = &a.pid_file {
        if let Err(e) = write_pid_file(f, pid) {
            // No engine will know of this container: it must not live on.
            let _ = delete(root, &a.id, true);
            return Err(e);
        }
    }
    Ok(child)
}

fn write_pid_file(path: &Path, pid: i32) -> anyhow::Result<()> {
    let tmp = path.with_extension("boxdesk-tmp");
    std::fs::write(&tmp, pid.to_string())
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing --pid-file {}", path.display()))
}

/// `run`: create, start, and (without --detach) wait.
fn run(root: &Root, a: &CreateArgs, detach: bool) -> anyhow::Result<i32> {
    let mut child = create(root, a)?;
    if let Err(e) = start(root, &a.id) {
        let _ = delete(root, &a.id, true);
        let _ = child.wait();
        return Err(e);
    }
    if detach {
        return Ok(0);
    }
    let status = child.wait().context("waiting for the container")?;
    use std::os::unix::process::ExitStatusExt as _;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    // A `run` that waited deletes what it made, as runc's does.
    let _ = delete(root, &a.id, true);
    Ok(code)
}

/// `start`: asks the monitor to start the process; returns once it has.
fn start(root: &Root, id: &str) -> anyhow::Result<()> {
    let (dir, record) = read(root, id)?;
    match state::status(&dir, &record) {
        Status::Created => {}
        s => bail!("cannot start container {id}: it is {}", s.word()),
    }
    monitor::request_start(&dir)
}

fn read(root: &Root, id: &str) -> anyhow::Result<(PathBuf, Record)> {
    let dir = root.dir(id)?;
    let record = state::read(root, id)?;
    Ok((dir, record))
}

fn state_json(dir: &Path, r: &Record) -> serde_json::Value {
    let status = state::status(dir, r);
    let mut v = serde_json::json!({
        "ociVersion": "1.2.0",
        "id": r.id,
        "status": status.word(),
        "bundle": r.bundle,
        "rootfs": r.bundle.join("rootfs"),
        "created": r.created,
        "annotations": r.annotations,
        "owner": "",
    });
    if status != Status::Stopped {
        v["pid"] = r.pid.into();
    } else {
        v["pid"] = 0.into();
    }
    v["annotations"]["io.boxdesk.sandbox"] = r.sandbox.clone().into();
    v
}

fn print_state(root: &Root, id: &str) -> anyhow::Result<()> {
    let (dir, r) = read(root, id)?;
    println!("{:#}", state_json(&dir, &r));
    Ok(())
}

/// A signal by name (`TERM`, `SIGTERM`, any case) or number.
fn parse_signal(s: &str) -> anyhow::Result<Signal> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).with_context(|| format!("{n} is not a signal"));
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .with_context(|| format!("{s} is not a signal"))
}

/// `kill`: the signal goes to the monitor, which forwards a catchable one
/// to the process and dies of SIGKILL (its sandbox with it). Sent through a
/// pidfd taken after the start time was checked: never to a reused pid.
fn kill(root: &Root, id: &str, signal: Option<&str>) -> anyhow::Result<()> {
    let sig = parse_signal(signal.unwrap_or("TERM"))?;
    // What the monitor forwards, and KILL, which ends it and the sandbox.
    // Anything else would act on the monitor itself (stop it, kill it
    // without its sandbox's clean end) or be lost: refused.
    let forwarded = crate::cli::exec::forwarded_for(crate::cli::exec::Relay::Container);
    if sig != Signal::SIGKILL && !forwarded.contains(sig) {
        bail!("{sig} cannot be delivered to a boxdesk container's process");
    }
    let (dir, r) = read(root, id)?;
    match state::status(&dir, &r) {
        Status::Created | Status::Running => {}
        Status::Creating => bail!("container {id} is being created"),
        Status::Stopped => bail!("container {id} is not running"),
    }
    signal_monitor(&r, sig).with_context(|| format!("signalling container {id}"))
}

/// Sends `sig` to `r`'s monitor if it is still that process.
fn signal_monitor(r: &Record, sig: Signal) -> anyhow::Result<()> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    // SAFETY: pidfd_open takes a pid and flags, no memory.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, r.pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a new descriptor nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if !state::alive(r.pid, r.pid_start) {
        bail!("it is not running");
    }
    // SAFETY: pidfd_send_signal on a pidfd we own, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig as i32,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// `delete`: a stopped container's state and whatever its sandbox left;
/// `--force` kills a live one first. One being created is left to its
/// `create`.
fn delete(root: &Root, id: &str, force: bool) -> anyhow::Result<()> {
    let dir = root.dir(id)?;
    let record = match state::read(root, id) {
        Ok(r) => r,
        // Claimed but never recorded (a create that died): just the dir.
        Err(state::StateError::Missing(_)) if dir.is_dir() => {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let status = state::status(&dir, &record);
    if status == Status::Creating {
        bail!("container {id} is being created: delete it once create has returned");
    }
    if status != Status::Stopped {
        if !force {
            bail!(
                "cannot delete container {id} that is not stopped: {}",
                status.word()
            );
        }
        let _ = signal_monitor(&record, Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while state::alive(record.pid, record.pid_start) {
            if Instant::now() > deadline {
                bail!("container {id}'s monitor {} outlived SIGKILL", record.pid);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The monitor is gone; its threads may still hold the name a moment.
    super::ls::remove_remains(&record.sandbox, Duration::from_secs(3));
    std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
}

/// `exec`: one more process in the container.
fn exec(root: &Root, a: ExecArgs) -> anyhow::Result<i32> {
    if a.preserve_fds != 0 {
        bail!("--preserve-fds is not supported");
    }
    if a.user.as_deref().is_some_and(|u| u != "0" && u != "0:0") {
        bail!("--user {}: a boxdesk container runs its processes as uid 0 of its own user namespace only", a.user.unwrap_or_default());
    }
    let (dir, r) = read(root, &a.id)?;
    if state::status(&dir, &r) != Status::Running {
        bail!("container {} is not running", a.id);
    }
    let mut process = match &a.process {
        Some(path) => {
            let plan = config::load_process(path)?;
            // Every process of a sandbox has the sandbox's capabilities,
            // rlimits and OOM score: one asking for others is refused.
            let mut caps = plan.caps.clone();
            caps.sort();
            let mut theirs = r.caps.clone();
            theirs.sort();
            if !plan.caps.is_empty() && caps != theirs {
                bail!(
                    "process.capabilities: an exec'd process has the container's ({}), not others",
                    theirs.join(",")
                );
            }
            let sorted = |v: &[(i32, u64, u64)]| {
                let mut v = v.to_vec();
                v.sort_unstable();
                v
            };
            if !plan.rlimits.is_empty() && sorted(&plan.rlimits) != sorted(&r.rlimits) {
                bail!("process.rlimits: an exec'd process has the container's, not others");
            }
            if plan.oom_score_adj.is_some() && plan.oom_score_adj != r.oom_score_adj {
                bail!("process.oomScoreAdj: an exec'd process has the container's, not another");
            }
            plan
        }
        None => {
            if a.command.is_empty() {
                bail!("exec needs --process FILE or a command");
            }
            config::ProcessPlan {
                args: a.command.clone(),
                env: Vec::new(),
                cwd: "/".into(),
                terminal: a.tty,
                console_size: None,
                caps: Vec::new(),
                rlimits: Vec::new(),
                oom_score_adj: None,
            }
        }
    };
    if a.tty {
        process.terminal = true;
    }
    if let Some(cwd) = &a.cwd {
        process.cwd.clone_from(cwd);
    }
    process.env.extend(a.env.iter().cloned());
    if process.terminal && a.console_socket.is_none() && a.detach {
        bail!("a detached exec on a terminal needs --console-socket");
    }
    let request = monitor::ExecRequest {
        sandbox: r.sandbox.clone(),
        process,
    };
    if a.detach {
        let (_, pid) = monitor::spawn(&monitor::Spawn {
            root: &root.0,
            id: &a.id,
            bundle: &r.bundle,
            console_socket: a.console_socket.as_deref(),
            exec: Some(&request),
        })?;
        if let Some(f) = &a.pid_file {
            write_pid_file(f, pid)?;
        }
        return Ok(0);
    }
    if let Some(f) = &a.pid_file {
        write_pid_file(f, std::process::id() as i32)?;
    }
    monitor::exec_here(&request, a.console_socket.as_deref())
}

/// `spec`: the default config (`oci-spec`'s, which is runc's), without a
/// terminal and without the cgroup namespace's mount so that it runs as it
/// is; refused if one is there already.
fn write_spec(bundle: &Path) -> anyhow::Result<()> {
    let path = bundle.join("config.json");
    if path.exists() {
        bail!("{} exists: not overwritten", path.display());
    }
    let mut v = serde_json::to_value(oci_spec::runtime::Spec::default())?;
    v["process"]["terminal"] = false.into();
    v["hostname"] = "boxdesk".into();
    std::fs::write(&path, serde_json::to_vec_pretty(&v)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// `list`: every container under the root.
fn list(root: &Root, format: &str, quiet: bool) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for id in root.ids() {
        if let Ok((dir, r)) = read(root, &id) {
            rows.push(state_json(&dir, &r));
        }
    }
    if quiet {
        for r in &rows {
            println!("{}", r["id"].as_str().unwrap_or_default());
        }
    } else if format == "json" {
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("ID\tPID\tSTATUS\tBUNDLE\tCREATED");
        for r in &rows {
            println!(
                "{}\t{}\t{}\t{}\t{}",
                r["id"].as_str().unwrap_or_default(),
                r["pid"],
                r["status"].as_str().unwrap_or_default(),
                r["bundle"].as_str().unwrap_or_default(),
                r["created"].as_str().unwrap_or_default()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_ids_become_short_sandbox_names_apart_per_root() {
        let root = Path::new("/run/boxdesk-oci");
        let name = sandbox_name(root, "web1");
        assert!(
            name.starts_with("oci-") && name.ends_with("-web1") && name.len() == 13,
            "{name}"
        );
        assert_ne!(
            name,
            sandbox_name(Path::new("/run/containerd/runc/k8s.io"), "web1")
        );
        assert_eq!(name, sandbox_name(root, "web1"), "stable");
        let long = "5960f66a9acea6b223fc0338a7d944a89dd883d90d51a8314beebac9c3e263df";
        assert!(sandbox_name(root, long).ends_with("-5960f66a9ace"));
        let odd = sandbox_name(root, "a+b");
        assert!(odd.starts_with("oci-") && odd.len() == 21, "{odd}");
        for n in [
            sandbox_name(root, long),
            odd,
            sandbox_name(root, &"x".repeat(200)),
        ] {
            boxdesk_platform::names::validate_name(&n).unwrap();
        }
    }

    #[test]
    fn signals_are_taken_by_name_with_or_without_sig_or_by_number() {
        assert_eq!(parse_signal("TERM").unwrap(), Signal::SIGTERM);
        assert_eq!(parse_signal("sigkill").unwrap(), Signal::SIGKILL);
        assert_eq!(parse_signal("9").unwrap(), Signal::SIGKILL);
        assert!(parse_signal("NOPE").is_err());
        let f = crate::cli::exec::forwarded_for(crate::cli::exec::Relay::Container);
        for s in [
            Signal::SIGTERM,
            Signal::SIGUSR1,
            Signal::SIGHUP,
            Signal::SIGWINCH,
        ] {
            assert!(f.contains(s), "{s}");
        }
        for s in [Signal::SIGSTOP, Signal::SIGCHLD, Signal::SIGSEGV] {
            assert!(!f.contains(s), "{s}");
        }
        assert!(parse_signal("99").is_err());
    }
}
