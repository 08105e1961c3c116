//! The hybrid Unix-socket muxer (Firecracker's convention): the host side
//! of every guest vsock stream.
//!
//! * Host-initiated: a client connects to `uds_path` and writes
//!   `CONNECT <port>\n`; the guest gets a REQUEST from an ephemeral host
//!   port to `<port>`; on its RESPONSE the client reads `OK <hostport>\n`
//!   and the stream begins. A guest that answers RST has no listener there,
//!   one that does not answer within [`CONNECT_TIMEOUT`] gets RST: either
//!   way the client reads `ERR <why>\n` and is closed.
//!
//! The preamble's grammar and rules are [`boxdesk_channel::hybrid`]'s, the
//! same as the namespace backend's forwarder: a peer of another uid is
//! refused before a byte of it is read, the line is read a byte at a time
//! (the stream's bytes behind it stay in the socket) and judged at its
//! first bad byte, so never past [`hybrid::REQUEST_MAX`], and every
//! refusal, the cap and a line not in within [`CONNECT_TIMEOUT`] included,
//! is one `ERR <why>\n` line before the close.
//! * Guest-initiated: a REQUEST to host port `P` connects to
//!   `<uds_path>_<P>`; nothing listening there → RST.
//!
//! The muxer owns the listener, the clients still writing their `CONNECT`
//! line, the [`Conn`]s (at most [`MAX_CONNECTIONS`] of both together), and
//! the order in which connections get RX buffers (round robin). It never
//! touches guest memory or virtqueues, never blocks (every socket is
//! non-blocking) and never trusts a header it did not check.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use boxdesk_channel::hybrid::{self, Refusal, Scan};
use boxdesk_platform::socket::ensure_same_uid;
use mio::net::{UnixListener, UnixStream};
use mio::{Interest, Registry, Token};

use super::conn::{say, Conn, ConnEnd, ConnKey, Readiness, CONNECT_TIMEOUT};
use super::packet::{Header, Op, HOST_CID, TYPE_STREAM};

/// The poller token of the listener.
pub const LISTENER: Token = Token(1);
/// First token handed to a host socket (0 and 1 are the waker's and the
/// listener's).
const FIRST_STREAM_TOKEN: usize = 2;
/// Streams plus clients still writing `CONNECT`, at most.
pub const MAX_CONNECTIONS: usize = 1024;
/// RSTs waiting for an RX buffer, at most; past it they are dropped (the
/// guest's own timeouts clean up).
const MAX_QUEUED_RST: usize = 4 * MAX_CONNECTIONS;
/// Host-initiated streams take host ports from here up, to
/// [`LAST_EPHEMERAL_PORT`], in turn (Firecracker's range).
const FIRST_EPHEMERAL_PORT: u32 = 1 << 30;
const LAST_EPHEMERAL_PORT: u32 = (1 << 31) - 1;

/// A host client that has not finished its `CONNECT <port>\n` line.
#[derive(Debug)]
struct Pending {
    stream: UnixStream,
    line: Vec<u8>,
    deadline: Instant,
}

#[derive(Debug)]
enum Slot {
    Pending(Pending),
    Conn(ConnKey),
}

/// Something owed to the guest, in RX-buffer order.
#[derive(Debug)]
enum RxItem {
    /// Ask this connection for its next packet.
    Conn(ConnKey),
    /// A ready-made packet (an RST for a stream that is gone).
    Packet(Header),
}

/// The host side of the device: listener, clients and streams.
#[derive(Debug)]
pub struct Muxer {
    guest_cid: u64,
    uds_path: PathBuf,
    registry: Registry,
    listener: UnixListener,
    slots: HashMap<Token, Slot>,
    conns: HashMap<ConnKey, Conn>,
    rxq: VecDeque<RxItem>,
    queued_rst: usize,
    next_token: usize,
    next_port: u32,
}

fn readiness(ev: &mio::event::Event) -> Readiness {
    Readiness {
        readable: ev.is_readable(),
        writable: ev.is_writable(),
        read_closed: ev.is_read_closed(),
        write_closed: ev.is_write_closed(),
        error: ev.is_error(),
    }
}

