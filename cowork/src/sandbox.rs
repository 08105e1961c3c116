//! The long-lived sandboxes of one profile. Spawns are execs through the
//! sandbox's agent (one channel session each), which is what makes them
//! fast; a sandbox is started once, by `startVM` (host network) or by the
//! first spawn with a given `allowedDomains` list (a private network whose
//! only way out is the allowlist proxy, served here on the connections the
//! sandbox relays from its `127.0.0.1:`[`PROXY_PORT`]; the names it lists
//! resolve inside through [`crate::dns`] where the backend can serve it).
//!
//! Each is a [`boxdesk_sandbox::Sandbox`] made by the [`Starter`] the
//! binary chose (cowork never picks or names a backend), kept by a
//! [`Keeper`] like any other sandbox: a name ([`name_for`]), a control
//! socket, a state dir and an `info` with `profile`, so `boxdesk ls` lists
//! it and `boxdesk exec`/`shell`/`stop` reach it. What it shares: the
//! profile's sessions dir at `/sessions` and its home mirror at the user's
//! home path (empty at first; the SDK and nothing else of the real home
//! appears there), both following later mounts: they are the shared views
//! of [`super::mounts`], so folders attached later show up in running
//! sandboxes.
//!
//! A sandbox's end, however it comes (`stopVM`, `boxdesk stop NAME`, its own
//! death), is seen here ([`Sandbox::ended`]) and takes its keeper's claim
//! with it: no socket, lock or state dir is left.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use boxdesk_channel::codec::handshake;
use boxdesk_platform::sync::lock;
use boxdesk_sandbox::keeper::{End, Keeper, KeeperError, Starter};
use boxdesk_sandbox::lock::LockError;
use boxdesk_sandbox::running::{
    Endpoint, InsideListener, Net as SpecNet, Resources, Rootfs, SandboxSpec, Share,
};
use boxdesk_sandbox::state::StateError;
use tokio::net::UnixStream;
use tokio::sync::Notify;

use super::proxy::{self, Allowlist};

/// Pre-connected agent sessions kept ready for the next spawns.
const POOL: usize = 2;
/// The proxy's address inside a filtered sandbox.
pub const PROXY_PORT: u16 = 3128;
/// How many names [`name_for`] tries before giving up.
const NAME_TRIES: u32 = 99;

/// Why a sandbox could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No name could be claimed for it.
    #[error(transparent)]
    Claim(#[from] KeeperError),
    /// The backend could not start it, or its agent never answered.
    #[error(transparent)]
    Start(#[from] boxdesk_sandbox::running::StartError),
    /// The sandbox is gone.
    #[error("the sandbox is not running")]
    Gone,
    /// The hybrid socket in front of the agent refused or garbled the
    /// `CONNECT` line.
    #[error("the agent's socket answered CONNECT with: {0}")]
    Refused(String),
    /// The agent refused or dropped the channel.
    #[error("agent channel: {0}")]
    Channel(boxdesk_channel::ChannelError),
    /// A system call failed.
    #[error("{what}: {error}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// What the OS said (in the message, so not also its source).
        error: io::Error,
    },
}

