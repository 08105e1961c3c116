//! Namespace backend figures, end to end through the real `boxdesk`
//! binary, beside baselines measured in the same run:
//!
//! * `boxdesk run --backend namespace -- true` (p50 of 20+) vs `bwrap … --
//!   true` with a similar layout vs a plain fork/exec of `true`;
//! * `boxdesk exec NAME -- true` on a running sandbox (p50 of 100+), and
//!   the same exec over the channel from this process (no CLI start-up);
//! * idle RSS of the `__vmm` helper, bwrap's monitor and the agent.
//!
//! With `BOXDESK_BASELINE_BIN` set to another build (e.g. the last
//! release), its `run` and `exec` are timed in the same rounds and the
//! ratios printed: what a change costs, measured side by side.
//!
//! Targets: exec ≤ 2.0 ms p50 with the release build users get (static-pie:
//! `BOXDESK_BIN=…` a build with `RUSTFLAGS="-C target-feature=+crt-static"
//! --target x86_64-unknown-linux-gnu`; the plain cargo build is dynamic and
//! starts slower); helper idle RSS ≤ 8 MiB. Run with
//! `cargo bench -p boxdesk --bench namespace_bench` (not a timed test).

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use boxdesk_channel::{Exec, Frame, Session};

struct Env {
    root: PathBuf,
    bin: PathBuf,
}

