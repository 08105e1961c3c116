//! `boxdesk cowork`, played exactly as the Claude Desktop app plays it
//! (seed 000): the three connection modes, the boot sequence, processes
//! and their events, mounts, the allowlist proxy, session dirs, and every
//! bad input. Each test runs its own server with its own
//! dirs; the whole module runs again as an unprivileged user in CI.

mod app;
pub(crate) mod client;
mod dns;
mod kept;
mod protocol_edges;
mod vm;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use client::{read_frame, write_frame, Cowork, WAIT};

#[test]
fn a_one_shot_request_gets_one_reply_without_an_id() {
    let c = Cowork::start();
    let r = c.one_shot("isRunning", json!({}));
    assert_eq!(r, json!({"success": true, "result": {"running": false}}));
    let r = c.one_shot("getNetworkDrives", json!({}));
    assert_eq!(r["result"], json!({"drives": []}));
    let r = c.one_shot("noSuchMethod", json!({}));
    assert_eq!(
        r,
        json!({"success": false, "error": "Unknown method: noSuchMethod"})
    );
}

#[test]
fn pipelined_requests_are_answered_by_id_and_a_slow_one_does_not_block_a_fast_one() {
    let c = Cowork::start();
    let mut p = c.pipe("p");
    // One write holding both requests: startVM takes milliseconds,
    // isRunning microseconds, so its reply must come first.
    let slow = p.send("startVM", json!({}));
    let fast = p.send("isRunning", json!({}));
    let first = read_frame(&mut p.s).unwrap();
    assert_eq!(first["id"], fast, "the fast reply must not wait: {first}");
    assert_eq!(p.wait(slow)["success"], true);
    // A spawn of sleep does not hold up a request behind it either.
    let sleep = p.send(
        "spawn",
        json!({"id": "s", "name": "a", "command": "sleep", "args": ["5"]}),
    );
    let q = p.send("isProcessRunning", json!({"id": "s"}));
    assert_eq!(p.wait(q)["success"], true);
    assert_eq!(p.wait(sleep)["success"], true);
    let r = p.call("isProcessRunning", json!({"id": "s"}));
    assert_eq!(r["result"]["running"], true, "{r}");
    p.call("kill", json!({"id": "s", "signal": "SIGKILL"}));
}

#[test]
fn the_boot_sequence_runs_a_command_and_its_output_arrives_as_events() {
    let c = Cowork::start();
    let mut ev = c.events("boot");
    let mut p = c.boot("boot");
    // startupStep events were emitted on the way up.
    let step = ev.until("wait_for_guest completed", |v| {
        v["type"] == "startupStep" && v["step"] == "wait_for_guest" && v["status"] == "completed"
    });
    assert_eq!(step["type"], "startupStep");
    ev.until("networkStatus connected", |v| {
        v["type"] == "networkStatus" && v["status"] == "connected"
    });
    // installSdk: <dir>/<version>/claude, a path under home given relative to /.
    let sdk = c.env.home.join(".config/Claude/claude-code-vm");
    std::fs::create_dir_all(sdk.join("2.0.1")).unwrap();
    let claude = sdk.join("2.0.1/claude");
    std::fs::write(&claude, "#!/bin/sh\necho \"claude-sdk $*\"\n").unwrap();
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755)).unwrap();
    let rel = sdk.strip_prefix("/").unwrap().to_str().unwrap().to_owned();
    let r = p.call("installSdk", json!({"sdkSubpath": rel, "version": "2.0.1"}));
    assert_eq!(r["success"], true, "installSdk: {r}\n{}", c.log());
    let r = p.call("spawn", json!({"id": "c1", "name": "s1", "command": "/usr/local/bin/claude", "args": ["--version"]}));
    assert_eq!(r, json!({"success": true, "result": {}, "id": r["id"]}));
    let exit = ev.exit_of("c1");
    assert_eq!(
        ev.text("stdout", "c1"),
        "claude-sdk --version\n",
        "{:?}",
        ev.seen
    );
    assert_eq!(exit["exitCode"], 0);
    assert_eq!(exit["signal"], Value::Null);
    // And `claude` is on PATH.
    p.sh("c2", "s1", "claude hi");
    ev.exit_of("c2");
    assert_eq!(ev.text("stdout", "c2"), "claude-sdk hi\n");
    let r = p.call("installSdk", json!({"sdkSubpath": rel, "version": "9.9.9"}));
    assert_eq!(r["success"], false, "a missing SDK is an error: {r}");
}

#[test]
fn echo_stdout_stderr_and_exit_status_reach_the_subscriber() {
    let c = Cowork::start();
    let mut p = c.boot("e");
    let mut ev = c.events("e");
    p.sh("x", "s", "echo out; echo err >&2; exit 3");
    let exit = ev.exit_of("x");
    assert_eq!(exit["exitCode"], 3);
    assert_eq!(ev.text("stdout", "x"), "out\n");
    assert_eq!(ev.text("stderr", "x"), "err\n");
    let r = p.call("isProcessRunning", json!({"id": "x"}));
    assert_eq!(r["result"], json!({"running": false, "exitCode": 3}));
}

#[test]
fn stdin_reaches_cat_and_kill_reports_the_signal_by_name() {
    let c = Cowork::start();
    let mut p = c.boot("k");
    let mut ev = c.events("k");
    p.call("spawn", json!({"id": "cat", "name": "s", "command": "cat"}));
    let r = p.call("writeStdin", json!({"id": "cat", "data": "hello €\n"}));
    assert_eq!(r["success"], true, "{r}");
    ev.until("cat's echo", |v| v["type"] == "stdout" && v["id"] == "cat");
    assert_eq!(ev.text("stdout", "cat"), "hello €\n");
    assert_eq!(
        p.call("isProcessRunning", json!({"id": "cat"}))["result"]["running"],
        true
    );
    p.call("kill", json!({"id": "cat", "signal": "SIGTERM"}));
    let exit = ev.exit_of("cat");
    assert_eq!(exit["exitCode"], Value::Null, "{exit}");
    assert_eq!(exit["signal"], "SIGTERM");
    p.call(
        "spawn",
        json!({"id": "sl", "name": "s", "command": "sleep", "args": ["30"]}),
    );
    p.call("kill", json!({"id": "sl", "signal": "SIGKILL"}));
    let exit = ev.exit_of("sl");
    assert_eq!(exit["signal"], "SIGKILL");
    assert_eq!(exit["exitCode"], Value::Null);
    // stdin to an exited process, and kill of an unknown id: clean answers.
    let r = p.call("writeStdin", json!({"id": "cat", "data": "late"}));
    assert_eq!(r["success"], false, "{r}");
    assert!(r["error"].as_str().unwrap().contains("exited"), "{r}");
    let r = p.call("kill", json!({"id": "nobody-here"}));
    assert_eq!(r["success"], false, "{r}");
    // The daemon is still fine.
    assert_eq!(p.call("isRunning", json!({}))["result"]["running"], true);
}

#[test]
fn writing_to_a_process_whose_stdin_is_closed_harms_nothing() {
    let c = Cowork::start();
    let mut p = c.boot("ep");
    let mut ev = c.events("ep");
    // The process closes its stdin, then keeps running for a while.
    p.sh("h", "s", "exec 0<&-; sleep 0.5; echo alive");
    for _ in 0..20 {
        let r = p.call(
            "writeStdin",
            json!({"id": "h", "data": "x".repeat(100_000)}),
        );
        assert!(r.get("success").is_some(), "{r}");
    }
    assert_eq!(ev.exit_of("h")["exitCode"], 0);
    assert_eq!(ev.text("stdout", "h"), "alive\n");
    assert_eq!(p.call("isRunning", json!({}))["result"]["running"], true);
}

