//! `boxdesk ls`, `boxdesk info` and `boxdesk stop`: the registry view of
//! the runtime dir, one control connection per sandbox.
//!
//! This module owns the table and JSON shapes and waiting for a stopped
//! helper to vanish. It must never remove a socket a helper still answers
//! on (stale ones only, through the platform's non-blocking probe) and
//! never signal a pid that is no longer the helper it asked.

use std::fs;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use boxdesk_platform::socket::{self, Staleness};
use boxdesk_platform::{dirs, names, SandboxPaths};
use boxdesk_sandbox::control::{ClientError, ControlClient};
use boxdesk_sandbox::lock::NameLock;
use boxdesk_sandbox::state::{Leftover, StateDir};

use super::run::STOP_WAIT;

/// The table's columns and the info keys behind them; the last,
/// `PROFILE` (a cowork sandbox's), only when some row has one.
const COLUMNS: [(&str, &str); 8] = [
    ("NAME", "name"),
    ("BACKEND", "backend"),
    ("ISOLATION", "isolation"),
    ("STATE", "state"),
    ("CPUS", "vcpus"),
    ("MEM", "mem_mib"),
    ("UPTIME", "uptime_ms"),
    ("PROFILE", "profile"),
];

/// Info keys printed as JSON numbers.
const NUMERIC: [&str; 10] = [
    "proto",
    "pid",
    "vcpus",
    "mem_mib",
    "uptime_ms",
    "ready_ms",
    "boot_ms",
    "sandbox_pid",
    "pids_max",
    "tmp_mib",
];

/// `boxdesk ls [--json]`: running sandboxes from their control sockets,
/// then those whose state dir outlived them (`dead`: the sandbox or its
/// helper died; `stopped`: kept with `--keep`).
pub fn ls(json: bool) -> anyhow::Result<i32> {
    let runtime = dirs::runtime_dir()?;
    NameLock::sweep(&runtime);
    let mut names: Vec<String> = fs::read_dir(&runtime)
        .with_context(|| format!("reading {}", runtime.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".sock").map(str::to_owned))
        .filter(|n| names::validate_name(n).is_ok())
        .collect();
    names.sort();
    let mut rows = Vec::new();
    let mut live = Vec::new();
    for name in names {
        let paths = SandboxPaths::new(&runtime, &name)?;
        match socket::clear_if_stale(&paths.sock) {
            Ok(Staleness::Live) => {}
            Ok(Staleness::Removed) => {
                tracing::info!("removed the stale socket of {name}");
                let _ = socket::clear_if_stale(&paths.agent);
                continue;
            }
            Ok(Staleness::Absent) => continue,
            Err(e) => {
                tracing::warn!("{e}");
                continue;
            }
        }
        live.push(name.clone());
        match ControlClient::connect(&paths.sock, &name).and_then(|mut c| c.info()) {
            Ok(info) => rows.push(info),
            Err(e) => {
                tracing::warn!("{name}: {e}");
                rows.push(vec![
                    ("name".into(), name.clone()),
                    ("state".into(), "unknown".into()),
                ]);
            }
        }
    }
    if let Ok(state_root) = dirs::state_dir() {
        for (name, state) in StateDir::all(&state_root) {
            if live.contains(&name) || NameLock::is_held(&runtime, &name) {
                continue;
            }
            let left = state.leftover();
            let mut row = vec![
                ("name".to_owned(), name),
                ("state".to_owned(), left.word().to_owned()),
                ("state_dir".to_owned(), state.dir.display().to_string()),
            ];
            if let Leftover::Dead(Some(why)) = left {
                row.push(("reason".to_owned(), why));
            }
            rows.push(row);
        }
    }
    if json {
        println!("{}", to_json(&rows));
    } else {
        print!("{}", table(&rows));
    }
    Ok(0)
}

/// What a name with no helper behind it left: its state dir, if any.
pub fn leftover(name: &str) -> Option<StateDir> {
    let root = dirs::state_dir().ok()?;
    StateDir::existing(&root, name)
}

/// The error for a name no helper answers: dead (with what to do) or
/// unknown.
pub fn not_running(name: &str, e: impl std::fmt::Display) -> anyhow::Error {
    match leftover(name) {
        Some(state) => match state.leftover() {
            Leftover::Dead(why) => anyhow::anyhow!(
                "sandbox {name} is dead{}; `boxdesk stop {name}` removes its state ({})",
                why.map(|w| format!(" ({w})")).unwrap_or_default(),
                state.dir.display()
            ),
            Leftover::Stopped => anyhow::anyhow!(
                "sandbox {name} is stopped (its state was kept: {}); `boxdesk run --name {name} --reuse` starts it again over that state",
                state.dir.display()
            ),
        },
        None => anyhow::anyhow!("{e}"),
    }
}

