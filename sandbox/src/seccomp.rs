//! The namespace sandbox's seccomp filter: a deny-list compiled by
//! [`seccompiler`] (rust-vmm, Firecracker's compiler) for the host's
//! architecture and handed to bwrap as classic BPF programs
//! (`--add-seccomp-fd`), which bwrap installs, after
//! `PR_SET_NO_NEW_PRIVS`, right before it execs the agent.
//!
//! It is a deny-list, not an allow-list: everything not named below is
//! allowed. It is one layer on top of the others (new namespaces, a user
//! namespace, dropped capabilities, read-only host dirs), there to take away
//! the kernel interfaces those layers leave reachable or that a sandboxed
//! root could still use. [`programs`] returns, in order:
//!
//! 1. **deny** (seccompiler): a system call from another architecture or
//!    ABI (`int 0x80` on x86_64, say) kills the process, since its numbers
//!    would walk past every rule; the calls below fail with `EPERM`;
//! 2. **enosys** (seccompiler): `clone3` and `openat2` fail with `ENOSYS`,
//!    so libc falls back to `clone` and `openat`, whose flags and mode a
//!    filter can read (`clone3` and `openat2` keep them in memory, where
//!    seccomp cannot look: `openat2(O_CREAT)` with mode 06755 would make a
//!    set-id file past the mode rules below; Docker and Flatpak answer
//!    `clone3` the same way). A second program because seccompiler gives a
//!    filter one match action;
//! 3. **x32** (x86_64 only, four instructions built here): a system call
//!    with bit 30 of its number set (the x32 ABI, same audit arch) fails
//!    with `EPERM`. seccompiler matches numbers one by one, so it cannot
//!    say "every number at or above 2^30".
//!
//! What fails with `EPERM`, one reason per group:
//!
//! - namespaces and mounts (`clone`/`unshare` with a namespace flag,
//!   `setns`, `mount`, `umount2`, `pivot_root`, `chroot`, `open_tree`,
//!   `open_tree_attr`, `move_mount`, `fsopen`, `fsconfig`, `fsmount`,
//!   `fspick`, `mount_setattr`): a new user namespace makes the caller root
//!   over new mount and network namespaces, and mounts change what the
//!   sandbox sees of the host (`unshare` of `CLONE_FILES`, `CLONE_FS` or
//!   `CLONE_SYSVSEM` alone makes no namespace and stays allowed);
//! - kernel code (`kexec_load`, `kexec_file_load`, `init_module`,
//!   `finit_module`, `delete_module`): replace the host kernel or load code
//!   into it;
//! - other processes (`ptrace`, `process_vm_readv`, `process_vm_writev`,
//!   `pidfd_getfd`, `process_madvise`, `kcmp`): read or write the agent's
//!   memory, steal its descriptors (its socket to the host);
//! - seeing past the sandbox (`fanotify_init`, `bpf`, `perf_event_open`,
//!   `syslog`, `lookup_dcookie`): fanotify hands out open descriptors of
//!   every file host processes open on a filesystem; BPF programs and perf
//!   events observe the host; the kernel log leaks addresses (KASLR);
//! - exploit aids (`userfaultfd`): stalls kernel copies at will, which
//!   turns kernel races into reliable exploits;
//! - the clock (`settimeofday`, `clock_settime`, `adjtimex`,
//!   `clock_adjtime`): the host has one, shared by every process;
//! - host administration (`swapon`, `swapoff`, `acct`, `reboot`,
//!   `quotactl`, `quotactl_fd`, `vhangup`): swap onto a sandbox file, make
//!   the kernel write accounting records, change quotas, reboot, hang up
//!   terminals;
//! - keyrings (`keyctl`, `add_key`, `request_key`): not namespaced, so the
//!   invoking user's keys (cached credentials) are in reach;
//! - file handles (`name_to_handle_at`, `open_by_handle_at`): open any file
//!   of a mounted filesystem by handle, outside the sandbox's mount tree
//!   (the "shocker" escape);
//! - raw hardware (x86_64: `iopl`, `ioperm`): I/O port access;
//! - x86_64 `modify_ldt`: segment descriptors of the process's own, old
//!   ground for kernel bugs (CVE-2015-5157, CVE-2017-17053) that no current
//!   program needs (Docker refuses it too);
//! - obsolete calls (`nfsservctl`; x86_64: `uselib`, `_sysctl`, `sysfs`,
//!   `ustat`): no current program needs them; `_sysctl` writes kernel
//!   parameters on kernels before 5.5;
//! - `personality` with anything but Docker's five values (Linux, 32-bit
//!   Linux, UNAME26, both, the query): `ADDR_NO_RANDOMIZE` would turn off
//!   ASLR for what the caller execs next, `READ_IMPLIES_EXEC` makes data
//!   executable;
//! - device nodes (`mknod`, `mknodat` of a block or character device):
//!   a node for the host's disk or `/dev/mem`; FIFOs, sockets and regular
//!   files stay allowed;
//! - set-id bits (`chmod`, `fchmod`, `fchmodat`, `fchmodat2` to a mode
//!   with `S_ISUID` or `S_ISGID`; `open`, `openat`, `creat`, `mknod`,
//!   `mknodat` creating with one): a file the sandbox writes in a share
//!   belongs to the host's user, root's when boxdesk runs as root (its
//!   shares are id-mapped), so a setuid bit there would be a setuid-root
//!   program on the host;
//! - `io_uring_setup`, `io_uring_enter`, `io_uring_register`: io_uring
//!   runs opens and other calls without a system call this filter sees
//!   (Docker refuses it too);
//! - terminal input (`ioctl` `TIOCSTI`): push keystrokes into a terminal,
//!   run by the user's shell once boxdesk exits;
//! - sockets (`socket` of `AF_VSOCK`, `AF_ALG`): vsock is not network
//!   namespaced, so it reaches the hypervisor (CID 2) and local VMs
//!   whatever `--net` says; AF_ALG is kernel crypto no sandbox needs.
//!
//! Left out on purpose: `create_module`, `get_kernel_syms` and
//! `query_module` (gone since Linux 2.6: the kernel answers `ENOSYS`), the
//! 32-bit-only `stime`/`clock_settime64` (caught by the architecture
//! check), `sethostname`/`setdomainname` (the sandbox has its own UTS
//! namespace), and Docker's NUMA calls (`mbind`, `set_mempolicy`, …: no
//! way out, and real programs use them).
//!
//! This module owns the policy and the bytes of the programs. It must never
//! install a filter itself outside its tests (bwrap does), and never depend
//! on libseccomp.

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// Why the programs cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The host's architecture has no table here.
    #[error("the namespace backend supports x86_64 and aarch64 hosts, not {0}")]
    UnsupportedArch(&'static str),
    /// seccompiler refused one rule: a bug in this module's tables.
    #[error("cannot compile the seccomp rule for {name}")]
    Rule {
        /// The system call (`SYS_name`).
        name: &'static str,
        /// What seccompiler said.
        #[source]
        source: seccompiler::BackendError,
    },
    /// seccompiler refused a whole filter: a bug in this module's tables.
    #[error("cannot compile the seccomp filter")]
    Compile(#[from] seccompiler::BackendError),
    /// More programs than the sandbox has descriptors set aside for.
    #[error("{0} seccomp programs are more than a sandbox takes")]
    TooMany(usize),
}

/// When a listed system call is refused. Arguments are compared on their
/// low 32 bits, all that the kernel reads of every one used here.
#[derive(Debug, Clone, Copy)]
enum When {
    /// Whatever the arguments.
    Always,
    /// Argument `.0` has any bit of `.1` set.
    AnyBit(u8, u32),
    /// Argument `.0` is one of `.1`.
    OneOf(u8, &'static [u32]),
    /// Argument `.0`, masked with `.1`, is one of `.2`.
    Masked(u8, u32, &'static [u32]),
    /// Argument `.0` is none of `.1`.
    NoneOf(u8, &'static [u32]),
}

/// One refused system call.
#[derive(Debug, Clone, Copy)]
struct Deny {
    name: &'static str,
    nr: libc::c_long,
    when: When,
}

/// `deny!(SYS_name)` or `deny!(SYS_name, when)`: a [`Deny`] numbered by
/// [`sys`] for the target.
macro_rules! deny {
    ($nr:ident) => {
        deny!($nr, When::Always)
    };
    ($nr:ident, $when:expr) => {
        Deny {
            name: stringify!($nr),
            nr: sys::$nr,
            when: $when,
        }
    };
}

/// System call numbers for the target: libc's, plus the few it lacks.
mod sys {
    pub use libc::*;

    /// `open_tree_attr` (Linux 6.15), not in libc yet: 467 on every
    /// architecture (numbers from 424 on are shared).
    #[allow(non_upper_case_globals)]
    pub const SYS_open_tree_attr: c_long = 467;
    /// `fchmodat2` (Linux 6.6): 452 on every architecture.
    #[allow(non_upper_case_globals)]
    pub const SYS_fchmodat2: c_long = 452;
    /// asm-generic's `kexec_file_load`, which libc's musl aarch64 table
    /// lacks.
    #[cfg(target_arch = "aarch64")]
    #[allow(non_upper_case_globals)]
    pub const SYS_kexec_file_load: c_long = 294;
}

/// `clone` flags that make a new namespace (`CLONE_NEWTIME` is not one
/// `clone` accepts: its bit is part of the exit signal there).
const CLONE_NAMESPACES: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
/// `unshare` flags that make a new namespace.
const UNSHARE_NAMESPACES: u32 = CLONE_NAMESPACES | libc::CLONE_NEWTIME as u32;
/// `personality` values Docker allows: `PER_LINUX`, `PER_LINUX32`,
/// `UNAME26`, `UNAME26 | PER_LINUX32`, and `0xffffffff` (query only).
const PERSONALITIES: &[u32] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];
/// The file types of device nodes.
const DEVICE_NODES: &[u32] = &[libc::S_IFBLK, libc::S_IFCHR];
/// The set-id mode bits.
const SETID: u32 = libc::S_ISUID | libc::S_ISGID;
/// `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Every refused call of every architecture (see the module doc).
const COMMON: &[Deny] = &[
    // Namespaces and mounts.
    deny!(SYS_clone, When::AnyBit(0, CLONE_NAMESPACES)),
    deny!(SYS_unshare, When::AnyBit(0, UNSHARE_NAMESPACES)),
    deny!(SYS_setns),
    deny!(SYS_mount),
    deny!(SYS_umount2),
    deny!(SYS_pivot_root),
    deny!(SYS_chroot),
    deny!(SYS_open_tree),
    deny!(SYS_open_tree_attr),
    deny!(SYS_move_mount),
    deny!(SYS_fsopen),
    deny!(SYS_fsconfig),
    deny!(SYS_fsmount),
    deny!(SYS_fspick),
    deny!(SYS_mount_setattr),
    // Kernel code.
    deny!(SYS_kexec_load),
    deny!(SYS_kexec_file_load),
    deny!(SYS_init_module),
    deny!(SYS_finit_module),
    deny!(SYS_delete_module),
    // Other processes.
    deny!(SYS_ptrace),
    deny!(SYS_process_vm_readv),
    deny!(SYS_process_vm_writev),
    deny!(SYS_pidfd_getfd),
    deny!(SYS_process_madvise),
    deny!(SYS_kcmp),
    // Seeing past the sandbox.
    deny!(SYS_fanotify_init),
    deny!(SYS_bpf),
    deny!(SYS_perf_event_open),
    deny!(SYS_syslog),
    deny!(SYS_lookup_dcookie),
    // Exploit aids.
    deny!(SYS_userfaultfd),
    // The clock.
    deny!(SYS_settimeofday),
    deny!(SYS_clock_settime),
    deny!(SYS_adjtimex),
    deny!(SYS_clock_adjtime),
    // Host administration.
    deny!(SYS_swapon),
    deny!(SYS_swapoff),
    deny!(SYS_acct),
    deny!(SYS_reboot),
    deny!(SYS_quotactl),
    deny!(SYS_quotactl_fd),
    deny!(SYS_vhangup),
    // Keyrings.
    deny!(SYS_keyctl),
    deny!(SYS_add_key),
    deny!(SYS_request_key),
    // File handles.
    deny!(SYS_name_to_handle_at),
    deny!(SYS_open_by_handle_at),
    // Obsolete.
    deny!(SYS_nfsservctl),
    // Personality, device nodes, terminal input, sockets.
    deny!(SYS_personality, When::NoneOf(0, PERSONALITIES)),
    deny!(SYS_mknodat, When::Masked(2, libc::S_IFMT, DEVICE_NODES)),
    // Set-id bits, and io_uring, which would open files past them.
    deny!(SYS_mknodat, When::AnyBit(2, SETID)),
    deny!(SYS_fchmod, When::AnyBit(1, SETID)),
    deny!(SYS_fchmodat, When::AnyBit(2, SETID)),
    deny!(SYS_fchmodat2, When::AnyBit(2, SETID)),
    deny!(SYS_openat, When::AnyBit(3, SETID)),
    deny!(SYS_io_uring_setup),
    deny!(SYS_io_uring_enter),
    deny!(SYS_io_uring_register),
    deny!(SYS_ioctl, When::OneOf(1, &[libc::TIOCSTI as u32])),
    deny!(
        SYS_socket,
        When::OneOf(0, &[libc::AF_VSOCK as u32, libc::AF_ALG as u32])
    ),
];

/// Refused calls that only x86_64 has.
#[cfg(target_arch = "x86_64")]
const ARCH_ONLY: &[Deny] = &[
    deny!(SYS_mknod, When::Masked(1, libc::S_IFMT, DEVICE_NODES)),
    deny!(SYS_mknod, When::AnyBit(1, SETID)),
    deny!(SYS_chmod, When::AnyBit(1, SETID)),
    deny!(SYS_open, When::AnyBit(2, SETID)),
    deny!(SYS_creat, When::AnyBit(1, SETID)),
    deny!(SYS_iopl),
    deny!(SYS_ioperm),
    deny!(SYS_modify_ldt),
    deny!(SYS_uselib),
    deny!(SYS__sysctl),
    deny!(SYS_sysfs),
    deny!(SYS_ustat),
];
/// Refused calls that only aarch64 has: none.
#[cfg(not(target_arch = "x86_64"))]
const ARCH_ONLY: &[Deny] = &[];

/// The calls the second program answers with `ENOSYS` (see the module
/// doc): what libc then falls back to is what the deny program checks.
pub const ENOSYS_CALLS: &[libc::c_long] = &[sys::SYS_clone3, sys::SYS_openat2];

/// This host's architecture as seccompiler names it.
pub fn target_arch() -> Result<TargetArch, SeccompError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        other => Err(SeccompError::UnsupportedArch(other)),
    }
}

/// The programs bwrap installs, in order (see the module doc), each as the
/// `struct sock_filter[]` bytes `--add-seccomp-fd` reads.
pub fn programs() -> Result<Vec<Vec<u8>>, SeccompError> {
    Ok(build(libc::EPERM as u32)?
        .iter()
        .map(|p| to_bytes(p))
        .collect())
}

/// The programs, with `errno` as the deny program's answer (tests use a
/// value no kernel path returns, to tell the filter's answer apart).
fn build(errno: u32) -> Result<Vec<BpfProgram>, SeccompError> {
    let arch = target_arch()?;
    let mut out = vec![
        deny_program(arch, errno)?,
        SeccompFilter::new(
            ENOSYS_CALLS.iter().map(|&nr| (nr, vec![])).collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )?
        .try_into()?,
    ];
    if cfg!(target_arch = "x86_64") {
        out.push(x32_program(errno));
    }
    Ok(out)
}

/// The deny-list as one seccompiler filter: listed calls answer `errno`,
/// the rest are allowed, another architecture is killed.
fn deny_program(arch: TargetArch, errno: u32) -> Result<BpfProgram, SeccompError> {
    let mut rules = std::collections::BTreeMap::new();
    for d in COMMON.iter().chain(ARCH_ONLY) {
        let r = rules_for(d.when).map_err(|source| SeccompError::Rule {
            name: d.name,
            source,
        })?;
        // Entries for one call are or-ed (none of them is `Always`).
        rules.entry(d.nr).or_insert_with(Vec::new).extend(r);
    }
    Ok(SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        arch,
    )?
    .try_into()?)
}

