//! What the agent costs over running a process directly: the round trip
//! of `true` (connect + handshake + Exec + Exit + close) against
//! `Command::new("true").status()`, and stdout throughput of
//! `head -c 1G /dev/zero` through the agent against reading the same
//! command's pipe. Not a timed test: it prints figures and the targets
//! (overhead ≤ 300 µs at p50, throughput ≥ 1 GB/s).
//!
//! Run with `cargo bench -p boxdesk-guest-agent`; `AGENT_BENCH=latency` or
//! `AGENT_BENCH=throughput` runs one half only, and `AGENT_BENCH_BIN=PATH`
//! measures another build of the agent (an older one, to compare).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use boxdesk_channel::{Exec, Frame, Session};

const RUNS: usize = 600;
const WARMUP: usize = 50;
const GIB: u64 = 1 << 30;

struct Agent {
    child: std::process::Child,
    sock: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("agent.sock");
        let results = dir.path().join("results");
        std::fs::create_dir(&results).unwrap();
        let bin = std::env::var_os("AGENT_BENCH_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_boxdesk-guest-agent").into());
        let child = Command::new(bin)
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--root")
            .arg(dir.path())
            .arg("--results")
            .arg(&results)
            .stderr(Stdio::null())
            .spawn()
            .expect("start the agent");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Session::connect_unix(&sock).is_err() {
            assert!(Instant::now() < deadline, "agent did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        Agent {
            child,
            sock,
            _dir: dir,
        }
    }

    /// One whole session; returns the exit status and stdout bytes seen.
    fn exec(&self, exec: Exec) -> (i32, u64) {
        let mut s = Session::connect_unix(&self.sock).expect("connect");
        s.send(&Frame::Exec(exec)).unwrap();
        let (mut exit, mut bytes) = (i32::MIN, 0u64);
        while let Some(frame) = s.recv().expect("recv") {
            match frame {
                Frame::Stdout(d) => bytes += d.len() as u64,
                Frame::Exit(c) => exit = c,
                other => panic!("unexpected {other:?}"),
            }
        }
        (exit, bytes)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Runs `a` and `b` alternately (so both see the same machine load) and
/// returns the sorted durations of each, warm-up runs dropped.
fn interleaved(mut a: impl FnMut(), mut b: impl FnMut()) -> (Vec<Duration>, Vec<Duration>) {
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for i in 0..WARMUP + RUNS {
        let start = Instant::now();
        a();
        let mid = Instant::now();
        b();
        if i >= WARMUP {
            ta.push(mid - start);
            tb.push(mid.elapsed());
        }
    }
    ta.sort();
    tb.sort();
    (ta, tb)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks what is here
    }
    if !cfg!(target_os = "linux") {
        println!("skipped: the agent runs only on Linux");
        return;
    }
    let agent = Agent::start();
    let part = std::env::var("AGENT_BENCH").unwrap_or_default();
    if part != "throughput" {
        latency(&agent);
    }
    if part != "latency" {
        throughput(&agent);
    }
}

