//! The socket server: accepts connections, checks peers, and runs each
//! connection in one of the three modes of docs/COWORK.md — one-shot, a
//! persistent pipe whose requests run concurrently (replies out of order),
//! or an event subscription.
//!
//! A connection's reader parses frames and starts one task per request;
//! its writer sends replies as they finish, or, after `subscribeEvents`,
//! the profile's events. A bad frame ends only its own connection (after
//! an error reply); nothing a peer sends can end the server.

use boxdesk_platform::sync::lock;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

use super::envelope::{self, Request};
use super::logcopy::LogCopy;
use super::logged;
use super::methods;
use super::profile::{Profile, ProfileKey};
use boxdesk_sandbox::conn::stall::{next_frame, Timed};
use boxdesk_sandbox::conn::{Admission, MAX_CONNECTIONS};

/// Turns debug logging on or off.
pub type DebugSwitch = Box<dyn Fn(bool) + Send + Sync>;

/// The server's shared state.
pub struct Server {
    uid: u32,
    home: PathBuf,
    data_root: PathBuf,
    runtime_root: PathBuf,
    own_roots: Vec<PathBuf>,
    profiles: Mutex<HashMap<ProfileKey, Arc<Profile>>>,
    last: Mutex<Option<ProfileKey>>,
    debug: DebugSwitch,
    backend: crate::Backend,
    log_copy: LogCopy,
}

impl Server {
    /// A server for user `uid` with home `home`, keeping profiles' data
    /// under `data_root` and their sockets and staged mounts under
    /// `runtime_root`, never mounting a folder that holds or lies in one of
    /// `own_roots` (boxdesk's runtime, state and data dirs), starting
    /// sandboxes on `backend`, copying its log where `log_copy` is told to.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        uid: u32,
        home: PathBuf,
        data_root: PathBuf,
        runtime_root: PathBuf,
        own_roots: Vec<PathBuf>,
        debug: DebugSwitch,
        backend: crate::Backend,
        log_copy: LogCopy,
    ) -> Self {
        Server {
            uid,
            home,
            data_root,
            runtime_root,
            own_roots,
            profiles: Mutex::default(),
            last: Mutex::default(),
            debug,
            backend,
            log_copy,
        }
    }

    /// Copies the server's log into `dir` from now on (`configure`'s
    /// `logDir`); one that cannot be used is said in the log and changes
    /// nothing.
    pub fn set_log_dir(&self, dir: &str) {
        let before = self.log_copy.path();
        match self.log_copy.set_dir(dir) {
            Ok(path) if before.as_ref() != Some(&path) => {
                tracing::info!("this log is copied to {}", logged(path.display()))
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("logDir: {}", logged(e)),
        }
    }

    /// The user's home directory.
    pub fn home(&self) -> &Path {
        &self.home
    }

    /// Where profiles keep their data.
    pub fn data_root(&self) -> &Path {
        &self.data_root
    }

    /// Where profiles keep sockets and staged mounts.
    pub fn runtime_root(&self) -> &Path {
        &self.runtime_root
    }

    /// boxdesk's own dirs, none of which a folder mount may hold or lie in.
    pub fn own_roots(&self) -> &[PathBuf] {
        &self.own_roots
    }

    /// Turns debug logging on or off.
    pub fn set_debug(&self, on: bool) {
        (self.debug)(on);
    }

    /// The profile `key`, created on first use.
    pub fn profile(&self, key: ProfileKey) -> Arc<Profile> {
        lock(&self.profiles)
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Profile::new(
                    key,
                    &self.data_root,
                    &self.runtime_root,
                    &self.home,
                    self.backend.clone(),
                ))
            })
            .clone()
    }

    /// The profile of a connection with none bound: the most recently
    /// configured one (or an unnamed default before any `configure`).
    pub fn current(&self) -> Arc<Profile> {
        let key = lock(&self.last).clone().unwrap_or(ProfileKey {
            name: String::new(),
            root: String::new(),
        });
        self.profile(key)
    }

    fn profile_of(&self, params: &Value) -> Option<ProfileKey> {
        let s = |k: &str| params.get(k).and_then(Value::as_str).map(str::to_owned);
        match (s("userDataName"), s("userDataRoot")) {
            (None, None) => None,
            (name, root) => Some(ProfileKey {
                name: name.unwrap_or_default(),
                root: root.unwrap_or_default(),
            }),
        }
    }

    /// Every profile (for shutdown).
    pub fn all(&self) -> Vec<Arc<Profile>> {
        lock(&self.profiles).values().cloned().collect()
    }
}

