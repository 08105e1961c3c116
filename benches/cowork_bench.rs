//! `boxdesk cowork` figures through the real binary and the app's wire
//! protocol, beside unsandboxed baselines measured in the same run:
//!
//! * one-shot `isRunning` round trip (p50/p99 of 1000);
//! * `spawn true` → `exit` event on the namespace backend (p50/p99 of 300)
//!   vs fork/exec/wait of `true` in this process;
//! * stdout of `head -c 256M /dev/zero` through events (MB/s of decoded
//!   stdout) vs reading the same command's pipe directly;
//! * 50 concurrent spawns, total time;
//! * the server's RSS after the stream, and spawn latency again after it.
//!
//! Targets: spawn→exit ≤ 1.5 ms p50; ≥ 500 MB/s; RSS after
//! the stream ≤ 64 MiB; spawn latency unchanged after it. The Node server
//! measured on this machine kind: 1.6 ms unsandboxed / 4.4 ms bwrap,
//! 55 MB/s, 1.5 GB RSS and 54 ms spawn after the stream.
//! Run with `cargo bench -p boxdesk --bench cowork_bench`.
//!
//! `BOXDESK_BENCH_BACKENDS=kvm,namespace` instead measures, for each
//! backend in one run: `startVM` → `isGuestConnected`, spawn `true` → exit
//! p50, 64 MiB of stdout through events, and the server's RSS outside
//! guest RAM — with ratios to the first (`tests/nested/cowork-bench.sh`
//! runs it inside the nested L1s, where a VM boots).

#[path = "support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Server {
    root: PathBuf,
    sock: PathBuf,
    child: Child,
}

impl Server {
    fn start() -> Server {
        Self::start_bin("bxcw", &support::bin())
    }

    fn start_bin(prefix: &str, bin: &std::path::Path) -> Server {
        Self::start_on(prefix, bin, None)
    }

