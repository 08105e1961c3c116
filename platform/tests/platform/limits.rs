//! `limits`: the open-file limit raise, in a child process so this test
//! binary's own limit is left alone.

use std::process::Command;

use nix::sys::resource::{getrlimit, Resource};

/// Runs this test binary's `raise_in_child` helper under a soft limit of
/// 64 and returns what it printed.
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
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -Sn 64 && exec \"$0\" --exact limits::the_soft_open_file_limit_is_raised_to_the_hard_limit --nocapture")
        .arg(&exe)
        .env("BOXDESK_LIMITS_CHILD", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RAISED "))
        .unwrap_or_else(|| panic!("no RAISED line: {text}"));
    let v: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
    assert_eq!(v[0], 64, "{line}");
    let expect = if cfg!(target_vendor = "apple") {
        hard.min(10_240)
    } else {
        hard
    };
    assert_eq!((v[1], v[2], v[3]), (expect, expect, hard), "{line}");
}
