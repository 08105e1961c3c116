//! The rules of the `allowedDomains` proxy ([`super::proxy`]): which host and port a
//! sandbox may ask for, and which addresses a listed name may lead to.
//!
//! An entry names a host (`example.com`), its subdomains (`*.example.com`), an IP address or
//! a CIDR (`10.0.0.5`, `192.168.1.0/24`, `[fd00::1]`). Without a port it allows 443 and 80
//! only; with one (`example.com:8443`, `[fd00::1]:8080`) exactly that port. A bare public
//! suffix (`com`, `co.uk`, `github.io`: the known entries of the public suffix list, compiled
//! in by the `psl` crate) or a wildcard over one (`*.com`) is refused, as is a CIDR of every
//! address: each would open half the internet. A listed *name* may lead only to public
//! addresses, or to an address an IP/CIDR entry allows on that port: private (RFC 1918),
//! CGNAT, loopback, link-local, ULA, unspecified, multicast, reserved, and IPv4 ones hidden in
//! IPv4-mapped, NAT64 or 6to4 addresses are not public. An IP or CIDR entry is the user's
//! explicit choice (a LAN host) and is allowed whatever its range.
//!
//! This module decides; it never resolves or connects (the proxy does, checking every
//! address it connects to with [`Allowlist::may_lead_to`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why an allowlist was refused.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistError {
    /// An entry that is not a hostname, `*.hostname`, IP or CIDR, each with an optional port.
    #[error("invalid allowlist entry: {0:?}")]
    Invalid(String),
    /// An entry that is a public suffix, or a wildcard over one.
    #[error("allowlist entry {0:?} is a public suffix (like com or co.uk) and would allow every site under it: list the sites")]
    PublicSuffix(String),
    /// A CIDR entry of every address.
    #[error(
        "allowlist entry {0:?} allows every address: leave allowedDomains out for an open network"
    )]
    Everything(String),
}

/// The ports an entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ports {
    /// No port given: HTTPS and HTTP.
    Web,
    /// `host:port`: exactly this one.
    Only(u16),
}

impl Ports {
    fn allows(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 443 || port == 80,
            Ports::Only(p) => p == port,
        }
    }
}

/// A destination as a request names it: an address, or a lowercase name without a trailing
/// dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Host {
    /// An address, IPv4-mapped ones as IPv4.
    Ip(IpAddr),
    /// A valid hostname.
    Name(String),
}

/// What a sandbox may reach; see the module doc for the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowlist {
    names: BTreeMap<String, BTreeSet<Ports>>,
    wildcards: BTreeMap<String, BTreeSet<Ports>>,
    nets: BTreeSet<(IpNet, Ports)>,
    /// Every public destination, on any port ([`Allowlist::public`]).
    public: bool,
}

/// One parsed entry.
enum Entry {
    Name(String, Ports),
    Wildcard(String, Ports),
    Net(IpNet, Ports),
}

impl Allowlist {
    /// Builds an allowlist from entries: `example.com` (exactly that host), `*.example.com`
    /// (any subdomain, not the apex), an IP or CIDR (`[v6]` in brackets when a port follows),
    /// each optionally `:port`. `*`, empty entries, schemes, paths, spaces, characters that
    /// are not hostname characters, public suffixes, wildcards over one and `/0` CIDRs are
    /// refused. Names compare lowercase with a trailing dot ignored.
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(
        entries: I,
    ) -> Result<Self, AllowlistError> {
        let mut list = Allowlist {
            names: BTreeMap::new(),
            wildcards: BTreeMap::new(),
            nets: BTreeSet::new(),
            public: false,
        };
        for raw in entries {
            let raw = raw.as_ref();
            match parse_entry(raw).ok_or_else(|| AllowlistError::Invalid(raw.to_owned()))? {
                Entry::Name(n, _) | Entry::Wildcard(n, _) if is_public_suffix(&n) => {
                    return Err(AllowlistError::PublicSuffix(raw.to_owned()))
                }
                Entry::Net(net, _) if net.prefix_len() == 0 => {
                    return Err(AllowlistError::Everything(raw.to_owned()))
                }
                Entry::Name(n, p) => list.names.entry(n).or_default().insert(p),
                Entry::Wildcard(n, p) => list.wildcards.entry(n).or_default().insert(p),
                Entry::Net(net, p) => list.nets.insert((net, p)),
            };
        }
        Ok(list)
    }