#[test]
fn a_missing_program_gets_an_error_and_an_exit_with_127_and_a_non_executable_126() {
    let c = Cowork::start();
    let mut p = c.boot("m");
    let mut ev = c.events("m");
    let r = p.call(
        "spawn",
        json!({"id": "nx", "name": "s", "command": "/no/such/program"}),
    );
    assert_eq!(r["success"], true);
    let exit = ev.exit_of("nx");
    assert_eq!(exit["exitCode"], 127, "{exit}");
    let err = ev.until("error of nx", |v| v["type"] == "error" && v["id"] == "nx");
    assert!(err["message"].as_str().unwrap().contains("ENOENT"), "{err}");
    p.sh(
        "mk",
        "s",
        "echo 'echo ran' > /sessions/s/plain; chmod 644 /sessions/s/plain",
    );
    assert_eq!(ev.exit_of("mk")["exitCode"], 0);
    p.call(
        "spawn",
        json!({"id": "ne", "name": "s", "command": "/sessions/s/plain"}),
    );
    let exit = ev.exit_of("ne");
    assert_eq!(exit["exitCode"], 126, "{:?}", ev.seen);
    ev.until("error of ne", |v| v["type"] == "error" && v["id"] == "ne");
    assert_eq!(
        p.call("isProcessRunning", json!({"id": "nx"}))["result"],
        json!({"running": false, "exitCode": 127})
    );
}

#[test]
fn is_process_running_is_true_before_and_false_with_the_code_after_exit() {
    let c = Cowork::start();
    let mut p = c.boot("r");
    let mut ev = c.events("r");
    p.sh("q", "s", "sleep 0.3; exit 4");
    assert_eq!(
        p.call("isProcessRunning", json!({"id": "q"}))["result"],
        json!({"running": true})
    );
    ev.exit_of("q");
    assert_eq!(
        p.call("isProcessRunning", json!({"id": "q"}))["result"],
        json!({"running": false, "exitCode": 4})
    );
    // A reused id: the new process is tracked, not the old exit.
    p.sh("q", "s", "sleep 0.3");
    assert_eq!(
        p.call("isProcessRunning", json!({"id": "q"}))["result"],
        json!({"running": true})
    );
    // One-shot processes are forgotten after their exit.
    p.call(
        "spawn",
        json!({"id": "o", "name": "s", "command": "true", "oneShot": true}),
    );
    ev.exit_of("o");
    assert_eq!(
        p.call("isProcessRunning", json!({"id": "o"}))["result"],
        json!({"running": false})
    );
}

#[test]
fn two_profiles_never_see_each_others_events() {
    let c = Cowork::start();
    let mut pa = c.boot("A");
    let mut pb = c.boot("B");
    let mut ea = c.events("A");
    let mut eb = c.events("B");
    pa.sh("only-a", "s", "echo from-a");
    pb.sh("only-b", "s", "echo from-b");
    ea.exit_of("only-a");
    eb.exit_of("only-b");
    let more_a = ea.drain_for(Duration::from_millis(300));
    assert!(
        ea.seen.iter().chain(&more_a).all(|v| v["id"] != "only-b"),
        "{:?}",
        ea.seen
    );
    assert!(eb.seen.iter().all(|v| v["id"] != "only-a"), "{:?}", eb.seen);
    // The process table is per profile too.
    assert_eq!(
        pb.call("isProcessRunning", json!({"id": "only-a"}))["result"],
        json!({"running": false})
    );
}

