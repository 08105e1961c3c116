//! The command line: clap definitions, logging set-up, and exit codes (an
//! exec's are `boxdesk_sandbox::client::status`'s one mapping: the
//! command's own status; 128+N for a signal; 124 for `--timeout`; 125 when
//! boxdesk itself failed; 126/127 as a shell).
//!
//! This module owns argument parsing and exit codes. It must never hold
//! sandbox logic: each sub-command is a thin module over the library.

#[cfg(target_os = "linux")]
mod apparmor;
mod bench;
mod cowork;
mod cp;
mod doctor;
mod exec;
mod images;
pub(crate) mod ls;
#[cfg(target_os = "linux")]
pub mod oci;
mod run;
mod screenshot;
mod signals;
mod tty;
mod view;

use std::ffi::OsString;
use std::path::PathBuf;

use crate::backend::Backend;
use crate::helper::{self, HelperOptions};
use anyhow::{bail, Context as _};
use boxdesk_platform::{dirs, SandboxPaths};
use clap::{Args, Parser, Subcommand};

/// Exit code when boxdesk itself failed (the client's one mapping,
/// `boxdesk_sandbox::client::status`).
pub use boxdesk_sandbox::client::EXIT_BOXDESK;

/// boxdesk: run commands in sandboxes.
///
/// Backends: kvm (Linux) and hvf (macOS, Apple silicon) boot a microVM; the
/// namespace backend (bubblewrap: user, mount, pid, uts, ipc and net
/// namespaces, no capabilities, a seccomp filter, cgroup limits) runs where
/// no VM can; `boxdesk doctor` says which `auto` picks here. Exit codes: the command's own status, 128+N when it was
/// killed by signal N, 124 when --timeout expired, 125 when boxdesk itself
/// failed, 126/127 as a shell when the command cannot run / is not found.
#[derive(Debug, Parser)]
#[command(
    name = "boxdesk",
    version,
    long_version = env!("BOXDESK_LONG_VERSION"),
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a sandbox: run CMD in it and tear it down, open a shell, or
    /// leave it running (--detach).
    Run(RunArgs),
    /// Run a command in a running sandbox.
    Exec(ExecArgs),
    /// Open an interactive shell in a running sandbox (exec -t /bin/sh).
    Shell {
        /// The sandbox.
        name: String,
    },
    /// Copy files between the host and a sandbox: `cp SRC NAME:PATH` or
    /// `cp NAME:PATH DST`.
    Cp(CpArgs),
    /// List sandboxes: running ones, and dead ones (their helper gone)
    /// as `dead`, whose stale sockets are removed.
    Ls {
        /// Print a JSON array of objects instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Stop a sandbox; returns once its helper has exited (at most 10 s,
    /// then it is killed).
    Stop {
        /// The sandbox.
        name: String,
    },
    /// Print a sandbox's `info` lines.
    Info {
        /// The sandbox.
        name: String,
    },
    /// Save a sandbox's display (`run --display`) as an 8-bit RGB PNG:
    /// its newest frame. Takes the display's lease, so an open `view`
    /// window closes.
    Screenshot {
        /// The sandbox.
        name: String,
        /// The PNG to write (`-`: standard output).
        out: PathBuf,
        /// Fail when the sandbox has drawn no frame within SECS seconds.
        #[arg(long, value_name = "SECS", default_value_t = 10.0)]
        timeout: f64,
    },
    /// Open a window showing a sandbox's display (`run --display`) live;
    /// keyboard and mouse in it go to the sandbox.
    View {
        /// The sandbox.
        name: String,
    },
    /// Say which backends can run here, and why not.
    Doctor,
    /// The guest images the VM backends boot: `images fetch` downloads
    /// this release's and installs it; `images ls`, `images path` say
    /// which each arch would boot.
    #[command(subcommand)]
    Images(images::ImagesCmd),
    /// boxdesk's AppArmor profile (Linux): where AppArmor restricts user
    /// namespaces (Ubuntu 23.10 and later), `sudo boxdesk apparmor
    /// install` lets boxdesk and the bwrap it starts make them.
    #[cfg(target_os = "linux")]
    #[command(subcommand, name = "apparmor")]
    AppArmor(apparmor::AppArmorCmd),
    /// Measure: `bench boot` starts sandboxes running `true` and prints
    /// the time to agent ready and the helper's memory.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// Run boxdesk as an OCI runtime (runc's command line), for podman and
    /// containerd: `boxdesk oci --help`. Also as `boxdesk-oci`.
    #[cfg(target_os = "linux")]
    #[command(disable_help_flag = true)]
    Oci {
        /// The runtime's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// The Claude Desktop app's Cowork helper (Linux): serve its protocol
    /// on SOCKET (the app runs `HELPER -socket PATH`), put boxdesk in the
    /// place of the app's helper (install, uninstall, status), or explain
    /// the app's support gate (doctor).
    Cowork(cowork::CoworkArgs),
    /// The per-sandbox helper process (internal).
    #[command(name = "__vmm", hide = true)]
    Vmm(VmmArgs),
}

/// `boxdesk bench` measurements.
#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// Boot to agent ready, and the helper's RSS, over several sandboxes.
    Boot(bench::BootArgs),
}

