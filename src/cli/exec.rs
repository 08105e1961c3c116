//! `boxdesk exec` and `boxdesk shell`, and the exec session every command
//! that runs something shares: connect through `<name>.agent`, start one
//! exec, forward stdin (its own thread; its end at EOF), signals and window
//! sizes (a descriptor the main thread polls beside the socket,
//! [`super::signals`]), and stream the output as it comes until the exec
//! ends. The protocol is `boxdesk_sandbox::client`'s; the exit code is its
//! one mapping ([`Outcome::exit_code`]); this module is the terminal side.
//!
//! File frames that follow the end (the sandbox's `/results`) are not
//! waited for: `boxdesk cp NAME:/results/… DST` fetches them.
//!
//! A peer that stalls never holds a client: getting through (the connect,
//! the hybrid preamble, the handshake) takes at most [`CONNECT_TIMEOUT`],
//! then a message naming the sandbox and exit 125; until the command runs
//! no signal is blocked, so SIGTERM/SIGINT end the client at once; once
//! it runs they are forwarded, and an agent that answers nothing for
//! [`SIGNAL_GRACE`] after one is given up on (exit 125).
//!
//! This module must never buffer a command's output beyond one frame
//! (except in [`capture`], which is bounded), never block the main thread
//! on the agent without a limit, and never leave the terminal in raw mode.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use boxdesk_channel::{Exec, SecretBytes, Stream, AGENT_PORT};
use boxdesk_platform::{dirs, SandboxPaths};
use boxdesk_sandbox::client::{
    self, Captured, Connection, Control, Endpoint, Event, Input, Outcome, Output,
};
use boxdesk_sandbox::state::StateDir;
use nix::sys::signal::Signal;

use super::signals::Signals;
use super::{tty, ExecOpts, EXIT_BOXDESK};

/// The default working directory of an exec.
pub const DEFAULT_CWD: &str = "/work";
/// Stdin bytes per frame.
const STDIN_CHUNK: usize = 64 * 1024;
/// After a forwarded SIGINT, SIGTERM, SIGHUP or SIGQUIT, how long the
/// client waits for any word from the agent (output, Exit, anything)
/// before it takes the sandbox as stalled and ends (exit 125). A command
/// that keeps talking keeps its client; one that handles the signal in
/// silence this long ends with it (the agent kills the exec of a client
/// that is gone).
pub const SIGNAL_GRACE: Duration = Duration::from_secs(10);
/// How long a frame the agent has begun may take to arrive whole.
const FRAME_STALL: Duration = Duration::from_secs(10);
/// How soon a signal frame the writer was too busy for is tried again.
const RETRY_SEND: Duration = Duration::from_millis(20);

/// `boxdesk exec NAME [opts] -- CMD ARGS…`.
pub fn exec_named(name: &str, opts: &ExecOpts, command: &[OsString]) -> anyhow::Result<i32> {
    let (_, paths) = super::sandbox_paths(name)?;
    let exec = build_exec(opts, command)?;
    let session = connect(&paths, name)?;
    run_session(session, exec, opts.tty, name)
}

/// `boxdesk shell NAME`: `exec -t /bin/sh`.
pub fn shell(name: &str) -> anyhow::Result<i32> {
    let opts = ExecOpts {
        tty: true,
        timeout: None,
        cwd: None,
        env: Vec::new(),
    };
    exec_named(name, &opts, &["/bin/sh".into()])
}

