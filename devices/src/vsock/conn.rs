//! One vsock stream between a guest socket and a host Unix socket: its
//! state (connecting, established, half-closed), its credit accounting in
//! both directions, and the bytes the host has not taken yet.
//!
//! A [`Conn`] owns its host socket and moves bytes between it and packets.
//! It never touches guest memory or the poller, and never sends more than
//! the guest's free credit. Anything that ends the stream is returned as
//! a [`ConnEnd`]; the muxer then drops the connection (closing the host
//! socket) and answers the guest with RST.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::Shutdown;
use std::num::Wrapping;
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

use boxdesk_channel::hybrid::{self, Refusal};
use mio::net::UnixStream;
use mio::Token;

use super::packet::{
    Header, Op, HOST_CID, SHUTDOWN_BOTH, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM,
};

/// Receive buffer we advertise per connection: the most guest bytes we
/// hold for a host socket that is not reading.
pub const BUF_ALLOC: u32 = 256 * 1024;
/// Host-consumed bytes after which we tell the guest about its new credit
/// without being asked.
const CREDIT_UPDATE_THRESHOLD: u32 = BUF_ALLOC / 2;
/// How long the guest has to answer our REQUEST.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a closing stream may wait for the other side to finish.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the host's end of a stream may sit undelivered after the host
/// half-closed, while the guest gives no credit at all: then the guest is
/// told the host is done (SHUTDOWN) and the rest is dropped. A Unix-socket
/// peer sees such a half-close at once (`POLLRDHUP`) however much it left
/// unread; over vsock it would otherwise wait behind bytes the guest does
/// not read (the agent, for one, ends an exec whose client hung up while
/// its stdin is full).
pub const HALF_CLOSE_STALL: Duration = Duration::from_secs(2);

/// The ports that name a stream: `local_port` on the host side (CID 2),
/// `peer_port` on the guest side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// The host-side port.
    pub local_port: u32,
    /// The guest-side port.
    pub peer_port: u32,
}