/// Options shared by `run` and `exec` for the command they run.
#[derive(Debug, Clone, Args)]
pub struct ExecOpts {
    /// Run the command on a pseudo-terminal (raw mode, window size follows).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Kill the command after SECS seconds (exit code 124).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Working directory inside the sandbox [default: /work].
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<OsString>,
    /// Set an environment variable (K=V; a bare K takes the host's value).
    #[arg(short = 'e', long = "env", value_name = "K=V")]
    pub env: Vec<OsString>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Sandbox name [default: a free generated bx-XXXX].
    #[arg(long)]
    name: Option<String>,
    /// auto, kvm, hvf or namespace [default: $BOXDESK_BACKEND, else auto].
    #[arg(long)]
    backend: Option<String>,
    /// vCPUs of a VM [default: 1]; a namespace sandbox's CPU quota
    /// (cgroups; refused where they cannot hold it) [default: none].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    cpus: Option<u32>,
    /// Memory in MiB: a VM's RAM [default: 512]; a namespace sandbox's
    /// memory limit, swap included (cgroups; refused where they cannot hold
    /// it) [default: half the host's RAM where they can].
    #[arg(long, value_name = "MiB", value_parser = clap::value_parser!(u32).range(16..))]
    mem: Option<u32>,
    /// Most processes and threads a namespace sandbox may hold at once.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(16..=4_194_304))]
    pids: u64,
    /// Size of a namespace sandbox's /tmp (and /dev/shm): bytes, or with K, M or G.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    tmp: u64,
    /// Run over the state dir (/work, /root, /results) an earlier sandbox of
    /// this name left behind, instead of refusing.
    #[arg(long)]
    reuse: bool,
    /// Share the host's network (default: none, only a private loopback).
    #[arg(long)]
    net: bool,
    /// Keep the sandbox's state dir and log after it stops.
    #[arg(long)]
    keep: bool,
    /// Leave the sandbox running in the background and print its name.
    #[arg(long, short = 'd', conflicts_with = "command")]
    detach: bool,
    /// VMs: the guest kernel (x86_64: vmlinux or bzImage; arm64: Image)
    /// [default: the installed image].
    #[arg(long, value_name = "FILE")]
    kernel: Option<PathBuf>,
    /// VMs: the initramfs [default: the installed image].
    #[arg(long, value_name = "FILE")]
    initrd: Option<PathBuf>,
    /// VMs: attach IMG (ext4 or squashfs) as the guest's root file system, read-only.
    #[arg(long, value_name = "IMG")]
    rootfs: Option<PathBuf>,
    /// VMs: make --rootfs writable.
    #[arg(long, requires = "rootfs")]
    rootfs_rw: bool,
    /// Share a host directory (or, namespace only, a file) at GUEST
    /// [default: the same path], read-write unless :ro. Repeatable.
    #[arg(long, value_name = "HOST[:GUEST][:ro]")]
    share: Vec<String>,
    /// `host`: the guest's /usr, /etc, /bin, /sbin, /lib* are the host's,
    /// read-only (VMs: over virtio-fs; the namespace backend's default).
    #[arg(long, value_name = "host", value_parser = ["host"], conflicts_with = "rootfs")]
    root: Option<String>,
    /// kvm/hvf: give the VM a display of WxH (virtio-gpu, keyboard, tablet):
    /// `boxdesk view` and `boxdesk screenshot` show it.
    #[arg(long, value_name = "WxH", num_args = 0..=1, default_missing_value = "1280x800", value_parser = parse_display)]
    display: Option<(u32, u32)>,
    #[command(flatten)]
    exec: ExecOpts,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct ExecArgs {
    /// The sandbox.
    name: String,
    #[command(flatten)]
    exec: ExecOpts,
    /// The command and its arguments (after `--`).
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct CpArgs {
    /// Copy directories recursively.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// A host path or NAME:PATH.
    src: OsString,
    /// A host path or NAME:PATH.
    dst: OsString,
}

#[derive(Debug, Args)]
struct VmmArgs {
    #[arg(long)]
    name: String,
    #[arg(long, default_value = "namespace")]
    backend: String,
    #[arg(long)]
    cpus: Option<u32>,
    #[arg(long)]
    mem: Option<u32>,
    #[arg(long)]
    net: bool,
    #[arg(long)]
    keep: bool,
    #[arg(long)]
    reuse: bool,
    #[arg(long, default_value_t = boxdesk_sandbox::DEFAULT_PIDS)]
    pids: u64,
    #[arg(long, default_value_t = boxdesk_sandbox::DEFAULT_TMP_BYTES)]
    tmp: u64,
    #[arg(long)]
    kernel: Option<PathBuf>,
    #[arg(long)]
    initrd: Option<PathBuf>,
    #[arg(long)]
    rootfs: Option<PathBuf>,
    #[arg(long)]
    rootfs_rw: bool,
    /// A share, as `share_arg::to_helper` writes it.
    #[arg(long)]
    share: Vec<String>,
    #[arg(long)]
    root_host: bool,
    #[arg(long, value_parser = parse_display)]
    display: Option<(u32, u32)>,
    /// A descriptor to write one byte to once ready.
    #[arg(long)]
    ready_fd: Option<i32>,
    /// Started by a foreground `run`: log only warnings.
    #[arg(long)]
    foreground: bool,
}

/// `boxdesk run`: its flags checked and handed on.
fn run_args(a: RunArgs) -> anyhow::Result<i32> {
    run::run(run::RunRequest {
        name: a.name,
        backend: a.backend,
        cpus: a.cpus,
        mem_mib: a.mem,
        net: a.net,
        keep: a.keep,
        reuse: a.reuse,
        pids: a.pids,
        tmp_bytes: a.tmp,
        detach: a.detach,
        vm: run::VmFlags {
            kernel: a.kernel,
            initrd: a.initrd,
            rootfs: a.rootfs,
            rootfs_rw: a.rootfs_rw,
            display: a.display,
        },
        shares: boxdesk_sandbox::share_arg::parse_all(
            &a.share,
            &std::env::current_dir().context("the current directory")?,
        )?,
        root_host: a.root.is_some(),
        exec: a.exec,
        command: a.command,
    })
}

/// `1280x800`: a display's width and height, each within what a screen
/// may have.
fn parse_display(s: &str) -> Result<(u32, u32), String> {
    use boxdesk_platform::screen::{MAX_SIDE, MIN_SIDE};
    let bad = || format!("{s:?} is not a display size (e.g. 1280x800)");
    let (w, h) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h): (u32, u32) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    let ok = |v: u32| (MIN_SIDE..=MAX_SIDE).contains(&v);
    if !ok(w) || !ok(h) {
        return Err(format!(
            "{s:?}: each side must be {MIN_SIDE} to {MAX_SIDE} pixels"
        ));
    }
    Ok((w, h))
}

/// `256M`, `1G`, `512k`, `4096`: a size in bytes (K, M, G are powers of
/// 1024; an optional `i`/`B` after them is accepted), at least 1 MiB.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix(['B', 'b']).unwrap_or(t);
    let t = t.strip_suffix('i').unwrap_or(t);
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 256M, 1G)"))?;
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))?;
    if bytes < 1 << 20 {
        return Err(format!("{s:?} is under 1M"));
    }
    Ok(bytes)
}

