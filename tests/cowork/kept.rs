//! Cowork's sandboxes are kept like any other: `boxdesk ls` lists them
//! with their profile, `boxdesk exec` reaches inside, `boxdesk stop` ends
//! one (and cowork lives on), and nothing of them outlives the server.
//! Run as root and, by scripts/test-unprivileged.sh, as a user: then the
//! server sits in a user namespace of its own, and `ls`/`exec`/`stop`
//! come from outside it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{Cowork, WAIT};

/// `boxdesk ls --json` in the server's environment.
fn ls(c: &Cowork) -> Vec<Value> {
    let out = c.env.run(["ls", "--json"]);
    assert_eq!(out.code(), 0, "{out}");
    serde_json::from_str::<Value>(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {out}"))
        .as_array()
        .unwrap()
        .clone()
}

/// The names `ls` shows for `profile`.
fn sandboxes_of(c: &Cowork, profile: &str) -> Vec<String> {
    ls(c)
        .iter()
        .filter(|r| r["profile"] == profile)
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_running_profiles_sandbox_is_listed_with_its_profile_and_exec_into_it_sees_the_session_dir() {
    let c = Cowork::start();
    let mut p = c.boot("listed");
    let mut ev = c.events("listed");
    p.sh("w", "sess", "echo from-cowork > /sessions/sess/marker");
    assert_eq!(ev.exit_of("w")["exitCode"], 0);

    let rows = ls(&c);
    let row = rows
        .iter()
        .find(|r| r["profile"] == "listed")
        .unwrap_or_else(|| panic!("no sandbox of profile listed in {rows:?}\n{}", c.log()));
    let name = row["name"].as_str().unwrap();
    assert!(name.starts_with("cowork-"), "{row}");
    assert_eq!(row["state"], "running", "{row}");
    assert_eq!(row["backend"], super::client::backend_word(), "{row}");
    let table = c.env.run(["ls"]);
    let line = table.stdout.lines().find(|l| l.starts_with(name)).unwrap();
    assert!(line.ends_with("listed"), "{table}");
    assert!(
        table.stdout.lines().next().unwrap().ends_with("PROFILE"),
        "{table}"
    );

    let out = c.env.run([
        "exec",
        name,
        "--",
        "cat",
        "/sessions/sess/marker",
        "sess/marker",
    ]);
    assert_eq!(out.code(), 0, "{out}\n{}", c.log());
    assert_eq!(out.stdout, "from-cowork\nfrom-cowork\n");
    let out = c.env.run([
        "exec",
        "--cwd",
        "/sessions",
        name,
        "--",
        "sh",
        "-c",
        "pwd; ls",
    ]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "/sessions\nsess\n", "{out}");
    let home = c.env.home.display().to_string();
    let out = c.env.run(["exec", name, "--", "test", "-d", &home]);
    assert_eq!(out.code(), 0, "the home mirror is at the home path: {out}");
}

#[test]
fn boxdesk_stop_of_a_cowork_sandbox_ends_its_processes_and_the_next_start_vm_starts_it_again() {
    let c = Cowork::start();
    let mut p = c.boot("stopped");
    let mut ev = c.events("stopped");
    assert_eq!(p.sh("long", "s", "sleep 300")["success"], true);
    let name = sandboxes_of(&c, "stopped").pop().expect("listed");

    let out = c.env.run(["stop", &name]);
    assert_eq!(out.code(), 0, "{out}\n{}", c.log());
    assert!(c.env.run(["info", &name]).code() != 0, "still answers");
    assert!(
        !c.env.xdg_state.join("boxdesk").join(&name).exists(),
        "its state dir stays"
    );
    let exit = ev.exit_of("long");
    assert_ne!(exit["exitCode"], 0, "{exit}");
    p.poll("isRunning", "/result/running", json!(false));
    let r = p.call("isProcessRunning", json!({"id": "long"}));
    assert_eq!(r["result"]["running"], false, "{r}");
    assert!(sandboxes_of(&c, "stopped").is_empty(), "{:?}", ls(&c));

    let r = p.call("startVM", json!({}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    p.sh("again", "s", "echo back");
    let exit = ev.exit_of("again");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(ev.text("stdout", "again"), "back\n");
    assert_eq!(sandboxes_of(&c, "stopped").len(), 1, "{:?}", ls(&c));
}

#[test]
fn nothing_of_cowork_sandboxes_is_left_after_cowork_exits() {
    let mut c = Cowork::start();
    let mut p = c.boot("left");
    let mut ev = c.events("left");
    p.sh("h", "s", "true");
    ev.exit_of("h");
    let r = p.call(
        "spawn",
        json!({"id": "f", "name": "s", "command": "true", "allowedDomains": ["example.com"]}),
    );
    assert_eq!(r["success"], true, "{r}");
    ev.exit_of("f");
    let names = sandboxes_of(&c, "left");
    assert_eq!(names.len(), 2, "{:?}\n{}", ls(&c), c.log());
    assert!(names.iter().any(|n| n.ends_with("-net0")), "{names:?}");

    // SAFETY: kill takes plain integers; the server is our child.
    unsafe { libc::kill(c.child.0.id() as i32, libc::SIGTERM) };
    let status = crate::support::wait_exit(&mut c.child.0);
    assert_eq!(status.code(), Some(0), "{}", c.log());
    assert_eq!(ls(&c), Vec::<Value>::new());
    let left = |dir: std::path::PathBuf| -> Vec<String> {
        std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("cowork-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(left(c.env.runtime()), Vec::<String>::new());
    assert_eq!(left(c.env.xdg_state.join("boxdesk")), Vec::<String>::new());
}

/// How many of `pid`'s threads are named `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .count()
}

#[test]
fn a_sandbox_that_ended_leaves_no_accepting_thread_behind_in_cowork() {
    let c = Cowork::start();
    let mut p = c.boot("cycled");
    let pid = c.child.0.id();
    for round in 0..3 {
        let name = sandboxes_of(&c, "cycled").pop().expect("listed");
        let out = if round == 1 {
            c.env.run(["stop", &name])
        } else {
            assert_eq!(p.call("stopVM", json!({}))["success"], true);
            c.env.run(["ls"])
        };
        assert_eq!(out.code(), 0, "{out}");
        let r = p.call("startVM", json!({}));
        assert_eq!(r["success"], true, "{r}\n{}", c.log());
    }
    // One control socket; one agent front (a namespace sandbox's
    // forwarder), or one VM's queue-kick thread.
    let agent = if super::client::on_vm() {
        "virtio-notify"
    } else {
        "agent-accept"
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let counts = ["control-accept", agent].map(|n| threads_named(pid, n));
        if counts == [1, 1] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "accepting threads of ended sandboxes stay: {counts:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_name_another_sandbox_holds_makes_cowork_take_the_next_free_one() {
    let c = Cowork::start();
    let taken = format!("cowork-{}-taken", c.child.0.id());
    let other = c.env.start(&taken, &[]);
    let _p = c.boot("taken");
    assert_eq!(
        sandboxes_of(&c, "taken"),
        [format!("{taken}-2")],
        "{:?}",
        ls(&c)
    );
    let info = c.env.info(&taken);
    assert!(!info.contains_key("profile"), "{info:?}");
    drop(other);
}
