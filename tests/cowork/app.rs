//! The real app finds and runs boxdesk: boxdesk started as
//! `cowork-linux-helper -socket PATH` is the helper; `boxdesk cowork
//! install` puts it in the place of the app's helper in a tree laid out
//! like the app's packages (and `status`, `uninstall`, an app update in
//! between, trees it must not or cannot change); `boxdesk cowork doctor`
//! explains the app's gate. The real binary throughout, no mocks.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

use super::client::{read_frame, write_frame, WAIT};
use crate::support::{bin, is_root, output, KillOnDrop, TestEnv};

/// The app's own helper in the test trees: a script that says so.
const ORIGINAL: &[u8] = b"#!/bin/sh\necho \"the app's own helper $*\"\nexit 7\n";

/// A tree laid out like the official package under `root`: its
/// `usr/lib/claude-desktop/resources/` with the helper and an `app.asar`.
fn official_tree(root: &Path) -> PathBuf {
    let res = root.join("usr/lib/claude-desktop/resources");
    fs::create_dir_all(&res).unwrap();
    fs::write(res.join("cowork-linux-helper"), ORIGINAL).unwrap();
    fs::set_permissions(
        res.join("cowork-linux-helper"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::write(res.join("app.asar"), b"asar").unwrap();
    res
}

/// Every file of `dir` with its bytes (links as `-> target`) and mode.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>, u32)> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let bytes = if m.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&p).unwrap().display()).into_bytes()
            } else {
                fs::read(&p).unwrap()
            };
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, bytes, m.permissions().mode())
        })
        .collect();
    v.sort();
    v
}

