//! Where a sandbox's cgroup goes, decided without changing anything: the
//! layout from `/proc/self/mountinfo` (v2, v1, hybrid), and for this user
//! the cgroup `boxdesk/` belongs in (the hierarchy's root for root, the
//! delegated ancestor for a v2 user) with the controllers it can have and
//! why not the others. It must never write to the cgroup filesystem.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Controller, Version};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mount {
    pub(super) point: PathBuf,
    /// The path inside the hierarchy mounted there (`/` unless a subtree).
    pub(super) root: String,
    pub(super) read_only: bool,
    /// v1: the controllers this hierarchy has (`cpu`, `cpuacct`, …).
    pub(super) controllers: Vec<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Mounts {
    pub(super) v2: Vec<Mount>,
    pub(super) v1: Vec<Mount>,
}

impl Mounts {
    pub(super) fn read() -> Mounts {
        Mounts::parse(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
    }

    pub(super) fn parse(text: &str) -> Mounts {
        let mut m = Mounts::default();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(dash) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            if dash < 6 || fields.len() < dash + 4 {
                continue;
            }
            let mount = Mount {
                point: PathBuf::from(unescape(fields[4])),
                root: unescape(fields[3]),
                read_only: fields[5].split(',').any(|o| o == "ro"),
                controllers: Vec::new(),
            };
            match fields[dash + 1] {
                "cgroup2" => m.v2.push(mount),
                "cgroup" => m.v1.push(Mount {
                    controllers: fields[dash + 3].split(',').map(str::to_owned).collect(),
                    ..mount
                }),
                _ => {}
            }
        }
        m
    }

    /// The v1 hierarchy `c` is bound to, if any.
    pub(super) fn v1_for(&self, c: Controller) -> Option<&Mount> {
        self.v1
            .iter()
            .find(|m| m.controllers.iter().any(|x| x == c.name()))
    }

    /// The cgroup2 mount to use: `/sys/fs/cgroup` first, then the hybrid
    /// `unified`, then any.
    pub(super) fn v2_main(&self) -> Option<&Mount> {
        let at = |p: &str| self.v2.iter().find(|m| m.point == Path::new(p));
        at("/sys/fs/cgroup")
            .or_else(|| at("/sys/fs/cgroup/unified"))
            .or_else(|| self.v2.first())
    }

    /// v1 when memory is bound to a v1 hierarchy (pure v1 or hybrid), v2
    /// when a cgroup2 is mounted, else none.
    pub(super) fn version(&self) -> Option<Version> {
        if self.v1_for(Controller::Memory).is_some() {
            Some(Version::V1)
        } else if self.v2_main().is_some() {
            Some(Version::V2)
        } else {
            None
        }
    }

    pub(super) fn describe(&self) -> String {
        match self.version() {
            None => "none mounted".to_owned(),
            Some(Version::V2) => {
                let m = self.v2_main().map(|m| m.point.clone()).unwrap_or_default();
                let ctl = fs::read_to_string(m.join("cgroup.controllers")).unwrap_or_default();
                format!("v2 at {} (controllers: {})", m.display(), ctl.trim())
            }
            Some(Version::V1) => {
                let hiers: Vec<String> = Controller::ALL
                    .iter()
                    .map(|&c| match self.v1_for(c) {
                        Some(m) => format!("{} at {}", c.name(), m.point.display()),
                        None => format!("no {} hierarchy", c.name()),
                    })
                    .collect();
                match self.v2_main() {
                    Some(u) => format!(
                        "hybrid: v1 {}; a cgroup2 at {} without those controllers",
                        hiers.join(", "),
                        u.point.display()
                    ),
                    None => format!("v1: {}", hiers.join(", ")),
                }
            }
        }
    }
}

/// A mountinfo field, its octal escapes undone (as text: cgroup paths
/// are).
fn unescape(s: &str) -> String {
    String::from_utf8_lossy(&boxdesk_platform::mountinfo::unescape(s)).into_owned()
}

