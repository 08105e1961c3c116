//! Host folders in real microVMs (virtio-fs, `--share`, `--root host`), in
//! the nested L1 on both arches. The big sizes (a 512 MiB file,
//! 10,000 small files) run with `BOXDESK_FS_FULL=1` in an L1 with room for
//! two such files in its tmpfs besides the VM:
//! `BOXDESK_FS_FULL=1 tests/nested/cargo-test.sh ARCH --mem 4096 -p boxdesk
//! --test tests -- vm::fs::big`. CI runs 8 MiB and 200 files, the same code
//! paths in a fraction of the nested minutes.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use super::{can_boot, kvm_env};

fn sizes() -> (u32, u32) {
    if std::env::var_os("BOXDESK_FS_FULL").is_some_and(|v| v == "1") {
        (512, 10_000)
    } else {
        (8, 200)
    }
}

/// `sh -c SCRIPT` in the sandbox, with a nested-TCG-sized deadline under
/// the suite's own (scripts/test-nested.sh): past it, the test fails with
/// what the VMM logged.
fn sh_long(sb: &crate::support::Started<'_>, script: &str) -> crate::support::Out {
    let limit = Duration::from_secs(if sizes().1 > 200 { 3600 } else { 420 });
    let mut cmd = sb
        .env
        .cmd(["exec", sb.name.as_str(), "--", "sh", "-c", script]);
    cmd.stdout(std::process::Stdio::piped());
    cmd.stderr(std::process::Stdio::piped());
    crate::support::wait_output_until(cmd.spawn().unwrap(), limit).unwrap_or_else(|| {
        panic!(
            "not done within {limit:?}: {script}\n{}",
            sb.log_tail(8 << 10)
        )
    })
}

/// Whether two files hold the same bytes, read in 1 MiB pieces: L1 holds
/// big ones in RAM, and a debug-built hash runs at a few MB/s under TCG.
fn same_bytes(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::io::Read;
    let (mut a, mut b) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = a.read(&mut x).unwrap();
        if n == 0 {
            return b.read(&mut y).unwrap() == 0;
        }
        if b.read_exact(&mut y[..n]).is_err() || x[..n] != y[..n] {
            return false;
        }
    }
}

#[test]
fn a_shared_dir_is_read_and_written_and_a_read_only_share_gives_erofs() {
    if !can_boot("a_shared_dir_is_read_and_written_and_a_read_only_share_gives_erofs") {
        return;
    }
    let env = kvm_env();
    let dir = crate::support::shares::shared_dir(&env);
    crate::support::shares::reads_and_writes(&env, "kvm", &dir);
    crate::support::shares::read_only_gives_erofs(&env, "kvm", &dir);
}

