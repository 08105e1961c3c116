//! The config's fields, each as the container sees it.

use std::fs;

use serde_json::json;

use super::bundle;

#[test]
fn args_env_cwd_hostname_and_the_root_user_are_the_configs() {
    let Some(b) = bundle(|c| {
        c["process"]["args"] = json!(["sh", "-c", "echo $GREETING; pwd; hostname; id -u; id -g"]);
        c["process"]["env"] = json!(["PATH=/bin", "GREETING=hi there"]);
        c["process"]["cwd"] = json!("/tmp");
        c["hostname"] = json!("c-host");
    }) else {
        return;
    };
    let out = b.run_container("fields");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "hi there\n/tmp\nc-host\n0\n0\n", "{out}");
}

#[test]
fn a_read_only_root_refuses_writes_and_a_writable_one_keeps_them() {
    let Some(b) = bundle(|c| {
        c["root"]["readonly"] = json!(true);
        c["process"]["args"] = json!(["sh", "-c", "touch /written 2>&1; echo rc=$?"]);
    }) else {
        return;
    };
    let out = b.run_container("ro");
    assert!(
        out.stdout.contains("Read-only file system") && out.stdout.contains("rc=1"),
        "{out}"
    );
    assert!(!b.dir.join("rootfs/written").exists());

    let Some(b) = bundle(|c| {
        c["root"]["readonly"] = json!(false);
        c["process"]["args"] = json!(["sh", "-c", "echo kept > /written"]);
    }) else {
        return;
    };
    let out = b.run_container("rw");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        fs::read_to_string(b.dir.join("rootfs/written")).unwrap(),
        "kept\n"
    );
}

#[test]
fn tmpfs_and_bind_mounts_appear_where_asked_read_only_where_asked() {
    let host = tempfile::tempdir().unwrap();
    fs::write(host.path().join("in"), "from-host\n").unwrap();
    let h = host.path().to_str().unwrap().to_owned();
    let Some(b) = bundle(|c| {
        let mounts = c["mounts"].as_array_mut().unwrap();
        mounts.push(
            json!({"destination": "/scratch", "type": "tmpfs", "source": "tmpfs",
                           "options": ["size=1m", "mode=1777"]}),
        );
        mounts.push(json!({"destination": "/data/rw", "type": "bind", "source": h, "options": ["rbind", "rw"]}));
        mounts.push(json!({"destination": "/data/ro", "type": "bind", "source": h, "options": ["bind", "ro"]}));
        c["process"]["args"] =
            json!(["sh", "-c",
            "stat -c %a /scratch; df -k /scratch | tail -1 | awk '{print $2}'; cat /data/rw/in; \
             echo back > /data/rw/out; echo x > /data/ro/x 2>/dev/null || echo ro-refused"]);
    }) else {
        return;
    };
    let out = b.run_container("mounts");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "1777\n1024\nfrom-host\nro-refused\n", "{out}");
    assert_eq!(
        fs::read_to_string(host.path().join("out")).unwrap(),
        "back\n"
    );
    assert!(
        b.dir.join("rootfs/scratch").is_dir(),
        "the mount point was made"
    );
}

#[test]
fn masked_paths_read_empty_and_read_only_paths_refuse_writes() {
    let Some(b) =
        bundle(|c| {
            c["linux"]["maskedPaths"] = json!(["/proc/kcore", "/proc/timer_list", "/sys/firmware"]);
            c["linux"]["readonlyPaths"] = json!(["/proc/sys"]);
            c["process"]["args"] =
                json!(["sh", "-c",
            "(cat /proc/timer_list 2>/dev/null || true) | wc -c; ls /sys/firmware | wc -l; \
             echo 1 > /proc/sys/kernel/domainname 2>/dev/null || echo sys-ro"]);
        })
    else {
        return;
    };
    let out = b.run_container("masked");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "0\n0\nsys-ro\n", "{out}");
}

