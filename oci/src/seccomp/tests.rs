use super::*;

fn profile(json: serde_json::Value) -> LinuxSeccomp {
    serde_json::from_value(json).unwrap()
}

/// Runs `probe` in a forked child under `programs` (no_new_privs first)
/// and returns what it wrote: one `i64` per call it made.
fn under(programs: &[BpfProgram], probe: fn() -> [i64; 4]) -> [i64; 4] {
    let (r, w) = nix::unistd::pipe().unwrap();
    // SAFETY: the child only makes raw system calls and `_exit`s.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            drop(r);
            // SAFETY: prctl and seccomp with valid arguments; `probe` makes
            // plain system calls; nothing allocates.
            unsafe {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                for p in programs {
                    let fprog = libc::sock_fprog {
                        len: p.len() as u16,
                        filter: p.as_ptr() as *mut libc::sock_filter,
                    };
                    if libc::syscall(libc::SYS_seccomp, 1, 0, &fprog) != 0 {
                        libc::_exit(90);
                    }
                }
                let out = probe();
                let bytes: [u8; 32] = std::mem::transmute(out);
                libc::write(
                    std::os::fd::AsRawFd::as_raw_fd(&w),
                    bytes.as_ptr().cast(),
                    32,
                );
                libc::_exit(0);
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            let mut buf = [0u8; 32];
            let mut f = std::fs::File::from(r);
            std::io::Read::read_exact(&mut f, &mut buf).expect("the child reported");
            let st = nix::sys::wait::waitpid(child, None).unwrap();
            assert_eq!(st, nix::sys::wait::WaitStatus::Exited(child, 0));
            // SAFETY: 32 bytes are four i64s.
            unsafe { std::mem::transmute::<[u8; 32], [i64; 4]>(buf) }
        }
    }
}

/// A call's result: its return value, or minus its errno.
fn call(nr: libc::c_long, a0: libc::c_long) -> i64 {
    // SAFETY: the calls probed take no pointers (or none are passed).
    let rc = unsafe { libc::syscall(nr, a0) };
    if rc == -1 {
        // SAFETY: errno of this thread.
        -i64::from(unsafe { *libc::__errno_location() })
    } else {
        rc
    }
}

#[test]
fn each_rule_gets_its_action_unnamed_calls_the_default_and_arguments_are_checked() {
    let p = profile(serde_json::json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 99,
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": [
            {"names": ["write", "exit_group", "exit", "getpid", "not_a_call_here", "_llseek"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 4294967295u64, "op": "SCMP_CMP_EQ"}]}
        ]
    }));
    let programs = programs(&p).unwrap();
    assert_eq!(programs.len(), 2, "the default's program and ERRNO(1)'s");
    let got = under(&programs, || {
        [
            call(libc::SYS_getpid, 0),
            call(libc::SYS_getppid, 0),
            call(libc::SYS_getuid, 0),
            call(libc::SYS_personality, 8),
        ]
    });
    assert!(got[0] > 0, "getpid is allowed: {got:?}");
    assert_eq!(got[1], -1, "getppid answers its rule's EPERM: {got:?}");
    assert_eq!(got[2], -99, "getuid is unnamed: the default: {got:?}");
    assert_eq!(
        got[3], -99,
        "personality(8) fails its argument check: {got:?}"
    );
    let allowed = under(&programs, || {
        [call(libc::SYS_personality, 0xffff_ffff), 0, 0, 0]
    });
    assert!(
        allowed[0] >= 0,
        "personality(query) passes its check: {allowed:?}"
    );
}

#[test]
fn a_profile_that_allows_by_default_denies_only_what_it_names() {
    let p = profile(serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": 77}]
    }));
    let programs = programs(&p).unwrap();
    assert_eq!(programs.len(), 1);
    let got = under(&programs, || {
        [call(libc::SYS_getppid, 0), call(libc::SYS_getuid, 0), 0, 0]
    });
    assert_eq!(got[0], -77);
    assert!(got[1] >= 0);
}

#[test]
fn notify_listeners_and_flags_are_refused_not_dropped() {
    let notify = profile(serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["mount"], "action": "SCMP_ACT_NOTIFY"}]
    }));
    assert!(compile(&notify)
        .unwrap_err()
        .to_string()
        .contains("SCMP_ACT_NOTIFY"));
    let flags = profile(serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "flags": ["SECCOMP_FILTER_FLAG_LOG"]
    }));
    assert!(compile(&flags)
        .unwrap_err()
        .to_string()
        .contains("linux.seccomp.flags"));
}
