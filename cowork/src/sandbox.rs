//! The long-lived namespace sandboxes of one profile. Spawns are execs
//! through the sandbox's agent (one channel session each), which is what
//! makes them fast; a sandbox is started once, by `startVM` (host network)
//! or by the first spawn with a given `allowedDomains` list (a private
//! network whose only way out is the allowlist proxy).
//!
//! Layout inside, on top of the `boxdesk run` base ([`namespace::bwrap_args`]:
//! read-only `/usr`, `/etc`, …, private `/dev`, `/proc`, `/tmp`, seccomp):
//! `/sessions` is the profile's sessions dir, read-write; the user's home
//! path holds the profile's home mirror (empty at first; the SDK and
//! nothing else of the real home appears there). Both are slaves of shared
//! mounts in the server's namespace ([`super::mounts`]), so folders
//! attached later show up in running sandboxes.
//!
//! bwrap runs with `--die-with-parent`, which follows the *thread* that
//! started it: each sandbox is started and waited for by a thread of its
//! own that lives exactly as long as the sandbox.

use boxdesk_platform::sync::lock;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use boxdesk_channel::{codec::handshake, AgchCodec, Frame};
use futures_util::SinkExt;
use tokio::net::UnixStream;
use tokio::sync::Notify;
use tokio_util::codec::Framed;

use super::proxy::{self, Allowlist};
use boxdesk_sandbox::cgroup;
use boxdesk_sandbox::forward::AgentAddr;
use boxdesk_sandbox::namespace::{self, Bind, NamespaceError, Spec};

/// How long a new sandbox's agent may take to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a sandbox may take to end after Shutdown.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Pre-connected agent sessions kept ready for the next spawns.
const POOL: usize = 2;
/// The proxy's address inside a filtered sandbox.
pub const PROXY_PORT: u16 = 3128;

/// Why a sandbox could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// bwrap or its state could not be set up.
    #[error(transparent)]
    Namespace(#[from] NamespaceError),
    /// The sandbox ended before its agent answered.
    #[error("the sandbox exited before its agent answered; log {}:\n{tail}", log.display())]
    Died {
        /// The sandbox log.
        log: PathBuf,
        /// Its last lines.
        tail: String,
    },
    /// The agent did not answer in time.
    #[error("the sandbox's agent did not answer within {}s; log {}", READY_TIMEOUT.as_secs(), log.display())]
    NotReady {
        /// The sandbox log.
        log: PathBuf,
    },
    /// The sandbox is gone.
    #[error("the sandbox is not running")]
    Gone,
    /// The agent refused or dropped the channel.
    #[error("agent channel: {0}")]
    Channel(#[from] boxdesk_channel::ChannelError),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// What the OS said.
        source: io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Os { what, source }
}

/// Where a profile's sandboxes live on the host.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The sessions dir (data; never carries a mount itself).
    pub sessions: PathBuf,
    /// The home mirror (data; never carries a mount itself).
    pub home_mirror: PathBuf,
    /// The user's home path (the same path inside).
    pub home: PathBuf,
    /// Logs.
    pub state: PathBuf,
    /// Under the runtime dir: the agents' run dirs and the staged (shared)
    /// views of `sessions` and `home_mirror` that mounts are attached to.
    pub runtime: PathBuf,
}

impl Layout {
    /// The shared mount showing `sessions`, bound at `/sessions`.
    pub fn staged_sessions(&self) -> PathBuf {
        self.runtime.join("sessions")
    }

    /// The shared mount showing `home_mirror`, bound at the home path.
    pub fn staged_home(&self) -> PathBuf {
        self.runtime.join("home")
    }
}

/// The network a sandbox gets.
#[derive(Debug, Clone)]
pub enum Net {
    /// The host's network, shared.
    Host,
    /// A private network; out only through the proxy, to these domains.
    Filtered(Arc<Allowlist>),
}

/// One running sandbox.
#[derive(Debug)]
pub struct Sandbox {
    agent: AgentAddr,
    log: PathBuf,
    bwrap_pid: u32,
    dead: Arc<AtomicBool>,
    died: Arc<Notify>,
    pool: Mutex<Vec<UnixStream>>,
    proxy: Option<tokio::task::JoinHandle<()>>,
    filtered: bool,
    /// Its cgroup, while it runs with enforced limits.
    cgroup: Arc<Mutex<Option<cgroup::Cgroup>>>,
}

