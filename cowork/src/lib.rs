//! boxdesk-cowork: the cowork frontend, `boxdesk cowork -socket PATH`, a
//! drop-in server for the helper protocol the Claude Desktop app speaks on
//! Linux (`docs/COWORK.md`). Linux only: on
//! other hosts this crate is empty and the CLI says cowork needs Linux.
//!
//! Module map: [`envelope`] (framing, envelopes) → [`server`] (socket,
//! the three connection modes) → [`methods`] (the method table and every
//! method) → [`profile`] (per-profile state, VM lifecycle) → [`sandbox`]
//! (long-lived sandboxes, each kept like any other, and agent sessions) and [`process`] (the
//! process table; one process = one channel session; events via [`utf8`]
//! and [`json`] into [`events`], signals named by [`signals`]).
//! [`names`] is the one check of a session or mount name, [`mounts`]
//! attaches host folders to running sandboxes, [`proxy`] is the
//! `allowedDomains` proxy (its rules: [`allowlist`]), [`sessions`] the
//! session dirs, [`files`] `readFile`, [`private`] the server's own
//! directories (0700; logs are `boxdesk_sandbox::log`'s), [`logcopy`] the
//! copy of the server's log in the app's `logDir`. [`app`] is the app's
//! install as boxdesk meets it: finding it, putting boxdesk in the place
//! of its helper and back, and the support gate the app evaluates before
//! it dials any helper. Every value a peer chose goes
//! through [`logged`] before it reaches a log line.
//!
//! Backend: which backend runs cowork's sandboxes is the `boxdesk`
//! binary's decision (`auto`: a VM where one boots, else namespaces), made
//! before it calls [`main`] and handed over as [`Options::starter`]; what
//! differs between backends is asked of the [`Starter`] (whether its
//! sandboxes can have the host's network), and nothing here names one. This crate builds on `boxdesk-sandbox` and
//! `boxdesk-channel` and must never depend on `boxdesk-hv`,
//! `boxdesk-devices` or `boxdesk-vmm` (`cargo tree -p boxdesk-cowork`
//! shows none of them).

#![cfg(target_os = "linux")]
#![deny(missing_docs)]

pub mod allowlist;
pub mod app;
pub mod dns;
pub mod envelope;
pub mod events;
pub mod files;
pub mod json;
pub mod logcopy;
pub mod methods;
pub mod mounts;
pub mod names;
pub mod private;
pub mod process;
pub mod profile;
pub mod proxy;
pub mod sandbox;
pub mod server;
pub mod sessions;
pub mod signals;
pub mod strict;
pub mod utf8;

use std::fmt::Display;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use boxdesk_platform::{dirs, socket, DirError, SocketError};
use boxdesk_sandbox::keeper::Starter;

