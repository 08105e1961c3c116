//! A container's monitor: the process whose pid an engine gets from
//! `create` (or `exec --detach`) and waits for. It lives as long as the
//! container's process and exits with its status (128+N for signal N).
//!
//! The init monitor: blocks the signals it forwards (before any thread),
//! takes the terminal when asked ([`super::console`]), claims the sandbox
//! name, starts the namespace sandbox of the bundle's plan and waits for
//! its agent, records the container (`state.json`), says it is ready on
//! the readiness pipe `create` reads (or the error, as text), then waits
//! on `init.sock` for `start` — a signal meanwhile ends the container.
//! Started, it runs the process through the agent and relays it
//! ([`crate::cli::exec::run_session_as`]); when the process ends it stops
//! the sandbox and exits. SIGKILL ends it at once, and its sandbox with it
//! (bwrap dies with its parent); `delete` removes what is left.
//!
//! An exec monitor does the relay part only, for one more process in a
//! running container.
//!
//! This module owns those processes. Its stdout and stderr are the
//! container's: it must never print anything of its own there.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use boxdesk_channel::{Exec, SecretBytes};
use boxdesk_oci::config::{self, ProcessPlan};
use boxdesk_oci::state::{self, Record};
use boxdesk_sandbox::keeper::{End, Keeper};
use boxdesk_sandbox::running::{Net, Sandbox};
use nix::sys::signal::SigSet;

use crate::cli::exec::{run_session_as, Relay};
use crate::cli::{signals::Signals, tty};

/// The descriptor the monitor's readiness pipe is placed on.
const READY_FD: i32 = 3;
/// How long `start` waits for the monitor to take its request.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// `boxdesk oci __monitor`.
#[derive(Debug, clap::Args)]
pub struct MonitorArgs {
    #[arg(long)]
    root: PathBuf,
    #[arg(long)]
    id: String,
    #[arg(long)]
    bundle: PathBuf,
    #[arg(long)]
    console_socket: Option<PathBuf>,
    #[arg(long)]
    ready_fd: i32,
    /// An exec monitor's request: a JSON file in the container's dir
    /// (0600; read and removed), never the command line, which any user
    /// can read.
    #[arg(long)]
    exec_file: Option<PathBuf>,
}

/// One more process for a running container.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ExecRequest {
    /// The container's sandbox.
    pub sandbox: String,
    /// The process.
    pub process: ProcessPlan,
}

/// What [`spawn`] starts a monitor for.
pub struct Spawn<'a> {
    pub root: &'a Path,
    pub id: &'a str,
    pub bundle: &'a Path,
    pub console_socket: Option<&'a Path>,
    pub exec: Option<&'a ExecRequest>,
}

/// Starts a monitor and waits until it is ready: the container created
/// (its sandbox answers), or an exec's process started. Returns the
/// monitor (the caller may wait for it) and its pid.
pub fn spawn(s: &Spawn<'_>) -> anyhow::Result<(std::process::Child, i32)> {
    let exe = std::env::current_exe().context("locating the boxdesk binary")?;
    let (read, write) = tty::cloexec_pipe().context("creating the readiness pipe")?;
    let mut cmd = Command::new(exe);
    cmd.args(["oci", "__monitor", "--id", s.id])
        .arg("--root")
        .arg(s.root)
        .arg("--bundle")
        .arg(s.bundle)
        .args(["--ready-fd", &READY_FD.to_string()])
        .current_dir("/")
        .stdin(Stdio::inherit());
    if let Some(c) = s.console_socket {
        cmd.arg("--console-socket").arg(c);
    }
    if let Some(e) = s.exec {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = s.root.join(s.id).join(format!(
            "exec-{}-{}.json",
            std::process::id(),
            state::now_rfc3339()
        ));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("writing {}", path.display()))?;
        f.write_all(&serde_json::to_vec(e)?)?;
        cmd.arg("--exec-file").arg(&path);
    }
    let write_raw = write.as_raw_fd();
    // SAFETY: the hook only calls async-signal-safe functions (dup2,
    // fcntl) on a descriptor open in the parent.
    unsafe {
        cmd.pre_exec(move || tty::place_fd(write_raw, READY_FD));
    }
    let mut child = cmd.spawn().context("starting the container's monitor")?;
    drop(write);
    let mut answer = Vec::new();
    let _ = std::fs::File::from(read).read_to_end(&mut answer);
    if answer.first() == Some(&b'R') {
        let pid = child.id() as i32;
        return Ok((child, pid));
    }
    let status = child.wait()?;
    let text = String::from_utf8_lossy(&answer);
    if text.trim().is_empty() {
        bail!("the container's monitor exited ({status}) before it was ready");
    }
    bail!("{}", text.trim())
}

