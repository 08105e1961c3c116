//! The cgroup layer (`sandbox/src/cgroup.rs`) on a pure cgroup v2, which the
//! build machines (hybrid layout, v1 controllers) cannot show: inside an
//! x86_64 L1, `chroot /host` mounts cgroup2 at `/sys/fs/cgroup` and runs the
//! boxdesk-sandbox's lib tests filtered to `cgroup::` twice: as root
//! (cgroups under `/sys/fs/cgroup/boxdesk`), and as nobody in a subtree
//! delegated to it the way systemd delegates `user@UID.service` (the
//! directory and its `cgroup.procs`, `cgroup.subtree_control` and
//! `cgroup.threads` chowned; the process in a leaf below). Both runs set
//! `BOXDESK_CGROUP_EXPECT=enforced`, so an unenforced placement fails
//! instead of skipping.

use super::{ready, run_with, unavailable, Arch, Options};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The lib test binary of boxdesk-sandbox (built if needed), or
/// `$BOXDESK_LIB_TESTS`.
fn lib_tests() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BOXDESK_LIB_TESTS") {
        return Some(PathBuf::from(p));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "test",
            "-p",
            "boxdesk-sandbox",
            "--lib",
            "--no-run",
            "--message-format=json",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            unavailable(&format!(
                "cargo test --lib --no-run failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return None;
        }
        Err(e) => {
            unavailable(&format!("cannot run cargo: {e}"));
            return None;
        }
    };
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let m: serde_json::Value = serde_json::from_str(l).ok()?;
        let lib = m["target"]["kind"].as_array()?.iter().any(|k| k == "lib");
        (m["reason"] == "compiler-artifact" && lib && m["profile"]["test"] == true)
            .then(|| m["executable"].as_str().map(PathBuf::from))
            .flatten()
    })
}

/// The L1 side, run by `sh` in `chroot /host`; `$1` is the test binary.
const SCRIPT: &str = r#"set -eu
b=$1
cg=/sys/fs/cgroup
mount -t cgroup2 cgroup2 $cg
cd /tmp
echo "== cgroup v2 as root"
BOXDESK_CGROUP_EXPECT=enforced "$b" cgroup:: --test-threads=1 --nocapture
echo "== cgroup v2 as uid 65534 in a delegated subtree"
echo '+memory +pids +cpu' > $cg/cgroup.subtree_control
mkdir $cg/user.slice
echo '+memory +pids +cpu' > $cg/user.slice/cgroup.subtree_control
d=$cg/user.slice/user@65534.service
mkdir $d
chown 65534:65534 $d $d/cgroup.procs $d/cgroup.subtree_control $d/cgroup.threads
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
as_nobody mkdir $d/session.scope
echo $$ > $d/session.scope/cgroup.procs
as_nobody env BOXDESK_CGROUP_EXPECT=enforced "$b" cgroup:: --test-threads=1 --nocapture
"#;

#[test]
fn the_cgroup_layer_holds_limits_on_pure_v2_as_root_and_as_a_delegated_user() {
    if std::env::consts::ARCH != "x86_64" {
        println!("skipped: chroot /host runs host binaries in an x86_64 L1 only");
        return;
    }
    if !ready(Arch::X86_64) {
        return;
    }
    let Some(bin) = lib_tests() else {
        return;
    };
    let bin = bin.to_str().expect("a UTF-8 path to the lib tests");
    assert!(Path::new(bin).is_file(), "{bin}");
    let opts = Options {
        hostroot: true,
        deadline: Duration::from_secs(180),
        ..Options::default()
    };
    let t0 = Instant::now();
    let out = run_with(
        Arch::X86_64,
        &[],
        &["chroot", "/host", "/bin/sh", "-c", SCRIPT, "sh", bin],
        &opts,
    );
    let total = t0.elapsed();
    out.assert_exit(0);
    let text = &out.output;
    assert!(!text.contains("skipped: limits unenforced"), "{text}");
    let passed = text.matches("test result: ok.").count();
    assert_eq!(passed, 2, "{text}");
    for line in [
        "cgroups: v2 at /sys/fs/cgroup",
        "limits: enforced, as root in /sys/fs/cgroup/boxdesk/NAME",
        "limits: enforced, as uid 65534 in /sys/fs/cgroup/user.slice/user@65534.service/boxdesk/NAME",
        "cgroup-v2 /sys/fs/cgroup/boxdesk/",
        "unenforced for uid 65534: no cgroup v2 delegation for uid 65534",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    println!(
        "nested cgroup v2: {:.1} s in all, the command ran {:.1} s in L1",
        total.as_secs_f64(),
        total
            .saturating_sub(out.cmd_started_after.unwrap_or_default())
            .as_secs_f64()
    );
}
