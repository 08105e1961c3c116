//! `boxdesk oci`, the OCI runtime, driven the way an engine drives it, on
//! bundles built here (Debian's static busybox as the root, `oci spec`'s
//! config edited per test). Together these are the runtime-spec checks
//! (lifecycle, state, errors, the config's fields) that runtime-tools'
//! validation suite makes, written from the spec: that suite is Go fetched
//! from GitHub, which CI cannot reach. podman and containerd are driven by
//! `tests/oci/engines.sh`.
//!
//! A container's agent must be static: the tests find the guest image's
//! (built by `images/build-agent.sh`) or say `skipped:`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{self, Out, TestEnv};

mod fields;

/// A bundle dir and the runtime root beside it, in a private environment.
struct Bundle {
    env: TestEnv,
    dir: PathBuf,
    root: PathBuf,
    agent: PathBuf,
}

/// The static busybox the root is made of.
const BUSYBOX: &str = "/bin/busybox";

/// A bundle with `oci spec`'s config changed by `edit`; `None` (after
/// saying why) where no static agent or busybox is here.
fn bundle(edit: impl FnOnce(&mut Value)) -> Option<Bundle> {
    let Some(agent) = agent() else {
        println!("skipped: no static agent (images/build-agent.sh x86_64 builds one)");
        return None;
    };
    if !Path::new(BUSYBOX).exists() {
        println!("skipped: {BUSYBOX} (busybox-static) is not installed");
        return None;
    }
    let env = TestEnv::new();
    let dir = env.root().join("bundle");
    let rootfs = dir.join("rootfs");
    for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "root"] {
        fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox")).unwrap();
    let list = Command::new(BUSYBOX).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            let _ = symlink("busybox", rootfs.join("bin").join(applet));
        }
    }
    let out = env.run(["oci", "spec", "--bundle", dir.to_str().unwrap()]);
    assert_eq!(out.code(), 0, "{out}");
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["process"]["args"] = json!(["sh", "-c", "echo hello"]);
    // `spec`'s root is read-only, as runc's is; these tests write.
    config["root"]["readonly"] = json!(false);
    edit(&mut config);
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let root = env.root().join("oci");
    Some(Bundle {
        env,
        dir,
        root,
        agent,
    })
}

/// The static agent the tests hand `boxdesk oci` (`BOXDESK_OCI_AGENT`):
/// that variable's, else the guest image's built in this checkout.
fn agent() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BOXDESK_OCI_AGENT") {
        return Some(PathBuf::from(p));
    }
    let arch = std::env::consts::ARCH;
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/images")
        .join(arch)
        .join("boxdesk-guest-agent");
    fs::File::open(&p).is_ok().then_some(p)
}

impl Bundle {
    /// `boxdesk oci --root R ARGS`.
    fn oci(&self, args: &[&str]) -> Command {
        let mut c = self.env.cmd(["oci", "--root", self.root.to_str().unwrap()]);
        c.args(args).env("BOXDESK_OCI_AGENT", &self.agent);
        c
    }

    /// Runs a command whose output ends with it (no monitor left holding
    /// its pipes).
    fn run(&self, args: &[&str]) -> Out {
        support::output(self.oci(args))
    }

    /// `create`, with the container's stdout and stderr in files (the
    /// monitor keeps them as long as the container lives).
    fn create(&self, id: &str) -> Out {
        let out_path = self.env.root().join(format!("{id}.out"));
        let err_path = self.env.root().join(format!("{id}.err"));
        let mut c = self.oci(&["create", "--bundle", self.dir.to_str().unwrap(), id]);
        c.stdout(fs::File::create(&out_path).unwrap())
            .stderr(fs::File::create(&err_path).unwrap());
        let status = c.status().unwrap();
        Out {
            status,
            stdout: String::new(),
            stderr: fs::read_to_string(&err_path).unwrap_or_default(),
        }
    }

    /// What the container `id` printed so far.
    fn printed(&self, id: &str) -> String {
        fs::read_to_string(self.env.root().join(format!("{id}.out"))).unwrap_or_default()
    }

    fn state(&self, id: &str) -> Value {
        let out = self.run(&["state", id]);
        assert_eq!(out.code(), 0, "{out}");
        serde_json::from_str(&out.stdout).unwrap()
    }

    fn status(&self, id: &str) -> String {
        self.state(id)["status"].as_str().unwrap().to_owned()
    }