/// Why a stream ends. Every one but [`ConnEnd::Finished`] is a failure of
/// one side; all of them close the host socket and send the guest RST.
#[derive(Debug, thiserror::Error)]
pub enum ConnEnd {
    /// Both sides are done (the guest shut down both directions and every
    /// byte reached the host).
    #[error("stream finished")]
    Finished,
    /// The guest sent more bytes than the credit we gave it.
    #[error("guest overran its credit")]
    CreditOverrun,
    /// The guest sent a packet the device cannot take (length, type, op).
    #[error("malformed packet from the guest")]
    Malformed,
    /// The guest sent an op that is wrong in the stream's state.
    #[error("unexpected op {0} from the guest")]
    Unexpected(u16),
    /// The other side did not answer in time (connect or shutdown).
    #[error("timed out")]
    Timeout,
    /// Reading the host socket failed.
    #[error("host socket read failed")]
    HostRead(#[source] io::Error),
    /// Writing the host socket failed (it is gone).
    #[error("host socket write failed")]
    HostWrite(#[source] io::Error),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The host asked; our REQUEST is pending or sent; no RESPONSE yet.
    LocalInit,
    /// Both sides agreed (for a guest-initiated stream, as soon as the
    /// host socket connected; our RESPONSE goes out before any data).
    Established,
}

/// What a host socket's readiness event said.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readiness {
    /// Bytes (or EOF) can be read.
    pub readable: bool,
    /// Bytes can be written.
    pub writable: bool,
    /// The host will write nothing more.
    pub read_closed: bool,
    /// The host reads nothing more (it closed its socket).
    pub write_closed: bool,
    /// The socket has an error pending.
    pub error: bool,
}

/// One stream.
#[derive(Debug)]
pub struct Conn {
    key: ConnKey,
    guest_cid: u64,
    stream: UnixStream,
    /// Its token with the poller.
    pub token: Token,
    state: State,
    /// Set while the muxer's RX queue names this connection.
    pub queued: bool,
    want_request: bool,
    want_response: bool,
    want_credit_update: bool,
    /// The host fully closed after we sent SHUTDOWN(SEND): say RCV too.
    want_full_shutdown: bool,
    credit_requested: bool,
    host_readable: bool,
    host_write_closed: bool,
    host_write_shut: bool,
    /// Shutdown flags we sent the guest.
    local_shut: u32,
    /// Shutdown flags the guest sent us.
    peer_shut: u32,
    /// Bytes for the host socket that it has not taken yet.
    tx_buf: VecDeque<u8>,
    /// How much of the front of `tx_buf` is our own `OK <port>\n`, which
    /// is not guest data and earns the guest no credit.
    uncounted: usize,
    /// Guest bytes delivered to the host socket.
    fwd_cnt: Wrapping<u32>,
    /// `fwd_cnt` as the guest last heard it.
    last_fwd_cnt_sent: Wrapping<u32>,
    peer_buf_alloc: u32,
    peer_fwd_cnt: Wrapping<u32>,
    /// Bytes sent to the guest.
    rx_cnt: Wrapping<u32>,
    expiry: Option<Instant>,
    /// The host half-closed (it will send nothing more).
    host_eof: bool,
    /// Since when the host's rest has waited for credit the guest does
    /// not give, after the host half-closed.
    stalled_since: Option<Instant>,
    /// The stall lasted [`HALF_CLOSE_STALL`]: tell the guest the host is
    /// done and drop the rest.
    want_forced_shutdown: bool,
}

impl Conn {
    fn new(key: ConnKey, guest_cid: u64, stream: UnixStream, token: Token, state: State) -> Conn {
        no_sigpipe(&stream);
        Conn {
            key,
            guest_cid,
            stream,
            token,
            state,
            queued: false,
            want_request: false,
            want_response: false,
            want_credit_update: false,
            want_full_shutdown: false,
            credit_requested: false,
            // Bytes may already wait (a client that did not wait for `OK`);
            // an edge-triggered poller would not say so again.
            host_readable: true,
            host_write_closed: false,
            host_write_shut: false,
            local_shut: 0,
            peer_shut: 0,
            tx_buf: VecDeque::new(),
            uncounted: 0,
            fwd_cnt: Wrapping(0),
            last_fwd_cnt_sent: Wrapping(0),
            peer_buf_alloc: 0,
            peer_fwd_cnt: Wrapping(0),
            rx_cnt: Wrapping(0),
            expiry: None,
            host_eof: false,
            stalled_since: None,
            want_forced_shutdown: false,
        }
    }

    /// A stream the host asked for with `CONNECT <port>`: a REQUEST for the
    /// guest is pending, which must be answered within [`CONNECT_TIMEOUT`].
    pub fn host_initiated(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        token: Token,
        now: Instant,
    ) -> Conn {
        let mut c = Conn::new(key, guest_cid, stream, token, State::LocalInit);
        c.want_request = true;
        c.expiry = Some(now + CONNECT_TIMEOUT);
        c
    }

    /// Tells the host client of a stream it asked for, which the guest has
    /// not accepted, why it ends (`ERR <why>\n`); nothing once established.
    pub fn refuse(&self, why: Refusal) {
        if self.state == State::LocalInit {
            say(&self.stream, why.reply().as_bytes());
        }
    }

    /// A stream the guest asked for, whose host socket is connected: a
    /// RESPONSE for the guest is pending.
    pub fn guest_initiated(
        key: ConnKey,
        guest_cid: u64,
        stream: UnixStream,
        token: Token,
        req: &Header,
    ) -> Conn {
        let mut c = Conn::new(key, guest_cid, stream, token, State::Established);
        c.want_response = true;
        c.peer_buf_alloc = req.buf_alloc;
        c.peer_fwd_cnt = Wrapping(req.fwd_cnt);
        c
    }

    /// Its ports.
    pub fn key(&self) -> ConnKey {
        self.key
    }

    /// When it must end if nothing happens first.
    pub fn expiry(&self) -> Option<Instant> {
        self.expiry
    }

