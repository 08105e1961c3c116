//! Host-side egress proxy for sandboxes.
//!
//! Sandboxed processes see `HTTP(S)_PROXY=http://127.0.0.1:<port>`; that listener lives in the
//! sandbox's network namespace but is served here, on the host, which makes the outbound
//! connections. This module owns the per-connection proxy protocol (`CONNECT` tunnels and
//! absolute-form plain HTTP), resolving and connecting, and reachability [`probe`]s; what is
//! allowed is [`Allowlist`]'s to say ([`super::allowlist`]).
//!
//! A request is refused (403) unless the allowlist names its host and port. A name is then
//! resolved once, every address is checked with [`Allowlist::may_lead_to`], and the
//! connection goes to exactly an address that passed, never through a second lookup: no DNS
//! answer can turn a public name into a LAN, loopback or cloud-metadata hop.
//!
//! It must never connect to a host or port the allowlist does not name, never connect to an
//! address it did not check, never size a buffer from a client-supplied length, and never log
//! header values or request paths (they may carry tokens).
//!
//! Nor may a sandbox spend the server's descriptors (two a tunnel): each sandbox's proxy holds
//! at most [`Limits::per_sandbox`] connections and all of them together at most [`total_cap`],
//! which keeps headroom for the app's own socket; a client past either gets `503` at once. A
//! tunnel with nothing moving either way for [`Limits::idle`] is closed, and so is one whose
//! one side closed [`Limits::half_closed`] ago while the other kept it open.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{lookup_host, TcpListener, TcpStream, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};
use tracing::debug;

pub use super::allowlist::Allowlist;
use super::allowlist::{parse_host, Host};
use super::logged;

const MAX_HEAD: usize = 16 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const BAD: &str = "400 Bad Request";
const FORBIDDEN: &str = "403 Forbidden";
const TOO_LARGE: &str = "431 Request Header Fields Too Large";
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";
/// Hop-by-hop and proxy headers not forwarded in plain HTTP (`Host` is rewritten from the URL).
const DROPPED: &str = "proxy-connection proxy-authorization connection keep-alive host";
const BUSY: &str = "too many connections through the sandbox's proxy\n";

/// How much a proxy holds, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections one sandbox's proxy serves at once.
    pub per_sandbox: usize,
    /// A tunnel with no byte moving either way this long is closed.
    pub idle: Duration,
    /// Once one side of a tunnel has closed, how long the other may keep it.
    pub half_closed: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_sandbox: 256,
            // Streamed API replies send a ping every few seconds; a quarter
            // of an hour of silence is a connection nobody uses.
            idle: Duration::from_secs(15 * 60),
            half_closed: Duration::from_secs(30),
        }
    }
}

/// Descriptors kept free of proxy connections: the app's socket, the
/// sandboxes' agents and logs, the server's own files.
const FD_HEADROOM: u64 = 512;

/// Proxy connections all sandboxes of this server may hold together: half
/// of what the open-file limit leaves past [`FD_HEADROOM`] (a tunnel holds
/// two descriptors), at least 16, at most 4096.
pub fn total_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    (soft.saturating_sub(FD_HEADROOM) / 2).clamp(16, 4096) as usize
}

/// The permits of [`total_cap`], shared by every proxy of this process.
fn total() -> Arc<Semaphore> {
    static TOTAL: OnceLock<Arc<Semaphore>> = OnceLock::new();
    Arc::clone(TOTAL.get_or_init(|| Arc::new(Semaphore::new(total_cap()))))
}

/// Status line and body a connection is answered with before it is closed.
type Refusal = (&'static str, String);

/// Errors from reaching an upstream host.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Not an `http://` or `https://` URL with a valid host (the URL is not echoed: it may
    /// carry secrets).
    #[error("invalid url")]
    InvalidUrl,
    /// A listed name resolved only to private, local or other non-public addresses that no
    /// IP/CIDR entry allows.
    #[error("host resolves only to private or local addresses")]
    PrivateAddress,
    /// Resolve plus connect did not finish in time.
    #[error("timed out")]
    Timeout,
    /// Name resolution or TCP connect failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// How names become addresses: the system's resolver, or in tests a fixed table.
#[derive(Debug, Clone, Default)]
enum Resolver {
    #[default]
    System,
    #[cfg(test)]
    Fixed(Arc<std::collections::HashMap<String, Vec<IpAddr>>>),
}

impl Resolver {
    async fn resolve(&self, name: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        match self {
            Resolver::System => Ok(lookup_host((name, port)).await?.collect()),
            #[cfg(test)]
            Resolver::Fixed(table) => Ok(table
                .get(name)
                .ok_or(std::io::ErrorKind::NotFound)?
                .iter()
                .map(|ip| SocketAddr::new(*ip, port))
                .collect()),
        }
    }
}

/// Result of [`probe`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reachability {
    /// Allowed, resolved, and a TCP connection succeeded.
    Reachable,
    /// Allowed, but resolve or connect failed; the reason is a short message.
    Unreachable(String),
    /// The allowlist refuses the host, its port, or every address it resolved to.
    Blocked,
}