#[derive(Debug)]
pub(super) struct PlanHier {
    /// The cgroup `boxdesk/` goes in: the hierarchy's root (root), or the
    /// delegated ancestor (a v2 user).
    pub(super) parent: PathBuf,
    pub(super) controllers: Vec<Controller>,
}

#[derive(Debug)]
pub(super) struct Plan {
    pub(super) version: Version,
    pub(super) hiers: Vec<PlanHier>,
    /// Wanted controllers that cannot be had, and why.
    pub(super) missing: Vec<(Controller, String)>,
}

pub(super) fn plan(euid: u32, wanted: &[Controller]) -> Result<Plan, String> {
    plan_in(&Mounts::read(), euid, wanted)
}

pub(super) fn plan_in(mounts: &Mounts, euid: u32, wanted: &[Controller]) -> Result<Plan, String> {
    match mounts.version() {
        None => Err("no cgroup filesystem is mounted".to_owned()),
        Some(Version::V1) => plan_v1(mounts, euid, wanted),
        Some(Version::V2) => plan_v2(mounts, euid, wanted),
    }
}

fn plan_v1(mounts: &Mounts, euid: u32, wanted: &[Controller]) -> Result<Plan, String> {
    let layout = if mounts.v2.is_empty() {
        "v1"
    } else {
        "the hybrid layout"
    };
    if euid != 0 {
        return Err(format!(
            "cgroup v1 ({layout}) has no safe delegation: only root can create cgroups, \
             and this is uid {euid}"
        ));
    }
    let mut p = Plan {
        version: Version::V1,
        hiers: Vec::new(),
        missing: Vec::new(),
    };
    for &c in wanted {
        let Some(m) = mounts.v1_for(c) else {
            p.missing
                .push((c, format!("no v1 {} hierarchy is mounted", c.name())));
            continue;
        };
        if let Err(why) = writable_by(&m.point, m, euid) {
            p.missing.push((c, why));
            continue;
        }
        match p.hiers.iter_mut().find(|h| h.parent == m.point) {
            Some(h) => h.controllers.push(c),
            None => p.hiers.push(PlanHier {
                parent: m.point.clone(),
                controllers: vec![c],
            }),
        }
    }
    if p.hiers.is_empty() {
        return Err(none_usable(&p.missing));
    }
    Ok(p)
}

