//! Names in a spawn: on the namespace backend its private network has
//! boxdesk's resolver (`nameserver 127.0.0.1`), which answers the names its
//! allowlist lists as the host's resolver does and no others; a VM's
//! `/etc/resolv.conf` is a regular file (its resolution comes with its
//! network). The `desktop_` tests run inside tests/desktops/run.sh's
//! layouts (a resolver the layout made, on 127.0.0.53 or 127.0.0.1 of its
//! own network namespace), ignored elsewhere.

use serde_json::json;

use super::client::{on_vm, Cowork};

/// A shell script sending one DNS query for `name` (type A) to 127.0.0.1:53
/// over UDP with python3 and printing `rcode=N answers=N last4=a.b.c.d`.
fn query_script(name: &str) -> String {
    format!(
        r#"/usr/bin/python3 - <<'PY'
import socket, struct
q = struct.pack(">HHHHHH", 77, 0x0100, 1, 0, 0, 0)
for l in "{name}".split("."):
    q += bytes([len(l)]) + l.encode()
q += b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.sendto(q, ("127.0.0.1", 53))
r = s.recv(512)
print("rcode=%d answers=%d last4=%s" % (r[3] & 15, struct.unpack(">H", r[6:8])[0], ".".join(map(str, r[-4:])) if struct.unpack(">H", r[6:8])[0] else "-"))
PY"#
    )
}

#[test]
fn a_spawn_on_a_private_network_resolves_the_names_its_allowlist_lists_and_no_others() {
    let c = Cowork::start();
    let mut p = c.boot("dns");
    let mut ev = c.events("dns");
    if on_vm() {
        // The guest's /etc is the host's: its resolv.conf reads as the
        // host's (a copy where the host's is a link into its /run), or is
        // missing as on the host.
        p.sh("r", "s", "cat /etc/resolv.conf 2>/dev/null || echo none");
        assert_eq!(ev.exit_of("r")["exitCode"], 0, "{:?}", ev.seen);
        let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_else(|_| "none\n".into());
        assert_eq!(ev.text("stdout", "r"), host);
        return;
    }
    // `localhost` is in every host's /etc/hosts: the host's resolver's
    // answer, whatever this machine's DNS is.
    let script = format!(
        "cat /etc/resolv.conf | grep -v '^#'\n{}\n{}\n",
        query_script("localhost"),
        query_script("unlisted.example.test")
    );
    let r = p.call(
        "spawn",
        json!({"id": "q", "name": "s", "command": "/bin/sh", "args": ["-c", script], "allowedDomains": ["localhost"]}),
    );
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    assert_eq!(ev.exit_of("q")["exitCode"], 0, "{:?}\n{}", ev.seen, c.log());
    assert_eq!(
        ev.text("stdout", "q"),
        "nameserver 127.0.0.1\noptions edns0\nrcode=0 answers=1 last4=127.0.0.1\nrcode=3 answers=0 last4=-\n",
        "{:?}",
        ev.seen
    );
}

#[test]
#[ignore = "runs inside tests/desktops/run.sh's layouts, whose resolver answers BOXDESK_DESKTOP_NAME"]
fn desktop_a_spawn_resolves_a_listed_name_as_the_host_does() {
    let name = std::env::var("BOXDESK_DESKTOP_NAME").expect("BOXDESK_DESKTOP_NAME");
    let addr = std::env::var("BOXDESK_DESKTOP_ADDR").expect("BOXDESK_DESKTOP_ADDR");
    let c = Cowork::start();
    let mut p = c.boot("desk");
    let mut ev = c.events("desk");
    let script = format!("getent hosts {name}");
    let r = p.call(
        "spawn",
        json!({"id": "g", "name": "s", "command": "/bin/sh", "args": ["-c", script], "allowedDomains": [name]}),
    );
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    assert_eq!(ev.exit_of("g")["exitCode"], 0, "{:?}\n{}", ev.seen, c.log());
    let out = ev.text("stdout", "g");
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        [addr.as_str(), name.as_str()],
        "{out}"
    );
}