/// Starts `helper ARGS` in `env` and waits for `sock`; the server's log is
/// `log`.
fn start_helper(
    env: &TestEnv,
    helper: &Path,
    args: &[&std::ffi::OsStr],
    sock: &Path,
) -> KillOnDrop {
    let log = env.root().join("helper.log");
    let logf = fs::File::create(&log).unwrap();
    let child = Command::new(helper)
        .args(args)
        .env("XDG_RUNTIME_DIR", &env.xdg_runtime)
        .env("XDG_STATE_HOME", &env.xdg_state)
        .env("XDG_DATA_HOME", env.root().join("data"))
        .env("HOME", &env.home)
        .env_remove("BOXDESK_BACKEND")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("start the helper");
    let child = KillOnDrop(child);
    let deadline = Instant::now() + WAIT;
    while UnixStream::connect(sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "the helper did not bind: {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child
}

/// One one-shot `isRunning`, as the app sends it.
fn one_shot_is_running(sock: &Path) -> Value {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    write_frame(&mut s, &json!({"method": "isRunning"}));
    s.shutdown(std::net::Shutdown::Write).unwrap();
    read_frame(&mut s).expect("a reply")
}

#[test]
fn a_cowork_linux_helper_symlink_started_with_socket_serves_a_one_shot_is_running() {
    let env = TestEnv::new();
    let helper = env.root().join("cowork-linux-helper");
    std::os::unix::fs::symlink(bin(), &helper).unwrap();
    let sock = env.xdg_runtime.join("claude-cowork-vm.sock");
    let _h = start_helper(
        &env,
        &helper,
        &["-socket".as_ref(), sock.as_os_str()],
        &sock,
    );
    assert_eq!(
        one_shot_is_running(&sock),
        json!({"success": true, "result": {"running": false}})
    );
}

#[test]
fn the_community_bwrap_swap_starting_the_helper_with_a_script_path_first_is_served_too() {
    let env = TestEnv::new();
    let helper = env.root().join("cowork-linux-helper");
    std::os::unix::fs::symlink(bin(), &helper).unwrap();
    let sock = env.xdg_runtime.join("s.sock");
    let script = env.root().join("resources/cowork-vm-service.js");
    let _h = start_helper(
        &env,
        &helper,
        &[script.as_os_str(), "--socket".as_ref(), sock.as_os_str()],
        &sock,
    );
    assert_eq!(one_shot_is_running(&sock)["success"], true);
}

#[test]
fn the_helper_name_refuses_any_other_argument_with_its_usage() {
    let env = TestEnv::new();
    let helper = env.root().join("cowork-linux-helper");
    std::os::unix::fs::symlink(bin(), &helper).unwrap();
    for args in [&["cowork", "--socket", "/s"][..], &["-e", "1"], &[]] {
        let mut c = Command::new(&helper);
        c.args(args).stdin(Stdio::null());
        let out = output(c);
        assert_eq!(out.code(), 125, "{args:?}: {out}");
        assert!(
            out.stderr
                .contains("usage: cowork-linux-helper -socket PATH"),
            "{out}"
        );
    }
}

#[test]
fn install_into_the_official_layout_then_status_then_uninstall_restores_the_original_byte_for_byte()
{
    let env = TestEnv::new();
    let res = official_tree(env.root());
    let before = snapshot(&res);
    let app = env.root().join("usr/lib/claude-desktop");
    let app = app.to_str().unwrap();

    let out = env.run(["cowork", "install", "--app", app]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("(the official package)"), "{out}");
    assert!(
        out.stdout.contains(r#"isRunning with {"running":false}"#),
        "{out}"
    );
    let helper = res.join("cowork-linux-helper");
    assert!(fs::symlink_metadata(&helper)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::canonicalize(&helper).unwrap(),
        fs::canonicalize(bin()).unwrap()
    );
    assert_eq!(
        fs::read(res.join("cowork-linux-helper.boxdesk-orig")).unwrap(),
        ORIGINAL
    );
    let manifest: Value =
        serde_json::from_slice(&fs::read(res.join("cowork-linux-helper.boxdesk.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["bytes"], ORIGINAL.len());
    assert_eq!(manifest["sha256"].as_str().unwrap().len(), 64);

    // The installed helper is what the app will start: it serves.
    let sock = env.xdg_runtime.join("app.sock");
    let h = start_helper(
        &env,
        &helper,
        &["-socket".as_ref(), sock.as_os_str()],
        &sock,
    );
    assert_eq!(one_shot_is_running(&sock)["result"]["running"], false);
    drop(h);

    let out = env.run(["cowork", "status", "--app", app]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("state: installed"), "{out}");
    let out = env.run(["cowork", "status", "--app", app, "--json"]);
    let st: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(st["state"], "installed", "{st}");
    assert_eq!(st["original_ok"], true, "{st}");

    // Installing again changes nothing but says so.
    let out = env.run(["cowork", "install", "--app", app]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("already installed"), "{out}");

    let out = env.run(["cowork", "uninstall", "--app", app]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(snapshot(&res), before, "not restored byte for byte");
    let out = env.run(["cowork", "status", "--app", app]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stdout.contains("state: not installed"), "{out}");
    let out = env.run(["cowork", "uninstall", "--app", app]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("not installed"), "{out}");
}

#[test]
fn an_app_update_that_replaced_boxdesk_is_reported_and_install_keeps_the_new_helper() {
    let env = TestEnv::new();
    let res = official_tree(env.root());
    let app = res.to_str().unwrap();
    assert_eq!(env.run(["cowork", "install", "--app", app]).code(), 0);
    // The update writes its new helper over the link.
    let helper = res.join("cowork-linux-helper");
    let updated = b"#!/bin/sh\necho the updated helper\n";
    fs::remove_file(&helper).unwrap();
    fs::write(&helper, updated).unwrap();
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();

    let out = env.run(["cowork", "status", "--app", app]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stdout.contains("an app update replaced boxdesk"),
        "{out}"
    );
    let out = env.run(["cowork", "install", "--app", app]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("kept its new helper"), "{out}");
    assert_eq!(
        fs::read(res.join("cowork-linux-helper.boxdesk-orig")).unwrap(),
        updated,
        "the stale helper was kept instead of the new one"
    );
    assert_eq!(env.run(["cowork", "uninstall", "--app", app]).code(), 0);
    assert_eq!(fs::read(&helper).unwrap(), updated);
}

#[test]
fn uninstall_refuses_a_kept_helper_whose_checksum_changed_and_changes_nothing() {
    let env = TestEnv::new();
    let res = official_tree(env.root());
    let app = res.to_str().unwrap();
    assert_eq!(env.run(["cowork", "install", "--app", app]).code(), 0);
    fs::write(res.join("cowork-linux-helper.boxdesk-orig"), b"tampered").unwrap();
    let before = snapshot(&res);
    let out = env.run(["cowork", "uninstall", "--app", app]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(
        out.stderr.contains("does not match its recorded sha256"),
        "{out}"
    );
    assert_eq!(snapshot(&res), before);
    let out = env.run(["cowork", "status", "--app", app]);
    assert!(out.stdout.contains("MISSING OR CHANGED"), "{out}");
}

#[test]
fn a_tree_inside_an_appimage_is_refused_with_the_way_round_and_nothing_changes() {
    let env = TestEnv::new();
    // Where an AppImage's runtime mounts its image.
    let mount = tempfile::Builder::new()
        .prefix(".mount_bxt")
        .tempdir_in("/tmp")
        .unwrap();
    let res = official_tree(mount.path());
    let before = snapshot(&res);
    let out = env.run(["cowork", "install", "--app", res.to_str().unwrap()]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("is read-only"), "{out}");
    assert!(out.stderr.contains("inside a running AppImage"), "{out}");
    assert!(out.stderr.contains("--appimage-extract"), "{out}");
    assert!(out.stderr.contains("COWORK_NODE_PATH="), "{out}");
    assert_eq!(snapshot(&res), before);
    // An AppImage file named with --app: the same way round.
    let image = env.root().join("Claude-1.0.AppImage");
    fs::write(&image, b"\x7fELF").unwrap();
    let out = env.run(["cowork", "install", "--app", image.to_str().unwrap()]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("--appimage-extract"), "{out}");
}

#[test]
fn a_tree_on_a_read_only_mount_is_refused_with_the_way_round_and_nothing_changes() {
    if crate::support::skip_unless_root("a read-only bind mount needs root") {
        return;
    }
    let env = TestEnv::new();
    let res = official_tree(env.root());
    let before = snapshot(&res);
    let script = format!(
        "mount --bind {r} {r} && mount -o remount,bind,ro {r} && exec {b} cowork install --app {r}",
        r = res.display(),
        b = bin().display()
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env("HOME", &env.home)
        .stdin(Stdio::null());
    let out = output(c);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("mounted read-only"), "{out}");
    assert!(out.stderr.contains("sudo mount --bind"), "{out}");
    assert_eq!(snapshot(&res), before);
}

#[test]
fn a_directory_only_another_user_may_write_is_refused_asking_for_sudo_and_nothing_changes() {
    let env = TestEnv::new();
    let base = tempfile::Builder::new()
        .prefix("bxt-app")
        .tempdir_in("/tmp")
        .unwrap();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let res = official_tree(base.path());
    for d in ["usr", "usr/lib", "usr/lib/claude-desktop"] {
        fs::set_permissions(base.path().join(d), fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::set_permissions(&res, fs::Permissions::from_mode(0o555)).unwrap();
    let before = snapshot(&res);
    let mut c = Command::new(bin());
    c.args(["cowork", "install", "--app", res.to_str().unwrap()])
        .env("HOME", &env.home)
        .stdin(Stdio::null());
    if is_root() {
        // As root every directory is writable: ask as nobody.
        use std::os::unix::process::CommandExt;
        c.uid(65534).gid(65534).env("HOME", "/");
    }
    let out = output(c);
    if is_root()
        && out.stderr.contains("Permission denied")
        && !out.stderr.contains("writable only")
    {
        println!("skipped: nobody cannot run {}: {out}", bin().display());
        return;
    }
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("writable"), "{out}");
    assert!(
        out.stderr.contains(&format!(
            "sudo boxdesk cowork install --app {}",
            res.display()
        )),
        "{out}"
    );
    assert_eq!(snapshot(&res), before);
    fs::set_permissions(&res, fs::Permissions::from_mode(0o755)).unwrap();
}

/// `boxdesk cowork doctor --json --root ROOT` with a PATH of `ROOT`'s.
fn doctor_under(env: &TestEnv, root: &Path) -> (i32, Value) {
    let mut c = env.cmd(["cowork", "doctor", "--json", "--root"]);
    c.arg(root)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env_remove("COWORK_VM_BACKEND");
    let out = output(c);
    let v = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    (out.code(), v)
}

#[test]
fn cowork_doctor_json_without_qemu_or_virtiofsd_names_each_missing_item() {
    let env = TestEnv::new();
    let root = env.root().join("bare");
    fs::create_dir(&root).unwrap();
    let (code, v) = doctor_under(&env, &root);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["dials_helper"], false, "{v:#}");
    assert_eq!(v["gate"]["passes"], false);
    let items = v["gate"]["items"].as_array().unwrap();
    let failing: Vec<&str> = items
        .iter()
        .filter(|i| i["ok"] == false)
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    if std::env::consts::ARCH == "x86_64" || std::env::consts::ARCH == "aarch64" {
        assert_eq!(
            failing,
            ["qemu", "firmware", "virtiofsd", "kvm", "vhost-vsock"],
            "{v:#}"
        );
        let by = |n: &str| items.iter().find(|i| i["name"] == n).unwrap().clone();
        assert!(by("virtiofsd")["probed"]
            .to_string()
            .contains("/usr/libexec/virtiofsd"));
        assert!(by("virtiofsd")["probed"]
            .to_string()
            .contains("/usr/bin/virtiofsd"));
        assert!(by("qemu")["probed"][0]
            .as_str()
            .unwrap()
            .contains("qemu-system-"));
        assert!(by("qemu")["fix"].as_str().unwrap().contains("install it"));
        assert_eq!(by("kvm")["probed"], json!(["/dev/kvm"]));
    }
    assert_eq!(
        v["boxdesk"]["backend"],
        super::client::backend_word(),
        "{v:#}"
    );

    // The same root with everything the app probes: the gate passes.
    let put = |p: &str, mode: u32| {
        let f = root.join(p.trim_start_matches('/'));
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(&f, b"x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(mode)).unwrap();
    };
    put("/usr/bin/qemu-system-x86_64", 0o755);
    put("/usr/bin/qemu-system-aarch64", 0o755);
    put("/usr/share/OVMF/OVMF_CODE.fd", 0o644);
    put("/usr/share/AAVMF/AAVMF_CODE.fd", 0o644);
    put("/usr/bin/virtiofsd", 0o755);
    put("/dev/kvm", 0o666);
    put("/dev/vhost-vsock", 0o666);
    let (_, v) = doctor_under(&env, &root);
    if std::env::consts::ARCH == "x86_64" || std::env::consts::ARCH == "aarch64" {
        assert_eq!(v["gate"]["passes"], true, "{v:#}");
        assert_eq!(v["dials_helper"], true, "{v:#}");
    }
}

#[test]
fn cowork_doctor_says_in_words_why_the_app_will_not_dial_and_how_to_fix_it() {
    let env = TestEnv::new();
    let root = env.root().join("bare");
    fs::create_dir(&root).unwrap();
    let mut c = env.cmd(["cowork", "doctor", "--root"]);
    c.arg(&root)
        .env("PATH", "/usr/bin:/bin")
        .env_remove("COWORK_VM_BACKEND");
    let out = output(c);
    assert_eq!(out.code(), 1, "{out}");
    assert!(out.stdout.contains("FAIL virtiofsd"), "{out}");
    assert!(out.stdout.contains("fix: "), "{out}");
    assert!(out.stdout.contains("will NOT start any helper"), "{out}");
    let serves = format!(
        "boxdesk: serves it on the {} backend",
        super::client::backend_word()
    );
    assert!(out.stdout.contains(&serves), "{out}");
}

#[test]
fn a_link_to_boxdesk_made_by_hand_is_reported_and_install_refuses_to_lose_the_apps_helper() {
    let env = TestEnv::new();
    let res = official_tree(env.root());
    let helper = res.join("cowork-linux-helper");
    fs::remove_file(&helper).unwrap();
    std::os::unix::fs::symlink(bin(), &helper).unwrap();
    let before = snapshot(&res);
    let app = res.to_str().unwrap();
    let out = env.run(["cowork", "status", "--app", app]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(
        out.stdout.contains("not made by `boxdesk cowork install`"),
        "{out}"
    );
    let out = env.run(["cowork", "install", "--app", app]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("already runs boxdesk"), "{out}");
    assert!(out.stderr.contains("reinstall the app"), "{out}");
    assert_eq!(snapshot(&res), before);
}

#[test]
fn uninstall_keeps_the_apps_helper_when_a_dangling_link_is_in_its_place() {
    let env = TestEnv::new();
    let res = official_tree(env.root());
    let app = res.to_str().unwrap();
    assert_eq!(env.run(["cowork", "install", "--app", app]).code(), 0);
    let helper = res.join("cowork-linux-helper");
    fs::remove_file(&helper).unwrap();
    std::os::unix::fs::symlink(env.root().join("gone/boxdesk"), &helper).unwrap();
    let before = snapshot(&res);
    let out = env.run(["cowork", "uninstall", "--app", app]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("not a regular file"), "{out}");
    assert_eq!(snapshot(&res), before, "the kept helper was dropped");
    assert_eq!(
        fs::read(res.join("cowork-linux-helper.boxdesk-orig")).unwrap(),
        ORIGINAL
    );
}

#[test]
fn as_root_a_directory_another_user_can_change_is_refused_and_nothing_changes() {
    if crate::support::skip_unless_root("a directory another uid owns needs root") {
        return;
    }
    let env = TestEnv::new();
    let res = official_tree(env.root());
    std::os::unix::fs::chown(&res, Some(65534), Some(65534)).unwrap();
    let before = snapshot(&res);
    let app = res.to_str().unwrap();
    let mut c = env.cmd(["cowork", "install", "--app", app]);
    c.env_remove("SUDO_UID");
    let out = output(c);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("owned by uid 65534"), "{out}");
    assert!(out.stderr.contains("without sudo"), "{out}");
    assert_eq!(snapshot(&res), before);
    // The same tree, root's again: installed.
    std::os::unix::fs::chown(&res, Some(0), Some(0)).unwrap();
    let mut c = env.cmd(["cowork", "install", "--app", app]);
    c.env_remove("SUDO_UID");
    let out = output(c);
    assert_eq!(out.code(), 0, "{out}");
}