fn latency(agent: &Agent) {
    let mut phases: Vec<[Duration; 3]> = Vec::with_capacity(RUNS + WARMUP);
    let (agent_t, direct_t) = interleaved(
        || {
            let t0 = Instant::now();
            let mut s = Session::connect_unix(&agent.sock).expect("connect");
            let t1 = Instant::now();
            s.send(&Frame::Exec(Exec::new("true", Vec::<&str>::new())))
                .unwrap();
            assert_eq!(s.recv().unwrap(), Some(Frame::Exit(0)));
            let t2 = Instant::now();
            assert_eq!(s.recv().unwrap(), None);
            phases.push([t1 - t0, t2 - t1, t2.elapsed()]);
        },
        || assert!(Command::new("true").status().unwrap().success()),
    );
    let (agent_p50, agent_p99) = (percentile(&agent_t, 0.5), percentile(&agent_t, 0.99));
    let (direct_p50, direct_p99) = (percentile(&direct_t, 0.5), percentile(&direct_t, 0.99));
    let overhead = us(agent_p50) - us(direct_p50);
    let phase = |i: usize| {
        let mut v: Vec<Duration> = phases[WARMUP..].iter().map(|p| p[i]).collect();
        v.sort();
        us(percentile(&v, 0.5))
    };
    println!("exec round trip of `true` over {RUNS} runs each, agent and direct alternating:");
    println!(
        "  agent  (connect+handshake+Exec+Exit+close): p50 {:8.1} µs  p99 {:8.1} µs",
        us(agent_p50),
        us(agent_p99)
    );
    println!(
        "    of which p50: connect+handshake {:.1} µs, Exec→Exit {:.1} µs, Exit→EOF {:.1} µs",
        phase(0),
        phase(1),
        phase(2)
    );
    println!(
        "  direct (Command::status):                   p50 {:8.1} µs  p99 {:8.1} µs",
        us(direct_p50),
        us(direct_p99)
    );
    println!(
        "  overhead p50 {overhead:.1} µs (target ≤ 300 µs: {}), ratio {:.2}x",
        if overhead <= 300.0 { "met" } else { "MISSED" },
        us(agent_p50) / us(direct_p50)
    );
}

fn throughput(agent: &Agent) {
    // Alternating runs, so both sides see the same machine load; the
    // median of each is reported.
    let (mut agent_t, mut direct_t, mut big_t) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..PAIRS {
        agent_t.push(through_agent(agent));
        direct_t.push(direct_pipe(None));
        big_t.push(direct_pipe(Some(1 << 20)));
    }
    agent_t.sort();
    direct_t.sort();
    big_t.sort();
    let (through_agent, direct, big) = (agent_t[PAIRS / 2], direct_t[PAIRS / 2], big_t[PAIRS / 2]);
    let (a, d, b) = (gbps(GIB, through_agent), gbps(GIB, direct), gbps(GIB, big));
    println!("stdout throughput of `head -c 1G /dev/zero` (median of {PAIRS} alternating runs):");
    println!(
        "  agent  {a:6.2} GB/s ({:.0} ms)",
        through_agent.as_secs_f64() * 1e3
    );
    println!(
        "  direct {d:6.2} GB/s ({:.0} ms)  default 64 KiB pipe",
        direct.as_secs_f64() * 1e3
    );
    println!(
        "  direct {b:6.2} GB/s ({:.0} ms)  1 MiB pipe, as the agent sets up",
        big.as_secs_f64() * 1e3
    );
    println!(
        "  agent/direct {:.2}, agent/direct-1MiB {:.2} (target ≥ 1 GB/s: {})",
        a / d,
        a / b,
        if a >= 1.0 { "met" } else { "MISSED" }
    );
}

/// How many agent/direct throughput pairs run.
const PAIRS: usize = 5;

fn through_agent(agent: &Agent) -> Duration {
    let start = Instant::now();
    let (exit, bytes) = agent.exec(Exec::new("head", ["-c", "1G", "/dev/zero"]));
    assert_eq!((exit, bytes), (0, GIB));
    start.elapsed()
}

/// `F_SETPIPE_SZ`, as the agent does (Linux only; the bench does not run
/// elsewhere).
#[cfg(target_os = "linux")]
fn resize_pipe(pipe: &impl std::os::fd::AsRawFd, size: i32) {
    // SAFETY: F_SETPIPE_SZ takes an int and only resizes the pipe.
    unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
}

#[cfg(not(target_os = "linux"))]
fn resize_pipe(_pipe: &impl std::os::fd::AsRawFd, _size: i32) {}

/// Reads `head -c 1G /dev/zero` from its pipe, resized to `pipe_size`
/// bytes when given.
fn direct_pipe(pipe_size: Option<i32>) -> Duration {
    let start = Instant::now();
    let mut child = Command::new("head")
        .args(["-c", "1G", "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    if let Some(size) = pipe_size {
        resize_pipe(&out, size);
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut bytes = 0u64;
    loop {
        match out.read(&mut buf).unwrap() {
            0 => break,
            n => bytes += n as u64,
        }
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(bytes, GIB);
    start.elapsed()
}
