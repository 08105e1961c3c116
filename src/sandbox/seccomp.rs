//! The namespace sandbox's seccomp filter, built as a classic BPF program
//! by hand (no libseccomp) and handed to `bwrap --seccomp FD`.
//!
//! The program, in order:
//!
//! 1. the architecture must be the host's (`AUDIT_ARCH_X86_64` or
//!    `AUDIT_ARCH_AARCH64`), otherwise the process is killed: a 32-bit
//!    entry point (`int 0x80`, compat) would use other syscall numbers and
//!    walk past every check below;
//! 2. x86_64 only: x32 system calls (number bit 30 set) are refused;
//! 3. kexec, kernel modules, `ptrace` and `process_vm_*`, and the ways out
//!    of a mount namespace (`unshare`, `setns`, `mount`, `umount2`,
//!    `pivot_root`, `chroot`, the new mount API, `open_by_handle_at`) fail
//!    with `EPERM`;
//! 4. `clone` with any namespace flag fails with `EPERM`; `clone3`, whose
//!    flags sit in memory a filter cannot read, fails with `ENOSYS` so libc
//!    falls back to `clone` (what Flatpak and Docker do);
//! 5. everything else is allowed.
//!
//! This module owns the program's bytes and their meaning. It must never
//! install a filter itself (bwrap does, after `PR_SET_NO_NEW_PRIVS`, just
//! before it execs the agent) and never depend on libseccomp.

/// One classic BPF instruction, `struct sock_filter`, as the kernel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// Opcode.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

// Opcodes: class | size/op | mode/source (BPF_W and BPF_K are 0).
/// `BPF_LD | BPF_W | BPF_ABS`.
const BPF_LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const BPF_JMP_JGE_K: u16 = 0x05 | 0x30;
/// `BPF_JMP | BPF_JSET | BPF_K`.
const BPF_JMP_JSET_K: u16 = 0x05 | 0x40;
/// `BPF_RET | BPF_K`.
const BPF_RET_K: u16 = 0x06;

/// `SECCOMP_RET_KILL_PROCESS`.
pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
/// `SECCOMP_RET_ERRNO` (the errno goes in the low 16 bits).
pub const RET_ERRNO: u32 = 0x0005_0000;
/// `SECCOMP_RET_ALLOW`.
pub const RET_ALLOW: u32 = 0x7fff_0000;

/// `offsetof(struct seccomp_data, nr)`.
const OFF_NR: u32 = 0;
/// `offsetof(struct seccomp_data, arch)`.
const OFF_ARCH: u32 = 4;
/// Low 32 bits of `args[0]` (both supported arches are little-endian).
const OFF_ARG0_LO: u32 = 16;

/// `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
/// CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET`.
pub const CLONE_NAMESPACE_FLAGS: u32 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;

/// An architecture the filter knows the syscall numbers of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// x86_64 (`AUDIT_ARCH_X86_64`).
    X86_64,
    /// aarch64 (`AUDIT_ARCH_AARCH64`).
    Aarch64,
}

impl Arch {
    /// The architecture this binary runs on, if the filter supports it.
    pub fn host() -> Option<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Some(Arch::X86_64),
            "aarch64" => Some(Arch::Aarch64),
            _ => None,
        }
    }

    /// The `AUDIT_ARCH_*` value the kernel puts in `seccomp_data.arch`.
    pub fn audit_arch(self) -> u32 {
        match self {
            Arch::X86_64 => 0xC000_003E,
            Arch::Aarch64 => 0xC000_00B7,
        }
    }

    fn nr(self, s: &Syscall) -> u32 {
        match self {
            Arch::X86_64 => s.x86_64,
            Arch::Aarch64 => s.aarch64,
        }
    }
}

/// A system call the filter names, with its number per architecture.
#[derive(Debug, Clone, Copy)]
pub struct Syscall {
    /// Its name, for tests and docs.
    pub name: &'static str,
    /// Its number on x86_64.
    pub x86_64: u32,
    /// Its number on aarch64 (asm-generic).
    pub aarch64: u32,
}

const fn sys(name: &'static str, x86_64: u32, aarch64: u32) -> Syscall {
    Syscall {
        name,
        x86_64,
        aarch64,
    }
}

