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
            run_root: self.tmp_root.join("run"),
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

/// Resolves the runtime dir as a user who is not root: this process when
/// it is not root, else a forked child that became `nobody` (what root
/// owns in the tree is handed to `nobody` first). Errors come back as their message.
fn resolve_as_user(roots: &Roots, env: impl FnOnce(u32) -> DirEnv) -> Result<PathBuf, String> {
    if euid() != 0 {
        return resolve_runtime_dir(&env(euid())).map_err(|e| e.to_string());
    }
    for entry in walk(roots._tmp.path()) {
        if fs::symlink_metadata(&entry).unwrap().uid() == 0 {
            lchown(&entry, Some(NOBODY), Some(NOBODY)).unwrap();
        }
    }
    let env = env(NOBODY);
    let (read, write) = nix::unistd::pipe().unwrap();
    let (mut read, write) = (fs::File::from(read), fs::File::from(write));
    // SAFETY: the child only calls setgid/setuid, the resolution and write
    // before _exit; glibc's malloc stays usable in a forked child.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            drop(read);
            let _ = nix::unistd::setgroups(&[]);
            let ok = nix::unistd::setgid(NOBODY.into()).is_ok()
                && nix::unistd::setuid(NOBODY.into()).is_ok();
            let answer = match (ok, resolve_runtime_dir(&env)) {
                (false, _) => "ERR cannot become nobody".to_owned(),
                (true, Ok(dir)) => format!("OK {}", dir.display()),
                (true, Err(e)) => format!("ERR {e}"),
            };
            let mut write = write;
            let _ = std::io::Write::write_all(&mut write, answer.as_bytes());
            // SAFETY: ends the forked child without running the parent's
            // destructors or atexit handlers.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(write);
            let mut answer = String::new();
            std::io::Read::read_to_string(&mut read, &mut answer).unwrap();
            nix::sys::wait::waitpid(child, None).unwrap();
            match answer.split_once(' ') {
                Some(("OK", dir)) => Ok(PathBuf::from(dir)),
                Some(("ERR", msg)) => Err(msg.to_owned()),
                _ => panic!("the child said {answer:?}"),
            }
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_owned()];
    if fs::symlink_metadata(dir).unwrap().is_dir() {
        for entry in fs::read_dir(dir).unwrap() {
            all.extend(walk(&entry.unwrap().path()));
        }
    }
    all
}

impl Roots {
    /// No `$XDG_RUNTIME_DIR`; `run_root` and `home` inside the temp tree.
    fn user_env(&self, uid: u32, tmpdir: Option<&Path>) -> DirEnv {
        DirEnv {
            xdg_runtime_dir: None,
            tmpdir: tmpdir.map(Into::into),
            run_root: self.tmp_root.join("run"),
            xdg_state_home: None,
            xdg_data_home: None,
            home: Some(self.tmp_root.join("home").into()),
            euid: uid,
        }
    }

    fn home(&self) -> PathBuf {
        let home = self.tmp_root.join("home");
        make_dir(&home, 0o700);
        home
    }
}

#[test]
fn without_xdg_runtime_dir_a_user_gets_a_runtime_dir_in_their_own_state_dir_never_in_shared_tmp() {
    let roots = Roots::new();
    let home = roots.home();
    // A sticky world-writable dir like /tmp, where another user could
    // have made boxdesk's dir first.
    fs::set_permissions(&roots.tmpdir, fs::Permissions::from_mode(0o1777)).unwrap();
    let dir = resolve_as_user(&roots, |uid| roots.user_env(uid, Some(&roots.tmpdir))).unwrap();
    assert_eq!(dir, home.join(".local/state/boxdesk/run"));
    assert_eq!(mode(&dir), 0o700);
    assert!(!roots.tmpdir.join("boxdesk").exists());
}

#[test]
fn a_runtime_dir_squatted_in_shared_tmp_by_another_user_does_not_stop_boxdesk() {
    if !is_root("make a dir another user owns") {
        return;
    }
    let roots = Roots::new();
    let home = roots.home();
    fs::set_permissions(&roots.tmpdir, fs::Permissions::from_mode(0o1777)).unwrap();
    for squat in ["boxdesk", &format!("boxdesk-{NOBODY}")] {
        let squat = roots.tmpdir.join(squat);
        make_dir(&squat, 0o777);
        chown(&squat, Some(4242), Some(4242)).unwrap();
    }
    let dir = resolve_as_user(&roots, |uid| roots.user_env(uid, Some(&roots.tmpdir))).unwrap();
    assert_eq!(dir, home.join(".local/state/boxdesk/run"));
}

#[test]
fn a_systemd_user_runtime_dir_is_used_when_xdg_runtime_dir_was_lost() {
    let roots = Roots::new();
    roots.home();
    let run_user = roots.tmp_root.join("run/user");
    fs::create_dir_all(&run_user).unwrap();
    let uid = if euid() == 0 { NOBODY } else { euid() };
    make_dir(&run_user.join(uid.to_string()), 0o700);
    let dir = resolve_as_user(&roots, |uid| roots.user_env(uid, None)).unwrap();
    assert_eq!(dir, run_user.join(format!("{uid}/boxdesk")));
}

#[test]
fn a_private_tmpdir_of_the_users_own_is_used_before_the_home() {
    let roots = Roots::new();
    roots.home();
    let dir = resolve_as_user(&roots, |uid| roots.user_env(uid, Some(&roots.tmpdir))).unwrap();
    assert_eq!(dir, roots.tmpdir.join("boxdesk"));
}

#[test]
fn without_xdg_runtime_dir_or_home_the_error_says_to_set_xdg_runtime_dir() {
    let roots = Roots::new();
    let err = resolve_as_user(&roots, |uid| DirEnv {
        home: None,
        ..roots.user_env(uid, None)
    })
    .unwrap_err();
    assert!(err.contains("set XDG_RUNTIME_DIR"), "{err}");
}

#[test]
fn root_without_xdg_runtime_dir_uses_run_boxdesk() {
    if !is_root("be root") {
        return;
    }
    let roots = Roots::new();
    let env = roots.user_env(0, None);
    fs::create_dir(&env.run_root).unwrap();
    let dir = resolve_runtime_dir(&env).unwrap();
    assert_eq!(dir, env.run_root.join("boxdesk"));
    assert_eq!(mode(&dir), 0o700);
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
