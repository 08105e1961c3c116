//! `boxdesk cp NAME:SRC DST`: what is written beneath DST never goes
//! through a symlink already there, while DST itself may be one the user
//! chose.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use crate::support::TestEnv;

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

fn is_empty(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().next().is_none()
}

#[test]
fn cp_r_through_a_symlinked_directory_inside_dst_is_refused_and_nothing_lands_outside() {
    let env = TestEnv::new();
    let sb = env.start("cpsym", &[]);
    let made = sb.sh(
        "mkdir -p /work/tree/sub && echo inside > /work/tree/sub/file && echo top > /work/tree/top.txt",
    );
    assert_eq!(made.code(), 0, "{made}");
    let outside = env.root().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("victim"), "keep\n").unwrap();

    // DST/tree/sub -> outside: a directory on the way is a symlink.
    let dst = env.root().join("dst");
    fs::create_dir_all(dst.join("tree")).unwrap();
    symlink(&outside, dst.join("tree/sub")).unwrap();
    let out = env.run(["cp", "-r", "cpsym:/work/tree", &s(&dst)]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stderr.contains(&s(&dst.join("tree/sub"))) && out.stderr.contains("symlink"),
        "{out}"
    );
    assert!(!outside.join("file").exists(), "written through the link");
    assert_eq!(
        fs::read_to_string(dst.join("tree/top.txt")).unwrap(),
        "top\n"
    );

    // DST/tree -> outside: the tree's own directory is a symlink.
    let dst2 = env.root().join("dst2");
    fs::create_dir(&dst2).unwrap();
    symlink(&outside, dst2.join("tree")).unwrap();
    let out = env.run(["cp", "-r", "cpsym:/work/tree", &s(&dst2)]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("symlink"), "{out}");

    // DST/tree/top.txt -> outside/victim: the file itself is a symlink.
    let dst3 = env.root().join("dst3");
    fs::create_dir_all(dst3.join("tree")).unwrap();
    symlink(outside.join("victim"), dst3.join("tree/top.txt")).unwrap();
    let out = env.run(["cp", "-r", "cpsym:/work/tree", &s(&dst3)]);
    assert_eq!(out.code(), 1, "{out}");
    assert_eq!(
        fs::read_to_string(dst3.join("tree/sub/file")).unwrap(),
        "inside\n"
    );

    // One file into a directory holding a symlink of its name.
    let dst4 = env.root().join("dst4");
    fs::create_dir(&dst4).unwrap();
    symlink(outside.join("victim"), dst4.join("top.txt")).unwrap();
    let out = env.run(["cp", "cpsym:/work/tree/top.txt", &s(&dst4)]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stderr.contains("symlink"), "{out}");

    assert_eq!(
        fs::read_to_string(outside.join("victim")).unwrap(),
        "keep\n"
    );
    let names: Vec<_> = fs::read_dir(&outside).unwrap().flatten().collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn a_dst_that_is_itself_a_symlink_is_the_users_choice_and_is_followed() {
    let env = TestEnv::new();
    let sb = env.start("cpdst", &[]);
    let made =
        sb.sh("mkdir -p /work/tree/a/b && echo deep > /work/tree/a/b/f && echo one > /work/one");
    assert_eq!(made.code(), 0, "{made}");
    let real = env.root().join("real");
    fs::create_dir(&real).unwrap();
    let link = env.root().join("link");
    symlink(&real, &link).unwrap();
    let out = env.run(["cp", "-r", "cpdst:/work/tree", &s(&link)]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        fs::read_to_string(real.join("tree/a/b/f")).unwrap(),
        "deep\n"
    );
    let out = env.run(["cp", "cpdst:/work/one", &s(&link)]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(fs::read_to_string(real.join("one")).unwrap(), "one\n");

    // A new DST is created; an existing tree is copied into again.
    let fresh = env.root().join("fresh");
    let out = env.run(["cp", "-r", "cpdst:/work/tree", &s(&fresh)]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(fs::read_to_string(fresh.join("a/b/f")).unwrap(), "deep\n");
    let out = env.run(["cp", "-r", "cpdst:/work/tree", &s(&fresh)]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        fs::read_to_string(fresh.join("tree/a/b/f")).unwrap(),
        "deep\n"
    );
    assert!(!is_empty(&fresh));
}
