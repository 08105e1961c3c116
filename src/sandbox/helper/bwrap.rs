//! The namespace backend's half of the helper (Linux only): start bwrap
//! over the sandbox's state dir, wait for its agent's handshake, then
//! forward `<name>.agent` to the agent's socket until the sandbox exits.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boxdesk_channel::{Session, Stream};
use boxdesk_platform::SandboxPaths;

use super::{
    fail, lock, log_tail, os, spawn_thread, HelperError, HelperOptions, Phase, Shared,
    READY_TIMEOUT,
};
use crate::sandbox::forward::{self, AgentAddr};
use crate::sandbox::namespace::{self, NamespaceError, Spec};

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
        tracing::error!("the sandbox exited unexpectedly ({status:?}); stopping");
        shared.teardown(1);
    }
    loop {
        std::thread::park();
    }
}

fn start(shared: &Shared, opts: &HelperOptions) -> Result<Child, HelperError> {
    let exe = std::env::current_exe().map_err(|source| NamespaceError::Inspect {
        what: "the boxdesk binary".into(),
        source,
    })?;
    let host = namespace::scan_host(std::path::Path::new("/")).map_err(|source| {
        NamespaceError::Inspect {
            what: "/".into(),
            source,
        }
    })?;
    let spec = Spec::for_state(opts.name.clone(), opts.net, host, &shared.state, exe);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&shared.paths.log)
        .map_err(os("opening the sandbox log"))?;
    let child = namespace::spawn(&spec, &log)?;
    shared.sandbox_pid.store(child.id(), Ordering::SeqCst);
    Ok(child)
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
            return Err(HelperError::Died {
                status,
                log: paths.log.clone(),
                tail: log_tail(&paths.log),
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
                tail: log_tail(&paths.log),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}