#[test]
fn big_and_small_files_links_renames_mmap_and_escape_attempts_through_a_share() {
    let name = "big_and_small_files_links_renames_mmap_and_escape_attempts_through_a_share";
    if !can_boot(name) {
        return;
    }
    let (mib, files) = sizes();
    let env = kvm_env();
    let dir = env.root().join("share");
    std::fs::create_dir(&dir).unwrap();
    let t0 = Instant::now();
    let sb = env.start(
        "fs1",
        &[
            "--backend",
            "kvm",
            "--mem",
            "1024",
            "--share",
            &format!("{}:/mnt/d", dir.display()),
        ],
    );
    let info = env.info("fs1");
    assert_eq!(info["isolation"], "vm");
    assert!(info["shares"].contains(":/mnt/d:rw"), "{info:?}");

    // Big file, guest → host and host → guest. The guest writes random
    // bytes and copies them through the share (the copy reads its own page
    // cache: what the guest meant to write); the host copies that file and
    // the guest copies it back (read from the host). The host compares each
    // pair; each goes once compared, so L1's tmpfs holds two at most.
    let out = sh_long(
        &sb,
        &format!(
            "dd if=/dev/urandom of=/mnt/d/big bs=1M count={mib} 2>/dev/null && cp /mnt/d/big /mnt/d/big.copy"
        ),
    );
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        std::fs::metadata(dir.join("big")).unwrap().len(),
        u64::from(mib) << 20
    );
    assert!(
        same_bytes(&dir.join("big"), &dir.join("big.copy")),
        "what the guest wrote reached the host changed"
    );
    std::fs::remove_file(dir.join("big.copy")).unwrap();
    std::fs::rename(dir.join("big"), dir.join("back")).unwrap();
    let out = sh_long(&sb, "cp /mnt/d/back /mnt/d/back.copy");
    assert_eq!(out.code(), 0, "{out}");
    assert!(
        same_bytes(&dir.join("back"), &dir.join("back.copy")),
        "what the guest read from the host came back changed"
    );
    for f in ["back", "back.copy"] {
        std::fs::remove_file(dir.join(f)).unwrap();
    }
    println!("{name}: {mib} MiB each way at {:?}", t0.elapsed());

    // Small files: created, listed, renamed (one `mv` renames them all into
    // another directory: no fork per file under nested TCG), removed.
    let out = sh_long(
        &sb,
        &format!(
            "set -e; mkdir /mnt/d/many /mnt/d/moved; cd /mnt/d/many; i=0; \
         while [ $i -lt {files} ]; do echo $i > f$i; i=$((i+1)); done; \
         ls | wc -l; mv f* ../moved/; ls ../moved | grep -c '^f'; \
         rm ../moved/f*; ls ../moved ../many | grep -c '^f' || true"
        ),
    );
    assert_eq!(out.code(), 0, "{out}");
    let counts: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(
        counts,
        [files.to_string().as_str(), &files.to_string(), "0"],
        "{out}"
    );
    println!("{name}: {files} small files at {:?}", t0.elapsed());

    // Hard links, rename over, unlink of an open file, mmap (exec) of a
    // shared file. The file server links with linkat(AT_EMPTY_PATH), which
    // Linux before 6.10 allows only with CAP_DAC_READ_SEARCH: a user's VM
    // there cannot hard-link in a share (docs/STATUS.md).
    let links = nix::unistd::geteuid().is_root() || kernel_at_least(6, 10);
    if !links {
        println!("skipped: {name}: hard links as a user need Linux 6.10 (fuse-backend-rs links with linkat(AT_EMPTY_PATH))");
    }
    let out = sb.sh(&format!(
        "set -e; cd /mnt/d; echo a > a; {} echo b > b; mv b a; cat a hard; \
         echo open > o; exec 3<o; rm o; cat <&3; \
         cp /bin/busybox busybox; ./busybox echo mapped",
        if links { "ln a hard;" } else { "cp a hard;" }
    ));
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "b\na\nopen\nmapped\n", "{out}");
    assert_eq!(std::fs::read_to_string(dir.join("hard")).unwrap(), "a\n");
    assert!(!dir.join("o").exists());

    // Escapes: a symlink to /etc made in the share and used from another
    // path, `..`, a rename of the share root, a FIFO, a device node, setuid.
    let out = sb.sh("cd /mnt/d; ln -s /etc esc; mkdir sub; cd sub; \
         echo x > ../esc/boxdesk-escape-probe; cat ../../d/esc/hostname >/dev/null; \
         cat ../../../etc/hostname >/dev/null; \
         mv /mnt/d /mnt/moved 2>&1 | head -1; \
         mkfifo /mnt/d/fifo && echo fifo-ok; \
         mknod /mnt/d/dev c 1 3 2>&1 || echo mknod-refused; \
         cp /bin/busybox /mnt/d/suid; chmod 4755 /mnt/d/suid; echo done");
    assert!(out.stdout.contains("fifo-ok"), "{out}");
    assert!(out.stdout.contains("mknod-refused"), "{out}");
    assert!(out.stdout.contains("done"), "{out}");
    assert!(
        !std::path::Path::new("/etc/boxdesk-escape-probe").exists(),
        "the host's /etc was written"
    );
    assert_eq!(
        std::fs::read_link(dir.join("esc")).unwrap(),
        std::path::Path::new("/etc")
    );
    assert!(!dir.join("dev").exists(), "a device node reached the host");
    let mode = std::fs::metadata(dir.join("suid"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o6000, 0, "setuid reached the host: {mode:o}");
    assert!(dir.join("hard").exists(), "the share root moved");
    assert!(sb.sh("ls /mnt/d/hard").code() == 0);
}

