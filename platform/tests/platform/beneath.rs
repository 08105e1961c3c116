//! `beneath`: both resolvers (openat2 and the component walk) against
//! real directories, symlinks and FIFOs.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use boxdesk_platform::beneath::{components, Beneath, PathError};
use nix::sys::stat::Mode;

/// Both resolvers: the kernel's openat2 and the component walk.
fn roots(dir: &Path) -> [Beneath; 2] {
    [
        Beneath::open(dir).unwrap(),
        Beneath::open(dir).unwrap().without_openat2(),
    ]
}

fn comps(p: &str) -> Vec<&[u8]> {
    components(p.as_bytes()).unwrap()
}

#[test]
fn a_leading_slash_dots_and_empty_components_name_paths_beneath_the_root() {
    assert_eq!(comps("/etc//x/./y"), vec![&b"etc"[..], b"x", b"y"]);
    assert!(comps("/").is_empty());
    assert!(matches!(components(b"a/../b"), Err(PathError::DotDot)));
    assert!(matches!(components(b"../x"), Err(PathError::DotDot)));
    assert!(matches!(components(b"a\0b"), Err(PathError::Nul)));
}

#[test]
fn missing_directories_are_created_beneath_the_root_with_mode_0755() {
    let t = tempfile::tempdir().unwrap();
    for (i, b) in roots(t.path()).iter().enumerate() {
        let name = format!("new{i}/a/b");
        b.dir(&comps(&name), true).unwrap();
        let meta = std::fs::metadata(t.path().join(&name)).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o755 & !current_umask());
    }
}

fn current_umask() -> u32 {
    // SAFETY: umask has no memory arguments; it is set straight back.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    }
}

#[test]
fn a_symlinked_directory_component_is_refused_by_both_resolvers() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), t.path().join("link")).unwrap();
    std::fs::create_dir(t.path().join("real")).unwrap();
    symlink("../real", t.path().join("real/up")).unwrap();
    for b in roots(t.path()) {
        for p in ["link", "link/x", "real/up/y"] {
            let r = b.dir(&comps(p), true);
            assert!(matches!(r, Err(PathError::Symlink)), "{p}: {:?}", r.err());
        }
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }
}

#[test]
fn only_regular_files_open_for_reading_and_a_symlink_target_is_refused() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("f"), b"hello").unwrap();
    symlink("f", t.path().join("l")).unwrap();
    std::fs::create_dir(t.path().join("d")).unwrap();
    nix::unistd::mkfifo(&t.path().join("p"), Mode::from_bits_truncate(0o644)).unwrap();
    for b in roots(t.path()) {
        let r = b.regular(&comps("/f")).unwrap();
        assert_eq!(r.size, 5);
        assert!(matches!(b.regular(&comps("l")), Err(PathError::Symlink)));
        assert!(matches!(
            b.regular(&comps("d")),
            Err(PathError::NotRegular { .. })
        ));
        assert!(matches!(
            b.regular(&comps("p")),
            Err(PathError::NotRegular { .. })
        ));
        assert!(matches!(b.regular(&comps("/")), Err(PathError::IsRoot)));
        let missing = b.regular(&comps("nope")).err().unwrap().to_string();
        assert!(missing.starts_with("ENOENT: "), "{missing}");
    }
}

#[test]
fn a_new_file_is_created_beneath_the_root_with_its_mode_and_an_old_one_truncated() {
    let t = tempfile::tempdir().unwrap();
    fs::create_dir(t.path().join("d")).unwrap();
    for (i, b) in roots(t.path()).iter().enumerate() {
        let name = format!("d/f{i}");
        let mut f = b.create_file(&comps(&name), 0o640).unwrap();
        f.write_all(b"long contents").unwrap();
        drop(f);
        let mode = fs::metadata(t.path().join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640 & !current_umask());
        let mut f = b.create_file(&comps(&name), 0o600).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(fs::read(t.path().join(&name)).unwrap(), b"x");
    }
}

#[test]
fn creating_through_a_symlinked_directory_or_onto_a_symlink_writes_nothing_outside() {
    let t = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("victim"), b"keep").unwrap();
    symlink(outside.path(), t.path().join("sub")).unwrap();
    symlink(outside.path().join("victim"), t.path().join("file")).unwrap();
    for b in roots(t.path()) {
        for p in ["sub/victim", "sub/new", "file"] {
            let r = b.create_file(&comps(p), 0o644);
            assert!(matches!(r, Err(PathError::Symlink)), "{p}: {:?}", r.err());
        }
    }
    assert_eq!(fs::read(outside.path().join("victim")).unwrap(), b"keep");
    assert!(!outside.path().join("new").exists());
}

#[test]
fn a_fifo_at_the_target_is_refused_without_waiting_for_a_reader() {
    let t = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&t.path().join("p"), Mode::from_bits_truncate(0o644)).unwrap();
    for b in roots(t.path()) {
        let r = b.create_file(&comps("p"), 0o644);
        assert!(r.is_err(), "a FIFO opened as a file");
    }
}

#[test]
fn a_component_that_is_not_one_plain_name_is_refused_by_both_resolvers() {
    let t = tempfile::tempdir().unwrap();
    fs::create_dir(t.path().join("d")).unwrap();
    for b in roots(t.path()) {
        for bad in [
            &[&b"d"[..], b".."][..],
            &[b".."],
            &[b"."],
            &[b""],
            &[b"d/x"],
        ] {
            assert!(b.dir(bad, true).is_err(), "{bad:?}");
            assert!(b.create_file(&[bad, &[&b"f"[..]]].concat(), 0o644).is_err());
            assert!(b
                .create_file(&[&[&b"d"[..]][..], bad].concat(), 0o644)
                .is_err());
        }
    }
    assert_eq!(fs::read_dir(t.path()).unwrap().count(), 1);
    assert!(!t.path().join("d/x").exists());
}
