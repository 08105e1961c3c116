//! The command line, parsed by hand (no clap: the static guest binary stays
//! small): `[--listen vsock:PORT | unix:PATH | fd:N] [--root DIR]
//! [--results DIR] [--pids-max N]`.
//!
//! Owns turning arguments into a [`Config`] and the defaults (PID 1 →
//! `vsock:1024`; root `/`; results `/results`; no task limit). It must
//! never touch the system beyond asking for its own pid: no binding, no
//! mounting, no checking of an inherited descriptor (that is `listen`'s).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use boxdesk_channel::AGENT_PORT;

/// The usage line printed with every argument error and for `--help`.
pub const USAGE: &str = "usage: boxdesk-guest-agent \
                         [--listen vsock:PORT | --listen unix:PATH | --listen fd:N] \
                         [--root DIR] [--results DIR] [--pids-max N] [--peer-uid UID] [--scope host]";

/// Where the agent listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// AF_VSOCK on this port, any CID (the VM backends).
    Vsock(u32),
    /// A Unix stream socket at this path (tests, and hosts that trust
    /// everything inside the sandbox not to touch the path).
    Unix(PathBuf),
    /// An inherited Unix stream socket, already bound and listening, on
    /// this descriptor (the namespace backend: the helper binds it outside
    /// the sandbox, so nothing inside can rename or replace the path).
    Fd(i32),
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Vsock(port) => write!(f, "vsock:{port}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
            Listen::Fd(fd) => write!(f, "fd:{fd}"),
        }
    }
}

impl Listen {
    /// Parses `vsock:PORT`, `unix:PATH` or `fd:N`.
    pub fn parse(s: &OsStr) -> Result<Self, CliError> {
        let b = s.as_bytes();
        if let Some(port) = b.strip_prefix(b"vsock:") {
            let port = std::str::from_utf8(port)
                .ok()
                .and_then(|p| p.parse::<u32>().ok())
                .ok_or_else(|| {
                    usage(format!(
                        "bad vsock port in --listen {}",
                        s.to_string_lossy()
                    ))
                })?;
            return Ok(Listen::Vsock(port));
        }
        if let Some(path) = b.strip_prefix(b"unix:") {
            if path.is_empty() {
                return Err(usage("--listen unix: needs a path".into()));
            }
            return Ok(Listen::Unix(PathBuf::from(OsStr::from_bytes(path))));
        }
        if let Some(fd) = b.strip_prefix(b"fd:") {
            let fd = std::str::from_utf8(fd)
                .ok()
                .and_then(|n| n.parse::<i32>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    usage(format!(
                        "bad descriptor number in --listen {}",
                        s.to_string_lossy()
                    ))
                })?;
            return Ok(Listen::Fd(fd));
        }
        Err(usage(format!(
            "--listen takes vsock:PORT, unix:PATH or fd:N, not {}",
            s.to_string_lossy()
        )))
    }
}

/// What [`crate::run`] serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The listening socket.
    pub listen: Listen,
    /// PutFile/GetFile paths resolve beneath this directory.
    pub root: PathBuf,
    /// After each exec, the regular files under this directory go back to
    /// the host as File frames.
    pub results: PathBuf,
    /// `RLIMIT_NPROC` (soft and hard) set at start, if given: see
    /// `limits::limit_tasks` for what it counts.
    pub pids_max: Option<u64>,
    /// The host uid that runs the sandbox, if given: a Unix peer of any
    /// other is refused (`listen::Listener::only_peer`).
    pub peer_uid: Option<u32>,
    /// `--scope host`: the sandbox shares the host's kernel, so the agent
    /// enters a Landlock domain scoping signals and abstract Unix sockets
    /// (where the kernel has scopes): nothing in the sandbox reaches a host
    /// process or a host abstract socket (X11's, D-Bus's) even on the
    /// host's network.
    pub scope_host: bool,
}

/// Why the arguments were refused.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `--help` or `-h` was given: print [`USAGE`] and exit 0.
    #[error("{USAGE}")]
    Help,
    /// The arguments are wrong; the message ends with the usage line.
    #[error("{0}\n{USAGE}")]
    Usage(String),
}

fn usage(msg: String) -> CliError {
    CliError::Usage(msg)
}

/// Parses the arguments that follow the program name (for an embedding
/// binary: those after its sub-command word). Without `--listen`, PID 1
/// listens on `vsock:1024`; any other process gets a usage error.
pub fn parse_args(args: impl Iterator<Item = OsString>) -> Result<Config, CliError> {
    parse_args_as(args, nix::unistd::getpid().as_raw() == 1)
}