    /// When a half-closed host's undelivered rest is given up on
    /// ([`HALF_CLOSE_STALL`]), if it is waiting for the guest's credit.
    pub fn stall_deadline(&self) -> Option<Instant> {
        self.stalled_since.map(|t| t + HALF_CLOSE_STALL)
    }

    /// The stall lasted: the next packet tells the guest the host is done.
    pub fn give_up_host_rest(&mut self) {
        self.stalled_since = None;
        self.want_forced_shutdown = true;
    }

    /// Starts or stops the stall clock: the host half-closed, its end of
    /// the stream is not closed yet, and the guest gives no credit.
    fn check_stall(&mut self, now: Instant) {
        let stalled = self.host_eof
            && self.state == State::Established
            && self.local_shut & SHUTDOWN_SEND == 0
            && self.peer_credit() == 0;
        if !stalled {
            self.stalled_since = None;
        } else if self.stalled_since.is_none() {
            self.stalled_since = Some(now);
        }
    }

    /// The guest's free receive space, as far as we know.
    fn peer_credit(&self) -> u32 {
        let in_flight = (self.rx_cnt - self.peer_fwd_cnt).0;
        self.peer_buf_alloc.saturating_sub(in_flight)
    }

    fn can_read_host(&self) -> bool {
        self.state == State::Established
            && self.host_readable
            && self.local_shut & SHUTDOWN_SEND == 0
            && self.peer_shut & SHUTDOWN_RCV == 0
    }

    /// Whether [`Conn::produce`] may yield a packet now.
    pub fn has_pending_rx(&self) -> bool {
        self.want_response
            || self.want_request
            || self.want_credit_update
            || self.want_full_shutdown
            || self.want_forced_shutdown
            || (self.can_read_host() && (self.peer_credit() > 0 || !self.credit_requested))
    }

    /// A header from us to the guest; it carries our credit, so no
    /// separate credit update is owed after it.
    fn stamp(&mut self, op: Op, flags: u32, len: u32) -> Header {
        self.last_fwd_cnt_sent = self.fwd_cnt;
        self.want_credit_update = false;
        Header {
            src_cid: HOST_CID,
            dst_cid: self.guest_cid,
            src_port: self.key.local_port,
            dst_port: self.key.peer_port,
            len,
            type_: TYPE_STREAM,
            op: op as u16,
            flags,
            buf_alloc: BUF_ALLOC,
            fwd_cnt: self.fwd_cnt.0,
        }
    }

    /// Nothing more comes from the host: the guest is told it will not
    /// receive (and not send either, when the host also stopped reading).
    fn host_send_ended(&mut self, now: Instant) -> Header {
        self.host_readable = false;
        let flags = if self.host_write_closed {
            SHUTDOWN_BOTH
        } else {
            SHUTDOWN_SEND
        };
        self.shutdown_to_guest(flags, now)
    }

    fn shutdown_to_guest(&mut self, flags: u32, now: Instant) -> Header {
        self.local_shut |= flags;
        if self.local_shut == SHUTDOWN_BOTH {
            self.expiry = Some(now + SHUTDOWN_TIMEOUT);
        }
        self.stamp(Op::Shutdown, flags, 0)
    }

    /// The next packet for the guest, its payload (at most `max_payload`
    /// bytes, within the guest's credit) read from the host socket into
    /// `scratch`. `None`: nothing to say now.
    pub fn produce(
        &mut self,
        max_payload: usize,
        scratch: &mut [u8],
        now: Instant,
    ) -> Result<Option<Header>, ConnEnd> {
        if self.want_response {
            self.want_response = false;
            return Ok(Some(self.stamp(Op::Response, 0, 0)));
        }
        if self.want_request {
            self.want_request = false;
            return Ok(Some(self.stamp(Op::Request, 0, 0)));
        }
        if self.want_full_shutdown {
            self.want_full_shutdown = false;
            return Ok(Some(self.shutdown_to_guest(SHUTDOWN_BOTH, now)));
        }
        if self.want_forced_shutdown {
            self.want_forced_shutdown = false;
            return Ok(Some(self.host_send_ended(now)));
        }
        if self.can_read_host() {
            let credit = self.peer_credit() as usize;
            if credit == 0 {
                if !self.credit_requested {
                    self.credit_requested = true;
                    return Ok(Some(self.stamp(Op::CreditRequest, 0, 0)));
                }
            } else {
                let n = credit.min(max_payload).min(scratch.len());
                loop {
                    match (&self.stream).read(&mut scratch[..n]) {
                        Ok(0) => return Ok(Some(self.host_send_ended(now))),
                        Ok(got) => {
                            let got32 = u32::try_from(got).unwrap_or(u32::MAX);
                            self.rx_cnt += Wrapping(got32);
                            self.check_stall(now);
                            return Ok(Some(self.stamp(Op::Rw, 0, got32)));
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            self.host_readable = false;
                            break;
                        }
                        Err(e) => return Err(ConnEnd::HostRead(e)),
                    }
                }
            }
        }
        if self.want_credit_update {
            return Ok(Some(self.stamp(Op::CreditUpdate, 0, 0)));
        }
        Ok(None)
    }

