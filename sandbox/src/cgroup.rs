//! Host-side cgroups of the namespace backend (and cowork): one cgroup per
//! sandbox that holds its `--mem`, `--cpus` and `--pids` limits, counts its
//! OOM kills and takes every process in it down at the end.
//!
//! Where the cgroup goes depends on the layout the host mounts (read from
//! `/proc/self/mountinfo`) and on who runs boxdesk:
//!
//! | layout | as root | as a user |
//! |---|---|---|
//! | v2 | `<cgroup2>/boxdesk/NAME` | `D/boxdesk/NAME`, D the highest ancestor of this process's cgroup the user owns (systemd delegates `user@UID.service`) |
//! | v1, hybrid | `<hierarchy>/boxdesk/NAME` for memory, pids and cpu | none: v1 has no safe delegation |
//!
//! The memory limit covers swap too (`memory.swap.max` 0, v1
//! `memory.memsw.limit_in_bytes` equal to the limit, where the kernel
//! accounts swap), so `--mem` cannot be dodged by paging out. A limit whose
//! controller cannot be had (not delegated, a parent holding processes) is
//! left out and named in [`Cgroup::unenforced`]; when no controller can be
//! had at all the sandbox is [`Placement::Unenforced`], with the reason in
//! one line.
//!
//! A child joins between `fork` and `exec` through [`join_self`] on the
//! descriptors of [`Cgroup::join_fds`], opened at create time, so the
//! child needs no allocation and no path lookup, and joins with the
//! credentials that opened them (the helper's, before bwrap changes uid).
//!
//! This module must never move a process other than the caller of
//! [`join_self`], never enable a controller in a non-root cgroup that holds
//! processes (v2's no-internal-process rule), never write a control file
//! outside `boxdesk/NAME` other than its parents' `cgroup.subtree_control`,
//! and, removing, never go anywhere but the directories below its own
//! cgroup (cgroupfs has no symlinks; entries are taken by their own type).

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use boxdesk_platform::names::{validate_name, NameError};

mod layout;
mod teardown;

use layout::{none_usable, plan, plan_in, Mounts, Plan};
use teardown::{read_pids, remove_tree};

/// The CFS period `--cpus` is a share of, in microseconds (the kernel's
/// default).
const PERIOD_US: u64 = 100_000;
/// The fewest CPUs `--cpus` takes: the kernel's smallest quota is 1 ms a
/// period.
const MIN_CPUS: f64 = 0.01;
/// The most CPUs `--cpus` takes (far above any host; keeps the quota an
/// integer the kernel accepts).
const MAX_CPUS: f64 = 65_536.0;
/// The most `pids.max` can be (`PID_MAX_LIMIT`).
const MAX_PIDS: u64 = 4 * 1024 * 1024;
/// Hierarchies a sandbox joins at most (v1: memory, pids, cpu).
const MAX_HIERARCHIES: usize = 3;

/// Why a cgroup cannot be made, read or removed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The name cannot be a sandbox's.
    #[error("cgroup name: {0}")]
    Name(NameError),
    /// A limit is out of range.
    #[error("{flag} {value}: {why}")]
    BadLimit {
        /// The command-line flag the limit comes from.
        flag: &'static str,
        /// The value given.
        value: String,
        /// The range it must be in.
        why: &'static str,
    },
    /// A cgroup of this name is left over and still holds processes.
    #[error("cgroup {} still holds processes (a sandbox of this name is running?)", .0.display())]
    InUse(PathBuf),
    /// The path exists and is not a directory (a control file's name).
    #[error("{} exists and is not a cgroup; use another name", .0.display())]
    NotACgroup(PathBuf),
    /// Creating a cgroup directory failed for a reason other than
    /// permission.
    #[error("cannot create {}: {error}", path.display())]
    Create {
        /// The directory.
        path: PathBuf,
        /// What the kernel said.
        error: io::Error,
    },
    /// Writing a control file failed.
    #[error("cannot write {value:?} to {}: {error}", path.display())]
    Write {
        /// The control file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// What the kernel said.
        error: io::Error,
    },
    /// Reading a control file or directory failed.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// What the kernel said.
        error: io::Error,
    },
    /// `rmdir` failed for a reason other than processes still inside.
    #[error("cannot remove {}: {error}", path.display())]
    Remove {
        /// The directory.
        path: PathBuf,
        /// What the kernel said.
        error: io::Error,
    },
    /// Processes survived SIGKILL until the deadline (uninterruptible
    /// sleep).
    #[error("{} still holds processes {pids:?} after {secs} s of SIGKILL", path.display())]
    Stuck {
        /// The cgroup.
        path: PathBuf,
        /// Who is still there.
        pids: Vec<i32>,
        /// How long removal tried.
        secs: u64,
    },
    /// More cgroups below the sandbox's than removal walks.
    #[error("more than {max} cgroups below {}", path.display())]
    TooMany {
        /// The sandbox's cgroup.
        path: PathBuf,
        /// The most walked.
        max: usize,
    },
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<NameError> for CgroupError {
    fn from(e: NameError) -> Self {
        CgroupError::Name(e)
    }
}

