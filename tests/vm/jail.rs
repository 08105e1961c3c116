//! The VM helper's jail on real KVM (`boxdesk_vmm::jail`): every thread of
//! a running helper is filtered, a vCPU that makes a forbidden call takes
//! the helper down with a `SECCOMP` line the CLI passes on, and a VM with
//! every device class (vsock, virtio-fs, virtio-gpu/input, the control
//! socket's display lease) does its work under the filters, in a mount
//! namespace of its own where it sees only its own paths.

use super::{can_boot, kvm_env};
use crate::support;

/// `Seccomp:` and `NoNewPrivs:` of every thread of `pid`, with its name.
fn thread_status(pid: u32) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(status) = std::fs::read_to_string(task.unwrap().path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or("?")
                .trim()
                .to_owned()
        };
        out.push((field("Name:"), field("Seccomp:"), field("NoNewPrivs:")));
    }
    out
}

/// The helper at `pid` sees only its own paths: every mount in its mount
/// namespace is its new root, a device, its runtime or state dir, the
/// share at `share`, the image, or its own `/proc/PID`.
fn assert_only_its_view(pid: u32, env: &support::TestEnv, share: &std::path::Path) {
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let points: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .collect();
    let mut allowed: Vec<String> = ["/dev/kvm", "/dev/null", "/dev/zero", "/dev/urandom"]
        .map(String::from)
        .to_vec();
    allowed.push(format!("/proc/{pid}"));
    for p in [env.runtime(), env.state_of("jail1"), share.to_owned()] {
        allowed.push(p.display().to_string());
    }
    if let Some(images) = std::env::var_os("BOXDESK_IMAGE_DIR") {
        allowed.push(std::path::PathBuf::from(images).display().to_string());
    }
    for p in &points {
        assert!(
            *p == "/" || allowed.iter().any(|a| p.starts_with(a.as_str())),
            "the helper sees {p}; its mounts: {points:?}"
        );
    }
    assert!(
        points.contains(&format!("/proc/{pid}").as_str()),
        "{points:?}"
    );
    let root = format!("/proc/{pid}/root");
    for gone in ["etc/passwd", "home", "usr/bin", "root"] {
        assert!(
            std::fs::symlink_metadata(format!("{root}/{gone}")).is_err(),
            "the helper sees /{gone}"
        );
    }
    assert!(std::path::Path::new(&format!("{root}/dev/kvm")).exists());
    println!("the helper's mounts: {points:?}");
}

#[test]
fn every_thread_of_a_running_vm_helper_has_a_seccomp_filter_and_its_devices_still_work() {
    if !can_boot(
        "every_thread_of_a_running_vm_helper_has_a_seccomp_filter_and_its_devices_still_work",
    ) {
        return;
    }
    let env = kvm_env();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in"), "from the host").unwrap();
    let share = format!("{}:/mnt/d", dir.path().display());
    let sb = env.start(
        "jail1",
        &["--backend", "kvm", "--share", &share, "--display=320x200"],
    );
    // Every device class at work: vsock (this exec), virtio-fs both ways,
    // the control socket's display lease and input stream.
    let out =
        sb.sh("cat /mnt/d/in; echo out > /mnt/d/out; ls /dev/dri /dev/input >/dev/null && echo ok");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "from the hostok\n", "{out}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out")).unwrap(),
        "out\n"
    );
    let png = env.root().join("shot.png");
    let shot = env.run(["screenshot", "jail1", png.to_str().unwrap()]);
    assert_eq!(shot.code(), 0, "{shot}");
    let pid = sb.pid.unwrap();
    let threads = thread_status(pid);
    assert!(threads.len() >= 6, "{threads:?}");
    for (name, seccomp, nnp) in &threads {
        assert_eq!(seccomp, "2", "thread {name} is not filtered: {threads:?}");
        assert_eq!(nnp, "1", "thread {name} may gain privileges: {threads:?}");
    }
    for want in ["vcpu0", "vsock", "virtio-notify", "virtio-gpu"] {
        assert!(
            threads.iter().any(|t| t.0 == want),
            "no {want} thread: {threads:?}"
        );
    }
    println!("jailed threads: {threads:?}");
    if nix::unistd::geteuid().is_root() {
        assert_only_its_view(pid, &env, dir.path());
    } else {
        // A user may not look into a process no one may dump.
        println!("the helper's mounts are checked as root only");
    }
    let out = env.run(["stop", "jail1"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(support::wait_gone(pid), "the helper outlived stop");
    // Its reaper, outside the view, finished the end.
    assert!(!env.state_of("jail1").exists(), "the state dir stayed");
    assert!(
        !env.runtime().join("jail1.lock").exists(),
        "the lock file stayed"
    );
    let log = std::fs::read_to_string(env.runtime().join("jail1.log")).unwrap_or_default();
    assert!(!log.contains("SECCOMP"), "{log}");
}

#[test]
fn a_vcpu_that_makes_a_forbidden_system_call_kills_its_helper_and_run_says_seccomp() {
    if !can_boot("a_vcpu_that_makes_a_forbidden_system_call_kills_its_helper_and_run_says_seccomp")
    {
        return;
    }
    let env = kvm_env();
    let out = support::output({
        let mut c = env.cmd(["run", "--backend", "kvm", "--", "true"]);
        c.env("BOXDESK_JAIL_TEST", "forbidden");
        c
    });
    assert_ne!(out.code(), 0, "{out}");
    let socket = if cfg!(target_arch = "aarch64") {
        198
    } else {
        41
    };
    assert!(
        out.stderr.contains(&format!(
            "SECCOMP: thread vcpu0 (vcpu allowlist) made system call {socket} (first arguments 0x2, 0x1)"
        )),
        "{out}"
    );
    assert!(out.stderr.contains("killed by its seccomp jail"), "{out}");
}
