//! What holds inside a namespace sandbox whoever starts it (root or a
//! user): no capabilities, root inside is nobody outside, read-only kernel
//! knobs, no host descriptors, sized tmpfs, and one rule for the state dir
//! whoever dies first.

use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use crate::support::{self, TestEnv};

/// `Name:\tvalue` from a `/proc/PID/status` text.
fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in {status}"))
}

#[test]
fn a_sandboxed_process_has_no_capabilities_and_root_inside_is_nobody_outside() {
    let env = TestEnv::new();
    let sb = env.start("caps", &[]);
    let out = sb.exec(&["cat", "/proc/self/status", "/proc/self/uid_map"]);
    assert_eq!(out.code(), 0, "{out}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(&out.stdout, cap),
            "0000000000000000",
            "{cap}: {out}"
        );
    }
    assert_eq!(status_field(&out.stdout, "NoNewPrivs"), "1", "{out}");
    assert_eq!(status_field(&out.stdout, "Seccomp"), "2", "{out}");
    // Root inside, and inside uid 0 maps to exactly one outside id.
    let uids: Vec<&str> = status_field(&out.stdout, "Uid")
        .split_whitespace()
        .collect();
    assert_eq!(uids, ["0", "0", "0", "0"], "{out}");
    let map: Vec<u32> = out
        .stdout
        .lines()
        .last()
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(map.len(), 3, "{out}");
    assert_eq!((map[0], map[2]), (0, 1), "{out}");
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    if support::is_root() {
        assert_ne!(map[1], 0, "root inside is the host's root: {out}");
    } else {
        assert_eq!(map[1], me, "{out}");
    }
    let info = env.info("caps");
    assert_eq!(info["uid_map"], format!("0:{}:1", map[1]), "{info:?}");
}

#[test]
fn host_secrets_and_kernel_knobs_are_out_of_reach() {
    let env = TestEnv::new();
    let sb = env.start("knobs", &[]);
    // /proc/sys is a read-only mount: EROFS, whoever asks.
    let out = sb.sh("echo '|/tmp/x' > /proc/sys/kernel/core_pattern");
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("Read-only file system"), "{out}");
    let out = sb.sh("echo 1 > /proc/sysrq-trigger");
    assert_ne!(out.code(), 0, "{out}");
    if std::path::Path::new("/etc/shadow").exists() {
        let out = sb.exec(&["cat", "/etc/shadow"]);
        assert_ne!(out.code(), 0, "/etc/shadow was readable: {out}");
        assert!(out.stdout.is_empty());
    }
    // The sandbox's / and /dev are read-only; /tmp, /run and its own dirs
    // are where it writes.
    for path in ["/x", "/dev/x", "/usr/x", "/etc/x"] {
        let out = sb.exec(&["touch", path]);
        assert_ne!(out.code(), 0, "{path} was writable: {out}");
    }
    let out = sb.sh("touch /tmp/x /run/x /work/x /root/x /results/x /dev/shm/x && echo ok");
    assert_eq!(out.stdout, "ok\n", "{out}");
}

#[test]
fn tmp_is_a_sized_tmpfs_that_refuses_to_grow_past_its_size() {
    let env = TestEnv::new();
    let sb = env.start("tmpsz", &["--tmp", "8M"]);
    let out = sb.sh("head -c 20000000 /dev/zero > /tmp/big; echo rc=$?; wc -c < /tmp/big");
    assert!(out.stdout.starts_with("rc=1"), "{out}");
    let written: u64 = out.stdout.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(written <= 8 << 20, "{written} bytes in an 8 MiB /tmp");
    assert!(out.stderr.contains("No space left"), "{out}");
    assert_eq!(env.info("tmpsz")["tmp_mib"], "8");
    let bad = env.run(["run", "--tmp", "lots", "--", "true"]);
    assert_eq!(bad.code(), 125, "{bad}");
    assert!(bad.stderr.contains("not a size"), "{bad}");
}

#[test]
fn no_descriptor_of_the_process_that_started_boxdesk_reaches_the_sandbox() {
    let env = TestEnv::new();
    let (r, w) = nix::unistd::pipe().unwrap();
    let (r_raw, w_raw) = (r.as_raw_fd(), w.as_raw_fd());
    let mut cmd = env.cmd(["run", "--", "ls", "/proc/self/fd"]);
    // SAFETY: fcntl on descriptors open in the parent; async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [r_raw, w_raw] {
                libc::fcntl(fd, libc::F_SETFD, 0);
            }
            Ok(())
        });
    }
    let out = support::output(cmd);
    drop((r, w));
    assert_eq!(out.code(), 0, "{out}");
    // 0, 1, 2 and the directory ls reads.
    let fds: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(fds, ["0", "1", "2", "3"], "{out}");
}

