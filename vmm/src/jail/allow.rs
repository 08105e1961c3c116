//! What each thread class of a VM helper may ask of the kernel: the
//! allowlists [`super`] compiles. A call is named here because a thread
//! of that class makes it on some path (found by tracing the helper's
//! threads through boots, execs, copies, virtio-fs shares, a display,
//! stops, guest reboots and panics in the x86_64 L1 —
//! `tests/nested/jail-trace.sh` — then read against the code, and the
//! whole VM suite run under the filters on both arches); nothing else is
//! allowed.
//!
//! Arguments narrow what would otherwise open the host: `ioctl` only with
//! the request numbers listed, `socket` only `AF_UNIX`, `clone` only for a
//! thread (`CLONE_THREAD`: no new process, so nothing can `exec`), `prctl`
//! only to name a thread or a mapping (or set no_new_privs again). Absent
//! everywhere: `execve`, `ptrace`, `mount` and the namespace calls, `bpf`,
//! `perf_event_open`, `open_by_handle_at`, `process_vm_*`, `keyctl`,
//! module and `kexec` calls, sockets of any other family.
//!
//! On x86_64 musl makes the old path calls (`open`, `unlink`, `mkdir`, …)
//! where the arch has them, so those are listed there beside the `*at`
//! ones; aarch64 has only the latter.

use libc::c_long;

/// A call and, when it is narrowed, the one argument checked and the values
/// it may take.
#[derive(Debug, Clone, Copy)]
pub(super) struct Allow {
    pub nr: c_long,
    pub args: Args,
}

