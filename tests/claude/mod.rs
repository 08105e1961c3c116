//! The real workload: Claude Code itself (npm's `@anthropic-ai/claude-code`,
//! its native executable, pinned at [`VERSION`]) through `boxdesk cowork`,
//! driven exactly as the Claude Desktop app drives it — configure, startVM,
//! isGuestConnected, installSdk, spawn of `claude` with stream-json on
//! stdin, writeStdin per user message with the process kept alive between
//! them, kill — against a Messages API stand-in of our own on loopback
//! (`api.py`: streaming as the real API streams, the turns scripted by the
//! tests' own messages, every request recorded). The sandbox's only way to
//! the stand-in is cowork's proxy: `allowedDomains` names it.
//!
//! The binary comes from `$BOXDESK_CLAUDE`, else the cache
//! `scripts/claude-code.sh` installs it into (`$BOXDESK_CACHE/claude-code/`);
//! without it each test says `skipped:` and why. On the VM backend
//! (`BOXDESK_TEST_BACKEND=kvm`) the SDK reaches the guest over virtio-fs;
//! `tests/nested/claude-stage.sh` runs that in the x86_64 L1.

mod bench;
mod tools;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cowork::client::{Cowork, Events, Pipe};

/// One test's world: a cowork server with profile `profile` booted, its
/// events subscribed, the API stand-in, the real SDK installed.
pub struct Session {
    /// The server (its env is the test's).
    pub c: Cowork,
    /// The Messages API stand-in.
    pub api: Api,
    /// The app's connection.
    pub p: Pipe,
    /// The profile's events.
    pub ev: Events,
    /// The Claude Code binary on the host.
    pub claude: PathBuf,
}

/// [`Session`] for `test`, or `None` after printing why it skips (no
/// Claude Code binary here).
pub fn session(test: &str, profile: &str) -> Option<Session> {
    let claude = claude_binary(test)?;
    let c = Cowork::start();
    let api = Api::start(c.env.root());
    let mut p = c.boot(profile);
    let ev = c.events(profile);
    install_sdk(&c, &mut p, &claude);
    Some(Session {
        c,
        api,
        p,
        ev,
        claude,
    })
}

/// The pinned Claude Code release (scripts/claude-code.sh installs it).
pub const VERSION: &str = "2.1.332";

/// How long one turn may take before a test gives up.
const TURN: Duration = Duration::from_secs(60);

/// The Claude Code binary, or `None` after printing why the test skips.
pub fn claude_binary(test: &str) -> Option<PathBuf> {
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "x64",
    };
    let path = std::env::var_os("BOXDESK_CLAUDE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("BOXDESK_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| "/var/cache/boxdesk".into());
            cache.join("claude-code").join(VERSION).join(format!(
                "node_modules/@anthropic-ai/claude-code-linux-{arch}/claude"
            ))
        });
    if path.is_file() {
        return Some(path);
    }
    println!(
        "skipped: {test}: no Claude Code binary at {} (bash scripts/claude-code.sh installs it)",
        path.display()
    );
    None
}

/// The Messages API stand-in, on 127.0.0.2 (not a loopback address the
/// sandbox's `NO_PROXY` names, so the client's requests go through the
/// proxy, as the real API's would).
pub struct Api {
    child: Child,
    /// Its port.
    pub port: u16,
    log: PathBuf,
}

impl Api {
    /// Starts one, recording into `dir/api.log`.
    pub fn start(dir: &Path) -> Api {
        let log = dir.join("api.log");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/claude/api.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("127.0.0.2")
            .arg(&log)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 for the API stand-in");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the stand-in said {line:?}"));
        Api { child, port, log }
    }

    /// `http://127.0.0.2:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.2:{}", self.port)
    }

    /// The `allowedDomains` entry that lets a sandbox reach it.
    pub fn entry(&self) -> String {
        format!("127.0.0.2:{}", self.port)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where `installSdk` finds the SDK under the test's home: the binary
/// hard-linked there (copied where a link cannot be made).
pub fn install_sdk(c: &Cowork, p: &mut Pipe, claude: &Path) {
    let sdk = c.env.home.join(".config/Claude/claude-code-vm");
    let dir = sdk.join(VERSION);
    std::fs::create_dir_all(&dir).unwrap();
    let dst = dir.join("claude");
    if std::fs::hard_link(claude, &dst).is_err() {
        std::fs::copy(claude, &dst).unwrap();
    }
    let rel = sdk.strip_prefix("/").unwrap().to_str().unwrap().to_owned();
    let r = p.call("installSdk", json!({"sdkSubpath": rel, "version": VERSION}));
    assert_eq!(r["success"], true, "installSdk: {r}\n{}", c.log());
}

/// The environment a spawn of `claude` gets from the test, as the app
/// gives its own: the API's address and a key; no traffic but the API's.
pub fn claude_env(api: &Api) -> Value {
    json!({
        "ANTHROPIC_BASE_URL": api.url(),
        "ANTHROPIC_API_KEY": "sk-ant-boxdesk-test",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    })
}

/// The app's arguments: stream-json both ways, the process kept for the
/// next message; `extra` after them.
pub fn claude_args(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--output-format",
        "stream-json",
        "--verbose",
        "--input-format",
        "stream-json",
        "--allowedTools",
        "Bash",
        "Write",
        "Read",
        "Edit",
    ]
    .map(String::from)
    .into();
    a.extend(extra.iter().map(|s| (*s).to_owned()));
    a
}

/// The `result` lines process `id` printed so far.
pub fn results(ev: &Events, id: &str) -> Vec<Value> {
    ev.text("stdout", id)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "result")
        .collect()
}

/// Sends `text` as one user message to `id` and waits for its result line;
/// returns the result's `result` text.
pub fn say(p: &mut Pipe, ev: &mut Events, id: &str, text: &str) -> String {
    let t0 = Instant::now();
    let before = results(ev, id).len();
    let line = json!({"type": "user", "message": {"role": "user", "content": text}});
    let r = p.call("writeStdin", json!({"id": id, "data": format!("{line}\n")}));
    assert_eq!(r["success"], true, "writeStdin: {r}");
    let deadline = Instant::now() + TURN;
    while results(ev, id).len() <= before {
        assert!(
            Instant::now() < deadline,
            "no result for {text:?}: {:?}",
            ev.seen
        );
        let v = ev.next(&format!("the result of {text:?}"), |v| {
            v["id"] == id && (v["type"] == "stdout" || v["type"] == "exit")
        });
        assert_ne!(v["type"], "exit", "{id} exited mid-turn: {:?}", ev.seen);
    }
    println!(
        "{id}: {:.1} s for {:?}",
        t0.elapsed().as_secs_f64(),
        text.get(..40).unwrap_or(text)
    );
    let r = &results(ev, id)[before];
    assert_eq!(r["is_error"], false, "{r}");
    r["result"].as_str().unwrap_or_default().to_owned()
}

/// Spawns `claude` as process `id` in session `name` with `extra`
/// arguments, allowed to reach `allowed` (the API's entry first).
pub fn spawn_claude(
    p: &mut Pipe,
    api: &Api,
    id: &str,
    name: &str,
    extra: &[&str],
    more: Value,
) -> Value {
    let mut params = json!({
        "id": id, "name": name, "command": "/usr/local/bin/claude",
        "args": claude_args(extra), "env": claude_env(api),
        "allowedDomains": [api.entry()], "isResume": false,
    });
    if let (Some(o), Some(m)) = (params.as_object_mut(), more.as_object()) {
        for (k, v) in m {
            o.insert(k.clone(), v.clone());
        }
    }
    p.call("spawn", params)
}