/// What a sandbox may use; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// CPUs' worth of time per period (`--cpus 1.5`: 150 ms every 100 ms).
    pub cpus: Option<f64>,
    /// Memory in MiB, swap included (`--mem`).
    pub mem_mib: Option<u64>,
    /// Processes and threads at once (`--pids`, default [`crate::DEFAULT_PIDS`]).
    pub pids: Option<u64>,
    /// A relative CPU weight, as cgroup v1's `cpu.shares` counts it (2 to
    /// 262144; the kernel's default is 1024): an OCI container's
    /// `linux.resources.cpu.shares`. v2 gets the same as `cpu.weight`.
    pub cpu_shares: Option<u64>,
}

impl Limits {
    /// Refuses a limit nothing could run under or the kernel would refuse:
    /// cpus outside 0.01–65536 or not a number, zero memory or memory past
    /// what a byte count holds, zero pids or more than the kernel's most.
    pub fn validate(&self) -> Result<(), CgroupError> {
        if let Some(c) = self.cpus {
            if !(MIN_CPUS..=MAX_CPUS).contains(&c) {
                return Err(CgroupError::BadLimit {
                    flag: "--cpus",
                    value: c.to_string(),
                    why: "must be a number from 0.01 to 65536",
                });
            }
        }
        if let Some(m) = self.mem_mib {
            if m == 0 || mem_bytes(m).is_none() {
                return Err(CgroupError::BadLimit {
                    flag: "--mem",
                    value: m.to_string(),
                    why: "must be from 1 MiB to 8 EiB",
                });
            }
        }
        if let Some(s) = self.cpu_shares {
            if !(2..=262_144).contains(&s) {
                return Err(CgroupError::BadLimit {
                    flag: "cpu shares",
                    value: s.to_string(),
                    why: "must be from 2 to 262144",
                });
            }
        }
        if let Some(p) = self.pids {
            if p == 0 || p > MAX_PIDS {
                return Err(CgroupError::BadLimit {
                    flag: "--pids",
                    value: p.to_string(),
                    why: "must be from 1 to 4194304",
                });
            }
        }
        Ok(())
    }
}

/// `mib` in bytes, when it fits the kernel's signed 64-bit counters.
fn mem_bytes(mib: u64) -> Option<u64> {
    mib.checked_mul(1 << 20).filter(|&b| b <= i64::MAX as u64)
}

/// The CFS quota for `cpus`, in microseconds per [`PERIOD_US`].
fn quota_us(cpus: f64) -> u64 {
    ((cpus * PERIOD_US as f64).round() as u64).max(1000)
}

/// Where a sandbox's processes are accounted.
#[derive(Debug)]
pub enum Placement {
    /// In a cgroup of their own, with (at least some of) their limits.
    Enforced(Cgroup),
    /// Nowhere: this host or user cannot have a cgroup per sandbox.
    Unenforced {
        /// One line saying why, for `info` and `doctor`.
        why: String,
    },
}

/// Which cgroup filesystem a [`Cgroup`] lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The legacy hierarchies, one per controller (also the hybrid layout).
    V1,
    /// The unified hierarchy.
    V2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];

    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }

    /// The limit this controller holds, as the user knows it.
    fn flag(self) -> &'static str {
        match self {
            Controller::Memory => "--mem",
            Controller::Pids => "--pids",
            Controller::Cpu => "--cpus",
        }
    }

    fn limited_by(self, l: &Limits) -> bool {
        match self {
            Controller::Memory => l.mem_mib.is_some(),
            Controller::Pids => l.pids.is_some(),
            Controller::Cpu => l.cpus.is_some() || l.cpu_shares.is_some(),
        }
    }
}

/// The controllers a sandbox with `limits` joins: memory and pids always
/// (OOM counts, the process count), cpu only to cap it.
fn wanted(limits: &Limits) -> Vec<Controller> {
    let mut w = vec![Controller::Memory, Controller::Pids];
    if limits.cpus.is_some() || limits.cpu_shares.is_some() {
        w.push(Controller::Cpu);
    }
    w
}

