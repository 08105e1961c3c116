//! `boxdesk cowork`: the Claude Desktop app's Cowork helper on Linux.
//!
//! `boxdesk cowork -socket PATH` (and boxdesk started under the helper's
//! own name, `cowork-linux-helper -socket PATH`, as the app starts it)
//! serves the helper protocol: logging whose level `setDebugLogging` can
//! change at runtime and that `configure`'s `logDir` gets a copy of, the
//! choice of backend (a microVM per profile where one boots, else
//! namespaces; [`cowork_backend`]), then the server of [`boxdesk_cowork`]. `install`, `uninstall` and `status` put
//! boxdesk in the place of the app's helper and back (`install.rs`);
//! `doctor` evaluates the app's support gate and says what boxdesk runs on
//! (`doctor.rs`).
//!
//! The app passes `-socket` with one dash; clap knows only `--socket`, so
//! the argument is rewritten before parsing. Off Linux the command exists
//! but only says that cowork is the Linux desktop helper.

#[cfg(target_os = "linux")]
mod doctor;
#[cfg(target_os = "linux")]
mod install;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::EXIT_BOXDESK;

/// The helper's file name in the app's resources directory: boxdesk
/// started under it is the helper.
pub const HELPER_NAME: &str = "cowork-linux-helper";

/// `boxdesk cowork`: serve on SOCKET, or one of the subcommands.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CoworkArgs {
    /// The socket to serve on (also `-socket`); its directory must be
    /// 0700 and ours.
    #[arg(long, required = true)]
    pub socket: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Option<CoworkCmd>,
}