/// Runs a monitor; returns its exit code (the process's status).
pub fn run(a: MonitorArgs) -> i32 {
    let mut ready = match tty::adopt_fd(a.ready_fd) {
        Ok(fd) => Some(std::fs::File::from(fd)),
        Err(_) => return 125,
    };
    let fail = |ready: &mut Option<std::fs::File>, e: anyhow::Error| {
        if let Some(r) = ready.as_mut() {
            let _ = write!(r, "{e:#}");
        }
        1
    };
    let signals = forwarded();
    if let Err(e) = tty::block(&signals) {
        return fail(
            &mut ready,
            anyhow::Error::new(e).context("blocking signals"),
        );
    }
    if let Some(file) = &a.exec_file {
        let read = std::fs::read(file);
        let _ = std::fs::remove_file(file);
        let request: ExecRequest = match read
            .map_err(anyhow::Error::new)
            .and_then(|b| serde_json::from_slice(&b).map_err(anyhow::Error::new))
        {
            Ok(r) => r,
            Err(e) => return fail(&mut ready, e.context("--exec-file")),
        };
        return match relay(&request, a.console_socket.as_deref(), &mut ready) {
            Ok(code) => code,
            Err(e) => fail(&mut ready, e),
        };
    }
    let created = match create(&a) {
        Ok(c) => c,
        Err(e) => return fail(&mut ready, e),
    };
    if let Some(mut r) = ready.take() {
        let _ = r.write_all(b"R");
    }
    created.serve(signals)
}

/// The signals a monitor forwards (blocked in all its threads).
fn forwarded() -> SigSet {
    crate::cli::exec::forwarded_for(Relay::Container)
}

/// A created container: its sandbox ready, its process not started.
struct Created {
    keeper: Arc<Keeper>,
    sandbox: Arc<dyn Sandbox>,
    dir: PathBuf,
    listener: UnixListener,
    request: ExecRequest,
}