impl Reachability {
    /// `"reachable"`, `"unreachable"` or `"blocked"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Reachable => "reachable",
            Self::Unreachable(_) => "unreachable",
            Self::Blocked => "blocked",
        }
    }
}

/// Where the proxy's clients come from: a listener in the sandbox's own
/// network namespace, or the Unix socket a VM's relay hands them to
/// (`boxdesk_sandbox::running::InsideListener`, registered with tokio).
#[derive(Debug)]
pub enum Listener {
    /// TCP connections.
    Tcp(TcpListener),
    /// Unix-socket connections (relayed from inside a VM).
    Unix(UnixListener),
}

impl Listener {
    /// Registers a sandbox's listener with the running tokio runtime.
    pub fn from_inside(l: boxdesk_sandbox::running::InsideListener) -> std::io::Result<Self> {
        use boxdesk_sandbox::running::InsideListener;
        Ok(match l {
            InsideListener::Tcp(l) => {
                l.set_nonblocking(true)?;
                Listener::Tcp(TcpListener::from_std(l)?)
            }
            InsideListener::Unix(l) => {
                l.set_nonblocking(true)?;
                Listener::Unix(UnixListener::from_std(l)?)
            }
        })
    }
}

/// One accepted client.
enum Client {
    Tcp(TcpStream),
    Unix(tokio::net::UnixStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Client> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Client::Tcp(s)),
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Client::Unix(s)),
        }
    }
}

/// Serves proxy connections accepted on `listener` until the returned future is dropped; each
/// connection is its own task; one bad client never affects another. Dropping the future also
/// aborts the connections it is still serving.
pub async fn serve(listener: Listener, allow: Arc<Allowlist>) {
    let limits = Limits::default();
    serve_using(listener, allow, Resolver::System, limits, total()).await;
}