/// How a call's arguments are checked.
#[derive(Debug, Clone, Copy)]
pub(super) enum Args {
    /// Any arguments.
    Any,
    /// Argument `index` equals one of the values.
    OneOf(u8, &'static [u64]),
    /// Argument `index` has every bit of the mask set.
    AllBits(u8, u64),
}

const fn any(nr: c_long) -> Allow {
    Allow {
        nr,
        args: Args::Any,
    }
}

const fn one_of(nr: c_long, index: u8, values: &'static [u64]) -> Allow {
    Allow {
        nr,
        args: Args::OneOf(index, values),
    }
}

use libc::*;

/// `_IO(0xAE, 0x80)`: run the vCPU.
pub(super) const KVM_RUN: u64 = 0xae80;
/// `_IOW(0xAE, 0xab, struct kvm_one_reg)` / `_IOW(0xAE, 0xac, …)`: one
/// register of an arm64 vCPU (PSCI state on a crash report).
#[cfg(target_arch = "aarch64")]
const KVM_GET_ONE_REG: u64 = 0x4010_aeab;
#[cfg(target_arch = "aarch64")]
const KVM_SET_ONE_REG: u64 = 0x4010_aeac;
/// `_IOR(0xAE, 0x81, struct kvm_regs)`: an x86_64 vCPU's registers.
#[cfg(target_arch = "x86_64")]
const KVM_GET_REGS: u64 = 0x8090_ae81;

// FIONBIO and FIOCLEX are `c_ulong` on glibc, `c_int` on musl.
#[allow(clippy::unnecessary_cast)]
#[cfg(target_arch = "x86_64")]
const VCPU_IOCTLS: &[u64] = &[KVM_RUN, KVM_GET_REGS, FIONBIO as u64];
#[allow(clippy::unnecessary_cast)]
#[cfg(target_arch = "aarch64")]
const VCPU_IOCTLS: &[u64] = &[KVM_RUN, KVM_GET_ONE_REG, KVM_SET_ONE_REG, FIONBIO as u64];
/// Outside the vCPU threads: only making a descriptor non-blocking (std's
/// `set_nonblocking` is `FIONBIO`) and closing it on exec.
#[allow(clippy::unnecessary_cast)]
const FD_IOCTLS: &[u64] = &[FIONBIO as u64, FIOCLEX as u64];

const UNIX: &[u64] = &[AF_UNIX as u64];
const NAMES: &[u64] = &[
    // seccompiler sets it before each filter it installs (a thread
    // entering its class's jail); it only ever takes privileges away.
    PR_SET_NO_NEW_PRIVS as u64,
    PR_SET_NAME as u64,
    PR_GET_NAME as u64,
    // glibc names its mappings (PR_SET_VMA_ANON_NAME) where it can.
    0x5356_4d41,
];

/// What every thread needs: memory, locks, time, signals, its own end,
/// reading and writing descriptors it holds.
pub(super) const BASE: &[Allow] = &[
    any(SYS_read),
    any(SYS_write),
    any(SYS_readv),
    any(SYS_writev),
    any(SYS_close),
    any(SYS_futex),
    any(SYS_mmap),
    any(SYS_munmap),
    // A DAX window's watch on a file nothing maps any more goes (a device
    // reset runs on a vCPU).
    any(SYS_inotify_rm_watch),
    any(SYS_mremap),
    any(SYS_mprotect),
    any(SYS_madvise),
    any(SYS_brk),
    any(SYS_rt_sigreturn),
    any(SYS_rt_sigprocmask),
    any(SYS_sigaltstack),
    any(SYS_exit),
    any(SYS_exit_group),
    any(SYS_sched_yield),
    any(SYS_sched_getaffinity),
    any(SYS_clock_gettime),
    any(SYS_clock_nanosleep),
    any(SYS_nanosleep),
    any(SYS_gettid),
    any(SYS_getpid),
    any(SYS_getrandom),
    any(SYS_restart_syscall),
    any(SYS_rseq),
    any(SYS_tgkill),
    // musl's pthread_kill: a vCPU's kick.
    any(SYS_tkill),
    any(SYS_fcntl),
    any(SYS_lseek),
    any(SYS_fstat),
    any(SYS_statx),
    any(SYS_newfstatat),
    any(SYS_ppoll),
    #[cfg(target_arch = "x86_64")]
    any(SYS_poll),
    any(SYS_eventfd2),
    one_of(SYS_prctl, 0, NAMES),
    // Who we are: the peer-uid checks of the vsock muxer and the control
    // socket compare against it.
    any(SYS_getuid),
    any(SYS_geteuid),
    any(SYS_getgid),
    any(SYS_getegid),
];

/// virtio-blk's I/O: a kick is served on the vCPU that wrote it (no
/// ioeventfd on Hypervisor.framework, or a write the ioeventfd does not
/// match) or on the queue notifier's thread.
pub(super) const BLK_IO: &[Allow] = &[
    any(SYS_pread64),
    any(SYS_pwrite64),
    any(SYS_preadv),
    any(SYS_pwritev),
    any(SYS_fsync),
    any(SYS_fdatasync),
];

/// A vCPU thread: `KVM_RUN` and the device work an exit does on it
/// (a device's activation: its event poller and descriptors; the
/// console's log; and [`BLK_IO`]).
pub(super) const VCPU: &[Allow] = &[
    one_of(SYS_ioctl, 1, VCPU_IOCTLS),
    any(SYS_rt_sigaction),
    any(SYS_epoll_create1),
    any(SYS_epoll_ctl),
    any(SYS_dup),
    any(SYS_memfd_create),
    any(SYS_ftruncate),
];

/// A device's event loop: its poller, the vsock muxer's Unix sockets (a
/// guest-initiated stream connects to `<uds>_<port>`), its eventfds; the
/// queue notifier serves a kick on its own thread (and [`BLK_IO`]).
pub(super) const DEVICE: &[Allow] = &[
    one_of(SYS_ioctl, 1, FD_IOCTLS),
    any(SYS_setsockopt),
    any(SYS_epoll_ctl),
    any(SYS_epoll_pwait),
    #[cfg(target_arch = "x86_64")]
    any(SYS_epoll_wait),
    one_of(SYS_socket, 0, UNIX),
    any(SYS_connect),
    any(SYS_accept4),
    any(SYS_getsockopt),
    any(SYS_getsockname),
    any(SYS_getpeername),
    any(SYS_recvfrom),
    any(SYS_sendto),
    any(SYS_recvmsg),
    any(SYS_sendmsg),
    any(SYS_shutdown),
    any(SYS_dup),
];

/// A control-socket connection: its socket (a display lease's descriptor
/// goes out with `SCM_RIGHTS`), and — for `stop` — the helper's end: the
/// VM stopped, the state dir removed, the process gone.
pub(super) const CONTROL: &[Allow] = &[
    one_of(SYS_ioctl, 1, FD_IOCTLS),
    // `stop` asks the agent to shut down over the VM's vsock socket.
    one_of(SYS_socket, 0, UNIX),
    any(SYS_connect),
    any(SYS_setsockopt),
    any(SYS_getsockname),
    any(SYS_recvfrom),
    any(SYS_sendto),
    any(SYS_recvmsg),
    any(SYS_sendmsg),
    any(SYS_shutdown),
    any(SYS_getsockopt),
    any(SYS_openat),
    // Passed on to the filter that answers it ENOSYS (see `super`): libc
    // falls back to `openat`.
    any(SYS_openat2),
    any(SYS_getdents64),
    any(SYS_unlinkat),
    any(SYS_mkdirat),
    #[cfg(target_arch = "x86_64")]
    any(SYS_renameat),
    any(SYS_renameat2),
    any(SYS_fchmod),
    any(SYS_flock),
    any(SYS_fsync),
    any(SYS_fdatasync),
    any(SYS_dup),
    #[cfg(target_arch = "x86_64")]
    any(SYS_open),
    #[cfg(target_arch = "x86_64")]
    any(SYS_unlink),
    #[cfg(target_arch = "x86_64")]
    any(SYS_rmdir),
    #[cfg(target_arch = "x86_64")]
    any(SYS_mkdir),
    #[cfg(target_arch = "x86_64")]
    any(SYS_rename),
    #[cfg(target_arch = "x86_64")]
    any(SYS_stat),
    #[cfg(target_arch = "x86_64")]
    any(SYS_lstat),
    #[cfg(target_arch = "x86_64")]
    any(SYS_access),
    #[cfg(target_arch = "x86_64")]
    any(SYS_readlink),
    #[cfg(target_arch = "x86_64")]
    any(SYS_chmod),
];

/// A virtio-fs worker: the file system beneath its share (never by a
/// handle: no `open_by_handle_at`), as the guest's request asks, under the
/// ids it serves as.
pub(super) const FILE_SERVER: &[Allow] = &[
    one_of(SYS_ioctl, 1, FD_IOCTLS),
    // A file mapped into a DAX window is watched for truncation.
    any(SYS_inotify_add_watch),
    any(SYS_openat),
    // Passed on to the filter that answers it ENOSYS (see `super`): libc
    // falls back to `openat`.
    any(SYS_openat2),
    // fuse-backend-rs reopens through /proc/self/fd with `open`, which
    // musl makes `SYS_open` where the arch has it.
    #[cfg(target_arch = "x86_64")]
    any(SYS_open),
    any(SYS_getdents64),
    any(SYS_readlinkat),
    any(SYS_mkdirat),
    any(SYS_mknodat),
    any(SYS_symlinkat),
    any(SYS_linkat),
    any(SYS_unlinkat),
    #[cfg(target_arch = "x86_64")]
    any(SYS_renameat),
    any(SYS_renameat2),
    any(SYS_fchmod),
    any(SYS_fchmodat),
    any(SYS_fchown),
    any(SYS_fchownat),
    any(SYS_utimensat),
    any(SYS_ftruncate),
    any(SYS_fallocate),
    any(SYS_fsync),
    any(SYS_fdatasync),
    any(SYS_pread64),
    any(SYS_pwrite64),
    any(SYS_preadv),
    any(SYS_pwritev),
    any(SYS_preadv2),
    any(SYS_pwritev2),
    any(SYS_copy_file_range),
    any(SYS_statfs),
    any(SYS_fstatfs),
    any(SYS_flock),
    any(SYS_dup),
    any(SYS_fgetxattr),
    any(SYS_fsetxattr),
    any(SYS_flistxattr),
    any(SYS_fremovexattr),
    any(SYS_getxattr),
    any(SYS_setxattr),
    any(SYS_listxattr),
    any(SYS_removexattr),
    any(SYS_lgetxattr),
    any(SYS_lsetxattr),
    any(SYS_llistxattr),
    any(SYS_lremovexattr),
    any(SYS_setresuid),
    any(SYS_setresgid),
    any(SYS_setfsuid),
    any(SYS_setfsgid),
    any(SYS_setgroups),
    any(SYS_capget),
    any(SYS_capset),
    any(SYS_umask),
    any(SYS_getuid),
    any(SYS_geteuid),
    any(SYS_getgid),
    any(SYS_getegid),
];

/// The rest of the helper (main, the signal thread, the control socket's
/// accept and lobby threads, the thread factory): everything the classes
/// do, plus making threads, the control socket's listener, and writing
/// the state dir. Every thread holds this filter beneath its own.
pub(super) const HELPER: &[Allow] = &[
    Allow {
        nr: SYS_clone,
        args: Args::AllBits(0, CLONE_THREAD as u64),
    },
    // Answered ENOSYS by a filter of its own (see `super`), so that libc
    // falls back to `clone`, whose flags a filter can read.
    any(SYS_clone3),
    // A thread entering its class's jail adds its filter (mode 1:
    // SECCOMP_SET_MODE_FILTER); filters only ever take calls away.
    one_of(SYS_seccomp, 0, &[1]),
    any(SYS_set_robust_list),
    any(SYS_rt_sigaction),
    any(SYS_rt_sigtimedwait),
    any(SYS_accept4),
    any(SYS_bind),
    any(SYS_listen),
    any(SYS_socketpair),
    any(SYS_pipe2),
    any(SYS_wait4),
    any(SYS_waitid),
    any(SYS_kill),
    any(SYS_getppid),
    any(SYS_uname),
    any(SYS_getcwd),
    any(SYS_faccessat),
    any(SYS_faccessat2),
    any(SYS_sysinfo),
    any(SYS_prlimit64),
    any(SYS_getrusage),
    any(SYS_getsockopt),
    any(SYS_setsockopt),
    any(SYS_umask),
    any(SYS_getuid),
    any(SYS_geteuid),
    any(SYS_getgid),
    any(SYS_getegid),
    #[cfg(target_arch = "x86_64")]
    any(SYS_dup2),
    #[cfg(target_arch = "x86_64")]
    any(SYS_pipe),
];