#[test]
fn events_emitted_with_nobody_subscribed_are_replayed_to_a_late_subscriber() {
    let c = Cowork::start();
    let mut p = c.boot("late");
    p.sh("early", "s", "echo one; echo two");
    // Wait until it has surely ended, then subscribe.
    let deadline = Instant::now() + WAIT;
    while p.call("isProcessRunning", json!({"id": "early"}))["result"]["running"] == true {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut ev = c.events("late");
    let exit = ev.exit_of("early");
    assert_eq!(exit["exitCode"], 0);
    assert_eq!(ev.text("stdout", "early"), "one\ntwo\n");
    // Nothing is lost across a resubscribe either.
    drop(ev);
    p.sh("between", "s", "echo three");
    std::thread::sleep(Duration::from_millis(300));
    let mut ev = c.events("late");
    ev.exit_of("between");
    assert_eq!(ev.text("stdout", "between"), "three\n");
}

#[test]
fn fifty_concurrent_spawns_each_get_their_own_output() {
    let c = Cowork::start();
    let mut p = c.boot("fifty");
    let mut ev = c.events("fifty");
    let ids: Vec<u64> = (0..50)
        .map(|i| p.send("spawn", json!({"id": format!("p{i}"), "name": "s", "command": "/bin/sh", "args": ["-c", format!("echo out-{i}")]})))
        .collect();
    for id in ids {
        assert_eq!(p.wait(id)["success"], true);
    }
    for i in 0..50 {
        let exit = ev.exit_of(&format!("p{i}"));
        assert_eq!(exit["exitCode"], 0, "{exit}");
    }
    for i in 0..50 {
        assert_eq!(ev.text("stdout", &format!("p{i}")), format!("out-{i}\n"));
    }
}

#[test]
fn a_character_split_across_writes_arrives_whole() {
    let c = Cowork::start();
    let mut p = c.boot("u8");
    let mut ev = c.events("u8");
    p.sh("eu", "s", r"printf '\342'; sleep 0.1; printf '\202\254'");
    ev.exit_of("eu");
    assert_eq!(ev.text("stdout", "eu"), "€");
    let parts = ev.seen.iter().filter(|v| v["type"] == "stdout").count();
    assert!(parts >= 1);
    assert!(!ev.text("stdout", "eu").contains('\u{fffd}'));
    // Really invalid bytes do become U+FFFD.
    p.sh("bad", "s", r"printf 'a\377b'");
    ev.exit_of("bad");
    assert_eq!(ev.text("stdout", "bad"), "a\u{fffd}b");
}

#[test]
fn a_frame_over_ten_mib_ends_only_its_own_connection() {
    let c = Cowork::start();
    let mut p = c.pipe("big");
    let mut s = c.connect();
    s.write_all(&((10u32 << 20) + 1).to_be_bytes()).unwrap();
    let r = read_frame(&mut s).expect("an error reply before the close");
    assert_eq!(r["success"], false, "{r}");
    assert!(read_frame(&mut s).is_none(), "the connection is closed");
    assert_eq!(
        p.call("isRunning", json!({}))["success"],
        true,
        "other connections are unaffected"
    );
}

#[test]
fn bodies_that_are_not_json_objects_are_refused_and_the_connection_closed() {
    let c = Cowork::start();
    for body in [&b"{not json"[..], b"[1,2,3]", b"\"str\"", b"\xff\xfe"] {
        let mut s = c.connect();
        // A valid frame queued behind the bad one is not processed. Both
        // go in one write: the server may close as soon as it has read
        // the bad one, and a second write would then meet EPIPE.
        let good = serde_json::to_vec(&json!({"method": "isRunning", "id": 5})).unwrap();
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(&(good.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&good);
        s.write_all(&bytes).unwrap();
        let r = read_frame(&mut s).expect("error reply");
        assert_eq!(r["success"], false, "{r}");
        assert!(read_frame(&mut s).is_none(), "closed after a bad body");
    }
    assert_eq!(c.one_shot("isRunning", json!({}))["success"], true);
}

#[test]
fn a_request_with_a_key_twice_is_refused_by_name_and_runs_neither_reading() {
    let c = Cowork::start();
    for body in [
        &br#"{"method":"isRunning","method":"stopVM","id":1}"#[..],
        br#"{"method":"spawn","id":2,"params":{"id":"a","name":"s","command":"true","command":"sh"}}"#,
    ] {
        let mut s = c.connect();
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        s.write_all(&bytes).unwrap();
        let r = read_frame(&mut s).expect("error reply");
        assert_eq!(r["success"], false, "{r}");
        let why = r["error"].as_str().unwrap_or_default();
        assert!(why.contains("duplicate key"), "{r}");
        assert!(read_frame(&mut s).is_none(), "closed after a bad body");
    }
    assert!(!c.log().contains("stopVM"), "{}", c.log());
    assert_eq!(c.one_shot("isRunning", json!({}))["success"], true);
}

#[test]
fn missing_or_ill_typed_params_get_an_error_reply_with_the_id() {
    let c = Cowork::start();
    let mut p = c.pipe("params");
    let mut s = p.s.try_clone().unwrap();
    write_frame(&mut s, &json!({"id": 77, "params": {}}));
    let r = p.wait(77);
    assert_eq!(r["success"], false, "{r}");
    for (method, params) in [
        ("spawn", json!({"id": "x", "name": "s"})),
        ("spawn", json!({"id": "x", "name": "s", "command": 12})),
        ("kill", json!({"id": "x", "signal": "SIGBOGUS"})),
        ("writeStdin", json!({"id": "x", "data": 5})),
        ("isProcessRunning", json!({})),
        ("setDebugLogging", json!({"enabled": "yes"})),
    ] {
        let r = p.call(method, params);
        assert_eq!(r["success"], false, "{method}: {r}");
        assert!(r["error"].is_string());
    }
    let id = p.send("isRunning", json!({}));
    write_frame(
        &mut s,
        &json!({"id": 78, "method": "isRunning", "params": [1]}),
    );
    assert_eq!(p.wait(78)["success"], false);
    assert_eq!(p.wait(id)["success"], true, "the pipe goes on");
}

#[test]
fn the_daemon_survives_a_thousand_garbage_connections() {
    let c = Cowork::start();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for i in 0..1000 {
        let Ok(mut s) = UnixStream::connect(&c.sock) else {
            panic!("connection {i} refused; log:\n{}", c.log());
        };
        let n = (seed % 64) as usize + 1;
        let junk: Vec<u8> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = s.write_all(&junk);
        if i % 3 == 0 {
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let _ = s.read_to_end(&mut sink);
        }
    }
    assert_eq!(c.one_shot("isRunning", json!({}))["success"], true);
    assert!(c.child.0.id() > 0);
}

#[test]
fn folders_are_mounted_read_only_or_read_write_and_escapes_are_refused() {
    let c = Cowork::start();
    let mut p = c.boot("mnt");
    let mut ev = c.events("mnt");
    let proj = c.env.home.join("proj");
    let docs = c.env.home.join("docs");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("d.md"), "doc text").unwrap();
    let rel = |p: &std::path::Path| p.strip_prefix("/").unwrap().to_str().unwrap().to_owned();
    let r = p.call(
        "spawn",
        json!({"id": "w", "name": "sess", "command": "/bin/sh",
               "args": ["-c", "pwd; cat /sessions/sess/mnt/docs/d.md; echo; echo made > out.txt; echo x > /sessions/sess/mnt/docs/new 2>/dev/null || echo ro-refused"],
               "additionalMounts": {"proj": {"path": rel(&proj), "mode": "rw"}, "docs": {"path": rel(&docs), "mode": "ro"}}}),
    );
    assert_eq!(r["result"], json!({}), "no failed mounts: {r}\n{}", c.log());
    let exit = ev.exit_of("w");
    assert_eq!(exit["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(
        ev.text("stdout", "w"),
        "/sessions/sess/mnt/proj\ndoc text\nro-refused\n"
    );
    assert_eq!(
        std::fs::read_to_string(proj.join("out.txt")).unwrap(),
        "made\n",
        "rw writes reach the host"
    );
    assert!(!docs.join("new").exists());
    // readFile reads through the agent, as the process sees the path.
    let r = p.call(
        "readFile",
        json!({"processName": "sess", "filePath": "/sessions/sess/mnt/docs/d.md"}),
    );
    assert_eq!(r["result"]["content"], "doc text", "{r}");
    for bad in [
        "/etc/passwd",
        "/sessions/sess/../../etc/passwd",
        "/sessions/other/x",
    ] {
        let r = p.call("readFile", json!({"processName": "sess", "filePath": bad}));
        assert_eq!(r["success"], false, "{bad}: {r}");
    }
    let r = p.call(
        "readFile",
        json!({"processName": "sess", "filePath": "/sessions/sess/mnt/docs/missing"}),
    );
    assert_eq!(r["success"], false, "{r}");
    // mountPath: `..`, the kernel's filesystems (directly or through a
    // link) and a symlink out of home are refused.
    p.call(
        "spawn",
        json!({"id": "long", "name": "sess", "command": "sleep", "args": ["30"]}),
    );
    std::os::unix::fs::symlink("/etc", c.env.home.join("esc")).unwrap();
    for sub in [
        format!("{}/../../etc", rel(&c.env.home)),
        "proc".into(),
        "sys/fs".into(),
        "dev".into(),
        "proc/self/root".into(),
        format!("{}/esc", rel(&c.env.home)),
    ] {
        let r = p.call(
            "mountPath",
            json!({"processId": "long", "subpath": sub, "mountName": "evil", "mode": "rw"}),
        );
        assert_eq!(r["success"], false, "{sub}: {r}");
    }
    let r = p.call(
        "mountPath",
        json!({"processId": "long", "subpath": rel(&docs), "mountName": "later", "mode": "ro"}),
    );
    assert_eq!(r["success"], true, "{r}");
    p.sh("see", "sess", "cat /sessions/sess/mnt/later/d.md");
    ev.exit_of("see");
    assert_eq!(ev.text("stdout", "see"), "doc text");
    // A mount that cannot be made is reported, not silently dropped.
    let r = p.call("spawn", json!({"id": "f", "name": "sess", "command": "true", "additionalMounts": {"bad": {"path": "proc"}}}));
    assert_eq!(r["result"], json!({"failedMounts": ["bad"]}), "{r}");
    p.call("kill", json!({"id": "long", "signal": "SIGKILL"}));
}

#[test]
fn session_dirs_are_measured_deleted_without_touching_mounted_folders_and_validated() {
    let c = Cowork::start();
    let mut p = c.boot("sd");
    let mut ev = c.events("sd");
    let keep = c.env.home.join("keep");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("precious"), "user data").unwrap();
    let rel = keep.strip_prefix("/").unwrap().to_str().unwrap().to_owned();
    p.call(
        "spawn",
        json!({"id": "fill", "name": "big", "command": "/bin/sh", "args": ["-c", "head -c 1048576 /dev/zero > /sessions/big/blob"],
               "additionalMounts": {"keep": {"path": rel, "mode": "rw"}}}),
    );
    ev.exit_of("fill");
    let r = p.call("getSessionsDiskInfo", json!({"lowWaterBytes": 0}));
    let info = &r["result"];
    assert!(
        info["totalBytes"].as_u64().unwrap() > 0 && info["freeBytes"].as_u64().is_some(),
        "{r}"
    );
    let big = info["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "big")
        .expect("session big");
    assert!(big["bytes"].as_u64().unwrap() >= 1 << 20, "{r}");
    let r = p.call(
        "deleteSessionDirs",
        json!({"names": ["big", "../x", "a/b", "nope"]}),
    );
    assert_eq!(r["result"]["deleted"], json!(["big"]), "{r}");
    for bad in ["../x", "a/b", "nope"] {
        assert!(r["result"]["errors"][bad].is_string(), "{bad}: {r}");
    }
    assert_eq!(
        std::fs::read_to_string(keep.join("precious")).unwrap(),
        "user data"
    );
    let r = p.call("pruneSessionCaches", json!({"onlyIfFreeBytesBelow": 0, "includeSessionTmp": true, "sessionTmpOlderThanSeconds": 0}));
    assert_eq!(r["success"], true, "{r}");
    assert!(r["result"]["freedBytes"].is_u64());
}

#[test]
fn a_session_whose_mnt_became_a_link_to_another_sessions_takes_only_its_own_mounts_off() {
    let c = Cowork::start();
    let mut p = c.boot("hop");
    let mut ev = c.events("hop");
    let folder = |n: &str| {
        let d = c.env.home.join(n);
        std::fs::create_dir_all(&d).unwrap();
        (
            d.clone(),
            d.strip_prefix("/").unwrap().to_str().unwrap().to_owned(),
        )
    };
    let (fa, ra) = folder("folder-a");
    let (fb, rb) = folder("folder-b");
    for (id, session, mount, rel) in [("a", "a", "fa", &ra), ("b", "b", "fb", &rb)] {
        p.call(
            "spawn",
            json!({"id": id, "name": session, "command": "/bin/sh", "args": ["-c", "true"],
                   "additionalMounts": {mount: {"path": rel, "mode": "rw"}}}),
        );
        assert_eq!(ev.exit_of(id)["exitCode"], 0, "{:?}", ev.seen);
    }
    // Session a swaps its own mnt for a link to b's (relative, so it leads
    // there on the host too), then asks for its dirs to go.
    p.sh(
        "swap",
        "a",
        "mv /sessions/a/mnt /sessions/a/old && ln -s ../b/mnt /sessions/a/mnt && echo swapped",
    );
    ev.exit_of("swap");
    assert_eq!(ev.text("stdout", "swap"), "swapped\n", "{:?}", ev.seen);
    let r = p.call("deleteSessionDirs", json!({"names": ["a"]}));
    // b's folder is still mounted: what b writes lands in the user's folder.
    p.sh(
        "write",
        "b",
        "echo kept > /sessions/b/mnt/fb/after && echo wrote",
    );
    ev.exit_of("write");
    assert_eq!(ev.text("stdout", "write"), "wrote\n", "{:?}", ev.seen);
    assert_eq!(
        std::fs::read_to_string(fb.join("after")).unwrap_or_default(),
        "kept\n",
        "b's mount was taken off through a's link"
    );
    // And a went, its own mount (moved to a/old) found and taken off first,
    // the user's folder untouched.
    assert_eq!(r["result"]["deleted"], json!(["a"]), "{r}");
    assert!(fa.is_dir());
}

#[test]
fn tokens_reach_the_process_but_never_the_log() {
    let c = Cowork::start();
    let mut p = c.boot("tok");
    let mut ev = c.events("tok");
    p.call("setDebugLogging", json!({"enabled": true}));
    p.call(
        "addApprovedOauthToken",
        json!({"token": "approved-SECRET-1"}),
    );
    p.call("spawn", json!({"id": "t1", "name": "s", "command": "/bin/sh", "args": ["-c", "echo $CLAUDE_CODE_OAUTH_TOKEN"], "oauthToken": "param-SECRET-2", "env": {"OTHER": "env-SECRET-3"}}));
    p.call("spawn", json!({"id": "t2", "name": "s", "command": "/bin/sh", "args": ["-c", "echo $CLAUDE_CODE_OAUTH_TOKEN $OTHER"], "env": {"OTHER": "env-SECRET-3"}}));
    ev.exit_of("t1");
    ev.exit_of("t2");
    assert_eq!(ev.text("stdout", "t1"), "param-SECRET-2\n");
    assert_eq!(ev.text("stdout", "t2"), "approved-SECRET-1 env-SECRET-3\n");
    let log = c.log();
    assert!(log.contains("request spawn"), "debug logging is on: {log}");
    assert!(!log.contains("SECRET"), "a secret reached the log:\n{log}");
}

/// A shell script for a sandbox behind the proxy (busybox `nc`, which is
/// in the host's system and in the nested L1's): prints `HTTPS_PROXY`,
/// then for each `(host, port)` the proxy's status for `CONNECT
/// host:port` and, on 200, what the far end sent; then whether a direct
/// connection to 127.0.0.1:`direct` got through.
fn proxy_script(targets: &[(&str, u16)], direct: u16) -> String {
    let calls: Vec<String> = targets
        .iter()
        .map(|(h, p)| format!("via {h} {p}"))
        .collect();
    format!(
        r#"echo "$HTTPS_PROXY"
via() {{
  out=$(printf 'CONNECT %s:%s HTTP/1.1\r\nHost: %s\r\n\r\n' "$1" "$2" "$1" |
    busybox nc 127.0.0.1 3128 2>/dev/null | tr -d '\r')
  status=$(printf '%s\n' "$out" | head -n 1 | cut -d ' ' -f 2)
  if [ "$status" = 200 ]; then
    echo "200 $(printf '%s\n' "$out" | sed '1,/^$/d')"
  else
    echo "${{status:-none}} "
  fi
}}
{}
if busybox nc -w 2 127.0.0.1 {direct} </dev/null >/dev/null 2>&1; then
  echo direct-ok
else
  echo direct-refused
fi
"#,
        calls.join("\n")
    )
}

/// Whether the proxy tests can run here: they need busybox (for `nc`).
fn has_busybox() -> bool {
    let there = std::path::Path::new("/bin/busybox").exists();
    if !there {
        println!("skipped: needs /bin/busybox (its nc) inside the sandbox");
    }
    there
}

/// A listener on 127.0.0.1 that greets every connection; its port.
fn greeting_host() -> u16 {
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in host.incoming().flatten() {
            let mut s = s;
            let _ = s.write_all(b"hello-from-host");
        }
    });
    port
}

