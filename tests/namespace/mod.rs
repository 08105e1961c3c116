//! What a namespace sandbox can and cannot see or do: the host's homes,
//! the network, new namespaces (seccomp), the read-only host system, its
//! own state dir, and nothing left running after stop.

use std::fs;
use std::net::TcpListener;
use std::path::Path;

use crate::support::{self, TestEnv};

mod hardening;
mod seccomp;
mod shares;

#[test]
fn the_sandbox_cannot_see_the_hosts_home_or_root() {
    let env = TestEnv::new();
    let marker = env.home.join("host-secret.txt");
    fs::write(&marker, "secret\n").unwrap();
    let sb = env.start("homes", &[]);
    let m = marker.to_str().unwrap();
    let out = sb.sh(&format!("cat {m}"));
    assert_ne!(out.code(), 0, "the sandbox read the host's HOME: {out}");
    assert!(!out.stdout.contains("secret"));
    let out = sb.sh(&format!("ls {}", env.home.display()));
    assert_ne!(out.code(), 0, "{out}");
    // /root inside is the sandbox's own, empty home.
    assert_eq!(sb.sh("ls -A /root").stdout, "");
    assert_eq!(sb.sh("echo $HOME").stdout, "/root\n");
    if support::skip_unless_root("planting markers in the real /root and /home") {
        return;
    }
    let tag = support::unique("bxmark");
    let in_root = Path::new("/root").join(&tag);
    let _ = fs::create_dir_all("/home");
    let in_home = Path::new("/home").join(&tag);
    fs::write(&in_root, "root-secret").unwrap();
    fs::write(&in_home, "home-secret").unwrap();
    let out = sb.sh(&format!("cat /root/{tag}; cat /home/{tag}; ls /home"));
    let _ = fs::remove_file(&in_root);
    let _ = fs::remove_file(&in_home);
    assert_ne!(out.code(), 0, "{out}");
    assert!(!out.stdout.contains("secret"), "{out}");
    assert!(out.stderr.contains("No such file"), "{out}");
}

#[test]
fn without_net_the_sandbox_has_only_its_own_loopback() {
    let env = TestEnv::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sb = env.start("nonet", &[]);
    let out = sb.exec(&["cat", "/proc/net/dev"]);
    let ifaces: Vec<&str> = out
        .stdout
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "{out}");
    assert_eq!(env.info("nonet")["net"], "none");
    if Path::new("/bin/bash").exists() {
        let out = sb.exec(&[
            "bash",
            "-c",
            &format!("echo x > /dev/tcp/127.0.0.1/{port} && echo connected"),
        ]);
        assert_ne!(out.code(), 0, "reached the host's listener: {out}");
        assert!(!out.stdout.contains("connected"), "{out}");
    } else {
        println!("skipped the TCP half: no /bin/bash for /dev/tcp");
    }
}

#[test]
fn with_net_the_sandbox_shares_the_hosts_network() {
    let env = TestEnv::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sb = env.start("withnet", &["--net"]);
    assert_eq!(env.info("withnet")["net"], "host");
    if !Path::new("/bin/bash").exists() {
        println!("skipped: no /bin/bash for /dev/tcp");
        return;
    }
    let out = sb.exec(&[
        "bash",
        "-c",
        &format!("echo x > /dev/tcp/127.0.0.1/{port} && echo connected"),
    ]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "connected\n");
}

#[test]
fn seccomp_refuses_new_namespaces_with_eperm_and_ordinary_commands_still_work() {
    let env = TestEnv::new();
    let sb = env.start("filter", &[]);
    for flags in ["-U", "-m", "-n", "-p -f"] {
        let out = sb.sh(&format!("unshare {flags} true"));
        assert_ne!(out.code(), 0, "unshare {flags} succeeded: {out}");
        assert!(
            out.stderr.contains("Operation not permitted"),
            "unshare {flags}: {out}"
        );
    }
    let out = sb.sh("grep '^Seccomp:' /proc/self/status");
    assert_eq!(
        out.stdout.split_whitespace().nth(1),
        Some("2"),
        "no filter: {out}"
    );
    let out = sb.sh("mount -t tmpfs none /tmp");
    assert_ne!(out.code(), 0, "{out}");
    // Ordinary work: pipes, forks, files, threads.
    let out = sb.sh("ls /usr/bin | head -1 >/dev/null && seq 1 3 | sort -r | tr '\\n' ' ' && echo > /tmp/f && sleep 0.01 && echo ok");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "3 2 1 ok\n");
}

