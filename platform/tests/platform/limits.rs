//! `limits`: the open-file limit raise, in a child process so this test
//! binary's own limit is left alone.

use std::process::Command;

use nix::sys::resource::{getrlimit, Resource};

/// Runs test `test` of this binary again under `sh -c "ULIMITS && exec …"`
/// with `env` set, and returns the four numbers of its `RAISED` line:
/// soft before, soft after (as the raise says), then soft and hard as
/// `getrlimit` sees them.
fn raised_in_child(ulimits: &str, test: &str, env: &str) -> Vec<u64> {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{ulimits} && exec \"$0\" --exact {test} --nocapture"
        ))
        .arg(&exe)
        .env(env, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RAISED "))
        .unwrap_or_else(|| panic!("no RAISED line: {text}"));
    line.split(' ').map(|n| n.parse().unwrap()).collect()
}

/// The soft limit (64 in the child) goes to the hard one.
#[test]
fn the_soft_open_file_limit_is_raised_to_the_hard_limit() {
    if std::env::var_os("BOXDESK_LIMITS_CHILD").is_some() {
        let got = boxdesk_platform::limits::raise_nofile().unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        println!("RAISED {} {} {soft} {hard}", got.before, got.now);
        return;
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if hard <= 64 {
        println!("skipped: the hard open-file limit is {hard}");
        return;
    }
    let v = raised_in_child(
        "ulimit -Sn 64",
        "limits::the_soft_open_file_limit_is_raised_to_the_hard_limit",
        "BOXDESK_LIMITS_CHILD",
    );
    let line = format!("{v:?}");
    assert_eq!(v[0], 64, "{line}");
    let expect = if cfg!(target_vendor = "apple") {
        hard.min(10_240)
    } else {
        hard
    };
    assert_eq!((v[1], v[2], v[3]), (expect, expect, hard), "{line}");
}

/// Whether this process has `CAP_SYS_RESOURCE` (bit 24 of `CapEff`).
fn has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap() & (1 << 24) != 0
}

#[cfg(target_os = "linux")]
#[test]
fn a_file_server_raises_the_hard_limit_where_it_may_and_else_the_soft_one() {
    if std::env::var_os("BOXDESK_LIMITS_FILES_CHILD").is_some() {
        let got = boxdesk_platform::limits::raise_nofile_for_files().unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        println!("RAISED {} {} {soft} {hard}", got.before, got.now);
        return;
    }
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if hard < 512 {
        println!("skipped: the hard open-file limit is {hard}");
        return;
    }
    // A hard limit of 512 the child starts under (lowering needs no
    // privilege), soft 64.
    let v = raised_in_child(
        "ulimit -Sn 64 && ulimit -Hn 512",
        "limits::a_file_server_raises_the_hard_limit_where_it_may_and_else_the_soft_one",
        "BOXDESK_LIMITS_FILES_CHILD",
    );
    let line = format!("{v:?}");
    let nr_open: u64 = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let expect = if has_sys_resource() {
        boxdesk_platform::limits::FILE_SERVER_NOFILE.min(nr_open)
    } else {
        512
    };
    assert_eq!(v, [64, expect, expect, expect], "{line}");
}