    /// A server whose sandboxes run on `backend` (`BOXDESK_BACKEND`), or
    /// on cowork's own choice.
    fn start_on(prefix: &str, bin: &std::path::Path, backend: Option<&str>) -> Server {
        let root = support::private_root(prefix, &["run", "home", "data"]);
        let sock = root.join("run/cw.sock");
        let mut cmd = Command::new(bin);
        if let Some(b) = backend {
            cmd.env("BOXDESK_BACKEND", b);
        }
        let child = cmd
            .args(["cowork", "-socket"])
            .arg(&sock)
            .env("HOME", root.join("home"))
            .env("XDG_DATA_HOME", root.join("data"))
            .env("XDG_RUNTIME_DIR", root.join("run"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while UnixStream::connect(&sock).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "cowork did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        Server { root, sock, child }
    }

    fn cpu_secs(&self) -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
        // utime and stime are fields 14 and 15 (1-based) of the whole line.
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        ticks as f64 / 100.0
    }

    /// Resident KiB of the server outside guest RAM: its RSS minus what
    /// is resident of its mappings of `guest_kib` or more (a VM's RAM).
    fn rss_without_guest_kib(&self, guest_kib: u64) -> u64 {
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", self.child.id())).unwrap();
        let (mut total, mut guest) = (0, 0);
        let mut big = false;
        for line in smaps.lines() {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some("Size:"), Some(kb)) => big = kb.parse::<u64>().unwrap_or(0) >= guest_kib,
                (Some("Rss:"), Some(kb)) => {
                    let kb: u64 = kb.parse().unwrap_or(0);
                    total += kb;
                    if big {
                        guest += kb;
                    }
                }
                _ => {}
            }
        }
        total - guest
    }

    fn rss_kib(&self) -> (u64, u64) {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |k: &str| {
            s.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill takes plain integers; the server is our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn write_frame(s: &mut UnixStream, v: &Value) {
    let body = serde_json::to_vec(v).unwrap();
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(&body);
    s.write_all(&f).unwrap();
}

fn read_body(s: &mut UnixStream, buf: &mut Vec<u8>) {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    buf.resize(u32::from_be_bytes(len) as usize, 0);
    s.read_exact(buf).unwrap();
}

fn read_frame(s: &mut UnixStream) -> Value {
    let mut b = Vec::new();
    read_body(s, &mut b);
    serde_json::from_slice(&b).unwrap()
}

fn call(s: &mut UnixStream, id: u64, method: &str, params: Value) -> Value {
    write_frame(s, &json!({"method": method, "id": id, "params": params}));
    loop {
        let v = read_frame(s);
        if v["id"] == id {
            return v;
        }
    }
}

/// The decoded length of a `data` string (`s` is the rest of the frame
/// after the opening quote, ending in `"}`) of one of the two streams,
/// without building it: the NUL stream is all `\u0000`; the text stream
/// has only `\n` escapes. Both shapes are checked, not assumed.
fn decoded_len(s: &[u8]) -> usize {
    let body = &s[..s.len() - 2];
    let escapes = body.iter().filter(|&&b| b == b'\\').count();
    if body.starts_with(b"\\u0000") {
        assert_eq!(body.len(), escapes * 6, "not a NUL stream");
        return escapes;
    }
    let newlines = body.windows(2).filter(|w| w == b"\\n").count();
    assert_eq!(
        newlines, escapes,
        "the text stream has only newline escapes"
    );
    body.len() - escapes
}

/// Reads events until the exit of `id`; returns decoded stdout bytes,
/// event bytes (frames with their length prefix) and the exit event.
fn until_exit(ev: &mut UnixStream, id: &str, buf: &mut Vec<u8>) -> (usize, usize, Value) {
    let exit_prefix = br#"{"type":"exit""#;
    let out_prefix = format!(r#"{{"type":"stdout","id":"{id}","data":""#);
    let (mut bytes, mut wire) = (0, 0);
    loop {
        read_body(ev, buf);
        wire += buf.len() + 4;
        if buf.starts_with(out_prefix.as_bytes()) {
            bytes += decoded_len(&buf[out_prefix.len()..]);
        } else if buf.starts_with(exit_prefix) {
            let v: Value = serde_json::from_slice(buf).unwrap();
            if v["id"] == id {
                return (bytes, wire, v);
            }
        }
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn spawn_latencies(
    pipe: &mut UnixStream,
    ev: &mut UnixStream,
    tag: &str,
    n: usize,
    next: &mut u64,
) -> Vec<Duration> {
    let mut buf = Vec::new();
    (0..n)
        .map(|i| {
            let id = format!("{tag}{i}");
            *next += 1;
            let t = Instant::now();
            write_frame(pipe, &json!({"method": "spawn", "id": *next, "params": {"id": id, "name": "bench", "command": "true", "oneShot": true}}));
            let (_, _, exit) = until_exit(ev, &id, &mut buf);
            let d = t.elapsed();
            assert_eq!(exit["exitCode"], 0, "{exit}");
            d
        })
        .collect()
}

/// Subscribes, configures and starts the `bench` profile on `srv`; the
/// request pipe's replies are drained by a thread.
fn session(srv: &Server) -> (UnixStream, UnixStream, u64) {
    let mut pipe = UnixStream::connect(&srv.sock).unwrap();
    let mut ev = UnixStream::connect(&srv.sock).unwrap();
    write_frame(
        &mut ev,
        &json!({"method": "subscribeEvents", "params": {"userDataName": "bench", "userDataRoot": "/b"}}),
    );
    assert_eq!(read_frame(&mut ev)["success"], true);
    let mut next = 1u64;
    assert_eq!(
        call(
            &mut pipe,
            next,
            "configure",
            json!({"userDataName": "bench", "userDataRoot": "/b"})
        )["success"],
        true
    );
    next += 1;
    let r = call(&mut pipe, next, "startVM", json!({}));
    assert_eq!(r["success"], true, "{r}");

    // Replies are drained from the pipe by a thread so spawns never wait on them.
    let mut replies = pipe.try_clone().unwrap();
    std::thread::spawn(move || loop {
        let mut len = [0u8; 4];
        if replies.read_exact(&mut len).is_err() {
            return;
        }
        let mut b = vec![0u8; u32::from_be_bytes(len) as usize];
        if replies.read_exact(&mut b).is_err() {
            return;
        }
    });
    (pipe, ev, next)
}

/// What one backend gives cowork: startVM → connected, spawn `true` →
/// exit p50, MB/s of 64 MiB of stdout through events, the server's RSS
/// outside guest RAM.
struct Figures {
    connect: Duration,
    spawn_p50: Duration,
    mbs: f64,
    rss_kib: u64,
}

fn figures(backend: &str) -> Figures {
    let srv = Server::start_on(&format!("bxcw-{backend}"), &support::bin(), Some(backend));
    let t = Instant::now();
    let (mut pipe, mut ev, mut next) = session(&srv);
    let mut probe = UnixStream::connect(&srv.sock).unwrap();
    while call(&mut probe, 1, "isGuestConnected", json!({}))["result"]["connected"] != true {
        std::thread::sleep(Duration::from_millis(1));
    }
    let connect = t.elapsed();
    spawn_latencies(&mut pipe, &mut ev, "w", 10, &mut next);
    let mut spawn = spawn_latencies(&mut pipe, &mut ev, "a", 100, &mut next);
    const N: usize = 64 << 20;
    let mut buf = Vec::new();
    next += 1;
    let t = Instant::now();
    write_frame(
        &mut pipe,
        &json!({"method": "spawn", "id": next, "params": {"id": "big", "name": "bench", "command": "/bin/sh", "args": ["-c", format!("head -c {N} /dev/zero")]}}),
    );
    let (got, _, exit) = until_exit(&mut ev, "big", &mut buf);
    let stream = t.elapsed();
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(got, N, "every byte arrives");
    Figures {
        connect,
        spawn_p50: pct(&mut spawn, 0.5),
        mbs: N as f64 / stream.as_secs_f64() / 1e6,
        // A cowork VM's RAM is 2048 MiB by default.
        rss_kib: srv.rss_without_guest_kib(2048 * 1024),
    }
}

/// `BOXDESK_BENCH_BACKENDS=kvm,namespace`: the same figures on each, in
/// one run, with each against the first.
fn compare_backends(list: &str) {
    let all: Vec<(&str, Figures)> = list.split(',').map(|b| (b, figures(b))).collect();
    let (first, base) = &all[0];
    for (b, f) in &all {
        println!(
            "cowork on {b}: startVM -> isGuestConnected {:.1} ms; spawn true -> exit p50 {:.3} ms; 64 MiB stdout {:.0} MB/s; server RSS outside guest RAM {:.1} MiB",
            ms(f.connect),
            ms(f.spawn_p50),
            f.mbs,
            f.rss_kib as f64 / 1024.0
        );
        if b != first {
            println!(
                "cowork {b} / {first}: startVM {:.2}, spawn p50 {:.2}, stdout MB/s {:.2}, RSS {:.2}",
                f.connect.as_secs_f64() / base.connect.as_secs_f64(),
                f.spawn_p50.as_secs_f64() / base.spawn_p50.as_secs_f64(),
                f.mbs / base.mbs,
                f.rss_kib as f64 / base.rss_kib as f64
            );
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !cfg!(target_os = "linux") {
        println!("skipped: cowork is the Linux desktop helper");
        return;
    }
    if let Ok(list) = std::env::var("BOXDESK_BENCH_BACKENDS") {
        compare_backends(&list);
        return;
    }
    let srv = Server::start();
    let (mut pipe, mut ev, mut next) = session(&srv);

    // One-shot round trips.
    let mut one: Vec<Duration> = (0..1000)
        .map(|_| {
            let t = Instant::now();
            let mut s = UnixStream::connect(&srv.sock).unwrap();
            write_frame(&mut s, &json!({"method": "isRunning"}));
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let v = read_frame(&mut s);
            assert_eq!(v["success"], true);
            t.elapsed()
        })
        .collect();
    println!(
        "one-shot isRunning: p50 {:.3} ms, p99 {:.3} ms",
        ms(pct(&mut one, 0.5)),
        ms(pct(&mut one, 0.99))
    );

    // spawn true → exit, beside fork/exec/wait of true.
    spawn_latencies(&mut pipe, &mut ev, "w", 20, &mut next);
    let mut spawn = spawn_latencies(&mut pipe, &mut ev, "a", 300, &mut next);
    let mut base: Vec<Duration> = (0..300)
        .map(|_| {
            let t = Instant::now();
            assert!(Command::new("true").status().unwrap().success());
            t.elapsed()
        })
        .collect();
    let (s50, b50) = (pct(&mut spawn, 0.5), pct(&mut base, 0.5));
    if let Some(bin) = std::env::var_os("BOXDESK_BASELINE_BIN") {
        // The same spawns against a server of another build, in alternating
        // rounds so load falls on both alike.
        let other = Server::start_bin("bxcwbase", std::path::Path::new(&bin));
        let (mut opipe, mut oev, mut onext) = session(&other);
        spawn_latencies(&mut opipe, &mut oev, "w", 20, &mut onext);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..10 {
            ours.extend(spawn_latencies(
                &mut pipe,
                &mut ev,
                &format!("r{round}-"),
                30,
                &mut next,
            ));
            theirs.extend(spawn_latencies(
                &mut opipe,
                &mut oev,
                &format!("r{round}-"),
                30,
                &mut onext,
            ));
        }
        let (o50, t50) = (pct(&mut ours, 0.5), pct(&mut theirs, 0.5));
        println!(
            "spawn true -> exit event vs the baseline build ({}): p50 {:.3} ms vs {:.3} ms, ratio {:.2} (goal <= 1.10)",
            std::path::Path::new(&bin).display(),
            ms(o50),
            ms(t50),
            o50.as_secs_f64() / t50.as_secs_f64()
        );
        drop(other);
    }
    println!(
        "spawn true -> exit event: p50 {:.3} ms, p99 {:.3} ms (target <= 1.5 ms; Node 1.6 unsandboxed, 4.4 bwrap); fork/exec/wait true: p50 {:.3} ms; ratio {:.2}",
        ms(s50),
        ms(pct(&mut spawn, 0.99)),
        ms(b50),
        s50.as_secs_f64() / b50.as_secs_f64()
    );

    // 256 MiB of stdout through events, beside reading the pipe directly:
    // the NUL stream (every byte becomes the 6-byte JSON escape
    // `\u0000`) and a text stream (only newlines are escaped).
    const N: usize = 256 << 20;
    let streams = [
        (
            "NUL stream (head -c 256M /dev/zero)",
            format!("head -c {N} /dev/zero"),
        ),
        (
            "text stream (yes LINE | head -c 256M)",
            format!("yes 'the quick brown fox jumps over the lazy dog 0123456789' | head -c {N}"),
        ),
    ];
    for (label, script) in streams {
        let mut buf = Vec::new();
        next += 1;
        let cpu0 = srv.cpu_secs();
        let t = Instant::now();
        write_frame(
            &mut pipe,
            &json!({"method": "spawn", "id": next, "params": {"id": "big", "name": "bench", "command": "/bin/sh", "args": ["-c", script]}}),
        );
        let (got, wire, exit) = until_exit(&mut ev, "big", &mut buf);
        let stream = t.elapsed();
        let server_cpu = srv.cpu_secs() - cpu0;
        assert_eq!(exit["exitCode"], 0, "{exit}");
        assert_eq!(got, N, "every byte arrives");
        let t = Instant::now();
        let mut direct = Command::new("/bin/sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut sink = vec![0u8; 1 << 16];
        let mut total = 0;
        let mut out = direct.stdout.take().unwrap();
        while let Ok(n) = out.read(&mut sink) {
            if n == 0 {
                break;
            }
            total += n;
        }
        direct.wait().unwrap();
        let pipe_time = t.elapsed();
        assert_eq!(total, N);
        let mbs = |n: usize, d: Duration| n as f64 / d.as_secs_f64() / 1e6;
        println!(
            "{label} through events: {:.0} MB/s of stdout, {:.0} MB/s of event frames ({:.2} s, server CPU {:.2} s; target >= 500; Node 55); direct pipe read {:.0} MB/s; ratio {:.2}",
            mbs(N, stream),
            mbs(wire, stream),
            stream.as_secs_f64(),
            server_cpu,
            mbs(N, pipe_time),
            pipe_time.as_secs_f64() / stream.as_secs_f64()
        );
    }
    let (rss, hwm) = srv.rss_kib();
    println!(
        "server RSS after the stream: {:.1} MiB (peak {:.1} MiB; target <= 64; Node 1.5 GB)",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );

    // 50 concurrent spawns.
    let t = Instant::now();
    for i in 0..50 {
        next += 1;
        write_frame(
            &mut pipe,
            &json!({"method": "spawn", "id": next, "params": {"id": format!("c{i}"), "name": "bench", "command": "/bin/sh", "args": ["-c", format!("echo out-{i}")], "oneShot": true}}),
        );
    }
    let mut exits = 0;
    let mut buf = Vec::new();
    while exits < 50 {
        read_body(&mut ev, &mut buf);
        if buf.starts_with(br#"{"type":"exit""#) {
            exits += 1;
        }
    }
    println!("50 concurrent spawns: {:.1} ms total", ms(t.elapsed()));

    let mut after = spawn_latencies(&mut pipe, &mut ev, "b", 300, &mut next);
    let a50 = pct(&mut after, 0.5);
    println!(
        "spawn true -> exit event after the stream: p50 {:.3} ms, p99 {:.3} ms; ratio to before {:.2} (Node: 54 ms)",
        ms(a50),
        ms(pct(&mut after, 0.99)),
        a50.as_secs_f64() / s50.as_secs_f64()
    );
}