    /// Every public destination on any port, and nothing private: no name
    /// whose DNS answer is a private, loopback, link-local, CGNAT or ULA
    /// address and no such address. The way out of a sandbox that has no
    /// network device of its own and no `allowedDomains` (a VM's).
    pub fn public() -> Self {
        Allowlist {
            names: BTreeMap::new(),
            wildcards: BTreeMap::new(),
            nets: BTreeSet::new(),
            public: true,
        }
    }

    /// Whether `host` (a name, IPv4 literal, or IPv6 literal with or without brackets) may be
    /// reached on `port` by the rules alone (before any name is resolved).
    pub fn allows(&self, host: &str, port: u16) -> bool {
        parse_host(host).is_some_and(|h| self.permits(&h, port))
    }

    /// Whether an entry names `name` (a hostname, not an address literal)
    /// on whatever port: a name the sandbox may resolve.
    pub fn lists_name(&self, name: &str) -> bool {
        matches!(parse_host(name), Some(h @ Host::Name(_)) if self.lists(&h))
    }

    /// The normalised entries, sorted and comma-joined (used as a key to share one proxy
    /// between sandboxes with the same list).
    pub fn key(&self) -> String {
        if self.public {
            return "*".to_owned();
        }
        let port = |p: &Ports| match p {
            Ports::Web => String::new(),
            Ports::Only(p) => format!(":{p}"),
        };
        let mut all = Vec::new();
        for (prefix, map) in [("", &self.names), ("*.", &self.wildcards)] {
            for (n, ports) in map {
                all.extend(ports.iter().map(|p| format!("{prefix}{n}{}", port(p))));
            }
        }
        for (net, p) in &self.nets {
            let shown = if net.prefix_len() == net.max_prefix_len() {
                net.addr().to_string()
            } else {
                net.to_string()
            };
            all.push(match (net, p) {
                (IpNet::V6(_), Ports::Only(_)) => format!("[{shown}]{}", port(p)),
                _ => format!("{shown}{}", port(p)),
            });
        }
        all.sort();
        all.join(",")
    }

    /// Whether an entry allows `host` on `port`.
    pub(super) fn permits(&self, host: &Host, port: u16) -> bool {
        self.listed(host, |p| p.allows(port))
    }

    /// Whether an entry names `host`, on whatever port.
    pub(super) fn lists(&self, host: &Host) -> bool {
        self.listed(host, |_| true)
    }

    /// Whether a listed name may lead to `ip` on `port`: a public address, or one an IP/CIDR
    /// entry allows on that port.
    pub(super) fn may_lead_to(&self, ip: IpAddr, port: u16) -> bool {
        !is_non_public(ip) || self.covers(ip, port)
    }

    /// Whether an entry names `host` with ports for which `ok` holds.
    fn listed(&self, host: &Host, ok: impl Fn(Ports) -> bool) -> bool {
        if self.public {
            return match host {
                Host::Ip(ip) => !is_non_public(*ip),
                Host::Name(_) => true,
            };
        }
        let has = |map: &BTreeMap<String, BTreeSet<Ports>>, n: &str| {
            map.get(n).is_some_and(|ps| ps.iter().any(|p| ok(*p)))
        };
        match host {
            Host::Ip(ip) => self.nets.iter().any(|(n, p)| ok(*p) && n.contains(ip)),
            Host::Name(n) => {
                has(&self.names, n)
                    || n.match_indices('.')
                        .any(|(i, _)| has(&self.wildcards, &n[i + 1..]))
            }
        }
    }

    /// Whether an IP/CIDR entry allows `ip` on `port`.
    fn covers(&self, ip: IpAddr, port: u16) -> bool {
        self.permits(&Host::Ip(ip.to_canonical()), port)
    }
}

/// A name the public suffix list knows as a suffix (`com`, `co.uk`, `github.io`, any name
/// under a wildcard rule like `*.ck`). Names only the list's default rule would call a suffix
/// (`localhost`, `nas`) are not: those are left to the address checks.
fn is_public_suffix(name: &str) -> bool {
    psl::suffix(name.as_bytes()).is_some_and(|s| s.is_known() && s.as_bytes() == name.as_bytes())
}