#[test]
fn the_agent_is_pid_1_and_the_hostname_is_the_sandbox_name() {
    let env = TestEnv::new();
    let sb = env.start("pidone", &[]);
    let out = sb.sh("cat /proc/1/cmdline | tr '\\0' ' '; echo; hostname");
    let mut lines = out.stdout.lines();
    assert!(lines.next().unwrap().contains("__agent"), "{out}");
    assert_eq!(lines.next(), Some("pidone"), "{out}");
    // Only the sandbox's own processes are visible.
    let out = sb.sh("ls /proc | grep -c '^[0-9]'");
    let n: u32 = out.stdout.trim().parse().unwrap();
    assert!(n < 10, "sees {n} processes: {out}");
}

#[test]
fn the_host_system_is_read_only_inside() {
    let env = TestEnv::new();
    let sb = env.start("ro", &[]);
    for path in ["/usr/boxdesk-x", "/etc/boxdesk-x"] {
        let out = sb.sh(&format!("touch {path}"));
        assert_ne!(out.code(), 0, "{path} is writable: {out}");
        assert!(!Path::new(path).exists());
    }
    assert_eq!(
        sb.sh("touch /tmp/x /work/x /root/x /results/x && echo ok")
            .stdout,
        "ok\n"
    );
}

#[test]
fn work_root_and_results_live_in_the_state_dir_which_stop_removes_unless_keep() {
    let env = TestEnv::new();
    let sb = env.start("st", &[]);
    sb.sh("echo w > /work/w; echo r > /root/r; echo o > /results/o; echo t > /tmp/t");
    let state = env.state_of("st");
    assert_eq!(fs::read_to_string(state.join("work/w")).unwrap(), "w\n");
    assert_eq!(fs::read_to_string(state.join("root/r")).unwrap(), "r\n");
    assert_eq!(fs::read_to_string(state.join("results/o")).unwrap(), "o\n");
    drop(sb);
    assert!(!state.exists(), "state dir survived stop");

    let sb = env.start("kept", &["--keep"]);
    sb.sh("echo k > /work/k");
    drop(sb);
    let state = env.state_of("kept");
    assert_eq!(fs::read_to_string(state.join("work/k")).unwrap(), "k\n");
    // The same name again is refused without --reuse, naming the dir...
    let again = env.run(["run", "--name", "kept", "--", "true"]);
    assert_eq!(again.code(), 125, "{again}");
    assert!(again.stderr.contains("--reuse"), "{again}");
    // ... and with it finds its files.
    let sb = env.start("kept", &["--keep", "--reuse"]);
    assert_eq!(sb.exec(&["cat", "/work/k"]).stdout, "k\n");
}

#[test]
fn processes_are_gone_after_stop() {
    let env = TestEnv::new();
    let sb = env.start("procs", &[]);
    let marker = format!("9999.{}", std::process::id());
    // Out of the exec's session (setsid; given time to get out before the
    // exec ends): what ends with an exec does not count here, only what
    // stop itself must end.
    let out = sb.sh(&format!(
        "setsid sleep {marker} & setsid sleep {marker} & sleep 0.5; echo started"
    ));
    assert_eq!(out.stdout, "started\n", "{out}");
    let info = env.info("procs");
    let helper: u32 = info["pid"].parse().unwrap();
    let sandbox: u32 = info["sandbox_pid"].parse().unwrap();
    let before = support::pids_with(&format!("sleep {marker}"));
    assert_eq!(before.len(), 2, "background sleeps not found: {before:?}");
    let out = env.run(["stop", "procs"]);
    assert_eq!(out.code(), 0, "{out}");
    std::mem::forget(sb);
    assert!(!support::pid_alive(helper));
    assert!(support::wait_gone(sandbox), "bwrap still running");
    for pid in before {
        assert!(
            support::wait_gone(pid),
            "sandboxed process {pid} survived stop"
        );
    }
    assert!(support::pids_with(&format!("sleep {marker}")).is_empty());
}

#[test]
fn a_foreground_run_leaves_no_process_behind() {
    let env = TestEnv::new();
    let marker = format!("8888.{}", std::process::id());
    let out = env.run([
        "run",
        "--",
        "sh",
        "-c",
        &format!("sleep {marker} & echo bg"),
    ]);
    assert_eq!(out.code(), 0, "{out}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left = support::pids_with(&format!("sleep {marker}"));
    for pid in &left {
        assert!(support::wait_gone(*pid), "{pid} survived the run");
    }
}

#[test]
fn stop_ends_the_sandbox_through_its_agent_rather_than_by_killing_it() {
    let env = TestEnv::new();
    let sb = env.start("graceful", &["--keep"]);
    drop(sb);
    let log = fs::read_to_string(env.runtime().join("graceful.log")).unwrap();
    assert!(log.contains("stopping sandbox graceful"), "{log}");
    assert!(!log.contains("killing it"), "{log}");
}
