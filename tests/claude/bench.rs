//! Figures, not assertions (a benchmark, run on demand: `cargo test -p
//! boxdesk --test tests -- claude::bench --ignored --nocapture`): the same
//! Claude Code binary asked one message straight on the host and through
//! `boxdesk cowork` on this host's backend (`BOXDESK_TEST_BACKEND`),
//! alternating, 10 rounds each (`BOXDESK_BENCH_ROUNDS`):
//! spawn → its first API request, spawn → the message's result; medians
//! and their ratios.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::{claude_args, results, session, spawn_claude, Api, Session};

/// Rounds, unless `BOXDESK_BENCH_ROUNDS` says (CI's L1 stage runs 3).
fn rounds() -> usize {
    std::env::var("BOXDESK_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(10)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Seconds from `t0` to the first API request made at or after it.
fn first_request_after(api: &Api, t0: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = api
            .requests()
            .iter()
            .filter_map(|r| r["t"].as_f64())
            .find(|t| *t >= t0)
        {
            return t - t0;
        }
        assert!(Instant::now() < deadline, "no API request");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: prints figures (claude::bench --ignored --nocapture)"]
fn bench_spawn_to_first_request_and_to_result_against_the_binary_on_the_host() {
    let Some(Session {
        c,
        api,
        mut p,
        mut ev,
        claude,
    }) = session("bench", "bench")
    else {
        return;
    };
    let home = c.env.root().join("direct-home");
    std::fs::create_dir_all(&home).unwrap();
    let (mut host_req, mut host_res, mut box_req, mut box_res) = (vec![], vec![], vec![], vec![]);
    let rounds = rounds();
    for round in 0..rounds {
        let msg = json!({"type": "user", "message": {"role": "user", "content": format!("round {round}")}});
        // Straight on the host.
        let t0 = now();
        let start = Instant::now();
        let mut child = Command::new(&claude)
            .args(claude_args(&[]))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("ANTHROPIC_BASE_URL", api.url())
            .env("ANTHROPIC_API_KEY", "sk-ant-boxdesk-test")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        writeln!(child.stdin.as_mut().unwrap(), "{msg}").unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 && !line.contains("\"type\":\"result\"") {
            line.clear();
        }
        host_res.push(start.elapsed().as_secs_f64());
        host_req.push(first_request_after(&api, t0));
        let _ = child.kill();
        let _ = child.wait();
        // Through boxdesk cowork.
        let id = format!("b{round}");
        let t0 = now();
        let start = Instant::now();
        let r = spawn_claude(&mut p, &api, &id, "s", &[], json!({}));
        assert_eq!(r["success"], true, "{r}");
        p.call("writeStdin", json!({"id": id, "data": format!("{msg}\n")}));
        while results(&ev, &id).is_empty() {
            ev.next("a result", |v| v["id"] == id.as_str());
        }
        box_res.push(start.elapsed().as_secs_f64());
        box_req.push(first_request_after(&api, t0));
        p.call("kill", json!({"id": id, "signal": "SIGKILL"}));
        ev.exit_of(&id);
    }
    let (hq, hr, bq, br) = (
        median(host_req),
        median(host_res),
        median(box_req),
        median(box_res),
    );
    let backend = crate::cowork::client::backend_word();
    println!(
        "bench: Claude Code {}, {rounds} rounds alternating, medians:",
        super::VERSION
    );
    println!(
        "bench:   spawn -> first API request: direct {:.0} ms, boxdesk cowork ({backend}) {:.0} ms, ratio {:.2}",
        hq * 1e3,
        bq * 1e3,
        bq / hq
    );
    println!(
        "bench:   spawn -> result:            direct {:.0} ms, boxdesk cowork ({backend}) {:.0} ms, ratio {:.2}",
        hr * 1e3,
        br * 1e3,
        br / hr
    );
}
