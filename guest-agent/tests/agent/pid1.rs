//! The agent as PID 1 of a new pid namespace (`unshare`), as in a VM (init
//! duties, power-off as Shutdown) and as the namespace backend runs it.

use std::time::Duration;

use boxdesk_channel::Frame;

use crate::support::{children_of, have, sh, wait_for, zombies_of, Agent};

const UNSHARE: [&str; 8] = [
    "unshare",
    "--fork",
    "--pid",
    "--mount",
    "--mount-proc",
    "--uts",
    "--net",
    "--",
];

/// Whether this machine lets us make the namespaces; says why not.
fn namespaces_available() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        crate::support::skip("needs root for pid/mount/uts/net namespaces");
        return false;
    }
    if !have("unshare") {
        crate::support::skip("unshare is not installed");
        return false;
    }
    let ok = std::process::Command::new(UNSHARE[0])
        .args(&UNSHARE[1..])
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        crate::support::skip("unshare cannot create the namespaces here");
    }
    ok
}

/// A temp dir outside /tmp and /run: as a VM's init the agent mounts
/// tmpfs over both in its mount namespace, which would hide a socket (and
/// the root and results dirs) created there. `None` (skip) when the target
/// dir itself is beneath one of them.
fn dir() -> Option<tempfile::TempDir> {
    let base = env!("CARGO_TARGET_TMPDIR");
    if ["/tmp", "/run"]
        .iter()
        .any(|m| std::path::Path::new(base).starts_with(m))
    {
        crate::support::skip(&format!(
            "the target dir {base} is under /tmp or /run, which the agent mounts over"
        ));
        return None;
    }
    Some(tempfile::tempdir_in(base).unwrap())
}

fn out(agent: &Agent, script: &str) -> String {
    let r = agent.run(sh(script));
    assert_eq!(r.exit, Some(0), "{script}: {r:?}");
    r.stdout_text()
}

#[test]
fn as_pid_1_like_a_vm_the_agent_does_its_init_duties_reaps_orphans_and_powers_off() {
    if !namespaces_available() {
        return;
    }
    let Some(dir) = dir() else { return };
    let mut agent = Agent::launch(dir, &UNSHARE, &[]);
    assert!(out(&agent, "cat /proc/1/cmdline").contains("boxdesk-guest-agent"));
    let own = agent
        .run(boxdesk_channel::Exec::new("cat", ["/proc/self/stat"]))
        .stdout_text();
    let pid: u32 = own.split(' ').next().unwrap().parse().unwrap();
    let st = crate::support::parse_stat(&own).unwrap();
    assert_eq!(
        (st.session, st.pgrp, st.ppid),
        (pid, pid, 1),
        "new session under PID 1"
    );
    assert_eq!(out(&agent, "hostname").trim(), "boxdesk");
    assert!(out(&agent, "grep ' /tmp ' /proc/self/mountinfo").contains("tmpfs"));
    if have("ip") {
        let lo = out(&agent, "ip -o link show lo");
        assert!(lo.contains(",UP"), "lo is up: {lo}");
    } else {
        crate::support::skip("the lo check: no ip tool");
    }

    // The agent's pid outside the namespace: unshare's only child.
    let host_pid = children_of(agent.pid())[0];
    let r = agent.run(sh("for i in $(seq 100); do (sleep 0.2 &) ; done"));
    assert_eq!(r.exit, Some(0));
    let clean = wait_for(Duration::from_secs(10), || {
        zombies_of(host_pid).is_empty() && children_of(host_pid).is_empty()
    });
    assert!(clean, "zombies under PID 1: {:?}", zombies_of(host_pid));

    let mut s = agent.session();
    s.send(&Frame::Shutdown).unwrap();
    assert!(
        agent.wait_exit(Duration::from_secs(15)).is_some(),
        "the namespace ended"
    );
}

#[test]
fn as_pid_1_of_the_namespace_backend_it_skips_init_duties_and_shutdown_exits_zero() {
    if !namespaces_available() {
        return;
    }
    let Some(dir) = dir() else { return };
    let mut agent = Agent::launch(dir, &UNSHARE, &[("BOXDESK_NAMESPACE", "1")]);
    assert_ne!(out(&agent, "hostname").trim(), "boxdesk", "no init duties");
    let mut s = agent.session();
    s.send(&Frame::Exec(sh("echo up; sleep 30"))).unwrap();
    assert_eq!(s.recv().unwrap(), Some(Frame::Stdout(b"up\n".to_vec())));
    agent.session().send(&Frame::Shutdown).unwrap();
    let status = agent
        .wait_exit(Duration::from_secs(10))
        .expect("agent exits");
    assert!(status.success(), "{status}");
}