fn parse_args_as(
    mut args: impl Iterator<Item = OsString>,
    is_pid1: bool,
) -> Result<Config, CliError> {
    let mut listen = None;
    let mut root = None;
    let mut results = None;
    let mut pids_max = None;
    let mut peer_uid = None;
    let mut scope = None;
    while let Some(arg) = args.next() {
        let bytes = arg.as_bytes();
        if bytes == b"--help" || bytes == b"-h" {
            return Err(CliError::Help);
        }
        let (name, inline) = match bytes.iter().position(|&c| c == b'=') {
            Some(i) if bytes.starts_with(b"--") => (
                &bytes[..i],
                Some(OsStr::from_bytes(&bytes[i + 1..]).to_os_string()),
            ),
            _ => (bytes, None),
        };
        let name = String::from_utf8_lossy(name).into_owned();
        let slot = match name.as_str() {
            "--listen" => &mut listen,
            "--root" => &mut root,
            "--results" => &mut results,
            "--pids-max" => &mut pids_max,
            "--peer-uid" => &mut peer_uid,
            "--scope" => &mut scope,
            _ => return Err(usage(format!("unknown argument {name}"))),
        };
        let value = match inline.or_else(|| args.next()) {
            Some(v) if !v.is_empty() => v,
            _ => return Err(usage(format!("{name} needs a value"))),
        };
        if slot.replace(value).is_some() {
            return Err(usage(format!("{name} given twice")));
        }
    }
    let listen = match listen {
        Some(l) => Listen::parse(&l)?,
        None if is_pid1 => Listen::Vsock(AGENT_PORT),
        None => {
            return Err(usage(
                "--listen is required when not running as PID 1".into(),
            ))
        }
    };
    let pids_max = match pids_max {
        None => None,
        Some(n) => Some(
            n.to_str()
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    usage(format!(
                        "--pids-max takes a positive number, not {}",
                        n.to_string_lossy()
                    ))
                })?,
        ),
    };
    let peer_uid = match peer_uid {
        None => None,
        Some(n) => Some(
            n.to_str()
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or_else(|| {
                    usage(format!(
                        "--peer-uid takes a uid, not {}",
                        n.to_string_lossy()
                    ))
                })?,
        ),
    };
    let scope_host = match scope {
        None => false,
        Some(s) if s == "host" => true,
        Some(s) => {
            return Err(usage(format!(
                "--scope takes host, not {}",
                s.to_string_lossy()
            )))
        }
    };
    Ok(Config {
        listen,
        root: root.map_or_else(|| PathBuf::from("/"), PathBuf::from),
        results: results.map_or_else(|| PathBuf::from("/results"), PathBuf::from),
        pids_max,
        peer_uid,
        scope_host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], pid1: bool) -> Result<Config, CliError> {
        parse_args_as(args.iter().map(OsString::from), pid1)
    }

    #[test]
    fn pid_1_without_arguments_listens_on_vsock_1024_with_the_default_dirs() {
        let c = parse(&[], true).unwrap();
        assert_eq!(c.listen, Listen::Vsock(1024));
        assert_eq!(c.root, PathBuf::from("/"));
        assert_eq!(c.results, PathBuf::from("/results"));
        assert_eq!(c.pids_max, None, "no task limit unless asked");
    }

    #[test]
    fn an_inherited_descriptor_and_a_task_limit_are_accepted() {
        let c = parse(&["--listen", "fd:3", "--pids-max=4096"], false).unwrap();
        assert_eq!(c.listen, Listen::Fd(3));
        assert_eq!(c.listen.to_string(), "fd:3");
        assert_eq!(c.pids_max, Some(4096));
        assert_eq!(c.peer_uid, None, "every peer unless asked");
    }

    #[test]
    fn scope_takes_host_and_nothing_else() {
        assert!(!parse(&["--listen", "fd:3"], false).unwrap().scope_host);
        let c = parse(&["--listen", "fd:3", "--scope", "host"], false).unwrap();
        assert!(c.scope_host);
        let e = parse(&["--listen", "fd:3", "--scope", "all"], false).unwrap_err();
        assert!(e.to_string().contains("--scope takes host"), "{e}");
    }

    #[test]
    fn a_peer_uid_is_a_uid_and_nothing_else() {
        let c = parse(&["--listen", "fd:3", "--peer-uid", "1000"], false).unwrap();
        assert_eq!(c.peer_uid, Some(1000));
        for bad in ["-1", "x", "4294967296"] {
            let e = parse(&["--listen", "fd:3", "--peer-uid", bad], false).unwrap_err();
            assert!(e.to_string().contains("--peer-uid takes a uid"), "{e}");
        }
    }

    #[test]
    fn a_process_that_is_not_pid_1_must_say_where_to_listen() {
        let err = parse(&[], false).unwrap_err();
        assert!(err.to_string().contains("--listen is required"), "{err}");
        assert!(err.to_string().contains("usage:"), "{err}");
    }

    #[test]
    fn both_listen_forms_and_both_value_styles_are_accepted() {
        let c = parse(
            &[
                "--listen",
                "unix:/tmp/a.sock",
                "--root=/r",
                "--results",
                "/x",
            ],
            false,
        )
        .unwrap();
        assert_eq!(c.listen, Listen::Unix("/tmp/a.sock".into()));
        assert_eq!(c.root, PathBuf::from("/r"));
        assert_eq!(c.results, PathBuf::from("/x"));
        let c = parse(&["--listen=vsock:77"], false).unwrap();
        assert_eq!(c.listen, Listen::Vsock(77));
        assert_eq!(c.listen.to_string(), "vsock:77");
    }

    #[test]
    fn unknown_missing_repeated_and_malformed_arguments_are_usage_errors() {
        for bad in [
            &["--listen", "tcp:1"][..],
            &["--listen", "vsock:x"],
            &["--listen", "unix:"],
            &["--listen", "fd:"],
            &["--listen", "fd:-1"],
            &["--listen", "fd:3x"],
            &["--listen", "vsock:1", "--pids-max", "0"],
            &["--listen", "vsock:1", "--pids-max", "-5"],
            &["--listen", "vsock:1", "--pids-max", "many"],
            &["--listen"],
            &["--root"],
            &["--frobnicate"],
            &["--root", "/a", "--root", "/b", "--listen", "vsock:1"],
        ] {
            assert!(
                matches!(parse(bad, false), Err(CliError::Usage(_))),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn help_is_its_own_outcome() {
        assert!(matches!(parse(&["-h"], false), Err(CliError::Help)));
        assert!(matches!(
            parse(&["--listen", "vsock:1", "--help"], false),
            Err(CliError::Help)
        ));
    }
}
