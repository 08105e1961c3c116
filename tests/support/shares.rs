//! What `run --share` must do on every backend, checked the same way on
//! each: a host dir read and written through `/mnt/d`, then the same dir
//! shared `:ro` (EROFS inside, the host file unchanged, nothing new).

use std::path::{Path, PathBuf};

use super::TestEnv;

/// A dir `share` under the env's root holding `in` = "from the host\n".
pub fn shared_dir(env: &TestEnv) -> PathBuf {
    let dir = env.root().join("share");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("in"), "from the host\n").unwrap();
    dir
}

fn run_sh(env: &TestEnv, backend: &str, share: &str, script: &str) -> super::Out {
    env.run([
        "run",
        "--backend",
        backend,
        "--share",
        share,
        "--",
        "sh",
        "-c",
        script,
    ])
}

/// `run --share DIR:/mnt/d` reads `in` and writes `out`, which the host
/// sees, owned by the caller.
pub fn reads_and_writes(env: &TestEnv, backend: &str, dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let share = format!("{}:/mnt/d", dir.display());
    let out = run_sh(env, backend, &share, "cat /mnt/d/in; echo out > /mnt/d/out");
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout, "from the host\n", "{out}");
    assert_eq!(std::fs::read_to_string(dir.join("out")).unwrap(), "out\n");
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    assert_eq!(std::fs::metadata(dir.join("out")).unwrap().uid(), me);
}

/// `run --share DIR:/mnt/d:ro`: reads work, writes get EROFS, the host is
/// unchanged.
pub fn read_only_gives_erofs(env: &TestEnv, backend: &str, dir: &Path) {
    let share = format!("{}:/mnt/d:ro", dir.display());
    let script = "cat /mnt/d/in; echo changed > /mnt/d/in; touch /mnt/d/new; echo rc=$?";
    let out = run_sh(env, backend, &share, script);
    assert!(out.stdout.starts_with("from the host\n"), "{out}");
    assert!(out.stderr.contains("Read-only file system"), "{out}");
    assert!(out.stdout.contains("rc=1"), "{out}");
    let now = std::fs::read_to_string(dir.join("in")).unwrap();
    assert_eq!(now, "from the host\n");
    assert!(!dir.join("new").exists());
}