/// Parses one allowlist entry.
fn parse_entry(entry: &str) -> Option<Entry> {
    if let Some(net) = parse_net(entry) {
        return Some(Entry::Net(net, Ports::Web));
    }
    let (host, ports) = split_port(entry)?;
    if entry.starts_with('[') {
        return parse_net(host)
            .filter(|n| matches!(n, IpNet::V6(_)))
            .map(|n| Entry::Net(n, ports));
    }
    if let Some(net) = parse_net(host).filter(|n| matches!(n, IpNet::V4(_))) {
        return Some(Entry::Net(net, ports));
    }
    match host.strip_prefix("*.") {
        Some(apex) => normalize_name(apex).map(|n| Entry::Wildcard(n, ports)),
        None => normalize_name(host).map(|n| Entry::Name(n, ports)),
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; the host comes back without brackets.
fn split_port(s: &str) -> Option<(&str, Ports)> {
    let (host, port) = match s.strip_prefix('[') {
        Some(r) => {
            let (h, after) = r.split_once(']')?;
            let port = match after {
                "" => None,
                a => Some(a.strip_prefix(':')?),
            };
            (h, port)
        }
        None => s.rsplit_once(':').map_or((s, None), |(h, p)| (h, Some(p))),
    };
    let ports = match port {
        None => Ports::Web,
        Some(p) => Ports::Only(parse_port(p)?),
    };
    Some((host, ports))
}

/// 1..=65535 written as at most five ASCII digits.
fn parse_port(p: &str) -> Option<u16> {
    let digits = !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| p.parse().ok()).flatten().filter(|&p| p != 0)
}

/// An IP address (as a one-address net, IPv4-mapped ones as IPv4) or a CIDR (its host bits
/// cleared).
fn parse_net(s: &str) -> Option<IpNet> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        let ip = ip.to_canonical();
        let len = if ip.is_ipv4() { 32 } else { 128 };
        return Some(IpNet::new_assert(ip, len));
    }
    s.parse::<IpNet>().ok().map(|n| n.trunc())
}

/// The destination a request names: IP literals (IPv6 with or without brackets) canonical,
/// names lowercase without a trailing dot; `None` if it is neither.
pub(super) fn parse_host(host: &str) -> Option<Host> {
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let ip = v6.parse::<Ipv6Addr>().ok()?;
        return Some(Host::Ip(IpAddr::V6(ip).to_canonical()));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(Host::Ip(ip.to_canonical()));
    }
    normalize_name(host).map(Host::Name)
}

/// A valid hostname, lowercase, without a trailing dot.
fn normalize_name(host: &str) -> Option<String> {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    valid_hostname(&name).then_some(name)
}

/// Labels of 1..=63 `[a-z0-9_-]` without edge hyphens, at most 253 bytes, and a last label
/// that is not all digits (so a name can never pose as an IP).
fn valid_hostname(name: &str) -> bool {
    let label_ok = |l: &str| {
        let chars = l
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'));
        chars && (1..=63).contains(&l.len()) && !l.starts_with('-') && !l.ends_with('-')
    };
    let last = name.rsplit('.').next().unwrap_or_default();
    name.len() <= 253 && name.split('.').all(label_ok) && !last.bytes().all(|b| b.is_ascii_digit())
}

/// IPv4 ranges no listed name may lead to: "this network" (with 0.0.0.0), RFC 1918 private,
/// CGNAT, loopback, link-local (cloud metadata), IETF protocol assignments, benchmarking,
/// multicast, and reserved (with broadcast).
const NON_PUBLIC_V4: [Ipv4Net; 11] = [
    Ipv4Net::new_assert(Ipv4Addr::new(0, 0, 0, 0), 8),
    Ipv4Net::new_assert(Ipv4Addr::new(10, 0, 0, 0), 8),
    Ipv4Net::new_assert(Ipv4Addr::new(100, 64, 0, 0), 10),
    Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8),
    Ipv4Net::new_assert(Ipv4Addr::new(169, 254, 0, 0), 16),
    Ipv4Net::new_assert(Ipv4Addr::new(172, 16, 0, 0), 12),
    Ipv4Net::new_assert(Ipv4Addr::new(192, 0, 0, 0), 24),
    Ipv4Net::new_assert(Ipv4Addr::new(192, 168, 0, 0), 16),
    Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 15),
    Ipv4Net::new_assert(Ipv4Addr::new(224, 0, 0, 0), 4),
    Ipv4Net::new_assert(Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// IPv6 ranges no listed name may lead to: IPv4-compatible (with `::` and `::1`) and
/// IPv4-translated forms, local-use NAT64, discard-only, ULA, link-local, site-local and
/// multicast. IPv4-mapped, NAT64 and 6to4 addresses are judged by the IPv4 address inside.
const NON_PUBLIC_V6: [Ipv6Net; 8] = [
    Ipv6Net::new_assert(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96),
    Ipv6Net::new_assert(Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, 0, 0), 96),
    Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48),
    Ipv6Net::new_assert(Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64),
    Ipv6Net::new_assert(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    Ipv6Net::new_assert(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
    Ipv6Net::new_assert(Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10),
    Ipv6Net::new_assert(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),
];
const NAT64: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96);
const SIX_TO_FOUR: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16);

