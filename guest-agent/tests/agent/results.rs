//! `/results`: what comes back after Exit or TimedOut.

use std::os::unix::fs::PermissionsExt;

use crate::support::{sh, Agent};

#[test]
fn results_files_in_nested_dirs_come_back_after_exit_with_paths_and_modes() {
    let agent = Agent::start();
    let script = format!(
        "cd {} && mkdir -p a/b && printf one > top.txt && printf two > a/b/deep.bin \
         && : > a/empty && chmod 0751 a/b/deep.bin",
        agent.results.display()
    );
    let r = agent.run(sh(&script));
    assert_eq!(r.exit, Some(0), "{r:?}");
    assert_eq!(r.order, ["exit", "file"], "files follow Exit");
    let names: Vec<_> = r.files.keys().cloned().collect();
    assert_eq!(names, ["a/b/deep.bin", "a/empty", "top.txt"]);
    assert_eq!(r.files["top.txt"].data, b"one");
    assert_eq!(r.files["a/b/deep.bin"].data, b"two");
    assert_eq!(r.files["a/b/deep.bin"].mode, 0o751);
    assert_eq!(
        (r.files["a/empty"].total, r.files["a/empty"].data.len()),
        (0, 0)
    );
    // Never cleared: the next exec sends them again.
    assert_eq!(agent.run(sh("true")).files.len(), 3);
}

#[test]
fn a_symlink_and_a_fifo_in_results_are_skipped_with_an_error_naming_them() {
    let agent = Agent::start();
    std::fs::write(agent.results.join("ok"), b"fine").unwrap();
    std::fs::set_permissions(
        agent.results.join("ok"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/passwd", agent.results.join("link")).unwrap();
    nix::unistd::mkfifo(
        &agent.results.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let r = agent.run(sh("true"));
    assert_eq!(r.exit, Some(0));
    assert_eq!(r.files.keys().collect::<Vec<_>>(), ["ok"]);
    assert_eq!(r.files["ok"].mode, 0o600);
    assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("\"link\"") && e.contains("symlink")),
        "{:?}",
        r.errors
    );
    assert!(
        r.errors
            .iter()
            .any(|e| e.contains("\"fifo\"") && e.contains("fifo")),
        "{:?}",
        r.errors
    );
    assert!(
        agent.results.join("link").exists(),
        "results are never cleared"
    );
}

#[test]
fn results_follow_a_timed_out_exec_too() {
    let agent = Agent::start();
    let mut exec = sh(&format!(
        "echo partial > {}/log; exec sleep 30",
        agent.results.display()
    ));
    exec.timeout_ms = 300;
    let r = agent.run(exec);
    assert!(r.timed_out);
    assert_eq!(r.files["log"].data, b"partial\n");
}
