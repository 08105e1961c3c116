//! What clients we did not write send, and what the app expects back: a
//! guest response nobody waits for, sizes and counts as any JSON number,
//! `null` for anything optional, `configure`'s `logDir`, `fatal` on the
//! `error` events of a sandbox that dies or cannot start, and `createVM`'s
//! `diskSizeGB` as the quota `getSessionsDiskInfo` reports.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{Cowork, WAIT};

#[test]
fn a_late_guest_response_is_accepted() {
    let c = Cowork::start();
    let r = c.one_shot("sendGuestResponse", json!({"id": 99, "resultJson": "{}"}));
    assert_eq!(r, json!({"success": true, "result": {}}), "{}", c.log());
    let mut p = c.pipe("late");
    let r = p.call(
        "sendGuestResponse",
        json!({"id": "req-7", "error": "timed out"}),
    );
    assert_eq!(r["success"], true, "{r}");
    assert!(!c.log().contains("sendGuestResponse failed"), "{}", c.log());
}

#[test]
fn sizes_and_counts_accept_any_json_number_and_fractions_round_down() {
    let c = Cowork::start();
    let mut p = c.pipe("num");
    let r = p.call("configure", json!({"memoryMB": 512.9, "cpuCount": 2.0}));
    assert_eq!(r["success"], true, "{r}");
    let r = p.call("startVM", json!({"cpuCount": 1.5}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    let name = super::kept_sandbox_of(&c, "num");
    let info = c.env.info(&name);
    assert_eq!(
        info.get("mem_mib").map(String::as_str),
        Some("512"),
        "{info:?}"
    );
    for (method, params) in [
        ("getSessionsDiskInfo", json!({"lowWaterBytes": 1.0e9})),
        (
            "pruneSessionCaches",
            json!({"onlyIfFreeBytesBelow": 1.5, "sessionTmpOlderThanSeconds": 10.9, "includeSessionTmp": true}),
        ),
        ("createVM", json!({"diskSizeGB": 64, "bundlePath": "/b"})),
    ] {
        let r = p.call(method, params);
        assert_eq!(r["success"], true, "{method}: {r}");
    }
}

#[test]
fn a_negative_size_or_count_is_refused_naming_its_field() {
    let c = Cowork::start();
    let mut p = c.pipe("neg");
    for (method, field, params) in [
        ("configure", "memoryMB", json!({"memoryMB": -1})),
        ("configure", "cpuCount", json!({"cpuCount": -0.5})),
        ("createVM", "diskSizeGB", json!({"diskSizeGB": -2})),
        (
            "getSessionsDiskInfo",
            "lowWaterBytes",
            json!({"lowWaterBytes": -5}),
        ),
        (
            "pruneSessionCaches",
            "onlyIfFreeBytesBelow",
            json!({"onlyIfFreeBytesBelow": -1}),
        ),
        ("startVM", "cpuCount", json!({"cpuCount": "two"})),
    ] {
        let r = p.call(method, params);
        assert_eq!(r["success"], false, "{method}: {r}");
        let e = r["error"].as_str().unwrap();
        assert!(
            e.contains(field),
            "{method}: the error must name {field}: {e}"
        );
        assert!(
            e.starts_with(&format!("invalid params for {method}")),
            "{e}"
        );
    }
    // Nothing was recorded: the profile's sandbox starts with the
    // backend's default memory (a VM's RAM; a namespace sandbox's default
    // limit, where a cgroup holds one).
    let r = p.call("startVM", json!({}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    let info = c.env.info(&super::kept_sandbox_of(&c, "neg"));
    if super::client::on_vm() {
        assert_eq!(
            info.get("mem_mib").map(String::as_str),
            Some("2048"),
            "{info:?}"
        );
    } else {
        assert_eq!(
            info.contains_key("mem_mib"),
            info.get("mem_source").is_some_and(|s| s == "default"),
            "{info:?}"
        );
    }
}

#[test]
fn null_in_args_env_mounts_and_optional_values_is_treated_as_absent() {
    let c = Cowork::start();
    let mut p = c.boot("nulls");
    let mut ev = c.events("nulls");
    let r = p.call(
        "spawn",
        json!({
            "id": "n", "name": "s", "command": "/bin/sh",
            "args": ["-c", null, "echo \"[$A][$B]\"; pwd", null],
            "env": {"A": "a", "B": null},
            "additionalMounts": {"gone": null},
            "cwd": null, "oneShot": null, "mountSkeletonHome": null,
            "isResume": null, "allowedDomains": null, "oauthToken": null,
        }),
    );
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    assert_eq!(
        r["result"],
        json!({}),
        "a null mount is no mount, not a failed one: {r}"
    );
    let exit = ev.exit_of("n");
    assert_eq!(exit["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(ev.text("stdout", "n"), "[a][]\n/sessions/s\n");
    let r = p.call("spawn", json!({"id": "m", "name": "s", "command": "true", "args": null, "env": null, "additionalMounts": null}));
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(ev.exit_of("m")["exitCode"], 0);
    let r = p.call("kill", json!({"id": "m", "signal": null}));
    assert_eq!(r["success"], true, "{r}");
    let r = p.call(
        "pruneSessionCaches",
        json!({"includeSessionTmp": null, "onlyIfFreeBytesBelow": null}),
    );
    assert_eq!(r["success"], true, "{r}");
}

#[test]
fn log_dir_gets_a_private_copy_of_the_helpers_log() {
    let c = Cowork::start();
    let dir = c.env.root().join("applogs");
    std::fs::create_dir(&dir).unwrap();
    let mut p = c.pipe("logs");
    let r = p.call("configure", json!({"logDir": dir}));
    assert_eq!(r["success"], true, "{r}");
    p.call("noSuchMethodForTheLog", json!({}));
    let log = dir.join("boxdesk-cowork.log");
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("noSuchMethodForTheLog") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no copy in {}: {text:?}\n{}",
            log.display(),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mode = std::fs::metadata(&log).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
    // The server's own stderr still has every line.
    assert!(c.log().contains("noSuchMethodForTheLog"), "{}", c.log());
}

#[test]
fn a_log_dir_whose_log_is_a_symlink_is_not_followed() {
    let c = Cowork::start();
    let dir = c.env.root().join("applogs");
    std::fs::create_dir(&dir).unwrap();
    let target = c.env.root().join("victim");
    std::os::unix::fs::symlink(&target, dir.join("boxdesk-cowork.log")).unwrap();
    let mut p = c.pipe("logs");
    let r = p.call("configure", json!({"logDir": dir}));
    assert_eq!(
        r["success"], true,
        "a bad logDir never fails configure: {r}"
    );
    p.call("noSuchMethodForTheLog", json!({}));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!target.exists(), "the symlink was followed");
    assert!(c.log().contains("boxdesk-cowork.log"), "{}", c.log());
}

/// Waits for the `error` event without an `id` (a profile's, not a
/// process's).
fn profile_error(ev: &mut super::client::Events) -> Value {
    ev.until("a profile's error event", |v| {
        v["type"] == "error" && v.get("id").is_none()
    })
}

#[test]
fn a_sandbox_that_cannot_start_emits_a_fatal_error_event() {
    let c = Cowork::start();
    let mut p = c.boot("nostart");
    assert_eq!(p.call("stopVM", json!({}))["success"], true);
    let log = super::profile_dir(&c).join("sandbox-host.log");
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(c.env.root().join("elsewhere"), &log).unwrap();
    let mut ev = c.events("nostart");
    let r = p.call("startVM", json!({}));
    assert_eq!(r["success"], false, "{r}");
    let err = profile_error(&mut ev);
    assert_eq!(err["fatal"], true, "{err}");
    assert!(
        err["message"].as_str().unwrap().contains("cannot start"),
        "{err}"
    );
}

#[test]
fn a_sandbox_that_dies_emits_a_fatal_error_event_and_a_process_error_is_not_fatal() {
    let c = Cowork::start();
    let mut p = c.boot("dies");
    let mut ev = c.events("dies");
    p.call(
        "spawn",
        json!({"id": "nx", "name": "s", "command": "/no/such/program"}),
    );
    ev.exit_of("nx");
    let err = ev.until("error of nx", |v| v["type"] == "error" && v["id"] == "nx");
    assert_eq!(
        err["fatal"], false,
        "a program that is missing is not fatal: {err}"
    );
    let name = super::kept_sandbox_of(&c, "dies");
    let out = c.env.run(["stop", &name]);
    assert_eq!(out.code(), 0, "{out}");
    let err = profile_error(&mut ev);
    assert_eq!(err["fatal"], true, "{err}");
    assert!(err["message"].as_str().unwrap().contains("ended"), "{err}");
    // stopVM is no death: no fatal error after it.
    let r = p.call("startVM", json!({}));
    assert_eq!(r["success"], true, "{r}");
    let seen = ev.seen.len();
    assert_eq!(p.call("stopVM", json!({}))["success"], true);
    let later = ev.drain_for(Duration::from_millis(500));
    assert!(
        !later.iter().any(|v| v["type"] == "error"),
        "stopVM is not a death: {:?}",
        &later
    );
    assert!(ev.seen.len() >= seen);
}

#[test]
fn create_vm_disk_size_becomes_the_sessions_quota_that_disk_info_reports() {
    let c = Cowork::start();
    let mut p = c.boot("quota");
    let mut ev = c.events("quota");
    let before = p.call("getSessionsDiskInfo", json!({}));
    assert_eq!(before["success"], true, "{before}");
    let r = p.call("createVM", json!({"bundlePath": "/b", "diskSizeGB": 1.5}));
    assert_eq!(r["success"], true, "{r}");
    p.sh("w", "big", "head -c 3000000 /dev/zero > /sessions/big/blob");
    assert_eq!(ev.exit_of("w")["exitCode"], 0);
    let r = p.call("getSessionsDiskInfo", json!({"lowWaterBytes": 100}));
    assert_eq!(r["success"], true, "{r}");
    let quota: u64 = 3 << 29;
    assert_eq!(r["result"]["totalBytes"], quota, "{r}");
    let used: u64 = r["result"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    assert!(used >= 3_000_000, "{r}");
    let free = r["result"]["freeBytes"].as_u64().unwrap();
    let fs_free = before["result"]["freeBytes"].as_u64().unwrap();
    assert!(free <= quota - used, "free {free} over the quota left: {r}");
    if fs_free > quota + (64 << 20) {
        assert_eq!(free, quota - used, "{r}");
    }
}