#[test]
fn the_agent_cannot_be_reached_through_proc_and_the_host_log_cannot_be_truncated() {
    let env = TestEnv::new();
    let sb = env.start("logcap", &[]);
    let log = env.runtime().join("logcap.log");
    let before = fs::metadata(&log).unwrap().len();
    let out = sb.sh(": > /proc/1/fd/1; echo x >> /proc/1/fd/2; ls /proc/1/fd");
    assert_ne!(out.code(), 0, "{out}");
    assert!(
        out.stdout.is_empty(),
        "the agent's descriptors are listed: {out}"
    );
    assert!(
        fs::metadata(&log).unwrap().len() >= before,
        "the log shrank"
    );
    // The socket the agent listens on is nowhere inside.
    let out = sb.sh(
        "test -e /run/boxdesk/agent.sock && echo present; find / -xdev -type s 2>/dev/null; true",
    );
    assert_eq!(out.code(), 0, "{out}");
    assert!(!out.stdout.contains("present"), "{out}");
    assert!(!out.stdout.contains("agent"), "a socket inside: {out}");
}

#[test]
fn a_dead_agent_leaves_work_until_stop_and_a_second_run_refuses_the_leftover() {
    let env = TestEnv::new();
    let sb = env.start("agentdies", &[]);
    assert_eq!(sb.sh("echo precious > /work/p").code(), 0);
    let info = env.info("agentdies");
    let helper: u32 = info["pid"].parse().unwrap();
    let bwrap: u32 = info["sandbox_pid"].parse().unwrap();
    // The agent is bwrap's only child: PID 1 of the sandbox.
    let agent = fs::read_to_string(format!("/proc/{bwrap}/task/{bwrap}/children")).unwrap();
    let agent: i32 = agent.trim().parse().unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(agent, libc::SIGKILL) };
    assert!(
        support::wait_gone_within(helper, Duration::from_secs(10)),
        "the helper outlived its sandbox"
    );
    std::mem::forget(sb);
    let state = env.state_of("agentdies");
    assert_eq!(
        fs::read_to_string(state.join("work/p")).unwrap(),
        "precious\n"
    );
    let ls = env.run(["ls", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&ls.stdout).unwrap();
    let row = &rows.as_array().unwrap()[0];
    assert_eq!(row["name"], "agentdies", "{ls}");
    assert_eq!(row["state"], "dead", "{ls}");
    assert!(row["reason"].as_str().unwrap().contains("exited"), "{ls}");
    for args in [
        &["info", "agentdies"][..],
        &["exec", "agentdies", "--", "true"],
        &["cp", "agentdies:/work/p", "/tmp/"],
    ] {
        let out = env.run(args);
        assert_eq!(out.code(), 125, "{args:?}: {out}");
        assert!(
            out.stderr.contains("is dead") && out.stderr.contains("boxdesk stop agentdies"),
            "{args:?}: {out}"
        );
    }
    let again = env.run(["run", "--name", "agentdies", "--", "true"]);
    assert_eq!(again.code(), 125, "{again}");
    assert!(
        again.stderr.contains(&state.display().to_string()),
        "{again}"
    );
    assert!(again.stderr.contains("--reuse"), "{again}");
    let out = env.run([
        "run",
        "--name",
        "agentdies",
        "--reuse",
        "--keep",
        "--",
        "cat",
        "/work/p",
    ]);
    assert_eq!(out.stdout, "precious\n", "{out}");
    let out = env.run(["stop", "agentdies"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(
        out.stderr.contains("--keep"),
        "a kept sandbox says it keeps: {out}"
    );
    assert!(state.exists());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&env.run(["ls", "--json"]).stdout).unwrap()[0]
            ["state"],
        "stopped"
    );
}