#[test]
fn allowed_domains_give_a_private_network_whose_only_way_out_is_the_proxy() {
    if !has_busybox() {
        return;
    }
    let port = greeting_host();
    let c = Cowork::start();
    let mut p = c.boot("net");
    let mut ev = c.events("net");
    // An IP entry with its port: the user's choice of a host on this machine.
    let script = proxy_script(
        &[
            ("127.0.0.1", port),
            ("localhost", port),
            ("example.com", 443),
        ],
        port,
    );
    let r = p.call("spawn", json!({"id": "py", "name": "s", "command": "/bin/sh", "args": ["-c", script], "allowedDomains": [format!("127.0.0.1:{port}")]}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    let exit = ev.exit_of("py");
    assert_eq!(exit["exitCode"], 0, "{:?}\n{}", ev.seen, c.log());
    assert_eq!(
        ev.text("stdout", "py"),
        "http://127.0.0.1:3128\n200 hello-from-host\n403 \n403 \ndirect-refused\n",
        "{:?}",
        ev.seen
    );
    // Without allowedDomains, too, the only way out is the proxy (a VM has
    // no network device; a namespace sandbox a network namespace of its
    // own), which allows every public destination and nothing on this host.
    let script = proxy_script(&[("127.0.0.1", port)], port);
    p.call(
        "spawn",
        json!({"id": "open", "name": "s", "command": "/bin/sh", "args": ["-c", script]}),
    );
    assert_eq!(ev.exit_of("open")["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(
        ev.text("stdout", "open"),
        "http://127.0.0.1:3128\n403 \ndirect-refused\n"
    );
}

#[test]
fn a_spawn_reaches_no_abstract_unix_socket_of_the_host() {
    use std::os::linux::net::SocketAddrExt;
    // An X server's socket is abstract (`@/tmp/.X11-unix/X0`): this stands
    // in for it. Abstract sockets belong to a network namespace.
    let name = format!("boxdesk-test-x11-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let x11 = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    x11.set_nonblocking(true).unwrap();
    let c = Cowork::start();
    let mut p = c.boot("x11");
    let mut ev = c.events("x11");
    // Not even listed where a spawn looks (/proc/net/unix shows the
    // sockets of the network namespace it is in; a VM's, of its kernel).
    p.sh(
        "seen",
        "s",
        &format!("grep -c '@{name}' /proc/net/unix || true"),
    );
    assert_eq!(ev.exit_of("seen")["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(ev.text("stdout", "seen"), "0\n", "{:?}", ev.seen);
    if !client::on_vm() {
        // And a connection by its name is refused (python3 is the host's
        // here; a VM's root has what its image has).
        let script = format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\n\
             try:\n    s.connect('\\0{name}')\n    print('connected')\n\
             except OSError as e:\n    print('refused', e.errno)\n"
        );
        p.call(
            "spawn",
            json!({"id": "x", "name": "s", "command": "python3", "args": ["-c", script]}),
        );
        assert_eq!(ev.exit_of("x")["exitCode"], 0, "{:?}\n{}", ev.seen, c.log());
        let out = ev.text("stdout", "x");
        assert!(out.starts_with("refused"), "{out}");
    }
    assert!(
        x11.accept().is_err(),
        "the host's abstract socket took a connection from a sandbox"
    );
}

#[test]
fn a_listed_name_that_resolves_to_loopback_or_an_unlisted_port_is_refused_by_the_proxy() {
    if !has_busybox() {
        return;
    }
    let port = greeting_host();
    let c = Cowork::start();
    let mut p = c.boot("dns");
    let mut ev = c.events("dns");
    // localhost is listed with the right port, but it is a name that
    // resolves to loopback; 127.0.0.1 is listed, but for 443 and 80 only.
    let script = proxy_script(&[("localhost", port), ("127.0.0.1", port)], port);
    let allowed = json!([format!("localhost:{port}"), "127.0.0.1"]);
    let r = p.call("spawn", json!({"id": "py", "name": "s", "command": "/bin/sh", "args": ["-c", script], "allowedDomains": allowed}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    assert_eq!(ev.exit_of("py")["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(
        ev.text("stdout", "py"),
        "http://127.0.0.1:3128\n403 \n403 \ndirect-refused\n",
        "{:?}",
        ev.seen
    );
}

#[test]
fn an_allowlist_of_a_public_suffix_is_refused_at_spawn_with_an_error_event_and_an_exit() {
    let c = Cowork::start();
    let mut p = c.boot("psl");
    let mut ev = c.events("psl");
    for (id, entry) in [
        ("tld", "com"),
        ("wild", "*.co.uk"),
        ("pages", "*.github.io"),
    ] {
        let r = p.call("spawn", json!({"id": id, "name": "s", "command": "true", "allowedDomains": ["api.anthropic.com", entry]}));
        assert_eq!(r["success"], true, "{r}");
        let err = ev.until("error", |v| v["type"] == "error" && v["id"] == id);
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains("public suffix") && msg.contains(entry),
            "{err}"
        );
        assert_eq!(ev.exit_of(id)["exitCode"], 127);
        assert_eq!(
            p.call("isProcessRunning", json!({"id": id}))["result"],
            json!({"running": false, "exitCode": 127})
        );
    }
    // A name under a public suffix is fine.
    let r = p.call("spawn", json!({"id": "ok", "name": "s", "command": "true", "allowedDomains": ["*.anthropic.com", "me.github.io"]}));
    assert_eq!(r["success"], true, "{r}");
    assert_eq!(ev.exit_of("ok")["exitCode"], 0, "{:?}", ev.seen);
}

#[test]
fn a_profile_keeps_at_most_eight_allowlist_sandboxes_and_an_idle_one_makes_room() {
    let c = Cowork::start();
    let mut p = c.boot("cap");
    let mut ev = c.events("cap");
    let spawn = |p: &mut client::Pipe, id: &str, script: &str, host: &str| {
        p.call("spawn", json!({"id": id, "name": "s", "command": "/bin/sh", "args": ["-c", script], "allowedDomains": [host]}))
    };
    // Eight lists, each with a process that waits on its stdin.
    for i in 0..8 {
        let r = spawn(
            &mut p,
            &format!("hold{i}"),
            "read x",
            &format!("h{i}.example.com"),
        );
        assert_eq!(r["success"], true, "{r}\n{}", c.log());
    }
    let r = spawn(&mut p, "ninth", "echo ran", "h8.example.com");
    assert_eq!(
        r["success"], false,
        "a ninth list while all eight are busy: {r}"
    );
    let msg = r["error"].as_str().unwrap();
    assert!(msg.contains("allowedDomains") && msg.contains('8'), "{r}");
    // One ends: its sandbox is idle and makes room for the ninth list.
    p.call("kill", json!({"id": "hold0", "signal": "SIGKILL"}));
    ev.exit_of("hold0");
    let deadline = Instant::now() + WAIT;
    loop {
        let r = spawn(&mut p, "ninth", "echo ran", "h8.example.com");
        if r["success"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {r}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ev.exit_of("ninth")["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(ev.text("stdout", "ninth"), "ran\n");
    // The busy ones were left alone.
    for i in 1..8 {
        let r = p.call("isProcessRunning", json!({"id": format!("hold{i}")}));
        assert_eq!(r["result"]["running"], true, "hold{i}: {r}");
    }
}

#[test]
fn start_vm_probes_the_api_url_and_stop_vm_ends_processes_with_exit_events() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let c = Cowork::start();
    let mut ev = c.events("st");
    let mut p = c.pipe("st");
    let r = p.call(
        "startVM",
        json!({"apiProbeURL": format!("http://127.0.0.1:{port}/v1")}),
    );
    assert_eq!(r["success"], true);
    let reach = ev.until("apiReachability", |v| v["type"] == "apiReachability");
    // Probed the way a spawn's connection goes: through the proxy, whose
    // rules keep it off anything private, this host's loopback included.
    assert_eq!(reach["status"], "blocked", "{reach}");
    p.call(
        "spawn",
        json!({"id": "z", "name": "s", "command": "sleep", "args": ["60"]}),
    );
    let r = p.call("stopVM", json!({}));
    assert_eq!(r["success"], true);
    let exit = ev.exit_of("z");
    assert_eq!(exit["signal"], "SIGKILL", "{exit}");
    ev.until("networkStatus disconnected", |v| {
        v["type"] == "networkStatus" && v["status"] == "disconnected"
    });
    assert_eq!(p.call("isRunning", json!({}))["result"]["running"], false);
    assert_eq!(
        p.call("isGuestConnected", json!({}))["result"]["connected"],
        false
    );
    let r = p.call("spawn", json!({"id": "y", "name": "s", "command": "true"}));
    assert_eq!(r["success"], false, "spawn needs a running VM: {r}");
    // And it starts again.
    assert_eq!(p.call("startVM", json!({}))["success"], true);
    assert_eq!(
        p.call("isGuestConnected", json!({}))["result"]["connected"],
        true
    );
}

#[test]
fn a_second_server_on_a_live_socket_exits_non_zero_and_a_stale_one_is_replaced() {
    let c = Cowork::start();
    let log = c.env.root().join("second.log");
    let mut second = client::spawn_server(&c.env, &c.sock, &log);
    let status = crate::support::wait_exit(&mut second);
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("in use"), "{text}");
    assert_eq!(
        c.one_shot("isRunning", json!({}))["success"],
        true,
        "the first still serves"
    );
    // A stale socket file (nobody listening) is removed and reused.
    let env = crate::support::TestEnv::new();
    let sock = env.xdg_runtime.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let mut s =
        crate::support::KillOnDrop(client::spawn_server(&env, &sock, &env.root().join("l")));
    let deadline = Instant::now() + WAIT;
    while UnixStream::connect(&sock).is_err() {
        assert!(
            Instant::now() < deadline,
            "did not take over the stale socket"
        );
        assert!(s.0.try_wait().unwrap().is_none(), "exited");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_vm_backend_that_cannot_run_here_or_an_unknown_one_is_refused_before_the_socket_is_bound() {
    let env = crate::support::TestEnv::new();
    let sock = env.xdg_runtime.join("vm.sock");
    let mut cases = vec![
        ("hvf", "the hvf backend needs macOS"),
        ("qemu", "unknown backend \"qemu\""),
    ];
    if env.run(["doctor"]).stdout.contains("kvm (accelerated)") {
        println!("skipped: the kvm case: this KVM can boot VMs, so cowork takes kvm");
    } else {
        cases.push((
            "kvm",
            "the kvm backend cannot run here: the hypervisor probe says",
        ));
    }
    for (word, says) in cases {
        let mut c = env.cmd(["cowork", "-socket"]);
        c.arg(&sock).env("BOXDESK_BACKEND", word);
        let out = crate::support::output(c);
        assert_eq!(out.code(), 125, "{word}: {out}");
        assert!(out.stderr.contains(says), "{word}: {out}");
        assert!(!sock.exists(), "{word}: bound {}", sock.display());
    }
}

#[test]
fn an_unsafe_socket_directory_or_a_symlinked_socket_is_refused() {
    let env = crate::support::TestEnv::new();
    let open = env.root().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = env.root().join("l");
    let mut child = client::spawn_server(&env, &open.join("s.sock"), &log);
    assert!(!crate::support::wait_exit(&mut child).success());
    assert!(
        std::fs::read_to_string(&log).unwrap().contains("open"),
        "names the directory"
    );
    let link = env.xdg_runtime.join("link.sock");
    std::os::unix::fs::symlink(env.root().join("elsewhere"), &link).unwrap();
    let mut child = client::spawn_server(&env, &link, &log);
    assert!(!crate::support::wait_exit(&mut child).success());
    assert!(std::fs::read_to_string(&log).unwrap().contains("symlink"));
}

#[test]
fn sigterm_stops_sandboxes_kills_processes_removes_the_socket_and_exits_zero() {
    let mut c = Cowork::start();
    let mut p = c.boot("term");
    let marker = crate::support::unique("cwterm");
    let mut ev = c.events("term");
    p.sh(
        "long",
        "s",
        &format!("echo started; sleep 300; echo {marker}"),
    );
    ev.until("started", |v| v["type"] == "stdout" && v["id"] == "long");
    // A VM's processes are not the host's: its vCPUs run in cowork.
    if client::on_vm() {
        assert!(
            !threads_of(c.child.0.id(), "vcpu").is_empty(),
            "no vCPU thread in cowork"
        );
    } else {
        assert!(
            !crate::support::pids_with(&marker).is_empty(),
            "not on the host"
        );
    }
    // SAFETY: kill takes plain integers; the server is our child.
    unsafe { libc::kill(c.child.0.id() as i32, libc::SIGTERM) };
    let status = crate::support::wait_exit(&mut c.child.0);
    assert_eq!(status.code(), Some(0), "{}", c.log());
    assert!(!c.sock.exists(), "the socket is removed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !crate::support::pids_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a spawned process outlived the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Threads of `pid` whose name starts with `prefix`.
fn threads_of(pid: u32, prefix: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .filter(|c| c.starts_with(prefix))
        .collect()
}

#[test]
fn a_peer_of_another_uid_gets_no_answer() {
    if crate::support::skip_unless_root("connecting as uid 65534 needs setuid") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let c = Cowork::start();
    // Loosen the path so uid 65534 can reach the socket at all: what must
    // refuse it then is the server's SO_PEERCRED check.
    let chmod = |p: &std::path::Path, m| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    chmod(&c.sock, 0o666);
    let mut p = c.sock.clone();
    while p.pop() && p.starts_with(c.env.root()) {
        chmod(&p, 0o711);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cowork::foreign_peer_probe_does_nothing_unless_spawned_by_its_test",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BOXDESK_TEST_COWORK_SOCK", &c.sock)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("REPLY<>"),
        "a foreign peer got an answer or the probe did not run: {text}"
    );
    assert!(
        c.log().contains("refused a connection from uid 65534"),
        "{}",
        c.log()
    );
    assert_eq!(c.one_shot("isRunning", json!({}))["success"], true);
}

/// Run by [`a_peer_of_another_uid_gets_no_answer`] as uid 65534; does
/// nothing otherwise.
#[test]
fn foreign_peer_probe_does_nothing_unless_spawned_by_its_test() {
    let Some(sock) = std::env::var_os("BOXDESK_TEST_COWORK_SOCK") else {
        return;
    };
    let mut s = UnixStream::connect(sock).expect("connect as another uid");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = br#"{"method":"isRunning"}"#;
    let _ = s.write_all(&(body.len() as u32).to_be_bytes());
    let _ = s.write_all(body);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    println!("REPLY<{}>", String::from_utf8_lossy(&reply));
}

#[test]
fn sigint_shuts_down_like_sigterm() {
    let mut c = Cowork::start();
    let _p = c.boot("int");
    // SAFETY: kill takes plain integers; the server is our child.
    unsafe { libc::kill(c.child.0.id() as i32, libc::SIGINT) };
    let status = crate::support::wait_exit(&mut c.child.0);
    assert_eq!(status.code(), Some(0), "{}", c.log());
    assert!(!c.sock.exists());
}

fn mount_count(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map(|m| m.lines().count())
        .unwrap_or(0)
}

#[test]
fn mounting_the_whole_home_again_and_again_replaces_the_mount_instead_of_stacking_it() {
    let c = Cowork::start();
    let mut p = c.boot("home");
    let mut ev = c.events("home");
    std::fs::write(c.env.home.join("marker"), "home here").unwrap();
    let rel = c
        .env
        .home
        .strip_prefix("/")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let mut counts = Vec::new();
    for i in 0..4 {
        let id = format!("h{i}");
        let r = p.call("spawn", json!({"id": id, "name": "s", "command": "cat", "args": ["/sessions/s/mnt/h/marker"], "additionalMounts": {"h": {"path": rel, "mode": "ro"}}}));
        assert_eq!(r["result"], json!({}), "{r}\n{}", c.log());
        assert_eq!(ev.exit_of(&id)["exitCode"], 0, "{:?}", ev.seen);
        assert_eq!(ev.text("stdout", &id), "home here");
        counts.push(mount_count(c.child.0.id()));
    }
    assert!(
        counts.windows(2).all(|w| w[1] <= w[0]),
        "mounts pile up: {counts:?}"
    );
}

#[test]
fn a_folder_holding_boxdesks_own_data_is_refused_as_a_mount() {
    // As on a real desktop: the data dir is ~/.local/share.
    let c = Cowork::start_with_data(Some(|env| env.home.join(".local/share")));
    let mut p = c.boot("own");
    let mut ev = c.events("own");
    let home = c
        .env
        .home
        .strip_prefix("/")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    std::fs::create_dir_all(c.env.home.join("proj")).unwrap();
    let r = p.call(
        "spawn",
        json!({"id": "o", "name": "s", "command": "ls", "args": ["/sessions/s/mnt"],
               "additionalMounts": {"all": {"path": home, "mode": "rw"}, "proj": {"path": format!("{home}/proj"), "mode": "rw"}}}),
    );
    assert_eq!(r["result"], json!({"failedMounts": ["all"]}), "{r}");
    assert!(c.log().contains("boxdesk's own"), "{}", c.log());
    assert_eq!(ev.exit_of("o")["exitCode"], 0);
    // The failed mount is not the working dir; the other one is there.
    assert!(ev.text("stdout", "o").contains("proj"), "{:?}", ev.seen);
}

#[test]
fn a_folder_holding_or_inside_boxdesks_state_dir_and_its_agent_sockets_is_refused_as_a_mount() {
    // As on a real desktop: the state dir is ~/.local/state, where each
    // sandbox's agent.sock lives.
    let c = Cowork::start_with_dirs(None, Some(|env| env.home.join(".local/state")));
    let mut p = c.boot("st");
    let mut ev = c.events("st");
    let state = c.env.home.join(".local/state/boxdesk");
    assert!(state.is_dir(), "no state dir at {}", state.display());
    let other = c.env.home.join(".local/other");
    std::fs::create_dir_all(&other).unwrap();
    let rel = |p: &std::path::Path| p.strip_prefix("/").unwrap().to_str().unwrap().to_owned();
    let r = p.call(
        "spawn",
        json!({"id": "o", "name": "s", "command": "ls", "args": ["/sessions/s/mnt"],
               "additionalMounts": {
                   "local": {"path": rel(&c.env.home.join(".local")), "mode": "rw"},
                   "state": {"path": rel(&state), "mode": "ro"},
                   "other": {"path": rel(&other), "mode": "rw"}}}),
    );
    let mut failed: Vec<String> = r["result"]["failedMounts"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    failed.sort();
    assert_eq!(failed, ["local", "state"], "{r}");
    assert_eq!(ev.exit_of("o")["exitCode"], 0);
    assert_eq!(ev.text("stdout", "o"), "other\n", "{:?}", ev.seen);
}

#[test]
fn kill_reaches_a_process_buried_under_stdin_it_never_reads() {
    let c = Cowork::start();
    let mut p = c.boot("buried");
    let mut ev = c.events("buried");
    p.call(
        "spawn",
        json!({"id": "s", "name": "s", "command": "sleep", "args": ["1000"]}),
    );
    let chunk = "x".repeat(1 << 20);
    let mut refused = false;
    for _ in 0..40 {
        let r = p.call("writeStdin", json!({"id": "s", "data": chunk}));
        if r["success"] == false {
            assert!(r["error"].as_str().unwrap().contains("stdin"), "{r}");
            refused = true;
            break;
        }
    }
    assert!(
        refused,
        "an unread stdin is refused once its queue is full, not buffered without end"
    );
    let t = Instant::now();
    assert_eq!(
        p.call("kill", json!({"id": "s", "signal": "SIGTERM"}))["success"],
        true
    );
    let exit = ev.exit_of("s");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "kill took {:?}",
        t.elapsed()
    );
    assert!(
        exit["signal"] == "SIGTERM" || exit["signal"] == "SIGKILL",
        "{exit}"
    );
    assert_eq!(p.call("isRunning", json!({}))["result"]["running"], true);
}

#[test]
fn a_newline_in_a_method_id_name_or_mount_never_forges_a_log_line() {
    let c = Cowork::start();
    let r = c.one_shot("nope\nFORGED one-shot method", json!({}));
    assert_eq!(r["success"], false, "{r}");
    let mut p = c.boot("lf");
    let mut ev = c.events("lf");
    p.call("setDebugLogging", json!({"enabled": true}));
    p.call("nope\r\nFORGED pipe method\u{1b}[31m", json!({}));
    let id = "i\nFORGED spawn id";
    let r = p.call(
        "spawn",
        json!({"id": id, "name": "s\nFORGED session name", "command": "true", "isResume": true,
               "additionalMounts": {"m\nFORGED mount name": {"path": "etc\nFORGED mount path"}}}),
    );
    // The reply names the mount as the client did; only the log escapes it.
    assert_eq!(
        r["result"],
        json!({"failedMounts": ["m\nFORGED mount name"]}),
        "{r}"
    );
    ev.exit_of(id);
    p.call("kill", json!({"id": "k\nFORGED kill id"}));
    let log = c.log();
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("FORGED")).collect();
    assert!(forged.is_empty(), "forged lines {forged:?} in:\n{log}");
    assert!(
        !log.contains('\u{1b}'),
        "a terminal escape reached the log:\n{log}"
    );
    for shown in [
        "nope\\x0aFORGED one-shot method",
        "nope\\x0d\\x0aFORGED pipe method\\x1b[31m",
        "i\\x0aFORGED spawn id",
        "s\\x0aFORGED session name",
        "m\\x0aFORGED mount name",
    ] {
        assert!(log.contains(shown), "{shown:?} not logged escaped:\n{log}");
    }
}

#[test]
fn a_missing_folder_beneath_home_is_created_for_the_session_and_one_elsewhere_is_refused() {
    use std::os::unix::fs::MetadataExt;
    let c = Cowork::start();
    let mut p = c.boot("gone");
    let mut ev = c.events("gone");
    let home = &c.env.home;
    std::fs::create_dir_all(home.join("proj")).unwrap();
    let rel = |p: &str| format!("{}/{p}", home.strip_prefix("/").unwrap().display());
    let outside = format!("nonexistent-boxdesk-{}/x", std::process::id());
    // No mode: read-write, as the app expects.
    let r = p.call(
        "spawn",
        json!({"id": "a", "name": "s", "command": "/bin/sh",
               "args": ["-c", "echo out > /sessions/s/mnt/gone/o && echo out > /sessions/s/mnt/half/o && ls /sessions/s/mnt"],
               "additionalMounts": {"gone": {"path": rel("gone/deeper")},
                                    "half": {"path": rel("proj/missing")},
                                    "far": {"path": outside.clone(), "mode": "rw"},
                                    "proj": {"path": rel("proj"), "mode": "rw"}}}),
    );
    assert_eq!(
        r["result"],
        json!({"failedMounts": ["far"]}),
        "{r}\n{}",
        c.log()
    );
    assert_eq!(ev.exit_of("a")["exitCode"], 0, "{:?}", ev.seen);
    for made in ["gone", "gone/deeper", "proj/missing"] {
        let m = std::fs::metadata(home.join(made)).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700, "{made}");
        assert_eq!(m.uid(), std::fs::metadata(home).unwrap().uid(), "{made}");
    }
    assert_eq!(
        std::fs::read_to_string(home.join("gone/deeper/o")).unwrap(),
        "out\n"
    );
    assert_eq!(
        std::fs::read_to_string(home.join("proj/missing/o")).unwrap(),
        "out\n"
    );
    assert!(
        !std::path::Path::new("/").join(&outside).exists(),
        "a folder outside home was created"
    );
    // A link on the way is never followed while creating.
    std::os::unix::fs::symlink("/tmp", home.join("tmplink")).unwrap();
    p.call(
        "spawn",
        json!({"id": "long", "name": "s", "command": "sleep", "args": ["30"]}),
    );
    let r = p.call(
        "mountPath",
        json!({"processId": "long", "subpath": rel("tmplink/boxdesk-made"), "mountName": "l"}),
    );
    assert_eq!(r["success"], false, "{r}");
    assert!(!std::path::Path::new("/tmp/boxdesk-made").exists());
    let r = p.call(
        "mountPath",
        json!({"processId": "long", "subpath": rel("later/x"), "mountName": "later"}),
    );
    assert_eq!(r["success"], true, "{r}");
    assert!(home.join("later/x").is_dir());
    p.call("kill", json!({"id": "long", "signal": "SIGKILL"}));
}

#[test]
fn a_self_referencing_link_at_a_source_becomes_a_directory_and_a_readable_folder_outside_home_mounts(
) {
    let c = Cowork::start();
    let mut p = c.boot("loop");
    let mut ev = c.events("loop");
    let home = &c.env.home;
    let rel = |p: &str| format!("{}/{p}", home.strip_prefix("/").unwrap().display());
    let cfg = home.join(".config/Claude");
    std::fs::create_dir_all(&cfg).unwrap();
    // The app's known leftover: `.mcpb-cache -> .mcpb-cache` (and the
    // absolute form).
    std::os::unix::fs::symlink(".mcpb-cache", cfg.join(".mcpb-cache")).unwrap();
    std::os::unix::fs::symlink(cfg.join("abs-cache"), cfg.join("abs-cache")).unwrap();
    // A link elsewhere is left alone.
    std::os::unix::fs::symlink("elsewhere", cfg.join("other")).unwrap();
    // Outside home: a directory this user may read (the test's own, not
    // beneath its home).
    let far = tempfile::Builder::new()
        .prefix("boxdesk-far")
        .tempdir_in(c.env.root())
        .unwrap();
    std::fs::write(far.path().join("f"), "far text").unwrap();
    let r = p.call(
        "spawn",
        json!({"id": "m", "name": "s", "command": "/bin/sh",
               "args": ["-c", "touch /sessions/s/mnt/cache/ok /sessions/s/mnt/abs/ok && cat /sessions/s/mnt/far/f"],
               "additionalMounts": {"cache": {"path": rel(".config/Claude/.mcpb-cache")},
                                    "abs": {"path": rel(".config/Claude/abs-cache")},
                                    "other": {"path": rel(".config/Claude/other")},
                                    "root": {"path": "root"},
                                    "far": {"path": far.path().strip_prefix("/").unwrap(), "mode": "ro"}}}),
    );
    // `/root` is 0700 on most hosts (not in the nested L1's own root): a
    // user who may not read it gets it refused.
    assert_eq!(
        r["result"],
        if std::fs::read_dir("/root").is_ok() {
            json!({"failedMounts": ["other"]})
        } else {
            json!({"failedMounts": ["other", "root"]})
        },
        "{r}\n{}",
        c.log()
    );
    assert_eq!(ev.exit_of("m")["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(ev.text("stdout", "m"), "far text");
    assert!(cfg.join(".mcpb-cache/ok").is_file());
    assert!(cfg.join("abs-cache/ok").is_file());
    assert!(
        cfg.join("other").is_symlink(),
        "only a link to itself is replaced"
    );
}

/// The name `boxdesk ls` shows for the one sandbox of `profile`.
fn kept_sandbox_of(c: &Cowork, profile: &str) -> String {
    let out = c.env.run(["ls", "--json"]);
    assert_eq!(out.code(), 0, "{out}");
    let rows: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["profile"] == profile)
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names.len(), 1, "{rows}");
    names[0].to_owned()
}

/// The one profile dir under `<data>/boxdesk/cowork`.
fn profile_dir(c: &Cowork) -> std::path::PathBuf {
    let root = c.env.root().join("data/boxdesk/cowork");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.remove(0)
}

fn mode_of(p: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn data_dirs_are_0700_and_sandbox_logs_0600_and_loose_ones_are_tightened() {
    let c = Cowork::start();
    let mut p = c.boot("modes");
    let mut ev = c.events("modes");
    p.sh("x", "sess", "true");
    ev.exit_of("x");
    let r = p.call("spawn", json!({"id": "f", "name": "sess", "command": "true", "allowedDomains": ["api.anthropic.com"]}));
    assert_eq!(r["success"], true, "{r}");
    ev.exit_of("f");
    let profile = profile_dir(&c);
    let data = c.env.root().join("data/boxdesk");
    let runtime = c.env.xdg_runtime.join("boxdesk/cowork");
    let dirs = [
        data.clone(),
        data.join("cowork"),
        profile.clone(),
        profile.join("sessions"),
        profile.join("sessions/sess"),
        profile.join("home"),
        runtime.clone(),
    ];
    for d in &dirs {
        assert_eq!(mode_of(d), 0o700, "{}", d.display());
    }
    for log in ["sandbox-host.log", "sandbox-net0.log"] {
        assert_eq!(mode_of(&profile.join(log)), 0o600, "{log}");
    }
    // What an older version left (0755 dirs, a 0644 log) is tightened at
    // the next startVM.
    assert_eq!(p.call("stopVM", json!({}))["success"], true);
    for d in &dirs[..4] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let log = profile.join("sandbox-host.log");
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(p.call("startVM", json!({}))["success"], true, "{}", c.log());
    for d in &dirs[..4] {
        assert_eq!(mode_of(d), 0o700, "{} not tightened", d.display());
    }
    assert_eq!(mode_of(&log), 0o600);
    assert!(c.log().contains("tightened"), "{}", c.log());
}

#[test]
fn a_sandbox_log_replaced_by_a_symlink_is_refused_and_its_target_left_alone() {
    let c = Cowork::start();
    let mut p = c.boot("link");
    assert_eq!(p.call("stopVM", json!({}))["success"], true);
    let log = profile_dir(&c).join("sandbox-host.log");
    let target = c.env.root().join("elsewhere");
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink(&target, &log).unwrap();
    let r = p.call("startVM", json!({}));
    assert_eq!(r["success"], false, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("sandbox-host.log"),
        "{r}"
    );
    assert!(!target.exists(), "the log symlink was followed");
}

#[test]
fn a_data_dir_owned_by_another_user_is_refused_not_used() {
    if crate::support::skip_unless_root("making a dir another uid owns needs root") {
        return;
    }
    let c = Cowork::start();
    let mut p = c.boot("owner");
    assert_eq!(p.call("stopVM", json!({}))["success"], true);
    let sessions = profile_dir(&c).join("sessions");
    std::os::unix::fs::chown(&sessions, Some(65534), Some(65534)).unwrap();
    let r = p.call("startVM", json!({}));
    assert_eq!(r["success"], false, "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("owned by uid 65534"),
        "{r}"
    );
    assert_eq!(mode_of(&sessions), 0o700, "left as it was");
}

#[test]
fn memory_mb_limits_the_sandbox_and_an_oom_killed_process_reports_it() {
    let c = Cowork::start();
    let mut ev = c.events("oom");
    let mut p = c.pipe("oom");
    let r = p.call("configure", json!({"memoryMB": 64, "cpuCount": 1}));
    assert_eq!(r["success"], true, "{r}");
    let r = p.call("startVM", json!({"bundlePath": "/nonexistent"}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    p.sh("small", "s1", "echo fine");
    let exit = ev.exit_of("small");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let Some(before) = exit.get("oomKillCount") else {
        println!("skipped: no cgroup for the sandbox's memory here (a user without delegation), so no OOM count: {exit}");
        return;
    };
    assert_eq!(before, 0, "{exit}");
    // One buffer filled at once, in the spawned process itself, as large
    // as the memory the kernel says it has less 1 MiB (a kernel refuses
    // outright to allocate more than its RAM): far past the cgroup's
    // 64 MiB, or past what a 64 MiB VM has free.
    p.sh(
        "hog",
        "s1",
        "kb=$(sed -n 's/^MemTotal: *\\([0-9]*\\) kB$/\\1/p' /proc/meminfo); \
         exec dd if=/dev/zero of=/dev/null bs=$((kb - 1024))k count=1",
    );
    let exit = ev.exit_of("hog");
    assert_eq!(exit["signal"], "SIGKILL", "{exit}");
    assert!(exit["oomKillCount"].as_u64().unwrap() >= 1, "{exit}");
    assert!(
        !ev.text("stderr", "hog").contains("268435456 bytes"),
        "the copy finished"
    );
}

/// The Landlock ABI of the kernel that runs a spawn: the host's, or on a VM
/// the guest images' (Linux 6.1 built with Landlock: ABI 2, no scopes).
fn landlock_abi() -> i64 {
    if client::on_vm() {
        2
    } else {
        crate::support::landlock_abi()
    }
}

#[test]
fn a_session_cannot_read_another_sessions_environment_or_signal_its_processes() {
    let c = Cowork::start();
    let mut p = c.boot("peers");
    let mut ev = c.events("peers");
    let abi = landlock_abi();
    // Session a: a token in its environment, a process that waits.
    p.call(
        "spawn",
        json!({"id": "a", "name": "a", "command": "/bin/sh",
               "args": ["-c", "echo $$; exec sleep 60"],
               "oauthToken": "peer-SECRET-7"}),
    );
    let first = ev.until("a's pid", |v| v["type"] == "stdout" && v["id"] == "a");
    let pid: u32 = first["data"].as_str().unwrap().trim().parse().unwrap();
    // Session b, of the same profile: reads a's environment, signals it.
    let script = format!(
        "if cat /proc/{pid}/environ >/dev/null 2>&1; then echo read; else echo unreadable; fi; \
         if kill -0 {pid} 2>/dev/null; then echo signalled; else echo unsignalled; fi; \
         readlink /proc/{pid}/cwd >/dev/null 2>&1 && echo cwd || echo nocwd"
    );
    p.call(
        "spawn",
        json!({"id": "b", "name": "b", "command": "/bin/sh", "args": ["-c", script]}),
    );
    assert_eq!(ev.exit_of("b")["exitCode"], 0, "{:?}", ev.seen);
    let out = ev.text("stdout", "b");
    assert!(!out.contains("peer-SECRET-7"), "{out}");
    if abi == 0 {
        println!("skipped: no Landlock in this kernel; sessions are not sealed ({out:?})");
        return;
    }
    assert!(
        out.contains("unreadable\n"),
        "session b read a's environ: {out}"
    );
    assert!(out.contains("nocwd\n"), "session b followed a's cwd: {out}");
    // Signals are sealed only where Landlock scopes them (ABI 6, Linux
    // 6.12); before that, sealing reads is the whole promise (docs/SECURITY.md).
    if abi >= 6 {
        assert!(
            out.contains("unsignalled\n"),
            "session b signalled a: {out}"
        );
    }
    // And a's own process still is a's to end: the server kills it.
    p.call("kill", json!({"id": "a", "signal": "SIGKILL"}));
    ev.exit_of("a");
}
