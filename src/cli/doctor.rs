//! `boxdesk doctor`: which backends can run here, and why not.
//!
//! This module owns the report. It must never change the host; what it runs
//! are a throw-away bwrap sandbox (`true` in fresh pid, net, ipc and uts
//! namespaces) to prove namespaces really work for this user, and the
//! hypervisor probe of `boxdesk-hv` (a tiny guest under a deadline), which
//! tells hardware KVM from an emulating one. On Linux it says whether the
//! namespace backend's `--mem`/`--cpus`/`--pids` hold for this user
//! (`sandbox::cgroup::probe`, which only reads), and what AppArmor does to
//! user namespaces here, with a child that makes one and mounts in it
//! (`crate::apparmor`: the child exits at once and changes nothing).

use boxdesk_platform::{dirs, probe, Probe};

/// `boxdesk doctor`: exit 0 when some backend can run, 1 when none can.
pub fn doctor() -> anyhow::Result<i32> {
    let bwrap = probe::bwrap();
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
        } else if cfg!(target_os = "linux") {
            "cannot run here"
        } else {
            "cannot run here: it needs Linux"
        }
    );
    println!("  bubblewrap: {bwrap}");
    for (k, v) in userns_checks() {
        println!("  {k}: {v}");
    }
    println!("  trial sandbox: {trial}");
    #[cfg(target_os = "linux")]
    println!("{}", boxdesk_sandbox::cgroup::probe());
    #[cfg(target_os = "linux")]
    for (k, v) in boxdesk_sandbox::host_system::doctor_lines(std::path::Path::new("/")) {
        println!("{k}: {v}");
    }
    let hv = boxdesk_hv::probe();
    println!("hypervisor: {hv}");
    println!("  /dev/kvm: {}", probe::dev_kvm());
    let image = boxdesk_vmm::image::find(std::env::consts::ARCH, None, None);
    let vm_ok = hv.can_boot() && image.is_ok();
    let vm = crate::backend::Backend::HOST_VM;
    println!(
        "{vm} backend: {}",
        match (&image, hv.can_boot()) {
            (Ok(_), true) => "can run here".to_owned(),
            (_, false) => "cannot run here: the hypervisor cannot boot a VM".to_owned(),
            (Err(e), true) => format!("cannot run here: {e}"),
        }
    );
    if let Ok(img) = &image {
        println!(
            "  image: {} + {}",
            img.kernel.display(),
            img.initrd.display()
        );
    }
    if vm == crate::backend::Backend::Kvm {
        println!("hvf backend: macOS on Apple silicon only");
    } else {
        println!("kvm backend: Linux only");
    }
    let auto = crate::backend::Backend::Auto
        .resolve()
        .map_or_else(|e| e.to_string(), |b| b.to_string());
    println!("--backend auto: {auto}");
    Ok(if namespace_ok || vm_ok { 0 } else { 1 })
}

/// The `user namespaces` line, then (Linux) what AppArmor does to them
/// here and the real test of one with capabilities
/// (`crate::apparmor`). Where AppArmor restricts user namespaces and the
/// test passes, this boxdesk's profile grants them: the sysctl alone
/// would say they are missing.
#[cfg(target_os = "linux")]
pub(super) fn userns_checks() -> Vec<(&'static str, String)> {
    use crate::apparmor::{self, status::Restriction, status::Status};

    let status = Status::read();
    let real = apparmor::probe::userns_with_capabilities();
    let exe = apparmor::this_exe().unwrap_or_else(|_| "boxdesk".into());
    let userns = match (&status.restriction, &real) {
        (Restriction::On, Ok(_)) => Probe::Available {
            detail: "restricted by AppArmor (kernel.apparmor_restrict_unprivileged_userns = 1), \
                     and granted to this boxdesk (see the two lines below)"
                .into(),
        },
        _ => probe::user_namespaces(),
    };
    let real = match real {
        Ok(made) => Probe::Available {
            detail: format!(
                "a child of this process{} made a user and a mount namespace, mapped its ids \
                 and mounted a tmpfs in it",
                if made.dropped {
                    format!(
                        " as uid {}, the id a root-started sandbox runs as,",
                        made.uid
                    )
                } else {
                    String::new()
                }
            ),
        },
        Err(e) => Probe::Missing {
            why: e.to_string(),
            hint: status
                .needs_profile()
                .then(|| format!("sudo {} apparmor install", exe.display())),
        },
    };
    vec![
        ("user namespaces", userns.to_string()),
        ("apparmor", status.describe(&exe)),
        ("user namespace with capabilities", real.to_string()),
    ]
}

/// Off Linux: the `user namespaces` line alone.
#[cfg(not(target_os = "linux"))]
pub(super) fn userns_checks() -> Vec<(&'static str, String)> {
    vec![("user namespaces", probe::user_namespaces().to_string())]
}

/// A throw-away bwrap sandbox, made as a real one is (`boxdesk cowork
/// doctor` runs it too).
#[cfg(target_os = "linux")]
pub(super) fn trial_sandbox() -> Probe {
    use std::process::{Command, Stdio};

    let Some(bwrap) = boxdesk_sandbox::namespace::find_bwrap() else {
        return Probe::Missing {
            why: "bwrap is not on an absolute PATH entry".into(),
            hint: None,
        };
    };
    // As a real sandbox is made: by its outside ids, in a user namespace
    // of its own, with no capability.
    let ids = boxdesk_sandbox::namespace::IdMap::for_this_process();
    let drop_to = ids.drop_from_root.then_some((ids.uid, ids.gid));
    let mut setup = match boxdesk_sandbox::namespace::child::ChildSetup::new(
        Vec::new(),
        &[],
        None,
        drop_to,
        Vec::new(),
    ) {
        Ok(s) => s,
        Err(e) => {
            return Probe::Missing {
                why: format!("cannot prepare the trial: {e}"),
                hint: None,
            }
        }
    };
    let mut cmd = Command::new(bwrap);
    // SAFETY: `ChildSetup::run` is made for a pre_exec hook: system calls
    // only, on memory prepared above.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || setup.run());
    }
    let out = cmd
        .current_dir("/")
        .args([
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--cap-drop",
            "ALL",
        ])
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
            detail: format!(
                "bwrap started `true` in new user, pid, net, ipc and uts namespaces, with no \
                 capability, root inside being uid {} outside",
                ids.uid
            ),
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

/// Off Linux there are no namespaces to try.
#[cfg(not(target_os = "linux"))]
fn trial_sandbox() -> Probe {
    Probe::Missing {
        why: "the namespace backend needs Linux".into(),
        hint: None,
    }
}
