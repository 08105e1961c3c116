use std::fs;
use std::os::unix::fs::{chown, lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use boxdesk_platform::dirs::{ensure_private_dir, resolve_runtime_dir, DirEnv};
use boxdesk_platform::{euid, DirError};
use tempfile::TempDir;

use crate::{is_root, NOBODY};

/// A temp tree standing in for `$XDG_RUNTIME_DIR`, `$TMPDIR` and `/tmp`.
struct Roots {
    _tmp: TempDir,
    xdg: PathBuf,
    tmpdir: PathBuf,
    tmp_root: PathBuf,
}

impl Roots {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let [xdg, tmpdir, tmp_root] = ["run", "tmpdir", "tmp"].map(|n| tmp.path().join(n));
        for dir in [&xdg, &tmpdir, &tmp_root] {
            fs::create_dir(dir).unwrap();
        }
        Roots {
            _tmp: tmp,
            xdg,
            tmpdir,
            tmp_root,
        }
    }

    /// Only `$XDG_RUNTIME_DIR` set.
    fn xdg_env(&self) -> DirEnv {
        self.env(Some(&self.xdg), None)
    }

    fn env(&self, xdg: Option<&Path>, tmpdir: Option<&Path>) -> DirEnv {
        DirEnv {
            xdg_runtime_dir: xdg.map(Into::into),
            tmpdir: tmpdir.map(Into::into),
            tmp_root: self.tmp_root.clone(),
            xdg_state_home: None,
            xdg_data_home: None,
            home: None,
            euid: euid(),
        }
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn make_dir(path: &Path, mode: u32) {
    fs::create_dir(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_missing_runtime_dir_is_created_with_mode_0700() {
    let roots = Roots::new();
    let dir = resolve_runtime_dir(&roots.xdg_env()).unwrap();
    assert_eq!(dir, roots.xdg.join("boxdesk"));
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn an_existing_private_runtime_dir_is_used_as_it_is() {
    let roots = Roots::new();
    make_dir(&roots.xdg.join("boxdesk"), 0o700);
    fs::write(roots.xdg.join("boxdesk/kept"), "").unwrap();
    let dir = resolve_runtime_dir(&roots.xdg_env()).unwrap();
    assert!(dir.join("kept").exists());
}

#[test]
fn a_runtime_dir_with_mode_0755_is_refused_naming_the_mode_and_the_fix() {
    let roots = Roots::new();
    let dir = roots.xdg.join("boxdesk");
    make_dir(&dir, 0o755);
    let err = resolve_runtime_dir(&roots.xdg_env()).unwrap_err();
    assert!(
        matches!(err, DirError::WrongMode { mode: 0o755, .. }),
        "{err:?}"
    );
    let shown = dir.display();
    assert_eq!(
        err.to_string(),
        format!("{shown} has mode 0755, expected 0700; fix it with chmod 700 {shown}")
    );
    assert_eq!(mode(&dir), 0o755, "the mode must not be repaired silently");
}

#[test]
fn a_runtime_dir_owned_by_another_uid_is_refused() {
    if !is_root("chown") {
        return;
    }
    let roots = Roots::new();
    let dir = roots.xdg.join("boxdesk");
    make_dir(&dir, 0o700);
    chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let err = resolve_runtime_dir(&roots.xdg_env()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{} is owned by uid {NOBODY}, not 0", dir.display())
    );
}

#[test]
fn a_symlinked_runtime_dir_is_refused() {
    let roots = Roots::new();
    let elsewhere = roots.xdg.join("elsewhere");
    make_dir(&elsewhere, 0o700);
    symlink(&elsewhere, roots.xdg.join("boxdesk")).unwrap();
    let err = resolve_runtime_dir(&roots.xdg_env()).unwrap_err();
    assert!(matches!(err, DirError::Symlink { .. }), "{err:?}");
}

#[test]
fn a_runtime_dir_that_is_a_file_is_refused() {
    let roots = Roots::new();
    fs::write(roots.xdg.join("boxdesk"), "").unwrap();
    let err = resolve_runtime_dir(&roots.xdg_env()).unwrap_err();
    assert!(matches!(err, DirError::NotADirectory { .. }), "{err:?}");
}

#[test]
fn a_missing_xdg_runtime_dir_is_an_error_and_is_not_created() {
    let roots = Roots::new();
    let gone = roots.xdg.join("gone");
    let err = resolve_runtime_dir(&roots.env(Some(&gone), None)).unwrap_err();
    assert!(matches!(err, DirError::ParentMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("does not exist"));
    assert!(!gone.exists());
}

#[test]
fn a_relative_xdg_runtime_dir_is_ignored_in_favour_of_tmpdir() {
    let roots = Roots::new();
    let env = roots.env(Some(Path::new("run/user/1000")), Some(&roots.tmpdir));
    assert_eq!(
        resolve_runtime_dir(&env).unwrap(),
        roots.tmpdir.join("boxdesk")
    );
}

#[test]
fn without_xdg_runtime_dir_or_tmpdir_the_temp_root_is_used() {
    let roots = Roots::new();
    let dir = resolve_runtime_dir(&roots.env(None, None)).unwrap();
    assert_eq!(dir, roots.tmp_root.join("boxdesk"));
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn a_shared_fallback_owned_by_another_uid_is_bypassed_for_a_per_uid_dir() {
    if !is_root("chown") {
        return;
    }
    let roots = Roots::new();
    let shared = roots.tmpdir.join("boxdesk");
    make_dir(&shared, 0o700);
    chown(&shared, Some(NOBODY), Some(NOBODY)).unwrap();
    let dir = resolve_runtime_dir(&roots.env(None, Some(&roots.tmpdir))).unwrap();
    assert_eq!(dir, roots.tmp_root.join("boxdesk-0"));
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn a_shared_fallback_symlink_planted_by_another_uid_is_bypassed() {
    if !is_root("lchown") {
        return;
    }
    let roots = Roots::new();
    let link = roots.tmp_root.join("boxdesk");
    symlink(&roots.xdg, &link).unwrap();
    lchown(&link, Some(NOBODY), Some(NOBODY)).unwrap();
    let dir = resolve_runtime_dir(&roots.env(None, None)).unwrap();
    assert_eq!(dir, roots.tmp_root.join("boxdesk-0"));
}

#[test]
fn a_shared_fallback_of_our_own_with_mode_0755_is_refused_not_repaired() {
    let roots = Roots::new();
    let shared = roots.tmp_root.join("boxdesk");
    make_dir(&shared, 0o755);
    let err = resolve_runtime_dir(&roots.env(None, None)).unwrap_err();
    assert!(
        matches!(err, DirError::WrongMode { mode: 0o755, .. }),
        "{err:?}"
    );
    assert_eq!(mode(&shared), 0o755);
}

#[test]
fn a_per_uid_fallback_with_a_wrong_mode_is_refused() {
    if !is_root("chown") {
        return;
    }
    let roots = Roots::new();
    let shared = roots.tmp_root.join("boxdesk");
    make_dir(&shared, 0o700);
    chown(&shared, Some(NOBODY), Some(NOBODY)).unwrap();
    make_dir(&roots.tmp_root.join("boxdesk-0"), 0o750);
    let err = resolve_runtime_dir(&roots.env(None, None)).unwrap_err();
    assert!(
        matches!(err, DirError::WrongMode { mode: 0o750, .. }),
        "{err:?}"
    );
}

#[test]
fn ensure_private_dir_creates_missing_parents_and_the_dir_with_mode_0700() {
    let roots = Roots::new();
    let dir = roots.tmp_root.join("home/.local/state/boxdesk");
    ensure_private_dir(&dir).unwrap();
    assert_eq!(mode(&dir), 0o700);
    ensure_private_dir(&dir).unwrap();
}

#[test]
fn ensure_private_dir_refuses_an_existing_dir_others_can_read() {
    let roots = Roots::new();
    let dir = roots.tmp_root.join("state");
    make_dir(&dir, 0o744);
    let err = ensure_private_dir(&dir).unwrap_err();
    assert!(
        matches!(err, DirError::WrongMode { mode: 0o744, .. }),
        "{err:?}"
    );
}