fn create(a: &MonitorArgs) -> anyhow::Result<Created> {
    let plan = config::load(&a.bundle)?;
    if plan.process.terminal {
        let socket = a
            .console_socket
            .as_deref()
            .context("process.terminal needs --console-socket")?;
        super::console::attach(socket, plan.process.console_size)?;
    }
    let name = super::sandbox_name(&a.root, &a.id);
    // SIGPIPE: a vanished peer is an EPIPE on its own connection.
    // SAFETY: SIG_IGN installs no handler code.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .context("ignoring SIGPIPE")?;
    // What can be refused is refused before anything is made.
    check_rlimits(&plan.layout.rlimits)?;
    let mut layout = plan.layout;
    layout.agent = Some(super::agent::find()?);
    boxdesk_oci::mountpoints::prepare(&mut layout)?;
    boxdesk_oci::joins::resolve(&mut layout.joins, &boxdesk_oci::state::Root(a.root.clone()))?;
    boxdesk_oci::mountpoints::check_program(&layout, &plan.process.args[0], &plan.process.env)?;
    // A container of this id SIGKILLed earlier may have left its sandbox's
    // remains (nothing is touched while a keeper holds the name).
    crate::cli::ls::remove_remains(&name, Duration::ZERO);
    let on_stop = Box::new(|| std::process::exit(128 + libc::SIGKILL));
    let (keeper, control) = Keeper::claim(&name, false, false, on_stop)?;
    // A failed create leaves nothing: the claim, the sandbox's cgroup,
    // log and state (engines never reuse the id to clean them).
    let undo = |keeper: &Keeper, e: anyhow::Error| -> anyhow::Error {
        keeper.abandon();
        crate::cli::ls::remove_remains(&name, Duration::from_secs(1));
        e
    };
    if let Err(e) = keeper.serve(control) {
        return Err(undo(&keeper, e.into()));
    }
    keeper.label("oci_id", a.id.clone());
    let mut spec = keeper.spec();
    spec.workspace = None;
    spec.home = "/".into();
    spec.cwd = "/".into();
    spec.net = if plan.net_host { Net::Host } else { Net::None };
    spec.resources.mem_mib = plan
        .mem_bytes
        .map(|b| u32::try_from(b.div_ceil(1 << 20)).unwrap_or(u32::MAX));
    // The cgroup's task cap: the config's, else every sandbox's default
    // (an RLIMIT_NPROC of its own is the agent's, set apart).
    spec.resources.pids = plan.pids.unwrap_or(boxdesk_sandbox::DEFAULT_PIDS);
    let caps = layout.caps.clone();
    let joins_net = layout
        .joins
        .iter()
        .any(|j| matches!(j, boxdesk_sandbox::container::Join::Net(_)));
    spec.container = Some(layout);
    let places = boxdesk_sandbox::namespace::running::Places {
        agent_sock: keeper.state().agent_sock(),
        front: Some(keeper.paths().agent.clone()),
        log: keeper.paths().log.clone(),
        etc: keeper.state().etc(),
    };
    let started = boxdesk_sandbox::namespace::running::NamespaceSandbox::start(&spec, places);
    let (sandbox, bwrap): (Arc<dyn Sandbox>, u32) = match started {
        Ok(s) => {
            let pid = s.pid();
            (Arc::new(s), pid)
        }
        Err(e) => return Err(undo(&keeper, e.into())),
    };
    keeper.hold(Arc::clone(&sandbox));
    if let Err(e) = sandbox.wait_ready() {
        let log = boxdesk_sandbox::log::tail(&keeper.paths().log);
        return Err(undo(
            &keeper,
            anyhow::Error::new(e).context(log.trim().to_owned()),
        ));
    }
    // The sandbox's first process, the agent: its namespaces are the
    // container's.
    let agent = std::fs::read_to_string(format!("/proc/{bwrap}/task/{bwrap}/children"))
        .ok()
        .and_then(|c| {
            c.split_whitespace()
                .next()
                .and_then(|p| p.parse::<i32>().ok())
        })
        .unwrap_or(0);
    if !plan.sysctls.is_empty() {
        if agent == 0 {
            return Err(undo(
                &keeper,
                anyhow::anyhow!("cannot find the sandbox's agent to set its sysctls"),
            ));
        }
        if let Err(e) = set_sysctls(agent, &plan.sysctls, joins_net) {
            return Err(undo(&keeper, e));
        }
    }
    keeper.ready();
    let dir = a.root.join(&a.id);
    let sock = dir.join("init.sock");
    let _ = std::fs::remove_file(&sock);
    let listener = match UnixListener::bind(&sock) {
        Ok(l) => l,
        Err(e) => {
            return Err(undo(
                &keeper,
                anyhow::Error::new(e).context("binding init.sock"),
            ))
        }
    };
    let me = std::process::id() as i32;
    let record = Record {
        id: a.id.clone(),
        bundle: a.bundle.clone(),
        pid: me,
        pid_start: state::start_time(me).unwrap_or(0),
        ns_pid: agent,
        created: state::now_rfc3339(),
        sandbox: name.clone(),
        annotations: plan.annotations,
        caps,
        rlimits: plan.process.rlimits.clone(),
        oom_score_adj: plan.process.oom_score_adj,
    };
    if let Err(e) = state::write(&dir, &record) {
        return Err(undo(&keeper, e.into()));
    }
    Ok(Created {
        keeper,
        sandbox,
        dir,
        listener,
        request: ExecRequest {
            sandbox: name,
            process: plan.process,
        },
    })
}

