//! The seccomp filter as a sandboxed program meets it: the host-facing
//! calls of an earlier attack round's findings answer `EPERM` inside `boxdesk run`, as
//! root and as a user, while a FIFO can still be made.

use std::collections::HashMap;
use std::path::Path;

use crate::support::TestEnv;

/// A python3 probe: each line `name ERRNO` (`ok` when the call worked).
/// Arguments are real ones (a map to create, the session keyring, the
/// kernel log to read), so only the filter stands between them and success
/// as root; none changes the host if it got through.
fn probe_script() -> String {
    format!(
        r#"
import ctypes, errno, os, stat, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r != -1 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def addr(buf):
    return ctypes.addressof(buf)
def py(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
out = {{}}
out["fanotify_init"] = call({fanotify_init}, 0, 0)
attr = ctypes.create_string_buffer(72)
struct.pack_into("IIII", attr, 0, 2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY, 4-byte key/value, 1 entry
out["bpf"] = call({bpf}, 0, addr(attr), 72)  # BPF_MAP_CREATE
pattr = ctypes.create_string_buffer(128)
struct.pack_into("IIQ", pattr, 0, 1, 64, 0)  # PERF_TYPE_SOFTWARE, size VER0, CPU clock
out["perf_event_open"] = call({perf_event_open}, addr(pattr), 0, -1, -1, 0)
out["settimeofday"] = call({settimeofday}, 0, 0)
log = ctypes.create_string_buffer(4096)
out["syslog"] = call({syslog}, 3, addr(log), 4096)  # SYSLOG_ACTION_READ_ALL
out["mknod_block"] = py(lambda: os.mknod("/tmp/blk", stat.S_IFBLK | 0o600, os.makedev(7, 0)))
out["keyctl"] = call({keyctl}, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID, session keyring
out["userfaultfd"] = call({userfaultfd}, os.O_CLOEXEC)
out["unshare_user"] = call({unshare}, {clone_newuser})
out["mkfifo"] = py(lambda: os.mkfifo("/tmp/fifo", 0o600))
out["fifo_is_fifo"] = "ok" if stat.S_ISFIFO(os.stat("/tmp/fifo").st_mode) else "no"
for k, v in out.items():
    print(k, v)
"#,
        fanotify_init = libc::SYS_fanotify_init,
        bpf = libc::SYS_bpf,
        perf_event_open = libc::SYS_perf_event_open,
        settimeofday = libc::SYS_settimeofday,
        syslog = libc::SYS_syslog,
        keyctl = libc::SYS_keyctl,
        userfaultfd = libc::SYS_userfaultfd,
        unshare = libc::SYS_unshare,
        clone_newuser = libc::CLONE_NEWUSER,
    )
}

#[test]
fn host_facing_calls_get_eperm_inside_and_a_fifo_can_still_be_made() {
    if !Path::new("/usr/bin/python3").exists() {
        println!("skipped: no /usr/bin/python3 on the host (the sandbox sees the host's /usr)");
        return;
    }
    let env = TestEnv::new();
    let out = env.run(["run", "--", "python3", "-c", &probe_script()]);
    assert_eq!(out.code(), 0, "{out}");
    let got: HashMap<&str, &str> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .collect();
    for call in [
        "fanotify_init",
        "bpf",
        "perf_event_open",
        "settimeofday",
        "syslog",
        "mknod_block",
        "keyctl",
        "userfaultfd",
        "unshare_user",
    ] {
        assert_eq!(got.get(call), Some(&"EPERM"), "{call}: {out}");
    }
    assert_eq!(got.get("mkfifo"), Some(&"ok"), "{out}");
    assert_eq!(got.get("fifo_is_fifo"), Some(&"ok"), "{out}");
}
