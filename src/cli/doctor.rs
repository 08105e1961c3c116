//! `boxdesk doctor`: which backends can run here, and why not.
//!
//! This module owns the report. It must never change the host; what it runs
//! are a throw-away bwrap sandbox (`true` in fresh pid, net, ipc and uts
//! namespaces) to prove namespaces really work for this user, and the
//! hypervisor probe of `boxdesk-hv` (a tiny guest under a deadline), which
//! tells hardware KVM from an emulating one.

use std::process::{Command, Stdio};

use boxdesk_platform::{dirs, probe, Probe};

/// `boxdesk doctor`: exit 0 when some backend can run, 1 when none can.
pub fn doctor() -> anyhow::Result<i32> {
    let bwrap = probe::bwrap();
    let userns = probe::user_namespaces();
    let trial = if bwrap.is_available() {
        trial_sandbox()
    } else {
        Probe::Missing {
            why: "not tried: bwrap is missing".into(),
            hint: None,
        }
    };
    let runtime = match dirs::runtime_dir() {
        Ok(d) => format!("ok: {}", d.display()),
        Err(e) => format!("refused: {e}"),
    };
    let namespace_ok = bwrap.is_available() && trial.is_available();

    println!("runtime dir: {runtime}");
    println!(
        "namespace backend: {}",
        if namespace_ok {
            "can run here"
        } else {
            "cannot run here"
        }
    );
    println!("  bubblewrap: {bwrap}");
    println!("  user namespaces: {userns}");
    println!("  trial sandbox: {trial}");
    println!("hypervisor: {}", boxdesk_hv::probe());
    println!("  /dev/kvm: {}", probe::dev_kvm());
    println!(
        "kvm backend: no VMM yet (boxdesk-hv runs guest code; booting Linux is not implemented)"
    );
    println!("hvf backend: no VMM yet (macOS on Apple silicon only)");
    println!("--backend auto: namespace");
    Ok(if namespace_ok { 0 } else { 1 })
}

fn trial_sandbox() -> Probe {
    let Some(bwrap) = boxdesk::sandbox::namespace::find_bwrap() else {
        return Probe::Missing {
            why: "bwrap is not on an absolute PATH entry".into(),
            hint: None,
        };
    };
    let out = Command::new(bwrap)
        .args([
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
        ])
        .args([
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ])
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => Probe::Available {
            detail: "bwrap started `true` in new pid, net, ipc and uts namespaces".into(),
        },
        Ok(o) => Probe::Missing {
            why: format!(
                "bwrap failed ({}): {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            hint: Some("see `user namespaces` above".into()),
        },
        Err(e) => Probe::Missing {
            why: format!("cannot run bwrap: {e}"),
            hint: None,
        },
    }
}
