use super::*;

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
        use std::os::unix::fs::PermissionsExt;
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
    std::os::unix::fs::symlink(outside.path(), t.path().join("link")).unwrap();
    std::fs::create_dir(t.path().join("real")).unwrap();
    std::os::unix::fs::symlink("../real", t.path().join("real/up")).unwrap();
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
    std::os::unix::fs::symlink("f", t.path().join("l")).unwrap();
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
