use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use proptest::prelude::*;

use super::*;

/// A query for `name` of type `qtype` (RD set), as a stub resolver sends.
fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        m.push(label.len() as u8);
        m.extend_from_slice(label.as_bytes());
    }
    m.push(0);
    m.extend_from_slice(&qtype.to_be_bytes());
    m.extend_from_slice(&CLASS_IN.to_be_bytes());
    m
}

fn table() -> Lookup {
    Lookup::Table(Arc::new(vec![(
        "api.example.test".to_owned(),
        vec![
            IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ],
    )]))
}

fn allow() -> Allowlist {
    Allowlist::new(["api.example.test", "*.other.test:8443"]).unwrap()
}

fn rcode(r: &[u8]) -> u8 {
    r[3] & 0x0F
}

fn answers(r: &[u8]) -> u16 {
    u16::from_be_bytes([r[6], r[7]])
}

#[tokio::test]
async fn a_listed_name_gets_the_host_resolvers_addresses_of_the_asked_family() {
    let r = answer(&query(7, "API.example.test", TYPE_A), &allow(), &table())
        .await
        .unwrap();
    assert_eq!(&r[..2], &7u16.to_be_bytes());
    assert_eq!(r[2] & 0x81, 0x81, "QR and RD");
    assert_eq!((rcode(&r), answers(&r)), (0, 1));
    assert_eq!(&r[r.len() - 4..], &[127, 0, 0, 9]);
    let r = answer(&query(8, "api.example.test", TYPE_AAAA), &allow(), &table())
        .await
        .unwrap();
    assert_eq!((rcode(&r), answers(&r)), (0, 1));
    assert_eq!(&r[r.len() - 16..], &Ipv6Addr::LOCALHOST.octets());
    // Another type of a listed name: an empty answer.
    let r = answer(&query(9, "api.example.test", 16), &allow(), &table())
        .await
        .unwrap();
    assert_eq!((rcode(&r), answers(&r)), (0, 0));
}

#[tokio::test]
async fn a_name_the_allowlist_does_not_list_is_nxdomain_without_asking_the_host() {
    // The table would answer it; the allowlist decides first.
    let lookup = Lookup::Table(Arc::new(vec![(
        "leak.example.test".into(),
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )]));
    let r = answer(&query(1, "leak.example.test", TYPE_A), &allow(), &lookup)
        .await
        .unwrap();
    assert_eq!((rcode(&r), answers(&r)), (3, 0));
    // A wildcard entry on another port still lets its names resolve.
    let r = answer(&query(2, "a.other.test", TYPE_A), &allow(), &table())
        .await
        .unwrap();
    assert_eq!(rcode(&r), 3, "listed but unknown to the resolver: NXDOMAIN");
    assert!(allow().lists_name("a.other.test"));
    assert!(!allow().lists_name("other.test"));
    assert!(!allow().lists_name("127.0.0.1"));
}

#[tokio::test]
async fn malformed_queries_get_formerr_and_responses_or_scraps_get_nothing() {
    let a = allow();
    let l = table();
    assert_eq!(answer(&[1, 2, 3], &a, &l).await, None);
    let mut resp = query(3, "api.example.test", TYPE_A);
    resp[2] |= 0x80;
    assert_eq!(
        answer(&resp, &a, &l).await,
        None,
        "a response is never answered"
    );
    let mut two = query(4, "api.example.test", TYPE_A);
    two[5] = 2;
    let r = answer(&two, &a, &l).await.unwrap();
    assert_eq!((&r[..2], rcode(&r)), (&4u16.to_be_bytes()[..], 1));
    let mut pointer = query(5, "api.example.test", TYPE_A);
    pointer[12] = 0xC0;
    assert_eq!(parse(&pointer), Err(DnsError::Name));
    let cut = &query(6, "api.example.test", TYPE_A)[..20];
    assert_eq!(parse(cut), Err(DnsError::Name));
    let q = query(6, "api.example.test", TYPE_A);
    assert_eq!(parse(&q[..q.len() - 2]), Err(DnsError::Truncated));
    let mut odd = query(7, "api.example.test", TYPE_A);
    odd[14] = b' ';
    assert_eq!(parse(&odd), Err(DnsError::Name));
}

#[test]
fn an_answer_over_512_bytes_is_cut_to_its_question_with_tc_set() {
    let q = parse(&query(3, "api.example.test", TYPE_A)).unwrap();
    let many: Vec<IpAddr> = (0..32)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 1, i)))
        .collect();
    let r = reply(&q, Rcode::NoError, &many);
    assert!(r.len() > 512);
    let t = truncated(r);
    assert_eq!(t.len(), 12 + q.question.len());
    assert_eq!((t[2] & 0x02, answers(&t)), (0x02, 0));
}

proptest! {
    #[test]
    fn no_message_panics_the_parser_or_the_reply(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(q) = parse(&bytes) {
            let r = reply(&q, Rcode::NoError, &[IpAddr::V4(Ipv4Addr::LOCALHOST)]);
            prop_assert!(parse_question_len(&r).is_ok());
        }
        let _ = format_error(&bytes);
    }

    #[test]
    fn every_query_of_hostname_labels_parses_back(labels in proptest::collection::vec("[a-z0-9-]{1,20}", 1..8), qtype in any::<u16>()) {
        let name = labels.join(".");
        let q = parse(&query(9, &name, qtype)).unwrap();
        prop_assert_eq!(q.name, name);
        prop_assert_eq!(q.qtype, qtype);
    }
}

/// The sockets a backend would make inside, here on loopback ports.
fn sockets() -> (boxdesk_sandbox::running::DnsSockets, SocketAddr, SocketAddr) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let (u, t) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
    (boxdesk_sandbox::running::DnsSockets { udp, tcp }, u, t)
}

#[tokio::test]
async fn the_server_answers_over_udp_and_tcp_and_garbage_or_a_huge_length_ends_only_that_client() {
    let (s, u, t) = sockets();
    let server = tokio::spawn(serve(s, Arc::new(allow()), table()));
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.send_to(&[0xff; 7], u).await.unwrap();
    client
        .send_to(&query(11, "api.example.test", TYPE_A), u)
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (&buf[..2], rcode(&buf[..n]), answers(&buf[..n])),
        (&11u16.to_be_bytes()[..], 0, 1)
    );

    // A length over the cap: that connection is closed, nothing read.
    let mut bad = TcpStream::connect(t).await.unwrap();
    bad.write_all(&[0xff, 0xff]).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), bad.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(rest.is_empty());

    let mut c = TcpStream::connect(t).await.unwrap();
    for id in [12u16, 13] {
        let q = query(id, "api.example.test", TYPE_AAAA);
        c.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
        c.write_all(&q).await.unwrap();
        let mut len = [0u8; 2];
        c.read_exact(&mut len).await.unwrap();
        let mut r = vec![0u8; usize::from(u16::from_be_bytes(len))];
        c.read_exact(&mut r).await.unwrap();
        assert_eq!(
            (&r[..2], rcode(&r), answers(&r)),
            (&id.to_be_bytes()[..], 0, 1)
        );
    }
    assert!(!server.is_finished());
    server.abort();
}