/// seccompiler's rules (or-ed; conditions in one rule and-ed) for `when`.
/// No rules at all means "always".
fn rules_for(when: When) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let cond = |arg, op, value: u32| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, u64::from(value))
    };
    let rules = match when {
        When::Always => Vec::new(),
        When::AnyBit(arg, mask) => (0..32)
            .map(|b| 1u32 << b)
            .filter(|bit| mask & bit != 0)
            .map(|bit| SeccompRule::new(vec![cond(arg, SeccompCmpOp::MaskedEq(bit.into()), bit)?]))
            .collect::<Result<_, _>>()?,
        When::OneOf(arg, values) => values
            .iter()
            .map(|&v| SeccompRule::new(vec![cond(arg, SeccompCmpOp::Eq, v)?]))
            .collect::<Result<_, _>>()?,
        When::Masked(arg, mask, values) => values
            .iter()
            .map(|&v| SeccompRule::new(vec![cond(arg, SeccompCmpOp::MaskedEq(mask.into()), v)?]))
            .collect::<Result<_, _>>()?,
        When::NoneOf(arg, values) => vec![SeccompRule::new(
            values
                .iter()
                .map(|&v| cond(arg, SeccompCmpOp::Ne, v))
                .collect::<Result<_, _>>()?,
        )?],
    };
    Ok(rules)
}

