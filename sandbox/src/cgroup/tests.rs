//! The cgroup layer against the host's real cgroups: limits written, a
//! child joined, a memory hog OOM-killed, a fork loop stopped, a busy loop
//! throttled, everything killed and removed, and a user without delegation
//! told why. Which layout is tested is the host's: v1/hybrid on the build
//! machines as root, pure v2 as root and as a delegated user in the nested
//! L1 (`tests/nested/cgroup.rs`). Where this user cannot have cgroups and
//! nothing says it should (`BOXDESK_CGROUP_EXPECT`), the real tests print
//! `skipped:` with the reason.

use super::layout::plan_in;
use super::*;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Set by the nested test: `enforced` makes an `Unenforced` placement a
/// failure (as root, and as the delegated user), `unenforced` the reverse.
const EXPECT: &str = "BOXDESK_CGROUP_EXPECT";
/// Set when this binary runs itself as nobody (see
/// `a_user_outside_any_delegation_gets_unenforced_with_a_why`).
const CHILD: &str = "BOXDESK_CGROUP_CHILD";

fn unique(tag: &str) -> String {
    format!("t{}-{tag}", std::process::id())
}

/// Removes the test's cgroup if the test panicked before it could.
struct Leftover(String);

impl Drop for Leftover {
    fn drop(&mut self) {
        let _ = remove_leftover(&self.0);
    }
}

/// Whether this run must get a cgroup: `BOXDESK_CGROUP_EXPECT`, else root
/// on a host whose cgroup filesystems are mounted read-write.
fn must_enforce() -> bool {
    match std::env::var(EXPECT).as_deref() {
        Ok("enforced") => return true,
        Ok("unenforced") => return false,
        _ => {}
    }
    let m = Mounts::read();
    boxdesk_platform::euid() == 0
        && match m.version() {
            Some(Version::V1) => !m.v1_for(Controller::Memory).unwrap().read_only,
            Some(Version::V2) => !m.v2_main().unwrap().read_only,
            None => false,
        }
}

fn enforced_or_skip(name: &str, limits: &Limits) -> Option<Cgroup> {
    match create(name, limits).expect("create") {
        Placement::Enforced(cg) => Some(cg),
        Placement::Unenforced { why } => {
            assert!(!must_enforce(), "expected a cgroup, got: unenforced: {why}");
            println!("skipped: limits unenforced here: {why}");
            None
        }
    }
}

/// Starts `cmd` inside `cg` (joined between fork and exec).
fn spawn_in(cg: &Cgroup, cmd: &mut Command) -> Child {
    let fds = cg.join_fds();
    // SAFETY: join_self is async-signal-safe (pwrite only) and reads only
    // the Copy `fds` moved into the closure.
    unsafe {
        cmd.pre_exec(move || join_self(fds.as_slice()));
    }
    cmd.stdin(Stdio::null())
        .spawn()
        .expect("spawn a child in the cgroup")
}

fn read(dir: &Path, file: &str) -> String {
    fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("{}/{file}: {e}", dir.display()))
        .trim()
        .to_owned()
}

fn dir_of(cg: &Cgroup, c: Controller) -> PathBuf {
    cg.hier(c)
        .unwrap_or_else(|| panic!("no {} hierarchy: {}", c.name(), cg.describe()))
        .dir
        .clone()
}