/// cgroup v2's `cpu.weight` (1–10000, default 100) for v1 shares (2–262144,
/// default 1024), as runc and crun convert it.
fn weight_of(shares: u64) -> u64 {
    1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142
}

/// The `cgroup.procs` descriptors a child writes itself into, one per
/// hierarchy; `Copy` and heap-free so a `pre_exec` closure can own it.
/// Valid as long as the [`Cgroup`] it came from.
#[derive(Debug, Clone, Copy)]
pub struct JoinFds {
    fds: [RawFd; MAX_HIERARCHIES],
    len: usize,
}

impl JoinFds {
    /// The descriptors, for [`join_self`].
    pub fn as_slice(&self) -> &[RawFd] {
        &self.fds[..self.len]
    }
}

/// Moves the calling process into the cgroups behind `fds` (from
/// [`Cgroup::join_fds`]) by writing `0` to each. Async-signal-safe: no
/// allocation, no lock, only `pwrite(2)`, so it may run in a `pre_exec`
/// hook of a child forked from a threaded process.
pub fn join_self(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        loop {
            // SAFETY: the buffer is a 1-byte static; `fd` is a descriptor
            // the caller keeps open (a bad one is EBADF, not UB).
            let n = unsafe { libc::pwrite(fd, b"0".as_ptr().cast(), 1, 0) };
            if n == 1 {
                break;
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

/// One hierarchy's directory of a sandbox's cgroup.
#[derive(Debug)]
struct Hier {
    dir: PathBuf,
    controllers: Vec<Controller>,
    procs: fs::File,
}

/// A sandbox's cgroup: its directories (one in v2, one per controller
/// hierarchy in v1), the limits written there and the `cgroup.procs`
/// descriptors children join through. Dropping it leaves the cgroup in
/// place; [`Cgroup::remove`] (or [`remove_leftover`]) takes it down.
#[derive(Debug)]
pub struct Cgroup {
    version: Version,
    name: String,
    hiers: Vec<Hier>,
    enforced: Limits,
    unenforced: Vec<String>,
}

impl Cgroup {
    /// The descriptors a forked child passes to [`join_self`].
    pub fn join_fds(&self) -> JoinFds {
        let mut j = JoinFds {
            fds: [-1; MAX_HIERARCHIES],
            len: 0,
        };
        for h in self.hiers.iter().take(MAX_HIERARCHIES) {
            j.fds[j.len] = h.procs.as_raw_fd();
            j.len += 1;
        }
        j
    }

    /// Which cgroup filesystem this cgroup is in.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The limits written to the cgroup's files.
    pub fn enforced(&self) -> Limits {
        self.enforced
    }

    /// The asked-for limits that could not be enforced, each with why
    /// (`--cpus: the cpu controller is not delegated to uid 1000 …`).
    pub fn unenforced(&self) -> &[String] {
        &self.unenforced
    }

    /// How many times the kernel's OOM killer killed a process in here
    /// (v2 `memory.events`, v1 `memory.oom_control`: `oom_kill`); 0 when
    /// there is no memory controller to ask.
    pub fn oom_kills(&self) -> u64 {
        let Some(h) = self.hier(Controller::Memory) else {
            return 0;
        };
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        fs::read_to_string(h.dir.join(file))
            .ok()
            .and_then(|t| keyed(&t, "oom_kill"))
            .unwrap_or(0)
    }

    /// One line for `info`: where the cgroup is and what it holds, e.g.
    /// `cgroup-v1 /sys/fs/cgroup/{memory,pids,cpu}/boxdesk/NAME: memory 512
    /// MiB (swap included), cpus 1.5, pids 4096`.
    pub fn describe(&self) -> String {
        let version = match self.version {
            Version::V1 => "cgroup-v1",
            Version::V2 => "cgroup-v2",
        };
        let mut s = format!("{version} {}: ", self.location());
        let l = &self.enforced;
        let mut parts = Vec::new();
        if let Some(m) = l.mem_mib {
            parts.push(format!("memory {m} MiB{}", self.swap_note()));
        }
        if let Some(c) = l.cpus {
            parts.push(format!("cpus {c}"));
        }
        if let Some(p) = l.pids {
            parts.push(format!("pids {p}"));
        }
        if parts.is_empty() {
            parts.push("no limits, processes tracked".to_owned());
        }
        s.push_str(&parts.join(", "));
        for u in &self.unenforced {
            s.push_str("; unenforced ");
            s.push_str(u);
        }
        s
    }

    /// Where it is: `/sys/fs/cgroup/boxdesk/NAME`, or for v1
    /// `/sys/fs/cgroup/{memory,pids,cpu}/boxdesk/NAME`.
    pub fn location(&self) -> String {
        let dirs: Vec<&Path> = self.hiers.iter().filter_map(|h| h.dir.parent()).collect();
        join_dirs(&dirs, &self.name)
    }

    fn swap_note(&self) -> &'static str {
        let Some(h) = self.hier(Controller::Memory) else {
            return "";
        };
        let file = match self.version {
            Version::V2 => "memory.swap.max",
            Version::V1 => "memory.memsw.limit_in_bytes",
        };
        if h.dir.join(file).exists() {
            " (swap included)"
        } else {
            " (no swap accounting here)"
        }
    }

    fn hier(&self, c: Controller) -> Option<&Hier> {
        self.hiers.iter().find(|h| h.controllers.contains(&c))
    }

    /// Kills every process still in the cgroup (v2 `cgroup.kill` where the
    /// kernel has it, else SIGKILL to each listed process until none is
    /// left, per hierarchy), then removes its directories, deepest first.
    /// Never follows anything outside its own directories; removing what is
    /// already gone is not an error.
    pub fn remove(self) -> Result<(), CgroupError> {
        let mut first = Ok(());
        for h in &self.hiers {
            if let Err(e) = remove_tree(&h.dir, self.version) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

/// Makes the cgroup `name` with `limits`, where this host and user allow
/// (see the module docs). `Unenforced` says why none can be had; an error
/// is a bad name or limit, a leftover of the same name with processes in
/// it, or a kernel refusing a value (nothing is left behind then).
pub fn create(name: &str, limits: &Limits) -> Result<Placement, CgroupError> {
    validate_name(name)?;
    limits.validate()?;
    let euid = boxdesk_platform::euid();
    match plan(euid, &wanted(limits)) {
        Ok(p) => build(p, name, limits),
        Err(why) => Ok(Placement::Unenforced { why }),
    }
}

/// Removes the cgroup `name` that a dead helper left, wherever [`create`]
/// would put it for this user, killing what is still inside. Whether there
/// was one.
pub fn remove_leftover(name: &str) -> Result<bool, CgroupError> {
    validate_name(name)?;
    let Ok(p) = plan(boxdesk_platform::euid(), &Controller::ALL) else {
        return Ok(false);
    };
    let mut found = false;
    let mut first = Ok(());
    for h in &p.hiers {
        let dir = h.parent.join("boxdesk").join(name);
        if fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            found = true;
            if let Err(e) = remove_tree(&dir, p.version) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
    }
    first.map(|()| found)
}

/// What `boxdesk doctor` says about cgroups: the layout, and whether and
/// where this user's sandboxes get limits, or why not and what that means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupProbe {
    /// The layout in words.
    pub layout: String,
    /// Where limits go (`Ok`), or why none can be had (`Err`).
    pub verdict: Result<String, String>,
}

impl CgroupProbe {
    /// Whether sandboxes of this user get a cgroup.
    pub fn can_enforce(&self) -> bool {
        self.verdict.is_ok()
    }
}

impl fmt::Display for CgroupProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cgroups: {}", self.layout)?;
        match &self.verdict {
            Ok(place) => write!(f, "  limits: enforced, {place}"),
            Err(why) => write!(
                f,
                "  limits: unenforced: {why}\n  what it means: run refuses --mem and --cpus \
                 and a sandbox has no default memory limit; the process count is capped by \
                 RLIMIT_NPROC in the sandbox's user namespace instead of pids.max"
            ),
        }
    }
}

/// Reads the layout and decides, without changing anything, what
/// [`create`] would do for this user.
pub fn probe() -> CgroupProbe {
    let euid = boxdesk_platform::euid();
    let mounts = Mounts::read();
    let verdict = plan_in(&mounts, euid, &Controller::ALL).map(|p| {
        let who = if euid == 0 {
            "as root".to_owned()
        } else {
            format!("as uid {euid}")
        };
        let dirs: Vec<PathBuf> = p.hiers.iter().map(|h| h.parent.join("boxdesk")).collect();
        let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
        let mut s = format!("{who} in {}", join_dirs(&dirs, "NAME"));
        for (c, why) in &p.missing {
            s.push_str(&format!("; {} unenforced: {why}", c.flag()));
        }
        s
    });
    CgroupProbe {
        layout: mounts.describe(),
        verdict,
    }
}

/// `name` in each of `dirs` (the `boxdesk` parents): one path, or for v1
/// hierarchies side by side `/a/memory/boxdesk` + `/a/pids/boxdesk` →
/// `/a/{memory,pids}/boxdesk/NAME`.
fn join_dirs(dirs: &[&Path], name: &str) -> String {
    let with_name = |d: &Path| d.join(name).display().to_string();
    if dirs.len() == 1 {
        return with_name(dirs[0]);
    }
    // v1: `<mounts>/<hierarchy>/boxdesk`, the hierarchies side by side.
    let split: Option<Vec<(&Path, String, &Path)>> = dirs
        .iter()
        .map(|d| {
            let rel = d
                .ancestors()
                .find(|a| a.file_name().is_some_and(|n| n == "boxdesk"))?;
            let hier = rel.parent()?;
            Some((
                hier.parent()?,
                hier.file_name()?.to_string_lossy().into_owned(),
                d.strip_prefix(hier).ok()?,
            ))
        })
        .collect();
    match split {
        Some(s) if s.iter().all(|(p, _, r)| *p == s[0].0 && *r == s[0].2) => {
            let names: Vec<&str> = s.iter().map(|(_, n, _)| n.as_str()).collect();
            format!(
                "{}/{{{}}}/{}",
                s[0].0.display(),
                names.join(","),
                s[0].2.join(name).display()
            )
        }
        _ => dirs
            .iter()
            .map(|d| with_name(d))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The value of `key` in a `key value` per line control file.
pub(super) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Errors that mean "not allowed here" rather than "broken".
fn denied(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

fn write_file(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|source| CgroupError::Write {
            path: path.to_owned(),
            value: value.to_owned(),
            error: source,
        })
}

fn build(p: Plan, name: &str, limits: &Limits) -> Result<Placement, CgroupError> {
    let mut made: Vec<PathBuf> = Vec::new();
    let undo = |made: &[PathBuf]| {
        for d in made {
            let _ = remove_tree(d, p.version);
        }
    };
    let mut missing = p.missing;
    let mut hiers = Vec::new();
    for ph in &p.hiers {
        let base = ph.parent.join("boxdesk");
        let mut controllers = ph.controllers.clone();
        if p.version == Version::V2 {
            enable_all(&ph.parent, &mut controllers, &mut missing);
        }
        if let Err(e) = fs::create_dir(&base) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                undo(&made);
                return refused(&base, e);
            }
        }
        if p.version == Version::V2 {
            enable_all(&base, &mut controllers, &mut missing);
        }
        if controllers.is_empty() {
            continue;
        }
        let dir = base.join(name);
        if let Err(e) = make_leaf(&dir, p.version) {
            undo(&made);
            return match e {
                CgroupError::Create {
                    path,
                    error: source,
                } if denied(&source) => refused(&path, source),
                e => Err(e),
            };
        }
        made.push(dir.clone());
        let opened = write_limits(&dir, p.version, &controllers, limits).and_then(|lacking| {
            for c in lacking {
                controllers.retain(|&x| x != c);
                missing.push((c, "this kernel has no CPU bandwidth control".to_owned()));
            }
            let procs = dir.join("cgroup.procs");
            fs::OpenOptions::new()
                .write(true)
                .open(&procs)
                .map_err(|source| CgroupError::Read {
                    path: procs,
                    error: source,
                })
        });
        match opened {
            Ok(procs) => hiers.push(Hier {
                dir,
                controllers,
                procs,
            }),
            Err(e) => {
                undo(&made);
                return Err(e);
            }
        }
    }
    if hiers.is_empty() {
        return Ok(Placement::Unenforced {
            why: none_usable(&missing),
        });
    }
    let has = |c: Controller| hiers.iter().any(|h: &Hier| h.controllers.contains(&c));
    let enforced = Limits {
        cpus: limits.cpus.filter(|_| has(Controller::Cpu)),
        mem_mib: limits.mem_mib.filter(|_| has(Controller::Memory)),
        pids: limits.pids.filter(|_| has(Controller::Pids)),
        cpu_shares: limits.cpu_shares.filter(|_| has(Controller::Cpu)),
    };
    let unenforced = missing
        .iter()
        .filter(|(c, _)| c.limited_by(limits))
        .map(|(c, why)| format!("{}: {why}", c.flag()))
        .collect();
    Ok(Placement::Enforced(Cgroup {
        version: p.version,
        name: name.to_owned(),
        hiers,
        enforced,
        unenforced,
    }))
}

fn refused(path: &Path, e: io::Error) -> Result<Placement, CgroupError> {
    if denied(&e) {
        Ok(Placement::Unenforced {
            why: format!("cannot create {}: {e}", path.display()),
        })
    } else {
        Err(CgroupError::Create {
            path: path.to_owned(),
            error: e,
        })
    }
}

/// Enables each of `controllers` for `dir`'s children (v2) that is not
/// yet; one the kernel refuses moves to `missing`.
fn enable_all(
    dir: &Path,
    controllers: &mut Vec<Controller>,
    missing: &mut Vec<(Controller, String)>,
) {
    let file = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&file).unwrap_or_default();
    controllers.retain(|&c| {
        if enabled.split_whitespace().any(|x| x == c.name()) {
            return true;
        }
        match write_file(&file, &format!("+{}", c.name())) {
            Ok(()) => true,
            Err(e) => {
                missing.push((c, e.to_string()));
                false
            }
        }
    });
}

/// Makes the sandbox's own directory; a leftover of the same name is
/// replaced when empty (fresh counters), refused when it holds processes.
fn make_leaf(dir: &Path, version: Version) -> Result<(), CgroupError> {
    match fs::create_dir(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(CgroupError::Create {
                path: dir.to_owned(),
                error: source,
            })
        }
    }
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(CgroupError::NotACgroup(dir.to_owned()));
    }
    let populated = match version {
        Version::V2 => {
            fs::read_to_string(dir.join("cgroup.events"))
                .ok()
                .and_then(|t| keyed(&t, "populated"))
                .unwrap_or(1)
                != 0
        }
        Version::V1 => !read_pids(dir)?.is_empty(),
    };
    if populated {
        return Err(CgroupError::InUse(dir.to_owned()));
    }
    remove_tree(dir, version)?;
    fs::create_dir(dir).map_err(|source| CgroupError::Create {
        path: dir.to_owned(),
        error: source,
    })
}