    /// Takes a packet from the guest (anything but REQUEST and RST, which
    /// the muxer handles). `payload` is the RW data.
    pub fn on_guest(&mut self, hdr: &Header, payload: &[u8], now: Instant) -> Result<(), ConnEnd> {
        self.peer_buf_alloc = hdr.buf_alloc;
        self.peer_fwd_cnt = Wrapping(hdr.fwd_cnt);
        self.credit_requested = false;
        self.check_stall(now);
        match hdr.op() {
            Some(Op::Response) if self.state == State::LocalInit => {
                self.state = State::Established;
                self.expiry = None;
                let ok = hybrid::ok_reply(self.key.local_port);
                self.uncounted += ok.len();
                self.tx_buf.extend(ok.as_bytes());
                self.flush(now)
            }
            Some(Op::Rw)
                if self.state == State::Established && self.peer_shut & SHUTDOWN_SEND == 0 =>
            {
                let held = self.tx_buf.len() - self.uncounted;
                if held + payload.len() > BUF_ALLOC as usize {
                    return Err(ConnEnd::CreditOverrun);
                }
                let mut rest = payload;
                // Straight to the host when nothing waits before it.
                while self.tx_buf.is_empty() && !rest.is_empty() {
                    match write_host(&self.stream, rest) {
                        Ok(0) => return Err(ConnEnd::HostWrite(io::ErrorKind::WriteZero.into())),
                        Ok(n) => {
                            rest = rest.get(n..).unwrap_or_default();
                            self.fwd_cnt += Wrapping(u32::try_from(n).unwrap_or(u32::MAX));
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(ConnEnd::HostWrite(e)),
                    }
                }
                self.tx_buf.extend(rest);
                self.flush(now)
            }
            Some(Op::CreditUpdate) => Ok(()),
            Some(Op::CreditRequest) => {
                self.want_credit_update = true;
                Ok(())
            }
            Some(Op::Shutdown) if self.state == State::Established => {
                self.peer_shut |= hdr.flags & SHUTDOWN_BOTH;
                self.settle(now)
            }
            _ => Err(ConnEnd::Unexpected(hdr.op)),
        }
    }

    /// Takes a readiness event of the host socket.
    pub fn on_host(&mut self, r: Readiness, now: Instant) -> Result<(), ConnEnd> {
        if r.readable || r.read_closed || r.error {
            self.host_readable = true;
        }
        if r.read_closed {
            self.host_eof = true;
            self.check_stall(now);
        }
        if r.write_closed && !self.host_write_closed {
            self.host_write_closed = true;
            if self.local_shut & SHUTDOWN_SEND != 0 && self.local_shut & SHUTDOWN_RCV == 0 {
                self.want_full_shutdown = true;
            }
        }
        if r.writable || r.write_closed || r.error {
            self.flush(now)?;
        }
        Ok(())
    }

    /// Writes what the host will take, credits the guest, and applies the
    /// guest's shutdown once nothing is left to write.
    fn flush(&mut self, now: Instant) -> Result<(), ConnEnd> {
        while !self.tx_buf.is_empty() {
            let (front, _) = self.tx_buf.as_slices();
            match write_host(&self.stream, front) {
                Ok(0) => return Err(ConnEnd::HostWrite(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.tx_buf.drain(..n);
                    let ours = n.min(self.uncounted);
                    self.uncounted -= ours;
                    self.fwd_cnt += Wrapping(u32::try_from(n - ours).unwrap_or(u32::MAX));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(ConnEnd::HostWrite(e)),
            }
        }
        if (self.fwd_cnt - self.last_fwd_cnt_sent).0 >= CREDIT_UPDATE_THRESHOLD {
            self.want_credit_update = true;
        }
        self.settle(now)
    }

    fn settle(&mut self, now: Instant) -> Result<(), ConnEnd> {
        if !self.tx_buf.is_empty() {
            if self.peer_shut == SHUTDOWN_BOTH && self.expiry.is_none() {
                self.expiry = Some(now + SHUTDOWN_TIMEOUT);
            }
            return Ok(());
        }
        if self.peer_shut & SHUTDOWN_SEND != 0 && !self.host_write_shut {
            self.host_write_shut = true;
            // The host may be gone already; that is its half-close too.
            let _ = self.stream.shutdown(Shutdown::Write);
        }
        if self.peer_shut == SHUTDOWN_BOTH {
            return Err(ConnEnd::Finished);
        }
        Ok(())
    }
}

/// Writes without raising SIGPIPE when the host has gone.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn write_host(stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a live slice of `buf.len()` readable bytes for the
    // whole call, and the descriptor is owned by `stream`, which outlives it.
    let n = unsafe {
        libc::send(
            stream.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_NOSIGNAL,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Writes; SIGPIPE is off for the socket ([`no_sigpipe`]).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn write_host(mut stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    use std::io::Write;
    stream.write(buf)
}

/// One non-blocking write of a host client's last line, whatever becomes of
/// it: the socket is closed next.
pub fn say(stream: &UnixStream, line: &[u8]) {
    no_sigpipe(stream);
    let _ = write_host(stream, line);
}

/// Turns SIGPIPE off for writes to this socket where the OS has no
/// per-call flag for it.
#[cfg(target_vendor = "apple")]
fn no_sigpipe(stream: &UnixStream) {
    let one: libc::c_int = 1;
    // SAFETY: the descriptor is owned by `stream`; the option value points
    // at a live c_int whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NOSIGPIPE,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!("vsock: SO_NOSIGPIPE: {}", io::Error::last_os_error());
    }
}

/// `send(MSG_NOSIGNAL)` covers it ([`write_host`]).
#[cfg(not(target_vendor = "apple"))]
fn no_sigpipe(_stream: &UnixStream) {}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn pair() -> (Conn, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let key = ConnKey {
            local_port: 1 << 30,
            peer_port: 1024,
        };
        (
            Conn::host_initiated(key, 3, UnixStream::from_std(a), Token(7), Instant::now()),
            b,
        )
    }

    fn guest(op: Op, len: u32, buf_alloc: u32, fwd_cnt: u32) -> Header {
        Header {
            src_cid: 3,
            dst_cid: HOST_CID,
            src_port: 1024,
            dst_port: 1 << 30,
            len,
            type_: TYPE_STREAM,
            op: op as u16,
            flags: 0,
            buf_alloc,
            fwd_cnt,
        }
    }

    #[test]
    fn host_bytes_never_exceed_the_guests_free_credit() {
        let (mut c, mut host) = pair();
        let now = Instant::now();
        let mut scratch = vec![0u8; 65536];
        let req = c.produce(65536, &mut scratch, now).unwrap().unwrap();
        assert_eq!(req.op(), Some(Op::Request));
        c.on_guest(&guest(Op::Response, 0, 100, 0), &[], now)
            .unwrap();
        host.write_all(&[7u8; 1000]).unwrap();
        let rw = c.produce(65536, &mut scratch, now).unwrap().unwrap();
        assert_eq!((rw.op(), rw.len), (Some(Op::Rw), 100));
        let ask = c.produce(65536, &mut scratch, now).unwrap().unwrap();
        assert_eq!(ask.op(), Some(Op::CreditRequest));
        assert!(!c.has_pending_rx());
        c.on_guest(&guest(Op::CreditUpdate, 0, 100, 60), &[], now)
            .unwrap();
        let rw = c.produce(65536, &mut scratch, now).unwrap().unwrap();
        assert_eq!(rw.len, 60);
    }

    #[test]
    fn guest_data_past_the_advertised_buffer_ends_the_stream() {
        let (mut c, _host) = pair();
        let now = Instant::now();
        c.on_guest(&guest(Op::Response, 0, 100, 0), &[], now)
            .unwrap();
        // Nobody reads the host side: fill its socket buffer, then ours.
        let chunk = vec![1u8; 65536];
        let mut result = Ok(());
        for _ in 0..256 {
            result = c.on_guest(&guest(Op::Rw, 65536, 100, 0), &chunk, now);
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(ConnEnd::CreditOverrun)));
    }

    fn read_closed() -> Readiness {
        Readiness {
            readable: true,
            read_closed: true,
            ..Readiness::default()
        }
    }

    /// An established stream whose guest has 100 bytes of room, whose host
    /// wrote `n` bytes and half-closed.
    fn half_closed_after(n: usize) -> (Conn, std::os::unix::net::UnixStream, Instant) {
        let (mut c, mut host) = pair();
        let t0 = Instant::now();
        c.produce(65536, &mut [0u8; 64], t0).unwrap();
        c.on_guest(&guest(Op::Response, 0, 100, 0), &[], t0)
            .unwrap();
        host.write_all(&vec![7u8; n]).unwrap();
        host.shutdown(Shutdown::Write).unwrap();
        (c, host, t0)
    }

    #[test]
    fn a_half_closed_host_whose_rest_the_guest_never_reads_is_shut_down_after_the_stall() {
        let (mut c, _host, t0) = half_closed_after(1000);
        let mut scratch = vec![0u8; 65536];
        let rw = c.produce(65536, &mut scratch, t0).unwrap().unwrap();
        assert_eq!((rw.op(), rw.len), (Some(Op::Rw), 100));
        c.on_host(read_closed(), t0).unwrap();
        // The guest's buffer is full and it gives nothing back.
        assert_eq!(c.stall_deadline(), Some(t0 + HALF_CLOSE_STALL));
        c.give_up_host_rest();
        let shut = c.produce(65536, &mut scratch, t0).unwrap().unwrap();
        assert_eq!((shut.op(), shut.flags), (Some(Op::Shutdown), SHUTDOWN_SEND));
        assert_eq!(c.stall_deadline(), None);
        assert!(!c.has_pending_rx(), "nothing more of the host's is sent");
    }

    #[test]
    fn a_half_closed_host_whose_guest_reads_on_never_stalls_and_loses_nothing() {
        let (mut c, _host, t0) = half_closed_after(250);
        let mut scratch = vec![0u8; 65536];
        c.on_host(read_closed(), t0).unwrap();
        let mut sent = 0;
        let mut fwd = 0;
        loop {
            let p = c.produce(65536, &mut scratch, t0).unwrap().unwrap();
            match p.op() {
                Some(Op::Rw) => sent += p.len,
                Some(Op::CreditRequest) => {
                    // The guest read everything: the stall clock stops.
                    assert!(c.stall_deadline().is_some());
                    fwd = sent;
                    c.on_guest(&guest(Op::CreditUpdate, 0, 100, fwd), &[], t0)
                        .unwrap();
                    assert_eq!(c.stall_deadline(), None);
                }
                Some(Op::Shutdown) => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            sent, 250,
            "every byte before the shutdown (last credit {fwd})"
        );
    }

    #[test]
    fn data_before_the_guests_response_is_a_protocol_error() {
        let (mut c, _host) = pair();
        let r = c.on_guest(&guest(Op::Rw, 1, 100, 0), &[1], Instant::now());
        assert!(matches!(r, Err(ConnEnd::Unexpected(5))));
    }
}
