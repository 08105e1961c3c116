//! `boxdesk apparmor` and what `doctor` says about AppArmor's
//! user-namespace restriction. Nothing here installs a profile: `install`
//! is run only where it must refuse before writing (as a user, or where
//! AppArmor is not active).

use std::path::Path;

use crate::support::{self, TestEnv};

#[test]
fn apparmor_show_prints_the_shipped_profile_with_this_binarys_real_path_added() {
    let env = TestEnv::new();
    let out = env.run(["apparmor", "show"]);
    assert_eq!(out.code(), 0, "{out}");
    let shipped = include_str!("../../dist/apparmor/boxdesk");
    let real = std::fs::canonicalize(support::bin()).unwrap();
    let added = format!("@{{boxdesk_exe}} += {}", real.display());
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("@{boxdesk_exe} += ")
                && l.split_whitespace().any(|w| Path::new(w) == real)),
        "want a line like {added:?}: {out}"
    );
    // Everything else is the shipped text, in order.
    let rest: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("@{boxdesk_exe} += ") && !l.starts_with("# Added by"))
        .collect();
    assert_eq!(rest, shipped.lines().collect::<Vec<_>>(), "{out}");
}

#[test]
fn apparmor_install_refuses_before_writing_as_a_user_or_where_apparmor_is_not_active() {
    let env = TestEnv::new();
    let active = Path::new("/sys/kernel/security/apparmor").is_dir();
    if support::is_root() && active {
        println!("skipped: as root with AppArmor active, install would load a profile into this machine's kernel");
        return;
    }
    let out = env.run(["apparmor", "install"]);
    assert_eq!(out.code(), 125, "{out}");
    if support::is_root() {
        assert!(
            out.stderr.contains("AppArmor is not active in this kernel"),
            "{out}"
        );
    } else {
        let real = std::fs::canonicalize(support::bin()).unwrap();
        assert!(
            out.stderr.contains(&format!(
                "needs root: sudo {} apparmor install",
                real.display()
            )),
            "{out}"
        );
    }
}

#[test]
fn doctor_says_what_apparmor_does_to_user_namespaces_and_makes_one_with_capabilities() {
    let env = TestEnv::new();
    let out = env.run(["doctor"]);
    let line = |key: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("  {key}: ")))
            .unwrap_or_else(|| panic!("no `{key}:` line: {out}"))
            .to_owned()
    };
    let apparmor = line("apparmor");
    let knob = Path::new("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    match std::fs::read_to_string(knob).ok().as_deref().map(str::trim) {
        None => assert!(
            apparmor.starts_with("does not restrict user namespaces on this kernel"),
            "{out}"
        ),
        Some("0") => assert!(
            apparmor.starts_with("does not restrict user namespaces ("),
            "{out}"
        ),
        Some(_) => assert!(apparmor.starts_with("restricts user namespaces"), "{out}"),
    }
    let real = line("user namespace with capabilities");
    if line("user namespaces").starts_with("available") {
        assert!(
            real.starts_with("available: a child of this process"),
            "{out}"
        );
    } else {
        println!("skipped: user namespaces are not allowed here: {out}");
    }
}