impl Sandbox {
    /// Starts a sandbox over `layout` with network `net`; `tag` names its
    /// run dir and log; `staged` binds the shared views (so later mounts
    /// reach it) rather than the plain dirs. Returns once its agent
    /// answered a handshake.
    pub async fn start(
        layout: &Layout,
        net: Net,
        tag: &str,
        staged: bool,
        limits: cgroup::Limits,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let run_dir = layout.runtime.join(format!("run-{tag}"));
        let log = layout.state.join(format!("sandbox-{tag}.log"));
        let spec = spec(layout, &net, &run_dir, staged)?;
        let agent_sock = run_dir.join("agent.sock");
        let agent = AgentAddr::new(&agent_sock).map_err(os("opening the run dir"))?;
        let dead = Arc::new(AtomicBool::new(false));
        let died = Arc::new(Notify::new());
        let cgroup = Arc::new(Mutex::new(None));
        let name = format!("cowork.{}.{tag}", std::process::id());
        let bwrap_pid = keeper(
            spec,
            Keep {
                agent_sock: agent_sock.clone(),
                log: log.clone(),
                cgroup: cgroup.clone(),
                name,
                limits,
            },
            dead.clone(),
            died.clone(),
        )
        .await?;
        let mut sb = Sandbox {
            agent,
            log,
            bwrap_pid,
            dead,
            died,
            pool: Mutex::new(Vec::with_capacity(POOL)),
            proxy: None,
            filtered: matches!(net, Net::Filtered(_)),
            cgroup,
        };
        let first = match sb.wait_ready().await {
            Ok(s) => s,
            Err(e) => {
                sb.kill().await;
                return Err(e);
            }
        };
        if let Net::Filtered(allow) = net {
            // The agent is bwrap's one child, PID 1 of the sandbox (its
            // socket's peer is this process, which bound it).
            let agent_pid = std::fs::read_to_string(format!(
                "/proc/{pid}/task/{pid}/children",
                pid = sb.bwrap_pid
            ))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
            match listen_in_netns(agent_pid) {
                Ok(l) => sb.proxy = Some(tokio::spawn(proxy::serve(l, allow))),
                Err(e) => {
                    sb.kill().await;
                    return Err(e);
                }
            }
        }
        lock(&sb.pool).push(first);
        Ok(Arc::new(sb))
    }

    /// OOM kills in the sandbox so far, where its limits are enforced by a
    /// cgroup.
    pub fn oom_kills(&self) -> Option<u64> {
        lock(&self.cgroup).as_ref().map(|c| c.oom_kills())
    }

