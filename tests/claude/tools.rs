//! The scenarios of the app's use, each through `boxdesk cowork` with the
//! real Claude Code.

use std::io::{Read, Write};
use std::net::TcpListener;

use serde_json::json;

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

#[test]
fn a_conversation_of_three_messages_runs_in_one_process_kept_alive_between_them() {
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        ..
    }) = session(
        "a_conversation_of_three_messages_runs_in_one_process_kept_alive_between_them",
        "talk",
    )
    else {
        return;
    };
    let r = spawn_claude(&mut p, &api, "cc", "s", &[], json!({}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    for (i, text) in ["first message", "second message", "third message"]
        .iter()
        .enumerate()
    {
        assert_eq!(say(&mut p, &mut ev, "cc", text), format!("echo: {text}"));
        // The same process answered each, kept alive between them.
        let running = p.call("isProcessRunning", json!({"id": "cc"}));
        assert_eq!(
            running["result"]["running"], true,
            "after message {i}: {running}"
        );
    }
    // Every turn went to the API through the proxy, with the whole
    // conversation so far.
    let asked: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap_or_default()
                .starts_with("/v1/messages")
        })
        .filter(|r| {
            r["body"]["messages"]
                .as_array()
                .is_some_and(|m| m.len() >= 5)
        })
        .collect();
    assert!(!asked.is_empty(), "{:?}", api.requests());
    p.call("kill", json!({"id": "cc", "signal": "SIGTERM"}));
    let exit = ev.exit_of("cc");
    assert!(
        exit["signal"] == "SIGTERM" || exit["exitCode"] == 143 || exit["exitCode"] == 0,
        "{exit}"
    );
}

#[test]
fn bash_write_read_and_edit_act_on_a_rw_folder_and_a_read_only_one_is_left_alone() {
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        ..
    }) = session(
        "bash_write_read_and_edit_act_on_a_rw_folder_and_a_read_only_one_is_left_alone",
        "tools",
    )
    else {
        return;
    };
    let proj = c.env.home.join("proj");
    let docs = c.env.home.join("docs");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(docs.join("d.md"), "doc\n").unwrap();
    let mounts = json!({"additionalMounts": {
        "proj": {"path": rel(&proj)},
        "docs": {"path": rel(&docs), "mode": "ro"},
    }});
    let r = spawn_claude(&mut p, &api, "cc", "s", &[], mounts);
    assert_eq!(r["result"], json!({}), "{r}\n{}", c.log());
    let m = "/sessions/s/mnt";
    let out = say(
        &mut p,
        &mut ev,
        "cc",
        &format!(
            r#"TOOL Bash {{"command": "echo made-by-bash > {m}/proj/b.txt && cat {m}/docs/d.md", "description": "write"}}"#
        ),
    );
    assert!(out.contains("doc"), "{out}");
    assert_eq!(
        std::fs::read_to_string(proj.join("b.txt")).unwrap(),
        "made-by-bash\n"
    );
    say(
        &mut p,
        &mut ev,
        "cc",
        &format!(r#"TOOL Write {{"file_path": "{m}/proj/w.txt", "content": "one\n"}}"#),
    );
    assert_eq!(
        std::fs::read_to_string(proj.join("w.txt")).unwrap(),
        "one\n"
    );
    let out = say(
        &mut p,
        &mut ev,
        "cc",
        &format!(r#"TOOL Read {{"file_path": "{m}/proj/w.txt"}}"#),
    );
    assert!(out.contains("one"), "{out}");
    say(
        &mut p,
        &mut ev,
        "cc",
        &format!(
            r#"TOOL Edit {{"file_path": "{m}/proj/w.txt", "old_string": "one", "new_string": "two"}}"#
        ),
    );
    assert_eq!(
        std::fs::read_to_string(proj.join("w.txt")).unwrap(),
        "two\n"
    );
    // The read-only folder: the tool reports the refusal, the host's
    // folder is unchanged.
    let out = say(
        &mut p,
        &mut ev,
        "cc",
        &format!(
            r#"TOOL Bash {{"command": "echo x > {m}/docs/new.txt", "description": "write ro"}}"#
        ),
    );
    assert!(out.to_lowercase().contains("read-only"), "{out}");
    let out = say(
        &mut p,
        &mut ev,
        "cc",
        &format!(r#"TOOL Write {{"file_path": "{m}/docs/w.txt", "content": "x"}}"#),
    );
    assert!(!docs.join("w.txt").exists(), "{out}");
    assert_eq!(std::fs::read_dir(&docs).unwrap().count(), 1);
    p.call("kill", json!({"id": "cc", "signal": "SIGKILL"}));
    ev.exit_of("cc");
}

#[test]
fn a_listed_local_server_is_reached_through_the_allowlist_and_an_unlisted_one_is_refused() {
    let listed = http_host("listed-server");
    let unlisted = http_host("unlisted-server");
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        ..
    }) = session(
        "a_listed_local_server_is_reached_through_the_allowlist_and_an_unlisted_one_is_refused",
        "net",
    )
    else {
        return;
    };
    let allowed = json!({"allowedDomains": [api.entry(), format!("127.0.0.3:{listed}")]});
    let r = spawn_claude(&mut p, &api, "cc", "s", &[], allowed);
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    let fetch = |port: u16| {
        format!(
            r#"TOOL Bash {{"command": "curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.3:{port}/; echo; curl -s http://127.0.0.3:{port}/", "description": "fetch"}}"#
        )
    };
    let out = say(&mut p, &mut ev, "cc", &fetch(listed));
    assert!(
        out.contains("200") && out.contains("listed-server"),
        "{out}"
    );
    let out = say(&mut p, &mut ev, "cc", &fetch(unlisted));
    assert!(
        out.contains("403") && !out.contains("unlisted-server"),
        "{out}"
    );
    p.call("kill", json!({"id": "cc", "signal": "SIGKILL"}));
    ev.exit_of("cc");
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

#[test]
fn an_mcp_stdio_server_from_mcp_config_has_its_tool_called() {
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        ..
    }) = session(
        "an_mcp_stdio_server_from_mcp_config_has_its_tool_called",
        "mcp",
    )
    else {
        return;
    };
    let proj = c.env.home.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::write(proj.join("server.py"), MCP_SERVER).unwrap();
    let m = "/sessions/s/mnt/proj";
    std::fs::write(
        proj.join("mcp.json"),
        json!({"mcpServers": {"probe": {"type": "stdio", "command": "/usr/bin/python3", "args": [format!("{m}/server.py")]}}}).to_string(),
    )
    .unwrap();
    let mcp = format!("{m}/mcp.json");
    let r = spawn_claude(
        &mut p,
        &api,
        "cc",
        "s",
        &["--mcp-config", &mcp, "--allowedTools", "mcp__probe__shout"],
        json!({"additionalMounts": {"proj": {"path": rel(&proj)}}}),
    );
    assert_eq!(r["result"], json!({}), "{r}\n{}", c.log());
    let out = say(
        &mut p,
        &mut ev,
        "cc",
        r#"TOOL mcp__probe__shout {"text": "hello"}"#,
    );
    assert!(out.contains("HELLO from mcp"), "{out}");
    p.call("kill", json!({"id": "cc", "signal": "SIGKILL"}));
    ev.exit_of("cc");
}

