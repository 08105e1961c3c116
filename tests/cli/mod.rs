//! The command line: exit codes, the run/exec/cp/ls/stop cycle, and the bad
//! input (duplicate names, stale sockets, unsafe runtime dirs,
//! bad names, missing sandboxes).

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use crate::support::{self, TestEnv};

#[cfg(target_os = "linux")]
mod apparmor;
mod cp;
mod stall;

#[test]
fn run_prints_the_commands_output_and_exits_with_its_code() {
    let env = TestEnv::new();
    let out = env.run(["run", "--", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!(out.code(), 3, "{out}");
    assert_eq!(out.stdout, "hi\n", "{out}");
    // Nothing of the sandbox is left behind by a foreground run (the
    // per-boot hypervisor probe result may stay: it is not the sandbox's).
    let left: Vec<_> = fs::read_dir(env.runtime())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name() != "hv-probe")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn stderr_is_kept_apart_from_stdout() {
    let env = TestEnv::new();
    let out = env.run(["run", "--", "sh", "-c", "echo out; echo err >&2"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");
}

#[test]
fn a_command_killed_by_a_signal_exits_128_plus_the_signal() {
    let env = TestEnv::new();
    let out = env.run(["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.code(), 128 + 15, "{out}");
    let out = env.run(["run", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.code(), 128 + 9, "{out}");
}

#[test]
fn an_expired_timeout_exits_124() {
    let env = TestEnv::new();
    let start = std::time::Instant::now();
    let out = env.run(["run", "--timeout", "0.5", "--", "sleep", "30"]);
    assert_eq!(out.code(), 124, "{out}");
    assert!(start.elapsed().as_secs() < 20);
    let sb = env.start("t124", &[]);
    let out = env.run(["exec", "t124", "--timeout", "0.3", "--", "sleep", "30"]);
    assert_eq!(out.code(), 124, "{out}");
    assert_eq!(sb.exec(&["true"]).code(), 0);
}

#[test]
fn a_missing_program_exits_127() {
    let env = TestEnv::new();
    let out = env.run(["run", "--", "no-such-program-here"]);
    assert_eq!(out.code(), 127, "{out}");
    assert!(out.stderr.contains("ENOENT"), "{out}");
}

#[test]
fn exec_on_a_missing_sandbox_fails_clearly_with_125() {
    let env = TestEnv::new();
    let out = env.run(["exec", "ghost", "--", "true"]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("no such sandbox: ghost"), "{out}");
    for args in [
        &["info", "ghost"][..],
        &["stop", "ghost"],
        &["cp", "/etc/hostname", "ghost:/work/"],
    ] {
        let out = env.run(args);
        assert_eq!(out.code(), 125, "{args:?}: {out}");
        assert!(out.stderr.contains("no such sandbox"), "{args:?}: {out}");
    }
}

#[test]
fn names_outside_the_grammar_are_refused_with_125() {
    let env = TestEnv::new();
    let long = "a".repeat(65);
    for bad in ["-x", ".hidden", "a/b", "a b", "é", long.as_str(), ""] {
        let out = env.run(["run", &format!("--name={bad}"), "--", "true"]);
        assert_eq!(out.code(), 125, "{bad:?}: {out}");
        assert!(out.stderr.contains("name"), "{bad:?}: {out}");
    }
    let out = env.run(["exec", "a/b", "--", "true"]);
    assert_eq!(out.code(), 125, "{out}");
    let ok = "A0_.-z".to_owned() + &"b".repeat(58);
    let out = env.run(["run", "--name", &ok, "--", "true"]);
    assert_eq!(out.code(), 0, "{out}");
}

#[test]
fn usage_errors_exit_125_and_help_exits_0() {
    let env = TestEnv::new();
    assert_eq!(env.run(["frobnicate"]).code(), 125);
    assert_eq!(env.run(["run", "--cpus", "many", "--", "true"]).code(), 125);
    assert_eq!(env.run(["exec", "x"]).code(), 125);
    assert_eq!(env.run(["run", "--detach", "--", "true"]).code(), 125);
    assert_eq!(
        env.run(["run", "--timeout", "-1", "--", "true"]).code(),
        125
    );
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["exec", "--help"],
        &["cp", "--help"],
        &["ls", "--help"],
        &["stop", "--help"],
        &["doctor", "--help"],
    ] {
        let out = env.run(args);
        assert_eq!(out.code(), 0, "{args:?}: {out}");
        assert!(out.stdout.contains("Usage"), "{args:?}: {out}");
    }
}

#[test]
fn backends_that_cannot_run_here_are_refused_with_the_reason() {
    let env = TestEnv::new();
    let out = env.run(["run", "--backend", "hvf", "--", "true"]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(
        out.stderr
            .contains("the hvf backend needs macOS on Apple silicon"),
        "{out}"
    );
    if env.run(["doctor"]).stdout.contains("kvm (accelerated)") {
        println!("skipped: the kvm refusal (this KVM can boot VMs; tests/vm covers it)");
    } else {
        let out = env.run(["run", "--backend", "kvm", "--", "true"]);
        assert_eq!(out.code(), 125, "{out}");
        assert!(out.stderr.contains("kvm backend cannot run here"), "{out}");
        let mut c = env.cmd(["run", "--", "true"]);
        c.env("BOXDESK_BACKEND", "kvm");
        let out = support::output(c);
        assert_eq!(out.code(), 125, "{out}");
    }
    let mut c = env.cmd(["run", "--", "true"]);
    c.env("BOXDESK_BACKEND", "namespace");
    assert_eq!(support::output(c).code(), 0);
    let out = env.run(["run", "--backend", "auto", "--", "true"]);
    assert_eq!(out.code(), 0, "{out}");
}

#[test]
fn a_second_run_with_the_same_name_fails_and_leaves_the_first_running() {
    let env = TestEnv::new();
    let sb = env.start("dup", &[]);
    let pid = env.info("dup")["pid"].clone();
    let out = env.run(["run", "--detach", "--name", "dup"]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("already running"), "{out}");
    let out = env.run(["run", "--name", "dup", "--", "true"]);
    assert_eq!(out.code(), 125, "{out}");
    assert_eq!(env.info("dup")["pid"], pid, "the socket changed hands");
    assert_eq!(sb.exec(&["true"]).code(), 0);
}

#[test]
fn two_runs_with_the_same_name_at_once_leave_exactly_one() {
    let env = TestEnv::new();
    let spawn = || {
        let mut c = env.cmd(["run", "--detach", "--name", "race"]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (support::wait_output(a), support::wait_output(b));
    let _sb = support::Started::adopt(&env, "race");
    let mut codes = [a.code(), b.code()];
    codes.sort();
    assert_eq!(codes, [0, 125], "{a}\n{b}");
    let loser = if a.code() == 125 { &a } else { &b };
    assert!(loser.stderr.contains("already running"), "{loser}");
    assert_eq!(env.info("race")["state"], "running");
    assert_eq!(env.run(["exec", "race", "--", "true"]).code(), 0);
}

/// Starts `name`, SIGKILLs its helper and waits for it and its sandbox to
/// die, leaving their sockets behind.
fn kill_helper(env: &TestEnv, name: &str) {
    let sb = env.start(name, &[]);
    let info = env.info(name);
    let pid: u32 = info["pid"].parse().unwrap();
    let sandbox: u32 = info["sandbox_pid"].parse().unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    assert!(support::wait_gone(pid));
    assert!(
        support::wait_gone(sandbox),
        "the sandbox outlived its helper"
    );
    assert!(env.sock(name).exists(), "expected a stale socket");
    std::mem::forget(sb);
}

#[test]
fn a_dead_helpers_socket_is_cleaned_by_ls_which_lists_the_sandbox_as_dead() {
    let env = TestEnv::new();
    kill_helper(&env, "gone");
    let _live = env.start("alive", &[]);
    let out = env.run(["ls"]);
    assert_eq!(out.code(), 0, "{out}");
    let gone = out
        .stdout
        .lines()
        .find(|l| l.starts_with("gone"))
        .unwrap_or("");
    assert!(gone.split_whitespace().any(|w| w == "dead"), "{out}");
    assert!(out.stdout.contains("alive"), "{out}");
    assert!(!env.sock("dead").exists(), "stale socket not removed");
    assert!(
        !env.agent("dead").exists(),
        "stale agent socket not removed"
    );
}

#[test]
fn a_stale_socket_from_a_killed_helper_is_cleaned_and_the_name_reused_after_stop() {
    let env = TestEnv::new();
    kill_helper(&env, "again");
    let out = env.run(["stop", "again"]);
    assert_eq!(out.code(), 0, "stop cleans up after a dead helper: {out}");
    let sb = env.start("again", &[]);
    assert_eq!(sb.sh("echo back").stdout, "back\n");
}

#[test]
fn a_runtime_dir_with_mode_0755_is_refused() {
    let env = TestEnv::new();
    fs::create_dir(env.runtime()).unwrap();
    fs::set_permissions(env.runtime(), fs::Permissions::from_mode(0o755)).unwrap();
    for args in [
        &["ls"][..],
        &["run", "--", "true"],
        &["exec", "x", "--", "true"],
    ] {
        let out = env.run(args);
        assert_eq!(out.code(), 125, "{args:?}: {out}");
        assert!(
            out.stderr.contains("0755") && out.stderr.contains("chmod 700"),
            "{out}"
        );
    }
}

#[test]
fn a_runtime_dir_owned_by_another_user_is_refused() {
    if support::skip_unless_root("chown to another uid") {
        return;
    }
    let env = TestEnv::new();
    fs::create_dir(env.runtime()).unwrap();
    fs::set_permissions(env.runtime(), fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(env.runtime(), Some(65534), Some(65534)).unwrap();
    for args in [&["ls"][..], &["run", "--", "true"]] {
        let out = env.run(args);
        assert_eq!(out.code(), 125, "{args:?}: {out}");
        assert!(out.stderr.contains("owned by uid 65534"), "{out}");
    }
}

#[test]
fn a_symlinked_runtime_dir_is_refused() {
    let env = TestEnv::new();
    let real = env.root().join("elsewhere");
    fs::create_dir(&real).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&real, env.runtime()).unwrap();
    let out = env.run(["ls"]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("symlink"), "{out}");
}

#[test]
fn detached_run_exec_cp_ls_and_stop_work_together() {
    let env = TestEnv::new();
    let out = env.run(["run", "--detach"]);
    assert_eq!(out.code(), 0, "{out}");
    let name = out.stdout.trim().to_owned();
    assert!(name.starts_with("bx-") && name.len() == 7, "{name:?}");
    let sb = support::Started::adopt(&env, &name);

    // exec: output, cwd, env.
    let out = env.run([
        "exec",
        &name,
        "--cwd",
        "/tmp",
        "-e",
        "GREETING=hello there",
        "--",
        "sh",
        "-c",
        "pwd; echo $GREETING",
    ]);
    assert_eq!(out.stdout, "/tmp\nhello there\n", "{out}");
    assert_eq!(sb.exec(&["pwd"]).stdout, "/work\n");

    // cp host → sandbox: a file, into a directory (keeps its name), a tree.
    let host = env.root().join("host");
    fs::create_dir_all(host.join("tree/sub/deeper")).unwrap();
    fs::create_dir_all(host.join("tree/empty")).unwrap();
    fs::write(host.join("one.txt"), "one\n").unwrap();
    fs::write(host.join("tree/a.txt"), "a\n").unwrap();
    fs::write(host.join("tree/sub/deeper/z.txt"), "z\n").unwrap();
    let big: Vec<u8> = (0..1_500_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(host.join("tree/sub/big.bin"), &big).unwrap();
    fs::set_permissions(
        host.join("tree/sub/big.bin"),
        fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let target = format!("{name}:/work/renamed.txt");
    assert_eq!(
        env.run(["cp", &s(&host.join("one.txt")), &target]).code(),
        0
    );
    let target = format!("{name}:/work");
    assert_eq!(
        env.run(["cp", &s(&host.join("one.txt")), &target]).code(),
        0
    );
    let out = env.run(["cp", &s(&host.join("tree")), &target]);
    assert_eq!(out.code(), 125, "a directory needs -r: {out}");
    let out = env.run(["cp", "-r", &s(&host.join("tree")), &target]);
    assert_eq!(out.code(), 0, "{out}");
    let out = sb.sh("cat /work/renamed.txt /work/one.txt /work/tree/a.txt /work/tree/sub/deeper/z.txt; stat -c %a /work/tree/sub/big.bin; wc -c < /work/tree/sub/big.bin; test -d /work/tree/empty && echo empty-dir");
    assert_eq!(
        out.stdout, "one\none\na\nz\n750\n1500000\nempty-dir\n",
        "{out}"
    );

    // cp sandbox → host: a file, into a directory, a tree.
    sb.sh("mkdir -p /results/r/s && echo res > /results/r/s/f && printf x > /work/empty-not && : > /work/zero");
    let back = env.root().join("back");
    fs::create_dir(&back).unwrap();
    let from = format!("{name}:/work/tree/sub/big.bin");
    assert_eq!(env.run(["cp", &from, &s(&back)]).code(), 0);
    assert_eq!(fs::read(back.join("big.bin")).unwrap(), big);
    assert_eq!(
        fs::metadata(back.join("big.bin"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o750
    );
    let from = format!("{name}:/work/zero");
    assert_eq!(
        env.run(["cp", &from, &s(&back.join("zero-copy"))]).code(),
        0
    );
    assert_eq!(fs::read(back.join("zero-copy")).unwrap(), b"");
    let from = format!("{name}:/work/tree");
    let out = env.run(["cp", "-r", &from, &s(&back)]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        fs::read_to_string(back.join("tree/sub/deeper/z.txt")).unwrap(),
        "z\n"
    );
    assert_eq!(fs::read(back.join("tree/sub/big.bin")).unwrap(), big);
    assert!(back.join("tree/empty").is_dir());
    let from = format!("{name}:/results");
    let out = env.run(["cp", "-r", &from, &s(&back.join("res"))]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(fs::read_to_string(back.join("res/r/s/f")).unwrap(), "res\n");
    let from = format!("{name}:/work/missing");
    let out = env.run(["cp", &from, &s(&back)]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("ENOENT"), "{out}");

    // ls, as a table and as JSON.
    let out = env.run(["ls"]);
    assert_eq!(out.code(), 0, "{out}");
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        [
            "NAME",
            "BACKEND",
            "ISOLATION",
            "STATE",
            "CPUS",
            "MEM",
            "UPTIME"
        ]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..5],
        [
            name.as_str(),
            "namespace",
            "namespaces",
            "running",
            // A namespace sandbox has no CPU limit unless asked.
            "-",
        ]
    );
    // Its memory limit is half the host's RAM where a cgroup holds it.
    let mem = &env.info(&name).get("mem_mib").map(|m| format!("{m}M"));
    assert_eq!(row[5], mem.as_deref().unwrap_or("-"), "{row:?}");
    let out = env.run(["ls", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["name"], name.as_str());
    assert_eq!(v[0]["backend"], "namespace");
    assert_eq!(v[0]["isolation"], "namespaces");
    assert!(v[0].get("vcpus").is_none(), "{v}");
    assert_eq!(
        v[0].get("mem_mib").is_some(),
        v[0].get("mem_source").is_some_and(|s| s == "default"),
        "a memory limit nobody asked for is the default: {v}"
    );
    assert_eq!(v[0]["pids_max"], 4096);

    // info, then stop: returns once the helper is gone.
    let out = env.run(["info", &name]);
    assert!(out.stdout.contains("backend namespace\n"), "{out}");
    let pid: u32 = env.info(&name)["pid"].parse().unwrap();
    let out = env.run(["stop", &name]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(
        !support::pid_alive(pid),
        "stop returned before the helper exited"
    );
    assert_eq!(env.run(["ls", "--json"]).stdout.trim(), "[]");
    assert!(!env.state_of(&name).exists(), "state dir left behind");
    std::mem::forget(sb);
}

#[test]
fn exec_forwards_stdin_and_closes_it_at_eof() {
    let env = TestEnv::new();
    let _sb = env.start("stdin", &[]);
    let mut c = env.cmd(["exec", "stdin", "--", "sh", "-c", "wc -c; echo done"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = vec![b'x'; 300_000];
    let writer = std::thread::spawn(move || input.write_all(&data));
    let out = support::wait_output(child);
    writer.join().unwrap().unwrap();
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "300000\ndone\n", "{out}");
}

#[test]
fn exec_with_a_tty_runs_the_command_on_a_terminal() {
    let env = TestEnv::new();
    let sb = env.start("tty", &[]);
    let out = env.run([
        "exec",
        "-t",
        "tty",
        "--",
        "sh",
        "-c",
        "test -t 0 && test -t 1 && echo on-a-tty",
    ]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("on-a-tty"), "{out}");
    assert_eq!(sb.sh("test -t 1 || echo no-tty").stdout, "no-tty\n");
}

#[test]
fn doctor_reports_the_namespace_backend_the_hypervisor_probe_and_whether_a_vm_can_boot() {
    let env = TestEnv::new();
    let out = env.run(["doctor"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(
        out.stdout.contains("namespace backend: can run here"),
        "{out}"
    );
    assert!(out.stdout.contains("bubblewrap: available"), "{out}");
    let boots = out.stdout.contains("kvm (accelerated)");
    if boots {
        assert!(out.stdout.contains("kvm backend: "), "{out}");
    } else {
        assert!(
            out.stdout
                .contains("kvm backend: cannot run here: the hypervisor cannot boot a VM"),
            "{out}"
        );
        assert!(out.stdout.contains("--backend auto: namespace"), "{out}");
    }
    assert!(out.stdout.contains("hypervisor: "), "{out}");
    assert!(out.stdout.contains("/dev/kvm"), "{out}");
}

#[test]
fn doctor_says_when_bubblewrap_is_missing() {
    let env = TestEnv::new();
    let empty = env.root().join("empty-path");
    fs::create_dir(&empty).unwrap();
    let mut c = env.cmd(["doctor"]);
    c.env("PATH", &empty);
    let out = support::output(c);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stdout.contains("bwrap is not on PATH"), "{out}");
    let mut c = env.cmd(["run", "--", "true"]);
    c.env("PATH", &empty);
    let out = support::output(c);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("bubblewrap"), "{out}");
}

#[test]
fn run_without_a_command_reads_a_shell_script_from_stdin() {
    let env = TestEnv::new();
    let mut c = env.cmd(["run"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo from-the-shell; exit 4\n")
        .unwrap();
    let out = support::wait_output(child);
    assert_eq!(out.code(), 4, "{out}");
    assert_eq!(out.stdout, "from-the-shell\n", "{out}");
    assert!(
        out.stderr.contains("bx-"),
        "the generated name is not said: {out}"
    );
}

#[test]
fn an_interrupt_is_forwarded_to_the_command() {
    use std::io::{BufRead, BufReader};
    let env = TestEnv::new();
    let script = "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done";
    let mut c = env.cmd(["run", "--", "sh", "-c", script]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "got-int\n");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(7));
}

#[test]
fn killing_a_foreground_run_stops_its_sandbox() {
    let env = TestEnv::new();
    let mut c = env.cmd(["run", "--name", "orphan", "--", "sleep", "60"]);
    c.stdout(Stdio::null()).stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let start = std::time::Instant::now();
    while !env.agent("orphan").exists() {
        assert!(start.elapsed().as_secs() < 20, "never started");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let info = env.info("orphan");
    let helper: u32 = info["pid"].parse().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(support::wait_gone(helper), "the helper outlived its CLI");
    assert!(!env.sock("orphan").exists());
    let state = env.state_of("orphan");
    if state.exists() {
        // What it left says why (an `ended` mark holds the reason).
        let left: Vec<String> = fs::read_dir(&state)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| {
                        let text = fs::read_to_string(e.path()).unwrap_or_default();
                        format!("{}: {text:?}", e.file_name().to_string_lossy())
                    })
                    .collect()
            })
            .unwrap_or_default();
        panic!("the state dir stayed, holding {left:?}");
    }
}

/// Reads the PTY master `pty` into `seen` until `want` appears (carriage
/// returns dropped), each read waiting at most 10 s. End of file (`EIO`
/// once every slave is closed) before `want` fails the test.
fn read_pty_until(pty: &mut fs::File, seen: &mut String, want: &str) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::io::Read;
    use std::os::fd::AsFd;
    while !seen.replace('\r', "").contains(want) {
        let mut fds = [PollFd::new(pty.as_fd(), PollFlags::POLLIN)];
        let n = poll(&mut fds, PollTimeout::from(10_000u16)).expect("poll");
        assert!(
            n > 0,
            "no output within 10 s; waiting for {want:?}, got {seen:?}"
        );
        let mut buf = [0u8; 4096];
        match pty.read(&mut buf) {
            Ok(0) | Err(_) => panic!("the PTY closed; waiting for {want:?}, got {seen:?}"),
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
}

#[test]
fn a_window_size_change_reaches_the_sandbox_as_a_resize() {
    use nix::pty::{openpty, Winsize};
    use std::os::fd::AsRawFd;
    let size = |rows, cols| Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let env = TestEnv::new();
    let sb = env.start("winch", &[]);
    let pty = openpty(Some(&size(24, 80)), None).expect("openpty");
    let script = "stty size; read x; stty size";
    let mut cli = {
        let mut c = env.cmd(["exec", "-t", "winch", "--", "sh", "-c", script]);
        c.stdin(Stdio::from(pty.slave.try_clone().unwrap()))
            .stdout(Stdio::from(pty.slave))
            .stderr(Stdio::piped());
        // `c` goes out of scope here, and with it our slave descriptors:
        // the master reads EIO once the CLI is gone.
        support::KillOnDrop(c.spawn().unwrap())
    };
    let mut master = fs::File::from(pty.master);
    let mut seen = String::new();
    // The CLI blocks SIGWINCH and opens its signalfd before it sends the
    // command, so once the first size is out a SIGWINCH cannot be lost.
    read_pty_until(&mut master, &mut seen, "24 80\n");

    let new = size(50, 132);
    // SAFETY: TIOCSWINSZ reads one `winsize` from a valid pointer; the
    // descriptor is the open PTY master.
    let rc = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &new) };
    assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(cli.0.id() as i32, libc::SIGWINCH) };
    // Wait until the sandbox's PTY has the new size before releasing
    // `read`: the Resize and the newline travel from different threads of
    // the CLI, so their order on the wire is not otherwise fixed.
    let start = std::time::Instant::now();
    loop {
        let out = sb.sh(r#"for p in /dev/pts/[0-9]*; do stty size < "$p"; done"#);
        if out.stdout.lines().any(|l| l == "50 132") {
            break;
        }
        assert!(
            start.elapsed().as_secs() < 20,
            "the sandbox's PTY never got the new size: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    master.write_all(b"\n").unwrap();
    read_pty_until(&mut master, &mut seen, "50 132\n");

    let status = support::wait_exit(&mut cli.0);
    let mut stderr = String::new();
    std::io::Read::read_to_string(cli.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{stderr}\n--- pty\n{seen}");
    let sizes: Vec<&str> = seen
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.ends_with(" 80") || l.ends_with(" 132"))
        .collect();
    assert_eq!(sizes, ["24 80", "50 132"], "{seen:?}");
}

/// Resumes and kills a SIGSTOPped helper on drop if it is still the same
/// live process, so a failing test leaves nothing frozen behind.
struct Frozen {
    pid: u32,
    started: Option<String>,
}

impl Frozen {
    fn start_time(pid: u32) -> Option<String> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(19).map(str::to_owned)
    }

    fn stop(pid: u32) -> Self {
        let started = Self::start_time(pid);
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Frozen { pid, started }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.started.is_some()
            && Self::start_time(self.pid) == self.started
            && support::pid_alive(self.pid)
        {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe {
                libc::kill(self.pid as i32, libc::SIGCONT);
                libc::kill(self.pid as i32, libc::SIGKILL);
            }
            support::wait_gone(self.pid);
        }
    }
}

#[test]
fn stop_kills_a_helper_that_does_not_answer_within_ten_seconds() {
    use std::io::{BufRead, BufReader};
    let env = TestEnv::new();
    let _sb = env.start("frozen", &[]);
    let info = env.info("frozen");
    let helper: u32 = info["pid"].parse().unwrap();
    let sandbox: u32 = info["sandbox_pid"].parse().unwrap();

    // A command running in the sandbox, found on the host by a marker.
    let marker = support::unique("frozenmark");
    let script = format!("echo up; sleep 3600; : {marker}");
    let mut c = env.cmd(["exec", "frozen", "--", "sh", "-c", &script]);
    c.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut cli = support::KillOnDrop(c.spawn().unwrap());
    let mut line = String::new();
    BufReader::new(cli.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "up\n");
    let in_sandbox = || -> Vec<u32> {
        support::pids_with(&marker)
            .into_iter()
            .filter(|&p| p != cli.0.id())
            .collect()
    };
    assert!(
        !in_sandbox().is_empty(),
        "the marked command is not running"
    );

    let _frozen = Frozen::stop(helper);
    let start = std::time::Instant::now();
    let out = env.run(["stop", "frozen"]);
    let took = start.elapsed();
    // Documented: stop returns once the helper has exited, killing it
    // after 10 s; that is success.
    assert_eq!(out.code(), 0, "{out}");
    assert!(took.as_secs() < 30, "stop took {took:?}");
    assert!(out.stderr.contains("killing it"), "{out}");

    // Dead (absent, or a zombie nobody reaps: it was started detached).
    assert!(!support::pid_alive(helper), "the helper survived stop");
    assert!(
        support::wait_gone(sandbox),
        "the sandbox outlived its helper"
    );
    let start = std::time::Instant::now();
    while !in_sandbox().is_empty() {
        assert!(
            start.elapsed().as_secs() < 10,
            "sandboxed processes outlived the sandbox: {:?}",
            in_sandbox()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = support::wait_exit(&mut cli.0);
    assert_ne!(status.code(), Some(0), "the exec cannot have succeeded");

    let out = env.run(["ls", "--json"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout.trim(), "[]", "{out}");
    assert!(!env.sock("frozen").exists(), "control socket left behind");
    assert!(!env.agent("frozen").exists(), "agent socket left behind");
    assert!(
        !env.state_of("frozen").exists(),
        "the state dir of a killed helper is left behind"
    );
}

#[test]
fn version_names_the_release_its_commit_target_and_backends() {
    let env = TestEnv::new();
    let out = env.run(["--version"]);
    assert_eq!(out.code(), 0, "{out}");
    let line = out.stdout.trim();
    assert!(
        line.starts_with(&format!("boxdesk {} (", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    let commit = line
        .split("commit ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .unwrap_or_else(|| panic!("no commit in {line:?}"));
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    let in_git = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".git")
        .exists();
    assert!(
        (hash.len() >= 7 && hash.chars().all(|c| c.is_ascii_hexdigit()))
            || (!in_git && hash == "unknown"),
        "commit {commit:?} in {line:?}"
    );
    // The test binary is built for the same target as boxdesk.
    assert!(
        line.contains(&format!("target {},", env!("BOXDESK_TARGET"))),
        "{line:?}"
    );
    assert!(line.contains(std::env::consts::ARCH), "{line:?}");
    assert!(line.ends_with("backends: namespace kvm)"), "{line:?}");
}

#[test]
fn doctor_says_whether_cgroup_limits_hold_for_this_user_and_what_it_means_when_not() {
    let env = TestEnv::new();
    let out = env.run(["doctor"]);
    let layout = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("cgroups: "))
        .unwrap_or_else(|| panic!("no cgroups line: {out}"));
    let enforced = out.stdout.contains("\n  limits: enforced, ");
    let unenforced = out.stdout.contains("\n  limits: unenforced: ");
    assert!(enforced != unenforced, "{out}");
    // SAFETY: geteuid cannot fail and takes no memory.
    let uid = unsafe { libc::geteuid() };
    let v1 = layout.starts_with("v1") || layout.starts_with("hybrid");
    if uid != 0 && v1 {
        assert!(out.stdout.contains("no safe delegation"), "{out}");
    }
    if unenforced {
        assert!(out.stdout.contains("RLIMIT_NPROC"), "{out}");
    } else {
        assert!(out.stdout.contains("/boxdesk/NAME"), "{out}");
    }
}

#[test]
fn exec_reaches_a_namespace_sandboxs_agent_on_its_own_socket_without_the_helpers_relay() {
    let env = TestEnv::new();
    let name = support::unique("direct");
    let sb = env.start(&name, &[]);
    // With `<name>.agent` moved away only the agent's own socket (in the
    // private state dir) can answer.
    let relay = env.agent(&name);
    let aside = relay.with_extension("aside");
    fs::rename(&relay, &aside).unwrap();
    let out = sb.exec(&["sh", "-c", "echo direct"]);
    fs::rename(&aside, &relay).unwrap();
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "direct\n", "{out}");
}

#[test]
fn exec_trusts_the_agents_own_socket_only_in_a_private_state_root() {
    let env = TestEnv::new();
    let name = support::unique("notdirect");
    let sb = env.start(&name, &[]);
    let state_root = env.xdg_state.join("boxdesk");
    fs::set_permissions(&state_root, fs::Permissions::from_mode(0o755)).unwrap();
    // Through the relay it still works…
    let through_relay = sb.exec(&["true"]);
    // …and without the relay nothing answers: the agent's own socket in a
    // state root others can read is not used.
    let relay = env.agent(&name);
    let aside = relay.with_extension("aside");
    fs::rename(&relay, &aside).unwrap();
    let without_relay = sb.exec(&["true"]);
    fs::rename(&aside, &relay).unwrap();
    fs::set_permissions(&state_root, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(through_relay.code(), 0, "{through_relay}");
    assert_eq!(without_relay.code(), 125, "{without_relay}");
    assert!(
        without_relay.stderr.contains(&name),
        "the error names the sandbox: {without_relay}"
    );
}

#[test]
fn stop_frees_the_name_at_once_and_removes_a_deep_work_tree_without_killing_its_helper() {
    let env = TestEnv::new();
    let sb = env.start("deep", &[]);
    let helper: u32 = env.info("deep")["pid"].parse().unwrap();
    // Deep enough that removing it takes longer than stop's 10 s patience
    // with a helper that does not exit (about 13 s in a debug build here).
    let out = sb.exec(&[
        "python3",
        "-c",
        "import os\nos.chdir('/work')\nfor _ in range(150000):\n    os.mkdir('d'); os.chdir('d')\n",
    ]);
    assert_eq!(out.code(), 0, "{out}");
    std::mem::forget(sb);
    let out = env.run(["stop", "deep"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(!out.stderr.contains("killing"), "{out}");
    assert!(
        !env.state_of("deep").exists(),
        "the name's state dir is gone"
    );
    // The name is free at once; the tree goes on being removed.
    let again = env.start("deep", &[]);
    assert_eq!(again.sh("ls /work").stdout, "", "a fresh /work");
    drop(again);
    assert!(
        support::wait_gone_within(helper, std::time::Duration::from_secs(300)),
        "the first helper never finished removing its tree"
    );
    let trash = env.xdg_state.join("boxdesk/.trash");
    let left: Vec<_> = fs::read_dir(&trash)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the trash: {left:?}");
}

#[test]
fn the_lock_file_of_a_killed_helper_is_swept_by_ls() {
    let env = TestEnv::new();
    kill_helper(&env, "locked");
    let lock = env.runtime().join("locked.lock");
    assert!(lock.exists(), "a SIGKILLed helper leaves its lock file");
    assert_eq!(env.run(["ls"]).code(), 0);
    assert!(!lock.exists(), "ls sweeps a lock no process holds");
}