/// System calls refused with `EPERM`.
pub const DENIED: &[Syscall] = &[
    sys("kexec_load", 246, 104),
    sys("kexec_file_load", 320, 294),
    sys("init_module", 175, 105),
    sys("finit_module", 313, 273),
    sys("delete_module", 176, 106),
    sys("ptrace", 101, 117),
    sys("process_vm_readv", 310, 270),
    sys("process_vm_writev", 311, 271),
    sys("unshare", 272, 97),
    sys("setns", 308, 268),
    sys("mount", 165, 40),
    sys("umount2", 166, 39),
    sys("pivot_root", 155, 41),
    sys("chroot", 161, 51),
    sys("open_by_handle_at", 304, 265),
    sys("open_tree", 428, 428),
    sys("move_mount", 429, 429),
    sys("fsopen", 430, 430),
    sys("fsconfig", 431, 431),
    sys("fsmount", 432, 432),
    sys("fspick", 433, 433),
    sys("mount_setattr", 442, 442),
    sys("open_tree_attr", 467, 467),
];

/// `clone`: allowed unless it asks for a namespace.
pub const CLONE: Syscall = sys("clone", 56, 220);
/// `clone3`: answered `ENOSYS` so libc falls back to `clone`.
pub const CLONE3: Syscall = sys("clone3", 435, 435);

