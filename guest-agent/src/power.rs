//! The end of the agent: Shutdown in a VM (kill every process, sync,
//! unmount, power off), a fatal error (print, then power off as a VM's
//! init or exit otherwise), and the panic hook of a VM's init.
//!
//! Power-off is `reboot(RB_AUTOBOOT)` on x86_64 (with `reboot=k` the VMM's
//! i8042 reset ends the VM cleanly; there is no ACPI) and
//! `reboot(RB_POWER_OFF)` (PSCI SYSTEM_OFF) on aarch64. Owns nothing but
//! the sequence; it must never return once power-off starts, and a VM's
//! init must never exit (the kernel would panic).

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::reboot::{reboot, RebootMode};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Why power-off did not happen (only ever logged).
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// `reboot(2)` returned.
    #[error("reboot: {0}")]
    Reboot(nix::Error),
}

/// How long processes get between SIGTERM and SIGKILL at shutdown.
const GRACE: Duration = Duration::from_millis(1000);

/// The VM shutdown of docs/CHANNEL.md: SIGTERM to every process, a short grace,
/// SIGKILL, sync, unmount what init mounted (best effort; after a switch to
/// a `--rootfs` these are the same paths in the new root), remount `/`
/// read-only, power off.
pub fn vm_shutdown(mounted: &[PathBuf]) -> ! {
    log!("shutdown: stopping every process");
    let _ = kill(Pid::from_raw(-1), Signal::SIGTERM);
    let step = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    while waited < GRACE && other_processes() {
        std::thread::sleep(step);
        waited += step;
    }
    let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
    std::thread::sleep(step);
    nix::unistd::sync();
    for target in mounted.iter().rev() {
        let _ = nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH);
    }
    remount_root_read_only();
    power_off()
}

/// Remounts `/` read-only (best effort), so a `--rootfs-rw` ext4 disk is
/// left clean (a journal left needing recovery would keep the image from
/// mounting read-only next time). Harmless on an overlay or the initramfs.
/// A process killed a moment ago may still hold a file open for writing
/// (`EBUSY`), so it tries a few times.
fn remount_root_read_only() {
    use nix::mount::{mount, MsFlags};
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    let mut result = Ok(());
    for _ in 0..5 {
        result = mount(None::<&str>, "/", None::<&str>, flags, None::<&str>);
        if result != Err(nix::errno::Errno::EBUSY) {
            break;
        }
        std::thread::sleep(Duration::from_millis(40));
    }
    if let Err(e) = result {
        log!("shutdown: remount / read-only: {e}");
    }
}

/// True while a user-space process other than the agent exists (kernel
/// threads have an empty cmdline).
fn other_processes() -> bool {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.bytes().all(|b| b.is_ascii_digit())
            && name != me
            && std::fs::read(e.path().join("cmdline")).is_ok_and(|c| !c.is_empty())
    })
}

/// Syncs and powers the VM off; never returns.
pub fn power_off() -> ! {
    nix::unistd::sync();
    let how = if cfg!(target_arch = "x86_64") {
        RebootMode::RB_AUTOBOOT
    } else {
        RebootMode::RB_POWER_OFF
    };
    let Err(e) = reboot(how);
    log!("{}", PowerError::Reboot(e));
    let _ = reboot(RebootMode::RB_HALT_SYSTEM);
    loop {
        // Exiting as init would panic the kernel; wait to be killed.
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A fatal error: printed to the console; a VM's init powers off, anything
/// else exits with `code`.
pub fn fatal(err: &dyn std::fmt::Display, code: i32) -> ! {
    log!("fatal: {err}");
    if crate::agent::Mode::detect() == crate::agent::Mode::VmInit {
        power_off()
    }
    std::process::exit(code)
}

/// In a VM's init, a panic is printed and powers the VM off rather than
/// leaving a dead init (and a kernel panic) behind — unless it unwinds on a
/// session thread, where it ends only that session.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let on_session = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with(crate::agent::SESSION_THREAD));
        if cfg!(panic = "unwind") && on_session {
            log!("panic ended one session; still serving");
            return;
        }
        log!("panic in the init process; powering off");
        power_off()
    }));
}