#[test]
fn a_kill_mid_turn_ends_the_process_with_its_signal_and_leaves_nothing_running() {
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        ..
    }) = session(
        "a_kill_mid_turn_ends_the_process_with_its_signal_and_leaves_nothing_running",
        "kill",
    )
    else {
        return;
    };
    let r = spawn_claude(&mut p, &api, "cc", "s", &[], json!({}));
    assert_eq!(r["success"], true, "{r}\n{}", c.log());
    assert_eq!(say(&mut p, &mut ev, "cc", "warm up"), "echo: warm up");
    // A turn the API takes 30 s to answer, killed once it is asked.
    let line = json!({"type": "user", "message": {"role": "user", "content": "SLOW 30\nwait"}});
    p.call(
        "writeStdin",
        json!({"id": "cc", "data": format!("{line}\n")}),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !api
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
    let r = p.call("kill", json!({"id": "cc", "signal": "SIGTERM"}));
    assert_eq!(r["success"], true, "{r}");
    let exit = ev.exit_of("cc");
    assert!(
        exit["signal"] == "SIGTERM" || exit["exitCode"] == 143,
        "{exit}"
    );
    assert_eq!(results(&ev, "cc").len(), 1, "the killed turn has no result");
    // Nothing of it is left in the sandbox.
    p.sh(
        "ps",
        "s",
        "for p in /proc/[0-9]*; do cat $p/comm; done | grep -c claude || true",
    );
    ev.exit_of("ps");
    assert_eq!(ev.text("stdout", "ps"), "0\n");
}

#[test]
fn eight_sessions_at_once_in_one_profile_all_answer() {
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        ..
    }) = session("eight_sessions_at_once_in_one_profile_all_answer", "many")
    else {
        return;
    };
    let ids: Vec<String> = (0..8).map(|i| format!("cc{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let r = spawn_claude(&mut p, &api, id, &format!("s{i}"), &[], json!({}));
        assert_eq!(r["success"], true, "{r}\n{}", c.log());
    }
    // All asked at once, then every answer awaited.
    for id in &ids {
        let line =
            json!({"type": "user", "message": {"role": "user", "content": format!("hello {id}")}});
        let r = p.call("writeStdin", json!({"id": id, "data": format!("{line}\n")}));
        assert_eq!(r["success"], true, "{r}");
    }
    // Eight starts at once take a while in a VM under TCG (the nested L1):
    // silence is waited out in steps until the deadline.
    let limit = if crate::cowork::client::on_vm() {
        600
    } else {
        120
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(limit);
    while ids.iter().any(|id| results(&ev, id).is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "not every session answered: {:?}",
            ev.seen
        );
        let got = ev.drain_for(std::time::Duration::from_secs(2));
        ev.seen.extend(got);
    }
    for id in &ids {
        assert_eq!(results(&ev, id)[0]["result"], format!("echo: hello {id}"));
    }
    let rss = std::fs::read_to_string(format!("/proc/{}/status", c.child.0.id()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?")
        .to_owned();
    println!("boxdesk cowork with 8 Claude Code sessions: {rss}");
    for id in &ids {
        p.call("kill", json!({"id": id, "signal": "SIGKILL"}));
        ev.exit_of(id);
    }
}
