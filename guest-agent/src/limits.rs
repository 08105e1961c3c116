//! Process-wide settings the agent makes once at start, before it serves
//! anything: it becomes non-dumpable, raises its open-file limit, keeps
//! glibc's allocator to one arena, and (when asked) caps the tasks of the
//! sandbox with `RLIMIT_NPROC`.
//!
//! Owns these three calls and what they mean. It must never lower a limit
//! the agent was not asked to lower, and never run after the first
//! connection (the limits are inherited by every exec only when set first).

use std::io;

/// Why a start-up setting could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// `prctl(PR_SET_DUMPABLE, 0)` failed.
    #[error("cannot make the agent non-dumpable: {0}")]
    Dumpable(io::Error),
    /// `setrlimit(RLIMIT_NPROC)` failed.
    #[error("--pids-max {max}: cannot set RLIMIT_NPROC: {err}")]
    Tasks {
        /// The requested limit.
        max: u64,
        /// The system error.
        err: io::Error,
    },
}

/// Makes the agent non-dumpable (`PR_SET_DUMPABLE` 0): its `/proc/PID`
/// files become root's, and processes in the sandbox running as the same
/// uid without `CAP_SYS_PTRACE` can no longer open `/proc/1/fd/*` (the
/// agent's sockets and pipes), read `/proc/1/mem`, or ptrace it. The
/// agent's own `/proc/self` stays readable to it: the kernel always allows
/// a thread group access to itself. An exec'd child gets its own, dumpable
/// mm again at `execve`, so this never reaches a sandboxed program.
pub fn non_dumpable() -> Result<(), LimitsError> {
    // SAFETY: PR_SET_DUMPABLE takes an integer argument and no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc != 0 {
        return Err(LimitsError::Dumpable(io::Error::last_os_error()));
    }
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, so a flood of
/// connections meets the connection cap before the descriptor limit.
/// Returns the soft limit now in force; a failure leaves the limit as it
/// was (the cap still holds, the flood just meets `EMFILE` sooner).
pub fn raise_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit read by the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
        log!(
            "cannot raise the open-file limit to {}: {}",
            lim.rlim_max,
            io::Error::last_os_error()
        );
    }
    lim.rlim_cur
}

/// Keeps glibc's allocator to one arena (`M_ARENA_MAX` 1; before any
/// thread starts). By default every new thread may get an arena of its
/// own, up to eight per CPU, and what a burst of session threads freed
/// there stays resident for good (`malloc_trim` cannot shrink those
/// heaps): measured after 1,024 idle sessions came and went, 7.3 MiB
/// resident against 4.1 MiB with one arena and the trim of `workers`
/// (2.3 MiB at rest; most of the rest is glibc's cache of exited threads'
/// stacks, bounded at 40 MiB of stacks). The agent allocates little per
/// session, so one arena costs no measurable contention. musl's allocator
/// has no arenas: nothing to do there.
pub fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt takes two integers and only sets allocator options;
    // no other thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Sets `RLIMIT_NPROC` to `max` (soft and hard, so no exec can raise it
/// again). The limit counts tasks — processes and threads, the agent's own
/// included — of the caller's real uid, and since Linux 5.14 it counts them
/// per user namespace (`ucounts`): inside a fresh user namespace whose root
/// maps to an id nothing else uses, that is exactly the sandbox's tasks, so
/// a fork bomb stops at `max` with `EAGAIN`. Two limits of the kernel: it
/// does not apply to the host's root (uid 0 of the initial user namespace,
/// or any task with `CAP_SYS_RESOURCE` or `CAP_SYS_ADMIN` there), and
/// before 5.14 the count is global per uid. The helper's cgroup pids limit
/// is the second line where it exists.
pub fn limit_tasks(max: u64) -> Result<(), LimitsError> {
    let lim = libc::rlimit {
        rlim_cur: max as libc::rlim_t,
        rlim_max: max as libc::rlim_t,
    };
    // SAFETY: `lim` is a valid rlimit read by the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) } != 0 {
        return Err(LimitsError::Tasks {
            max,
            err: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Marks every descriptor above stderr close-on-exec (`close_range`, Linux
/// 5.11; older kernels keep them, which only a container's agent has).
pub fn cloexec_inherited() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes no pointers; it only sets descriptor flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc != 0 {
        log!(
            "cannot mark inherited descriptors close-on-exec: {}",
            io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_ends_at_the_hard_limit() {
        let now = raise_open_files();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit for the call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((lim.rlim_cur, now), (lim.rlim_max, lim.rlim_max));
    }
}