impl Created {
    /// Waits for `start`, a signal or the sandbox's end; then runs the
    /// process to its end. Returns the exit code (after the sandbox is
    /// stopped).
    fn serve(self, set: SigSet) -> i32 {
        // The sandbox ending on its own ends the container, whenever.
        let (keeper, sandbox) = (Arc::clone(&self.keeper), Arc::clone(&self.sandbox));
        let _ = std::thread::Builder::new()
            .name("sandbox-end".into())
            .spawn(move || {
                let ended = sandbox.wait();
                if !keeper.ending() {
                    let _ = keeper.end(End::Stop);
                    tracing::info!("the sandbox ended: {ended:?}");
                    if sandbox.oom_kills().is_some_and(|n| n > 0) {
                        eprintln!(
                            "boxdesk-oci: the container was killed by the out-of-memory killer at its memory limit"
                        );
                    }
                    std::process::exit(137);
                }
            });
        let mut signals = match Signals::new(&set) {
            Ok(s) => s,
            Err(_) => return self.finish(125),
        };
        loop {
            match wait_start(&self.listener, &signals) {
                Waited::Start(mut conn) => {
                    let _ = std::fs::write(self.dir.join("started"), b"");
                    let _ = conn.write_all(b"ok\n");
                    drop(conn);
                    let _ = std::fs::remove_file(self.dir.join("init.sock"));
                    let code = match relay(&self.request, None, &mut None) {
                        Ok(code) => code,
                        // The kernel's OOM killer acted in the container's
                        // cgroup and the session went with it: a memory
                        // cgroup may kill more than the biggest process
                        // (the agent too, as its next victim), and the
                        // container died of its memory limit, as runc
                        // reports an OOM-killed init.
                        Err(e) if self.sandbox.oom_kills().is_some_and(|n| n > 0) => {
                            eprintln!(
                                "boxdesk-oci: the container was killed by the out-of-memory killer at its memory limit ({e:#})"
                            );
                            128 + libc::SIGKILL
                        }
                        Err(e) => {
                            eprintln!("boxdesk-oci: {e:#}");
                            125
                        }
                    };
                    return self.finish(code);
                }
                Waited::Signal => {
                    if let Some(sig) = signals.next() {
                        if sig != nix::sys::signal::Signal::SIGWINCH {
                            return self.finish(128 + sig as i32);
                        }
                    }
                }
                Waited::Nothing => {}
            }
        }
    }

    fn finish(self, code: i32) -> i32 {
        let _ = std::fs::remove_file(self.dir.join("init.sock"));
        if self.keeper.end(End::Stop) {
            return code;
        }
        // Another end (a `boxdesk stop`) exits the process.
        loop {
            std::thread::park();
        }
    }
}

enum Waited {
    Start(UnixStream),
    Signal,
    Nothing,
}

/// One wait for a `start` request or a signal.
fn wait_start(listener: &UnixListener, signals: &Signals) -> Waited {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd as _;
    let mut fds = [
        PollFd::new(listener.as_fd(), PollFlags::POLLIN),
        PollFd::new(signals.as_fd(), PollFlags::POLLIN),
    ];
    if poll(&mut fds, PollTimeout::NONE).is_err() {
        return Waited::Nothing;
    }
    let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
    if ready(&fds[1]) {
        return Waited::Signal;
    }
    if ready(&fds[0]) {
        if let Ok((conn, _)) = listener.accept() {
            // Only the container's owner can reach the socket (its dir is
            // 0700); a request is one line.
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut line = String::new();
            let mut r = BufReader::new(&conn);
            if r.read_line(&mut line).is_ok() && line == "start\n" {
                return Waited::Start(conn);
            }
        }
    }
    Waited::Nothing
}

