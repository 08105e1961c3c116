//! boxdesk's resolver inside a sandbox with a private network: the
//! `nameserver 127.0.0.1` of its `/etc/resolv.conf` ([`RESOLV_CONF`]),
//! served here on sockets the backend made in the sandbox's network
//! namespace ([`boxdesk_sandbox::Sandbox::dns_inside`]), UDP and TCP.
//!
//! What it answers: one question of class IN. A and AAAA for a name the
//! sandbox's [`Allowlist`] lists (on any port) get the host's resolver's
//! addresses of that family, as the host itself would resolve the name
//! (its `/etc/hosts`, systemd-resolved, NetworkManager: whatever the host
//! uses); other types of a listed name get an empty answer. A name the
//! allowlist does not list is NXDOMAIN, never asked of the host's
//! resolver: the names a sandbox may learn about, and leak through, are
//! the ones it may reach. The answers are only information: the sandbox's
//! one way out is still the proxy, which checks every address it connects
//! to.
//!
//! Limits: a query is read into a buffer of [`MAX_MESSAGE`] bytes (a TCP
//! length over it ends that connection before anything is allocated);
//! [`MAX_INFLIGHT`] lookups at once, more UDP queries are dropped (the
//! client retries); [`MAX_TCP`] TCP connections, each closed after
//! [`TCP_IDLE`] without a query; a lookup gets [`LOOKUP_TIMEOUT`], then
//! SERVFAIL. Malformed queries get FORMERR when they have an id to answer
//! to, nothing otherwise. Nothing a client sends can end the server.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use crate::allowlist::Allowlist;

/// The sandbox's `/etc/resolv.conf`: this resolver. TCP is fine too.
pub const RESOLV_CONF: &str = "# boxdesk: the sandbox's resolver (names its allowlist lists)\nnameserver 127.0.0.1\noptions edns0\n";
/// Largest query read, UDP or TCP.
pub const MAX_MESSAGE: usize = 4096;
/// Lookups in flight at once.
pub const MAX_INFLIGHT: usize = 64;
/// TCP connections at once.
pub const MAX_TCP: usize = 32;
/// A TCP connection's idle limit.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// How long the host's resolver gets.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// TTL of an answer, seconds: short, the host's answers change.
const TTL: u32 = 30;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;

/// Response codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Rcode {
    /// Answered.
    NoError = 0,
    /// The query could not be understood.
    FormErr = 1,
    /// The host's resolver failed or timed out.
    ServFail = 2,
    /// No such name (or one the sandbox may not learn about).
    NxDomain = 3,
    /// A kind of query this resolver does not answer.
    NotImp = 4,
}

/// Why a message is not a query this resolver answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// Fewer bytes than a header.
    #[error("a DNS message of {0} bytes, shorter than its 12-byte header")]
    Short(usize),
    /// A response, or an opcode other than QUERY.
    #[error("not a standard query")]
    NotQuery,
    /// Not exactly one question.
    #[error("{0} questions: one is answered")]
    Questions(u16),
    /// The question's name is cut short, compressed or too long.
    #[error("a malformed name in the question")]
    Name,
    /// The question ends before its type and class.
    #[error("the question ends before its type and class")]
    Truncated,
}

/// The one question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The query's id, echoed.
    pub id: u16,
    /// Recursion desired, echoed.
    pub rd: bool,
    /// The name, lowercase, dot-separated, no trailing dot.
    pub name: String,
    /// QTYPE.
    pub qtype: u16,
    /// QCLASS.
    pub qclass: u16,
    /// The question's bytes as sent (name, type, class), echoed.
    question: Vec<u8>,
}

