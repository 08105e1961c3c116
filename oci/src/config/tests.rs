use super::*;
use serde_json::json;

/// A bundle like podman's (trimmed), rootfs a real directory.
fn bundle(config: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("rootfs")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_vec(config).unwrap(),
    )
    .unwrap();
    dir
}

fn podman_like() -> Value {
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 0, "gid": 0, "umask": 18},
            "args": ["sh", "-c", "echo hi"],
            "env": ["PATH=/usr/bin:/bin", "TERM=xterm"],
            "cwd": "/",
            "capabilities": {
                "bounding": ["CAP_CHOWN", "CAP_KILL"],
                "effective": ["CAP_CHOWN", "CAP_KILL"],
                "permitted": ["CAP_CHOWN", "CAP_KILL"]
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]
        },
        "root": {"path": "rootfs"},
        "hostname": "c1",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts", "options": ["bind", "rprivate"]},
            {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["rprivate", "nosuid", "noexec", "nodev", "relatime", "ro"]}
        ],
        "annotations": {"io.container.manager": "libpod"},
        "linux": {
            "resources": {
                "devices": [{"allow": false, "access": "rwm"}],
                "pids": {"limit": 2048},
                "memory": {"limit": 67108864, "swap": 67108864}
            },
            "cgroupsPath": "/libpod_parent/libpod-c1",
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore"],
            "readonlyPaths": ["/proc/sys"]
        }
    })
}

