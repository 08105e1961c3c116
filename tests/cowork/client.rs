//! A client of `boxdesk cowork` that speaks exactly as the Claude Desktop
//! app does (seed 000): `u32` big-endian length + JSON, one-shot requests
//! without id, a persistent pipe with numeric ids, and an event
//! subscription that must be acked first.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{bin, KillOnDrop, TestEnv};

/// How long a test waits for any one reply or event.
pub const WAIT: Duration = Duration::from_secs(30);

/// A running `boxdesk cowork` with its own environment.
pub struct Cowork {
    pub env: TestEnv,
    pub sock: PathBuf,
    pub log: PathBuf,
    pub child: KillOnDrop,
}

impl Cowork {
    /// Starts a server on `<runtime>/cw.sock` and waits for the socket.
    pub fn start() -> Cowork {
        Self::start_with_data(None)
    }

    /// [`Cowork::start`] with `XDG_DATA_HOME` at `data(env)` (default: a
    /// dir beside `HOME`).
    pub fn start_with_data(data: Option<fn(&TestEnv) -> PathBuf>) -> Cowork {
        Self::start_with_dirs(data, None)
    }

    /// [`Cowork::start_with_data`], and `$XDG_STATE_HOME` where `state`
    /// says (the test env's own when `None`).
    pub fn start_with_dirs(
        data: Option<fn(&TestEnv) -> PathBuf>,
        state: Option<fn(&TestEnv) -> PathBuf>,
    ) -> Cowork {
        let env = TestEnv::new();
        let sock = env.xdg_runtime.join("cw.sock");
        let log = env.root().join("cowork.log");
        let data = data.map_or_else(|| env.root().join("data"), |f| f(&env));
        let state = state.map_or_else(|| env.xdg_state.clone(), |f| f(&env));
        let child = spawn_server_in(&env, &sock, &log, &data, &state);
        let deadline = Instant::now() + WAIT;
        while UnixStream::connect(&sock).is_err() {
            assert!(
                Instant::now() < deadline,
                "cowork did not bind: {}",
                read(&log)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Cowork {
            env,
            sock,
            log,
            child: KillOnDrop(child),
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        read(&self.log)
    }

    /// A one-shot request: `{method, params}`, half-close, one reply.
    pub fn one_shot(&self, method: &str, params: Value) -> Value {
        let mut s = self.connect();
        write_frame(&mut s, &json!({"method": method, "params": params}));
        s.shutdown(Shutdown::Write).unwrap();
        read_frame(&mut s).unwrap_or_else(|| panic!("no reply to {method}; log:\n{}", self.log()))
    }

    /// A connected socket with the test's read timeout.
    pub fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.sock).expect("connect to cowork");
        s.set_read_timeout(Some(WAIT)).unwrap();
        s
    }

    /// A persistent pipe, configured for profile `name` as the app does.
    pub fn pipe(&self, name: &str) -> Pipe {
        let mut p = Pipe {
            s: self.connect(),
            next: 1,
            early: HashMap::new(),
        };
        let r = p.call(
            "configure",
            json!({"userDataName": name, "userDataRoot": "/r", "sessionOnly": true}),
        );
        assert_eq!(r["success"], true, "{r}");
        p
    }

    /// An event subscription for profile `name`; checks the ack comes first.
    pub fn events(&self, name: &str) -> Events {
        let mut s = self.connect();
        write_frame(
            &mut s,
            &json!({"method": "subscribeEvents", "params": {"userDataName": name, "userDataRoot": "/r"}}),
        );
        let ack = read_frame(&mut s).expect("subscribe ack");
        assert_eq!(
            ack["success"], true,
            "the first frame must be the ack: {ack}"
        );
        assert!(
            ack.get("type").is_none(),
            "the first frame must be the ack: {ack}"
        );
        Events {
            s,
            seen: Vec::new(),
        }
    }

    /// configure + startVM + poll isGuestConnected, on a fresh pipe.
    pub fn boot(&self, name: &str) -> Pipe {
        let mut p = self.pipe(name);
        let r = p.call("startVM", json!({"bundlePath": "/nonexistent"}));
        assert_eq!(r["success"], true, "startVM: {r}\nlog:\n{}", self.log());
        p.poll("isGuestConnected", "/result/connected", json!(true));
        p
    }
}

/// Starts `boxdesk cowork -socket SOCK` in `env`, stderr to `log`.
pub fn spawn_server(env: &TestEnv, sock: &Path, log: &Path) -> std::process::Child {
    spawn_server_with(env, sock, log, &env.root().join("data"))
}

/// [`spawn_server`] with `XDG_DATA_HOME` at `data`.
pub fn spawn_server_with(
    env: &TestEnv,
    sock: &Path,
    log: &Path,
    data: &Path,
) -> std::process::Child {
    spawn_server_in(env, sock, log, data, &env.xdg_state)
}

/// [`spawn_server_with`] with `$XDG_STATE_HOME` at `state`.
pub fn spawn_server_in(
    env: &TestEnv,
    sock: &Path,
    log: &Path,
    data: &Path,
    state: &Path,
) -> std::process::Child {
    let logf = std::fs::File::create(log).unwrap();
    Command::new(bin())
        .args(["cowork", "-socket"])
        .arg(sock)
        .env("XDG_RUNTIME_DIR", &env.xdg_runtime)
        .env("XDG_STATE_HOME", state)
        .env("XDG_DATA_HOME", data)
        .env("HOME", &env.home)
        .env_remove("BOXDESK_BACKEND")
        .env_remove("RUST_LOG")
        .envs(test_backend().map(|b| ("BOXDESK_BACKEND", b)))
        .stdin(Stdio::null())
        .stdout(logf.try_clone().unwrap())
        .stderr(logf)
        .spawn()
        .expect("spawn boxdesk cowork")
}

/// The backend the suite runs cowork on: `BOXDESK_TEST_BACKEND` (CI sets
/// `kvm` inside the nested L1s), else cowork's own choice (`auto`).
pub fn test_backend() -> Option<String> {
    std::env::var("BOXDESK_TEST_BACKEND")
        .ok()
        .filter(|b| !b.is_empty())
}

/// Whether the suite runs cowork's sandboxes in VMs.
pub fn on_vm() -> bool {
    matches!(test_backend().as_deref(), Some("kvm" | "hvf"))
}

/// The backend `info` and `ls` report for cowork's sandboxes in this run.
pub fn backend_word() -> &'static str {
    match test_backend().as_deref() {
        Some("kvm") => "kvm",
        Some("hvf") => "hvf",
        _ => "namespace",
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Writes one frame.
pub fn write_frame(s: &mut UnixStream, v: &Value) {
    let body = serde_json::to_vec(v).unwrap();
    s.write_all(&(body.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&body).unwrap();
}

/// Reads one frame; `None` at a clean end of stream.
pub fn read_frame(s: &mut UnixStream) -> Option<Value> {
    try_read_frame(s).unwrap_or_else(|e| panic!("reading a frame: {e}"))
}

/// Reads one frame; `Ok(None)` at a clean end of stream, `Err` on a
/// timeout or error.
pub fn try_read_frame(s: &mut UnixStream) -> std::io::Result<Option<Value>> {
    let mut len = [0u8; 4];
    if let Err(e) = s.read_exact(&mut len) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Ok(None);
        }
        return Err(e);
    }
    let len = u32::from_be_bytes(len) as usize;
    assert!(len <= 10 << 20, "frame of {len} bytes");
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(Some(serde_json::from_slice(&body).expect("frame is JSON")))
}

/// A persistent RPC pipe.
pub struct Pipe {
    pub s: UnixStream,
    next: u64,
    early: HashMap<u64, Value>,
}

impl Pipe {
    /// Sends a request and returns its id without waiting.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        write_frame(
            &mut self.s,
            &json!({"method": method, "id": id, "params": params}),
        );
        id
    }

    /// Waits for the reply to `id` (replies to others are kept).
    pub fn wait(&mut self, id: u64) -> Value {
        if let Some(v) = self.early.remove(&id) {
            return v;
        }
        loop {
            let v = read_frame(&mut self.s).expect("pipe closed");
            let got = v["id"].as_u64().expect("a pipe reply carries its id");
            if got == id {
                return v;
            }
            self.early.insert(got, v);
        }
    }

    /// Sends and waits.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.wait(id)
    }

    /// Calls `method` (no params) until its reply's `pointer` is `want`;
    /// fails the test after [`WAIT`].
    pub fn poll(&mut self, method: &str, pointer: &str, want: Value) {
        let deadline = Instant::now() + WAIT;
        loop {
            let r = self.call(method, json!({}));
            if r.pointer(pointer) == Some(&want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{method}: {pointer} never became {want}: {r}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Spawns `sh -c script` as process `id` in session `name`.
    pub fn sh(&mut self, id: &str, name: &str, script: &str) -> Value {
        self.call("spawn", json!({"id": id, "name": name, "command": "/bin/sh", "args": ["-c", script], "isResume": false}))
    }
}

/// An event subscription.
pub struct Events {
    s: UnixStream,
    /// Every event read so far.
    pub seen: Vec<Value>,
}

impl Events {
    /// Reads events until `pred` holds for one (one already seen counts);
    /// returns it.
    pub fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.seen.iter().find(|v| pred(v)) {
            return v.clone();
        }
        self.next(what, pred)
    }

    /// Reads new events (none seen before is looked at) until `pred` holds
    /// for one; returns it.
    pub fn next(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = match try_read_frame(&mut self.s) {
                Ok(Some(v)) => v,
                Ok(None) => panic!("events ended waiting for {what}; seen {:?}", self.seen),
                Err(e) => panic!("{e} waiting for {what}; seen {:?}", self.seen),
            };
            self.seen.push(v.clone());
            if pred(&v) {
                return v;
            }
        }
    }

    /// Waits for the exit event of `id`.
    pub fn exit_of(&mut self, id: &str) -> Value {
        self.until(&format!("exit of {id}"), |v| {
            v["type"] == "exit" && v["id"] == id
        })
    }

    /// The stdout (or stderr) text of `id` seen so far, joined.
    pub fn text(&self, kind: &str, id: &str) -> String {
        self.seen
            .iter()
            .filter(|v| v["type"] == kind && v["id"] == id)
            .map(|v| v["data"].as_str().unwrap_or_default())
            .collect()
    }

    /// Reads for `d`, returning what arrived (for asserting silence).
    pub fn drain_for(&mut self, d: Duration) -> Vec<Value> {
        self.s.set_read_timeout(Some(d)).unwrap();
        let mut got = Vec::new();
        let mut len = [0u8; 4];
        while self.s.read_exact(&mut len).is_ok() {
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            self.s.read_exact(&mut body).unwrap();
            got.push(serde_json::from_slice(&body).unwrap());
        }
        self.s.set_read_timeout(Some(WAIT)).unwrap();
        got
    }
}