/// Whether `ip` is private, local or otherwise not a public destination.
fn is_non_public(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => NON_PUBLIC_V4.iter().any(|n| n.contains(&v4)),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let inner = if NAT64.contains(&v6) {
                Some(Ipv4Addr::new(o[12], o[13], o[14], o[15]))
            } else if SIX_TO_FOUR.contains(&v6) {
                Some(Ipv4Addr::new(o[2], o[3], o[4], o[5]))
            } else {
                None
            };
            match inner {
                Some(v4) => is_non_public(IpAddr::V4(v4)),
                None => NON_PUBLIC_V6.iter().any(|n| n.contains(&v6)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

    #[test]
    fn the_public_list_allows_any_name_and_public_address_on_any_port_and_nothing_private() {
        let a = Allowlist::public();
        assert!(a.allows("api.anthropic.com", 443) && a.allows("example.org", 8443));
        assert!(a.allows("1.1.1.1", 53) && a.allows("[2606:4700::1111]", 443));
        for private in [
            "127.0.0.1",
            "10.0.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "[::1]",
            "[fd00::1]",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(!a.allows(private, 443), "{private}");
        }
        // A name is allowed by the rules; where it leads is checked after
        // the lookup, and only public addresses pass.
        assert!(a.may_lead_to("93.184.216.34".parse().unwrap(), 443));
        assert!(!a.may_lead_to("127.0.0.1".parse().unwrap(), 443));
        assert!(!a.may_lead_to("10.1.2.3".parse().unwrap(), 80));
        assert_eq!(a.key(), "*");
    }

    #[test]
    fn exact_entries_match_only_that_host_and_ip_literals_only_literally() -> R {
        let a = Allowlist::new(["example.com", "127.0.0.1", "[::1]"])?;
        assert!(a.allows("example.com", 443) && a.allows("127.0.0.1", 443));
        assert!(a.allows("[0:0::1]", 80) && a.allows("[::ffff:127.0.0.1]", 443));
        assert!(!a.allows("api.example.com", 443) && !a.allows("example.org", 443));
        assert!(!a.allows("127.0.0.2", 443) && !a.allows("notexample.com", 443));
        assert!(!a.allows("", 443) && !a.allows("localhost", 443));
        Ok(())
    }

    #[test]
    fn wildcard_entries_match_any_subdomain_but_not_the_apex() -> R {
        let a = Allowlist::new(["*.example.com"])?;
        assert!(a.allows("api.example.com", 443) && a.allows("a.b.example.com", 80));
        assert!(!a.allows("example.com", 443) && !a.allows("badexample.com", 443));
        assert!(!a.allows("example.com.evil.io", 443));
        Ok(())
    }

    #[test]
    fn hosts_compare_case_insensitively_and_ignore_a_trailing_dot() -> R {
        let a = Allowlist::new(["Example.COM.", "*.Anthropic.com"])?;
        assert!(a.allows("EXAMPLE.com", 443) && a.allows("example.com.", 443));
        assert!(a.allows("API.anthropic.COM.", 443) && !a.allows("example.com..", 443));
        Ok(())
    }

    #[test]
    fn a_listed_name_is_allowed_on_443_and_80_only_unless_the_entry_names_a_port() -> R {
        let a = Allowlist::new(["example.com", "*.example.org", "git.example.net:2222"])?;
        for (host, port, ok) in [
            ("example.com", 443, true),
            ("example.com", 80, true),
            ("example.com", 22, false),
            ("example.com", 8443, false),
            ("api.example.org", 443, true),
            ("api.example.org", 25, false),
            ("git.example.net", 2222, true),
            ("git.example.net", 443, false),
        ] {
            assert_eq!(a.allows(host, port), ok, "{host}:{port}");
        }
        let b = Allowlist::new(["*.example.org:8443", "10.0.0.5", "[fd00::1]:8080"])?;
        assert!(b.allows("x.example.org", 8443) && !b.allows("x.example.org", 443));
        assert!(b.allows("10.0.0.5", 443) && !b.allows("10.0.0.5", 22));
        assert!(b.allows("[fd00::1]", 8080) && !b.allows("[fd00::1]", 443));
        Ok(())
    }

    #[test]
    fn public_suffixes_and_wildcards_over_them_are_refused_but_names_under_them_are_not() {
        for entry in [
            "com",
            "COM.",
            "co.uk",
            "github.io",
            "*.com",
            "*.co.uk",
            "*.github.io",
            "*.uk",
            "com:8443",
            "*.com:443",
        ] {
            let e = Allowlist::new([entry]).unwrap_err();
            assert!(matches!(e, AllowlistError::PublicSuffix(_)), "{entry}: {e}");
        }
        for entry in ["0.0.0.0/0", "::/0", "[::/0]:443"] {
            let e = Allowlist::new([entry]).unwrap_err();
            assert!(matches!(e, AllowlistError::Everything(_)), "{entry}: {e}");
        }
        for entry in [
            "example.com",
            "*.example.co.uk",
            "me.github.io",
            "*.me.github.io",
            "localhost",
            "nas",
            "*.corp.internal",
            "10.0.0.0/8",
        ] {
            assert!(Allowlist::new([entry]).is_ok(), "refused {entry}");
        }
    }

    #[test]
    fn ip_and_cidr_entries_allow_exactly_their_addresses() -> R {
        let a = Allowlist::new(["192.168.1.9/24", "fd00::/8", "100.64.0.1"])?;
        assert!(a.allows("192.168.1.77", 443) && !a.allows("192.168.2.1", 443));
        assert!(a.allows("[fd12::5]", 80) && a.allows("fd12::5", 80));
        assert!(!a.allows("[fe80::1]", 80) && !a.allows("100.64.0.2", 443));
        assert!(
            a.allows("[::ffff:192.168.1.1]", 443),
            "IPv4-mapped is the same host"
        );
        assert!(
            !a.allows("printer.lan", 443),
            "a CIDR never lets a name in by itself"
        );
        Ok(())
    }

    #[test]
    fn wildcards_schemes_paths_spaces_bad_ports_and_non_hostname_chars_are_refused() {
        let bad = "*||*.|example.com:0|example.com:65536|example.com:|example.com:+1|\
                   https://example.com|example.com/p|exa mple.com|bücher.de|*.*.example.com|\
                   a.*.example.com|*.127.0.0.1|-bad.com|1.2.3| example.com|10.0.0.0/33|\
                   [example.com]:443|[10.0.0.1]:80|fd00::1]:80|[fd00::1]80|a:b:c";
        for entry in bad.split('|') {
            assert!(
                matches!(Allowlist::new([entry]), Err(AllowlistError::Invalid(_))),
                "accepted {entry:?}"
            );
        }
    }

    #[test]
    fn key_is_the_sorted_normalised_entries() -> R {
        let a = Allowlist::new(["b.com", "*.A.com", "a.com.", "10.0.0.1", "a.com:8443"])?;
        assert_eq!(a.key(), "*.a.com,10.0.0.1,a.com,a.com:8443,b.com");
        assert_eq!(
            a,
            Allowlist::new(["10.0.0.1", "a.com:8443", "a.com", "*.a.com", "B.com"])?
        );
        let v6 = Allowlist::new(["[FD00::1]:8080", "fd00::/8", "10.1.2.3/8", "::ffff:1.2.3.4"])?;
        assert_eq!(v6.key(), "1.2.3.4,10.0.0.0/8,[fd00::1]:8080,fd00::/8");
        Ok(())
    }

    #[test]
    fn private_cgnat_ula_link_local_loopback_and_mapped_addresses_are_not_public() -> R {
        let local = "127.0.0.1 127.9.9.9 ::1 0.0.0.0 :: 169.254.169.254 fe80::1 \
                     ::ffff:127.0.0.1 10.1.2.3 172.16.0.1 172.31.255.255 192.168.0.1 \
                     100.64.0.1 100.127.255.254 fc00::1 fd12:3456::1 ff02::1 224.0.0.251 \
                     255.255.255.255 240.0.0.1 ::ffff:10.0.0.1 ::ffff:192.168.1.1 \
                     64:ff9b::a00:1 2002:c0a8:101::1 64:ff9b:1::1 fec0::1 ::10.0.0.1 \
                     198.18.0.1 192.0.0.8";
        for ip in local.split_whitespace() {
            assert!(is_non_public(ip.parse()?), "{ip}");
        }
        let public = "93.184.216.34 1.1.1.1 172.32.0.1 100.128.0.1 2606:4700::1111 \
                      ::ffff:8.8.8.8 64:ff9b::808:808 2002:808:808::1";
        for ip in public.split_whitespace() {
            assert!(!is_non_public(ip.parse()?), "{ip}");
        }
        Ok(())
    }
}