impl Muxer {
    /// Serves `listener` (bound at `uds_path`), registering it with `registry`.
    pub fn new(
        guest_cid: u64,
        uds_path: &Path,
        listener: std::os::unix::net::UnixListener,
        registry: Registry,
    ) -> io::Result<Muxer> {
        listener.set_nonblocking(true)?;
        let mut listener = UnixListener::from_std(listener);
        registry.register(&mut listener, LISTENER, Interest::READABLE)?;
        Ok(Muxer {
            guest_cid,
            uds_path: uds_path.to_path_buf(),
            registry,
            listener,
            slots: HashMap::new(),
            conns: HashMap::new(),
            rxq: VecDeque::new(),
            queued_rst: 0,
            next_token: FIRST_STREAM_TOKEN,
            next_port: FIRST_EPHEMERAL_PORT,
        })
    }

    fn new_token(&mut self) -> Token {
        loop {
            let t = Token(self.next_token);
            self.next_token = self.next_token.checked_add(1).unwrap_or(FIRST_STREAM_TOKEN);
            if !self.slots.contains_key(&t) {
                return t;
            }
        }
    }

    /// Accepts every waiting client (the listener was readable).
    pub fn accept(&mut self, now: Instant) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if let Err(e) = ensure_same_uid(&stream) {
                        say(&stream, hybrid::REPLY_FOREIGN);
                        tracing::warn!("vsock: refused a host client: {e}");
                        continue;
                    }
                    if self.slots.len() >= MAX_CONNECTIONS {
                        say(&stream, hybrid::REPLY_TOO_MANY);
                        tracing::warn!(
                            "vsock: {MAX_CONNECTIONS} connections open; refusing a host client"
                        );
                        continue;
                    }
                    let token = self.new_token();
                    if let Err(e) = self.registry.register(
                        &mut stream,
                        token,
                        Interest::READABLE | Interest::WRITABLE,
                    ) {
                        tracing::warn!("vsock: cannot poll a host client: {e}");
                        continue;
                    }
                    let pending = Pending {
                        stream,
                        line: Vec::with_capacity(hybrid::REQUEST_MAX),
                        deadline: now + CONNECT_TIMEOUT,
                    };
                    self.slots.insert(token, Slot::Pending(pending));
                    // It may have written its line already.
                    self.read_connect_line(token, now);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("vsock: accept on {}: {e}", self.uds_path.display());
                    return;
                }
            }
        }
    }

    /// A host socket's readiness event.
    pub fn on_event(&mut self, ev: &mio::event::Event, now: Instant) {
        let token = ev.token();
        match self.slots.get(&token) {
            Some(Slot::Pending(_)) => self.read_connect_line(token, now),
            Some(Slot::Conn(key)) => {
                let key = *key;
                if let Some(conn) = self.conns.get_mut(&key) {
                    match conn.on_host(readiness(ev), now) {
                        Ok(()) => self.schedule(key),
                        Err(end) => self.kill(key, end, false),
                    }
                }
            }
            None => {}
        }
    }

    /// Reads the client's line a byte at a time, so that bytes it sends
    /// after the line stay in the socket for the stream, until it is
    /// settled: a port to connect, or a refusal.
    fn read_connect_line(&mut self, token: Token, now: Instant) {
        let Some(Slot::Pending(p)) = self.slots.get_mut(&token) else {
            return;
        };
        let verdict = loop {
            let mut b = [0u8; 1];
            match p.stream.read(&mut b) {
                // Gone before a word: nobody to answer.
                Ok(0) if p.line.is_empty() => break None,
                Ok(0) => break Some(hybrid::scan_request_at_eof(&p.line)),
                Ok(_) => {
                    p.line.push(b[0]);
                    match hybrid::scan_request(&p.line) {
                        Scan::Partial => {}
                        Scan::Connect(r) => break Some(Ok(r)),
                        Scan::Refused(e) => break Some(Err(e)),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => break None,
            }
        };
        let Some(Slot::Pending(p)) = self.slots.remove(&token) else {
            return;
        };
        match verdict {
            Some(Ok(r)) => self.host_connect(token, p.stream, r.port, now),
            Some(Err(e)) => {
                say(&p.stream, Refusal::from(e).reply().as_bytes());
                tracing::debug!("vsock: refused a host client: {e}");
            }
            None => tracing::debug!("vsock: a host client left"),
        }
    }

    fn host_connect(&mut self, token: Token, stream: UnixStream, peer_port: u32, now: Instant) {
        let key = loop {
            let key = ConnKey {
                local_port: self.next_port,
                peer_port,
            };
            self.next_port = if self.next_port < LAST_EPHEMERAL_PORT {
                self.next_port + 1
            } else {
                FIRST_EPHEMERAL_PORT
            };
            if !self.conns.contains_key(&key) {
                break key;
            }
        };
        let conn = Conn::host_initiated(key, self.guest_cid, stream, token, now);
        self.slots.insert(token, Slot::Conn(key));
        self.conns.insert(key, conn);
        self.schedule(key);
    }

    /// A packet the guest sent (header checked for size only).
    pub fn on_guest(&mut self, hdr: &Header, payload: &[u8], now: Instant) {
        if hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            tracing::debug!(
                "vsock: dropped a packet from cid {} to cid {}",
                hdr.src_cid,
                hdr.dst_cid
            );
            return;
        }
        let Some(op) = hdr.op().filter(|_| hdr.type_ == TYPE_STREAM) else {
            self.reject(hdr);
            return;
        };
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        match op {
            Op::Rst => {
                if let Some(conn) = self.conns.remove(&key) {
                    conn.refuse(Refusal::NoListener(key.peer_port));
                    self.slots.remove(&conn.token);
                }
            }
            Op::Request if !self.conns.contains_key(&key) => self.guest_connect(hdr, key),
            _ => match self.conns.get_mut(&key) {
                Some(conn) => match conn.on_guest(hdr, payload, now) {
                    Ok(()) => self.schedule(key),
                    Err(end) => self.kill(key, end, false),
                },
                None => self.reject(hdr),
            },
        }
    }

    fn guest_connect(&mut self, req: &Header, key: ConnKey) {
        if self.slots.len() >= MAX_CONNECTIONS {
            tracing::debug!(
                "vsock: {MAX_CONNECTIONS} connections open; refusing guest port {}",
                key.peer_port
            );
            self.reject(req);
            return;
        }
        let mut path = self.uds_path.as_os_str().to_owned();
        path.push(format!("_{}", key.local_port));
        let mut stream = match UnixStream::connect(Path::new(&path)) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(
                    "vsock: guest connect to {}: {e}",
                    Path::new(&path).display()
                );
                self.reject(req);
                return;
            }
        };
        let token = self.new_token();
        if let Err(e) =
            self.registry
                .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
        {
            tracing::warn!("vsock: cannot poll {}: {e}", Path::new(&path).display());
            self.reject(req);
            return;
        }
        let conn = Conn::guest_initiated(key, self.guest_cid, stream, token, req);
        self.slots.insert(token, Slot::Conn(key));
        self.conns.insert(key, conn);
        self.schedule(key);
    }

    /// Answers a packet the device cannot take with RST (unless it is
    /// one). A stream it names is reset too: the guest will drop its end.
    pub fn reject(&mut self, hdr: &Header) {
        if hdr.op == Op::Rst as u16 || hdr.src_cid != self.guest_cid || hdr.dst_cid != HOST_CID {
            return;
        }
        let key = ConnKey {
            local_port: hdr.dst_port,
            peer_port: hdr.src_port,
        };
        if self.conns.contains_key(&key) {
            self.kill(key, ConnEnd::Malformed, false);
        } else {
            self.queue_rst(key.local_port, key.peer_port, false);
        }
    }

    fn queue_rst(&mut self, local_port: u32, peer_port: u32, front: bool) {
        if self.queued_rst >= MAX_QUEUED_RST {
            tracing::debug!("vsock: too many RSTs waiting for rx buffers; dropped one");
            return;
        }
        let rst = RxItem::Packet(Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: local_port,
            dst_port: peer_port,
            type_: TYPE_STREAM,
            op: Op::Rst as u16,
            ..Header::default()
        });
        self.queued_rst += 1;
        if front {
            self.rxq.push_front(rst);
        } else {
            self.rxq.push_back(rst);
        }
    }

    /// Ends a stream: its host socket closes now, the guest gets RST
    /// (next, with `front`).
    fn kill(&mut self, key: ConnKey, end: ConnEnd, front: bool) {
        if let Some(conn) = self.conns.remove(&key) {
            self.slots.remove(&conn.token);
        }
        match end {
            ConnEnd::Finished => tracing::trace!("vsock: {key:?} finished"),
            end => tracing::debug!("vsock: {key:?} reset: {end}"),
        }
        self.queue_rst(key.local_port, key.peer_port, front);
    }

    fn schedule(&mut self, key: ConnKey) {
        if let Some(conn) = self.conns.get_mut(&key) {
            if !conn.queued && conn.has_pending_rx() {
                conn.queued = true;
                self.rxq.push_back(RxItem::Conn(key));
            }
        }
    }

    /// Ends what has waited too long: clients without a line, streams
    /// the guest did not accept or finish closing; and gives up the rest
    /// of a half-closed host the guest will not read
    /// ([`super::conn::HALF_CLOSE_STALL`]).
    pub fn expire(&mut self, now: Instant) {
        let late: Vec<Token> = self
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Pending(p) if p.deadline <= now))
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            if let Some(Slot::Pending(p)) = self.slots.remove(&t) {
                say(&p.stream, hybrid::REPLY_STALLED);
            }
        }
        for key in self.due(Conn::expiry, now) {
            if let Some(conn) = self.conns.get(&key) {
                conn.refuse(Refusal::NoAnswer(key.peer_port));
            }
            self.kill(key, ConnEnd::Timeout, false);
        }
        for key in self.due(Conn::stall_deadline, now) {
            if let Some(conn) = self.conns.get_mut(&key) {
                conn.give_up_host_rest();
            }
            self.schedule(key);
        }
    }

    /// The connections whose `deadline` has come.
    fn due(&self, deadline: impl Fn(&Conn) -> Option<Instant>, now: Instant) -> Vec<ConnKey> {
        self.conns
            .values()
            .filter(|c| deadline(c).is_some_and(|d| d <= now))
            .map(Conn::key)
            .collect()
    }

    /// The earliest time [`Muxer::expire`] has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        let pending = self.slots.values().filter_map(|s| match s {
            Slot::Pending(p) => Some(p.deadline),
            Slot::Conn(_) => None,
        });
        self.conns
            .values()
            .flat_map(|c| [c.expiry(), c.stall_deadline()])
            .flatten()
            .chain(pending)
            .min()
    }

    /// Whether packets wait for RX buffers.
    pub fn has_pending_rx(&self) -> bool {
        !self.rxq.is_empty()
    }

    /// The next packet for the guest, payload (at most `max_payload`
    /// bytes) in `scratch`. `None`: nothing to send now.
    pub fn next_packet(
        &mut self,
        max_payload: usize,
        scratch: &mut [u8],
        now: Instant,
    ) -> Option<Header> {
        while let Some(item) = self.rxq.pop_front() {
            let key = match item {
                RxItem::Packet(hdr) => {
                    self.queued_rst = self.queued_rst.saturating_sub(1);
                    return Some(hdr);
                }
                RxItem::Conn(key) => key,
            };
            let Some(conn) = self.conns.get_mut(&key) else {
                continue;
            };
            conn.queued = false;
            match conn.produce(max_payload, scratch, now) {
                Ok(Some(hdr)) => {
                    self.schedule(key);
                    return Some(hdr);
                }
                Ok(None) => {}
                // This buffer carries the RST.
                Err(end) => self.kill(key, end, true),
            }
        }
        None
    }
}
