//! The scenarios of the app's use, each through `boxdesk cowork` with the
//! real Claude Code: each played alone in a profile of its own, and all of
//! them side by side as eight sessions of one profile, as the app keeps one
//! VM for many sessions (the nested L1 runs only that one: every Claude
//! Code start costs it ~13 s of emulated CPU).

use std::io::{Read, Write};
use std::net::TcpListener;

use serde_json::{json, Value};

use super::{results, say, session, spawn_claude, Session};

/// A session's folders, relative to `/` as the app names them.
fn rel(p: &std::path::Path) -> String {
    p.strip_prefix("/").unwrap().to_str().unwrap().to_owned()
}

/// An HTTP server on 127.0.0.3 answering every request `200 <body>`.
fn http_host(body: &'static str) -> u16 {
    let l = TcpListener::bind("127.0.0.3:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// One use of Claude Code as the app makes it: what its spawn asks for,
/// then what it does with the running process once it has answered a
/// first message.
trait Scenario {
    /// Extra arguments and spawn parameters; it makes the folders and
    /// servers they name.
    fn spawn(&mut self, _w: &Session, _cc: &Cc) -> (Vec<String>, Value) {
        (Vec::new(), json!({}))
    }

    /// Drives `cc` after its first message was answered.
    fn drive(&mut self, w: &mut Session, cc: &Cc);
}

/// A running `claude`: its process id and session name.
struct Cc {
    id: String,
    name: String,
    /// Its spawn's `allowedDomains`: on a VM backend, which VM it runs in.
    allowed: Value,
}

impl Cc {
    /// Where the session's folders are mounted inside.
    fn mnt(&self) -> String {
        format!("/sessions/{}/mnt", self.name)
    }
}

/// Spawns one `claude` per scenario in `w`'s profile, asks them all a
/// first message at once and waits for every answer; then drives each
/// scenario in turn. Whatever is still running is killed at the end.
/// `during` sees the sessions while all of them run.
fn play(w: &mut Session, scenarios: &mut [&mut dyn Scenario], during: impl FnOnce(&Session)) {
    let t0 = std::time::Instant::now();
    let mut ccs: Vec<Cc> = (0..scenarios.len())
        .map(|i| Cc {
            id: format!("cc{i}"),
            name: format!("s{i}"),
            allowed: json!([w.api.entry()]),
        })
        .collect();
    for (s, cc) in scenarios.iter_mut().zip(&mut ccs) {
        let (extra, more) = s.spawn(w, cc);
        if let Some(a) = more.get("allowedDomains") {
            cc.allowed = a.clone();
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let r = spawn_claude(&mut w.p, &w.api, &cc.id, &cc.name, &extra, more);
        assert_eq!(r["success"], true, "{r}\n{}", w.c.log());
        let failed = &r["result"]["failedMounts"];
        assert!(
            failed.as_array().is_none_or(Vec::is_empty),
            "{r}\n{}",
            w.c.log()
        );
    }
    // All asked at once, then every answer awaited.
    for cc in &ccs {
        let line = json!({"type": "user", "message": {"role": "user", "content": format!("hello {}", cc.id)}});
        let r = w.p.call(
            "writeStdin",
            json!({"id": cc.id, "data": format!("{line}\n")}),
        );
        assert_eq!(r["success"], true, "{r}");
    }
    // Eight starts at once take minutes in a VM under TCG (the nested L1):
    // silence is waited out in steps until the deadline.
    let limit = if crate::cowork::client::on_vm() {
        600
    } else {
        120
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(limit);
    while ccs.iter().any(|cc| results(&w.ev, &cc.id).is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "not every session answered: {:?}",
            w.ev.seen
        );
        let got = w.ev.drain_for(std::time::Duration::from_millis(250));
        w.ev.seen.extend(got);
    }
    for cc in &ccs {
        assert_eq!(
            results(&w.ev, &cc.id)[0]["result"],
            format!("echo: hello {}", cc.id)
        );
    }
    println!(
        "{} sessions started at once all answered {:.1} s after the first spawn",
        ccs.len(),
        t0.elapsed().as_secs_f64()
    );
    during(w);
    for (s, cc) in scenarios.iter_mut().zip(&ccs) {
        let t = std::time::Instant::now();
        s.drive(w, cc);
        println!(
            "{}: its scenario took {:.1} s",
            cc.id,
            t.elapsed().as_secs_f64()
        );
    }
    for cc in &ccs {
        if !exited(w, &cc.id) {
            w.p.call("kill", json!({"id": cc.id, "signal": "SIGKILL"}));
        }
        w.ev.exit_of(&cc.id);
    }
}

/// Whether an exit event of `id` was seen.
fn exited(w: &Session, id: &str) -> bool {
    w.ev.seen
        .iter()
        .any(|v| v["type"] == "exit" && v["id"] == id)
}

/// `scenario` alone in a profile of its own.
fn alone(test: &str, profile: &str, scenario: &mut dyn Scenario) {
    let Some(mut w) = session(test, profile) else {
        return;
    };
    play(&mut w, &mut [scenario], |_| {});
}

/// Two more user messages to the process that answered the first one,
/// kept alive between them; the API sees the whole conversation each time.
struct Conversation;

impl Scenario for Conversation {
    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        for (i, text) in ["second message", "third message"].iter().enumerate() {
            assert_eq!(
                say(&mut w.p, &mut w.ev, &cc.id, text),
                format!("echo: {text}")
            );
            // The same process answered each, kept alive between them.
            let running = w.p.call("isProcessRunning", json!({"id": cc.id}));
            assert_eq!(
                running["result"]["running"], true,
                "after message {i}: {running}"
            );
        }
        // Every turn went to the API through the proxy, with the whole
        // conversation so far.
        let asked = w.api.requests().into_iter().any(|r| {
            let messages = &r["body"]["messages"];
            r["path"]
                .as_str()
                .unwrap_or_default()
                .starts_with("/v1/messages")
                && messages.to_string().contains("third message")
                && messages.as_array().is_some_and(|m| m.len() >= 5)
        });
        assert!(asked, "{:?}", w.api.requests());
    }
}

#[test]
fn a_conversation_of_three_messages_runs_in_one_process_kept_alive_between_them() {
    alone(
        "a_conversation_of_three_messages_runs_in_one_process_kept_alive_between_them",
        "talk",
        &mut Conversation,
    );
}

/// Bash, Write, Read and Edit on a rw folder; a read-only one refuses.
#[derive(Default)]
struct Tools {
    proj: std::path::PathBuf,
    docs: std::path::PathBuf,
}

impl Scenario for Tools {
    fn spawn(&mut self, w: &Session, _cc: &Cc) -> (Vec<String>, Value) {
        let unique = w.c.env.home.join(format!("tools-{}", rand_suffix()));
        self.proj = unique.join("proj");
        self.docs = unique.join("docs");
        std::fs::create_dir_all(&self.proj).unwrap();
        std::fs::create_dir_all(&self.docs).unwrap();
        std::fs::write(self.docs.join("d.md"), "doc\n").unwrap();
        let mounts = json!({"additionalMounts": {
            "proj": {"path": rel(&self.proj)},
            "docs": {"path": rel(&self.docs), "mode": "ro"},
        }});
        (Vec::new(), mounts)
    }

    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        let (proj, docs, m) = (&self.proj, &self.docs, cc.mnt());
        let (p, ev, id) = (&mut w.p, &mut w.ev, cc.id.as_str());
        // Bash writes the rw folder, reads the read-only one and is
        // refused writing it (the refusal is in the tool's result).
        let out = say(
            p,
            ev,
            id,
            &format!(
                r#"TOOL Bash {{"command": "echo made-by-bash > {m}/proj/b.txt && cat {m}/docs/d.md; echo x > {m}/docs/new.txt", "description": "write"}}"#
            ),
        );
        assert!(out.contains("doc"), "{out}");
        assert!(out.to_lowercase().contains("read-only"), "{out}");
        assert_eq!(
            std::fs::read_to_string(proj.join("b.txt")).unwrap(),
            "made-by-bash\n"
        );
        say(
            p,
            ev,
            id,
            &format!(r#"TOOL Write {{"file_path": "{m}/proj/w.txt", "content": "one\n"}}"#),
        );
        assert_eq!(
            std::fs::read_to_string(proj.join("w.txt")).unwrap(),
            "one\n"
        );
        let out = say(
            p,
            ev,
            id,
            &format!(r#"TOOL Read {{"file_path": "{m}/proj/w.txt"}}"#),
        );
        assert!(out.contains("one"), "{out}");
        say(
            p,
            ev,
            id,
            &format!(
                r#"TOOL Edit {{"file_path": "{m}/proj/w.txt", "old_string": "one", "new_string": "two"}}"#
            ),
        );
        assert_eq!(
            std::fs::read_to_string(proj.join("w.txt")).unwrap(),
            "two\n"
        );
        // Write is refused in the read-only folder; the host's folder is
        // unchanged.
        let out = say(
            p,
            ev,
            id,
            &format!(r#"TOOL Write {{"file_path": "{m}/docs/w.txt", "content": "x"}}"#),
        );
        assert!(!docs.join("w.txt").exists(), "{out}");
        assert_eq!(std::fs::read_dir(docs).unwrap().count(), 1);
    }
}

/// A name no other scenario of this process uses.
fn rand_suffix() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn bash_write_read_and_edit_act_on_a_rw_folder_and_a_read_only_one_is_left_alone() {
    alone(
        "bash_write_read_and_edit_act_on_a_rw_folder_and_a_read_only_one_is_left_alone",
        "tools",
        &mut Tools::default(),
    );
}

/// `curl` of a server the spawn's `allowedDomains` lists, and of one it
/// does not.
#[derive(Default)]
struct Net {
    listed: u16,
    unlisted: u16,
}

impl Scenario for Net {
    fn spawn(&mut self, w: &Session, _cc: &Cc) -> (Vec<String>, Value) {
        self.listed = http_host("listed-server");
        self.unlisted = http_host("unlisted-server");
        let allowed =
            json!({"allowedDomains": [w.api.entry(), format!("127.0.0.3:{}", self.listed)]});
        (Vec::new(), allowed)
    }

    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        let (listed, unlisted) = (self.listed, self.unlisted);
        let fetch = format!(
            r#"TOOL Bash {{"command": "for p in {listed} {unlisted}; do echo \"$p: $(curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.3:$p/) $(curl -s http://127.0.0.3:$p/)\"; done", "description": "fetch"}}"#
        );
        let out = say(&mut w.p, &mut w.ev, &cc.id, &fetch);
        assert!(
            out.contains(&format!("{listed}: 200 listed-server")),
            "{out}"
        );
        assert!(out.contains(&format!("{unlisted}: 403")), "{out}");
        assert!(!out.contains("unlisted-server"), "{out}");
    }
}

#[test]
fn a_listed_local_server_is_reached_through_the_allowlist_and_an_unlisted_one_is_refused() {
    alone(
        "a_listed_local_server_is_reached_through_the_allowlist_and_an_unlisted_one_is_refused",
        "net",
        &mut Net::default(),
    );
}

/// A small MCP server (stdio, JSON-RPC lines): one tool, `shout`.
const MCP_SERVER: &str = r#"import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    meth = m.get("method")
    if meth == "initialize":
        r = {"protocolVersion": m["params"].get("protocolVersion", "2024-11-05"), "capabilities": {"tools": {}}, "serverInfo": {"name": "probe", "version": "1"}}
    elif meth == "tools/list":
        r = {"tools": [{"name": "shout", "description": "upper-cases text", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]}
    elif meth == "tools/call":
        r = {"content": [{"type": "text", "text": m["params"]["arguments"]["text"].upper() + " from mcp"}]}
    else:
        r = {}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
"#;

/// An MCP stdio server named by `--mcp-config`, its tool called.
struct Mcp;

impl Scenario for Mcp {
    fn spawn(&mut self, w: &Session, cc: &Cc) -> (Vec<String>, Value) {
        let proj = w.c.env.home.join(format!("mcp-{}", rand_suffix()));
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::write(proj.join("server.py"), MCP_SERVER).unwrap();
        let m = format!("{}/mcp", cc.mnt());
        std::fs::write(
            proj.join("mcp.json"),
            json!({"mcpServers": {"probe": {"type": "stdio", "command": "/usr/bin/python3", "args": [format!("{m}/server.py")]}}}).to_string(),
        )
        .unwrap();
        (
            vec![
                "--mcp-config".into(),
                format!("{m}/mcp.json"),
                "--allowedTools".into(),
                "mcp__probe__shout".into(),
            ],
            json!({"additionalMounts": {"mcp": {"path": rel(&proj)}}}),
        )
    }

    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        let out = say(
            &mut w.p,
            &mut w.ev,
            &cc.id,
            r#"TOOL mcp__probe__shout {"text": "hello"}"#,
        );
        assert!(out.contains("HELLO from mcp"), "{out}");
    }
}

#[test]
fn an_mcp_stdio_server_from_mcp_config_has_its_tool_called() {
    alone(
        "an_mcp_stdio_server_from_mcp_config_has_its_tool_called",
        "mcp",
        &mut Mcp,
    );
}

/// A turn the API takes 30 s to answer, killed once it is asked: the exit
/// carries the signal, the turn has no result, the process is gone.
struct KillMidTurn;

impl Scenario for KillMidTurn {
    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        let before = claudes(w, cc);
        assert!(before >= 1, "{} runs no claude process", cc.id);
        let answered = results(&w.ev, &cc.id).len();
        let line = json!({"type": "user", "message": {"role": "user", "content": "SLOW 30\nwait"}});
        w.p.call(
            "writeStdin",
            json!({"id": cc.id, "data": format!("{line}\n")}),
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !w
            .api
            .requests()
            .iter()
            .any(|r| r["body"].to_string().contains("SLOW 30"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the slow turn never reached the API"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let r = w.p.call("kill", json!({"id": cc.id, "signal": "SIGTERM"}));
        assert_eq!(r["success"], true, "{r}");
        let exit = w.ev.exit_of(&cc.id);
        assert!(
            exit["signal"] == "SIGTERM" || exit["exitCode"] == 143,
            "{exit}"
        );
        assert_eq!(
            results(&w.ev, &cc.id).len(),
            answered,
            "the killed turn has no result"
        );
        // Nothing of it is left in the sandbox.
        assert_eq!(claudes(w, cc), before - 1);
    }
}

/// How many `claude` processes run for `w`'s profile: in its VM, counted
/// inside; on namespaces (each spawn a pid namespace of its own), the
/// server's descendants on the host.
fn claudes(w: &mut Session, cc: &Cc) -> usize {
    if !crate::cowork::client::on_vm() {
        return descendants_named(w.c.child.0.id(), "claude");
    }
    // The same allowlist, so the same VM (cowork boots one per list).
    let id = format!("ps-{}-{}", cc.id, rand_suffix());
    let r = w.p.call(
        "spawn",
        json!({"id": id, "name": cc.name, "command": "/bin/sh", "isResume": false,
               "allowedDomains": cc.allowed,
               "args": ["-c", "for p in /proc/[0-9]*; do cat $p/comm; done"]}),
    );
    assert_eq!(r["success"], true, "{r}");
    w.ev.exit_of(&id);
    let out = w.ev.text("stdout", &id);
    out.lines().filter(|l| *l == "claude").count()
}

/// How many processes below `root` (on this host) are named `comm`.
fn descendants_named(root: u32, comm: &str) -> usize {
    let mut parent = std::collections::HashMap::new();
    let mut named = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = tail.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        parent.insert(pid, ppid.unwrap_or(0));
        if head.split_once('(').is_some_and(|(_, c)| c == comm) {
            named.push(pid);
        }
    }
    named
        .into_iter()
        .filter(|&pid| {
            let mut p = pid;
            for _ in 0..64 {
                match parent.get(&p) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 1 => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .count()
}

#[test]
fn a_kill_mid_turn_ends_the_process_with_its_signal_and_leaves_nothing_running() {
    alone(
        "a_kill_mid_turn_ends_the_process_with_its_signal_and_leaves_nothing_running",
        "kill",
        &mut KillMidTurn,
    );
}

/// A session that only answers, then is killed (the others keep running).
struct Idle;

impl Scenario for Idle {
    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        let r = w.p.call("kill", json!({"id": cc.id, "signal": "SIGKILL"}));
        assert_eq!(r["success"], true, "{r}");
        assert_eq!(w.ev.exit_of(&cc.id)["signal"], "SIGKILL");
    }
}

/// Several scenarios played by one process, in order: their spawns'
/// arguments and parameters joined (mounts merged, allowlists united).
struct All<'a>(Vec<&'a mut dyn Scenario>);

impl Scenario for All<'_> {
    fn spawn(&mut self, w: &Session, cc: &Cc) -> (Vec<String>, Value) {
        let mut args = Vec::new();
        let mut params = json!({"allowedDomains": [w.api.entry()]});
        for s in &mut self.0 {
            let (a, p) = s.spawn(w, cc);
            args.extend(a);
            merge(&mut params, p);
        }
        (args, params)
    }

    fn drive(&mut self, w: &mut Session, cc: &Cc) {
        let last = self.0.len().saturating_sub(1);
        for (i, s) in self.0.iter_mut().enumerate() {
            s.drive(w, cc);
            // Each leaves the process running for the next (the last may
            // end it).
            if i < last {
                let r = w.p.call("isProcessRunning", json!({"id": cc.id}));
                assert_eq!(
                    r["result"]["running"],
                    true,
                    "after scenario {i} of {}: {r}; {}",
                    self.0.len(),
                    w.c.log()
                );
            }
        }
    }
}

/// `more` into `into`: objects key by key, arrays united, anything else
/// replaced.
fn merge(into: &mut Value, more: Value) {
    match (into, more) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(old) => merge(old, v),
                    None => {
                        a.insert(k, v);
                    }
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for v in b {
                if !a.contains(&v) {
                    a.push(v);
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Eight sessions at once in one profile, as the app keeps many in one
/// VM: all of them answer a message sent to each at once, seven are killed
/// and the eighth plays every scenario above in turn (the nested L1 runs only this
/// test: each Claude Code start costs it ~13 s of emulated CPU).
#[test]
fn eight_sessions_at_once_in_one_profile_all_answer_and_one_plays_every_scenario() {
    let Some(mut w) = session(
        "eight_sessions_at_once_in_one_profile_all_answer_and_one_plays_every_scenario",
        "many",
    ) else {
        return;
    };
    let (mut talk, mut tools, mut net) = (Conversation, Tools::default(), Net::default());
    let (mut mcp, mut kill) = (Mcp, KillMidTurn);
    let mut every = All(vec![&mut talk, &mut tools, &mut net, &mut mcp, &mut kill]);
    let mut idle = [Idle, Idle, Idle, Idle, Idle, Idle, Idle];
    // The seven others are killed first: the scenarios then run beside
    // nothing else, as in their own tests.
    let mut scenarios: Vec<&mut dyn Scenario> =
        idle.iter_mut().map(|i| i as &mut dyn Scenario).collect();
    scenarios.push(&mut every);
    play(&mut w, &mut scenarios, |w| {
        let rss = std::fs::read_to_string(format!("/proc/{}/status", w.c.child.0.id()))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap_or("VmRSS: ?")
            .to_owned();
        // On a VM backend the guest's memory is the server's own (its
        // VMs run in its process).
        let note = if crate::cowork::client::on_vm() {
            " (its VM's guest memory included)"
        } else {
            ""
        };
        println!("boxdesk cowork with 8 Claude Code sessions: {rss}{note}");
    });
}
