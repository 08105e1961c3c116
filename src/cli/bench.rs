//! `boxdesk bench boot`: starts sandboxes one after the other, each running
//! `true`, and prints how long the agent took to answer and what the helper
//! costs in memory — the figure docs/BENCHMARKS.md records per backend (KVM,
//! Hypervisor.framework, namespaces). It measures; it asserts nothing.

use std::time::Duration;

use super::run::{self, BootTimes, RunRequest};

/// `boxdesk bench boot`'s options.
#[derive(Debug, clap::Args)]
pub struct BootArgs {
    /// auto, kvm, hvf or namespace [default: $BOXDESK_BACKEND, else auto].
    #[arg(long)]
    pub backend: Option<String>,
    /// Sandboxes to start.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// vCPUs per sandbox (what a VM accepts: 1 to 64).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub cpus: u32,
    /// Memory per sandbox in MiB (what a VM accepts: 64 to 65536).
    #[arg(long, value_name = "MiB", default_value_t = 512, value_parser = clap::value_parser!(u32).range(64..=65536))]
    pub mem: u32,
    /// `host`: boot with `--root host` (what the host's system as `/` costs).
    #[arg(long, value_name = "host", value_parser = ["host"])]
    pub root: Option<String>,
}

/// Runs the benchmark and prints one line per run and a summary.
pub fn boot(a: BootArgs) -> anyhow::Result<i32> {
    let backend = super::chosen_backend(a.backend.as_deref())?;
    let req = RunRequest {
        name: None,
        backend: Some(backend.to_string()),
        cpus: Some(a.cpus),
        mem_mib: Some(a.mem),
        net: false,
        keep: false,
        reuse: false,
        pids: boxdesk_sandbox::DEFAULT_PIDS,
        tmp_bytes: boxdesk_sandbox::DEFAULT_TMP_BYTES,
        detach: false,
        vm: run::VmFlags::default(),
        shares: Vec::new(),
        root_host: a.root.is_some(),
        exec: super::ExecOpts {
            tty: false,
            timeout: None,
            cwd: None,
            env: Vec::new(),
        },
        command: Vec::new(),
    };
    println!(
        "bench boot: backend {backend}, {} vCPU, {} MiB, {} runs{}",
        a.cpus,
        a.mem,
        a.runs,
        if req.root_host { ", --root host" } else { "" }
    );
    let mut all = Vec::new();
    for i in 1..=a.runs {
        let t = run::timed_start(&req)?;
        println!(
            "run {i}: agent ready {:.1} ms, first exec done {:.1} ms{}",
            ms(t.ready),
            ms(t.first_exec),
            t.helper_rss_kib
                .map(|k| format!(
                    ", helper RSS without guest RAM {:.1} MiB",
                    k as f64 / 1024.0
                ))
                .unwrap_or_default()
        );
        all.push(t);
    }
    println!("{}", summary(&backend.to_string(), &all));
    Ok(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The closing line: p50, min and max of each time, and the median RSS.
fn summary(backend: &str, runs: &[BootTimes]) -> String {
    let stats = |f: fn(&BootTimes) -> Duration| {
        let mut v: Vec<f64> = runs.iter().map(|t| ms(f(t))).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (r50, rmin, rmax) = stats(|t| t.ready);
    let (e50, _, _) = stats(|t| t.first_exec);
    let mut rss: Vec<u64> = runs.iter().filter_map(|t| t.helper_rss_kib).collect();
    rss.sort_unstable();
    let rss = rss
        .get(rss.len() / 2)
        .map(|k| {
            format!(
                ", helper RSS without guest RAM p50 {:.1} MiB",
                *k as f64 / 1024.0
            )
        })
        .unwrap_or_default();
    format!(
        "boot {backend}: agent ready p50 {r50:.1} ms (min {rmin:.1}, max {rmax:.1}), first exec done p50 {e50:.1} ms{rss}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_gives_the_median_and_range_of_each_time() {
        let t = |r: u64, e: u64, k: Option<u64>| BootTimes {
            ready: Duration::from_millis(r),
            first_exec: Duration::from_millis(e),
            helper_rss_kib: k,
        };
        let s = summary(
            "kvm",
            &[
                t(30, 40, Some(2048)),
                t(10, 20, Some(1024)),
                t(20, 25, None),
            ],
        );
        assert_eq!(
            s,
            "boot kvm: agent ready p50 20.0 ms (min 10.0, max 30.0), first exec done p50 25.0 ms, helper RSS without guest RAM p50 2.0 MiB"
        );
    }
}
