//! Each test enters a view in a child process (a mount namespace is for
//! the rest of a process's life), which prints what it saw; the parent
//! asserts on that and on the host's side.

use std::io::ErrorKind;
use std::path::Path;

use super::*;

/// Runs this test binary's `test` alone in a child with `BOXDESK_VIEW_DIR`
/// set to `dir`; its stdout, after asserting it exited 0.
fn in_child(test: &str, dir: &Path) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("BOXDESK_VIEW_DIR", dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{out:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn child_dir() -> Option<PathBuf> {
    std::env::var_os("BOXDESK_VIEW_DIR").map(PathBuf::from)
}

/// Runs `f` in a fork of the child (libtest runs a test on a thread of
/// its own; a fork has only the one that forked) and exits with its code.
fn in_fork(f: impl FnOnce() -> i32) -> ! {
    use std::io::Write;
    // SAFETY: the fork only makes system calls, prints, and `_exit`s.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let code = f();
            let _ = std::io::stdout().flush();
            // SAFETY: ends the fork without the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let code = match nix::sys::wait::waitpid(child, None).unwrap() {
                nix::sys::wait::WaitStatus::Exited(_, code) => code,
                other => panic!("the fork ended: {other:?}"),
            };
            std::process::exit(code)
        }
    }
}

/// Prints each check as `what: got` for the parent; the fork's exit code.
fn print_checks(checks: &[(&str, String)]) -> i32 {
    for (what, got) in checks {
        println!("{what}: {got}");
    }
    0
}

/// Asserts that each of `wants` is a line of the child's `out` (the first
/// follows libtest's "test NAME ... ").
fn assert_lines(out: &str, wants: &[&str]) {
    for want in wants {
        let line = |l: &str| l == *want || l.ends_with(&format!(" ... {want}"));
        assert!(out.lines().any(line), "want {want:?} in:\n{out}");
    }
}

/// What an I/O result says, in a word.
fn said<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) if e.kind() == ErrorKind::NotFound => "missing".into(),
        Err(e) => match e.raw_os_error() {
            Some(libc::EROFS) => "read-only".into(),
            Some(libc::EACCES) | Some(libc::EPERM) => "refused".into(),
            _ => format!("{e}"),
        },
    }
}

#[test]
fn a_helper_in_its_view_sees_its_paths_where_they_were_and_nothing_else_of_the_host() {
    const NAME: &str = "jail::view::tests::a_helper_in_its_view_sees_its_paths_where_they_were_and_nothing_else_of_the_host";
    if let Some(d) = child_dir() {
        in_fork(move || {
            let mut view = View::new();
            view.bind(d.join("rw"), true)
                .bind(d.join("ro"), false)
                .bind(d.join("image"), false)
                .bind(d.join("not-there"), true)
                .bind("/dev/null", true)
                .link(d.join("link"), "rw");
            let t = std::time::Instant::now();
            view.enter().unwrap();
            println!("entered in {} us", t.elapsed().as_micros());
            let checks = [
                ("read rw", said(std::fs::read(d.join("rw/in")))),
                ("write rw", said(std::fs::write(d.join("rw/out"), "x"))),
                ("read ro", said(std::fs::read(d.join("ro/in")))),
                ("write ro", said(std::fs::write(d.join("ro/out"), "x"))),
                ("read image", said(std::fs::read(d.join("image")))),
                (
                    "write image",
                    said(
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(d.join("image")),
                    ),
                ),
                ("through link", said(std::fs::read(d.join("link/in")))),
                ("secret", said(std::fs::read(d.join("secret")))),
                ("/etc/passwd", said(std::fs::read("/etc/passwd"))),
                ("/proc/1", said(std::fs::metadata("/proc/1"))),
                ("/proc/self/fd", said(std::fs::read_dir("/proc/self/fd"))),
                ("/dev/null", said(std::fs::write("/dev/null", "x"))),
                ("new at root", said(std::fs::write("/new", "x"))),
                ("new beside", said(std::fs::write(d.join("beside"), "x"))),
            ];
            print_checks(&checks)
        });
    }
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for sub in ["rw", "ro"] {
        std::fs::create_dir(d.join(sub)).unwrap();
        std::fs::write(d.join(sub).join("in"), "in").unwrap();
    }
    std::fs::write(d.join("image"), "kernel").unwrap();
    std::fs::write(d.join("secret"), "s").unwrap();
    let out = in_child(NAME, d);
    assert_lines(
        &out,
        &[
            "read rw: ok",
            "write rw: ok",
            "read ro: ok",
            "write ro: read-only",
            "read image: ok",
            "write image: read-only",
            "through link: ok",
            "secret: missing",
            "/etc/passwd: missing",
            "/proc/1: missing",
            "/proc/self/fd: ok",
            "/dev/null: ok",
            "new at root: read-only",
            "new beside: read-only",
        ],
    );
    // What entering costs (docs/BENCHMARKS.md's figure).
    if let Some(at) = out.find("entered in") {
        let line = out[at..].lines().next().unwrap_or_default();
        println!("{line} (6 paths and /proc/PID)");
    }
    // The write went to the host's directory, as the caller.
    let written = d.join("rw/out");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "x");
    assert_eq!(
        std::fs::metadata(&written).unwrap().uid(),
        nix::unistd::geteuid().as_raw()
    );
    assert!(!d.join("ro/out").exists() && !d.join("beside").exists());
}