/// Opens an AGCH session with sandbox `name`: the connect, the preamble
/// and the handshake together within [`client::CONNECT_TIMEOUT`], or a
/// clear error naming the sandbox.
///
/// Where the agent listens on a socket of its own in the sandbox's state
/// dir (a namespace sandbox's does: the helper bound it and the agent
/// inherited it), the session goes there and skips the helper's relay
/// through `<name>.agent` (about 0.2 ms of an exec). Everything else — a
/// VM, a socket nothing answers on any more — goes through `<name>.agent`,
/// which also says why a sandbox cannot be reached.
pub fn connect(paths: &SandboxPaths, name: &str) -> anyhow::Result<Connection> {
    if let Some(sock) = own_agent_socket(name) {
        match client::connect(&Endpoint::Unix(sock), name) {
            Ok(c) => return Ok(c),
            // Stale or refused: `<name>.agent` tells the user what is wrong.
            Err(client::AgentError::Connect(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let endpoint = Endpoint::Hybrid {
        path: paths.agent.clone(),
        port: AGENT_PORT,
    };
    client::connect(&endpoint, name).map_err(|e| match e {
        // Unwrapped, so the CLI can tell a dead sandbox by its
        // `NoSuchSandbox` (a transparent wrapper hides it from the chain).
        client::AgentError::Connect(e) => e.into(),
        e => e.into(),
    })
}

/// The agent's own socket of sandbox `name`, if its state dir has one and
/// the state root is ours and private (as the runtime dir must be): only
/// we can have put a socket there.
fn own_agent_socket(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let root = dirs::state_dir().ok()?;
    let meta = std::fs::metadata(&root).ok()?;
    if meta.uid() != boxdesk_platform::euid() || meta.mode() & 0o077 != 0 {
        return None;
    }
    let sock = StateDir::existing(&root, name)?.agent_sock();
    let meta = std::fs::symlink_metadata(&sock).ok()?;
    (meta.file_type().is_socket() && meta.uid() == boxdesk_platform::euid()).then_some(sock)
}

/// The Exec frame for `command` with `opts`.
pub fn build_exec(opts: &ExecOpts, command: &[OsString]) -> anyhow::Result<Exec> {
    let Some((cmd, args)) = command.split_first() else {
        bail!("no command given");
    };
    let mut exec = Exec::new(cmd.as_bytes(), args.iter().map(|a| a.as_bytes()));
    exec.cwd = opts.cwd.as_ref().map_or_else(
        || DEFAULT_CWD.as_bytes().to_vec(),
        |c| c.as_bytes().to_vec(),
    );
    for kv in &opts.env {
        exec.env.push(parse_env(kv)?);
    }
    if let Some(secs) = opts.timeout {
        exec.timeout_ms = timeout_ms(secs)?;
    }
    Ok(exec)
}

/// `K=V`, or a bare `K` taking the host's value.
fn parse_env(kv: &OsStr) -> anyhow::Result<(Vec<u8>, SecretBytes)> {
    let b = kv.as_bytes();
    let (k, v) = match b.iter().position(|&c| c == b'=') {
        Some(i) => (&b[..i], SecretBytes::copy_from(&b[i + 1..])),
        None => match std::env::var_os(kv) {
            Some(v) => (b, SecretBytes::new(v.into_vec())),
            None => bail!("-e {}: not set on the host", kv.to_string_lossy()),
        },
    };
    if k.is_empty() || k.contains(&0) {
        bail!("-e {}: bad variable name", String::from_utf8_lossy(k));
    }
    Ok((k.to_vec(), v))
}

/// Seconds (fractions allowed) as the protocol's milliseconds.
pub fn timeout_ms(secs: f64) -> anyhow::Result<u32> {
    if !secs.is_finite() || secs <= 0.0 {
        bail!("--timeout must be a positive number of seconds");
    }
    let ms = (secs * 1000.0).ceil();
    if ms > f64::from(u32::MAX) {
        bail!("--timeout is too large (at most {} s)", u32::MAX / 1000);
    }
    Ok(ms as u32)
}

type Writer = Arc<Mutex<Input>>;

fn send(w: &Writer, control: Control) -> Result<(), client::AgentError> {
    boxdesk_platform::sync::lock(w).send(control)
}

/// Runs one exec on `conn` with sandbox `name`, streaming it to this
/// process's stdio, and returns the exit code. The main thread waits on the
/// socket and the forwarded signals together; stdin is read by its own
/// thread (none when stdin is `/dev/null`: its EOF is sent at once). A
/// terminating signal the agent does not answer within [`SIGNAL_GRACE`]
/// ends the client, and so does a frame left half-sent for 10 s: the main
/// thread never blocks on the agent without a limit.
pub fn run_session(conn: Connection, exec: Exec, pty: bool, name: &str) -> anyhow::Result<i32> {
    run_session_as(conn, exec, pty, name, Relay::Client)
}

/// Whose exec a session relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relay {
    /// A user's client (`exec`, `run`): SIGINT, SIGTERM, SIGHUP and SIGQUIT
    /// forwarded, a third interrupt or an agent silent after one gives up.
    Client,
    /// A container's process (`boxdesk oci`): its monitor is the process
    /// engines signal, so every catchable terminating signal is forwarded
    /// and the relay lasts as long as the process, whatever it ignores.
    Container,
}

/// [`run_session`] for `relay`.
pub fn run_session_as(
    conn: Connection,
    exec: Exec,
    pty: bool,
    name: &str,
    relay: Relay,
) -> anyhow::Result<i32> {
    let signals = forwarded_for(relay);
    tty::block(&signals).context("blocking signals")?;
    let mut signals = Signals::new(&signals).context("watching signals")?;
    let size = pty.then(tty::window_size);
    let (mut output, input) = conn.exec(exec, size).context("sending the command")?;
    let raw = if pty { tty::RawMode::enter() } else { None };
    // Only reads of a frame already begun can wait (poll says when one
    // starts): the agent writes frames whole.
    output
        .stall_after(FRAME_STALL)
        .context("setting the read timeout")?;
    let writer: Writer = Arc::new(Mutex::new(input));

    if tty::stdin_is_dev_null() {
        send(&writer, Control::EndOfStdin).context("closing stdin")?;
    } else {
        let w = Arc::clone(&writer);
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || forward_stdin(&w))
            .context("starting the stdin thread")?;
    }

    let mut interrupts = 0;
    // Set by a forwarded terminating signal; cleared by any frame.
    let mut answer_by: Option<(Instant, Signal)> = None;
    // Signals and window sizes not written yet (the writer was busy).
    let mut unsent: VecDeque<Control> = VecDeque::new();
    let outcome = loop {
        if output.buffered() == 0 {
            send_pending(&writer, &mut unsent);
            let mut wait = answer_by.map(|(at, _)| at.saturating_duration_since(Instant::now()));
            if !unsent.is_empty() {
                wait = Some(wait.map_or(RETRY_SEND, |w| w.min(RETRY_SEND)));
            }
            let (sock_ready, sig_ready) = wait_readable(output.stream(), &signals, wait)?;
            if sig_ready {
                while let Some(sig) = signals.next() {
                    let Some(control) = signal_control(sig, pty, &mut interrupts, relay) else {
                        continue;
                    };
                    if relay == Relay::Client
                        && matches!(control, Control::Signal(_))
                        && answer_by.is_none()
                    {
                        answer_by = Some((Instant::now() + SIGNAL_GRACE, sig));
                    }
                    unsent.push_back(control);
                }
                send_pending(&writer, &mut unsent);
            }
            if !sock_ready {
                match answer_by {
                    Some((at, sig)) if Instant::now() >= at => {
                        tty::restore();
                        eprintln!(
                            "boxdesk: sandbox {name} did not answer within {} s of {sig}; giving up",
                            SIGNAL_GRACE.as_secs()
                        );
                        break EXIT_BOXDESK;
                    }
                    _ => continue,
                }
            }
        }
        answer_by = None;
        match next_output(&mut output) {
            Ok(Some(code)) => break code,
            Ok(None) => {}
            Err(e) => {
                tty::restore();
                return Err(e);
            }
        }
    };
    drop(raw);
    Ok(outcome)
}

/// The signals a session of `relay` forwards.
pub fn forwarded_for(relay: Relay) -> nix::sys::signal::SigSet {
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut set = tty::forwarded_signals();
    #[cfg(target_os = "linux")]
    if relay == Relay::Container {
        for s in tty::CONTAINER_SIGNALS {
            set.add(*s);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = relay;
    set
}

/// Polls the session socket and the signals, at most `wait` (`None`: no
/// limit); which are readable.
fn wait_readable(
    sock: &Stream,
    signals: &Signals,
    wait: Option<Duration>,
) -> anyhow::Result<(bool, bool)> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let timeout = match wait {
        None => PollTimeout::NONE,
        // Rounded up, so a wait never ends just before its deadline.
        Some(d) => PollTimeout::try_from(d.as_millis().saturating_add(1).min(60_000) as u32)
            .unwrap_or(PollTimeout::MAX),
    };
    loop {
        let mut fds = [
            PollFd::new(sock.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(_) => {
                let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
                return Ok((ready(&fds[0]), ready(&fds[1])));
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e).context("poll"),
        }
    }
}

fn forward_stdin(w: &Writer) {
    let mut buf = vec![0u8; STDIN_CHUNK];
    let mut stdin = io::stdin().lock();
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if send(w, Control::Stdin(SecretBytes::copy_from(&buf[..n]))).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf.iter_mut().for_each(|b| *b = 0);
    let _ = send(w, Control::EndOfStdin);
}

/// SIGWINCH becomes a Resize (PTY only; `None` otherwise); the others
/// become signals for the command's process group. A client's third
/// interrupt gives up on the agent and exits at once.
fn signal_control(sig: Signal, pty: bool, interrupts: &mut u32, relay: Relay) -> Option<Control> {
    match sig {
        Signal::SIGWINCH if pty => Some(Control::Resize(tty::window_size())),
        Signal::SIGWINCH => None,
        // A container's init alone, as an engine's `kill` means it.
        other if relay == Relay::Container => Some(Control::Signal(-(other as i32))),
        other => {
            *interrupts += 1;
            if *interrupts >= 3 {
                tty::restore();
                std::process::exit(128 + other as i32);
            }
            Some(Control::Signal(other as i32))
        }
    }
}

/// Writes what `unsent` holds, in order, as far as that is possible
/// without waiting: never while the stdin thread holds the writer (it may
/// be blocked on a peer that does not read), never into a full socket.
fn send_pending(w: &Writer, unsent: &mut VecDeque<Control>) {
    if unsent.is_empty() {
        return;
    }
    let Ok(mut w) = w.try_lock() else {
        return;
    };
    while !unsent.is_empty() {
        if !writable_now(w.stream()) {
            return;
        }
        // A failed write will not succeed later: it is dropped, and the
        // session's end shows on the read side.
        if let Some(control) = unsent.pop_front() {
            let _ = w.send(control);
        }
    }
}

/// Whether a small frame can be written without waiting: a Unix socket
/// polls writable only while at most a quarter of its buffer is in use.
fn writable_now(sock: &Stream) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLOUT)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLOUT))
}