/// A value a peer may have chosen (a method name, an id, a path, a
/// domain, an error quoting any of those), as it may appear in a log line:
/// control characters and bidi overrides escaped, so no peer can forge a
/// line or drive the reader's terminal. Every such value goes through
/// this before it reaches a tracing macro.
pub fn logged(v: impl Display) -> String {
    boxdesk_channel::sanitize_error(&v.to_string()).into_owned()
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum CoworkError {
    /// The socket's directory is unsafe.
    #[error("the socket's directory: {0}")]
    Dir(DirError),
    /// The socket could not be bound (another server answers on it, a
    /// symlink, a path too long…).
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The socket path has no parent directory.
    #[error("{} has no parent directory", .0.display())]
    NoParent(PathBuf),
    /// No home directory is known.
    #[error("HOME is not set to an absolute path")]
    NoHome,
    /// The async runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(io::Error),
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<DirError> for CoworkError {
    fn from(e: DirError) -> Self {
        CoworkError::Dir(e)
    }
}

/// What `boxdesk cowork` was asked to do.
#[derive(Clone)]
pub struct Options {
    /// The socket to serve on.
    pub socket: PathBuf,
    /// Turns debug logging on or off at runtime (`setDebugLogging`).
    pub debug: Arc<dyn Fn(bool) + Send + Sync>,
    /// What starts the sandboxes: the backend the binary resolved (cowork
    /// never picks one).
    pub starter: Arc<dyn Starter>,
    /// Why the binary chose that backend, in one line (reported with the
    /// first `startupStep` of every `startVM`).
    pub backend_why: String,
    /// Where the binary's logger copies its lines once `configure` names
    /// the app's `logDir`.
    pub log_copy: logcopy::LogCopy,
}

/// What runs cowork's sandboxes: the binary's choice of backend, and why
/// it chose it (said in the log and with every `startVM`).
#[derive(Debug, Clone)]
pub struct Backend {
    /// What starts the sandboxes.
    pub starter: Arc<dyn Starter>,
    /// Why this backend, in one line.
    pub why: Arc<str>,
}

/// Serves until SIGTERM or SIGINT, then stops every sandbox, kills every
/// process, removes the socket and returns. Call it while the process is
/// still single-threaded: it enters a private mount namespace first.
pub fn main(opts: Options) -> Result<(), CoworkError> {
    private::set_sandbox_owner(opts.starter.inside_owner());
    if let Err(why) = mounts::enter_private_namespace() {
        tracing::warn!(
            "folders cannot be mounted into sandboxes: no private mount namespace: {why}"
        );
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .ok_or(CoworkError::NoHome)?;
    let data_root = dirs::data_dir()?.join("cowork");
    let runtime_root = dirs::runtime_dir()?.join("cowork");
    // Each as the folder checks will see it: through any link on its way.
    let own_roots = [dirs::runtime_dir()?, dirs::state_dir()?, dirs::data_dir()?]
        .into_iter()
        .map(|d| std::fs::canonicalize(&d).unwrap_or(d))
        .collect();
    sweep_leftovers();
    let listener = bind(&opts.socket)?;
    let bound = std::fs::symlink_metadata(&opts.socket)
        .map(|m| (m.dev(), m.ino()))
        .ok();
    // One async worker: the work is socket I/O and small bookkeeping, and
    // on a 2-core machine one worker streamed 1.4x faster and spawned 1.3x
    // sooner than two (no cross-thread wake-ups); blocking work (session
    // dirs) runs on the blocking pool and sandboxes on threads of their own.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(CoworkError::Runtime)?;
    let debug = opts.debug.clone();
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let overflow = std::fs::read_to_string("/proc/sys/kernel/overflowuid").ok();
    if uid != 0 && overflow.as_deref().map(str::trim) == Some(uid.to_string().as_str()) {
        tracing::warn!(
            "running as the overflow uid {uid}: inside this server's user namespace other users look like uid {uid}, so only the socket directory's 0700 keeps them out"
        );
    }
    let server = Arc::new(server::Server::new(
        uid,
        home,
        data_root,
        runtime_root,
        own_roots,
        Box::new(move |on| debug(on)),
        Backend {
            starter: opts.starter.clone(),
            why: opts.backend_why.as_str().into(),
        },
        opts.log_copy.clone(),
    ));
    tracing::info!("boxdesk cowork serving on {}", opts.socket.display());
    runtime.block_on(async {
        listener
            .set_nonblocking(true)
            .map_err(CoworkError::Runtime)?;
        let listener =
            tokio::net::UnixListener::from_std(listener).map_err(CoworkError::Runtime)?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(CoworkError::Runtime)?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(CoworkError::Runtime)?;
        tokio::select! {
            () = server::serve(server.clone(), listener) => {}
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        for p in server.all() {
            p.stop().await;
        }
        Ok::<(), CoworkError>(())
    })?;
    // Remove the socket only if it is still the one we bound.
    let still_ours = std::fs::symlink_metadata(&opts.socket)
        .map(|m| (m.dev(), m.ino()))
        .ok();
    if still_ours.is_some() && still_ours == bound {
        let _ = std::fs::remove_file(&opts.socket);
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

/// Checks the socket's directory (ours, 0700, not a symlink) and binds,
/// refusing a path where a live server answers.
fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener, CoworkError> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| CoworkError::NoParent(path.to_owned()))?;
    dirs::check_private_dir(parent, boxdesk_platform::euid())?;
    socket::check_not_symlink(path)?;
    match socket::bind_exclusive(path) {
        Err(SocketError::InUse(p)) => Err(SocketError::InUse(p).into()),
        other => Ok(other?),
    }
}

/// [`boxdesk_sandbox::keeper::sweep_leftovers`] on a thread of its own, off
/// the start's path: a deep tree takes a while.
fn sweep_leftovers() {
    let spawned = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(boxdesk_sandbox::keeper::sweep_leftovers);
    if let Err(e) = spawned {
        tracing::warn!("cannot start the leftover sweep: {e}");
    }
}
