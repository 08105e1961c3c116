//! A VM's ways out that its owner controls: for each `boxdesk.relay=PORT`
//! on the kernel command line the agent listens on the guest's
//! `127.0.0.1:PORT` and carries every connection made there to the host
//! over vsock (CID 2, port `PORT`), where the VMM hands it to whatever its
//! owner listens with (cowork's egress proxy). A VM has no network device:
//! this is how a process inside reaches an HTTP(S) proxy outside.
//!
//! This module owns the listeners and one thread per relayed connection
//! (at most [`MAX_RELAYED`]). It never connects anywhere but the host's
//! vsock port of its listener and never looks at the bytes it carries.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, VsockAddr};

/// Connections relayed at once, per listener; past it a new one is closed.
pub const MAX_RELAYED: usize = 256;

/// Why a relay could not start.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// A `boxdesk.relay=` value that is not a port (1–65535).
    #[error("boxdesk.relay={0}: not a port")]
    Port(String),
    /// The loopback listener could not be made.
    #[error("listening on 127.0.0.1:{port}: {error}")]
    Listen {
        /// The port.
        port: u16,
        /// What the OS said.
        error: io::Error,
    },
}

/// The relay ports a command line asks for, in order, each once.
pub fn parse_cmdline(cmdline: &str) -> Result<Vec<u16>, RelayError> {
    let mut ports = Vec::new();
    for word in cmdline.split_ascii_whitespace() {
        let Some(value) = word.strip_prefix("boxdesk.relay=") else {
            continue;
        };
        let port = (value.bytes().all(|b| b.is_ascii_digit()) && !value.starts_with('0'))
            .then(|| value.parse::<u16>().ok())
            .flatten()
            .ok_or_else(|| RelayError::Port(value.to_owned()))?;
        if !ports.contains(&port) {
            ports.push(port);
        }
    }
    Ok(ports)
}

/// Starts the relays `/proc/cmdline` asks for; each failure is logged
/// (the agent serves anyway: only that way out is missing).
pub fn start_asked() {
    let cmdline = match std::fs::read_to_string("/proc/cmdline") {
        Ok(c) => c,
        Err(e) => return log!("relay: /proc/cmdline: {e}"),
    };
    let ports = match parse_cmdline(&cmdline) {
        Ok(p) => p,
        Err(e) => return log!("relay: {e}"),
    };
    for port in ports {
        if let Err(e) = start(port, connect_host) {
            log!("relay: {e}");
        }
    }
}

/// Listens on `127.0.0.1:port` and relays each connection to what
/// `connect(port)` opens, on a thread of its own.
fn start(port: u16, connect: fn(u16) -> io::Result<OwnedFd>) -> Result<u16, RelayError> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|error| RelayError::Listen { port, error })?;
    let bound = listener.local_addr().map(|a| a.port()).unwrap_or(port);
    let live = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name(format!("relay-{port}"))
        .spawn(move || accept_loop(&listener, port, connect, &live))
        .map_err(|error| RelayError::Listen { port, error })?;
    Ok(bound)
}

fn accept_loop(
    listener: &TcpListener,
    port: u16,
    connect: fn(u16) -> io::Result<OwnedFd>,
    live: &Arc<AtomicUsize>,
) {
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        if live.fetch_add(1, Ordering::SeqCst) >= MAX_RELAYED {
            live.fetch_sub(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let held = live.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("relay-{port}-conn"))
            .spawn(move || {
                match connect(port) {
                    Ok(host) => carry(client, host),
                    Err(e) => log!("relay: host port {port}: {e}"),
                }
                held.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A vsock stream to the host's `port`.
fn connect_host(port: u16) -> io::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &VsockAddr::new(libc::VMADDR_CID_HOST, port.into()),
    )?;
    Ok(fd)
}

/// Carries bytes both ways until both directions have ended; an end of
/// one direction is passed on as a half-close.
fn carry(client: TcpStream, host: OwnedFd) {
    let host = std::fs::File::from(host);
    let (Ok(client_rx), Ok(host_rx)) = (client.try_clone(), host.try_clone()) else {
        return;
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            pump(client_rx, &host);
            let _ = socket::shutdown(
                std::os::fd::AsRawFd::as_raw_fd(&host.as_fd()),
                socket::Shutdown::Write,
            );
        });
        pump(host_rx, &client);
        let _ = client.shutdown(Shutdown::Write);
    });
}

/// Copies `from` into `to` until `from` ends or either side fails.
fn pump(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn relay_ports_are_read_in_order_once_each_and_a_bad_one_is_refused() {
        let c = "console=ttyS0 boxdesk.relay=3128 quiet boxdesk.relay=80 boxdesk.relay=3128";
        assert_eq!(parse_cmdline(c).unwrap(), vec![3128, 80]);
        assert!(parse_cmdline("quiet").unwrap().is_empty());
        for bad in ["0", "65536", "-1", "+80", "080", "", "80a"] {
            let e = parse_cmdline(&format!("boxdesk.relay={bad}")).unwrap_err();
            assert_eq!(e.to_string(), format!("boxdesk.relay={bad}: not a port"));
        }
    }

    /// The host side of the test relay: one end of a socket pair per
    /// connection, the other end echoing upper-cased bytes, then a
    /// half-close after the client's.
    fn echo_upper(_port: u16) -> io::Result<OwnedFd> {
        let (ours, theirs) = UnixStream::pair()?;
        std::thread::spawn(move || {
            let mut s = theirs;
            let mut all = Vec::new();
            let _ = s.read_to_end(&mut all);
            let _ = s.write_all(&all.to_ascii_uppercase());
            let _ = s.shutdown(Shutdown::Write);
        });
        Ok(ours.into())
    }

    #[test]
    fn a_connection_to_the_relay_reaches_the_host_side_and_half_closes_pass_through() {
        let port = start(0, echo_upper).unwrap();
        for _ in 0..3 {
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            c.write_all(b"connect example.com:443").unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            let mut back = String::new();
            c.read_to_string(&mut back).unwrap();
            assert_eq!(back, "CONNECT EXAMPLE.COM:443");
        }
    }

    fn refuse(_port: u16) -> io::Result<OwnedFd> {
        Err(io::Error::from(io::ErrorKind::ConnectionRefused))
    }

    #[test]
    fn a_host_that_refuses_closes_the_relayed_connection() {
        let port = start(0, refuse).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut back = Vec::new();
        assert_eq!(c.read_to_end(&mut back).unwrap_or(0), 0);
    }
}
