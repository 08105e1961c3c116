//! `boxdesk oci features`: what this runtime supports, as the runtime
//! spec's features document (`features.json`) says it, so engines can
//! ask before they send a config.

use serde_json::{json, Value};

/// The features document.
pub fn document() -> Value {
    json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": "1.2.0",
        "hooks": [],
        "mountOptions": [
            "bind", "rbind", "ro", "rw", "nosuid", "nodev", "noexec", "suid", "dev", "exec",
            "private", "rprivate", "slave", "rslave", "strictatime", "relatime", "norelatime",
            "noatime", "nodiratime", "newinstance", "async", "sync", "size=", "mode=",
            "ptmxmode=", "gid=", "uid="
        ],
        "linux": {
            "namespaces": ["pid", "network", "ipc", "uts", "mount", "user", "cgroup"],
            "capabilities": crate::features::CAPS,
            "cgroup": { "v1": true, "v2": true, "systemd": false, "systemdUser": false, "rdma": false },
            "seccomp": {
                "enabled": true,
                "actions": [
                    "SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
                    "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG", "SCMP_ACT_TRACE", "SCMP_ACT_TRAP"
                ],
                "operators": [
                    "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_LE", "SCMP_CMP_LT",
                    "SCMP_CMP_MASKED_EQ", "SCMP_CMP_NE"
                ],
                "archs": [native_arch()],
                "knownFlags": [],
                "supportedFlags": []
            },
            "apparmor": { "enabled": false },
            "selinux": { "enabled": false },
            "intelRdt": { "enabled": false },
            "mountExtensions": { "idmap": { "enabled": false } }
        },
        "annotations": {
            "io.boxdesk.backend": "auto|namespace|vm",
            "io.boxdesk.noNewPrivileges": "always on",
            "io.boxdesk.cgroupsPath": "recorded, not followed: the sandbox's cgroup is boxdesk's own"
        }
    })
}

fn native_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "SCMP_ARCH_AARCH64",
        _ => "SCMP_ARCH_X86_64",
    }
}

/// The capabilities a container may keep (in its own user namespace).
pub const CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];
