//! `boxdesk cowork -socket PATH`: logging whose level `setDebugLogging`
//! can change at runtime, the backend check (cowork's sandboxes run on the
//! namespace backend until a VM's shares can follow folders attached while
//! it runs), then the server of
//! [`boxdesk_cowork`].
//!
//! The app passes `-socket` with one dash; clap knows only `--socket`, so
//! the argument is rewritten before parsing. Off Linux the command exists
//! but only says that cowork is the Linux desktop helper.

use std::ffi::OsString;
use std::path::PathBuf;

use super::EXIT_BOXDESK;

/// `boxdesk cowork -socket P` → `boxdesk cowork --socket P` (also
/// `-socket=P`); other arguments are left alone.
pub fn rewrite_single_dash(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.collect();
    if args.get(1).is_some_and(|a| a == "cowork") {
        for a in args.iter_mut().skip(2) {
            if a == "-socket" {
                *a = "--socket".into();
            } else if let Some(rest) = a.to_str().and_then(|s| s.strip_prefix("-socket=")) {
                *a = format!("--socket={rest}").into();
            }
        }
    }
    args
}

/// Runs the server; logs are lines on stderr (the app copies them to its
/// log file).
#[cfg(target_os = "linux")]
pub fn cowork(socket: PathBuf) -> i32 {
    use std::sync::Arc;
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::prelude::*;
    use tracing_subscriber::reload;

    let base = match std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| l.parse::<LevelFilter>().ok())
    {
        Some(level) => level,
        None => LevelFilter::INFO,
    };
    let (filter, handle) = reload::Layer::new(base);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false);
    // The same lines, copied into the app's logDir once configure names it.
    let log_copy = boxdesk_cowork::logcopy::LogCopy::default();
    let copy = log_copy.clone();
    let copied = tracing_subscriber::fmt::layer()
        .with_writer(move || copy.writer())
        .with_ansi(false)
        .with_target(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(copied)
        .try_init();
    super::raise_nofile();
    let debug = Arc::new(move |on: bool| {
        let level = if on { LevelFilter::DEBUG } else { base };
        let _ = handle.modify(|f| *f = level);
        tracing::info!("debug logging {}", if on { "on" } else { "off" });
    });
    let starter = match cowork_backend() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("boxdesk cowork: {e:#}");
            return EXIT_BOXDESK;
        }
    };
    let opts = boxdesk_cowork::Options {
        socket,
        debug,
        starter,
        log_copy,
    };
    match boxdesk_cowork::main(opts) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("boxdesk cowork: {e}");
            EXIT_BOXDESK
        }
    }
}

/// The starter of cowork's sandboxes, from `BOXDESK_BACKEND` parsed as for
/// `run`. Its sandboxes need host folders, which only the namespace backend
/// shares today (a VM needs virtio-fs), so `auto` and `namespace` start
/// namespace sandboxes and `kvm`/`hvf` are refused with that reason; an
/// unknown word is refused as for `run`. Unset, empty or not UTF-8 means
/// `auto`.
#[cfg(target_os = "linux")]
fn cowork_backend() -> anyhow::Result<std::sync::Arc<dyn boxdesk_sandbox::keeper::Starter>> {
    use crate::backend::Backend;
    let backend = match std::env::var("BOXDESK_BACKEND") {
        Ok(w) if !w.is_empty() => w.parse::<Backend>()?,
        _ => Backend::Auto,
    };
    match backend {
        Backend::Auto | Backend::Namespace => Ok(std::sync::Arc::new(
            boxdesk_sandbox::namespace::running::NamespaceStarter,
        )),
        vm => anyhow::bail!("cowork runs on the namespace backend: the {vm} backend cannot run cowork's sandboxes yet (cowork attaches folders to running sandboxes, and a VM's virtio-fs shares are fixed at boot); unset BOXDESK_BACKEND or set it to namespace"),
    }
}

/// Off Linux: a clear refusal; the server is the app's helper on Linux
/// and runs its sandboxes on the namespace backend.
#[cfg(not(target_os = "linux"))]
pub fn cowork(_socket: PathBuf) -> i32 {
    eprintln!("boxdesk cowork: cowork is the Linux desktop helper (the Claude Desktop app on Linux); it needs Linux");
    EXIT_BOXDESK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apps_single_dash_socket_flag_is_accepted() {
        let a = |v: &[&str]| rewrite_single_dash(v.iter().map(OsString::from));
        assert_eq!(
            a(&["boxdesk", "cowork", "-socket", "/s"]),
            a(&["boxdesk", "cowork", "--socket", "/s"])
        );
        assert_eq!(a(&["boxdesk", "cowork", "-socket=/s"])[2], "--socket=/s");
        assert_eq!(a(&["boxdesk", "run", "-socket"])[2], "-socket");
    }
}
