//! Installing the profile: `<root>/etc/apparmor.d/boxdesk` for this
//! binary (and every binary an earlier install added), loaded into the
//! kernel.
//!
//! The new text is written to a temporary file beside the profile and
//! loaded from there first; only a text the kernel took is renamed into
//! place, so a failed install leaves the old file and the old policy as
//! they were. Loading is the caller's (`apparmor_parser -r` in the
//! binary, a recorder in the tests), so this module runs no program.
//! It must never overwrite a `boxdesk` profile that boxdesk did not write.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::profile::{self, ProfileError};

/// Where the profile goes, beneath the root.
pub const INSTALLED: &str = "etc/apparmor.d/boxdesk";

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The binary's path cannot go into the profile.
    #[error(transparent)]
    Path(#[from] ProfileError),
    /// There is no `/etc/apparmor.d`: AppArmor's userspace is not installed.
    #[error("{0} does not exist: AppArmor's tools are not installed (Debian and Ubuntu: apt install apparmor)")]
    NoDir(PathBuf),
    /// A `boxdesk` profile boxdesk did not write is in the way.
    #[error("{0} was not written by boxdesk; left as it is (remove it, or add what boxdesk needs to it by hand: see `boxdesk apparmor show`)")]
    Foreign(PathBuf),
    /// The kernel (the loader) refused the new profile; nothing changed.
    #[error("loading the profile failed, nothing was changed: {0}")]
    Load(String),
    /// Reading or writing a file failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_owned();
    move |source| InstallError::Io { what, path, source }
}

/// The profile an install for `exe` would write, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `<root>/etc/apparmor.d/boxdesk`.
    pub path: PathBuf,
    /// The text.
    pub text: String,
    /// The paths added to the shipped list (earlier installs' and `exe`).
    pub added: Vec<PathBuf>,
    /// Whether the file already holds exactly this text.
    pub unchanged: bool,
}

/// What [`install`] would write for `exe` (a real path): the shipped
/// profile with the paths an installed copy added, and `exe`.
pub fn plan(root: &Path, exe: &Path) -> Result<Plan, InstallError> {
    let path = root.join(INSTALLED);
    let existing = match fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("reading", &path)(e)),
    };
    if existing.as_deref().is_some_and(|t| !profile::is_ours(t)) {
        return Err(InstallError::Foreign(path));
    }
    let mut exes = existing
        .as_deref()
        .map(profile::added_paths)
        .unwrap_or_default();
    exes.push(exe.to_owned());
    let text = profile::render(&exes)?;
    let added = profile::added_paths(&text);
    let unchanged = existing.as_deref() == Some(text.as_str());
    Ok(Plan {
        path,
        text,
        added,
        unchanged,
    })
}