/// boxdesk started as `cowork-linux-helper` (the app's helper's name):
/// `-socket PATH` and nothing else; returns the exit code.
pub fn as_cowork_helper() -> i32 {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    cowork::as_helper(&args)
}

/// Whether boxdesk was started under the cowork helper's name.
pub fn started_as_cowork_helper(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .is_some_and(|n| n == cowork::HELPER_NAME)
}

/// Parses the arguments, runs the command and returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse_from(cowork::rewrite_single_dash(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => 0,
                _ => EXIT_BOXDESK,
            };
        }
    };
    if let Cmd::Cowork(a) = cli.cmd {
        return cowork::run(a);
    }
    #[cfg(target_os = "linux")]
    if let Cmd::Oci { args } = cli.cmd {
        return oci::main(args);
    }
    let detached_helper = matches!(&cli.cmd, Cmd::Vmm(a) if !a.foreground);
    init_logging(detached_helper);
    let outcome = match cli.cmd {
        Cmd::Run(a) => run_args(a),
        Cmd::Exec(a) => exec::exec_named(&a.name, &a.exec, &a.command),
        Cmd::Shell { name } => exec::shell(&name),
        Cmd::Cp(a) => cp::cp(&a.src, &a.dst, a.recursive),
        Cmd::Ls { json } => ls::ls(json),
        Cmd::Stop { name } => ls::stop(&name),
        Cmd::Info { name } => ls::info(&name),
        Cmd::Screenshot { name, out, timeout } => screenshot::screenshot(&name, &out, timeout),
        Cmd::View { name } => view::view(&name),
        Cmd::Doctor => doctor::doctor(),
        Cmd::Images(c) => images::images(c),
        #[cfg(target_os = "linux")]
        Cmd::AppArmor(c) => apparmor::run(&c),
        Cmd::Bench(BenchCmd::Boot(a)) => bench::boot(a),
        Cmd::Vmm(a) => vmm(a),
        Cmd::Cowork(_) => unreachable!("handled above"),
        #[cfg(target_os = "linux")]
        Cmd::Oci { .. } => unreachable!("handled above"),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            // A name nothing answers for may be a dead sandbox: say so,
            // and what to do about it.
            let dead = e.chain().find_map(|c| match c.downcast_ref() {
                Some(boxdesk_sandbox::control::ClientError::NoSuchSandbox(name)) => {
                    Some(name.clone())
                }
                _ => None,
            });
            let e = match dead {
                Some(name) => ls::not_running(&name, &e),
                None => e,
            };
            eprintln!("boxdesk: {e:#}");
            EXIT_BOXDESK
        }
    }
}