/// Handles one event of output; `Some(code)` once the exec is over.
fn next_output(output: &mut Output) -> anyhow::Result<Option<i32>> {
    Ok(match output.next_event()? {
        Event::Stdout(data) => {
            let mut out = io::stdout().lock();
            if let Err(e) = out.write_all(&data).and_then(|()| out.flush()) {
                if e.kind() == io::ErrorKind::BrokenPipe {
                    // As a shell would report a pipeline member killed by SIGPIPE.
                    return Ok(Some(Outcome::Signaled(libc::SIGPIPE).exit_code()));
                }
                return Err(e).context("writing stdout");
            }
            None
        }
        Event::Stderr(data) => {
            let mut err = io::stderr().lock();
            let _ = err.write_all(&data).and_then(|()| err.flush());
            None
        }
        Event::Error(msg) => {
            tty::restore();
            eprintln!("boxdesk: {msg}");
            None
        }
        Event::Ended(outcome) => {
            if outcome == Outcome::TimedOut {
                tty::restore();
                eprintln!("boxdesk: the command timed out and was killed");
            }
            Some(outcome.exit_code())
        }
    })
}

/// Runs `argv` in sandbox `name` with no stdin, cwd `/`, and collects its
/// output (bounded: [`client::CAPTURE_STDOUT_MAX`]).
pub fn capture(paths: &SandboxPaths, name: &str, argv: &[&[u8]]) -> anyhow::Result<Captured> {
    let (cmd, args) = argv.split_first().context("empty argv")?;
    let mut exec = Exec::new(*cmd, args.iter().copied());
    exec.cwd = b"/".to_vec();
    Ok(connect(paths, name)?.capture(exec)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_positive_and_rounded_up_to_milliseconds() {
        assert_eq!(timeout_ms(0.5).unwrap(), 500);
        assert_eq!(timeout_ms(0.0001).unwrap(), 1);
        assert!(timeout_ms(0.0).is_err());
        assert!(timeout_ms(f64::NAN).is_err());
        assert!(timeout_ms(1e12).is_err());
    }

    #[test]
    fn env_takes_k_equals_v_and_refuses_an_empty_name() {
        let (k, v) = parse_env(OsStr::new("A=b=c")).unwrap();
        assert_eq!((k.as_slice(), v.as_slice()), (&b"A"[..], &b"b=c"[..]));
        assert!(parse_env(OsStr::new("=x")).is_err());
    }
}