/// Refuses, naming it, an rlimit whose hard limit this process cannot
/// raise to (above the host's without `CAP_SYS_RESOURCE`): the sandbox
/// would otherwise fail to start with a bare EPERM. A raise that works is
/// kept (the monitor's own limit; the sandbox sets its own).
fn check_rlimits(rlimits: &[boxdesk_sandbox::container::Rlimit]) -> anyhow::Result<()> {
    for r in rlimits {
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(r.resource as _, &mut now) } != 0 || r.hard <= now.rlim_max {
            continue;
        }
        let raised = libc::rlimit {
            rlim_cur: now.rlim_cur,
            rlim_max: r.hard,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(r.resource as _, &raised) } != 0 {
            bail!(
                "process.rlimits: {} hard limit {} is above this host's {} ({}); with podman, pass --ulimit",
                config::rlimit_name(r.resource),
                r.hard,
                now.rlim_max,
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// Sets `sysctls` in the sandbox's own namespaces, from a fresh process
/// (`__sysctl`: a namespace is entered by a single-threaded process) that
/// joins the agent's.
fn set_sysctls(agent: i32, sysctls: &[(String, String)], joined_net: bool) -> anyhow::Result<()> {
    let agent = agent.to_string();
    let exe = std::env::current_exe().context("locating the boxdesk binary")?;
    let mut cmd = Command::new(exe);
    cmd.args(["oci", "__sysctl", "--pid", &agent]);
    if joined_net {
        cmd.arg("--outside");
    }
    let out = cmd
        .args(sysctls.iter().map(|(k, v)| format!("{k}={v}")))
        .stdin(Stdio::null())
        .output()
        .context("setting the container's sysctls")?;
    if !out.status.success() {
        bail!(
            "setting the container's sysctls: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `boxdesk oci __sysctl --pid PID [--outside] K=V…`: joins PID's user
/// (unless `--outside`), network and IPC namespaces and writes each
/// `/proc/sys` key. In the user namespace (capable there: root over every
/// one, a user over the one it made) a value naming ids
/// (`ping_group_range`) means the container's; `--outside` is for a
/// network namespace the container joined, which that user namespace has
/// no power over (root writes it as the host's). Single-threaded.
pub fn sysctl_main(pid: i32, outside: bool, sysctls: &[String]) -> anyhow::Result<()> {
    use nix::sched::{setns, CloneFlags};
    let ns = |kind: &str| {
        std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
            .with_context(|| format!("opening the sandbox's {kind} namespace"))
    };
    let (user, net, ipc) = (ns("user")?, ns("net")?, ns("ipc")?);
    if !outside {
        setns(&user, CloneFlags::CLONE_NEWUSER).context("joining the sandbox's user namespace")?;
    }
    setns(&net, CloneFlags::CLONE_NEWNET).context("joining the sandbox's network namespace")?;
    setns(&ipc, CloneFlags::CLONE_NEWIPC).context("joining the sandbox's IPC namespace")?;
    for kv in sysctls {
        let (key, value) = kv.split_once('=').context("not K=V")?;
        // The network check was made against the config: here the key
        // only has to be well formed and of a namespace joined above.
        boxdesk_oci::config::check_sysctl(key, false)
            .map_err(|why| anyhow::anyhow!("{key}: {why}"))?;
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        std::fs::write(&path, value).with_context(|| format!("writing {value:?} to {path}"))?;
    }
    Ok(())
}

/// `start`'s side: asks the monitor and waits for its answer.
pub fn request_start(dir: &Path) -> anyhow::Result<()> {
    let sock = dir.join("init.sock");
    let mut conn = UnixStream::connect(&sock)
        .with_context(|| format!("reaching the container's monitor at {}", sock.display()))?;
    conn.set_read_timeout(Some(START_TIMEOUT))?;
    conn.write_all(b"start\n")?;
    let mut answer = String::new();
    BufReader::new(&conn)
        .read_line(&mut answer)
        .context("waiting for the container to start")?;
    if answer != "ok\n" {
        bail!("the container's monitor did not start it");
    }
    Ok(())
}

/// Runs `request`'s process in its sandbox, relayed on this process's
/// stdio (or a terminal sent to `console`); says so on `ready` once it
/// runs. Returns its exit code.
fn relay(
    request: &ExecRequest,
    console: Option<&Path>,
    ready: &mut Option<std::fs::File>,
) -> anyhow::Result<i32> {
    let p = &request.process;
    if p.terminal {
        if let Some(socket) = console {
            super::console::attach(socket, p.console_size)?;
        }
    }
    let (_, paths) = crate::cli::sandbox_paths(&request.sandbox)?;
    let conn = crate::cli::exec::connect(&paths, &request.sandbox)?;
    let exec = to_exec(p)?;
    if let Some(mut r) = ready.take() {
        let _ = r.write_all(b"R");
    }
    run_session_as(conn, exec, p.terminal, &request.sandbox, Relay::Container)
}

/// A non-detached `exec`: the relay in this process.
pub fn exec_here(request: &ExecRequest, console: Option<&Path>) -> anyhow::Result<i32> {
    relay(request, console, &mut None)
}

/// The Exec frame of a process.
fn to_exec(p: &ProcessPlan) -> anyhow::Result<Exec> {
    let (cmd, args) = p.args.split_first().context("process.args is empty")?;
    let mut exec = Exec::new(cmd.as_bytes(), args.iter().map(|a| a.as_bytes()));
    exec.cwd = p.cwd.as_bytes().to_vec();
    for kv in &p.env {
        let (k, v) = kv.split_once('=').context("process.env: not K=V")?;
        exec.env
            .push((k.as_bytes().to_vec(), SecretBytes::copy_from(v.as_bytes())));
    }
    Ok(exec)
}
