//! Per-profile state: everything the client scopes by `(userDataName,
//! userDataRoot)` — settings, the OAuth token, the installed SDK, the
//! sandboxes, processes, session dirs and the event queue.
//!
//! Owns the VM lifecycle as the client sees it (`startVM`, `stopVM`,
//! `isRunning`, `isGuestConnected`) and the events that go with it. A
//! profile's files live under `<data>/boxdesk/cowork/<dir_name>/`; every
//! directory from `<data>/boxdesk` down, and from the runtime dir's
//! `cowork/` down, is private (0700, the sandbox's own where it uses them)
//! and every log 0600 ([`private`]).

use boxdesk_platform::sync::lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::envelope;
use super::events::Events;
use super::mounts;
use super::private;
use super::process::Procs;
use super::proxy::{self, Allowlist};
use super::sandbox::{Layout, Naming, Net, Sandbox, SandboxError};
use super::sessions::SessionsDir;
use boxdesk_sandbox::running::Resources;

/// Private-network sandboxes (one per distinct `allowedDomains` list) a
/// profile keeps at once; on a VM backend each is a VM. Past it, an idle
/// one is stopped to make room, and with none idle the spawn is refused.
pub const MAX_FILTERED: usize = 8;

/// A profile's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProfileKey {
    /// `userDataName`.
    pub name: String,
    /// `userDataRoot`.
    pub root: String,
}

impl ProfileKey {
    /// A filesystem-safe directory name: the name's safe characters and a
    /// digest of both fields.
    pub fn dir_name(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.name.as_bytes());
        h.update([0]);
        h.update(self.root.as_bytes());
        let digest = h.finalize();
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        let safe: String = self
            .name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(32)
            .collect();
        if safe.is_empty() {
            hex
        } else {
            format!("{safe}-{hex}")
        }
    }
}

/// The installed SDK.
#[derive(Debug, Clone)]
pub struct Sdk {
    /// `<dir>/<version>`, the same path inside the sandbox.
    pub dir: PathBuf,
    /// `<dir>/<version>/claude`.
    pub claude: PathBuf,
}

/// What `configure`, `createVM` and the token methods record.
#[derive(Debug, Default)]
pub struct Settings {
    /// `memoryMB` of configure (or startVM's `memoryGB`): the sandboxes'
    /// memory limit, swap included, where cgroups can be had.
    pub memory_mb: Option<u64>,
    /// `cpuCount` of configure or startVM: their CPU quota, likewise.
    pub cpu_count: Option<u64>,
    /// `bundlePath` of createVM/startVM (VM backends only).
    pub bundle_path: Option<String>,
    /// `diskSizeGB` of createVM, in bytes: the sessions dir's quota as
    /// `getSessionsDiskInfo` reports it (recorded, not enforced: the
    /// namespace backend cannot hold a plain directory to a size).
    pub disk_quota: Option<u64>,
    /// The token of `addApprovedOauthToken`.
    pub token: Option<Zeroizing<String>>,
    /// The SDK of `installSdk`.
    pub sdk: Option<Sdk>,
}

/// One profile.
#[derive(Debug)]
pub struct Profile {
    /// Its identity.
    pub key: ProfileKey,
    /// `<data>/boxdesk/cowork/<dir_name>`.
    pub dir: PathBuf,
    /// Its session dirs.
    pub sessions: SessionsDir,
    /// Where its sandboxes live.
    pub layout: Layout,
    /// Its event queue.
    pub events: Arc<Events>,
    /// Its processes.
    pub procs: Arc<Procs>,
    /// What the client configured.
    pub settings: Mutex<Settings>,
    /// Held by startVM and stopVM, so they run one at a time.
    lifecycle: tokio::sync::Mutex<()>,
    /// The host-network sandbox (read without waiting for a lifecycle
    /// change, so `isRunning` never queues behind `startVM`).
    host: Mutex<Option<Arc<Sandbox>>>,
    /// Private-network sandboxes by allowlist key.
    filtered: tokio::sync::Mutex<HashMap<String, Arc<Sandbox>>>,
    connected: AtomicBool,
    shared_ready: AtomicBool,
    /// Numbers the private-network sandboxes (`-net<n>` of their names and logs); never reused.
    next_tag: std::sync::atomic::AtomicU32,
    /// What starts its sandboxes (the binary's choice of backend).
    backend: crate::Backend,
    /// The topmost private dirs above `dir` (`<data>/boxdesk`) and above
    /// `layout.runtime` (`<runtime>/boxdesk/cowork`).
    tops: [PathBuf; 2],
}