fn get<'a>(row: &'a [(String, String)], key: &str) -> Option<&'a str> {
    row.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The rows as an array of objects, numbers where the key is numeric.
fn to_json(rows: &[Vec<(String, String)>]) -> String {
    let array: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let mut obj = serde_json::Map::new();
            for (k, v) in row {
                let value = match v.parse::<u64>() {
                    Ok(n) if NUMERIC.contains(&k.as_str()) => serde_json::Value::from(n),
                    _ => serde_json::Value::from(v.as_str()),
                };
                obj.insert(k.clone(), value);
            }
            serde_json::Value::Object(obj)
        })
        .collect();
    serde_json::Value::Array(array).to_string()
}

fn table(rows: &[Vec<(String, String)>]) -> String {
    let profiles = rows.iter().any(|r| get(r, "profile").is_some());
    let columns = &COLUMNS[..COLUMNS.len() - usize::from(!profiles)];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|(_, key)| {
                    let v = get(row, key).unwrap_or("-");
                    match *key {
                        "mem_mib" if v != "-" => format!("{v}M"),
                        "uptime_ms" => v.parse().map_or_else(|_| "-".into(), human_ms),
                        _ => v.to_owned(),
                    }
                })
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|(h, _)| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cols: &mut dyn Iterator<Item = &str>| {
        let mut s = cols
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(&mut columns.iter().map(|(h, _)| *h));
    for row in &cells {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// `3s`, `4m05s`, `2h10m`, `3d04h`.
fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// `boxdesk info NAME`.
pub fn info(name: &str) -> anyhow::Result<i32> {
    let (_, paths) = super::sandbox_paths(name)?;
    let mut client = match ControlClient::connect(&paths.sock, name) {
        Ok(c) => c,
        Err(e) => return Err(not_running(name, e)),
    };
    for (k, v) in client.info()? {
        println!("{k} {v}");
    }
    Ok(0)
}

/// `boxdesk stop NAME`: returns once the helper has exited or released the
/// name (it moves the state dir aside first, then removes it: a deep tree
/// is never raced by a kill); a helper that holds the name for
/// [`STOP_WAIT`] is killed, also when it never answers the request. A
/// keeper that outlives its sandbox (cowork holds several) is done when it
/// has released the name: then it is left running once [`OUTLIVES`] has
/// passed. A dead sandbox (state dir, no helper) has its state removed; a
/// `--keep` one keeps it.
pub fn stop(name: &str) -> anyhow::Result<i32> {
    let (runtime, paths) = super::sandbox_paths(name)?;
    let mut client = match ControlClient::connect(&paths.sock, name) {
        Ok(c) => c,
        Err(e) => {
            if NameLock::is_held(&runtime, name) {
                return Err(e.into());
            }
            let Some(state) = leftover(name) else {
                return Err(e.into());
            };
            clean_up_after(name, &paths, &state);
            boxdesk_sandbox::keeper::sweep_leftovers();
            return Ok(0);
        }
    };
    // Who listens, from the kernel rather than from `info`: a helper that
    // does not answer (stopped, wedged) must still be found and killed.
    let pid = client.peer_pid();
    let started = pid.and_then(start_time);
    let deadline = Instant::now() + STOP_WAIT;
    match client.stop() {
        Ok(()) => {}
        Err(e @ (ClientError::Io(_) | ClientError::Malformed(_) | ClientError::Stalled { .. }))
            if started.is_some() =>
        {
            tracing::warn!("{name} did not answer stop: {e}");
        }
        Err(e) => return Err(e.into()),
    }
    if let (Some(pid), Some(started)) = (pid, started) {
        let mut released: Option<Instant> = None;
        while alive(pid, started) {
            if released.is_none() && !NameLock::is_held(&runtime, name) {
                released = Some(Instant::now());
            }
            if released.is_some_and(|t| t.elapsed() > OUTLIVES) {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!(
                    "helper {pid} of {name} still running after {STOP_WAIT:?}; killing it"
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let kill_deadline = Instant::now() + Duration::from_secs(2);
                while alive(pid, started) && Instant::now() < kill_deadline {
                    std::thread::sleep(Duration::from_millis(5));
                }
                // The helper had no chance to clean up: do its part.
                if let Some(state) = leftover(name) {
                    clean_up_after(name, &paths, &state);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    // A jailed helper's reaper finishes its end just after it (the state
    // dir, the lock): done when the name is free.
    let reaped = Instant::now() + Duration::from_secs(2);
    while NameLock::is_held(&runtime, name) && Instant::now() < reaped {
        std::thread::sleep(Duration::from_millis(2));
    }
    let _ = socket::clear_if_stale(&paths.sock);
    let _ = socket::clear_if_stale(&paths.agent);
    boxdesk_sandbox::keeper::sweep_leftovers();
    Ok(0)
}

/// What a sandbox whose keeper is gone left (state dir, log, cgroup, stale
/// sockets, lock file), removed whether or not it was kept: an OCI
/// container's `delete`. Nothing is touched while a keeper holds the name
/// (waited for up to `wait`: one that is dying).
#[cfg(target_os = "linux")]
pub fn remove_remains(name: &str, wait: Duration) {
    let Ok((runtime, paths)) = super::sandbox_paths(name) else {
        return;
    };
    // Held while cleaning, so no keeper claims the name meanwhile; its
    // release removes the lock file. A keeper just killed holds it until
    // its last thread is gone: up to `wait`.
    let deadline = Instant::now() + wait;
    let lock = loop {
        match NameLock::acquire(&runtime, name) {
            Ok(l) => break l,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return,
        }
    };
    if let Some(state) = leftover(name) {
        if let Err(e) = state.remove() {
            tracing::warn!("cannot remove {}: {e}", state.dir.display());
        }
    }
    let _ = fs::remove_file(&paths.log);
    let _ = fs::remove_file(boxdesk_sandbox::log::rotated(&paths.log));
    if let Err(e) = boxdesk_sandbox::cgroup::remove_leftover(name) {
        tracing::warn!("cannot remove the cgroup of {name}: {e}");
    }
    let _ = socket::clear_if_stale(&paths.sock);
    let _ = socket::clear_if_stale(&paths.agent);
    lock.release();
}

/// How long a keeper that released the name may take to exit before it
/// counts as one that outlives its sandbox (a helper exits at once).
const OUTLIVES: Duration = Duration::from_millis(200);

/// A helper's clean-up done for it: the state dir (unless `--keep`), the
/// log, stale sockets.
fn clean_up_after(name: &str, paths: &SandboxPaths, state: &StateDir) {
    if state.keep() {
        eprintln!(
            "boxdesk: {name} was started with --keep: its state stays in {}",
            state.dir.display()
        );
        state.mark_stopped();
    } else {
        if let Err(e) = state.remove() {
            tracing::warn!("cannot remove {}: {e}", state.dir.display());
        }
        let _ = fs::remove_file(&paths.log);
        let _ = fs::remove_file(boxdesk_sandbox::log::rotated(&paths.log));
    }
    #[cfg(target_os = "linux")]
    if let Err(e) = boxdesk_sandbox::cgroup::remove_leftover(name) {
        tracing::warn!("cannot remove the cgroup of {name}: {e}");
    }
    let _ = socket::clear_if_stale(&paths.sock);
    let _ = socket::clear_if_stale(&paths.agent);
}

use boxdesk_platform::procstat::{alive, start_time};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptimes_read_as_a_person_would_say_them() {
        assert_eq!(human_ms(4_500), "4s");
        assert_eq!(human_ms(245_000), "4m05s");
        assert_eq!(human_ms(7_800_000), "2h10m");
        assert_eq!(human_ms(273_600_000), "3d04h");
    }

    #[test]
    fn a_cowork_sandbox_shows_its_profile_in_the_table_and_in_json() {
        let row: Vec<(String, String)> = [("name", "cowork-1-p"), ("profile", "Claude")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let t = table(std::slice::from_ref(&row));
        let line = t.lines().nth(1).unwrap();
        assert!(t.starts_with("NAME"), "{t}");
        assert!(
            line.starts_with("cowork-1-p") && line.ends_with("  Claude"),
            "{t}"
        );
        let j: serde_json::Value = serde_json::from_str(&to_json(&[row])).unwrap();
        assert_eq!(j[0]["profile"], "Claude");
    }

    #[test]
    fn the_table_has_a_header_and_one_aligned_row_per_sandbox() {
        let row: Vec<(String, String)> = [
            ("name", "a"),
            ("backend", "namespace"),
            ("isolation", "namespaces"),
            ("state", "running"),
            ("vcpus", "2"),
            ("mem_mib", "512"),
            ("uptime_ms", "61000"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let t = table(std::slice::from_ref(&row));
        assert_eq!(
            t,
            "NAME  BACKEND    ISOLATION   STATE    CPUS  MEM   UPTIME\n\
             a     namespace  namespaces  running  2     512M  1m01s\n"
        );
        let j: serde_json::Value = serde_json::from_str(&to_json(&[row])).unwrap();
        assert_eq!(j[0]["vcpus"], 2);
        assert_eq!(j[0]["backend"], "namespace");
    }
}
