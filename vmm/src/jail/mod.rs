//! The VM helper's jail (Linux): once the VM is built and before a vCPU
//! runs, [`lock_down`] takes away what the helper no longer needs.
//!
//! 1. **The process**: no new privileges, no core dumps and not
//!    dumpable (guest memory must never land in a core file, nor be read
//!    through `/proc/PID/mem` by another process of the user without
//!    `CAP_SYS_PTRACE`), `RLIMIT_NOFILE` no higher than the helper needs.
//! 2. **Every thread** gets the helper's allowlist ([`allow::HELPER`] and
//!    every class's calls), synchronised across the threads that exist
//!    (`SECCOMP_FILTER_FLAG_TSYNC`), plus a filter answering `clone3` and
//!    `openat2` with `ENOSYS` so that libc falls back to `clone` and
//!    `openat`, whose flags the allowlist checks (a thread, never a
//!    process: nothing can `exec`); the namespace sandbox's filter answers
//!    the same calls the same way (`boxdesk_sandbox::seccomp::ENOSYS_CALLS`).
//! 3. **Each thread class** narrows itself further when its thread
//!    starts, through `boxdesk_platform::threads`: vCPUs ([`allow::VCPU`]:
//!    `KVM_RUN` and the device work an exit does), device event loops,
//!    control-socket connections, virtio-fs workers. Device threads are
//!    created by the platform's thread factory, not by the vCPU that
//!    activates the device, so they never inherit a vCPU's filter.
//!
//! A call outside a thread's allowlist traps: [`sigsys`] writes one line
//! to the helper's stderr (its log) — `SECCOMP`, the thread, the system
//! call's number — and the process dies of `SIGSYS`, which the CLI reports.
//!
//! `BOXDESK_SECCOMP=off` installs no filter (the benchmark's baseline),
//! and says so in the log; the process steps of 1. hold then too.

mod allow;
mod sigsys;
pub mod view;

use std::collections::BTreeMap;

use boxdesk_platform::threads::{self, Class};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use allow::{Allow, Args};

/// How calls outside the allowlists are met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Trapped: a log line, then the process dies of `SIGSYS`.
    Enforce,
    /// No seccomp filter at all (the benchmark's baseline).
    Off,
}

impl Mode {
    /// `BOXDESK_SECCOMP`: `off`, else (unset too) enforce.
    pub fn from_env() -> Mode {
        match std::env::var("BOXDESK_SECCOMP").as_deref() {
            Ok("off") => Mode::Off,
            _ => Mode::Enforce,
        }
    }
}

