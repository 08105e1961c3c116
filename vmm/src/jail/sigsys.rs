//! What happens when a jailed thread makes a forbidden call: the filter
//! traps (`SIGSYS`), and this handler writes one line to stderr (the
//! helper's log, or the terminal of a foreground `run`) naming the thread,
//! its class, the system call's number and its first two arguments (an
//! `ioctl`'s request), then makes the process die of
//! `SIGSYS` by trapping again: the kernel forces the default action of a
//! signal that traps while blocked, as `SIGSYS` is inside its own handler.
//!
//! Only async-signal-safe work happens here: a stack buffer, `prctl`
//! (the thread's name) and `write`, all on every allowlist.

use std::cell::Cell;

use boxdesk_platform::threads::Class;

thread_local! {
    /// The calling thread's class, once it entered its jail.
    static CLASS: Cell<Option<Class>> = const { Cell::new(None) };
}

/// Records the calling thread's class for the report.
pub(super) fn name_thread_class(class: Class) {
    CLASS.with(|c| c.set(Some(class)));
}

/// Installs the handler for `SIGSYS`.
pub(super) fn install() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; the handler is
    // an `extern "C"` function with the SA_SIGINFO signature, and the
    // struct outlives the call.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The system call number of a `SIGSYS` from seccomp: `si_syscall`, the
/// `int` after `si_call_addr` in the siginfo's union (offset 24 on both
/// 64-bit arches).
///
/// # Safety
/// `info` points at the siginfo the kernel passed the handler.
unsafe fn syscall_of(info: *const libc::siginfo_t) -> i32 {
    // SAFETY: the caller's promise; the siginfo is 128 bytes and the
    // field at 24 is an aligned i32 of the `_sigsys` member.
    unsafe { info.cast::<u8>().add(24).cast::<i32>().read() }
}

/// The trapped call's first two arguments (an `ioctl`'s descriptor and
/// request, a `socket`'s family and type), from the saved registers.
///
/// # Safety
/// `ctx` points at the ucontext the kernel passed the handler.
unsafe fn first_args(ctx: *const libc::c_void) -> [u64; 2] {
    // SAFETY: the caller's promise; the registers are plain integers.
    let uc = unsafe { &*ctx.cast::<libc::ucontext_t>() };
    #[cfg(target_arch = "x86_64")]
    {
        [
            uc.uc_mcontext.gregs[libc::REG_RDI as usize] as u64,
            uc.uc_mcontext.gregs[libc::REG_RSI as usize] as u64,
        ]
    }
    #[cfg(target_arch = "aarch64")]
    {
        [uc.uc_mcontext.regs[0], uc.uc_mcontext.regs[1]]
    }
}

extern "C" fn handler(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let nr = unsafe { syscall_of(info) };
    let mut line = Line::default();
    line.push(b"boxdesk: SECCOMP: thread ");
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, to `name`.
    if unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr(), 0, 0, 0) } == 0 {
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        line.push(&name[..len]);
    }
    let class = CLASS.try_with(Cell::get).ok().flatten();
    line.push(b" (");
    line.push(class.map_or("helper", Class::name).as_bytes());
    line.push(b" allowlist) made system call ");
    line.number(nr);
    // SAFETY: the kernel hands a valid ucontext to an SA_SIGINFO handler.
    let [a0, a1] = unsafe { first_args(ctx) };
    line.push(b" (first arguments ");
    line.hex(a0);
    line.push(b", ");
    line.hex(a1);
    line.push(b"), which it may not make: the VM helper stops\n");
    // SAFETY: writing our own stack buffer to stderr.
    unsafe { libc::write(2, line.buf.as_ptr().cast(), line.len) };
    // SAFETY: the same forbidden number again, with zero arguments (every
    // narrowed call refuses zeros too): it traps while SIGSYS is blocked,
    // so the kernel kills the process with SIGSYS. Should it return, the
    // process exits as a shell reports a SIGSYS death.
    unsafe {
        libc::syscall(libc::c_long::from(nr), 0, 0, 0, 0, 0, 0);
        libc::syscall(libc::SYS_exit_group, 128 + libc::SIGSYS);
    }
}

/// A fixed line on the stack.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 256],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn hex(&mut self, v: u64) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        let mut v = v;
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(v & 15) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.push(b"0x");
        self.push(&digits[i..]);
    }

    fn number(&mut self, n: i32) {
        let mut digits = [0u8; 11];
        let mut i = digits.len();
        let mut v = i64::from(n).unsigned_abs();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if n < 0 {
            self.push(b"-");
        }
        self.push(&digits[i..]);
    }
}