#[test]
fn a_killed_helper_shows_as_dead_and_stop_cleans_up_after_it() {
    let env = TestEnv::new();
    let sb = env.start("helperdies", &[]);
    assert_eq!(sb.sh("echo w > /work/w").code(), 0);
    let info = env.info("helperdies");
    let helper: u32 = info["pid"].parse().unwrap();
    let bwrap: u32 = info["sandbox_pid"].parse().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(helper as i32, libc::SIGKILL) };
    assert!(support::wait_gone(helper));
    std::mem::forget(sb);
    assert!(support::wait_gone(bwrap), "the sandbox outlived its helper");
    let ls = env.run(["ls"]);
    assert!(
        ls.stdout
            .lines()
            .any(|l| l.starts_with("helperdies") && l.contains("dead")),
        "{ls}"
    );
    let state = env.state_of("helperdies");
    assert!(state.join("work/w").exists());
    let out = env.run(["run", "--name", "helperdies", "--detach"]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("--reuse"), "{out}");
    let out = env.run(["stop", "helperdies"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(!state.exists(), "stop left the state of a dead sandbox");
    assert!(env.run(["ls"]).stdout.lines().count() <= 1);
    let out = env.run(["stop", "helperdies"]);
    assert_eq!(out.code(), 125, "a second stop finds nothing: {out}");
}

#[test]
fn stop_removes_a_work_tree_two_thousand_levels_deep_and_answers() {
    let env = TestEnv::new();
    let sb = env.start("deep", &[]);
    // Each level made with a relative mkdir: the whole path is far past
    // PATH_MAX, as a hostile sandbox would make it.
    let out = sb.sh("cd /work && i=0; while [ $i -lt 2000 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; echo deep > f; echo ok");
    assert_eq!(out.stdout, "ok\n", "{out}");
    let helper: u32 = env.info("deep")["pid"].parse().unwrap();
    let out = env.run(["stop", "deep"]);
    assert_eq!(out.code(), 0, "{out}");
    std::mem::forget(sb);
    assert!(support::wait_gone(helper));
    assert!(
        !env.state_of("deep").exists(),
        "the deep tree survived stop"
    );
    let log = env.runtime().join("deep.log");
    assert!(!log.exists(), "the helper died before its clean-up");
}

#[test]
fn with_the_hosts_network_the_sandbox_still_cannot_reconfigure_it() {
    let Some(ip) = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        println!("skipped: no `ip` binary (iproute2) on this host");
        return;
    };
    let env = TestEnv::new();
    let sb = env.start("netadmin", &["--net"]);
    let out = sb.exec(&[ip, "link", "set", "dev", "lo", "mtu", "1280"]);
    assert_ne!(
        out.code(),
        0,
        "the sandbox reconfigured the host's lo: {out}"
    );
    assert!(out.stderr.contains("Operation not permitted"), "{out}");
}

#[test]
fn a_fork_bomb_is_held_by_the_pids_limit_and_gone_when_its_exec_times_out() {
    let env = TestEnv::new();
    let sb = env.start("forks", &["--pids", "256"]);
    assert_eq!(env.info("forks")["pids_max"], "256");
    let marker = format!("7777.{}", std::process::id());
    // 5,000 forks asked for, each becoming a `sleep` (dash gives up at its
    // first failed fork; python keeps asking); the count of processes that
    // run goes to stderr, then it waits to be timed out.
    let script = format!(
        "import os, sys, time\n\
         for i in range(5000):\n    \
             try:\n        \
                 if os.fork() == 0:\n            \
                     os.execvp('sleep', ['sleep', '{marker}'])\n    \
             except OSError:\n        \
                 pass\n\
         print(sum(1 for p in os.listdir('/proc') if p.isdigit()), file=sys.stderr, flush=True)\n\
         time.sleep(100)\n"
    );
    let out = env.run([
        "exec",
        "forks",
        "--timeout",
        "5",
        "--",
        "python3",
        "-c",
        &script,
    ]);
    assert_eq!(out.code(), 124, "{out}");
    let held: u32 = out
        .stderr
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no process count: {out}"));
    assert!(held <= 256, "{held} processes under a limit of 256");
    assert!(held >= 200, "the loop should reach the limit: {held}");
    // Every one of them ended with the exec.
    let left = support::pids_with(&format!("sleep {marker}"));
    assert!(
        left.is_empty(),
        "{} sleeps outlived exec --timeout",
        left.len()
    );
    // And the sandbox still works.
    assert_eq!(sb.exec(&["echo", "alive"]).stdout, "alive\n");
}