/// Why the helper could not be jailed (it then refuses to run the VM).
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A process-wide step failed.
    #[error("cannot {what}")]
    Process {
        /// The step.
        what: &'static str,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A filter did not compile (a bug in the lists).
    #[error("cannot compile the {class} seccomp filter")]
    Compile {
        /// The class.
        class: &'static str,
        /// What seccompiler said.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused a filter.
    #[error("cannot install the helper's seccomp filter")]
    Install(#[source] seccompiler::Error),
    /// The thread hook was installed already.
    #[error(transparent)]
    Hook(#[from] threads::InstallError),
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Process { what, source }
}

/// The descriptors a helper may hold: the VM's own (KVM, memory, eventfds,
/// a few hundred with a display) and, with virtio-fs, the file server's
/// open files (it raised the limit to the hard limit for them).
const NOFILE_WITHOUT_SHARES: u64 = 4096;

/// Jails the calling process as described in the module doc; call it
/// from the thread that built the VM, after the VM is built and before a
/// vCPU runs. `serves_files`: virtio-fs shares are served (their open
/// files keep the raised descriptor limit).
pub fn lock_down(mode: Mode, serves_files: bool) -> Result<(), JailError> {
    process(serves_files)?;
    if mode == Mode::Off {
        tracing::warn!("seccomp: off (BOXDESK_SECCOMP=off): the VM helper runs unfiltered");
        return Ok(());
    }
    sigsys::install().map_err(os("install the SIGSYS handler"))?;
    let trap = SeccompAction::Trap;
    let arch = target_arch();
    let mut classes = Vec::new();
    for class in Class::ALL {
        classes.push((
            class,
            compile(class.name(), &lists(Some(class)), trap.clone(), arch)?,
        ));
    }
    let helper = compile("helper", &lists(None), trap, arch)?;
    let enosys = SeccompFilter::new(
        boxdesk_sandbox::seccomp::ENOSYS_CALLS
            .iter()
            .map(|&nr| (nr, vec![]))
            .collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .and_then(BpfProgram::try_from)
    .map_err(|source| JailError::Compile {
        class: "enosys",
        source,
    })?;
    threads::install(Box::new(move |class| {
        let Some((_, program)) = classes.iter().find(|(c, _)| *c == class) else {
            return;
        };
        sigsys::name_thread_class(class);
        if let Err(e) = seccompiler::apply_filter(program) {
            // A thread that cannot be jailed must not run.
            eprintln!(
                "boxdesk: SECCOMP: cannot jail a {} thread: {e}",
                class.name()
            );
            std::process::abort();
        }
    }))?;
    seccompiler::apply_filter_all_threads(&helper).map_err(JailError::Install)?;
    seccompiler::apply_filter_all_threads(&enosys).map_err(JailError::Install)?;
    tracing::debug!("seccomp: every thread filtered ({mode:?})");
    Ok(())
}

/// The process-wide steps, whatever the mode.
fn process(serves_files: bool) -> Result<(), JailError> {
    // SAFETY: prctl with integer arguments only; results checked.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(os("set no_new_privs")(std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(os("make the helper non-dumpable")(
            std::io::Error::last_os_error(),
        ));
    }
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(|e| os("turn core dumps off")(e.into()))?;
    if !serves_files {
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map_err(|e| os("read RLIMIT_NOFILE")(e.into()))?;
        let cap = NOFILE_WITHOUT_SHARES;
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NOFILE,
            soft.min(cap),
            hard.min(cap),
        )
        .map_err(|e| os("lower RLIMIT_NOFILE")(e.into()))?;
    }
    Ok(())
}

/// The calls of `class` (with [`allow::BASE`]), or of the whole helper
/// (`None`: every class and [`allow::HELPER`]).
fn lists(class: Option<Class>) -> Vec<Allow> {
    let of = |c: Class| -> &[&[Allow]] {
        match c {
            Class::Vcpu => &[allow::VCPU, allow::BLK_IO],
            Class::Device => &[allow::DEVICE, allow::BLK_IO],
            Class::Control => &[allow::CONTROL],
            Class::FileServer => &[allow::FILE_SERVER],
        }
    };
    let mut out = allow::BASE.to_vec();
    match class {
        Some(c) => out.extend(of(c).concat()),
        None => {
            for c in Class::ALL {
                out.extend(of(c).concat());
            }
            out.extend_from_slice(allow::HELPER);
        }
    }
    out
}

/// One allowlist as a program: listed calls (with their argument checks)
/// allowed, anything else `trap`, another architecture killed. Values are
/// compared on the argument's low 32 bits: `ioctl`'s request, `socket`'s
/// family and `prctl`'s option are C `int`s, which musl passes
/// sign-extended (`KVM_GET_REGS` has bit 31 set).
fn compile(
    class: &'static str,
    calls: &[Allow],
    trap: SeccompAction,
    arch: TargetArch,
) -> Result<BpfProgram, JailError> {
    let fail = |source| JailError::Compile { class, source };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut unconditional = std::collections::BTreeSet::new();
    for a in calls {
        let nr: i64 = a.nr;
        let conditions: Vec<Vec<SeccompCondition>> = match a.args {
            Args::Any => {
                unconditional.insert(nr);
                continue;
            }
            Args::OneOf(index, values) => values
                .iter()
                .map(|&v| {
                    SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)
                        .map(|c| vec![c])
                })
                .collect::<Result<_, _>>()
                .map_err(fail)?,
            Args::AllBits(index, mask) => vec![vec![SeccompCondition::new(
                index,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(mask),
                mask,
            )
            .map_err(fail)?]],
        };
        let entry = rules.entry(nr).or_default();
        for c in conditions {
            entry.push(SeccompRule::new(c).map_err(fail)?);
        }
    }
    // A call allowed with any arguments anywhere is allowed outright.
    for nr in unconditional {
        rules.insert(nr, Vec::new());
    }
    SeccompFilter::new(rules, trap, SeccompAction::Allow, arch)
        .and_then(BpfProgram::try_from)
        .map_err(fail)
}