fn refusal(config: &Value) -> String {
    let b = bundle(config);
    match load(b.path()) {
        Ok(_) => panic!("accepted: {config}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_podman_config_becomes_a_plan_with_its_mounts_limits_and_process() {
    let b = bundle(&podman_like());
    let p = load(b.path()).unwrap();
    assert_eq!(p.process.args, ["sh", "-c", "echo hi"]);
    assert_eq!(p.process.caps, ["CAP_CHOWN", "CAP_KILL"]);
    assert!(!p.net_host, "a network namespace was asked for");
    assert_eq!(p.mem_bytes, Some(64 << 20));
    assert_eq!(p.pids, Some(2048));
    assert_eq!(p.backend, BackendChoice::Auto);
    assert_eq!(p.layout.hostname.as_deref(), Some("c1"));
    assert!(p.layout.root_writable);
    assert_eq!(
        p.layout.root,
        b.path().join("rootfs").canonicalize().unwrap()
    );
    assert_eq!(
        p.layout.mounts,
        vec![
            Mount::Proc {
                dest: "/proc".into()
            },
            Mount::Dev {
                dest: "/dev".into()
            },
            Mount::Sysfs {
                dest: "/sys".into()
            },
            Mount::Mqueue {
                dest: "/dev/mqueue".into()
            },
            Mount::Bind {
                source: "/etc/hosts".into(),
                dest: "/etc/hosts".into(),
                writable: true
            },
        ],
        "devpts and cgroup are parts of /dev and the read-only /sys"
    );
    assert!(p.sysctls.is_empty());
    assert_eq!((p.layout.cpu_quota, p.layout.cpu_shares), (None, None));
    let mut c = podman_like();
    c["linux"]["resources"]["cpu"] = json!({"quota": 50000, "period": 100000, "shares": 2});
    let b3 = bundle(&c);
    let p3 = load(b3.path()).unwrap();
    assert_eq!(
        (p3.layout.cpu_quota, p3.layout.cpu_shares),
        (Some(0.5), Some(2))
    );
    let mut c = podman_like();
    c["linux"]["sysctl"] = json!({"net.ipv4.ping_group_range": "0 0", "kernel.shmmax": "4096"});
    let b2 = bundle(&c);
    assert_eq!(
        load(b2.path()).unwrap().sysctls,
        vec![
            ("kernel.shmmax".into(), "4096".into()),
            ("net.ipv4.ping_group_range".into(), "0 0".into())
        ]
    );
    assert_eq!(
        p.layout.rlimits,
        vec![Rlimit {
            resource: libc::RLIMIT_NOFILE as i32,
            soft: 1024,
            hard: 1024
        }]
    );
}

#[test]
fn an_unknown_or_unhonoured_field_is_refused_by_name() {
    let cases: &[(&str, Value)] = &[
        ("linux.intelRdt", json!({"closID": "x"})),
        (
            "linux.devices",
            json!([{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}]),
        ),
        ("linux.resources.blockIO", json!({"weight": 10})),
        (
            "linux.resources.hugepageLimits",
            json!([{"pageSize": "2MB", "limit": 1}]),
        ),
        ("process.apparmorProfile", json!("containers-default")),
        (
            "process.selinuxLabel",
            json!("system_u:system_r:container_t:s0"),
        ),
        ("hooks", json!({"prestart": [{"path": "/bin/true"}]})),
        ("domainname", json!("example.org")),
        (
            "linux.uidMappings",
            json!([{"containerID": 0, "hostID": 1000, "size": 1}]),
        ),
        ("linux.personality", json!({"domain": "LINUX32"})),
        ("process.scheduler", json!({"policy": "SCHED_FIFO"})),
        ("somethingNew", json!(1)),
    ];
    for (path, value) in cases {
        let mut c = podman_like();
        let mut at = &mut c;
        let parts: Vec<&str> = path.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            at = at.get_mut(*p).unwrap();
        }
        at[parts[parts.len() - 1]] = value.clone();
        let e = refusal(&c);
        assert!(e.contains(path), "{path}: {e}");
    }
}

#[test]
fn empty_values_ask_nothing_and_pass() {
    let mut c = podman_like();
    c["hooks"] = json!({});
    c["domainname"] = json!("");
    c["linux"]["devices"] = json!([]);
    c["linux"]["mountLabel"] = Value::Null;
    let b = bundle(&c);
    load(b.path()).unwrap();
}

#[test]
fn what_a_sandbox_cannot_be_is_refused_with_the_reason() {
    let mut c = podman_like();
    c["process"]["user"]["uid"] = json!(1000);
    assert!(refusal(&c).contains("process.user"));

    let mut c = podman_like();
    c["linux"]["namespaces"][0] = json!({"type": "pid", "path": "/proc/1/ns/pid"});
    let e = refusal(&c);
    assert!(
        e.contains("linux.namespaces[0].path") && e.contains("network, ipc and uts are"),
        "{e}"
    );

    let mut c = podman_like();
    c["linux"]["namespaces"] =
        json!([{"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]);
    assert!(refusal(&c).contains("no pid namespace"));

    let mut c = podman_like();
    c["process"]["rlimits"] = json!([{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 1024}]);
    assert!(refusal(&c).contains("RLIMIT_NOFILE"));

    let mut c = podman_like();
    c["linux"]["sysctl"] = json!({"vm.overcommit_memory": "1"});
    assert!(refusal(&c).contains("linux.sysctl.vm.overcommit_memory"));

    let mut c = podman_like();
    c["linux"]["sysctl"] = json!({"net.ipv4/../../x": "1"});
    assert!(refusal(&c).contains("not a sysctl name"));

    let mut c = podman_like();
    c["linux"]["namespaces"] =
        json!([{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}]);
    c["linux"]["sysctl"] = json!({"net.ipv4.ping_group_range": "0 0"});
    assert!(refusal(&c).contains("shares the host's network"));

    let mut c = podman_like();
    c["mounts"][5]["options"] = json!(["bind", "idmap"]);
    assert!(refusal(&c).contains("mounts[5].options"));

    let mut c = podman_like();
    c["mounts"][0]["destination"] = json!("proc/../x");
    assert!(refusal(&c).contains("mounts[0].destination"));

    let mut c = podman_like();
    c["mounts"] = json!([]);
    assert!(refusal(&c).contains("proc mount is required"));

    let mut c = podman_like();
    c["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwx"}]);
    assert!(refusal(&c).contains("linux.resources.devices[0].access"));

    let mut c = podman_like();
    c["mounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"destination": "/etc/hosts/x", "type": "tmpfs", "source": "tmpfs"}));
    assert!(refusal(&c).contains("beneath the bind mount at /etc/hosts"));

    let mut c = podman_like();
    c["linux"]["readonlyPaths"] = json!(["/etc"]);
    assert!(refusal(&c).contains("linux.readonlyPaths[0]"));
    c["linux"]["readonlyPaths"] = json!(["/proc/../etc"]);
    assert!(refusal(&c).contains("linux.readonlyPaths[0]"));

    let mut c = podman_like();
    c["linux"]["seccomp"] = json!({"defaultAction": "SCMP_ACT_ALLOW", "newThing": 1});
    assert!(refusal(&c).contains("linux.seccomp.newThing"));

    let mut c = podman_like();
    c["linux"]["resources"]["memory"]["swap"] = json!(-5);
    assert!(refusal(&c).contains("not a size"));

    let mut c = podman_like();
    c["linux"]["resources"]["memory"]["swap"] = json!(1024);
    assert!(refusal(&c).contains("linux.resources.memory.swap"));

    let mut c = podman_like();
    c["annotations"]["io.boxdesk.backend"] = json!("qemu");
    assert!(refusal(&c).contains("io.boxdesk.backend"));

    let mut c = podman_like();
    c["process"]["capabilities"]["effective"] = json!(["CAP_SYS_ADMIN"]);
    assert!(refusal(&c).contains("process.capabilities.effective"));

    let mut c = podman_like();
    c["root"]["path"] = json!("missing");
    assert!(refusal(&c).contains("root.path"));

    let mut c = podman_like();
    c["root"]["path"] = json!("/");
    assert!(refusal(&c).contains("host's own root"));
    c["root"]["path"] = json!("../../../../../../../../..");
    assert!(refusal(&c).contains("host's own root"));
}

#[test]
fn a_pods_network_ipc_and_uts_namespaces_are_joined_by_path() {
    let mut c = podman_like();
    c["linux"]["namespaces"][1] = json!({"type": "network", "path": "/run/netns/pod"});
    c["linux"]["namespaces"][2] = json!({"type": "ipc", "path": "/proc/7/ns/ipc"});
    let b = bundle(&c);
    let p = load(b.path()).unwrap();
    assert!(!p.net_host);
    assert_eq!(
        p.layout.joins,
        vec![
            Join::Net("/run/netns/pod".into()),
            Join::Ipc("/proc/7/ns/ipc".into())
        ]
    );
    // A joined network namespace's sysctls are set in it.
    c["linux"]["sysctl"] = json!({"net.ipv4.ping_group_range": "0 0"});
    let b = bundle(&c);
    assert_eq!(load(b.path()).unwrap().sysctls.len(), 1);
}

#[test]
fn garbage_is_an_error_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for body in [
        &b"{"[..],
        b"[]",
        b"null",
        b"{\"ociVersion\": 5}",
        b"\xff\xfe",
    ] {
        std::fs::write(dir.path().join("config.json"), body).unwrap();
        assert!(load(dir.path()).is_err());
    }
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    assert!(load(dir.path()).is_err());
    // A huge file is refused before it is read whole.
    let f = std::fs::File::create(dir.path().join("config.json")).unwrap();
    f.set_len(MAX_CONFIG_BYTES + 10).unwrap();
    assert!(load(dir.path())
        .unwrap_err()
        .to_string()
        .contains("larger than"));
}

#[test]
fn sizes_take_the_mount_suffixes() {
    assert_eq!(parse_size("65536k"), Some(64 << 20));
    assert_eq!(parse_size("64m"), Some(64 << 20));
    assert_eq!(parse_size("1g"), Some(1 << 30));
    assert_eq!(parse_size("12"), Some(12));
    assert_eq!(parse_size("x"), None);
    assert_eq!(parse_size("99999999999999999999g"), None);
}