async fn serve_using(
    listener: Listener,
    allow: Arc<Allowlist>,
    resolver: Resolver,
    limits: Limits,
    total: Arc<Semaphore>,
) {
    let mut conns = JoinSet::new();
    let mine = Arc::new(Semaphore::new(limits.per_sandbox));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(client) => {
                    let permits = Arc::clone(&mine)
                        .try_acquire_owned()
                        .and_then(|a| Ok((a, Arc::clone(&total).try_acquire_owned()?)));
                    let Ok(permits) = permits else {
                        debug!("sandbox proxy at its connection cap: 503");
                        conns.spawn(async move {
                            match client {
                                Client::Tcp(s) => busy(s).await,
                                Client::Unix(s) => busy(s).await,
                            }
                        });
                        continue;
                    };
                    let (allow, resolver) = (Arc::clone(&allow), resolver.clone());
                    conns.spawn(async move {
                        let _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit) = permits;
                        match client {
                            Client::Tcp(s) => handle(s, &allow, &resolver, &limits).await,
                            Client::Unix(s) => handle(s, &allow, &resolver, &limits).await,
                        }
                    });
                }
                Err(e) => {
                    // e.g. EMFILE: back off instead of spinning.
                    debug!(error = %e, "sandbox proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// Whether `url` (http:// or https://, default ports 80/443) can be reached through the
/// proxy's rules: refused by the allowlist (if `allow` is Some), by port, or because every
/// address the name resolved to is refused -> [`Reachability::Blocked`]; else resolve + TCP
/// connect with a 5 s timeout -> Reachable or Unreachable(reason). Without an allowlist every
/// address may be reached. A bad URL is an error.
pub async fn probe(url: &str, allow: Option<&Allowlist>) -> Result<Reachability, ProxyError> {
    let target = parse_url(url).ok_or(ProxyError::InvalidUrl)?;
    let host = parse_host(target.host).ok_or(ProxyError::InvalidUrl)?;
    if allow.is_some_and(|a| !a.permits(&host, target.port)) {
        return Ok(Reachability::Blocked);
    }
    let reached =
        connect_upstream(&host, target.port, allow, &Resolver::System, PROBE_TIMEOUT).await;
    Ok(match reached {
        Ok(_) => Reachability::Reachable,
        Err(ProxyError::PrivateAddress) => Reachability::Blocked,
        Err(e) => Reachability::Unreachable(e.to_string()),
    })
}

/// Tells a client past the cap so, at once, and closes.
async fn busy<S: AsyncWrite + Unpin>(mut client: S) {
    let msg = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{BUSY}",
        BUSY.len()
    );
    let _ = timeout(Duration::from_millis(100), client.write_all(msg.as_bytes())).await;
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    mut client: S,
    allow: &Allowlist,
    resolver: &Resolver,
    limits: &Limits,
) {
    if let Err((status, body)) = proxy_one(&mut client, allow, resolver, limits).await {
        reply(client, status, &body).await;
    }
}

/// Serves one connection; `Err` is the status line and body to answer with before closing.
async fn proxy_one<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    allow: &Allowlist,
    resolver: &Resolver,
    limits: &Limits,
) -> Result<(), Refusal> {
    let refuse = |status, body: &str| Err((status, body.to_owned()));
    let (buf, end) = match timeout(HEAD_TIMEOUT, read_head(client)).await {
        Err(_) => return refuse("408 Request Timeout", "request head timed out\n"),
        Ok(head) => match head? {
            Some(head) => head,
            None => return Ok(()),
        },
    };
    let Some(req) = parse_head(&buf[..end + 2]) else {
        return refuse(BAD, "malformed request\n");
    };
    let rest = buf.get(end + 4..).unwrap_or_default();
    let target = (req.method != "CONNECT").then(|| parse_url(req.target).filter(|t| !t.https));
    let (raw_host, port) = match &target {
        None => parse_authority(req.target, None).ok_or((BAD, "bad connect target\n".into()))?,
        Some(Some(t)) => (t.host, t.port),
        Some(None) => return refuse(BAD, "not a proxy request\n"),
    };
    let shown = logged(raw_host);
    let Some(host) = parse_host(raw_host).filter(|h| allow.permits(h, port)) else {
        debug!(host = %shown, port, decision = "blocked", "sandbox proxy");
        let listed = parse_host(raw_host).is_some_and(|h| allow.lists(&h));
        let body = if listed {
            format!("port {port} of host {raw_host} is not allowed by the sandbox proxy\n")
        } else {
            format!("host {raw_host} is not allowed by the sandbox proxy\n")
        };
        return Err((FORBIDDEN, body));
    };
    debug!(host = %shown, port, decision = "allowed", "sandbox proxy");
    let mut upstream = match connect_upstream(&host, port, Some(allow), resolver, CONNECT_TIMEOUT)
        .await
    {
        Ok(s) => s,
        Err(ProxyError::PrivateAddress) => {
            debug!(host = %shown, port, decision = "blocked: private address", "sandbox proxy");
            let body = format!("host {raw_host} resolves only to private or local addresses, which the sandbox proxy does not allow for a name\n");
            return Err((FORBIDDEN, body));
        }
        Err(e) => {
            debug!(host = %shown, port, error = %logged(e), "sandbox proxy upstream failed");
            return refuse("502 Bad Gateway", "upstream connect failed\n");
        }
    };
    let relayed = async {
        if let Some(Some(t)) = &target {
            upstream
                .write_all(&rewrite_origin_form(&req, t, rest))
                .await?;
        } else {
            client.write_all(ESTABLISHED).await?;
            upstream.write_all(rest).await?;
        }
        relay(client, &mut upstream, limits).await
    };
    if let Err(e) = relayed.await {
        debug!(host = %shown, error = %e, "sandbox proxy relay ended with error");
    }
    Ok(())
}

/// Copies both ways until both sides have closed, or one closed
/// `limits.half_closed` ago while the other kept going, or nothing moved
/// either way for `limits.idle`. A side's end is passed on as a shutdown of
/// the other's writing half.
async fn relay<A, B>(a: &mut A, b: &mut B, limits: &Limits) -> std::io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    // When a byte last moved, in milliseconds from `start`.
    let moved = AtomicU64::new(0);
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = pump(&mut ar, &mut bw, &moved, start);
    let down = pump(&mut br, &mut aw, &moved, start);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done, mut one_closed) = (false, false, None);
    loop {
        let last = start + Duration::from_millis(moved.load(Ordering::Relaxed));
        let mut deadline = last + limits.idle;
        if let Some(at) = one_closed {
            deadline = deadline.min(at + limits.half_closed);
        }
        if Instant::now() >= deadline {
            return Ok(());
        }
        tokio::select! {
            r = &mut up, if !up_done => {
                r?;
                up_done = true;
                one_closed.get_or_insert_with(Instant::now);
            }
            r = &mut down, if !down_done => {
                r?;
                down_done = true;
                one_closed.get_or_insert_with(Instant::now);
            }
            () = tokio::time::sleep_until(deadline) => {}
        }
        if up_done && down_done {
            return Ok(());
        }
    }
}

/// Copies `r` to `w` until `r` ends, then shuts `w`'s writing down;
/// records each move in `moved` (milliseconds from `start`).
async fn pump<R, W>(r: &mut R, w: &mut W, moved: &AtomicU64, start: Instant) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return w.shutdown().await;
        }
        w.write_all(&buf[..n]).await?;
        let ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        moved.store(ms, Ordering::Relaxed);
    }
}