fn plan_v2(mounts: &Mounts, euid: u32, wanted: &[Controller]) -> Result<Plan, String> {
    let Some(m) = mounts.v2_main() else {
        return Err("no cgroup2 is mounted".to_owned());
    };
    let parent = if euid == 0 {
        writable_by(&m.point, m, euid)?;
        m.point.clone()
    } else {
        delegated_ancestor(m, euid)?
    };
    let words = |f: &str| -> Vec<String> {
        fs::read_to_string(parent.join(f))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let available = words("cgroup.controllers");
    let enabled = words("cgroup.subtree_control");
    // The real root has no cgroup.type and may hold processes; any other
    // cgroup may not enable controllers while it does.
    let holds_procs = parent.join("cgroup.type").exists()
        && !fs::read_to_string(parent.join("cgroup.procs"))
            .unwrap_or_default()
            .trim()
            .is_empty();
    let mut p = Plan {
        version: Version::V2,
        hiers: Vec::new(),
        missing: Vec::new(),
    };
    let owns = |f: &Path| fs::metadata(f).is_ok_and(|md| md.uid() == euid);
    let mut usable = Vec::new();
    for &c in wanted {
        let has = |list: &[String]| list.iter().any(|x| x == c.name());
        if !has(&available) {
            let why = if euid == 0 {
                format!("the kernel offers no {} controller here", c.name())
            } else {
                format!(
                    "the {} controller is not delegated to uid {euid} ({}/cgroup.controllers: {})",
                    c.name(),
                    parent.display(),
                    available.join(" ")
                )
            };
            p.missing.push((c, why));
        } else if !has(&enabled) && euid != 0 && !owns(&parent.join("cgroup.subtree_control")) {
            p.missing.push((
                c,
                format!(
                    "{}/cgroup.subtree_control does not belong to uid {euid}, so it cannot \
                     enable the {} controller for its children",
                    parent.display(),
                    c.name()
                ),
            ));
        } else if !has(&enabled) && holds_procs {
            p.missing.push((
                c,
                format!(
                    "{} holds processes, so cgroup v2 lets it enable no {} controller for \
                     its children",
                    parent.display(),
                    c.name()
                ),
            ));
        } else {
            usable.push(c);
        }
    }
    if usable.is_empty() {
        return Err(none_usable(&p.missing));
    }
    p.hiers.push(PlanHier {
        parent,
        controllers: usable,
    });
    Ok(p)
}

pub(super) fn none_usable(missing: &[(Controller, String)]) -> String {
    let whys: Vec<String> = missing
        .iter()
        .map(|(c, why)| format!("{}: {why}", c.name()))
        .collect();
    format!("no controller can be used ({})", whys.join("; "))
}

/// Whether `euid` may make cgroups in `dir` of mount `m`: a writable mount
/// and a directory the user owns (root: one root owns, so a user
/// namespace's root is not mistaken for the host's).
fn writable_by(dir: &Path, m: &Mount, euid: u32) -> Result<(), String> {
    if m.read_only {
        return Err(format!("{} is mounted read-only", m.point.display()));
    }
    match fs::metadata(dir) {
        Ok(md) if md.uid() == euid => Ok(()),
        Ok(md) => Err(format!(
            "{} belongs to uid {}, not to uid {euid}",
            dir.display(),
            md.uid()
        )),
        Err(e) => Err(format!("cannot read {}: {e}", dir.display())),
    }
}

/// This process's cgroup in the v2 hierarchy, as a path under `m`.
fn own_v2_cgroup(m: &Mount) -> Result<(String, PathBuf), String> {
    let text = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let cg = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("/proc/self/cgroup has no cgroup v2 entry")?
        .to_owned();
    let root = m.root.trim_end_matches('/');
    let rel = cg
        .strip_prefix(root)
        .filter(|r| r.is_empty() || r.starts_with('/'))
        .ok_or_else(|| {
            format!(
                "this process's cgroup {cg} is outside the mounted {}",
                m.point.display()
            )
        })?;
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return Err(format!(
            "this process's cgroup {cg} is outside its namespace"
        ));
    }
    Ok((cg.clone(), m.point.join(rel)))
}

/// The highest ancestor of this process's v2 cgroup (itself included)
/// whose directory and `cgroup.procs` `euid` owns: where systemd's
/// delegation (`user@UID.service`) begins.
fn delegated_ancestor(m: &Mount, euid: u32) -> Result<PathBuf, String> {
    let (cg, own) = own_v2_cgroup(m)?;
    let owned = |d: &Path| {
        [d.to_path_buf(), d.join("cgroup.procs")]
            .iter()
            .all(|p| fs::metadata(p).is_ok_and(|md| md.uid() == euid))
    };
    let mut best = None;
    for d in own.ancestors() {
        if !d.starts_with(&m.point) || !owned(d) {
            break;
        }
        best = Some(d.to_path_buf());
        if d == m.point {
            break;
        }
    }
    if m.read_only {
        return Err(format!("{} is mounted read-only", m.point.display()));
    }
    best.ok_or_else(|| {
        let svc = format!("user@{euid}.service");
        let outside = if cg.contains(&svc) {
            String::new()
        } else {
            format!(" (outside {svc})")
        };
        format!(
            "no cgroup v2 delegation for uid {euid}: this process runs in {cg}{outside}, \
             which uid {euid} does not own; start boxdesk inside the user's systemd manager, \
             e.g. `systemd-run --user --scope boxdesk …`"
        )
    })
}