/// What `boxdesk cowork` does besides serving.
#[derive(Debug, Subcommand)]
pub enum CoworkCmd {
    /// Put boxdesk in the place of the app's helper (a symlink named
    /// cowork-linux-helper in its resources directory), keeping the app's
    /// own beside it, checksummed; then start it as the app does and ask
    /// it `isRunning`. Needs root where the app's directory does. Where
    /// AppArmor restricts user namespaces, also installs boxdesk's AppArmor
    /// profile (as root; else it prints the command and exits 1).
    Install(AppArg),
    /// Put the app's own helper back (only when its checksum still
    /// matches).
    Uninstall(AppArg),
    /// Say what is at the app's helper path: boxdesk, the app's own, or
    /// the app's own again after an app update replaced boxdesk. Exit 0
    /// when boxdesk is installed.
    Status {
        #[command(flatten)]
        app: AppArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate the app's Cowork gate item by item (qemu, firmware,
    /// virtiofsd, /dev/kvm, /dev/vhost-vsock) and say whether the app will
    /// dial a helper at all, and what boxdesk runs on. Exit 0 when the app
    /// will dial it and boxdesk can serve it here.
    Doctor {
        #[command(flatten)]
        app: AppArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Evaluate the gate against the file system under DIR (a chroot,
        /// an image) instead of this machine's.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
}

/// Where the app is, when not where its packages put it.
#[derive(Debug, Args)]
pub struct AppArg {
    /// The app's directory or its resources directory [default: the
    /// official package's, claude-desktop-debian's, the AUR's or a Nix
    /// profile's].
    #[arg(long, value_name = "DIR")]
    pub app: Option<PathBuf>,
}

/// `boxdesk cowork …` once parsed: serve, or run a subcommand.
pub fn run(a: CoworkArgs) -> i32 {
    match (a.cmd, a.socket) {
        (Some(cmd), _) => {
            super::init_logging(false);
            match subcommand(cmd) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("boxdesk cowork: {e:#}");
                    EXIT_BOXDESK
                }
            }
        }
        (None, Some(socket)) => cowork(socket),
        // clap requires one or the other.
        (None, None) => EXIT_BOXDESK,
    }
}

#[cfg(target_os = "linux")]
fn subcommand(cmd: CoworkCmd) -> anyhow::Result<i32> {
    match cmd {
        CoworkCmd::Install(a) => install::install(a.app.as_deref()),
        CoworkCmd::Uninstall(a) => install::uninstall(a.app.as_deref()),
        CoworkCmd::Status { app, json } => install::status(app.app.as_deref(), json),
        CoworkCmd::Doctor { app, json, root } => {
            doctor::doctor(app.app.as_deref(), json, root.as_deref())
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn subcommand(_cmd: CoworkCmd) -> anyhow::Result<i32> {
    anyhow::bail!(
        "cowork is the Linux desktop helper (the Claude Desktop app on Linux); it needs Linux"
    )
}

/// What `cowork-linux-helper ARGS` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelperArgs {
    /// Serve on this socket.
    Serve(PathBuf),
    /// `--help`.
    Help,
    /// `--version`.
    Version,
}

/// The arguments of boxdesk started as `cowork-linux-helper`: the app's
/// `-socket PATH` (also `--socket PATH`, `-socket=PATH`, `--socket=PATH`)
/// and nothing else. A first argument naming `cowork-vm-service.js` is
/// skipped: claude-desktop-debian's `COWORK_VM_BACKEND=bwrap` starts
/// `$COWORK_NODE_PATH <resources>/cowork-vm-service.js -socket PATH`, and
/// `COWORK_NODE_PATH` may name boxdesk under this name.
pub fn helper_args(args: &[OsString]) -> Result<HelperArgs, String> {
    let mut rest = args;
    if let Some(first) = rest.first() {
        if std::path::Path::new(first)
            .file_name()
            .is_some_and(|n| n == "cowork-vm-service.js")
        {
            rest = &rest[1..];
        }
    }
    let words: Vec<Option<&str>> = rest.iter().map(|a| a.to_str()).collect();
    match words.as_slice() {
        [Some("-h" | "--help")] => Ok(HelperArgs::Help),
        [Some("-V" | "--version")] => Ok(HelperArgs::Version),
        [Some("-socket" | "--socket"), _] => Ok(HelperArgs::Serve(PathBuf::from(&rest[1]))),
        [Some(one)] => match one
            .strip_prefix("-socket=")
            .or_else(|| one.strip_prefix("--socket="))
        {
            Some(p) if !p.is_empty() => Ok(HelperArgs::Serve(PathBuf::from(p))),
            _ => Err(format!("unexpected argument {one:?}")),
        },
        [] => Err("the socket is missing".to_owned()),
        _ => Err(format!(
            "unexpected arguments {:?}",
            rest.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>()
        )),
    }
}

/// boxdesk started as `cowork-linux-helper` (a symlink or a copy in the
/// app's resources directory): the helper the app starts.
pub fn as_helper(args: &[OsString]) -> i32 {
    let usage = format!("usage: {HELPER_NAME} -socket PATH");
    match helper_args(args) {
        Ok(HelperArgs::Serve(socket)) => cowork(socket),
        Ok(HelperArgs::Help) => {
            println!(
                "{HELPER_NAME}: boxdesk {}, serving the Claude Desktop app's Cowork helper protocol
{usage}
(the same as `boxdesk cowork -socket PATH`; see `boxdesk cowork --help`)",
                env!("CARGO_PKG_VERSION")
            );
            0
        }
        Ok(HelperArgs::Version) => {
            println!("{HELPER_NAME} (boxdesk {})", env!("CARGO_PKG_VERSION"));
            0
        }
        Err(why) => {
            eprintln!(
                "{HELPER_NAME} (boxdesk): {why}
{usage}"
            );
            EXIT_BOXDESK
        }
    }
}

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
        .with(super::quiet_dependencies())
        .with(fmt)
        .with(copied)
        .try_init();
    super::raise_nofile();
    let debug = Arc::new(move |on: bool| {
        let level = if on { LevelFilter::DEBUG } else { base };
        let _ = handle.modify(|f| *f = level);
        tracing::info!("debug logging {}", if on { "on" } else { "off" });
    });
    let choice = match cowork_backend() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("boxdesk cowork: {e:#}");
            return EXIT_BOXDESK;
        }
    };
    tracing::info!(
        "sandboxes run on the {} backend: {}",
        choice.starter.backend(),
        choice.why
    );
    let opts = boxdesk_cowork::Options {
        socket,
        debug,
        starter: choice.starter,
        backend_why: choice.why,
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

/// What cowork's sandboxes run on, and why.
#[cfg(target_os = "linux")]
pub(super) struct Choice {
    /// What starts them.
    pub starter: std::sync::Arc<dyn boxdesk_sandbox::keeper::Starter>,
    /// Why this backend, in one line.
    pub why: String,
}

/// vCPUs of a cowork VM when `startVM`/`configure` set none (at most the
/// host's CPUs).
#[cfg(target_os = "linux")]
pub const COWORK_VCPUS: u32 = 2;
/// Memory of a cowork VM in MiB when `startVM`/`configure` set none; RAM
/// the guest never touches is never resident on the host.
#[cfg(target_os = "linux")]
pub const COWORK_MEM_MIB: u32 = 2048;

/// The backend of cowork's sandboxes, from `BOXDESK_BACKEND` parsed as for
/// `run` (unset, empty or not UTF-8: `auto`): `auto` is a VM where one can
/// boot here (the same probe as `run`), else the namespace backend; `kvm`
/// and `namespace` force one, and a VM that cannot boot here is refused
/// with the probe's reason.
#[cfg(target_os = "linux")]
pub(super) fn cowork_backend() -> anyhow::Result<Choice> {
    use crate::backend::{vm_here, Backend};
    use std::sync::Arc;
    let backend = match std::env::var("BOXDESK_BACKEND") {
        Ok(w) if !w.is_empty() => w.parse::<Backend>()?,
        _ => Backend::Auto,
    };
    let vm = |why: String| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let defaults = boxdesk_sandbox::running::Resources {
            cpus: Some(COWORK_VCPUS.min(cpus)),
            mem_mib: Some(COWORK_MEM_MIB),
            ..Default::default()
        };
        Choice {
            starter: Arc::new(boxdesk_vmm::sandbox::VmStarter { defaults }),
            why,
        }
    };
    let namespace = |why: String| Choice {
        starter: Arc::new(boxdesk_sandbox::namespace::running::NamespaceStarter),
        why,
    };
    Ok(match backend {
        Backend::Namespace => namespace("BOXDESK_BACKEND=namespace".into()),
        Backend::Auto => match vm_here() {
            Ok(b) => vm(format!("auto: a VM boots here ({b})")),
            Err(why) => namespace(format!("auto: no VM can boot here ({why})")),
        },
        forced => {
            forced.resolve()?;
            vm(format!("BOXDESK_BACKEND={forced}"))
        }
    })
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
    fn started_as_the_helper_only_the_apps_socket_flag_is_taken() {
        let a = |v: &[&str]| helper_args(&v.iter().map(OsString::from).collect::<Vec<_>>());
        let s = Ok(HelperArgs::Serve(PathBuf::from("/run/s.sock")));
        assert_eq!(a(&["-socket", "/run/s.sock"]), s);
        assert_eq!(a(&["--socket", "/run/s.sock"]), s);
        assert_eq!(a(&["-socket=/run/s.sock"]), s);
        assert_eq!(a(&["--socket=/run/s.sock"]), s);
        assert_eq!(
            a(&[
                "/usr/lib/claude-desktop/resources/cowork-vm-service.js",
                "-socket",
                "/run/s.sock"
            ]),
            s
        );
        assert_eq!(a(&["--help"]), Ok(HelperArgs::Help));
        assert!(a(&[]).is_err());
        assert!(a(&["-socket"]).is_err());
        assert!(a(&["-socket="]).is_err());
        assert!(a(&["-e", "process.exit(1)"]).is_err());
        assert!(a(&["install"]).is_err());
    }

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
