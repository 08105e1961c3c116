//! Starting processes: exit codes, exec errors, environment, cwd, session.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use boxdesk_channel::{Exec, Frame};

use crate::support::{collect, parse_stat, sh, Agent};

#[test]
fn true_false_and_exit_42_report_their_exit_codes() {
    let agent = Agent::start();
    assert_eq!(
        agent.run(Exec::new("true", Vec::<&str>::new())).exit,
        Some(0)
    );
    assert_eq!(
        agent.run(Exec::new("false", Vec::<&str>::new())).exit,
        Some(1)
    );
    let r = agent.run(sh("exit 42"));
    assert_eq!(r.exit, Some(42));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.end, None, "the agent closes cleanly after Exit");
}

fn killed_by(sig: i32) -> Option<i32> {
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(sh("echo started; exec sleep 30")))
        .unwrap();
    assert_eq!(
        s.recv().unwrap(),
        Some(Frame::Stdout(b"started\n".to_vec()))
    );
    s.send(&Frame::Signal(sig)).unwrap();
    collect(&mut s).exit
}

#[test]
fn a_process_killed_by_sigterm_exits_with_minus_15() {
    assert_eq!(killed_by(libc::SIGTERM), Some(-15));
}

#[test]
fn a_process_killed_by_sigkill_exits_with_minus_9() {
    assert_eq!(killed_by(libc::SIGKILL), Some(-9));
}

#[test]
fn a_missing_program_is_an_enoent_error_and_no_exit() {
    let agent = Agent::start();
    let r = agent.run(Exec::new("no-such-program-boxdesk", Vec::<&str>::new()));
    assert_eq!(r.exit, None);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0].starts_with("ENOENT:"), "{}", r.errors[0]);
    assert_eq!(r.end, None);
}

#[test]
fn a_non_executable_file_is_an_eacces_error() {
    let agent = Agent::start();
    let script = agent.base.join("not-executable");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = agent.run(Exec::new(script.to_str().unwrap(), Vec::<&str>::new()));
    assert_eq!(r.exit, None);
    assert!(
        r.errors.first().is_some_and(|e| e.starts_with("EACCES:")),
        "{:?}",
        r.errors
    );
}

#[test]
fn a_missing_cwd_is_enoent_and_a_file_as_cwd_is_enotdir() {
    let agent = Agent::start();
    let mut exec = Exec::new("true", Vec::<&str>::new());
    exec.cwd = b"/no/such/dir/boxdesk".to_vec();
    let r = agent.run(exec.clone());
    assert!(
        r.errors.first().is_some_and(|e| e.starts_with("ENOENT:")),
        "{:?}",
        r.errors
    );
    exec.cwd = b"/etc/passwd".to_vec();
    let r = agent.run(exec);
    assert!(
        r.errors.first().is_some_and(|e| e.starts_with("ENOTDIR:")),
        "{:?}",
        r.errors
    );
    assert_eq!(r.exit, None);
}

#[test]
fn an_empty_cwd_is_the_root_directory_and_a_cwd_is_honoured() {
    let agent = Agent::start();
    assert_eq!(
        agent
            .run(Exec::new("pwd", Vec::<&str>::new()))
            .stdout_text(),
        "/\n"
    );
    let mut exec = Exec::new("pwd", Vec::<&str>::new());
    exec.cwd = b"/etc".to_vec();
    assert_eq!(agent.run(exec).stdout_text(), "/etc\n");
}

#[test]
fn the_environment_is_the_fixed_default_plus_the_exec_env_and_nothing_else() {
    let agent = Agent::start();
    let mut exec = Exec::new("env", Vec::<&str>::new());
    exec.env.push((b"HOME".to_vec(), "/work".into()));
    exec.env.push((b"SECRET".to_vec(), "s3cr3t".into()));
    let out = agent.run(exec).stdout_text();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "HOME=/work",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "SECRET=s3cr3t",
        ]
    );
}

#[test]
fn a_path_in_the_exec_env_is_used_to_find_the_command() {
    let agent = Agent::start();
    let bin = agent.base.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let tool = bin.join("boxdesk-only-here");
    std::fs::write(&tool, "#!/bin/sh\necho found-me\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut exec = Exec::new("boxdesk-only-here", Vec::<&str>::new());
    exec.env.push((
        b"PATH".to_vec(),
        format!("{}:/bin:/usr/bin", bin.display()).as_str().into(),
    ));
    let r = agent.run(exec);
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "found-me\n"));
}

#[test]
fn the_child_leads_a_new_session_with_default_signals_and_an_empty_mask() {
    let agent = Agent::start();
    let r = agent.run(Exec::new("cat", ["/proc/self/stat", "/proc/self/status"]));
    let text = r.stdout_text();
    let first = text.lines().next().unwrap();
    let pid: u32 = first.split(' ').next().unwrap().parse().unwrap();
    let st = parse_stat(first).unwrap();
    assert_eq!(
        (st.pgrp, st.session),
        (pid, pid),
        "leader of its own session and group"
    );
    for field in ["SigIgn", "SigBlk"] {
        let line = text.lines().find(|l| l.starts_with(field)).unwrap();
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
}

#[test]
fn args_and_env_values_are_passed_as_raw_bytes() {
    let agent = Agent::start();
    let mut exec = Exec::new(
        "printf",
        [b"%s|%s".to_vec(), vec![0xff, b'a'], b"b c".to_vec()],
    );
    exec.env.push((b"X".to_vec(), vec![0xfe].into()));
    let r = agent.run(exec);
    assert_eq!(r.stdout, b"\xffa|b c");
    let mut exec = sh("printf %s \"$X\"");
    exec.env.push((b"X".to_vec(), vec![0xfe, b'!'].into()));
    assert_eq!(agent.run(exec).stdout, b"\xfe!");
}

#[test]
fn a_process_that_ends_well_before_its_timeout_gets_its_exit() {
    let agent = Agent::start();
    let mut exec = sh("echo quick");
    exec.timeout_ms = 10_000;
    let start = std::time::Instant::now();
    let r = agent.run(exec);
    assert_eq!((r.exit, r.timed_out), (Some(0), false));
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn an_isolated_exec_runs_as_any_other_and_an_unknown_flag_is_refused() {
    let agent = Agent::start();
    let mut isolated = sh("echo sealed; exit 3");
    isolated.flags = Exec::ISOLATE;
    let r = agent.run(isolated);
    assert_eq!(r.errors, Vec::<String>::new());
    assert_eq!(r.stdout, b"sealed\n");
    assert_eq!(r.exit, Some(3));
    let mut unknown = sh("echo never");
    unknown.flags = 1 << 7;
    let r = agent.run(unknown);
    assert_eq!(r.exit, None);
    assert!(
        r.errors
            .first()
            .is_some_and(|e| e.starts_with("EINVAL: unknown exec flags 0x80")),
        "{:?}",
        r.errors
    );
}