impl Env {
    fn new(prefix: &str, bin: PathBuf) -> Env {
        let root = support::private_root(prefix, &["run", "state", "home"]);
        Env { root, bin }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("XDG_STATE_HOME", self.root.join("state"))
            .env("HOME", self.root.join("home"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        c
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Timings of several cases measured round-robin; the first run of each
/// case is a warm-up and not kept.
#[derive(Default)]
struct Group {
    cases: Vec<(&'static str, Vec<Duration>)>,
}

impl Group {
    fn time(&mut self, label: &'static str, f: impl FnOnce()) {
        let t = Instant::now();
        f();
        let d = t.elapsed();
        match self.cases.iter_mut().find(|c| c.0 == label) {
            Some(c) => c.1.push(d),
            // The first run warms caches up and is not kept.
            None => self.cases.push((label, Vec::new())),
        }
    }

    /// Prints the case's figures; returns its p50 in ms.
    fn row(&mut self, label: &str) -> f64 {
        let v = &mut self.cases.iter_mut().find(|c| c.0 == label).unwrap().1;
        v.sort();
        let p = |q: f64| ms(v[((v.len() - 1) as f64 * q).round() as usize]);
        println!(
            "{label:<48} n={:<4} p50 {:>8.3} ms  p90 {:>8.3} ms  min {:>8.3} ms",
            v.len(),
            p(0.5),
            p(0.9),
            ms(v[0])
        );
        p(0.5)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
}

fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let rest = stat.rsplit(')').next().unwrap_or("");
            if rest.split_whitespace().nth(1) == Some(pid.to_string().as_str()) {
                out.push(p);
            }
        }
    }
    out
}

fn bwrap_baseline() -> Command {
    let mut c = Command::new("bwrap");
    c.args([
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
    ]);
    for d in ["/usr", "/etc"] {
        c.args(["--ro-bind", d, d]);
    }
    for l in ["/bin", "/sbin", "/lib", "/lib64"] {
        let p = Path::new(l);
        match std::fs::read_link(p) {
            Ok(t) => {
                c.arg("--symlink").arg(t).arg(l);
            }
            Err(_) if p.is_dir() => {
                c.args(["--ro-bind", l, l]);
            }
            Err(_) => {}
        }
    }
    c.args([
        "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--", "true",
    ]);
    c.stdin(Stdio::null());
    c
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !cfg!(target_os = "linux") {
        println!("skipped: the namespace backend needs Linux");
        return;
    }
    let env = Env::new("bxbench", support::bin());
    let base =
        std::env::var_os("BOXDESK_BASELINE_BIN").map(|b| Env::new("bxbase", PathBuf::from(b)));
    if let Some(b) = &base {
        println!("baseline build: {}", b.bin.display());
    }
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("boxdesk namespace bench ({})", support::bin().display());
    println!("load average before: {}", load().trim());

    // Each group runs its cases round-robin, so load from elsewhere on the
    // machine falls on all of them alike and the ratios stay fair.
    let mut g = Group::default();
    for _ in 0..31 {
        g.time("baseline: fork/exec true", || {
            assert!(Command::new("true").status().unwrap().success());
        });
        g.time("baseline: bwrap (namespaces + binds) -- true", || {
            assert!(bwrap_baseline().status().unwrap().success());
        });
        g.time("boxdesk run --backend namespace -- true", || {
            let st = env
                .cmd()
                .args(["run", "--backend", "namespace", "--", "true"])
                .status()
                .unwrap();
            assert!(st.success());
        });
        if let Some(b) = &base {
            g.time("baseline build: run -- true", || {
                let st = b
                    .cmd()
                    .args(["run", "--backend", "namespace", "--", "true"])
                    .status()
                    .unwrap();
                assert!(st.success());
            });
        }
    }
    let fork_p50 = g.row("baseline: fork/exec true");
    let bw_p50 = g.row("baseline: bwrap (namespaces + binds) -- true");
    let run_p50 = g.row("boxdesk run --backend namespace -- true");
    let base_run_p50 = base.as_ref().map(|_| g.row("baseline build: run -- true"));

    // Names of this run's own: a sandbox's cgroup is named after it and is
    // global, so another bench running at the same time must not collide.
    let name = format!("bench-{}", std::process::id());
    let base_name = format!("base-{}", std::process::id());
    let st = env
        .cmd()
        .args(["run", "--detach", "--name", &name])
        .status()
        .unwrap();
    assert!(st.success());
    if let Some(b) = &base {
        let st = b
            .cmd()
            .args(["run", "--detach", "--name", &base_name])
            .status()
            .unwrap();
        assert!(st.success());
    }
    let agent = env.root.join(format!("run/boxdesk/{name}.agent"));
    let direct_sock = env.root.join(format!("state/boxdesk/{name}/agent.sock"));
    let exec_true = |s: &mut Session| {
        s.send(&Frame::Exec(Exec::new("true", Vec::<Vec<u8>>::new())))
            .unwrap();
        s.send(&Frame::Stdin(Default::default())).unwrap();
        loop {
            match s.recv().unwrap() {
                Some(Frame::Exit(0)) => break,
                Some(Frame::Exit(c)) => panic!("exit {c}"),
                Some(_) => {}
                None => panic!("closed"),
            }
        }
    };
    let mut g = Group::default();
    for _ in 0..201 {
        g.time("baseline: fork/exec true ", || {
            assert!(Command::new("true").status().unwrap().success());
        });
        g.time("boxdesk exec NAME -- true (running sandbox)", || {
            let st = env
                .cmd()
                .args(["exec", &name, "--", "true"])
                .status()
                .unwrap();
            assert!(st.success());
        });
        g.time("  the same exec over <name>.agent, in-process", || {
            exec_true(&mut Session::connect_hybrid(&agent, 1024).unwrap());
        });
        g.time("  ... straight to the agent's own socket", || {
            exec_true(&mut Session::connect_unix(&direct_sock).unwrap());
        });
        g.time("  boxdesk --version (CLI process start-up)", || {
            assert!(env.cmd().arg("--version").status().unwrap().success());
        });
        if let Some(b) = &base {
            g.time("baseline build: exec NAME -- true", || {
                let st = b
                    .cmd()
                    .args(["exec", &base_name, "--", "true"])
                    .status()
                    .unwrap();
                assert!(st.success());
            });
        }
    }
    let fork2_p50 = g.row("baseline: fork/exec true ");
    let exec_p50 = g.row("boxdesk exec NAME -- true (running sandbox)");
    let chan_p50 = g.row("  the same exec over <name>.agent, in-process");
    let direct_p50 = g.row("  ... straight to the agent's own socket");
    g.row("  boxdesk --version (CLI process start-up)");
    let base_exec_p50 = base
        .as_ref()
        .map(|_| g.row("baseline build: exec NAME -- true"));

    std::thread::sleep(Duration::from_secs(1));
    let info = env
        .cmd()
        .args(["info", &name])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    let get = |k: &str| -> u32 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let helper = get("pid");
    let bwrap = get("sandbox_pid");
    let agents = children(bwrap);
    let helper_rss = rss_kib(helper).unwrap_or(0);
    println!();
    println!(
        "idle RSS: __vmm helper {:>6} KiB ({:.2} MiB)",
        helper_rss,
        helper_rss as f64 / 1024.0
    );
    println!(
        "idle RSS: bwrap monitor {:>6} KiB",
        rss_kib(bwrap).unwrap_or(0)
    );
    for a in &agents {
        println!(
            "idle RSS: agent (pid {a}) {:>6} KiB",
            rss_kib(*a).unwrap_or(0)
        );
    }
    let _ = env.cmd().args(["stop", &name]).status();
    if let Some(b) = &base {
        let _ = b.cmd().args(["stop", &base_name]).status();
    }

    println!("load average after: {}", load().trim());
    println!();
    println!("ratios:");
    println!("  run / bwrap baseline          {:>6.2}x", run_p50 / bw_p50);
    println!(
        "  run / fork-exec baseline      {:>6.2}x",
        run_p50 / fork_p50
    );
    println!(
        "  exec / fork-exec baseline     {:>6.2}x",
        exec_p50 / fork2_p50
    );
    println!(
        "  exec (channel) / fork-exec    {:>6.2}x",
        chan_p50 / fork2_p50
    );
    println!(
        "  relay cost (channel - direct) {:>6.3} ms",
        chan_p50 - direct_p50
    );
    if let (Some(r), Some(e)) = (base_run_p50, base_exec_p50) {
        println!(
            "  run / baseline build's run    {:>6.2}x ({:+.3} ms: user namespace, cgroups, staging)",
            run_p50 / r,
            run_p50 - r
        );
        println!(
            "  exec / baseline build's exec  {:>6.2}x (goal ≤ 1.10)",
            exec_p50 / e
        );
    }
    println!(
        "targets: exec p50 {:.3} ms (≤ 2.0 ms: {}), helper idle RSS {:.2} MiB (≤ 8 MiB: {})",
        exec_p50,
        if exec_p50 <= 2.0 { "met" } else { "missed" },
        helper_rss as f64 / 1024.0,
        if helper_rss <= 8 * 1024 {
            "met"
        } else {
            "missed"
        }
    );
}