#[test]
fn rlimits_and_capabilities_are_the_containers() {
    let Some(b) = bundle(|c| {
        c["process"]["rlimits"] = json!([{"type": "RLIMIT_NOFILE", "soft": 512, "hard": 512},
                                         {"type": "RLIMIT_CORE", "soft": 0, "hard": 0}]);
        c["process"]["capabilities"] = json!({"bounding": ["CAP_KILL", "CAP_CHOWN"],
            "effective": ["CAP_KILL"], "permitted": ["CAP_KILL", "CAP_CHOWN"]});
        c["process"]["args"] = json!([
            "sh",
            "-c",
            "ulimit -n; ulimit -c; grep CapBnd /proc/self/status"
        ]);
    }) else {
        return;
    };
    let out = b.run_container("caps");
    assert_eq!(out.code(), 0, "{out}");
    // CAP_CHOWN is bit 0, CAP_KILL bit 5: 0x21.
    assert_eq!(out.stdout, "512\n0\nCapBnd:\t0000000000000021\n", "{out}");
}

#[test]
fn a_seccomp_profile_answers_the_calls_it_names() {
    let Some(b) = bundle(|c| {
        c["linux"]["seccomp"] = json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]
        });
        c["process"]["args"] = json!([
            "sh",
            "-c",
            "mkdir /tmp/d 2>&1; echo rc=$?; touch /tmp/f && echo touched"
        ]);
    }) else {
        return;
    };
    let out = b.run_container("seccomp");
    assert_eq!(out.code(), 0, "{out}");
    assert!(
        out.stdout.contains("Operation not permitted") && out.stdout.contains("rc=1"),
        "{out}"
    );
    assert!(out.stdout.ends_with("touched\n"), "{out}");
}

#[test]
fn net_sysctls_of_its_own_network_namespace_are_set() {
    let Some(b) = bundle(|c| {
        c["linux"]["sysctl"] = json!({"net.ipv4.ping_group_range": "0 0"});
        c["process"]["args"] = json!(["cat", "/proc/sys/net/ipv4/ping_group_range"]);
    }) else {
        return;
    };
    let out = b.run_container("sysctl");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        out.stdout.split_whitespace().collect::<Vec<_>>(),
        ["0", "0"],
        "{out}"
    );
}

#[test]
fn a_field_boxdesk_cannot_honour_is_refused_by_name_and_nothing_is_left() {
    let Some(b) = bundle(|c| {
        c["hooks"] = json!({"prestart": [{"path": "/bin/true"}]});
    }) else {
        return;
    };
    let out = b.create("hooked");
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("hooks.prestart"), "{out}");
    assert!(!b.root.join("hooked").exists());
    let Some(b) = bundle(|c| {
        c["annotations"] = json!({"io.boxdesk.backend": "vm"});
    }) else {
        return;
    };
    let out = b.create("vm");
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("VM backend"), "{out}");
}

#[test]
fn the_agent_the_container_sees_is_a_sealed_copy_not_the_hosts_binary() {
    let Some(b) = bundle(|c| {
        c["process"]["args"] = json!([
            "sh",
            "-c",
            "readlink /proc/1/exe 2>/dev/null || echo hidden; \
             (echo x >> /proc/1/exe) 2>/dev/null && echo wrote || echo refused; ls /proc/self/fd"
        ]);
    }) else {
        return;
    };
    let out = b.run_container("exe");
    assert_eq!(out.code(), 0, "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    // The agent is not dumpable: its exe link is hidden from the
    // container's processes; where it shows, it is the sealed copy.
    if fs::read_to_string("/proc/sys/vm/memfd_noexec").is_ok_and(|v| v.trim() == "2") {
        println!("skipped the memfd half: vm.memfd_noexec is 2 here");
    } else {
        assert!(
            lines[0] == "hidden" || lines[0].starts_with("/memfd:boxdesk-agent"),
            "{out}"
        );
    }
    assert_eq!(lines[1], "refused", "{out}");
    // Only stdio (and ls's own directory) are open in the process.
    assert_eq!(lines[2..], ["0", "1", "2", "3"], "{out}");
}