impl SandboxError {
    /// The message with every cause after it (`a: b: c`), for the app,
    /// which sees only this text.
    pub fn with_causes(&self) -> String {
        boxdesk_platform::report::chain(self)
    }
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<boxdesk_channel::ChannelError> for SandboxError {
    fn from(e: boxdesk_channel::ChannelError) -> Self {
        SandboxError::Channel(e)
    }
}

fn os(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |error| SandboxError::Os { what, error }
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
    /// Under the runtime dir: the staged (shared) views of `sessions` and
    /// `home_mirror` that mounts are attached to (the sandboxes' own
    /// sockets are their keepers', beside every other sandbox's).
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
    /// A private network; out only through the proxy, to any public
    /// destination (never this host, its LAN or link-local): what a
    /// sandbox gets without `allowedDomains`, on every backend. (Sharing the
    /// host's network namespace would hand a spawned process the host's
    /// loopback services and abstract Unix sockets, an X server's among
    /// them.)
    Public,
    /// A private network; out only through the proxy, to these domains.
    Filtered(Arc<Allowlist>),
}

/// What a sandbox is started as: its profile, its name's stem, its log.
#[derive(Debug, Clone)]
pub struct Naming {
    /// The profile's name (`userDataName`), shown by `boxdesk ls`.
    pub profile: String,
    /// The stem of its name ([`name_for`]): the profile's part, then
    /// `-net<n>` for a private-network one.
    pub stem: String,
    /// Where what it prints goes (the profile's `sandbox-<tag>.log`).
    pub log: PathBuf,
}

/// The sandbox name cowork gives a profile's sandbox: `cowork-<pid>-<safe>`
/// where `<pid>` is this server's (so two servers, of two users or two
/// runtime dirs, never share a name or a cgroup) and `<safe>` is up to 24
/// of the profile name's `[A-Za-z0-9_-]` (`profile` when it has none); a
/// private-network sandbox adds `-net<n>`. A name another keeper holds
/// (two profiles whose names differ only in other characters) gets the
/// next free `-2`, `-3`, …: attempt `n` (from 1) of [`NAME_TRIES`].
pub fn name_for(profile: &str, suffix: &str, attempt: u32) -> String {
    let safe: String = profile
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(24)
        .collect();
    let safe = if safe.is_empty() { "profile" } else { &safe };
    let base = format!("cowork-{}-{safe}{suffix}", std::process::id());
    match attempt {
        0 | 1 => base,
        n => format!("{base}-{n}"),
    }
}

/// One running sandbox.
pub struct Sandbox {
    name: String,
    sandbox: Arc<dyn boxdesk_sandbox::Sandbox>,
    keeper: Arc<Keeper>,
    agent: Endpoint,
    dead: Arc<AtomicBool>,
    died: Arc<Notify>,
    /// How it ended, in one line, once it has.
    how: Arc<Mutex<Option<String>>>,
    pool: Mutex<Vec<UnixStream>>,
    proxy: Option<tokio::task::JoinHandle<()>>,
    /// Its resolver ([`crate::dns`]), where the backend can serve one.
    dns: Option<tokio::task::JoinHandle<()>>,
    /// The rules of its proxy, its only way out.
    allow: Arc<Allowlist>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Starts a sandbox over `layout` with network `net` and `resources`
    /// through `starter`, kept under a name of [`name_for`]; `staged`
    /// shares the shared views (so later mounts reach it) rather than the
    /// plain dirs. Returns once its agent answered a handshake.
    pub async fn start(
        starter: Arc<dyn Starter>,
        layout: &Layout,
        net: Net,
        naming: Naming,
        staged: bool,
        resources: Resources,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        // Every sandbox reaches out only through the proxy.
        let allow = match net {
            Net::Public => Arc::new(Allowlist::public()),
            Net::Filtered(allow) => allow,
        };
        let layout = layout.clone();
        let (keeper, sandbox, listener, dns) = tokio::task::spawn_blocking(move || {
            start_kept(&*starter, &layout, &naming, staged, resources)
        })
        .await
        .map_err(|_| SandboxError::Gone)??;
        let agent = sandbox.owner_agent();
        let dead = Arc::new(AtomicBool::new(false));
        let died = Arc::new(Notify::new());
        let how = Arc::new(Mutex::new(None));
        watch(&keeper, &sandbox, &dead, &died, &how)?;
        let mut sb = Sandbox {
            name: keeper_name(&keeper),
            sandbox,
            keeper,
            agent,
            dead,
            died,
            how,
            pool: Mutex::new(Vec::with_capacity(POOL)),
            proxy: None,
            dns: None,
            allow: allow.clone(),
        };
        if let Some(sockets) = dns {
            sb.dns = Some(tokio::spawn(crate::dns::serve(
                sockets,
                allow.clone(),
                crate::dns::Lookup::Host,
            )));
        }
        match proxy::Listener::from_inside(listener) {
            Ok(l) => sb.proxy = Some(tokio::spawn(proxy::serve(l, allow))),
            Err(e) => {
                sb.stop().await;
                return Err(os("registering the proxy listener")(e));
            }
        }
        let sb = Arc::new(sb);
        sb.refill().await;
        Ok(sb)
    }

