//! boxdesk and AppArmor's user-namespace restriction (Linux).
//!
//! Ubuntu 23.10 and later set `kernel.apparmor_restrict_unprivileged_userns
//! = 1`: a program without an AppArmor profile that makes a user namespace
//! gets no capabilities in it, so bwrap (the namespace backend) and the VM
//! helper's jail fail for every user. boxdesk ships a profile
//! (`dist/apparmor/boxdesk`) that confines nothing and grants `userns` to
//! the boxdesk binary, and through it to the bwrap it starts.
//!
//! [`profile`] is the text (embedded, with the paths an install adds),
//! [`install`] writes and loads it beneath a root, [`status`] reads what
//! AppArmor does here, and [`probe`] tries a user namespace with
//! capabilities for real. `boxdesk apparmor`, `boxdesk doctor` and
//! `boxdesk cowork install` (`cli/`) use them.

pub mod install;
pub mod probe;
pub mod profile;
pub mod status;

use std::path::{Path, PathBuf};

/// The real path of the running binary: what AppArmor matches a profile's
/// attachment against (links resolved).
pub fn this_exe() -> std::io::Result<PathBuf> {
    std::env::current_exe().and_then(std::fs::canonicalize)
}

/// `apparmor_parser`: on `PATH`, else in the sbin directories a user's
/// `PATH` often lacks.
pub fn parser() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("apparmor_parser"))
        .find(|p| p.is_file())
}

/// The shell commands that install the profile for `exe` by hand, as root.
pub fn manual_commands(exe: &Path) -> String {
    format!(
        "{exe} apparmor show | sudo tee /{dst} >/dev/null && sudo apparmor_parser -r /{dst}",
        exe = exe.display(),
        dst = install::INSTALLED
    )
}