    /// Whether the sandbox is still running.
    pub fn alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }

    /// Resolves once the sandbox has ended.
    pub async fn ended(&self) {
        loop {
            let n = self.died.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if !self.alive() {
                return;
            }
            n.await;
        }
    }

    /// Environment that points a process at this sandbox's proxy.
    pub fn proxy_env(&self) -> Vec<(&'static str, String)> {
        if !self.filtered {
            return Vec::new();
        }
        let url = format!("http://127.0.0.1:{PROXY_PORT}");
        let mut env = Vec::with_capacity(5);
        for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            env.push((k, url.clone()));
        }
        env.push(("NO_PROXY", "localhost,127.0.0.1".to_owned()));
        env
    }

    /// A fresh channel session with the agent, after the handshake
    /// (pre-connected when one is ready), and a refill of the pool in the
    /// background.
    pub async fn session(self: &Arc<Self>) -> Result<UnixStream, SandboxError> {
        if !self.alive() {
            return Err(SandboxError::Gone);
        }
        let pooled = lock(&self.pool).pop();
        let me = self.clone();
        tokio::spawn(async move { me.refill().await });
        match pooled {
            Some(s) => Ok(s),
            None => self.connect().await,
        }
    }

    async fn refill(&self) {
        while self.alive() && lock(&self.pool).len() < POOL {
            match self.connect().await {
                Ok(s) => lock(&self.pool).push(s),
                Err(_) => return,
            }
        }
    }

    async fn connect(&self) -> Result<UnixStream, SandboxError> {
        let mut s = UnixStream::connect(self.agent.path())
            .await
            .map_err(os("connecting to the agent"))?;
        tokio::time::timeout(
            boxdesk_channel::session::HANDSHAKE_TIMEOUT,
            handshake(&mut s),
        )
        .await
        .map_err(|_| os("the agent handshake")(io::ErrorKind::TimedOut.into()))??;
        Ok(s)
    }

    async fn wait_ready(&self) -> Result<UnixStream, SandboxError> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut pause = Duration::from_micros(200);
        loop {
            if !self.alive() {
                return Err(SandboxError::Died {
                    log: self.log.clone(),
                    tail: boxdesk_sandbox::log::tail(&self.log),
                });
            }
            if let Ok(s) = self.connect().await {
                return Ok(s);
            }
            if Instant::now() > deadline {
                return Err(SandboxError::NotReady {
                    log: self.log.clone(),
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }

    /// Ends the sandbox: Shutdown to the agent (every process in it is
    /// killed), then SIGKILL to bwrap if it has not ended in time.
    pub async fn stop(&self) {
        lock(&self.pool).clear();
        if let Some(p) = &self.proxy {
            p.abort();
        }
        if self.alive() {
            if let Ok(s) = self.connect().await {
                let mut f = Framed::new(s, AgchCodec);
                let _ = f.send(Frame::Shutdown).await;
            }
            if tokio::time::timeout(STOP_GRACE, self.ended())
                .await
                .is_err()
            {
                self.kill().await;
            }
        }
        let _ = std::fs::remove_file(self.agent.path());
    }

    async fn kill(&self) {
        if self.alive() {
            // SAFETY: kill takes plain integers; bwrap is our child and is
            // not reaped until its keeper thread sees it exit, so the pid
            // cannot have been reused.
            unsafe { libc::kill(self.bwrap_pid as i32, libc::SIGKILL) };
            self.ended().await;
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(p) = &self.proxy {
            p.abort();
        }
    }
}

fn spec(layout: &Layout, net: &Net, run_dir: &Path, staged: bool) -> Result<Spec, SandboxError> {
    let state = |p: &Path, e: super::private::PrivateError| NamespaceError::State {
        path: p.to_owned(),
        source: std::io::Error::other(e.to_string()),
    };
    super::private::dir(run_dir).map_err(|e| state(run_dir, e))?;
    for d in [&layout.sessions, &layout.home_mirror] {
        super::private::sandbox_dir(d).map_err(|e| state(d, e))?;
    }
    let mut spec = Spec::new("cowork")?;
    spec.net = matches!(net, Net::Host);
    spec.binds = vec![
        Bind::Rw {
            host: if staged {
                layout.staged_sessions()
            } else {
                layout.sessions.clone()
            },
            inside: "/sessions".into(),
        },
        Bind::Rw {
            host: if staged {
                layout.staged_home()
            } else {
                layout.home_mirror.clone()
            },
            inside: layout.home.clone(),
        },
    ];
    spec.home = layout.home.clone();
    spec.cwd = "/sessions".into();
    Ok(spec)
}

/// What [`keeper`] sets up around bwrap and takes down after it.
struct Keep {
    agent_sock: PathBuf,
    log: PathBuf,
    cgroup: Arc<Mutex<Option<cgroup::Cgroup>>>,
    name: String,
    limits: cgroup::Limits,
}

/// Starts bwrap on a thread that then waits for it, so `--die-with-parent`
/// holds for the sandbox's whole life, in a cgroup of its own with the
/// profile's limits where one can be had (removed when it ends); returns
/// bwrap's pid.
async fn keeper(
    spec: Spec,
    keep: Keep,
    dead: Arc<AtomicBool>,
    died: Arc<Notify>,
) -> Result<u32, SandboxError> {
    let Keep {
        agent_sock,
        log,
        cgroup: cg_slot,
        name,
        limits,
    } = keep;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("cowork-sandbox".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // The agent's socket is bound here, outside the sandbox, and
            // handed to the agent as a descriptor.
            let _ = std::fs::remove_file(&agent_sock);
            let join = match cgroup::create(&name, &limits) {
                Ok(cgroup::Placement::Enforced(cg)) => {
                    let fds = cg.join_fds().as_slice().to_vec();
                    *lock(&cg_slot) = Some(cg);
                    fds
                }
                Ok(cgroup::Placement::Unenforced { why }) => {
                    tracing::info!("sandbox limits unenforced: {why}");
                    Vec::new()
                }
                Err(e) => {
                    tracing::warn!("sandbox limits not set up: {e}");
                    Vec::new()
                }
            };
            let started = std::os::unix::net::UnixListener::bind(&agent_sock)
                .map_err(|source| NamespaceError::State {
                    path: agent_sock.clone(),
                    source,
                })
                .and_then(|l| namespace::spawn(&spec, &l.into(), join));
            match started {
                Ok(started) => {
                    let mut child = started.child;
                    let output = started.output;
                    let pumped = std::thread::Builder::new()
                        .name("cowork-sandbox-log".into())
                        .stack_size(64 * 1024)
                        .spawn(move || boxdesk_sandbox::log::pump(output, &log));
                    let _ = tx.send(Ok(child.id()));
                    let _ = child.wait();
                    if let Ok(t) = pumped {
                        let _ = t.join();
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
            if let Some(cg) = lock(&cg_slot).take() {
                if let Err(e) = cg.remove() {
                    tracing::warn!("removing a sandbox's cgroup: {e}");
                }
            }
            dead.store(true, Ordering::SeqCst);
            died.notify_waiters();
        })
        .map_err(os("starting a thread"))?;
    match rx.await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SandboxError::Gone),
    }
}

/// A listener on 127.0.0.1:[`PROXY_PORT`] inside the network namespace of
/// `pid`, made on a short-lived thread that enters that namespace (a
/// socket stays in the namespace it was made in).
fn listen_in_netns(pid: u32) -> Result<tokio::net::TcpListener, SandboxError> {
    if pid == 0 {
        return Err(os("finding the agent's pid")(
            io::ErrorKind::NotFound.into(),
        ));
    }
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(os("opening the sandbox's network namespace"))?;
    let listener = std::thread::spawn(move || -> io::Result<std::net::TcpListener> {
        // SAFETY: setns on a valid namespace fd; it changes only this
        // thread's network namespace, and the thread ends right after.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let l = std::net::TcpListener::bind(("127.0.0.1", PROXY_PORT))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .join()
    .map_err(|_| os("entering the sandbox's network namespace")(io::ErrorKind::Other.into()))?
    .map_err(os("listening in the sandbox's network namespace"))?;
    tokio::net::TcpListener::from_std(listener).map_err(os("registering the proxy listener"))
}