impl Profile {
    /// A profile whose files live under `root/<dir_name>` and whose
    /// sockets and staged mounts live under `runtime/<dir_name>`, for a
    /// user whose home is `home`, whose sandboxes run on `backend`.
    pub fn new(
        key: ProfileKey,
        root: &Path,
        runtime: &Path,
        home: &Path,
        backend: crate::Backend,
    ) -> Self {
        let dir = root.join(key.dir_name());
        let tops = [root.parent().unwrap_or(root).to_owned(), runtime.to_owned()];
        let layout = Layout {
            sessions: dir.join("sessions"),
            home_mirror: dir.join("home"),
            home: home.to_owned(),
            state: dir.clone(),
            runtime: runtime.join(key.dir_name()),
        };
        Profile {
            sessions: SessionsDir::new(layout.sessions.clone()),
            key,
            dir,
            layout,
            events: Arc::default(),
            procs: Arc::default(),
            settings: Mutex::default(),
            lifecycle: tokio::sync::Mutex::default(),
            host: Mutex::default(),
            filtered: tokio::sync::Mutex::default(),
            connected: AtomicBool::new(false),
            shared_ready: AtomicBool::new(false),
            next_tag: std::sync::atomic::AtomicU32::new(0),
            backend,
            tops,
        }
    }

    /// What this profile's sandboxes may use: `memoryMB`/`cpuCount` (as
    /// large as a limit can say), and the default pids cap and `/tmp`.
    fn resources(&self) -> Resources {
        let s = self.settings();
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Resources {
            cpus: s.cpu_count.map(clamp),
            mem_mib: s.memory_mb.map(clamp),
            ..Resources::default()
        }
    }

    /// How the sandbox of `tag` (`host`, `net<n>`) is named and logged.
    fn naming(&self, tag: &str) -> Naming {
        Naming {
            profile: self.key.name.clone(),
            stem: if tag == "host" {
                String::new()
            } else {
                format!("-{tag}")
            },
            log: self.log_of(tag),
        }
    }

    fn log_of(&self, tag: &str) -> PathBuf {
        self.layout.state.join(format!("sandbox-{tag}.log"))
    }

