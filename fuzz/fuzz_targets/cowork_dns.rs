//! Fuzzes cowork's resolver (`boxdesk_cowork::dns`) as a sandbox feeds it
//! one datagram or TCP message: parsing never panics, a parsed query
//! reads back from the response built for it, and a response is never
//! answered.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use boxdesk_cowork::dns::{parse, reply, Rcode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(q) = parse(data) else {
        return;
    };
    assert!(q.name.len() <= 253);
    let addrs = [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)];
    let r = reply(&q, Rcode::NoError, &addrs);
    assert_eq!(&r[..2], &q.id.to_be_bytes());
    assert!(r[2] & 0x80 != 0, "a reply is a response");
    // A response parses as no query: it is never answered.
    assert!(parse(&r).is_err());
});