#[test]
fn a_view_is_refused_to_a_process_with_a_second_thread_or_an_open_directory_and_for_slash_or_dotdot(
) {
    const NAME: &str = "jail::view::tests::a_view_is_refused_to_a_process_with_a_second_thread_or_an_open_directory_and_for_slash_or_dotdot";
    if let Some(d) = child_dir() {
        // Checked before anything else: `/` itself and `..` cannot be placed.
        for bad in ["/", "/tmp/../etc"] {
            let refused = View::new().bind(bad, false).enter();
            println!(
                "{bad}: {}",
                refused.map_or_else(|e| e.to_string(), |()| "entered".into())
            );
        }
        // libtest's main thread and this test's: two at least.
        let refused = View::new().enter();
        println!(
            "with threads: {}",
            refused.map_or_else(|e| e.to_string(), |()| "entered".into())
        );
        in_fork(move || {
            let _dir = std::fs::File::open(&d).unwrap();
            let refused = View::new().enter();
            println!(
                "with a directory: {}",
                refused.map_or_else(|e| e.to_string(), |()| "entered".into())
            );
            0
        });
    }
    let t = tempfile::tempdir().unwrap();
    let out = in_child(NAME, t.path());
    assert!(out.contains("with threads: the VM helper has "), "{out}");
    assert!(
        out.contains("/: the VM helper's view cannot hold / "),
        "{out}"
    );
    assert!(
        out.contains("/tmp/../etc: the VM helper's view cannot hold /tmp/../etc "),
        "{out}"
    );
    assert!(
        out.contains("which it would be a way out") || out.contains("it would be a way out"),
        "{out}"
    );
}

#[test]
fn a_writable_path_inside_a_read_only_one_stays_writable_and_one_inside_a_writable_one_adds_no_mount(
) {
    const NAME: &str = "jail::view::tests::a_writable_path_inside_a_read_only_one_stays_writable_and_one_inside_a_writable_one_adds_no_mount";
    if let Some(d) = child_dir() {
        in_fork(move || {
            let mut view = View::new();
            view.bind(d.join("ro"), false)
                .bind(d.join("ro/state"), true)
                .bind(d.join("rw"), true)
                .bind(d.join("rw/inner"), true);
            view.enter().unwrap();
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let checks = [
                ("write ro", said(std::fs::write(d.join("ro/x"), "x"))),
                (
                    "write ro/state",
                    said(std::fs::write(d.join("ro/state/x"), "x")),
                ),
                (
                    "write rw/inner",
                    said(std::fs::write(d.join("rw/inner/x"), "x")),
                ),
                ("mounts", mounts.lines().count().to_string()),
            ];
            print_checks(&checks)
        });
    }
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for sub in ["ro/state", "rw/inner"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    let out = in_child(NAME, d);
    // `/`, ro, ro/state, rw and /proc/PID: rw/inner is already there.
    assert_lines(
        &out,
        &[
            "write ro: read-only",
            "write ro/state: ok",
            "write rw/inner: ok",
            "mounts: 5",
        ],
    );
}