/// Builds the filter for `arch`. The program is straight-line: every jump
/// is forward and within 255 instructions by construction.
pub fn build(arch: Arch) -> Vec<Insn> {
    let ld = |k| Insn {
        code: BPF_LD_W_ABS,
        jt: 0,
        jf: 0,
        k,
    };
    let ret = |k| Insn {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k,
    };
    // Jumps name their targets; offsets are filled in once the layout is known.
    #[derive(Clone, Copy)]
    enum To {
        Next,
        Eperm,
        Enosys,
        CheckClone,
    }
    let mut prog: Vec<(Insn, To, To)> = Vec::new();
    let jmp = |code, k, jt, jf| {
        (
            Insn {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            jt,
            jf,
        )
    };
    let plain = |i: Insn| (i, To::Next, To::Next);

    prog.push(plain(ld(OFF_ARCH)));
    // Equal: skip the kill.
    prog.push((
        Insn {
            code: BPF_JMP_JEQ_K,
            jt: 1,
            jf: 0,
            k: arch.audit_arch(),
        },
        To::Next,
        To::Next,
    ));
    prog.push(plain(ret(RET_KILL_PROCESS)));
    prog.push(plain(ld(OFF_NR)));
    if arch == Arch::X86_64 {
        prog.push(jmp(BPF_JMP_JGE_K, X32_SYSCALL_BIT, To::Eperm, To::Next));
    }
    for s in DENIED {
        prog.push(jmp(BPF_JMP_JEQ_K, arch.nr(s), To::Eperm, To::Next));
    }
    prog.push(jmp(BPF_JMP_JEQ_K, arch.nr(&CLONE3), To::Enosys, To::Next));
    prog.push(jmp(
        BPF_JMP_JEQ_K,
        arch.nr(&CLONE),
        To::CheckClone,
        To::Next,
    ));
    prog.push(plain(ret(RET_ALLOW)));
    let check_clone = prog.len();
    prog.push(plain(ld(OFF_ARG0_LO)));
    prog.push(jmp(
        BPF_JMP_JSET_K,
        CLONE_NAMESPACE_FLAGS,
        To::Eperm,
        To::Next,
    ));
    prog.push(plain(ret(RET_ALLOW)));
    let eperm = prog.len();
    prog.push(plain(ret(RET_ERRNO | libc::EPERM as u32)));
    let enosys = prog.len();
    prog.push(plain(ret(RET_ERRNO | libc::ENOSYS as u32)));

    let offset = |at: usize, to: To, keep: u8| -> u8 {
        let target = match to {
            To::Next => return keep,
            To::Eperm => eperm,
            To::Enosys => enosys,
            To::CheckClone => check_clone,
        };
        u8::try_from(target - at - 1).expect("seccomp jump over 255 instructions")
    };
    prog.iter()
        .enumerate()
        .map(|(at, &(insn, jt, jf))| Insn {
            jt: offset(at, jt, insn.jt),
            jf: offset(at, jf, insn.jf),
            ..insn
        })
        .collect()
}

/// The program as `struct sock_filter[]` bytes in native byte order, which
/// is what `bwrap --seccomp FD` reads.
pub fn to_bytes(prog: &[Insn]) -> Vec<u8> {
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

    /// A classic-BPF interpreter for the few opcodes [`build`] emits, over
    /// a `seccomp_data` of (nr, arch, args[0]).
    fn run(prog: &[Insn], nr: u32, arch: u32, arg0: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        data[16..24].copy_from_slice(&arg0.to_le_bytes());
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                BPF_JMP_JEQ_K | BPF_JMP_JGE_K | BPF_JMP_JSET_K => {
                    let hit = match i.code {
                        BPF_JMP_JEQ_K => acc == i.k,
                        BPF_JMP_JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += usize::from(if hit { i.jt } else { i.jf });
                }
                BPF_RET_K => return i.k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    #[test]
    fn every_denied_call_gets_eperm_on_both_arches() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let prog = build(arch);
            for s in DENIED {
                assert_eq!(
                    run(&prog, arch.nr(s), arch.audit_arch(), 0),
                    EPERM,
                    "{} on {arch:?}",
                    s.name
                );
            }
        }
    }

    #[test]
    fn ordinary_calls_are_allowed() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let prog = build(arch);
            // read, write, openat, execve
            let calls: &[u32] = match arch {
                Arch::X86_64 => &[0, 1, 257, 59],
                Arch::Aarch64 => &[63, 64, 56, 221],
            };
            for &nr in calls {
                assert_eq!(
                    run(&prog, nr, arch.audit_arch(), 0),
                    RET_ALLOW,
                    "nr {nr} on {arch:?}"
                );
            }
        }
    }

    #[test]
    fn a_foreign_architecture_is_killed() {
        let prog = build(Arch::X86_64);
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        assert_eq!(run(&prog, 0, AUDIT_ARCH_I386, 0), RET_KILL_PROCESS);
        assert_eq!(
            run(&prog, 0, Arch::Aarch64.audit_arch(), 0),
            RET_KILL_PROCESS
        );
    }

    #[test]
    fn x32_system_calls_are_refused_on_x86_64() {
        let prog = build(Arch::X86_64);
        assert_eq!(
            run(&prog, X32_SYSCALL_BIT | 1, Arch::X86_64.audit_arch(), 0),
            EPERM
        );
    }

    #[test]
    fn clone_with_a_namespace_flag_is_refused_and_a_plain_fork_is_not() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let prog = build(arch);
            let a = arch.audit_arch();
            let sigchld = 17u64;
            assert_eq!(run(&prog, arch.nr(&CLONE), a, sigchld), RET_ALLOW);
            // CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD…: a thread.
            assert_eq!(run(&prog, arch.nr(&CLONE), a, 0x003d_0f00), RET_ALLOW);
            assert_eq!(run(&prog, arch.nr(&CLONE), a, 0x1000_0000 | sigchld), EPERM);
            assert_eq!(run(&prog, arch.nr(&CLONE), a, 0x0002_0000), EPERM);
        }
    }

    #[test]
    fn clone3_gets_enosys_so_libc_falls_back_to_clone() {
        let prog = build(Arch::Aarch64);
        assert_eq!(
            run(&prog, 435, Arch::Aarch64.audit_arch(), 0),
            RET_ERRNO | libc::ENOSYS as u32
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_x86_64_numbers_match_libc() {
        let by_name = |n: &str| DENIED.iter().find(|s| s.name == n).unwrap().x86_64 as i64;
        assert_eq!(by_name("ptrace"), libc::SYS_ptrace);
        assert_eq!(by_name("unshare"), libc::SYS_unshare);
        assert_eq!(by_name("setns"), libc::SYS_setns);
        assert_eq!(by_name("mount"), libc::SYS_mount);
        assert_eq!(by_name("umount2"), libc::SYS_umount2);
        assert_eq!(by_name("pivot_root"), libc::SYS_pivot_root);
        assert_eq!(by_name("kexec_load"), libc::SYS_kexec_load);
        assert_eq!(by_name("kexec_file_load"), libc::SYS_kexec_file_load);
        assert_eq!(by_name("init_module"), libc::SYS_init_module);
        assert_eq!(by_name("finit_module"), libc::SYS_finit_module);
        assert_eq!(by_name("delete_module"), libc::SYS_delete_module);
        assert_eq!(by_name("open_tree"), libc::SYS_open_tree);
        assert_eq!(by_name("fsopen"), libc::SYS_fsopen);
        assert_eq!(CLONE.x86_64 as i64, libc::SYS_clone);
        assert_eq!(CLONE3.x86_64 as i64, libc::SYS_clone3);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn the_aarch64_numbers_match_libc() {
        let by_name = |n: &str| DENIED.iter().find(|s| s.name == n).unwrap().aarch64 as i64;
        assert_eq!(by_name("ptrace"), libc::SYS_ptrace);
        assert_eq!(by_name("unshare"), libc::SYS_unshare);
        assert_eq!(by_name("mount"), libc::SYS_mount);
        assert_eq!(CLONE.aarch64 as i64, libc::SYS_clone);
    }

    #[test]
    fn the_bytes_are_eight_per_instruction_in_sock_filter_layout() {
        let prog = build(Arch::X86_64);
        let bytes = to_bytes(&prog);
        assert_eq!(bytes.len(), prog.len() * 8);
        assert_eq!(&bytes[0..2], &BPF_LD_W_ABS.to_ne_bytes());
        assert_eq!(&bytes[4..8], &OFF_ARCH.to_ne_bytes());
    }
}
