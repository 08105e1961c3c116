use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::*;

#[test]
fn errno_names_are_the_c_names() {
    assert_eq!(errno_name(Errno::ENOENT), "ENOENT");
    assert_eq!(errno_name(Errno::EACCES), "EACCES");
    let e = SpawnError::Os {
        errno: Errno::ENOTDIR,
        what: "cwd \"/etc/passwd\"".into(),
    };
    assert!(e.to_string().starts_with("ENOTDIR: cwd"), "{e}");
}

#[test]
fn nul_bytes_and_bad_env_keys_are_refused_before_forking() {
    let mut exec = Exec::new("tr\0ue", Vec::<Vec<u8>>::new());
    assert!(matches!(validate(&exec), Err(SpawnError::Invalid(_))));
    exec.command = b"true".to_vec();
    exec.env.push((b"A=B".to_vec(), "x".into()));
    assert!(validate(&exec)
        .unwrap_err()
        .to_string()
        .starts_with("EINVAL: "));
}

#[test]
fn a_cwd_that_is_a_file_is_enotdir_and_a_missing_one_enoent() {
    let e = check_cwd(b"/proc/self/status").unwrap_err().to_string();
    assert!(e.starts_with("ENOTDIR: "), "{e}");
    let e = check_cwd(b"/no/such/dir/anywhere").unwrap_err().to_string();
    assert!(e.starts_with("ENOENT: "), "{e}");
}

#[test]
fn the_exec_env_overrides_and_extends_the_defaults_in_order() {
    let mut exec = Exec::new("true", Vec::<&str>::new());
    exec.env.push((b"HOME".to_vec(), "/a".into()));
    exec.env.push((b"X".to_vec(), "1".into()));
    exec.env.push((b"X".to_vec(), "2".into()));
    let env = environment(&exec, true);
    let flat: Vec<String> = env
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v)
            )
        })
        .collect();
    assert_eq!(
        flat,
        [
            format!("PATH={DEFAULT_PATH}"),
            "HOME=/a".into(),
            "TERM=xterm-256color".into(),
            "X=2".into()
        ]
    );
}

/// One registry (and so one reaper) for the whole test binary: two
/// reapers would steal each other's statuses.
fn registry() -> &'static Arc<Registry> {
    static REGISTRY: OnceLock<Arc<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Registry::new();
        r.start_reaper().unwrap();
        r
    })
}

/// Runs `exec` on pipes by the fast (posix_spawn) or the std (fork) path;
/// returns its stdout and exit status.
fn run(fast: bool, exec: &Exec) -> (String, i32) {
    let (slot, _wake) = ExitSlot::new().unwrap();
    let env = environment(exec, false);
    let spawned = if fast {
        spawn_fast(exec, b"/", &env, registry(), &slot)
            .unwrap()
            .expect("this libc has POSIX_SPAWN_SETSID")
    } else {
        spawn_std(exec, b"/", &env, None, registry(), &slot).unwrap()
    };
    let ChildIo::Pipes { stdin, stdout, .. } = spawned.io else {
        panic!("pipes expected")
    };
    drop(stdin);
    let mut out = String::new();
    std::fs::File::from(stdout)
        .read_to_string(&mut out)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(code) = slot.status() {
            return (out, code);
        }
        assert!(Instant::now() < deadline, "no exit status");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn both_spawn_paths_give_clean_signals_and_only_the_given_env() {
    for fast in [true, false] {
        // The process itself reads its status: a shell's own mask is
        // briefly full while it forks.
        let (status, code) = run(fast, &Exec::new("cat", ["/proc/self/status"]));
        assert_eq!(code, 0);
        assert!(
            status.contains("SigIgn:\t0000000000000000"),
            "fast={fast}: {status}"
        );
        assert!(
            status.contains("SigBlk:\t0000000000000000"),
            "fast={fast}: {status}"
        );
        let mut exec = Exec::new("env", Vec::<&str>::new());
        exec.env.push((b"X".to_vec(), "y".into()));
        let (env, code) = run(fast, &exec);
        assert_eq!(code, 0);
        let mut lines: Vec<&str> = env.lines().collect();
        lines.sort();
        let path = format!("PATH={DEFAULT_PATH}");
        assert_eq!(lines, ["HOME=/root", path.as_str(), "X=y"], "fast={fast}");
    }
}

#[test]
fn both_spawn_paths_make_the_child_lead_its_own_session() {
    for fast in [true, false] {
        let (out, code) = run(fast, &Exec::new("cat", ["/proc/self/stat"]));
        assert_eq!(code, 0);
        let f: Vec<&str> = out[out.rfind(')').unwrap() + 2..].split(' ').collect();
        let pid = out.split(' ').next().unwrap();
        assert_eq!(
            (f[2], f[3]),
            (pid, pid),
            "fast={fast}: pgrp and session are its pid"
        );
    }
}

#[test]
fn a_script_without_a_shebang_runs_under_sh_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("plain-script");
    std::fs::write(&script, "echo from-sh $1\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    for fast in [true, false] {
        let exec = Exec::new(script.to_str().unwrap(), ["arg"]);
        assert_eq!(run(fast, &exec), ("from-sh arg\n".into(), 0), "fast={fast}");
    }
}
