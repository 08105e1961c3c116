//! `run --share` on the namespace backend (a bind mount): read and write,
//! `:ro`, `info`, refusals, and nothing set-id reaching the host — as root
//! (the share is id-mapped) and as a user.

use std::os::unix::fs::PermissionsExt;

use crate::support::TestEnv;

use crate::support::shares::shared_dir;

#[test]
fn a_shared_dir_is_read_and_written_and_what_the_sandbox_creates_is_the_callers() {
    let env = TestEnv::new();
    let dir = shared_dir(&env);
    crate::support::shares::reads_and_writes(&env, "namespace", &dir);
}

#[test]
fn a_read_only_share_gives_erofs_and_leaves_the_host_file_alone() {
    let env = TestEnv::new();
    let dir = shared_dir(&env);
    crate::support::shares::read_only_gives_erofs(&env, "namespace", &dir);
}

#[test]
fn the_guest_path_defaults_to_the_host_path_and_info_lists_every_share() {
    let env = TestEnv::new();
    let dir = shared_dir(&env);
    let other = env.root().join("other dir");
    std::fs::create_dir(&other).unwrap();
    let a = dir.display().to_string();
    let b = format!("{}:/mnt/o:ro", other.display());
    let sb = env.start(
        "shr1",
        &["--backend", "namespace", "--share", &a, "--share", &b],
    );
    let canon = dir.canonicalize().unwrap();
    assert_eq!(
        sb.sh(&format!("cat {}/in", canon.display())).stdout,
        "from the host\n"
    );
    let info = env.info("shr1");
    let shares = &info["shares"];
    assert!(
        shares.contains(&format!("{}:{}:rw", canon.display(), canon.display())),
        "{shares}"
    );
    assert!(shares.contains("%20dir:/mnt/o:ro"), "{shares}");
}

#[test]
fn bad_shares_are_refused_before_anything_starts() {
    let env = TestEnv::new();
    let dir = shared_dir(&env);
    let d = dir.display();
    for (share, why) in [
        (format!("{d}/missing:/mnt/x"), "No such file"),
        (format!("{d}:mnt"), "not absolute"),
        (format!("{d}:/mnt/../etc"), "`..`"),
        (format!("{d}:/proc/x"), "/proc"),
        (format!("{d}:/"), "the root"),
        (format!("{d}:/a:/b"), "HOST[:GUEST][:ro]"),
    ] {
        let out = env.run([
            "run",
            "--backend",
            "namespace",
            "--share",
            &share,
            "--",
            "true",
        ]);
        assert_ne!(out.code(), 0, "{share}: {out}");
        assert!(out.stderr.contains(why), "{share}: {out}");
    }
    assert_eq!(
        std::fs::read_dir(env.runtime())
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
}

#[test]
fn setuid_bits_and_device_nodes_never_reach_the_host_through_a_share() {
    let env = TestEnv::new();
    let dir = shared_dir(&env);
    let share = format!("{}:/mnt/d", dir.display());
    // openat2(AT_FDCWD, "/mnt/d/o2", {O_CREAT|O_WRONLY, 06755}), its result
    // and errno printed.
    let openat2 = "import ctypes, os, struct; libc = ctypes.CDLL(None, use_errno=True); \
        how = struct.pack('QQQ', os.O_CREAT | os.O_WRONLY, 0o6755, 0); \
        r = libc.syscall(437, -100, b'/mnt/d/o2', how, len(how)); \
        print('openat2', r, ctypes.get_errno())";
    let script = format!(
        "cp /bin/sh /mnt/d/sh; chmod u+s /mnt/d/sh; chmod g+s /mnt/d/sh; \
         mknod /mnt/d/dev c 1 3; mkfifo /mnt/d/fifo; python3 -c \"{openat2}\"; echo done"
    );
    let out = env.run([
        "run",
        "--backend",
        "namespace",
        "--share",
        &share,
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert!(out.stdout.contains("done"), "{out}");
    // openat2 keeps its mode where seccomp cannot read it: it is answered
    // ENOSYS (38), so libc falls back to openat, whose mode is checked.
    assert!(
        out.stdout.contains("openat2 -1 38\n"),
        "openat2 was not answered ENOSYS: {out}"
    );
    assert!(
        !dir.join("o2").exists(),
        "openat2 created a file in the share"
    );
    let mode = std::fs::metadata(dir.join("sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "a set-id bit reached the host: {mode:o}");
    assert!(!dir.join("dev").exists(), "a device node reached the host");
    assert!(dir.join("fifo").exists());
}

#[test]
fn root_host_is_the_namespace_backends_own_root() {
    let env = TestEnv::new();
    let out = env.run([
        "run",
        "--backend",
        "namespace",
        "--root",
        "host",
        "--",
        "sh",
        "-c",
        "test -x /bin/sh && echo ok",
    ]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "ok\n");
}