/// Reads through the blank line, keeping at most `MAX_HEAD` plus one read. Returns the buffer
/// (which may hold bytes past the head) and the index of its `\r\n\r\n`; `None` if the client
/// closed or failed before sending anything.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Result<Option<(Vec<u8>, usize)>, Refusal> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = match s.read(&mut chunk).await {
            Ok(0) | Err(_) if buf.is_empty() => return Ok(None),
            Ok(0) | Err(_) => return Err((BAD, "incomplete request head\n".into())),
            Ok(n) => n,
        };
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        // A terminator past the cap leaves `buf` over the cap too, so the second arm catches it.
        match buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            Some(i) if from + i + 4 <= MAX_HEAD => return Ok(Some((buf, from + i))),
            _ if buf.len() >= MAX_HEAD => {
                return Err((TOO_LARGE, "request head too large\n".into()))
            }
            _ => {}
        }
    }
}

struct Request<'a> {
    method: &'a str,
    target: &'a str,
    version: &'a str,
    headers: Vec<&'a [u8]>,
}

/// Parses a head whose every line ends in CRLF (final blank line excluded). Strict: bare CR or
/// LF, obs-folding, non-token header names and a non-ASCII request line are refused.
fn parse_head(head: &[u8]) -> Option<Request<'_>> {
    let mut lines = Vec::new();
    let mut rest = head;
    while let Some(i) = rest.iter().position(|&b| b == b'\n') {
        let line = rest[..i]
            .strip_suffix(b"\r")
            .filter(|l| !l.contains(&b'\r'))?;
        let name = line.split(|&b| b == b':').next().unwrap_or_default();
        if !lines.is_empty() && (name.len() == line.len() || !is_token(name)) {
            return None;
        }
        lines.push(line);
        rest = &rest[i + 1..];
    }
    let (first, headers) = lines.split_first()?;
    if !first.iter().all(|&b| b.is_ascii_graphic() || b == b' ') {
        return None;
    }
    let mut parts = std::str::from_utf8(first).ok()?.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = matches!(version, "HTTP/1.1" | "HTTP/1.0") && is_token(method.as_bytes());
    let headers = headers.to_vec();
    (ok && !target.is_empty() && parts.next().is_none()).then_some(Request {
        method,
        target,
        version,
        headers,
    })
}

fn is_token(s: &[u8]) -> bool {
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    !s.is_empty() && s.iter().all(tchar)
}

struct Target<'a> {
    https: bool,
    authority: &'a str,
    host: &'a str,
    port: u16,
    path: &'a str,
}

/// Splits `http[s]://authority[/path][?query]`; userinfo and empty hosts are refused.
fn parse_url(url: &str) -> Option<Target<'_>> {
    // Slicing is safe: both arms matched an ASCII prefix of that length.
    let (https, rest) = match url.get(..8).unwrap_or(url).to_ascii_lowercase() {
        s if s.starts_with("http://") => (false, &url[7..]),
        s if s == "https://" => (true, &url[8..]),
        _ => return None,
    };
    let (authority, path) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    if authority.contains('@') {
        return None;
    }
    let (host, port) = parse_authority(authority, Some(if https { 443 } else { 80 }))?;
    let path = path.split('#').next().unwrap_or_default();
    Some(Target {
        https,
        authority,
        host,
        port,
        path,
    })
}

/// `host:port` or `[v6]:port`, the port optional when a default is given. The returned host
/// has no brackets.
fn parse_authority(s: &str, default_port: Option<u16>) -> Option<(&str, u16)> {
    let (host, port) = match s.strip_prefix('[') {
        Some(r) => {
            let (h, after) = r.split_once(']')?;
            h.parse::<Ipv6Addr>().ok()?;
            let port = match after {
                "" => None,
                a => Some(a.strip_prefix(':')?),
            };
            (h, port)
        }
        None => s.split_once(':').map_or((s, None), |(h, p)| (h, Some(p))),
    };
    let port = match port {
        None => default_port?,
        Some(p) if p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
        Some(_) => return None,
    };
    (!host.is_empty() && port != 0).then_some((host, port))
}

