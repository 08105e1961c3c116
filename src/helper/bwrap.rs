//! The namespace backend's half of the helper (Linux only): bind the
//! agent's listening socket outside the sandbox, start bwrap over the
//! sandbox's state dir with that socket inherited, copy what the sandbox
//! prints into the capped log, wait for the agent's handshake, then forward
//! `<name>.agent` to the agent until the sandbox exits.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_channel::{Session, Stream};
use boxdesk_platform::SandboxPaths;

use super::{
    fail, lock, os, spawn_thread, End, HelperError, HelperOptions, Phase, Shared, READY_TIMEOUT,
};
use boxdesk_sandbox::forward::{self, AgentAddr};
use boxdesk_sandbox::namespace::{self, Spec};
use boxdesk_sandbox::{cgroup, log};

/// Runs a namespace sandbox to its end; returns only on a startup failure
/// (after cleaning up). `agent_listener` is the bound `<name>.agent`.
pub(super) fn run(
    shared: Arc<Shared>,
    opts: HelperOptions,
    agent_listener: Option<UnixListener>,
    agent: Arc<AgentAddr>,
) -> Result<std::convert::Infallible, HelperError> {
    let started = shared.started;
    let Some(agent_listener) = agent_listener else {
        unreachable!("a namespace sandbox always binds its agent socket")
    };
    let mut child = match start(&shared, &opts) {
        Ok(child) => child,
        Err(e) => return Err(fail(&shared, None, e)),
    };
    tracing::debug!("bwrap started at {:?}", started.elapsed());
    if let Err(e) = wait_ready(&mut child, &agent, &shared.paths) {
        return Err(fail(&shared, Some(child), e));
    }
    shared.ready_ms.store(
        started.elapsed().as_millis().max(1) as u64,
        Ordering::Relaxed,
    );
    *lock(&shared.phase) = Phase::Running;
    spawn_thread("agent-accept", move || {
        let e = forward::serve(agent_listener, agent);
        tracing::error!("agent socket: {e}");
    })?;
    tracing::info!(
        "sandbox {} ready in {} ms",
        opts.name,
        started.elapsed().as_millis()
    );
    // Kept open (not dropped) until the process exits.
    let _ready = opts.ready.map(|fd| {
        let mut f = File::from(fd);
        let _ = f.write_all(b"R");
        f
    });

    let status = child.wait();
    *lock(&shared.exited) = true;
    shared.exited_cv.notify_all();
    if !shared.stopping.load(Ordering::SeqCst) {
        let why = match status {
            Ok(s) => format!("the sandbox exited on its own ({s})"),
            Err(e) => format!("the sandbox could not be waited for ({e})"),
        };
        shared.teardown(1, End::Died(why));
    }
    loop {
        std::thread::park();
    }
}

fn start(shared: &Shared, opts: &HelperOptions) -> Result<Child, HelperError> {
    let mut spec = Spec::for_state(&opts.name, &shared.state)?;
    spec.net = opts.net;
    spec.pids_max = opts.pids;
    spec.tmp_bytes = opts.tmp_bytes;
    let t = Instant::now();
    let join = limits(shared, opts)?;
    tracing::debug!("limits set up in {:?}", t.elapsed());
    {
        let mut info = lock(&shared.extra_info);
        info.push(("uid_map", format!("0:{}:1", spec.ids.uid)));
        info.push(("gid_map", format!("0:{}:1", spec.ids.gid)));
        info.push(("pids_max", spec.pids_max.to_string()));
        info.push(("tmp_mib", (spec.tmp_bytes >> 20).to_string()));
    }
    // The agent's socket lives outside the sandbox, in the 0700 state dir,
    // and reaches the agent as a descriptor: nothing inside can rename,
    // replace or listen in place of it. Any file there is a leftover of
    // this name's earlier run (we hold the name's lock).
    let sock = shared.state.agent_sock();
    let _ = std::fs::remove_file(&sock);
    let listener: OwnedFd = UnixListener::bind(&sock)
        .map_err(os("binding the agent's socket"))?
        .into();
    let started = namespace::spawn(&spec, &listener, join)?;
    drop(listener);
    let log_path = shared.paths.log.clone();
    let output = started.output;
    spawn_thread("sandbox-log", move || log::pump(output, &log_path))?;
    shared
        .sandbox_pid
        .store(started.child.id(), Ordering::SeqCst);
    Ok(started.child)
}

/// Puts the sandbox's limits in a cgroup of its own where this host and
/// user allow one (removed again at its end), says in `info` what holds,
/// and returns the `cgroup.procs` descriptors bwrap's child joins. The
/// pids cap also holds without a cgroup: the agent sets RLIMIT_NPROC in
/// the sandbox's user namespace.
fn limits(shared: &Shared, opts: &HelperOptions) -> Result<Vec<std::os::fd::RawFd>, HelperError> {
    let wanted = cgroup::Limits {
        cpus: opts.cpus.map(f64::from),
        mem_mib: opts.mem_mib.map(u64::from),
        pids: Some(opts.pids),
    };
    let placement = cgroup::create(&opts.name, &wanted)?;
    let mut info = lock(&shared.extra_info);
    match placement {
        cgroup::Placement::Enforced(cg) => {
            let version = match cg.version() {
                cgroup::Version::V1 => "cgroup-v1",
                cgroup::Version::V2 => "cgroup-v2",
            };
            info.push(("limits", version.to_owned()));
            info.push(("cgroup", cg.location()));
            if !cg.unenforced().is_empty() {
                info.push(("limits_unenforced", cg.unenforced().join(",")));
            }
            let fds = cg.join_fds().as_slice().to_vec();
            let cg = std::sync::Mutex::new(Some(cg));
            lock(&shared.after_end).push(Box::new(move || {
                if let Some(cg) = lock(&cg).take() {
                    if let Err(e) = cg.remove() {
                        tracing::warn!("removing the sandbox's cgroup: {e}");
                    }
                }
            }));
            Ok(fds)
        }
        cgroup::Placement::Unenforced { why } => {
            info.push(("limits", "unenforced".to_owned()));
            info.push(("limits_why", why));
            Ok(Vec::new())
        }
    }
}

/// Polls the agent's socket until a channel handshake succeeds.
fn wait_ready(
    child: &mut Child,
    agent: &AgentAddr,
    paths: &SandboxPaths,
) -> Result<(), HelperError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut pause = Duration::from_micros(100);
    loop {
        if let Some(status) = child.try_wait().map_err(os("waiting for bwrap"))? {
            // Let the log thread write out what bwrap said.
            std::thread::sleep(Duration::from_millis(20));
            return Err(HelperError::Died {
                status,
                log: paths.log.clone(),
                tail: log::tail(&paths.log),
            });
        }
        if let Ok(s) = agent.connect() {
            if Session::over(Stream::Unix(s)).is_ok() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(HelperError::NotReady {
                log: paths.log.clone(),
                tail: log::tail(&paths.log),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}