/// Polls `f` every 20 ms until it is true or `secs` pass.
fn within(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn limits_out_of_range_are_refused_naming_the_flag_and_the_range() {
    let bad = [
        Limits {
            cpus: Some(0.0),
            ..Limits::default()
        },
        Limits {
            cpus: Some(f64::NAN),
            ..Limits::default()
        },
        Limits {
            cpus: Some(1e9),
            ..Limits::default()
        },
        Limits {
            mem_mib: Some(0),
            ..Limits::default()
        },
        Limits {
            mem_mib: Some(u64::MAX / 2),
            ..Limits::default()
        },
        Limits {
            pids: Some(0),
            ..Limits::default()
        },
        Limits {
            pids: Some(MAX_PIDS + 1),
            ..Limits::default()
        },
    ];
    for l in bad {
        let e = l.validate().unwrap_err().to_string();
        assert!(e.starts_with("--") && e.contains("must be"), "{e}");
        assert!(matches!(create("x", &l), Err(CgroupError::BadLimit { .. })));
    }
    let ok = Limits {
        cpus: Some(0.01),
        mem_mib: Some(1),
        pids: Some(MAX_PIDS),
        cpu_shares: Some(2),
    };
    ok.validate().unwrap();
}

#[test]
fn a_bad_name_is_refused_before_any_cgroup_is_touched() {
    for name in ["", "../etc", ".hidden", "a/b", &"x".repeat(65)] {
        assert!(
            matches!(create(name, &Limits::default()), Err(CgroupError::Name(_))),
            "{name:?}"
        );
        assert!(remove_leftover(name).is_err(), "{name:?}");
    }
}

#[test]
fn the_cpu_quota_is_cpus_times_the_period_and_never_under_a_millisecond() {
    assert_eq!(quota_us(1.5), 150_000);
    assert_eq!(quota_us(0.01), 1000);
    assert_eq!(quota_us(0.012_34), 1234);
    assert_eq!(quota_us(4.0), 400_000);
}

const HYBRID: &str = "\
25 1 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
34 30 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
35 30 0:31 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpuset
36 30 0:32 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,pids
37 30 0:33 /docker/abc /sys/fs/cgroup/mem\\040ory ro,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,memory
";

#[test]
fn mountinfo_gives_each_v1_controllers_hierarchy_and_the_cgroup2_mount() {
    let m = Mounts::parse(HYBRID);
    assert_eq!(m.version(), Some(Version::V1));
    let cpu = m.v1_for(Controller::Cpu).unwrap();
    assert_eq!(cpu.point, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    assert!(!cpu.read_only);
    // `cpuset` is not `cpu`: the co-mounted cpu,cpuacct hierarchy is found.
    assert_eq!(m.v1.len(), 4);
    let mem = m.v1_for(Controller::Memory).unwrap();
    assert_eq!(mem.point, Path::new("/sys/fs/cgroup/mem ory"));
    assert_eq!(mem.root, "/docker/abc");
    assert!(mem.read_only);
    assert_eq!(
        m.v2_main().unwrap().point,
        Path::new("/sys/fs/cgroup/unified")
    );
    assert!(m
        .describe()
        .starts_with("hybrid: v1 memory at /sys/fs/cgroup/mem ory"));
    let e = plan_in(&m, 1000, &Controller::ALL).unwrap_err();
    assert!(
        e.contains("no safe delegation") && e.contains("uid 1000"),
        "{e}"
    );
}

#[test]
fn a_pure_v2_mountinfo_is_v2_and_one_without_cgroups_is_none() {
    let v2 = "29 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
    let m = Mounts::parse(v2);
    assert_eq!(m.version(), Some(Version::V2));
    assert_eq!(m.v2_main().unwrap().point, Path::new("/sys/fs/cgroup"));
    let none = Mounts::parse("22 1 0:5 / / rw - ext4 /dev/vda rw\ngarbage line\n");
    assert_eq!(none.version(), None);
    assert_eq!(
        plan_in(&none, 0, &Controller::ALL).unwrap_err(),
        "no cgroup filesystem is mounted"
    );
}

#[test]
fn v1_hierarchies_side_by_side_are_written_with_braces() {
    let dirs = [
        Path::new("/sys/fs/cgroup/memory/boxdesk"),
        Path::new("/sys/fs/cgroup/pids/boxdesk"),
        Path::new("/sys/fs/cgroup/cpu,cpuacct/boxdesk"),
    ];
    assert_eq!(
        join_dirs(&dirs, "sb"),
        "/sys/fs/cgroup/{memory,pids,cpu,cpuacct}/boxdesk/sb"
    );
    assert_eq!(
        join_dirs(&[Path::new("/sys/fs/cgroup/boxdesk")], "sb"),
        "/sys/fs/cgroup/boxdesk/sb"
    );
}

#[test]
fn join_self_on_a_closed_descriptor_is_an_error_not_a_crash() {
    let e = join_self(&[-1]).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    join_self(&[]).unwrap();
}

#[test]
fn a_cgroup_made_with_limits_holds_them_in_its_files() {
    let name = unique("files");
    let _guard = Leftover(name.clone());
    let limits = Limits {
        cpus: Some(1.5),
        mem_mib: Some(64),
        pids: Some(100),
        cpu_shares: None,
    };
    let Some(cg) = enforced_or_skip(&name, &limits) else {
        return;
    };
    assert_eq!(cg.enforced(), limits, "{}", cg.describe());
    assert!(cg.unenforced().is_empty(), "{:?}", cg.unenforced());
    let mem = dir_of(&cg, Controller::Memory);
    let pids = dir_of(&cg, Controller::Pids);
    let cpu = dir_of(&cg, Controller::Cpu);
    for d in [&mem, &pids, &cpu] {
        assert!(
            d.ends_with(Path::new("boxdesk").join(&name)),
            "{}",
            d.display()
        );
    }
    let bytes = (64u64 << 20).to_string();
    assert_eq!(read(&pids, "pids.max"), "100");
    match cg.version() {
        Version::V2 => {
            assert_eq!(read(&mem, "memory.max"), bytes);
            if mem.join("memory.swap.max").exists() {
                assert_eq!(read(&mem, "memory.swap.max"), "0");
            }
            assert_eq!(read(&cpu, "cpu.max"), "150000 100000");
        }
        Version::V1 => {
            assert_eq!(read(&mem, "memory.limit_in_bytes"), bytes);
            if mem.join("memory.memsw.limit_in_bytes").exists() {
                assert_eq!(read(&mem, "memory.memsw.limit_in_bytes"), bytes);
            }
            assert_eq!(read(&cpu, "cpu.cfs_quota_us"), "150000");
            assert_eq!(read(&cpu, "cpu.cfs_period_us"), "100000");
        }
    }
    let line = cg.describe();
    assert!(
        line.contains("memory 64 MiB") && line.contains("cpus 1.5") && line.contains("pids 100"),
        "{line}"
    );
    assert!(line.contains(&format!("/boxdesk/{name}: ")), "{line}");
    println!("{line}");
    cg.remove().unwrap();
    for d in [&mem, &pids, &cpu] {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[test]
fn children_that_join_are_listed_in_every_hierarchy_and_remove_kills_them_and_the_dirs() {
    let name = unique("join");
    let _guard = Leftover(name.clone());
    let limits = Limits {
        cpus: Some(2.0),
        mem_mib: Some(256),
        pids: Some(64),
        cpu_shares: None,
    };
    let Some(cg) = enforced_or_skip(&name, &limits) else {
        return;
    };
    // Two children through the same descriptors: each joins on its own.
    let mut kids: Vec<Child> = (0..2)
        .map(|_| spawn_in(&cg, Command::new("sleep").arg("30")))
        .collect();
    let dirs: Vec<PathBuf> = cg.hiers.iter().map(|h| h.dir.clone()).collect();
    assert_eq!(dirs.len(), if cg.version() == Version::V1 { 3 } else { 1 });
    for d in &dirs {
        let listed = read_pids(d).unwrap();
        for k in &kids {
            assert!(
                listed.contains(&(k.id() as i32)),
                "{} is not in {}/cgroup.procs: {listed:?}",
                k.id(),
                d.display()
            );
        }
    }
    cg.remove().unwrap();
    for k in &mut kids {
        let st = k.wait().unwrap();
        assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    }
    for d in &dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

#[test]
fn a_memory_hog_inside_is_oom_killed_and_counted() {
    let name = unique("hog");
    let _guard = Leftover(name.clone());
    let limits = Limits {
        mem_mib: Some(32),
        pids: Some(64),
        ..Limits::default()
    };
    let Some(cg) = enforced_or_skip(&name, &limits) else {
        return;
    };
    assert_eq!(cg.oom_kills(), 0);
    // dd fills a 256 MiB buffer from /dev/zero: 8 times the limit.
    let st = spawn_in(
        &cg,
        Command::new("dd")
            .args(["if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"])
            .stderr(Stdio::null()),
    )
    .wait()
    .unwrap();
    assert_eq!(
        st.signal(),
        Some(libc::SIGKILL),
        "dd was not OOM-killed: {st:?}"
    );
    assert!(cg.oom_kills() >= 1, "oom_kills {}", cg.oom_kills());
    assert!(cg.describe().contains("memory 32 MiB"));
    cg.remove().unwrap();
}

#[test]
fn a_fork_loop_inside_stops_at_pids_max() {
    let name = unique("forks");
    let _guard = Leftover(name.clone());
    let max = 16u64;
    let limits = Limits {
        pids: Some(max),
        mem_mib: Some(256),
        ..Limits::default()
    };
    let Some(cg) = enforced_or_skip(&name, &limits) else {
        return;
    };
    let pids = dir_of(&cg, Controller::Pids);
    // Bounded: 64 sleepers at most, and the shell is in the cgroup before it
    // runs (joined before exec), so the host never sees more than 64.
    let mut sh = spawn_in(
        &cg,
        Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 64 ]; do i=$((i+1)); sleep 30 & done; wait",
            ])
            .stderr(Stdio::piped()),
    );
    let refused = within(20, || {
        fs::read_to_string(pids.join("pids.events"))
            .ok()
            .and_then(|t| keyed(&t, "max"))
            .is_some_and(|n| n >= 1)
    });
    let current: u64 = read(&pids, "pids.current").parse().unwrap();
    assert!(refused, "no fork was refused: pids.current {current}");
    assert!(current <= max, "pids.current {current} over pids.max {max}");
    cg.remove().unwrap();
    let out = sh.wait().unwrap();
    assert!(!out.success());
    assert!(!pids.exists());
}

#[test]
fn a_busy_loop_inside_is_throttled_to_its_cpus() {
    let name = unique("cpu");
    let _guard = Leftover(name.clone());
    let limits = Limits {
        cpus: Some(0.05),
        pids: Some(16),
        ..Limits::default()
    };
    let Some(cg) = enforced_or_skip(&name, &limits) else {
        return;
    };
    let cpu = dir_of(&cg, Controller::Cpu);
    let mut spin = spawn_in(&cg, Command::new("sh").args(["-c", "while :; do :; done"]));
    // 5 ms of CPU every 100 ms: a spinning shell is throttled every period.
    let throttled = within(10, || {
        fs::read_to_string(cpu.join("cpu.stat"))
            .ok()
            .and_then(|t| keyed(&t, "nr_throttled"))
            .is_some_and(|n| n >= 2)
    });
    let stat = read(&cpu, "cpu.stat");
    cg.remove().unwrap();
    spin.wait().unwrap();
    assert!(throttled, "never throttled: {stat}");
}

#[test]
fn remove_leftover_kills_and_removes_what_a_dead_owner_left() {
    let name = unique("left");
    let _guard = Leftover(name.clone());
    let Some(cg) = enforced_or_skip(&name, &Limits::default()) else {
        return;
    };
    let mut kid = spawn_in(&cg, Command::new("sleep").arg("30"));
    let dirs: Vec<PathBuf> = cg.hiers.iter().map(|h| h.dir.clone()).collect();
    drop(cg); // the helper died: nothing removed
    assert!(dirs.iter().all(|d| d.exists()));
    assert!(remove_leftover(&name).unwrap());
    assert_eq!(kid.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(dirs.iter().all(|d| !d.exists()));
    assert!(!remove_leftover(&name).unwrap(), "a second time finds none");
}

#[test]
fn a_leftover_holding_processes_is_refused_and_an_empty_one_is_replaced() {
    let name = unique("again");
    let _guard = Leftover(name.clone());
    let limits = Limits {
        mem_mib: Some(64),
        ..Limits::default()
    };
    let Some(cg) = enforced_or_skip(&name, &limits) else {
        return;
    };
    let mut kid = spawn_in(&cg, Command::new("sleep").arg("30"));
    match create(&name, &limits) {
        Err(CgroupError::InUse(p)) => assert!(p.ends_with(&name)),
        other => panic!("expected InUse, got {other:?}"),
    }
    let memdir = dir_of(&cg, Controller::Memory);
    kid.kill().unwrap();
    kid.wait().unwrap();
    drop(cg);
    let Placement::Enforced(again) = create(&name, &limits).unwrap() else {
        panic!("an empty leftover was not replaced");
    };
    assert_eq!(dir_of(&again, Controller::Memory), memdir);
    again.remove().unwrap();
}

#[test]
fn a_user_outside_any_delegation_gets_unenforced_with_a_why() {
    let uid = boxdesk_platform::euid();
    if std::env::var_os(CHILD).is_some() {
        // This binary, run as nobody by the root case below.
        let placement = create(&unique("nobody"), &Limits::default()).unwrap();
        let Placement::Unenforced { why } = placement else {
            panic!("uid {uid} outside any delegation got a cgroup");
        };
        assert!(why.contains(&format!("uid {uid}")), "{why}");
        let p = probe();
        assert!(!p.can_enforce());
        assert!(p.to_string().contains("RLIMIT_NPROC"), "{p}");
        println!("unenforced for uid {uid}: {why}");
        return;
    }
    if uid != 0 {
        println!("skipped: needs root to run itself as nobody (this is uid {uid})");
        return;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        println!("skipped: no user nobody");
        return;
    };
    // Run where nobody can read the binary: in place when every directory
    // above it lets others through, else a copy.
    let exe = std::env::current_exe().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("boxdesk-cg-")
        .tempdir()
        .unwrap();
    let others_may = |p: &Path, bits: u32| fs::metadata(p).is_ok_and(|m| m.mode() & bits == bits);
    let in_place = others_may(&exe, 0o005) && exe.ancestors().skip(1).all(|d| others_may(d, 0o001));
    let bin = if in_place {
        exe
    } else {
        let copy = dir.path().join("t");
        fs::copy(&exe, &copy).unwrap();
        copy
    };
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(&bin)
        .args([
            "--exact",
            "cgroup::tests::a_user_outside_any_delegation_gets_unenforced_with_a_why",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .current_dir(dir.path())
        .uid(nobody.uid.as_raw())
        .gid(nobody.gid.as_raw())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("unenforced for uid"),
        "as nobody: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(line) = text.lines().find(|l| l.contains("unenforced for uid")) {
        println!("{line}");
    }
}

#[test]
fn the_doctor_probe_agrees_with_what_create_does() {
    let p = probe();
    let name = unique("probe");
    let _guard = Leftover(name.clone());
    let placement = create(&name, &Limits::default()).unwrap();
    let text = p.to_string();
    assert!(text.starts_with("cgroups: "), "{text}");
    match placement {
        Placement::Enforced(cg) => {
            assert!(p.can_enforce(), "probe: {text}\ncreate: {}", cg.describe());
            assert!(text.contains("/boxdesk/NAME"), "{text}");
            cg.remove().unwrap();
        }
        Placement::Unenforced { why } => {
            assert!(!p.can_enforce(), "probe: {text}\ncreate: {why}");
            assert!(text.contains("unenforced"), "{text}");
        }
    }
    println!("{text}");
}

/// A cgroup2 directory as a container's namespace root looks: not the real
/// root (it has `cgroup.type`), holding a process, lending only pids.
fn v2_fixture(dir: &Path) -> Mounts {
    for (f, text) in [
        ("cgroup.type", "domain\n"),
        ("cgroup.procs", "1\n"),
        ("cgroup.controllers", "memory pids\n"),
        ("cgroup.subtree_control", "pids\n"),
    ] {
        fs::write(dir.join(f), text).unwrap();
    }
    Mounts::parse(&format!(
        "29 24 0:26 / {} rw,relatime - cgroup2 cgroup2 rw\n",
        dir.display()
    ))
}

#[test]
fn a_v2_parent_holding_processes_lends_no_new_controller_and_says_why() {
    if boxdesk_platform::euid() != 0 {
        println!("skipped: the root plan needs root (the fixture must belong to uid 0)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let m = v2_fixture(tmp.path());
    let p = plan_in(&m, 0, &Controller::ALL).unwrap();
    assert_eq!(p.hiers.len(), 1);
    assert_eq!(p.hiers[0].parent, tmp.path());
    assert_eq!(p.hiers[0].controllers, [Controller::Pids]);
    let why = |c: Controller| {
        p.missing
            .iter()
            .find(|(m, _)| *m == c)
            .map(|(_, w)| w.clone())
            .unwrap_or_else(|| panic!("{} not missing: {:?}", c.name(), p.missing))
    };
    assert!(
        why(Controller::Memory).contains("holds processes"),
        "{}",
        why(Controller::Memory)
    );
    assert!(
        why(Controller::Cpu).contains("no cpu controller"),
        "{}",
        why(Controller::Cpu)
    );
    // Nothing usable at all: unenforced, every reason in the line.
    fs::write(tmp.path().join("cgroup.subtree_control"), "").unwrap();
    let e = plan_in(&m, 0, &Controller::ALL).unwrap_err();
    assert!(e.starts_with("no controller can be used (memory: "), "{e}");
    assert!(e.contains("pids: ") && e.contains("holds processes"), "{e}");
}

#[test]
fn a_read_only_cgroup_mount_is_unenforced_for_root_too() {
    let tmp = tempfile::tempdir().unwrap();
    let m = Mounts::parse(&format!(
        "29 24 0:26 / {} ro,relatime - cgroup2 cgroup2 rw\n",
        tmp.path().display()
    ));
    let e = plan_in(&m, 0, &Controller::ALL).unwrap_err();
    assert!(e.ends_with("is mounted read-only"), "{e}");
}

#[test]
fn cpu_shares_become_the_v2_weight_runc_would_write() {
    assert_eq!(super::weight_of(2), 1);
    assert_eq!(super::weight_of(1024), 39);
    assert_eq!(super::weight_of(262_144), 10_000);
    assert_eq!(super::weight_of(1), 1, "clamped");
    let bad = Limits {
        cpu_shares: Some(1),
        ..Limits::default()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("2 to 262144"));
}