#[test]
fn root_host_runs_the_hosts_own_binaries_inside_a_vm() {
    if !can_boot("root_host_runs_the_hosts_own_binaries_inside_a_vm") {
        return;
    }
    if !crate::support::is_root() {
        println!("skipped: root_host_runs_the_hosts_own_binaries_inside_a_vm: writes a probe into the host's /usr/bin");
        return;
    }
    let env = kvm_env();
    // A program only the host has: python3 where installed, and a probe
    // script written into this host's /usr/bin for the test.
    let probe = std::path::Path::new("/usr/bin/boxdesk-root-host-probe");
    std::fs::write(probe, "#!/bin/sh\necho host-probe \"$@\"\n").unwrap();
    std::fs::set_permissions(probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    struct Remove<'a>(&'a std::path::Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(probe);
    let python = std::path::Path::new("/usr/bin/python3").exists();
    let script = if python {
        "boxdesk-root-host-probe 1; python3 -c 'print(1)'; touch /usr/x 2>&1; echo w > /work/w; cat /work/w"
    } else {
        "boxdesk-root-host-probe 1; echo 1; touch /usr/x 2>&1; echo w > /work/w; cat /work/w"
    };
    let sb = env.start("rh1", &["--backend", "kvm", "--root", "host"]);
    let info = env.info("rh1");
    assert_eq!(info["isolation"], "vm");
    assert_eq!(info["rootfs"], "host");
    let out = sb.sh(script);
    assert!(out.stdout.starts_with("host-probe 1\n1\n"), "{out}");
    assert!(out.stdout.contains("Read-only file system"), "{out}");
    assert!(out.stdout.ends_with("w\n"), "{out}");
    assert!(!std::path::Path::new("/usr/x").exists());
    let state = env.state_of("rh1");
    assert_eq!(
        std::fs::read_to_string(state.join("work/w")).unwrap(),
        "w\n"
    );
}

#[test]
fn an_exec_still_answers_while_another_hammers_the_share() {
    if !can_boot("an_exec_still_answers_while_another_hammers_the_share") {
        return;
    }
    let env = kvm_env();
    let dir = env.root().join("share");
    std::fs::create_dir(&dir).unwrap();
    let sb = env.start(
        "fs2",
        &[
            "--backend",
            "kvm",
            "--share",
            &format!("{}:/mnt/d", dir.display()),
        ],
    );
    let mut hammer = env.cmd([
        "exec",
        "fs2",
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 50 ]; do dd if=/dev/zero of=/mnt/d/h$((i%4)) bs=64k count=16 2>/dev/null; \
         cat /mnt/d/h$((i%4)) >/dev/null; ls /mnt/d >/dev/null; i=$((i+1)); done; echo hammered",
    ]);
    hammer.stdout(std::process::Stdio::piped());
    hammer.stderr(std::process::Stdio::piped());
    let hammer = hammer.spawn().unwrap();
    for _ in 0..5 {
        let t = Instant::now();
        let out = sb.exec(&["echo", "alive"]);
        assert_eq!(out.stdout, "alive\n", "{out}");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "an exec took {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = crate::support::wait_output_within(hammer, Duration::from_secs(900));
    assert!(out.stdout.contains("hammered"), "{out}");
}

#[test]
fn a_share_goes_through_its_dax_window_and_a_file_shrunk_on_the_host_does_not_end_the_vm() {
    let name =
        "a_share_goes_through_its_dax_window_and_a_file_shrunk_on_the_host_does_not_end_the_vm";
    if !can_boot(name) {
        return;
    }
    let env = kvm_env();
    let dir = env.root().join("share");
    std::fs::create_dir(&dir).unwrap();
    let pattern: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.join("f"), &pattern).unwrap();
    let sb = env.start(
        "fs3",
        &[
            "--backend",
            "kvm",
            "--share",
            &format!("{}:/mnt/d", dir.display()),
        ],
    );
    // Mounted with DAX; a read maps the host file into the window and a
    // copy of it is the same bytes; an overwrite in place (not extending
    // the file) is a store into the host's page cache.
    let out = sh_long(
        &sb,
        "set -e; grep -c ' /mnt/d virtiofs .*dax=always' /proc/mounts; cd /mnt/d; \
         cp f f.copy; dd if=/dev/zero of=f bs=4096 count=1 conv=notrunc 2>/dev/null; echo ok",
    );
    assert_eq!(out.stdout, "1\nok\n", "{out}");
    let host = std::fs::read(dir.join("f")).unwrap();
    assert!(
        host[..4096].iter().all(|&b| b == 0),
        "the DAX store missed the host file"
    );
    assert_eq!(host[4096..], pattern[4096..]);
    assert!(
        std::fs::read(dir.join("f.copy")).unwrap() == pattern,
        "a copy read through the window differs from the host file"
    );

    // The guest reads the file (its pages mapped in the window, its size
    // cached), the host shrinks it, the guest reads again at once: pages
    // past the new end are no longer the host's to give, and the VMM backs
    // them with zeros instead of ending the VM.
    let mut reader = env.cmd([
        "exec",
        "fs3",
        "--",
        "sh",
        "-c",
        "cd /mnt/d; cat f >/dev/null; : > ready; while [ ! -e go ]; do :; done; \
         dd if=f bs=1M 2>/dev/null | wc -c; echo survived",
    ]);
    reader.stdout(std::process::Stdio::piped());
    reader.stderr(std::process::Stdio::piped());
    let reader = reader.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    while !dir.join("ready").exists() {
        assert!(Instant::now() < deadline, "the guest never read the file");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("f"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    std::fs::write(dir.join("go"), b"").unwrap();
    let out = crate::support::wait_output_within(reader, Duration::from_secs(300));
    assert!(
        out.stdout.ends_with("survived\n"),
        "{out}\n{}",
        sb.log_tail(4 << 10)
    );
    let out = sb.exec(&["echo", "alive"]);
    assert_eq!(out.stdout, "alive\n", "{out}");
}

/// Whether the running kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}