/// Origin-form request line, `Host` from the URL (RFC 9112 §3.2.2), the client's headers minus
/// proxy and connection-management ones, `Connection: close`, then any body bytes read.
fn rewrite_origin_form(req: &Request<'_>, t: &Target<'_>, rest: &[u8]) -> Vec<u8> {
    let slash = if t.path.starts_with('/') { "" } else { "/" };
    let (method, path, version, authority) = (req.method, t.path, req.version, t.authority);
    let mut out = format!("{method} {slash}{path} {version}\r\nHost: {authority}\r\n").into_bytes();
    for h in &req.headers {
        let name = h.split(|&b| b == b':').next().unwrap_or_default();
        if !DROPPED
            .split(' ')
            .any(|d| d.as_bytes().eq_ignore_ascii_case(name))
        {
            out.extend_from_slice(h);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(rest);
    out
}
/// Whether a name may lead to `ip` on `port`: anything without an allowlist (a probe for the
/// host network), else what [`Allowlist::may_lead_to`] says.
fn address_allowed(ip: IpAddr, port: u16, allow: Option<&Allowlist>) -> bool {
    allow.is_none_or(|a| a.may_lead_to(ip, port))
}

/// Connects to `host` within `limit`: an IP directly (the rules already allowed it); a name
/// resolved once, each address checked by [`address_allowed`], then the first checked
/// address that accepts — the very addresses checked, never a second lookup.
async fn connect_upstream(
    host: &Host,
    port: u16,
    allow: Option<&Allowlist>,
    resolver: &Resolver,
    limit: Duration,
) -> Result<TcpStream, ProxyError> {
    let attempt = async {
        let addrs = match host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
            Host::Name(name) => resolver.resolve(name, port).await?,
        };
        let (mut last, mut refused) = (None, false);
        for addr in addrs {
            if matches!(host, Host::Name(_)) && !address_allowed(addr.ip(), port, allow) {
                refused = true;
                continue;
            }
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(match last {
            Some(e) => e.into(),
            None if refused => ProxyError::PrivateAddress,
            None => ProxyError::Io(std::io::ErrorKind::NotFound.into()),
        })
    };
    timeout(limit, attempt)
        .await
        .unwrap_or(Err(ProxyError::Timeout))
}

/// Sends a short text response and half-closes, then briefly drains what the client still
/// sends so the close does not become a reset that eats the response.
async fn reply<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, status: &str, body: &str) {
    let len = body.len();
    // A refusal by the rules says so in a header a client can test for.
    let why = if status == FORBIDDEN {
        "X-Proxy-Error: blocked-by-allowlist\r\n"
    } else {
        ""
    };
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{why}Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
    );
    if s.write_all(msg.as_bytes()).await.is_ok() && s.shutdown().await.is_ok() {
        let mut sink = [0u8; 4096];
        let drain = async { while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {} };
        let _ = timeout(Duration::from_secs(1), drain).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
    const SECS_5: Duration = Duration::from_secs(5);

    async fn local_listener() -> std::io::Result<(TcpListener, u16)> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let port = l.local_addr()?.port();
        Ok((l, port))
    }

    /// A proxy for `entries` on its own port, and a client connected to it.
    async fn proxied<S: AsRef<str>>(entries: &[S]) -> std::io::Result<TcpStream> {
        proxied_with(entries, Resolver::System).await
    }

    /// [`proxied`] resolving names with `resolver`.
    async fn proxied_with<S: AsRef<str>>(
        entries: &[S],
        resolver: Resolver,
    ) -> std::io::Result<TcpStream> {
        let (listener, port) = local_listener().await?;
        let allow = Allowlist::new(entries).map_err(std::io::Error::other)?;
        tokio::spawn(serve_using(
            Listener::Tcp(listener),
            Arc::new(allow),
            resolver,
            Limits::default(),
            Arc::new(Semaphore::new(1024)),
        ));
        TcpStream::connect(("127.0.0.1", port)).await
    }

    /// A proxy allowing `127.0.0.1:port` with `limits` and `total` permits,
    /// on its own port.
    async fn limited(port: u16, limits: Limits, total: usize) -> std::io::Result<u16> {
        let (listener, proxy_port) = local_listener().await?;
        let allow =
            Allowlist::new(&[format!("127.0.0.1:{port}")]).map_err(std::io::Error::other)?;
        tokio::spawn(serve_using(
            Listener::Tcp(listener),
            Arc::new(allow),
            Resolver::System,
            limits,
            Arc::new(Semaphore::new(total)),
        ));
        Ok(proxy_port)
    }

    /// A tunnel through the proxy at `proxy` to `127.0.0.1:port`,
    /// established.
    async fn tunnel(proxy: u16, port: u16) -> R<TcpStream> {
        let mut c = TcpStream::connect(("127.0.0.1", proxy)).await?;
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await?;
        let head = read_head_text(&mut c).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        Ok(c)
    }

    /// A server that accepts and holds every connection, never writing or
    /// closing; each accepted stream goes to the returned channel.
    async fn holder() -> R<(u16, tokio::sync::mpsc::UnboundedReceiver<TcpStream>)> {
        let (l, port) = local_listener().await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                if tx.send(s).is_err() {
                    break;
                }
            }
        });
        Ok((port, rx))
    }

    /// A tunnel through a proxy with `limits` to a server that holds it,
    /// and that server's end of it.
    async fn tunnel_with(limits: Limits) -> R<(TcpStream, TcpStream)> {
        let (port, mut held) = holder().await?;
        let proxy = limited(port, limits, 100).await?;
        let c = tunnel(proxy, port).await?;
        let upstream = held.recv().await.ok_or("no upstream")?;
        Ok((c, upstream))
    }

    #[tokio::test]
    async fn past_its_cap_a_sandboxs_proxy_answers_503_at_once_and_serves_again_when_one_ends() -> R
    {
        let (port, _held) = holder().await?;
        // (a client's end holds its slot until the upstream ends too, or
        // for the half-close limit)
        let limits = Limits {
            per_sandbox: 2,
            half_closed: Duration::from_millis(200),
            ..Limits::default()
        };
        let proxy = limited(port, limits, 100).await?;
        let first = tunnel(proxy, port).await?;
        let _second = tunnel(proxy, port).await?;
        let mut third = TcpStream::connect(("127.0.0.1", proxy)).await?;
        let mut resp = String::new();
        timeout(SECS_5, third.read_to_string(&mut resp)).await??;
        assert!(
            resp.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{resp}"
        );
        assert!(resp.ends_with("too many connections through the sandbox's proxy\n"));
        drop(first);
        // The permit comes back once the proxy has seen the end.
        let deadline = Instant::now() + SECS_5;
        loop {
            let mut c = TcpStream::connect(("127.0.0.1", proxy)).await?;
            c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
                .await?;
            if read_head_text(&mut c).await?.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(Instant::now() < deadline, "no room came back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    #[tokio::test]
    async fn the_servers_total_cap_holds_across_sandboxes() -> R {
        let (port, _held) = holder().await?;
        let total = Arc::new(Semaphore::new(1));
        let mut proxies = Vec::new();
        for _ in 0..2 {
            let (listener, p) = local_listener().await?;
            let allow = Allowlist::new(&[format!("127.0.0.1:{port}")])?;
            tokio::spawn(serve_using(
                Listener::Tcp(listener),
                Arc::new(allow),
                Resolver::System,
                Limits::default(),
                Arc::clone(&total),
            ));
            proxies.push(p);
        }
        let _one = tunnel(proxies[0], port).await?;
        let mut other = TcpStream::connect(("127.0.0.1", proxies[1])).await?;
        let mut resp = String::new();
        timeout(SECS_5, other.read_to_string(&mut resp)).await??;
        assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
        Ok(())
    }

    #[test]
    fn the_total_cap_keeps_headroom_under_the_open_file_limit() {
        let cap = total_cap() as u64;
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert!((16..=4096).contains(&cap), "{cap}");
        assert!(
            cap == 16 || 2 * cap + FD_HEADROOM <= soft,
            "{cap} of {soft}"
        );
    }

    #[tokio::test]
    async fn a_tunnel_with_nothing_moving_past_the_idle_limit_is_closed() -> R {
        let (mut c, mut upstream) = tunnel_with(Limits {
            idle: Duration::from_millis(300),
            ..Limits::default()
        })
        .await?;
        // Bytes moving keep it open past the limit...
        for _ in 0..4 {
            c.write_all(b"x").await?;
            let mut one = [0u8; 1];
            timeout(SECS_5, upstream.read_exact(&mut one)).await??;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        // ...silence closes both sides.
        let mut rest = Vec::new();
        timeout(SECS_5, c.read_to_end(&mut rest)).await??;
        assert!(rest.is_empty());
        let n = timeout(SECS_5, upstream.read(&mut [0u8; 1])).await??;
        assert_eq!(n, 0, "upstream still connected");
        Ok(())
    }

    #[tokio::test]
    async fn a_tunnel_whose_client_closed_is_gone_after_the_half_close_limit_though_upstream_stays(
    ) -> R {
        let (mut c, mut upstream) = tunnel_with(Limits {
            half_closed: Duration::from_millis(300),
            ..Limits::default()
        })
        .await?;
        c.shutdown().await?;
        // The end is passed on...
        let n = timeout(SECS_5, upstream.read(&mut [0u8; 1])).await??;
        assert_eq!(n, 0);
        // ...and the upstream, which never closes, does not keep the tunnel:
        // the client sees its end, though nothing was idle long.
        let mut rest = Vec::new();
        timeout(SECS_5, c.read_to_end(&mut rest)).await??;
        assert!(rest.is_empty());
        Ok(())
    }

    /// A resolver answering only for `name`, with `ips` in this order.
    fn fixed(name: &str, ips: &[&str]) -> R<Resolver> {
        let ips = ips.iter().map(|ip| ip.parse()).collect::<Result<_, _>>()?;
        Ok(Resolver::Fixed(Arc::new([(name.to_owned(), ips)].into())))
    }

    /// Sends `request` and reads the reply until the proxy closes.
    async fn exchange(c: &mut TcpStream, request: impl AsRef<[u8]>) -> R<String> {
        c.write_all(request.as_ref()).await?;
        let mut resp = String::new();
        timeout(SECS_5, c.read_to_string(&mut resp)).await??;
        Ok(resp)
    }

    /// Reads until the end of a head; returns everything read so far.
    async fn read_head_text(s: &mut TcpStream) -> R<String> {
        let (mut buf, mut chunk) = (Vec::new(), [0u8; 1024]);
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = timeout(SECS_5, s.read(&mut chunk)).await??;
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8(buf)?)
    }

    /// Whether `listener` accepts a connection within 200 ms.
    async fn was_reached(listener: &TcpListener) -> bool {
        timeout(Duration::from_millis(200), listener.accept())
            .await
            .is_ok()
    }

    #[test]
    fn authorities_parse_bracketed_ipv6_and_reject_bad_ports() {
        assert_eq!(parse_authority("[::1]:443", None), Some(("::1", 443)));
        assert_eq!(parse_authority("[::1]", Some(80)), Some(("::1", 80)));
        assert_eq!(parse_authority("Ex.com:8443", None), Some(("Ex.com", 8443)));
        for bad in "::1:443 example.com x:0 x:65536 x:+80 [nope]:1 :443 [::1]x".split(' ') {
            assert_eq!(parse_authority(bad, None), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn connect_to_an_allowed_host_round_trips_bytes_both_ways() -> R {
        let (echo, port) = local_listener().await?;
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await?;
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await
        });
        let mut c = proxied(&[format!("127.0.0.1:{port}")]).await?;
        // Bytes sent right after the head must be forwarded too.
        let req = format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\nearly-");
        c.write_all(req.as_bytes()).await?;
        let head = read_head_text(&mut c).await?;
        let after = head.strip_prefix("HTTP/1.1 200 Connection Established\r\n\r\n");
        let mut got = after.ok_or(head.clone())?.as_bytes().to_vec();
        c.write_all(b"ping").await?;
        c.shutdown().await?;
        timeout(SECS_5, c.read_to_end(&mut got)).await??;
        assert_eq!(got, b"early-ping");
        Ok(())
    }

    #[tokio::test]
    async fn connect_to_an_unlisted_host_gets_403_and_no_connection_is_made() -> R {
        let (target, port) = local_listener().await?;
        let mut c = proxied(&["localhost"]).await?;
        let resp = exchange(&mut c, format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await?;
        assert!(resp.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{resp}");
        assert!(resp.ends_with("host 127.0.0.1 is not allowed by the sandbox proxy\n"));
        assert!(!was_reached(&target).await);
        Ok(())
    }

    #[tokio::test]
    async fn a_listed_host_on_an_unlisted_port_gets_403_and_no_connection_is_made() -> R {
        let (target, port) = local_listener().await?;
        let mut c = proxied(&["127.0.0.1"]).await?;
        let resp = exchange(&mut c, format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n")).await?;
        assert!(resp.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{resp}");
        let why = format!("port {port} of host 127.0.0.1 is not allowed by the sandbox proxy\n");
        assert!(resp.ends_with(&why), "{resp}");
        assert!(!was_reached(&target).await);
        Ok(())
    }

    #[tokio::test]
    async fn a_listed_name_resolving_to_loopback_gets_403_and_no_connection_is_made() -> R {
        let (target, port) = local_listener().await?;
        // The system resolver: localhost is 127.0.0.1 (and ::1) on every Linux.
        let mut c = proxied(&[format!("localhost:{port}")]).await?;
        let resp = exchange(&mut c, format!("CONNECT localhost:{port} HTTP/1.1\r\n\r\n")).await?;
        assert!(resp.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{resp}");
        assert!(
            resp.contains("resolves only to private or local addresses"),
            "{resp}"
        );
        assert!(!was_reached(&target).await);
        // Plain HTTP goes through the same check.
        let mut c = proxied(&[format!("localhost:{port}")]).await?;
        let req = format!("GET http://localhost:{port}/ HTTP/1.1\r\n\r\n");
        let resp = exchange(&mut c, req).await?;
        assert!(resp.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{resp}");
        assert!(!was_reached(&target).await);
        Ok(())
    }

    #[tokio::test]
    async fn a_public_looking_name_answered_with_lan_addresses_gets_403() -> R {
        for ip in [
            "10.0.0.7",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "fd00::1",
        ] {
            let resolver = fixed("api.example.com", &[ip])?;
            let mut c = proxied_with(&["api.example.com"], resolver).await?;
            let resp = exchange(&mut c, "CONNECT api.example.com:443 HTTP/1.1\r\n\r\n").await?;
            assert!(
                resp.starts_with("HTTP/1.1 403 Forbidden\r\n"),
                "{ip}: {resp}"
            );
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_name_goes_only_to_a_checked_address_and_one_an_ip_entry_allows_is_fine() -> R {
        // Two listeners on one port: 127.0.0.2 is loopback that no entry allows, 127.0.0.1
        // is listed. The name resolves to the forbidden one first.
        let (allowed, port) = local_listener().await?;
        let Ok(forbidden) = TcpListener::bind(("127.0.0.2", port)).await else {
            println!("skipped: cannot bind 127.0.0.2:{port}");
            return Ok(());
        };
        let resolver = fixed("lan.example.com", &["127.0.0.2", "127.0.0.1"])?;
        let entries = [
            format!("lan.example.com:{port}"),
            format!("127.0.0.1:{port}"),
        ];
        let mut c = proxied_with(&entries, resolver).await?;
        let req = format!("CONNECT lan.example.com:{port} HTTP/1.1\r\n\r\n");
        c.write_all(req.as_bytes()).await?;
        let head = read_head_text(&mut c).await?;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        assert!(
            was_reached(&allowed).await,
            "the listed address was not reached"
        );
        assert!(
            !was_reached(&forbidden).await,
            "an unchecked address was reached"
        );
        Ok(())
    }

    #[tokio::test]
    async fn absolute_form_get_arrives_in_origin_form_without_proxy_headers() -> R {
        let (stub, port) = local_listener().await?;
        let stub = tokio::spawn(async move {
            let (mut s, _) = stub.accept().await?;
            let head = read_head_text(&mut s).await?;
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .await?;
            R::Ok(head)
        });
        let req = format!(
            "GET http://127.0.0.1:{port}/v1/x?q=1 HTTP/1.1\r\nHost: elsewhere.example\r\n\
             Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic c2VjcmV0\r\n\
             User-Agent: t\r\nConnection: keep-alive\r\n\r\n"
        );
        let entry = format!("127.0.0.1:{port}");
        let resp = exchange(&mut proxied(&[entry]).await?, req).await?;
        assert!(resp.starts_with("HTTP/1.1 200 OK\r\n") && resp.ends_with("\r\n\r\nok"));
        let host = format!("Host: 127.0.0.1:{port}");
        let want = format!(
            "GET /v1/x?q=1 HTTP/1.1\r\n{host}\r\nUser-Agent: t\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(stub.await??, want);
        Ok(())
    }

    #[tokio::test]
    async fn a_head_over_16_kib_gets_431() -> R {
        let mut c = proxied(&["localhost"]).await?;
        let mut req = b"GET http://localhost/ HTTP/1.1\r\n".to_vec();
        req.extend(b"X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".repeat(500));
        c.write_all(&req).await?;
        let resp = read_head_text(&mut c).await?;
        assert!(resp.starts_with("HTTP/1.1 431 "), "{resp}");
        Ok(())
    }

    #[tokio::test]
    async fn garbage_gets_400_and_the_proxy_still_serves_the_next_client() -> R {
        let (listener, port) = local_listener().await?;
        tokio::spawn(serve(
            Listener::Tcp(listener),
            Arc::new(Allowlist::new(["example.com"])?),
        ));
        let garbage: [&[u8]; 2] = [
            b"\x16\x03\x01\x00\xff hi\r\n\r\n",
            b"GET /x HTTP/1.1\r\n\r\n",
        ];
        for g in garbage {
            let resp = exchange(&mut TcpStream::connect(("127.0.0.1", port)).await?, g).await?;
            assert!(resp.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{resp}");
        }
        let mut next = TcpStream::connect(("127.0.0.1", port)).await?;
        let resp = exchange(&mut next, "CONNECT other.com:443 HTTP/1.1\r\n\r\n").await?;
        assert!(resp.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{resp}");
        Ok(())
    }

    #[tokio::test]
    async fn probe_reports_reachable_unreachable_blocked_and_rejects_bad_urls() -> R {
        let (_open, open) = local_listener().await?;
        let closed = local_listener().await?.1;
        let allow = Some(Allowlist::new([
            format!("127.0.0.1:{open}"),
            format!("127.0.0.1:{closed}"),
            format!("localhost:{open}"),
        ])?);
        let reached = probe(&format!("http://127.0.0.1:{open}/health"), allow.as_ref()).await?;
        assert_eq!(reached, Reachability::Reachable);
        let refused = probe(&format!("https://127.0.0.1:{closed}"), allow.as_ref()).await?;
        assert!(
            matches!(refused, Reachability::Unreachable(_)),
            "{refused:?}"
        );
        assert_eq!(refused.as_str(), "unreachable");
        let blocked = probe("https://example.com/", allow.as_ref()).await?;
        assert_eq!(blocked, Reachability::Blocked);
        let port = probe("https://127.0.0.1/", allow.as_ref()).await?;
        assert_eq!(port, Reachability::Blocked, "a port no entry names");
        // localhost:open is listed and 127.0.0.1:open too, so the name may go there; without
        // the IP entry it is refused after resolving.
        let named = probe(&format!("http://localhost:{open}/"), allow.as_ref()).await?;
        assert_eq!(named, Reachability::Reachable);
        let alone = Allowlist::new([format!("localhost:{open}")])?;
        let named = probe(&format!("http://localhost:{open}/"), Some(&alone)).await?;
        assert_eq!(named, Reachability::Blocked);
        for bad in "ftp://127.0.0.1/|http://|not a url|http://u@127.0.0.1/|http://x:0/".split('|') {
            assert!(
                matches!(probe(bad, None).await, Err(ProxyError::InvalidUrl)),
                "{bad}"
            );
        }
        Ok(())
    }
}