fn target_arch() -> TargetArch {
    if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else {
        TargetArch::x86_64
    }
}

/// The test hook of the nested suite: with `BOXDESK_JAIL_TEST=forbidden`
/// in the helper's environment, a vCPU thread, once jailed, makes a call
/// its allowlist lacks (`socket(AF_INET, …)`), as a compromised device
/// model would.
pub(crate) fn test_forbidden_call() {
    if std::env::var_os("BOXDESK_JAIL_TEST").is_some_and(|v| v == "forbidden") {
        // SAFETY: socket(2) with integer arguments; whatever it returns
        // (it should never return) is closed.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        if fd >= 0 {
            // SAFETY: `fd` was just returned to us.
            unsafe { libc::close(fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs this test binary's `test` alone in a child process with
    /// `BOXDESK_JAIL_CHILD` set (a jail is for a whole process, and for
    /// good); its status and output.
    fn in_child(test: &str) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("BOXDESK_JAIL_CHILD", "1")
            .output()
            .unwrap()
    }

    fn child() -> bool {
        std::env::var_os("BOXDESK_JAIL_CHILD").is_some()
    }

    #[test]
    fn a_jailed_vcpu_thread_that_opens_an_inet_socket_kills_the_process_with_sigsys_and_a_seccomp_line(
    ) {
        const NAME: &str = "jail::tests::a_jailed_vcpu_thread_that_opens_an_inet_socket_kills_the_process_with_sigsys_and_a_seccomp_line";
        if child() {
            lock_down(Mode::Enforce, false).unwrap();
            let t = threads::spawn("vcpu7".into(), Class::Vcpu, || {
                // SAFETY: socket(2) with integer arguments.
                unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) }
            })
            .unwrap();
            let _ = t.join();
            println!("still alive");
            return;
        }
        use std::os::unix::process::ExitStatusExt;
        let out = in_child(NAME);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{out:?}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("still alive"));
        let line = format!(
            "boxdesk: SECCOMP: thread vcpu7 (vcpu allowlist) made system call {} (first arguments {:#x}, {:#x}), which it may not make",
            libc::SYS_socket,
            libc::AF_INET,
            libc::SOCK_STREAM
        );
        assert!(stderr.contains(&line), "{stderr}");
    }

    #[test]
    fn a_jailed_helper_is_answered_enosys_for_openat2_and_clone3_so_libc_falls_back() {
        const NAME: &str = "jail::tests::a_jailed_helper_is_answered_enosys_for_openat2_and_clone3_so_libc_falls_back";
        if child() {
            lock_down(Mode::Enforce, true).unwrap();
            for (name, nr) in [("openat2", libc::SYS_openat2), ("clone3", libc::SYS_clone3)] {
                // SAFETY: the pointers are bad on purpose (were the call let
                // through, the kernel would answer EFAULT and change
                // nothing); only integers are passed.
                let r = unsafe { libc::syscall(nr, libc::AT_FDCWD, 1usize, 1usize, 24usize) };
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                println!("{name} {r} {errno}");
            }
            return;
        }
        let out = in_child(NAME);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let enosys = libc::ENOSYS;
        assert!(
            stdout.contains(&format!("openat2 -1 {enosys}\n")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("clone3 -1 {enosys}\n")),
            "{stdout}"
        );
    }

    #[test]
    fn the_process_steps_leave_no_new_privileges_no_core_dumps_and_a_process_no_one_may_dump() {
        const NAME: &str = "jail::tests::the_process_steps_leave_no_new_privileges_no_core_dumps_and_a_process_no_one_may_dump";
        if child() {
            process(false).unwrap();
            // SAFETY: prctl with integer arguments.
            let (nnp, dumpable) = unsafe {
                (
                    libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0),
                    libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0),
                )
            };
            let core =
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_CORE).unwrap();
            let nofile =
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
            println!("nnp {nnp} dumpable {dumpable} core {core:?} nofile {nofile:?}");
            return;
        }
        let out = in_child(NAME);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("nnp 1 dumpable 0 core (0, 0) nofile"),
            "{stdout}"
        );
        let nofile = stdout.split("nofile (").nth(1).unwrap();
        let hard: u64 = nofile
            .split([',', ')'])
            .nth(1)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(hard <= NOFILE_WITHOUT_SHARES, "{stdout}");
    }

    #[test]
    fn once_jailed_every_thread_old_and_new_has_a_seccomp_filter() {
        const NAME: &str = "jail::tests::once_jailed_every_thread_old_and_new_has_a_seccomp_filter";
        if child() {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let before = std::thread::spawn(move || rx.recv());
            lock_down(Mode::Enforce, false).unwrap();
            let device = threads::spawn("dev".into(), Class::Device, || {
                std::thread::sleep(std::time::Duration::from_millis(300))
            })
            .unwrap();
            for task in std::fs::read_dir("/proc/self/task").unwrap() {
                let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
                let seccomp = status.lines().find(|l| l.starts_with("Seccomp:")).unwrap();
                println!("{seccomp}");
            }
            device.join().unwrap();
            drop(tx);
            let _ = before.join();
            return;
        }
        let out = in_child(NAME);
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let seccomp: Vec<_> = stdout
            .lines()
            .filter(|l| l.starts_with("Seccomp:"))
            .collect();
        // The test's thread, the one started before, the factory, the device's.
        assert!(seccomp.len() >= 4, "{stdout}");
        assert!(seccomp.iter().all(|l| l.ends_with("\t2")), "{stdout}");
    }

    #[test]
    fn every_class_and_the_whole_helper_compile_for_this_arch() {
        for class in Class::ALL {
            compile(
                class.name(),
                &lists(Some(class)),
                SeccompAction::Trap,
                target_arch(),
            )
            .unwrap();
        }
        compile("helper", &lists(None), SeccompAction::Trap, target_arch()).unwrap();
    }

    #[test]
    fn no_list_allows_exec_ptrace_mounts_or_file_handles() {
        let forbidden = [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_ptrace,
            libc::SYS_mount,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_open_by_handle_at,
            libc::SYS_bpf,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_keyctl,
        ];
        let all = lists(None);
        for nr in forbidden {
            assert!(
                all.iter().all(|a| a.nr != nr),
                "system call {nr} is allowed"
            );
        }
    }

    #[test]
    fn the_vcpu_list_lacks_the_call_the_test_hook_makes() {
        assert!(lists(Some(Class::Vcpu))
            .iter()
            .all(|a| a.nr != libc::SYS_socket));
    }

    #[test]
    fn sockets_are_unix_only_and_clone_makes_only_threads() {
        for a in lists(None) {
            match a.nr {
                libc::SYS_socket => {
                    assert!(matches!(a.args, Args::OneOf(0, v) if v == [libc::AF_UNIX as u64]))
                }
                libc::SYS_clone => {
                    assert!(matches!(a.args, Args::AllBits(0, m) if m == libc::CLONE_THREAD as u64))
                }
                _ => {}
            }
        }
    }
}