    /// Waits (at most 20 s) until `id` is `want`.
    fn wait_status(&self, id: &str, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.status(id);
            if s == want {
                return;
            }
            assert!(Instant::now() < deadline, "{id} stayed {s}, not {want}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `run ID`: the whole life, its output and status.
    fn run_container(&self, id: &str) -> Out {
        self.run(&["run", "--bundle", self.dir.to_str().unwrap(), id])
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        for id in fs::read_dir(&self.root).into_iter().flatten().flatten() {
            let id = id.file_name().to_string_lossy().into_owned();
            if !id.starts_with('.') {
                let _ = self.run(&["delete", "--force", &id]);
            }
        }
    }
}

#[test]
fn a_container_goes_created_running_stopped_and_delete_removes_it() {
    let Some(b) = bundle(|c| {
        c["process"]["args"] =
            json!(["sh", "-c", "echo started; read line < /dev/stdin; sleep 30"]);
    }) else {
        return;
    };
    let out = b.create("life");
    assert_eq!(out.code(), 0, "{out}");
    let st = b.state("life");
    assert_eq!(st["status"], "created");
    assert_eq!(st["id"], "life");
    assert_eq!(st["ociVersion"], "1.2.0");
    assert_eq!(Path::new(st["bundle"].as_str().unwrap()), b.dir);
    let pid = st["pid"].as_i64().unwrap();
    assert!(pid > 0 && support::pid_alive(pid as u32), "{st}");
    assert_eq!(b.printed("life"), "", "nothing runs before start");

    let out = b.run(&["start", "life"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(b.status("life"), "running");
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.printed("life") != "started\n" && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.printed("life"), "started\n");
    let out = b.run(&["start", "life"]);
    assert_ne!(out.code(), 0, "a second start: {out}");
    let out = b.run(&["delete", "life"]);
    assert_ne!(out.code(), 0, "delete of a running container: {out}");
    assert!(out.stderr.contains("not stopped"), "{out}");

    let out = b.run(&["kill", "life", "KILL"]);
    assert_eq!(out.code(), 0, "{out}");
    b.wait_status("life", "stopped");
    assert_eq!(b.state("life")["pid"], 0);
    let out = b.run(&["kill", "life", "TERM"]);
    assert_ne!(out.code(), 0, "kill of a stopped container: {out}");
    assert!(out.stderr.contains("not running"), "{out}");
    let out = b.run(&["delete", "life"]);
    assert_eq!(out.code(), 0, "{out}");
    let out = b.run(&["state", "life"]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("does not exist"), "{out}");
    // Nothing of its sandbox is left: no sockets, no state dir.
    let left: Vec<_> = fs::read_dir(b.root.join(".run/boxdesk"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left in the runtime dir: {left:?}");
    assert!(!support::pid_alive(pid as u32), "the monitor is gone");
}

#[test]
fn the_process_status_is_the_containers_exit_and_a_signal_is_128_plus_it() {
    let Some(b) = bundle(|c| c["process"]["args"] = json!(["sh", "-c", "echo hi; exit 3"])) else {
        return;
    };
    let out = b.run_container("exit3");
    assert_eq!((out.code(), out.stdout.as_str()), (3, "hi\n"), "{out}");
    let Some(b) = bundle(|c| c["process"]["args"] = json!(["sh", "-c", "kill -USR1 $$; sleep 5"]))
    else {
        return;
    };
    let out = b.run_container("sig");
    assert_eq!(out.code(), 128 + libc::SIGUSR1, "{out}");
}

#[test]
fn an_id_is_taken_once_and_a_bad_id_or_missing_bundle_leaves_nothing() {
    let Some(b) = bundle(|c| c["process"]["args"] = json!(["sleep", "30"])) else {
        return;
    };
    assert_eq!(b.create("twice").code(), 0);
    let out = b.create("twice");
    assert_ne!(out.code(), 0);
    assert!(out.stderr.contains("already exists"), "{out}");
    for bad in ["../x", ".hidden", "a/b", ""] {
        let out = b.run(&["create", "--bundle", b.dir.to_str().unwrap(), bad]);
        assert_ne!(out.code(), 0, "{bad:?}: {out}");
    }
    let out = b.run(&["create", "--bundle", "/nonexistent", "nob"]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("config.json"), "{out}");
    let ids: Vec<_> = fs::read_dir(&b.root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(ids, ["twice"]);
}

#[test]
fn kill_delivers_the_signal_to_the_init_process_which_may_handle_it() {
    let Some(b) = bundle(|c| {
        c["process"]["args"] = json!([
            "sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; echo ready; while true; do sleep 0.1; done"
        ]);
    }) else {
        return;
    };
    assert_eq!(b.create("trap").code(), 0);
    assert_eq!(b.run(&["start", "trap"]).code(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.printed("trap").contains("ready") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = b.state("trap")["pid"].as_i64().unwrap() as u32;
    assert_eq!(b.run(&["kill", "trap"]).code(), 0, "TERM by default");
    b.wait_status("trap", "stopped");
    assert!(
        b.printed("trap").contains("got-term"),
        "{}",
        b.printed("trap")
    );
    // The monitor exited with the process's status (7): the state says
    // stopped, the pid is gone.
    assert!(support::wait_gone(pid));
}

#[test]
fn delete_force_ends_a_running_container_and_everything_it_made() {
    let Some(b) = bundle(|c| c["process"]["args"] = json!(["sleep", "300"])) else {
        return;
    };
    assert_eq!(b.create("forced").code(), 0);
    assert_eq!(b.run(&["start", "forced"]).code(), 0);
    let pid = b.state("forced")["pid"].as_i64().unwrap() as u32;
    let out = b.run(&["delete", "--force", "forced"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(support::wait_gone(pid));
    assert!(support::pids_with("sleep 300").is_empty() || !support::is_root());
    assert!(!b.root.join("forced").exists());
    let left: Vec<_> = fs::read_dir(b.root.join(".run/boxdesk"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn exec_runs_another_process_in_the_running_container() {
    let Some(b) = bundle(|c| {
        c["process"]["args"] = json!(["sh", "-c", "echo inside > /tmp/mark; sleep 60"]);
    }) else {
        return;
    };
    assert_eq!(b.create("ex").code(), 0);
    let out = b.run(&["exec", "ex", "true"]);
    assert_ne!(out.code(), 0, "exec before start: {out}");
    assert_eq!(b.run(&["start", "ex"]).code(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out;
    loop {
        out = b.run(&["exec", "ex", "sh", "-c", "cat /tmp/mark; hostname; exit 4"]);
        if out.stdout.contains("inside") || Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(out.code(), 4, "{out}");
    assert_eq!(out.stdout, "inside\nboxdesk\n", "{out}");
    let process = b.env.root().join("process.json");
    fs::write(
        &process,
        json!({"args": ["sh", "-c", "echo $FOO; pwd"], "env": ["FOO=bar"], "cwd": "/tmp",
               "user": {"uid": 0, "gid": 0}})
        .to_string(),
    )
    .unwrap();
    let out = b.run(&["exec", "--process", process.to_str().unwrap(), "ex"]);
    assert_eq!(
        (out.code(), out.stdout.as_str()),
        (0, "bar\n/tmp\n"),
        "{out}"
    );
    fs::write(
        &process,
        json!({"args": ["id"], "cwd": "/", "user": {"uid": 1000, "gid": 1000}}).to_string(),
    )
    .unwrap();
    let out = b.run(&["exec", "--process", process.to_str().unwrap(), "ex"]);
    assert_ne!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("process.user"), "{out}");
}

#[test]
fn features_says_what_is_supported_as_the_spec_lays_it_out() {
    let env = TestEnv::new();
    let out = env.run(["oci", "features"]);
    assert_eq!(out.code(), 0, "{out}");
    let f: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(f["ociVersionMax"], "1.2.0");
    assert_eq!(f["linux"]["seccomp"]["enabled"], true);
    assert!(f["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .contains(&json!("pid")));
    assert_eq!(f["hooks"], json!([]));
}

#[test]
fn pause_and_update_are_refused_clearly_and_list_shows_containers() {
    let Some(b) = bundle(|c| c["process"]["args"] = json!(["sleep", "30"])) else {
        return;
    };
    assert_eq!(b.create("ls1").code(), 0);
    for args in [
        &["pause", "ls1"][..],
        &["resume", "ls1"],
        &["update", "ls1"],
    ] {
        let out = b.run(args);
        assert_ne!(out.code(), 0, "{args:?}: {out}");
        assert!(out.stderr.contains("not supported"), "{out}");
    }
    let out = b.run(&["list", "--format", "json"]);
    let l: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(l[0]["id"], "ls1");
    assert_eq!(l[0]["status"], "created");
    let out = b.run(&["list", "-q"]);
    assert_eq!(out.stdout, "ls1\n");
}

#[test]
fn started_as_boxdesk_oci_it_is_the_runtime() {
    let env = TestEnv::new();
    let link = env.root().join("boxdesk-oci");
    symlink(support::bin(), &link).unwrap();
    let out = support::output({
        let mut c = Command::new(&link);
        c.arg("features").stdin(Stdio::null());
        c
    });
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("ociVersionMax"), "{out}");
}