/// Parses a query: header, then one question whose name is plain labels
/// (no compression pointer: a question has nothing to point back to).
/// What follows the question (an EDNS OPT record) is ignored.
pub fn parse(msg: &[u8]) -> Result<Query, DnsError> {
    let Some(header) = msg.get(..12) else {
        return Err(DnsError::Short(msg.len()));
    };
    let id = u16::from_be_bytes([header[0], header[1]]);
    let flags = u16::from_be_bytes([header[2], header[3]]);
    // QR (a response) or an opcode other than 0.
    if flags & 0xF800 != 0 {
        return Err(DnsError::NotQuery);
    }
    let qdcount = u16::from_be_bytes([header[4], header[5]]);
    if qdcount != 1 {
        return Err(DnsError::Questions(qdcount));
    }
    let mut i = 12;
    let mut name = String::new();
    loop {
        let len = usize::from(*msg.get(i).ok_or(DnsError::Name)?);
        if len == 0 {
            i += 1;
            break;
        }
        // 0xC0: a pointer; 0x40, 0x80: reserved label types.
        if len > 63 {
            return Err(DnsError::Name);
        }
        let label = msg.get(i + 1..i + 1 + len).ok_or(DnsError::Name)?;
        if !name.is_empty() {
            name.push('.');
        }
        for &b in label {
            // Hostname characters only: anything else is no name the
            // allowlist could list.
            if !(b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
                return Err(DnsError::Name);
            }
            name.push(char::from(b.to_ascii_lowercase()));
        }
        if name.len() > 253 {
            return Err(DnsError::Name);
        }
        i += 1 + len;
    }
    let tail = msg.get(i..i + 4).ok_or(DnsError::Truncated)?;
    Ok(Query {
        id,
        rd: flags & 0x0100 != 0,
        name,
        qtype: u16::from_be_bytes([tail[0], tail[1]]),
        qclass: u16::from_be_bytes([tail[2], tail[3]]),
        question: msg[12..i + 4].to_vec(),
    })
}

/// The response to `q`: `rcode`, and an answer record for each of
/// `addrs` (those of the question's family).
pub fn reply(q: &Query, rcode: Rcode, addrs: &[IpAddr]) -> Vec<u8> {
    let records: Vec<&IpAddr> = addrs
        .iter()
        .filter(|a| match a {
            IpAddr::V4(_) => q.qtype == TYPE_A,
            IpAddr::V6(_) => q.qtype == TYPE_AAAA,
        })
        .take(32)
        .collect();
    let mut out = Vec::with_capacity(12 + q.question.len() + records.len() * 28);
    out.extend_from_slice(&q.id.to_be_bytes());
    // QR, RD echoed, RA, the rcode.
    let flags = 0x8080 | if q.rd { 0x0100 } else { 0 } | rcode as u16;
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(records.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&q.question);
    for a in records {
        // The name: a pointer to the question's, at offset 12.
        out.extend_from_slice(&[0xC0, 12]);
        let (ty, data): (u16, Vec<u8>) = match a {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&ty.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&TTL.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&data);
    }
    out
}

/// FORMERR for a message with a header (its id echoed, no question).
fn format_error(msg: &[u8]) -> Option<Vec<u8>> {
    let id = msg.get(..2)?;
    // A response is never answered: two resolvers must not ping-pong.
    if msg.get(2).is_some_and(|f| f & 0x80 != 0) {
        return None;
    }
    let mut out = id.to_vec();
    out.extend_from_slice(&(0x8080u16 | Rcode::FormErr as u16).to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    Some(out)
}

/// How names become addresses: the host's resolver, or in tests a table.
#[derive(Clone)]
pub enum Lookup {
    /// The host's own resolver (getaddrinfo, on tokio's blocking pool).
    Host,
    /// A fixed table (tests).
    Table(Arc<Vec<(String, Vec<IpAddr>)>>),
}

impl Lookup {
    async fn addrs(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        match self {
            Lookup::Host => {
                let found =
                    tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((name, 0)))
                        .await
                        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
                let mut v: Vec<IpAddr> = Vec::new();
                for a in found {
                    if !v.contains(&a.ip()) {
                        v.push(a.ip());
                    }
                }
                Ok(v)
            }
            Lookup::Table(t) => t
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| a.clone())
                .ok_or_else(|| io::ErrorKind::NotFound.into()),
        }
    }
}

/// The response to `msg` under `allow`, or `None` when there is nothing
/// to answer (no header, or a response).
pub async fn answer(msg: &[u8], allow: &Allowlist, lookup: &Lookup) -> Option<Vec<u8>> {
    let q = match parse(msg) {
        Ok(q) => q,
        Err(DnsError::Short(_)) => return None,
        Err(DnsError::NotQuery) if msg[2] & 0x80 != 0 => return None,
        Err(_) => return format_error(msg),
    };
    if q.qclass != CLASS_IN {
        return Some(reply(&q, Rcode::NotImp, &[]));
    }
    if !allow.lists_name(&q.name) {
        return Some(reply(&q, Rcode::NxDomain, &[]));
    }
    if q.qtype != TYPE_A && q.qtype != TYPE_AAAA {
        return Some(reply(&q, Rcode::NoError, &[]));
    }
    match lookup.addrs(&q.name).await {
        Ok(addrs) => Some(reply(&q, Rcode::NoError, &addrs)),
        Err(e) if e.kind() == io::ErrorKind::TimedOut => Some(reply(&q, Rcode::ServFail, &[])),
        // getaddrinfo's "no such name" and "no address" both come as
        // errors without a kind worth telling apart.
        Err(_) => Some(reply(&q, Rcode::NxDomain, &[])),
    }
}