/// Installs the profile for `exe` under `root` (see the module doc):
/// `load` is given the file to load (a temporary one beside the profile
/// when the text changes, else the profile itself) and returns the
/// loader's complaint when it fails.
pub fn install(
    root: &Path,
    exe: &Path,
    load: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<Plan, InstallError> {
    let dir = root.join("etc/apparmor.d");
    if !dir.is_dir() {
        return Err(InstallError::NoDir(dir));
    }
    let plan = plan(root, exe)?;
    if plan.unchanged {
        // Loaded again all the same: the file may be there and the
        // profile not (never loaded, or removed since).
        load(&plan.path).map_err(InstallError::Load)?;
        return Ok(plan);
    }
    // A dot file: AppArmor's boot-time loader skips it if it is ever
    // left behind.
    let tmp = dir.join(".boxdesk.new");
    let written = write_new(&tmp, &plan.text).and_then(|()| {
        load(&tmp).map_err(InstallError::Load)?;
        fs::rename(&tmp, &plan.path).map_err(io_err("renaming into place", &plan.path))
    });
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map(|()| plan)
}

/// `text` as a fresh 0644 file at `tmp`, on disk before it is loaded.
fn write_new(tmp: &Path, text: &str) -> Result<(), InstallError> {
    match fs::remove_file(tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("removing a stale", tmp)(e)),
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)
        .map_err(io_err("creating", tmp))?;
    // Whatever the umask: the profile is world-readable, as every other
    // file in /etc/apparmor.d.
    f.set_permissions(fs::Permissions::from_mode(0o644))
        .map_err(io_err("setting the mode of", tmp))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io_err("writing", tmp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("etc/apparmor.d")).unwrap();
        d
    }

    /// A loader that keeps what it was given to load.
    fn recorder(
        seen: &RefCell<Vec<(PathBuf, String)>>,
    ) -> impl FnOnce(&Path) -> Result<(), String> + '_ {
        |p: &Path| {
            seen.borrow_mut()
                .push((p.to_owned(), fs::read_to_string(p).unwrap()));
            Ok(())
        }
    }

    #[test]
    fn install_writes_the_profile_with_the_binary_path_added_and_loads_it_before_it_is_in_place() {
        let r = root();
        let exe = Path::new("/home/ann/bin/boxdesk");
        let seen = RefCell::new(Vec::new());
        let plan = install(r.path(), exe, recorder(&seen)).unwrap();
        let path = r.path().join(INSTALLED);
        assert_eq!(plan.path, path);
        assert_eq!(plan.added, [exe.to_owned()]);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text, plan.text);
        assert!(text.contains("\n@{boxdesk_exe} += /home/ann/bin/boxdesk\n"));
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        let seen = seen.into_inner();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0, r.path().join("etc/apparmor.d/.boxdesk.new"));
        assert_eq!(seen[0].1, text);
        assert!(!seen[0].0.exists(), "the temporary file was renamed");
    }

    #[test]
    fn a_second_install_for_another_binary_keeps_the_first_binary() {
        let r = root();
        install(r.path(), Path::new("/srv/a/boxdesk"), |_| Ok(())).unwrap();
        let plan = install(r.path(), Path::new("/srv/b/boxdesk"), |_| Ok(())).unwrap();
        assert_eq!(
            plan.added,
            [
                PathBuf::from("/srv/a/boxdesk"),
                PathBuf::from("/srv/b/boxdesk")
            ]
        );
    }

    #[test]
    fn installing_again_changes_nothing_but_loads_the_profile_in_place() {
        let r = root();
        let exe = Path::new("/usr/bin/boxdesk");
        install(r.path(), exe, |_| Ok(())).unwrap();
        let before = fs::metadata(r.path().join(INSTALLED))
            .unwrap()
            .modified()
            .unwrap();
        let seen = RefCell::new(Vec::new());
        let plan = install(r.path(), exe, recorder(&seen)).unwrap();
        assert!(plan.unchanged);
        assert_eq!(plan.text, profile::SHIPPED);
        assert_eq!(seen.into_inner()[0].0, r.path().join(INSTALLED));
        let after = fs::metadata(r.path().join(INSTALLED))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(before, after);
    }

    #[test]
    fn a_profile_the_kernel_refuses_leaves_the_old_file_and_no_temporary_one() {
        let r = root();
        install(r.path(), Path::new("/srv/a/boxdesk"), |_| Ok(())).unwrap();
        let old = fs::read_to_string(r.path().join(INSTALLED)).unwrap();
        let err = install(r.path(), Path::new("/srv/b/boxdesk"), |_| {
            Err("apparmor_parser: syntax error".into())
        })
        .unwrap_err();
        assert!(matches!(&err, InstallError::Load(why) if why.contains("syntax error")));
        assert_eq!(fs::read_to_string(r.path().join(INSTALLED)).unwrap(), old);
        let names: Vec<_> = fs::read_dir(r.path().join("etc/apparmor.d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["boxdesk"]);
    }

    #[test]
    fn a_boxdesk_profile_someone_else_wrote_is_left_alone() {
        let r = root();
        let theirs = "profile boxdesk /usr/bin/boxdesk { }\n";
        fs::write(r.path().join(INSTALLED), theirs).unwrap();
        let err = install(r.path(), Path::new("/usr/bin/boxdesk"), |_| {
            panic!("nothing may be loaded")
        })
        .unwrap_err();
        assert!(matches!(err, InstallError::Foreign(_)));
        assert_eq!(
            fs::read_to_string(r.path().join(INSTALLED)).unwrap(),
            theirs
        );
    }

    #[test]
    fn the_profile_installed_for_a_binary_path_compiles_with_this_machines_apparmor_parser() {
        let r = root();
        install(
            r.path(),
            Path::new("/home/ann/src/boxdesk/target/release/boxdesk"),
            |_| Ok(()),
        )
        .unwrap();
        // scripts/check-apparmor.sh says what it could check with the
        // parser here (all of it with AppArmor 4, all but the two 4.0
        // lines with Debian 12's 3.0), or `skipped:` without one.
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check-apparmor.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(r.path().join(INSTALLED))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        print!("{stdout}");
        assert!(
            stdout.starts_with("ok: ") || stdout.starts_with("skipped: "),
            "{stdout}"
        );
    }

    #[test]
    fn without_etc_apparmor_d_install_says_apparmor_is_not_installed() {
        let r = tempfile::tempdir().unwrap();
        let err = install(r.path(), Path::new("/usr/bin/boxdesk"), |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("apt install apparmor"), "{err}");
    }
}
