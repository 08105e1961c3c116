//! Finds bubblewrap on `PATH` and asks its version.
//!
//! Must never search relative `PATH` entries: a `bwrap` in the current
//! directory is not the system's.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Probe;

const HINT: &str = "apt-get install bubblewrap";

/// Whether `bwrap` is on `PATH`, with its path and `bwrap --version`.
pub fn bwrap() -> Probe {
    bwrap_in(&std::env::var_os("PATH").unwrap_or_default())
}

/// [`bwrap`] with the search path given.
pub(crate) fn bwrap_in(search_path: &OsStr) -> Probe {
    let Some(path) = find_executable("bwrap", search_path) else {
        return Probe::missing("bwrap is not on PATH", Some(HINT));
    };
    let output = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(out) if out.status.success() => Probe::Available {
            detail: format!(
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stdout).trim()
            ),
        },
        Ok(out) => Probe::missing(
            format!(
                "`{} --version` failed ({}): {}",
                path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Some(HINT),
        ),
        Err(e) => Probe::missing(format!("cannot run {}: {e}", path.display()), Some(HINT)),
    }
}

fn find_executable(name: &str, search_path: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(search_path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn script(dir: &Path, body: &str) {
        let path = dir.join("bwrap");
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn bwrap_absent_from_path_is_missing_with_the_apt_hint() {
        let empty = tempfile::tempdir().unwrap();
        let probe = bwrap_in(empty.path().as_os_str());
        assert_eq!(
            probe,
            Probe::missing("bwrap is not on PATH", Some("apt-get install bubblewrap"))
        );
    }

    #[test]
    fn a_relative_path_entry_is_not_searched() {
        let dir = tempfile::tempdir().unwrap();
        script(dir.path(), "echo bubblewrap 0.9.0");
        // The same directory, spelled relative to the current directory.
        let cwd = std::env::current_dir().unwrap();
        let up = "../".repeat(cwd.components().count() - 1);
        let relative = Path::new(&up).join(dir.path().strip_prefix("/").unwrap());
        assert!(is_executable(&relative.join("bwrap")));
        assert!(find_executable("bwrap", relative.as_os_str()).is_none());
    }

    // One test runs both scripts, so no other probe test forks while a
    // script is still open for writing (which would make exec fail ETXTBSY).
    #[test]
    fn bwrap_on_path_reports_its_path_and_version_or_why_it_failed() {
        let good = tempfile::tempdir().unwrap();
        script(good.path(), "echo bubblewrap 0.9.0");
        let expected = format!("{}: bubblewrap 0.9.0", good.path().join("bwrap").display());
        assert_eq!(
            bwrap_in(good.path().as_os_str()),
            Probe::Available { detail: expected }
        );

        let bad = tempfile::tempdir().unwrap();
        script(bad.path(), "echo broken >&2; exit 3");
        let Probe::Missing { why, .. } = bwrap_in(bad.path().as_os_str()) else {
            panic!("a failing bwrap counted as available");
        };
        assert!(
            why.contains("--version` failed") && why.contains("broken"),
            "{why}"
        );
    }
}
