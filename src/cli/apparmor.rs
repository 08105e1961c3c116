//! `boxdesk apparmor install | show` (Linux): the words around
//! `crate::apparmor`, which holds the profile and writes it.
//!
//! `install` as root writes `/etc/apparmor.d/boxdesk` for this binary's
//! real path and loads it with `apparmor_parser -r`; as a user it says the
//! one command to run. `show` prints what `install` would write. This
//! module also gives `boxdesk cowork install` its AppArmor step.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context as _};
use clap::Subcommand;

use crate::apparmor::{self, install, status::Status};

/// `boxdesk apparmor` subcommands.
#[derive(Debug, Subcommand)]
pub enum AppArmorCmd {
    /// Write /etc/apparmor.d/boxdesk for this boxdesk's real path (added to
    /// the profile's list of places boxdesk is installed, with those of
    /// earlier installs) and load it with `apparmor_parser -r`. Needs root.
    Install,
    /// Print the profile `install` would write.
    Show,
}

/// Runs one subcommand.
pub fn run(cmd: &AppArmorCmd) -> anyhow::Result<i32> {
    let exe = apparmor::this_exe().context("locating the boxdesk binary")?;
    match cmd {
        AppArmorCmd::Show => {
            let plan = install::plan(Path::new("/"), &exe)?;
            print!("{}", plan.text);
            Ok(0)
        }
        AppArmorCmd::Install => {
            if !is_root() {
                bail!(
                    "installing the AppArmor profile needs root: sudo {} apparmor install \
                     (or, by hand: {})",
                    exe.display(),
                    apparmor::manual_commands(&exe)
                );
            }
            for line in install_as_root(&exe)? {
                println!("{line}");
            }
            Ok(0)
        }
    }
}

fn is_root() -> bool {
    // SAFETY: cannot fail, touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// Installs and loads the profile for `exe`; the lines to print.
fn install_as_root(exe: &Path) -> anyhow::Result<Vec<String>> {
    if !Path::new("/sys/kernel/security/apparmor").is_dir() {
        bail!("AppArmor is not active in this kernel (no /sys/kernel/security/apparmor): it restricts nothing here, and boxdesk needs no profile");
    }
    let parser = apparmor::parser()
        .context("apparmor_parser is not installed (Debian and Ubuntu: apt install apparmor)")?;
    let plan = install::install(Path::new("/"), exe, |file| load(&parser, file))?;
    let mut lines = vec![if plan.unchanged {
        format!(
            "{} was already up to date; loaded it again",
            plan.path.display()
        )
    } else {
        format!("wrote {} and loaded it", plan.path.display())
    }];
    lines.push(format!(
        "the profile `{}` grants user namespaces to boxdesk at the shipped places{}",
        apparmor::profile::NAME,
        if plan.added.is_empty() {
            String::new()
        } else {
            let added: Vec<String> = plan.added.iter().map(|p| p.display().to_string()).collect();
            format!(" and at {}", added.join(", "))
        }
    ));
    let restriction = apparmor::status::read_restriction(Path::new("/proc/sys"));
    if restriction != apparmor::status::Restriction::On {
        lines.push(format!(
            "AppArmor {restriction}: the profile matters once it does"
        ));
    }
    lines.push("boxdesk processes started from now on run under it; restart those already running (a `boxdesk cowork` server: restart the app)".into());
    Ok(lines)
}

/// `apparmor_parser -r -K FILE`: replace (or add) the profile in the
/// kernel, without touching the parser's cache.
fn load(parser: &Path, file: &Path) -> Result<(), String> {
    let out = Command::new(parser)
        .args(["-r", "-K"])
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", parser.display()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} -r {} ({}): {}",
        parser.display(),
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// `boxdesk cowork install`'s AppArmor step: nothing where AppArmor does
/// not restrict user namespaces or this binary already runs under its
/// profile; the install as root; else the one command. Returns the lines
/// to print and whether boxdesk can make its namespaces afterwards.
pub fn for_cowork_install() -> (Vec<String>, bool) {
    let status = Status::read();
    if !status.needs_profile() {
        return (Vec::new(), true);
    }
    let exe = match apparmor::this_exe() {
        Ok(e) => e,
        Err(e) => {
            return (
                vec![format!("apparmor: cannot locate the boxdesk binary: {e}")],
                false,
            )
        }
    };
    let head = format!("apparmor: {}", status.restriction);
    if !is_root() {
        return (
            vec![
                head,
                format!(
                    "  boxdesk cannot make its sandboxes until its profile is installed: sudo {} apparmor install",
                    exe.display()
                ),
            ],
            false,
        );
    }
    match install_as_root(&exe) {
        Ok(lines) => (
            std::iter::once(head)
                .chain(lines.into_iter().map(|l| format!("  {l}")))
                .collect(),
            true,
        ),
        Err(e) => (
            vec![
                head,
                format!("  installing boxdesk's profile failed: {e:#}"),
            ],
            false,
        ),
    }
}