/// Accepts connections forever, at most [`MAX_CONNECTIONS`] at once: past
/// that a peer gets one error frame (`{"success":false,"error":"too many
/// connections"}`, written without waiting) and is closed. A peer owes its
/// first frame within [`boxdesk_sandbox::conn::STALL_TIMEOUT`] of connecting, and
/// any frame it begins within as long of its first byte (else a `bad
/// frame: no complete frame within 10 s` reply and close); idle between
/// frames is normal (a pipe, a subscription) and stays.
pub async fn serve(server: Arc<Server>, listener: UnixListener) {
    let admission = Admission::new("cowork socket", MAX_CONNECTIONS);
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Some(slot) = admission.try_admit() else {
                    let _ = stream.try_write(&reply_frame(None, Err(TOO_MANY.into())));
                    continue;
                };
                let server = server.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    connection(server, stream).await;
                });
            }
            Err(e) => {
                // EMFILE and friends: wait a little rather than spin, and
                // say so once, not twenty times a second.
                admission.flood(format_args!("accept: {e}"));
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// The read buffer a connection starts with.
const FIRST_READ: usize = 512;

/// The error of the frame sent to a peer refused past the cap.
pub const TOO_MANY: &str = "too many connections";

enum Out {
    Frame(Bytes),
    Events(Arc<Profile>),
}

fn reply_frame(id: Option<&Value>, outcome: Result<Value, String>) -> Bytes {
    let mut body = envelope::reply(id, outcome);
    if body.len() > envelope::MAX_BODY {
        // The client drops a connection whose frame is over its cap.
        body = envelope::reply(
            id,
            Err(format!(
                "the reply would be {} bytes, over the 10 MiB frame limit",
                body.len()
            )),
        );
    }
    let mut f = Vec::with_capacity(body.len() + 4);
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(&body);
    Bytes::from(f)
}

async fn connection(server: Arc<Server>, stream: UnixStream) {
    match stream.peer_cred() {
        Ok(c) if c.uid() == server.uid => {}
        Ok(c) => {
            tracing::warn!(
                "refused a connection from uid {} (not {})",
                c.uid(),
                server.uid
            );
            return;
        }
        Err(e) => {
            tracing::warn!("refused a connection: no peer credentials: {e}");
            return;
        }
    }
    let (rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Out>(256);
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            match out {
                Out::Frame(b) => {
                    if wr.write_all(&b).await.is_err() {
                        return;
                    }
                }
                Out::Events(p) => {
                    let _ = p.events.deliver(&mut wr).await;
                    return;
                }
            }
        }
    });
    // A small first buffer: the codec reserves a frame's whole length once
    // it has read it, and an idle peer costs no more than this.
    let mut frames = FramedRead::with_capacity(rd, Timed::new(envelope::codec()), FIRST_READ);
    let mut bound: Option<Arc<Profile>> = None;
    let mut subscribed = false;
    while let Some(frame) = next_frame(&mut frames).await {
        let mut body = match frame {
            Ok(b) => b,
            Err(e) => {
                let _ = tx
                    .send(Out::Frame(reply_frame(
                        None,
                        Err(format!("bad frame: {e}")),
                    )))
                    .await;
                break;
            }
        };
        if subscribed {
            // An event connection carries nothing from the client.
            continue;
        }
        let parsed = envelope::parse(&body);
        // The body may hold a token or stdin: wipe it once parsed.
        zeroize::Zeroize::zeroize(&mut body[..]);
        let req = match parsed {
            Ok(r) => r,
            Err(e) => {
                let _ = tx
                    .send(Out::Frame(reply_frame(e.id(), Err(e.to_string()))))
                    .await;
                if e.closes() {
                    break;
                }
                continue;
            }
        };
        if tracing::enabled!(tracing::Level::DEBUG) {
            let id = req.id.as_ref().map_or("-".into(), Value::to_string);
            tracing::debug!(
                "request {} id={} params={}",
                logged(&req.method),
                logged(id),
                logged(methods::redacted(&req.params))
            );
        }
        match req.method.as_str() {
            "subscribeEvents" => {
                let p = match server.profile_of(&req.params) {
                    Some(k) => server.profile(k),
                    None => server.current(),
                };
                let _ = tx
                    .send(Out::Frame(reply_frame(req.id.as_ref(), Ok(json!({})))))
                    .await;
                let _ = tx.send(Out::Events(p.clone())).await;
                p.events.replace_subscriber(writer.abort_handle());
                subscribed = true;
            }
            "configure" => {
                let p = match server.profile_of(&req.params) {
                    Some(k) => server.profile(k),
                    None => bound.clone().unwrap_or_else(|| server.current()),
                };
                *lock(&server.last) = Some(p.key.clone());
                bound = Some(p.clone());
                respond(&server, &p, req, &tx).await;
            }
            _ => {
                let p = bound.clone().unwrap_or_else(|| server.current());
                let (server, tx) = (server.clone(), tx.clone());
                tokio::spawn(async move { respond(&server, &p, req, &tx).await });
            }
        }
    }
    drop(tx);
    // A subscriber that half-closed still gets its events; the writer ends
    // when a write fails or a newer subscriber replaces it.
    let _ = writer.await;
}

async fn respond(server: &Arc<Server>, p: &Arc<Profile>, req: Request, tx: &mpsc::Sender<Out>) {
    let outcome = methods::call(server, p, &req.method, req.params)
        .await
        .map_err(|e| e.to_string());
    if let Err(e) = &outcome {
        tracing::info!("{} failed: {}", logged(&req.method), logged(e));
    }
    let _ = tx
        .send(Out::Frame(reply_frame(req.id.as_ref(), outcome)))
        .await;
}