/// `RUST_LOG` when set; otherwise warnings, and info for a detached
/// helper. Logs go to stderr (a detached helper's stderr is its log).
pub(crate) fn init_logging(verbose: bool) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::EnvFilter;
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    let default = if verbose {
        LevelFilter::INFO
    } else {
        LevelFilter::WARN
    };
    // Without RUST_LOG, a plain level: no filter to parse on every exec.
    let _ = match std::env::var_os("RUST_LOG") {
        Some(_) => builder
            .with_env_filter(
                EnvFilter::builder()
                    .with_default_directive(default.into())
                    .from_env_lossy(),
            )
            .try_init()
            .is_ok(),
        None => builder
            .with_max_level(default)
            .finish()
            .with(quiet_dependencies())
            .try_init()
            .is_ok(),
    };
}

/// Passes everything but the chatter of crates we use: fuse-backend-rs
/// logs every FUSE `INIT` (a dozen lines per VM) at info.
pub(crate) fn quiet_dependencies() -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::LevelFilter;
    tracing_subscriber::filter::Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_target("fuse_backend_rs", LevelFilter::WARN)
}

/// Raises a server's open-file soft limit to the hard limit (`__vmm` and
/// `cowork`), so a burst of connections meets the servers' own cap and
/// its clear refusal before `EMFILE`; says so in the log.
pub fn raise_nofile() {
    log_nofile(boxdesk_platform::limits::raise_nofile());
}