    /// Its name, as `boxdesk ls` shows it ([`name_for`]).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// OOM kills in the sandbox so far, where its backend counts them.
    pub fn oom_kills(&self) -> Option<u64> {
        self.sandbox.oom_kills()
    }

    /// Whether the sandbox is still running.
    pub fn alive(&self) -> bool {
        !self.dead.load(Ordering::SeqCst)
    }

    /// How the sandbox ended, in one line; `None` while it runs.
    pub fn how_it_ended(&self) -> Option<String> {
        lock(&self.how).clone()
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

    /// The rules its processes' connections out are held to: its only way
    /// out is the proxy.
    pub fn allowlist(&self) -> &Allowlist {
        &self.allow
    }

    /// Environment that points a process at this sandbox's proxy.
    pub fn proxy_env(&self) -> Vec<(&'static str, String)> {
        let url = format!("http://127.0.0.1:{PROXY_PORT}");
        let mut env = Vec::with_capacity(8);
        for k in [
            "HTTPS_PROXY",
            "HTTP_PROXY",
            "ALL_PROXY",
            "https_proxy",
            "http_proxy",
            "all_proxy",
        ] {
            env.push((k, url.clone()));
        }
        for k in ["NO_PROXY", "no_proxy"] {
            env.push((k, "localhost,127.0.0.1,::1".to_owned()));
        }
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
        let (path, port) = match &self.agent {
            Endpoint::Unix(path) => (path, None),
            Endpoint::Hybrid { path, port } => (path, Some(*port)),
        };
        let mut s = UnixStream::connect(path)
            .await
            .map_err(os("connecting to the agent"))?;
        let opened = async {
            if let Some(port) = port {
                hybrid_connect(&mut s, port).await?;
            }
            handshake(&mut s).await.map_err(SandboxError::from)
        };
        tokio::time::timeout(boxdesk_channel::session::HANDSHAKE_TIMEOUT, opened)
            .await
            .map_err(|_| os("the agent handshake")(io::ErrorKind::TimedOut.into()))??;
        Ok(s)
    }

    /// Ends the sandbox: its agent asked to shut down (every process in it
    /// is killed), killed if it has not ended in time, and its keeper's
    /// claim undone.
    pub async fn stop(&self) {
        lock(&self.pool).clear();
        for task in [&self.proxy, &self.dns].into_iter().flatten() {
            task.abort();
        }
        end_kept(self.keeper.clone(), self.sandbox.clone()).await;
        self.ended().await;
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for task in [&self.proxy, &self.dns].into_iter().flatten() {
            task.abort();
        }
    }
}

/// `CONNECT <port>` on a hybrid socket and its `OK` line, read a byte at
/// a time so nothing of the stream after it is taken.
async fn hybrid_connect(s: &mut UnixStream, port: u32) -> Result<(), SandboxError> {
    use boxdesk_channel::hybrid::{self, Reply};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(hybrid::request(port).as_bytes())
        .await
        .map_err(os("writing CONNECT"))?;
    let mut line = Vec::with_capacity(16);
    loop {
        let b = s.read_u8().await.map_err(os("reading CONNECT's answer"))?;
        line.push(b);
        match hybrid::scan_reply(&line) {
            Reply::Partial => {}
            Reply::Ok { .. } => return Ok(()),
            Reply::Err(why) => return Err(SandboxError::Refused(why.to_owned())),
            Reply::Malformed(e) => return Err(SandboxError::Refused(e.to_string())),
        }
    }
}

fn keeper_name(keeper: &Keeper) -> String {
    keeper
        .paths()
        .sock
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Ends a kept sandbox off the runtime (the keeper waits for it).
async fn end_kept(keeper: Arc<Keeper>, sandbox: Arc<dyn boxdesk_sandbox::Sandbox>) {
    let _ = tokio::task::spawn_blocking(move || {
        if !keeper.end(End::Stop) {
            // Another end runs (`boxdesk stop`): the sandbox's end is
            // what is waited for.
            sandbox.wait();
        }
    })
    .await;
}

/// A thread that waits for the sandbox's end, whoever caused it, and then
/// ends its keeper (a sandbox that died on its own says so in the log,
/// with the tail of its own log) and wakes [`Sandbox::ended`].
fn watch(
    keeper: &Arc<Keeper>,
    sandbox: &Arc<dyn boxdesk_sandbox::Sandbox>,
    dead: &Arc<AtomicBool>,
    died: &Arc<Notify>,
    how: &Arc<Mutex<Option<String>>>,
) -> Result<(), SandboxError> {
    let (keeper, sandbox, dead, died, how) = (
        keeper.clone(),
        sandbox.clone(),
        dead.clone(),
        died.clone(),
        how.clone(),
    );
    std::thread::Builder::new()
        .name("cowork-sandbox".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            let ended = sandbox.wait();
            let line = match &ended {
                boxdesk_sandbox::running::Ended::Stopped => "it was stopped".to_owned(),
                boxdesk_sandbox::running::Ended::PoweredOff => "it powered off".to_owned(),
                boxdesk_sandbox::running::Ended::Died(why) => why.clone(),
            };
            *lock(&how) = Some(line);
            if let boxdesk_sandbox::running::Ended::Died(why) = ended {
                if !keeper.ending() {
                    let tail = super::logged(sandbox.log_tail());
                    tracing::warn!(
                        "sandbox {}: {why}; its log ends:\n{tail}",
                        keeper_name(&keeper)
                    );
                }
            }
            // Cowork restarts its sandboxes itself: nothing of an ended
            // one is kept for `ls` (its log stays in the profile's dir).
            keeper.end(End::Stop);
            dead.store(true, Ordering::SeqCst);
            died.notify_waiters();
        })
        .map(drop)
        .map_err(os("starting a thread"))
}

type Kept = (
    Arc<Keeper>,
    Arc<dyn boxdesk_sandbox::Sandbox>,
    InsideListener,
    Option<boxdesk_sandbox::running::DnsSockets>,
);

/// Claims a name, starts the sandbox under it and waits for its agent
/// (blocking); for a private-network one, also the proxy's listener.
fn start_kept(
    starter: &dyn Starter,
    layout: &Layout,
    naming: &Naming,
    staged: bool,
    resources: Resources,
) -> Result<Kept, SandboxError> {
    let (keeper, control) = claim(naming)?;
    let abandon = |e: SandboxError| {
        keeper.abandon();
        e
    };
    keeper
        .serve(control)
        .map_err(|e| abandon(os("starting a thread")(e)))?;
    keeper.label("profile", naming.profile.clone());
    keeper.label("log", naming.log.display().to_string());
    let spec = spec(layout, &keeper_name(&keeper), staged, resources);
    let sandbox: Arc<dyn boxdesk_sandbox::Sandbox> = starter
        .start(&spec, &keeper, &naming.log)
        .map(Arc::from)
        .map_err(|e| abandon(e.into()))?;
    keeper.hold(sandbox.clone());
    sandbox.wait_ready().map_err(|e| abandon(e.into()))?;
    let listener = sandbox
        .listen_inside(PROXY_PORT)
        .map_err(|e| abandon(e.into()))?;
    // Its resolver, where the backend can make one (a VM's comes with its
    // network).
    let dns = match sandbox.dns_inside() {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!("no resolver inside {}: {e}", keeper_name(&keeper));
            None
        }
    };
    keeper.ready();
    Ok((keeper, sandbox, listener, dns))
}

/// The first free name of [`name_for`], claimed.
fn claim(naming: &Naming) -> Result<(Arc<Keeper>, std::os::unix::net::UnixListener), SandboxError> {
    let mut attempt = 1;
    loop {
        let name = name_for(&naming.profile, &naming.stem, attempt);
        match Keeper::claim(&name, false, false, Box::new(|| {})) {
            Ok(k) => return Ok(k),
            Err(
                KeeperError::Lock(LockError::Held(_))
                | KeeperError::State(StateError::Leftover { .. }),
            ) if attempt < NAME_TRIES => {
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The spec of a profile's sandbox: its sessions dir at `/sessions`
/// (its working directory) and again at `/work`, where `boxdesk exec`
/// starts a command unless told otherwise, its home mirror at the home
/// path (its HOME), all writable and following later mounts.
fn spec(layout: &Layout, name: &str, staged: bool, resources: Resources) -> SandboxSpec {
    let pick = |view: PathBuf, plain: &Path| if staged { view } else { plain.to_owned() };
    let mut spec = SandboxSpec::new(name);
    // A private network; the proxy's port relayed out (see `Net`).
    spec.net = SpecNet::None;
    spec.relays = vec![PROXY_PORT];
    // Names it may reach resolve inside, through boxdesk ([`crate::dns`]).
    spec.resolv_conf = Some(crate::dns::RESOLV_CONF.to_owned());
    spec.resources = resources;
    spec.shares = vec![
        Share {
            host: pick(layout.staged_sessions(), &layout.sessions),
            inside: "/sessions".into(),
            writable: true,
            follows_mounts: true,
        },
        Share {
            host: pick(layout.staged_sessions(), &layout.sessions),
            inside: "/work".into(),
            writable: true,
            follows_mounts: true,
        },
        Share {
            host: pick(layout.staged_home(), &layout.home_mirror),
            inside: layout.home.clone(),
            writable: true,
            follows_mounts: true,
        },
    ];
    spec.home = layout.home.clone();
    spec.cwd = "/sessions".into();
    // The host's own system, read-only: the namespace backend's root, a
    // VM's over virtio-fs, so the user's tools run in either.
    spec.rootfs = Rootfs::Host;
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_error_reaches_the_app_with_every_cause() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot inspect the bind sources")]
        struct Inspect(#[source] io::Error);
        let cause = io::Error::new(io::ErrorKind::NotFound, "/x: No such file");
        let e = SandboxError::Start(boxdesk_sandbox::running::StartError::Backend(Box::new(
            Inspect(cause),
        )));
        assert_eq!(
            e.with_causes(),
            "cannot inspect the bind sources: /x: No such file"
        );
    }

    #[test]
    fn a_profiles_sandbox_is_named_after_this_server_and_the_profiles_safe_characters() {
        let pid = std::process::id();
        assert_eq!(name_for("Claude", "", 1), format!("cowork-{pid}-Claude"));
        assert_eq!(
            name_for("Claude", "-net3", 1),
            format!("cowork-{pid}-Claude-net3")
        );
        assert_eq!(name_for("Claude", "", 2), format!("cowork-{pid}-Claude-2"));
        assert_eq!(name_for("../é x", "", 1), format!("cowork-{pid}-x"));
        assert_eq!(name_for("//", "", 1), format!("cowork-{pid}-profile"));
        let long = name_for(&"a".repeat(200), "-net4294967295", NAME_TRIES);
        assert!(
            boxdesk_platform::names::validate_name(&long).is_ok(),
            "{long}"
        );
    }
}