    /// Locks the settings.
    pub fn settings(&self) -> std::sync::MutexGuard<'_, Settings> {
        lock(&self.settings)
    }

    /// Queues a status event (never held back).
    pub fn emit(&self, event: Value) {
        self.events.push(envelope::frame_json(&event));
    }

    /// Queues the `error` event of the profile itself (no process `id`):
    /// `fatal` when its sandbox cannot start or died under it.
    pub fn emit_error(&self, message: &str, fatal: bool) {
        self.emit(json!({"type": "error", "message": message, "fatal": fatal}));
    }

    fn step(&self, step: &str, status: &str) {
        self.emit(json!({"type": "startupStep", "step": step, "status": status}));
    }

    /// Whether the host-network sandbox runs.
    pub fn is_running(&self) -> bool {
        lock(&self.host).as_ref().is_some_and(|s| s.alive())
    }

    /// Whether the agent answered a handshake and the sandbox still runs.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst) && self.is_running()
    }

    fn host(&self) -> Option<Arc<Sandbox>> {
        lock(&self.host).clone().filter(|s| s.alive())
    }

    /// `startVM`: starts the host-network sandbox (idempotent), with
    /// startupStep events, then probes `api_probe` in the background.
    pub async fn start(self: &Arc<Self>, api_probe: Option<String>) -> Result<(), String> {
        let _life = self.lifecycle.lock().await;
        if self.is_running() {
            return Ok(());
        }
        // Which backend, and why: the binary's choice, said once per start.
        self.emit(json!({
            "type": "startupStep",
            "step": "select_backend",
            "status": "completed",
            "backend": self.backend.starter.backend(),
            "reason": &*self.backend.why,
        }));
        self.step("prepare_session", "running");
        if let Err(e) = self.prepare() {
            self.step("prepare_session", "failed");
            self.emit_error(&format!("cannot start the sandbox: {e}"), true);
            return Err(e);
        }
        self.step("prepare_session", "completed");
        self.step("start_vm", "running");
        self.step("wait_for_guest", "running");
        let staged = self.shared_ready.load(Ordering::SeqCst);
        if let Err(e) = self.private_log("host") {
            self.step("start_vm", "failed");
            self.step("wait_for_guest", "failed");
            let why = format!("cannot start the sandbox: {e}");
            self.emit_error(&why, true);
            return Err(why);
        }
        let starter = self.backend.starter.clone();
        let (naming, resources) = (self.naming("host"), self.resources());
        match Sandbox::start(
            starter,
            &self.layout,
            Net::Public,
            naming,
            staged,
            resources,
        )
        .await
        {
            Ok(sb) => {
                self.step("start_vm", "completed");
                self.step("wait_for_guest", "completed");
                self.watch(sb.clone());
                *lock(&self.host) = Some(sb);
                self.connected.store(true, Ordering::SeqCst);
                self.emit(json!({"type": "networkStatus", "status": "connected"}));
            }
            Err(e) => {
                self.step("start_vm", "failed");
                self.step("wait_for_guest", "failed");
                let why = format!("cannot start the sandbox: {}", e.with_causes());
                self.emit_error(&why, true);
                return Err(why);
            }
        }
        drop(_life);
        if let Some(url) = api_probe {
            let me = self.clone();
            // The path a spawn's traffic takes: through the proxy and its
            // rules.
            let rules = self
                .host()
                .map_or_else(Allowlist::public, |sb| sb.allowlist().clone());
            tokio::spawn(async move {
                let status = match proxy::probe(&url, Some(&rules)).await {
                    Ok(r) => r.as_str(),
                    Err(_) => "unreachable",
                };
                me.emit(json!({"type": "apiReachability", "status": status}));
            });
        }
        Ok(())
    }

    /// Creates the profile's dirs and, once, the shared staged views of
    /// its sessions dir and home mirror. Without mount support the
    /// sandboxes still run (on the plain dirs); spawns that need mounts
    /// report them as failed.
    fn prepare(&self) -> Result<(), String> {
        let l = &self.layout;
        let [data, runtime] = &self.tops;
        let shown = |e: private::PrivateError| e.to_string();
        private::dirs(data, &l.state).map_err(shown)?;
        private::dirs(runtime, &l.runtime).map_err(shown)?;
        // What the sandboxes see (the staged views once bound show the
        // same dirs) is theirs.
        for d in [
            &l.sessions,
            &l.home_mirror,
            &l.staged_sessions(),
            &l.staged_home(),
        ] {
            private::sandbox_dir(d).map_err(shown)?;
        }
        if !self.shared_ready.load(Ordering::SeqCst) {
            let shared = mounts::make_shared(&l.sessions, &l.staged_sessions())
                .and_then(|()| mounts::make_shared(&l.home_mirror, &l.staged_home()));
            match shared {
                Ok(()) => self.shared_ready.store(true, Ordering::SeqCst),
                Err(e) => {
                    let e = super::logged(e);
                    tracing::warn!("folders cannot be mounted into this profile's sandboxes: {e}")
                }
            }
        }
        Ok(())
    }

    /// Makes the log of sandbox `tag` (which its backend then opens by
    /// name, appending) a private regular file: created 0600 or tightened,
    /// never through a symlink.
    fn private_log(&self, tag: &str) -> std::io::Result<()> {
        boxdesk_sandbox::log::open(&self.log_of(tag)).map(drop)
    }

    /// Whether folders can be attached to this profile's sandboxes.
    pub fn can_mount(&self) -> Result<(), String> {
        mounts::available().map_err(|e| e.to_string())?;
        if self.shared_ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("the sessions dir is not a shared mount".into())
        }
    }

    /// Marks the profile disconnected when the host sandbox ends on its
    /// own (not by `stopVM`), with a fatal `error` event saying how.
    fn watch(self: &Arc<Self>, sb: Arc<Sandbox>) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            sb.ended().await;
            if let Some(me) = me.upgrade() {
                let current = lock(&me.host).as_ref().is_some_and(|h| Arc::ptr_eq(h, &sb));
                if current && me.connected.swap(false, Ordering::SeqCst) {
                    let name = super::logged(&me.key.name);
                    let how = sb.how_it_ended().unwrap_or_else(|| "it ended".to_owned());
                    tracing::warn!(
                        "the sandbox of profile {name} ended: {}",
                        super::logged(&how)
                    );
                    me.emit_error(
                        &format!("the sandbox ended: {how}; startVM starts it again"),
                        true,
                    );
                    me.emit(json!({"type": "networkStatus", "status": "disconnected"}));
                }
            }
        });
    }

    /// The sandbox a spawn with `allowed` domains runs in: the host one,
    /// or the private-network one for that list (started on first use).
    pub async fn sandbox_for(&self, allowed: Option<Allowlist>) -> Result<Arc<Sandbox>, String> {
        let host = self
            .host()
            .ok_or("the VM is not running: call startVM first")?;
        let Some(allow) = allowed else {
            return Ok(host);
        };
        let key = allow.key();
        let mut filtered = self.filtered.lock().await;
        filtered.retain(|_, s| s.alive());
        if let Some(sb) = filtered.get(&key) {
            return Ok(sb.clone());
        }
        // A stopVM may have run while this waited for the lock.
        self.host()
            .ok_or("the VM is not running: call startVM first")?;
        if filtered.len() >= MAX_FILTERED {
            // Room is made by an idle one: no process runs in it (only this
            // table holds it).
            let idle = filtered
                .iter()
                .find(|(_, sb)| Arc::strong_count(sb) == 1)
                .map(|(k, _)| k.clone());
            match idle.and_then(|k| filtered.remove(&k)) {
                Some(sb) => sb.stop().await,
                None => {
                    return Err(format!(
                        "{MAX_FILTERED} sandboxes for other allowedDomains lists are running processes, \
                         the most a profile keeps at once; spawn again when one of them has finished"
                    ))
                }
            }
        }
        let tag = format!("net{}", self.next_tag.fetch_add(1, Ordering::Relaxed));
        let staged = self.shared_ready.load(Ordering::SeqCst);
        self.private_log(&tag)
            .map_err(|e| format!("cannot start the filtered sandbox: {e}"))?;
        let sb = Sandbox::start(
            self.backend.starter.clone(),
            &self.layout,
            Net::Filtered(Arc::new(allow)),
            self.naming(&tag),
            staged,
            self.resources(),
        )
        .await
        .map_err(|e: SandboxError| {
            format!("cannot start the filtered sandbox: {}", e.with_causes())
        })?;
        filtered.insert(key, sb.clone());
        Ok(sb)
    }

    /// `stopVM` (and shutdown): kills every process, waits briefly for
    /// their exit events, ends the sandboxes and takes the sessions'
    /// mounts off (the SDK stays installed).
    pub async fn stop(&self) {
        let _life = self.lifecycle.lock().await;
        let was = lock(&self.host).is_some();
        self.procs.signal_all(libc::SIGKILL);
        for _ in 0..100 {
            if self.procs.running() == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let host = lock(&self.host).take();
        let all: Vec<Arc<Sandbox>> = host
            .into_iter()
            .chain(self.filtered.lock().await.drain().map(|(_, s)| s))
            .collect();
        for sb in all {
            sb.stop().await;
        }
        let staged = self.layout.staged_sessions();
        let _ = tokio::task::spawn_blocking(move || mounts::detach_all(&staged, None)).await;
        self.connected.store(false, Ordering::SeqCst);
        if was {
            self.emit(json!({"type": "networkStatus", "status": "disconnected"}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dirs_are_safe_distinct_and_stable() {
        let a = ProfileKey {
            name: "Claude".into(),
            root: "/home/u/.config".into(),
        };
        let b = ProfileKey {
            name: "../Claude".into(),
            root: "/home/u/.config".into(),
        };
        assert!(a.dir_name().starts_with("Claude-"));
        assert_eq!(a.dir_name(), a.clone().dir_name());
        assert_ne!(a.dir_name(), b.dir_name());
        assert!(!b.dir_name().contains('/') && !b.dir_name().contains(".."));
    }
}