fn log_nofile(
    raised: Result<boxdesk_platform::limits::Nofile, boxdesk_platform::limits::LimitError>,
) {
    match raised {
        Ok(n) if n.now != n.before => {
            tracing::info!("open-file limit raised from {} to {}", n.before, n.now)
        }
        Ok(_) => {}
        Err(e) => tracing::warn!("{e}; a burst of connections may run out of descriptors"),
    }
}

fn vmm(a: VmmArgs) -> anyhow::Result<i32> {
    abort_on_panic();
    boxdesk_sandbox::conn::few_malloc_arenas();
    let backend: Backend = a.backend.parse()?;
    let backend = backend.resolve()?;
    // A VM's virtio-fs server holds a descriptor per cached guest inode.
    if backend.is_vm() && (a.root_host || !a.share.is_empty()) {
        log_nofile(boxdesk_platform::limits::raise_nofile_for_files());
    } else {
        raise_nofile();
    }
    let foreground = a.foreground;
    let ready = match a.ready_fd {
        Some(fd) => Some(tty::adopt_fd(fd).context("--ready-fd")?),
        None => None,
    };
    let opts = HelperOptions {
        name: a.name,
        cpus: a.cpus,
        mem_mib: a.mem,
        net: a.net,
        keep: a.keep,
        reuse: a.reuse,
        pids: a.pids,
        tmp_bytes: a.tmp,
        ready,
        shares: a
            .share
            .iter()
            .map(|s| boxdesk_sandbox::share_arg::from_helper(s))
            .collect::<Result<_, _>>()?,
        root_host: a.root_host,
        vm: backend.is_vm().then(|| helper::VmOptions {
            kernel: a.kernel,
            initrd: a.initrd,
            rootfs: a.rootfs.map(|r| (r, a.rootfs_rw)),
            display: a.display,
            etc: None,
        }),
    };
    match helper::run(opts) {
        Ok(never) => match never {},
        // A foreground helper's stderr is the user's terminal: say it
        // plainly; a detached one's is its log.
        Err(e) if foreground => {
            eprintln!("boxdesk: {}", boxdesk_platform::report::chain(&e));
            Ok(1)
        }
        Err(e) => {
            tracing::error!("{}", boxdesk_platform::report::chain(&e));
            Ok(1)
        }
    }
}

/// Makes a panic on any thread of the helper end the process, after the
/// usual report (to its log): what release builds do (`panic = "abort"`),
/// in every build. A test build's device thread that panicked would
/// otherwise die alone, and the guest wait forever for the request it held.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}

/// The runtime dir and the paths of sandbox `name`, refusing a bad name or
/// an unsafe runtime dir.
pub fn sandbox_paths(name: &str) -> anyhow::Result<(PathBuf, SandboxPaths)> {
    let dir = dirs::runtime_dir()?;
    let paths = SandboxPaths::new(&dir, name)?;
    Ok((dir, paths))
}

/// Refuses a backend that cannot run; `None` means `$BOXDESK_BACKEND` or
/// auto.
pub fn chosen_backend(flag: Option<&str>) -> anyhow::Result<Backend> {
    let word = match flag {
        Some(w) => w.to_owned(),
        None => match std::env::var("BOXDESK_BACKEND") {
            Ok(w) if !w.is_empty() => w,
            Ok(_) | Err(std::env::VarError::NotPresent) => "auto".to_owned(),
            Err(std::env::VarError::NotUnicode(_)) => bail!("BOXDESK_BACKEND is not UTF-8"),
        },
    };
    let backend: Backend = word.parse()?;
    Ok(backend.resolve()?)
}