/// x86_64's x32 ABI refused: `nr >= __X32_SYSCALL_BIT` answers `errno`.
/// Another architecture's calls are left to the deny program, which kills
/// them (the strictest answer of all installed filters wins).
fn x32_program(errno: u32) -> BpfProgram {
    use libc::{BPF_ABS, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let insn = |code: u32, jt, jf, k| sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    vec![
        // offsetof(struct seccomp_data, nr)
        insn(BPF_LD | BPF_W | BPF_ABS, 0, 0, 0),
        insn(BPF_JMP | BPF_JGE | BPF_K, 0, 1, X32_SYSCALL_BIT),
        insn(BPF_RET | BPF_K, 0, 0, libc::SECCOMP_RET_ERRNO | errno),
        insn(BPF_RET | BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// A program as the `struct sock_filter[]` bytes (native byte order)
/// bwrap's `--add-seccomp-fd` reads.
pub fn to_bytes(prog: &[sock_filter]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * 8);
    for i in prog {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// An errno no kernel path returns: the deny program's answer in
    /// [`build`]`(MARKER)`, so a test tells the filter from the kernel.
    const MARKER: u32 = 4000;

    /// How one probe must come out.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Want {
        /// The deny program answers (its errno).
        Denied,
        /// The second program answers `ENOSYS` (clone3, openat2).
        Enosys,
        /// The kernel answers, success or not.
        Kernel,
        /// The kernel answers with success.
        Succeeds,
    }

    /// One system call the child makes, with arguments chosen so that, were
    /// the filter to let it through, nothing changes on the host (bad
    /// pointers, bad descriptors, bad flags).
    #[derive(Debug, Clone, Copy)]
    struct Probe {
        name: &'static str,
        nr: libc::c_long,
        args: [libc::c_long; 6],
        want: Want,
    }

    const fn p(name: &'static str, nr: libc::c_long, args: [libc::c_long; 6], want: Want) -> Probe {
        Probe {
            name,
            nr,
            args,
            want,
        }
    }

    /// An address nothing is mapped at: the kernel answers `EFAULT`.
    const BAD: libc::c_long = 1;
    const NS_FLAGS: [libc::c_int; 7] = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ];

    /// Every probe; `fifo` is a path (as a C string's address) where the
    /// child may make a FIFO.
    fn probes(fifo: libc::c_long) -> Vec<Probe> {
        use libc::*;
        use Want::*;
        let at = AT_FDCWD as c_long;
        let mut v = vec![
            // Namespaces and mounts (each namespace flag: below); clone
            // and unshare without one reach the kernel.
            p("setns", SYS_setns, [-1, 0, 0, 0, 0, 0], Denied),
            p("mount", SYS_mount, [0, 0, 0, 0, 0, 0], Denied),
            p("umount2", SYS_umount2, [0, 0, 0, 0, 0, 0], Denied),
            p("pivot_root", SYS_pivot_root, [0, 0, 0, 0, 0, 0], Denied),
            p("chroot", SYS_chroot, [0, 0, 0, 0, 0, 0], Denied),
            p("open_tree", SYS_open_tree, [-1, 0, 0, 0, 0, 0], Denied),
            p(
                "open_tree_attr",
                sys::SYS_open_tree_attr,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p("move_mount", SYS_move_mount, [-1, 0, -1, 0, 0, 0], Denied),
            p("fsopen", SYS_fsopen, [0, 0, 0, 0, 0, 0], Denied),
            p("fsconfig", SYS_fsconfig, [-1, 0, 0, 0, 0, 0], Denied),
            p("fsmount", SYS_fsmount, [-1, 0, 0, 0, 0, 0], Denied),
            p("fspick", SYS_fspick, [-1, 0, 0, 0, 0, 0], Denied),
            p(
                "mount_setattr",
                SYS_mount_setattr,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "clone",
                SYS_clone,
                [
                    CLONE_FILES as c_long | CLONE_THREAD as c_long,
                    0,
                    0,
                    0,
                    0,
                    0,
                ],
                Kernel,
            ),
            p(
                "unshare",
                SYS_unshare,
                [CLONE_FILES as c_long, 0, 0, 0, 0, 0],
                Succeeds,
            ),
            p(
                "unshare",
                SYS_unshare,
                [
                    CLONE_NEWTIME as c_long | CLONE_VFORK as c_long,
                    0,
                    0,
                    0,
                    0,
                    0,
                ],
                Denied,
            ),
            // Kernel code.
            p("kexec_load", SYS_kexec_load, [0, 0, 0, -1, 0, 0], Denied),
            p(
                "kexec_file_load",
                sys::SYS_kexec_file_load,
                [-1, -1, 0, 0, -1, 0],
                Denied,
            ),
            p("init_module", SYS_init_module, [0, 0, 0, 0, 0, 0], Denied),
            p(
                "finit_module",
                SYS_finit_module,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "delete_module",
                SYS_delete_module,
                [0, 0, 0, 0, 0, 0],
                Denied,
            ),
            // Other processes.
            p(
                "ptrace",
                SYS_ptrace,
                [PTRACE_PEEKDATA as c_long, -1, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "process_vm_readv",
                SYS_process_vm_readv,
                [0, 0, 0, 0, 0, -1],
                Denied,
            ),
            p(
                "process_vm_writev",
                SYS_process_vm_writev,
                [0, 0, 0, 0, 0, -1],
                Denied,
            ),
            p("pidfd_getfd", SYS_pidfd_getfd, [-1, 0, 0, 0, 0, 0], Denied),
            p(
                "process_madvise",
                SYS_process_madvise,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p("kcmp", SYS_kcmp, [0, 0, 1000, 0, 0, 0], Denied),
            // Seeing past the sandbox, exploit aids.
            p(
                "fanotify_init",
                SYS_fanotify_init,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p("bpf", SYS_bpf, [-1, 0, 0, 0, 0, 0], Denied),
            p(
                "perf_event_open",
                SYS_perf_event_open,
                [BAD, 0, -1, -1, 0, 0],
                Denied,
            ),
            p("syslog", SYS_syslog, [-1, 0, 0, 0, 0, 0], Denied),
            p(
                "lookup_dcookie",
                SYS_lookup_dcookie,
                [0, 0, 0, 0, 0, 0],
                Denied,
            ),
            p("userfaultfd", SYS_userfaultfd, [-1, 0, 0, 0, 0, 0], Denied),
            // The clock.
            p(
                "settimeofday",
                SYS_settimeofday,
                [BAD, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "clock_settime",
                SYS_clock_settime,
                [CLOCK_REALTIME as c_long, BAD, 0, 0, 0, 0],
                Denied,
            ),
            p("adjtimex", SYS_adjtimex, [BAD, 0, 0, 0, 0, 0], Denied),
            p(
                "clock_adjtime",
                SYS_clock_adjtime,
                [CLOCK_REALTIME as c_long, BAD, 0, 0, 0, 0],
                Denied,
            ),
            // Host administration (vhangup: the child has no terminal).
            p("swapon", SYS_swapon, [BAD, 0, 0, 0, 0, 0], Denied),
            p("swapoff", SYS_swapoff, [BAD, 0, 0, 0, 0, 0], Denied),
            p("acct", SYS_acct, [BAD, 0, 0, 0, 0, 0], Denied),
            p("reboot", SYS_reboot, [0, 0, 0, 0, 0, 0], Denied),
            p("quotactl", SYS_quotactl, [0, BAD, 0, 0, 0, 0], Denied),
            p("quotactl_fd", SYS_quotactl_fd, [-1, 0, 0, 0, 0, 0], Denied),
            p("vhangup", SYS_vhangup, [0, 0, 0, 0, 0, 0], Denied),
            // Keyrings.
            p("keyctl", SYS_keyctl, [-1, 0, 0, 0, 0, 0], Denied),
            p("add_key", SYS_add_key, [0, 0, 0, 0, 0, 0], Denied),
            p("request_key", SYS_request_key, [0, 0, 0, 0, 0, 0], Denied),
            // File handles, obsolete calls.
            p(
                "name_to_handle_at",
                SYS_name_to_handle_at,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "open_by_handle_at",
                SYS_open_by_handle_at,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p("nfsservctl", SYS_nfsservctl, [0, 0, 0, 0, 0, 0], Denied),
            // Personality: only Docker's values, and the query.
            p(
                "personality",
                SYS_personality,
                [ADDR_NO_RANDOMIZE as c_long, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "personality",
                SYS_personality,
                [READ_IMPLIES_EXEC as c_long, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "personality",
                SYS_personality,
                [0xffff_ffff, 0, 0, 0, 0, 0],
                Succeeds,
            ),
            p("personality", SYS_personality, [0, 0, 0, 0, 0, 0], Succeeds),
            // Device nodes: block and character refused, a FIFO made, a
            // regular file and a socket reach the kernel.
            p(
                "mknodat",
                SYS_mknodat,
                [at, 0, (S_IFBLK | 0o600) as c_long, 0x700, 0, 0],
                Denied,
            ),
            p(
                "mknodat",
                SYS_mknodat,
                [at, 0, (S_IFCHR | 0o600) as c_long, 0x103, 0, 0],
                Denied,
            ),
            p(
                "mknodat",
                SYS_mknodat,
                [at, fifo, (S_IFIFO | 0o600) as c_long, 0, 0, 0],
                Succeeds,
            ),
            p(
                "mknodat",
                SYS_mknodat,
                [at, 0, (S_IFREG | 0o600) as c_long, 0, 0, 0],
                Kernel,
            ),
            p(
                "mknodat",
                SYS_mknodat,
                [at, 0, (S_IFSOCK | 0o600) as c_long, 0, 0, 0],
                Kernel,
            ),
            // Set-id bits refused; the same calls without them reach the
            // kernel (bad descriptors and addresses: nothing changes).
            p(
                "mknodat",
                SYS_mknodat,
                [at, 0, (S_IFREG | 0o4755) as c_long, 0, 0, 0],
                Denied,
            ),
            p("fchmod", SYS_fchmod, [-1, 0o4755, 0, 0, 0, 0], Denied),
            p("fchmod", SYS_fchmod, [-1, 0o2755, 0, 0, 0, 0], Denied),
            p("fchmod", SYS_fchmod, [-1, 0o755, 0, 0, 0, 0], Kernel),
            p("fchmodat", SYS_fchmodat, [at, BAD, 0o4755, 0, 0, 0], Denied),
            p("fchmodat", SYS_fchmodat, [at, BAD, 0o755, 0, 0, 0], Kernel),
            p(
                "fchmodat2",
                sys::SYS_fchmodat2,
                [at, BAD, 0o6755, 0, 0, 0],
                Denied,
            ),
            p(
                "fchmodat2",
                sys::SYS_fchmodat2,
                [at, BAD, 0o755, 0, 0, 0],
                Kernel,
            ),
            p(
                "openat",
                SYS_openat,
                [at, BAD, O_CREAT as c_long, 0o4755, 0, 0],
                Denied,
            ),
            p(
                "openat",
                SYS_openat,
                [at, BAD, O_CREAT as c_long, 0o644, 0, 0],
                Kernel,
            ),
            p(
                "io_uring_setup",
                SYS_io_uring_setup,
                [1, BAD, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "io_uring_enter",
                SYS_io_uring_enter,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "io_uring_register",
                SYS_io_uring_register,
                [-1, 0, 0, 0, 0, 0],
                Denied,
            ),
            // Terminal input.
            p(
                "ioctl",
                SYS_ioctl,
                [-1, TIOCSTI as c_long, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "ioctl",
                SYS_ioctl,
                [-1, TCGETS as c_long, 0, 0, 0, 0],
                Kernel,
            ),
            // Sockets.
            p(
                "socket",
                SYS_socket,
                [AF_VSOCK as c_long, SOCK_STREAM as c_long, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "socket",
                SYS_socket,
                [AF_ALG as c_long, SOCK_SEQPACKET as c_long, 0, 0, 0, 0],
                Denied,
            ),
            p(
                "socket",
                SYS_socket,
                [AF_UNIX as c_long, SOCK_STREAM as c_long, 0, 0, 0, 0],
                Succeeds,
            ),
            // clone3, and what must keep working.
            p("clone3", SYS_clone3, [0, 0, 0, 0, 0, 0], Enosys),
            // openat2 whatever its open_how says (here: a bad address).
            p(
                "openat2",
                sys::SYS_openat2,
                [at, BAD, BAD, 24, 0, 0],
                Enosys,
            ),
            p("getpid", SYS_getpid, [0; 6], Succeeds),
        ];
        // With CLONE_THREAD but not CLONE_SIGHAND (clone), or CLONE_VFORK
        // (unshare), the kernel would answer EINVAL: nothing is created.
        for flag in NS_FLAGS {
            let f = flag as c_long;
            let thread = CLONE_THREAD as c_long;
            v.push(p("clone", SYS_clone, [f | thread, 0, 0, 0, 0, 0], Denied));
            v.push(p(
                "unshare",
                SYS_unshare,
                [f | CLONE_VFORK as c_long, 0, 0, 0, 0, 0],
                Denied,
            ));
        }
        #[cfg(target_arch = "x86_64")]
        v.extend([
            p(
                "mknod",
                SYS_mknod,
                [0, (S_IFBLK | 0o600) as c_long, 0x700, 0, 0, 0],
                Denied,
            ),
            p(
                "mknod",
                SYS_mknod,
                [0, (S_IFCHR | 0o600) as c_long, 0x103, 0, 0, 0],
                Denied,
            ),
            p(
                "mknod",
                SYS_mknod,
                [0, (S_IFIFO | 0o600) as c_long, 0, 0, 0, 0],
                Kernel,
            ),
            p(
                "mknod",
                SYS_mknod,
                [0, (S_IFREG | 0o4755) as c_long, 0, 0, 0, 0],
                Denied,
            ),
            p("chmod", SYS_chmod, [BAD, 0o4755, 0, 0, 0, 0], Denied),
            p("chmod", SYS_chmod, [BAD, 0o755, 0, 0, 0, 0], Kernel),
            p(
                "open",
                SYS_open,
                [BAD, O_CREAT as c_long, 0o2755, 0, 0, 0],
                Denied,
            ),
            p(
                "open",
                SYS_open,
                [BAD, O_CREAT as c_long, 0o644, 0, 0, 0],
                Kernel,
            ),
            p("creat", SYS_creat, [BAD, 0o4755, 0, 0, 0, 0], Denied),
            p("creat", SYS_creat, [BAD, 0o755, 0, 0, 0, 0], Kernel),
            p("iopl", SYS_iopl, [4, 0, 0, 0, 0, 0], Denied),
            p("ioperm", SYS_ioperm, [0x1_0000, 1, 1, 0, 0, 0], Denied),
            // A write of one LDT entry from a bad address.
            p("modify_ldt", SYS_modify_ldt, [1, BAD, 16, 0, 0, 0], Denied),
            p("uselib", SYS_uselib, [0, 0, 0, 0, 0, 0], Denied),
            p("_sysctl", SYS__sysctl, [0, 0, 0, 0, 0, 0], Denied),
            p("sysfs", SYS_sysfs, [0, 0, 0, 0, 0, 0], Denied),
            p("ustat", SYS_ustat, [0, 0, 0, 0, 0, 0], Denied),
            // An x32 getpid.
            p(
                "x32 getpid",
                X32_SYSCALL_BIT as c_long | SYS_getpid,
                [0; 6],
                Denied,
            ),
        ]);
        v
    }

    /// Forks a child that does what bwrap does before exec (no_new_privs,
    /// then each program of `programs` in order, in a new session so it
    /// has no terminal), runs `body` on `slots` zeroed values and sends
    /// them back. `Err(signal)` if the child was killed.
    ///
    /// The test harness is multi-threaded: the child must not allocate (the
    /// allocator's lock may be held by a thread that is not there), so
    /// `body` makes raw calls on memory allocated before the fork.
    fn in_filtered_child(
        programs: &[Vec<u8>],
        slots: usize,
        body: impl Fn(&mut [i64]),
    ) -> Result<Vec<i64>, i32> {
        let fprogs: Vec<libc::sock_fprog> = programs
            .iter()
            .map(|p| libc::sock_fprog {
                len: u16::try_from(p.len() / 8).unwrap(),
                // The kernel copies the bytes; nothing here reads them as
                // `sock_filter`, so their alignment does not matter.
                filter: p.as_ptr() as *mut libc::sock_filter,
            })
            .collect();
        let mut out = vec![0i64; slots];
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: pipe2 returned two new descriptors that only we own.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: the child below makes only raw system calls on memory
        // allocated before the fork and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: raw calls on valid pointers (fprogs, out) that this
            // process owns; _exit never returns.
            unsafe {
                libc::setsid();
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    libc::_exit(120);
                }
                for f in &fprogs {
                    let f: *const libc::sock_fprog = f;
                    if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, f) != 0 {
                        libc::_exit(121);
                    }
                }
                body(&mut out);
                let len = out.len() * 8;
                let wrote = libc::write(write.as_raw_fd(), out.as_ptr().cast(), len);
                libc::_exit(if wrote == len as isize { 0 } else { 122 });
            }
        }
        drop(write);
        let mut bytes = Vec::new();
        File::from(read).read_to_end(&mut bytes).unwrap();
        let mut status = 0;
        // SAFETY: pid is our child; status is a valid int.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        if libc::WIFSIGNALED(status) {
            return Err(libc::WTERMSIG(status));
        }
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child could not install the filters"
        );
        Ok(bytes
            .chunks_exact(8)
            .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
            .collect())
    }

    /// Runs every probe under `programs`; each result is the call's return
    /// value or `-errno`.
    fn run_probes(programs: &[Vec<u8>], probes: &[Probe]) -> Vec<i64> {
        in_filtered_child(programs, probes.len(), |out| {
            for (slot, pr) in out.iter_mut().zip(probes) {
                let a = pr.args;
                // SAFETY: every probe's pointers are null, unmapped or
                // point at memory allocated before the fork.
                let r = unsafe { libc::syscall(pr.nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
                // Error::last_os_error reads errno without allocating.
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                *slot = if r == -1 { -i64::from(errno) } else { r };
            }
        })
        .expect("the child was killed")
    }

    fn fifo_path(dir: &tempfile::TempDir) -> std::ffi::CString {
        let p = dir.path().join("fifo");
        std::ffi::CString::new(p.into_os_string().into_encoded_bytes()).unwrap()
    }

    fn check(results: &[i64], probes: &[Probe], denied: i64) {
        let mut wrong = Vec::new();
        for (r, pr) in results.iter().zip(probes) {
            let ok = match pr.want {
                Want::Denied => *r == -denied,
                Want::Enosys => *r == -i64::from(libc::ENOSYS),
                Want::Kernel => *r != -denied && *r != -i64::from(MARKER),
                Want::Succeeds => *r >= 0,
            };
            if !ok {
                wrong.push(format!(
                    "{}{:x?} -> {r} (want {:?})",
                    pr.name, pr.args, pr.want
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn every_listed_call_is_answered_by_the_filter_and_the_rest_by_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_path(&dir);
        let probes = probes(fifo.as_ptr() as libc::c_long);
        let programs: Vec<Vec<u8>> = build(MARKER).unwrap().iter().map(|p| to_bytes(p)).collect();
        check(&run_probes(&programs, &probes), &probes, i64::from(MARKER));
    }

    #[test]
    fn the_shipped_programs_answer_eperm_and_enosys_and_leave_ordinary_calls_working() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = fifo_path(&dir);
        let probes = probes(fifo.as_ptr() as libc::c_long);
        let results = run_probes(&programs().unwrap(), &probes);
        check(&results, &probes, i64::from(libc::EPERM));
        let meta = std::fs::metadata(dir.path().join("fifo")).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(meta.file_type().is_fifo());
    }

    #[test]
    fn every_listed_call_has_a_probe_that_shows_it_refused() {
        let probes = probes(0);
        for d in COMMON.iter().chain(ARCH_ONLY) {
            let name = d.name.trim_start_matches("SYS_");
            assert!(
                probes
                    .iter()
                    .any(|p| p.name == name && p.nr == d.nr && p.want == Want::Denied),
                "no probe for {name}"
            );
        }
    }

    #[test]
    fn a_plain_fork_still_works_under_the_filter() {
        let out = in_filtered_child(&programs().unwrap(), 2, |out| {
            // SAFETY: fork-like clone (no CLONE_VM): the new child only
            // calls _exit; the parent waits for it.
            unsafe {
                let pid = libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0);
                if pid == 0 {
                    libc::_exit(7);
                }
                out[0] = pid;
                let mut status = 0;
                if pid > 0
                    && libc::waitpid(pid as libc::pid_t, &mut status, 0) == pid as libc::pid_t
                {
                    out[1] = i64::from(libc::WEXITSTATUS(status));
                }
            }
        })
        .unwrap();
        assert!(out[0] > 0, "clone(SIGCHLD) -> {}", out[0]);
        assert_eq!(out[1], 7);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn a_32_bit_system_call_kills_the_process() {
        let body = |_: &mut [i64]| {
            // SAFETY: i386 getpid (20) through the compat entry; it touches
            // no memory, and the clobbered registers are declared.
            unsafe {
                std::arch::asm!(
                    "int 0x80",
                    inout("eax") 20u32 => _,
                    out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                    options(nostack)
                );
            }
        };
        // Without a filter: does this kernel have the 32-bit entry at all?
        match in_filtered_child(&[], 0, body) {
            Ok(_) => {}
            Err(sig) => {
                println!(
                    "skipped: int 0x80 without a filter dies of signal {sig} (no IA-32 emulation)"
                );
                return;
            }
        }
        assert_eq!(
            in_filtered_child(&programs().unwrap(), 0, body),
            Err(libc::SIGSYS)
        );
    }

    #[test]
    fn each_program_is_whole_sock_filter_instructions_within_the_kernel_limit() {
        let programs = programs().unwrap();
        assert_eq!(
            programs.len(),
            if cfg!(target_arch = "x86_64") { 3 } else { 2 }
        );
        for (i, p) in programs.iter().enumerate() {
            assert_eq!(p.len() % 8, 0, "program {i}");
            let n = p.len() / 8;
            assert!(n > 0 && n <= 4096, "program {i}: {n} instructions");
            println!("program {i}: {n} instructions");
        }
    }

    #[test]
    fn the_numbers_libc_lacks_match_the_kernel() {
        #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
        assert_eq!(sys::SYS_kexec_file_load, 320);
        #[cfg(all(target_arch = "aarch64", target_env = "gnu"))]
        assert_eq!(sys::SYS_kexec_file_load, libc::SYS_kexec_file_load);
        // open_tree_attr follows open_tree's neighbours in the shared table.
        assert_eq!(libc::SYS_open_tree, 428);
        assert_eq!(sys::SYS_open_tree_attr, 467);
    }

    /// Nanoseconds per call of `nr(args)` over many calls, in a child under
    /// `programs`, and what the last call returned.
    fn ns_per_call(programs: &[Vec<u8>], nr: libc::c_long, args: [libc::c_long; 3]) -> (f64, i64) {
        const N: i64 = 200_000;
        let out = in_filtered_child(programs, 2, |out| {
            let start = std::time::Instant::now();
            let mut r = 0;
            for _ in 0..N {
                // SAFETY: getppid, or ioctl on a bad descriptor: no memory.
                r = unsafe { libc::syscall(nr, args[0], args[1], args[2]) };
            }
            out[0] = start.elapsed().as_nanos() as i64;
            out[1] = r;
        })
        .unwrap();
        (out[0] as f64 / N as f64, out[1])
    }

    /// The figures of the report: run with `--nocapture`. getppid's answer
    /// depends on no argument, so the kernel's seccomp action cache allows
    /// it without running the filters; an `ioctl` runs all of them.
    #[test]
    fn getppid_and_ioctl_still_work_under_the_filter_and_their_cost_is_printed() {
        let programs = programs().unwrap();
        let tcgets = [-1, libc::TCGETS as libc::c_long, 0];
        for (what, nr, args) in [
            ("getppid", libc::SYS_getppid, [0; 3]),
            ("ioctl(-1, TCGETS)", libc::SYS_ioctl, tcgets),
        ] {
            // Best of a few runs: the machine is shared.
            let best = |p: &[Vec<u8>]| {
                let runs: Vec<(f64, i64)> = (0..5).map(|_| ns_per_call(p, nr, args)).collect();
                let r = runs[0].1;
                assert!(runs.iter().all(|run| run.1 == r), "{what}: {runs:?}");
                (runs.iter().map(|run| run.0).fold(f64::MAX, f64::min), r)
            };
            let ((bare, r0), (filtered, r1)) = (best(&[]), best(&programs));
            assert_eq!(r0, r1, "{what} answers differently under the filter");
            assert!(
                if nr == libc::SYS_getppid {
                    r1 > 0
                } else {
                    r1 == -1
                },
                "{what} -> {r1}"
            );
            println!("{what}: {bare:.0} ns without a filter, {filtered:.0} ns under it");
        }
    }
}