#[test]
fn info_shows_the_limits_that_hold_and_a_memory_hog_is_stopped_where_they_do() {
    let env = TestEnv::new();
    // Without --mem: half the host's RAM, where a cgroup holds memory.
    let sb0 = env.start("nolimits", &[]);
    let info = env.info("nolimits");
    assert!(!info.contains_key("vcpus"), "{info:?}");
    let memory_holds = matches!(info["limits"].as_str(), "cgroup-v1" | "cgroup-v2")
        && !info
            .get("limits_unenforced")
            .is_some_and(|u| u.contains("--mem"));
    if memory_holds {
        let half = host_mem_mib() / 2;
        assert_eq!(info["mem_mib"], half.to_string(), "{info:?}");
    } else {
        assert!(!info.contains_key("mem_mib"), "{info:?}");
    }
    drop(sb0);
    if !memory_holds {
        // A limit the user typed that cannot hold is refused, not recorded.
        let out = env.run([
            "run", "--detach", "--name", "limits", "--mem", "64", "--cpus", "1",
        ]);
        assert_ne!(
            out.code(),
            0,
            "an unenforceable --mem must be refused: {out}"
        );
        assert!(out.stderr.contains("cannot enforce --mem"), "{out}");
        assert!(out.stderr.contains("boxdesk doctor"), "{out}");
        assert!(!env.sock("limits").exists(), "nothing may be left running");
        // Where no cgroup holds memory, the refusal is the whole promise.
        return;
    }
    let cpu_holds = !info
        .get("limits_unenforced")
        .is_some_and(|u| u.contains("--cpus"));
    let mut flags = vec!["--mem", "64", "--pids", "300"];
    if cpu_holds {
        flags.extend(["--cpus", "1"]);
    }
    let sb = env.start("limits", &flags);
    let info = env.info("limits");
    assert_eq!(info["mem_mib"], "64", "{info:?}");
    if cpu_holds {
        assert_eq!(info["vcpus"], "1", "{info:?}");
    }
    assert_eq!(info["pids_max"], "300", "{info:?}");
    assert!(info["cgroup"].contains("boxdesk"), "{info:?}");
    let out = sb.exec(&[
        "python3",
        "-c",
        "b = bytearray(256 << 20); print('survived')",
    ]);
    assert_eq!(
        out.code(),
        137,
        "a 256 MiB allocation under a 64 MiB limit: {out}"
    );
    assert!(!out.stdout.contains("survived"));
}

/// The host's `MemTotal` in MiB.
fn host_mem_mib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    kib / 1024
}

#[test]
fn the_agent_greets_its_sandboxs_owner_and_closes_on_any_other_uid_unanswered() {
    use std::os::unix::fs::PermissionsExt;
    if support::skip_unless_root("connecting as another uid needs root") {
        return;
    }
    let env = TestEnv::new();
    let _sb = env.start("peer", &[]);
    // Root's sandbox maps one subordinate id onto its root: a host process
    // of that id is root inside, but not the sandbox's owner.
    let map = env.info("peer")["uid_map"].clone();
    let mapped: u32 = map
        .split(':')
        .nth(1)
        .and_then(|u| u.parse().ok())
        .expect(&map);
    let sock = env.state_of("peer").join("agent.sock");
    // Let any uid reach the socket file: what must refuse them is the agent.
    for dir in [
        env.root().to_owned(),
        env.xdg_state.clone(),
        env.xdg_state.join("boxdesk"),
        env.state_of("peer"),
    ] {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711)).unwrap();
    }
    fs::set_permissions(&sock, fs::Permissions::from_mode(0o666)).unwrap();
    // The first four bytes the agent sends a peer that connects as `uid`.
    let first = |uid: Option<u32>| -> String {
        let script = "import socket, sys\n\
                      s = socket.socket(socket.AF_UNIX)\n\
                      s.settimeout(10)\n\
                      s.connect(sys.argv[1])\n\
                      print(repr(s.recv(4)))\n";
        let mut c = std::process::Command::new("python3");
        c.args(["-c", script]).arg(&sock);
        if let Some(uid) = uid {
            c.uid(uid).gid(uid);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(first(None), "b'AGCH'", "the owner is greeted");
    assert_eq!(first(Some(mapped)), "b''", "uid {mapped} was served");
    // (the refused peer is root inside: the one id the map gives it)
    let log = env.log_tail("peer", 8192);
    assert!(
        log.contains("connection(s) from uid 0: only the sandbox's owner may connect"),
        "{log}"
    );
}

#[test]
fn on_the_hosts_network_a_sandbox_reaches_no_host_abstract_socket_where_landlock_scopes_it() {
    use std::os::linux::net::SocketAddrExt;
    let abi = support::landlock_abi();
    // A stand-in for the X server's `@/tmp/.X11-unix/X0` or a D-Bus bus.
    let name = support::unique("boxdesk-test-abstract");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let host = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    host.set_nonblocking(true).unwrap();
    let env = TestEnv::new();
    let sb = env.start("abstract", &["--net"]);
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         try:\n    s.connect('\\0{name}')\n    print('connected')\n\
         except OSError as e:\n    print('refused', e.errno)\n\
         own = socket.socket(socket.AF_UNIX)\n\
         own.bind('\\0inside-{name}')\n\
         own.listen()\n\
         socket.socket(socket.AF_UNIX).connect('\\0inside-{name}')\n\
         print('own ok')\n"
    );
    let out = sb.exec(&["python3", "-c", &script]);
    assert_eq!(out.code(), 0, "{out}");
    if abi < 6 {
        println!("skipped: Landlock ABI {abi} has no abstract-socket scope here");
        return;
    }
    assert_eq!(out.stdout, "refused 1\nown ok\n", "{out}");
    assert!(
        host.accept().is_err(),
        "the host's socket took a connection"
    );
}