/// Writes `l` for `controllers` into `dir`; returns the controllers whose
/// limit file this kernel lacks (cpu without `CONFIG_CFS_BANDWIDTH`).
fn write_limits(
    dir: &Path,
    version: Version,
    controllers: &[Controller],
    l: &Limits,
) -> Result<Vec<Controller>, CgroupError> {
    let mut no_bandwidth = Vec::new();
    for c in controllers {
        match (c, version) {
            (Controller::Memory, _) => {
                let Some(bytes) = l.mem_mib.and_then(mem_bytes) else {
                    continue;
                };
                let bytes = bytes.to_string();
                if version == Version::V2 {
                    write_file(&dir.join("memory.max"), &bytes)?;
                    let swap = dir.join("memory.swap.max");
                    if swap.exists() {
                        write_file(&swap, "0")?;
                    }
                } else {
                    // memsw may never be below the memory limit: memory first.
                    write_file(&dir.join("memory.limit_in_bytes"), &bytes)?;
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write_file(&memsw, &bytes)?;
                    }
                }
            }
            (Controller::Pids, _) => {
                if let Some(p) = l.pids {
                    write_file(&dir.join("pids.max"), &p.to_string())?;
                }
            }
            (Controller::Cpu, _) => {
                if let Some(shares) = l.cpu_shares {
                    match version {
                        Version::V2 => {
                            write_file(&dir.join("cpu.weight"), &weight_of(shares).to_string())?
                        }
                        Version::V1 => write_file(&dir.join("cpu.shares"), &shares.to_string())?,
                    }
                }
                let Some(cpus) = l.cpus else {
                    continue;
                };
                let (quota, period) = match version {
                    Version::V2 => (dir.join("cpu.max"), None),
                    Version::V1 => (
                        dir.join("cpu.cfs_quota_us"),
                        Some(dir.join("cpu.cfs_period_us")),
                    ),
                };
                if !quota.exists() {
                    no_bandwidth.push(Controller::Cpu);
                    continue;
                }
                match period {
                    None => write_file(&quota, &format!("{} {PERIOD_US}", quota_us(cpus)))?,
                    Some(period) => {
                        write_file(&period, &PERIOD_US.to_string())?;
                        write_file(&quota, &quota_us(cpus).to_string())?;
                    }
                }
            }
        }
    }
    Ok(no_bandwidth)
}

#[cfg(test)]
mod tests;