/// Serves `sockets` under `allow` until the task is aborted (the sandbox's
/// end).
pub async fn serve(
    sockets: boxdesk_sandbox::running::DnsSockets,
    allow: Arc<Allowlist>,
    lookup: Lookup,
) {
    let udp = match UdpSocket::from_std(sockets.udp) {
        Ok(s) => Arc::new(s),
        Err(e) => return tracing::warn!("the sandbox's resolver (UDP): {e}"),
    };
    let tcp = match TcpListener::from_std(sockets.tcp) {
        Ok(s) => s,
        Err(e) => return tracing::warn!("the sandbox's resolver (TCP): {e}"),
    };
    let inflight = Arc::new(Semaphore::new(MAX_INFLIGHT));
    let conns = Arc::new(Semaphore::new(MAX_TCP));
    let tcp_task = {
        let (allow, lookup, inflight) = (allow.clone(), lookup.clone(), inflight.clone());
        async move {
            loop {
                let Ok((stream, _)) = tcp.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                // Past the cap a connection is closed at once.
                let Ok(permit) = conns.clone().try_acquire_owned() else {
                    continue;
                };
                let (allow, lookup, inflight) = (allow.clone(), lookup.clone(), inflight.clone());
                tokio::spawn(async move {
                    let _ = serve_tcp(stream, &allow, &lookup, &inflight).await;
                    drop(permit);
                });
            }
        }
    };
    let udp_task = async move {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let Ok((n, peer)) = udp.recv_from(&mut buf).await else {
                continue;
            };
            let Ok(permit) = inflight.clone().try_acquire_owned() else {
                continue;
            };
            let msg = buf[..n].to_vec();
            let (udp, allow, lookup) = (udp.clone(), allow.clone(), lookup.clone());
            tokio::spawn(async move {
                if let Some(mut r) = answer(&msg, &allow, &lookup).await {
                    // Over 512 bytes without EDNS: cut to the header and
                    // question with TC set, the client retries over TCP.
                    if r.len() > 512 {
                        r = truncated(r);
                    }
                    let _ = udp.send_to(&r, peer).await;
                }
                drop(permit);
            });
        }
    };
    tokio::join!(tcp_task, udp_task);
}

/// A response cut to its header and question, TC set, no answers.
fn truncated(mut r: Vec<u8>) -> Vec<u8> {
    if let Ok(q) = parse_question_len(&r) {
        r.truncate(q);
        r[2] |= 0x02;
        r[6] = 0;
        r[7] = 0;
    }
    r
}

/// The length of a message's header and question.
fn parse_question_len(msg: &[u8]) -> Result<usize, DnsError> {
    let mut q = msg.to_vec();
    // Parse it as a query (clear QR) to find the question's end.
    if let Some(f) = q.get_mut(2) {
        *f &= 0x7F;
    }
    parse(&q).map(|p| 12 + p.question.len())
}

/// One TCP connection: length-prefixed queries, one at a time.
async fn serve_tcp(
    mut s: TcpStream,
    allow: &Allowlist,
    lookup: &Lookup,
    inflight: &Semaphore,
) -> io::Result<()> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, s.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let len = usize::from(u16::from_be_bytes(len));
        if len > MAX_MESSAGE {
            return Ok(());
        }
        tokio::time::timeout(TCP_IDLE, s.read_exact(&mut buf[..len]))
            .await
            .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
        let _permit = inflight.acquire().await.map_err(io::Error::other)?;
        let Some(r) = answer(&buf[..len], allow, lookup).await else {
            return Ok(());
        };
        let mut out = Vec::with_capacity(2 + r.len());
        out.extend_from_slice(&(r.len() as u16).to_be_bytes());
        out.extend_from_slice(&r);
        s.write_all(&out).await?;
    }
}

#[cfg(test)]
mod tests;
