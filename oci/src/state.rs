//! A container's state on disk, under the runtime's `--root`:
//! `<root>/<id>/state.json` (written whole, by rename, once the sandbox is
//! created), `started` (the init process was started), `init.sock` (where
//! `start` reaches the container's monitor) and the monitor's `log`.
//!
//! The status is derived, never stored: the monitor (the process whose pid
//! engines are given, which exits with the init process's status) alive
//! under the same start time → `created` or, once `started` exists,
//! `running`; otherwise `stopped`. A reused pid is told apart by its start
//! time in `/proc/<pid>/stat`.
//!
//! This module owns those files. It must never follow a symlink out of
//! the root, nor take an id that is not one path component.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why the state cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The id is not usable.
    #[error(
        "invalid container id {0:?}: use letters, digits and _ + - . (not first; at most 1024)"
    )]
    BadId(String),
    /// No such container.
    #[error("container {0} does not exist")]
    Missing(String),
    /// The id is taken.
    #[error("container {0} already exists")]
    Exists(String),
    /// The state file is not ours to read.
    #[error("container {id}: corrupt state.json")]
    Corrupt {
        /// The id.
        id: String,
        /// What serde said.
        source: serde_json::Error,
    },
    /// The root is not this user's private directory.
    #[error("{}: the state root must be a directory of this user's that no one else can write to, not a symlink", .0.display())]
    Unsafe(PathBuf),
    /// No runtime dir for the default root.
    #[error(transparent)]
    Dirs(#[from] boxdesk_platform::DirError),
    /// A file system call failed.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StateError + 'a {
    move |source| StateError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// A container's status, as the runtime spec names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `create` is still running.
    Creating,
    /// Created, its process not started.
    Created,
    /// Its process runs.
    Running,
    /// Its process has exited.
    Stopped,
}

impl Status {
    /// The spec's word.
    pub fn word(self) -> &'static str {
        match self {
            Status::Creating => "creating",
            Status::Created => "created",
            Status::Running => "running",
            Status::Stopped => "stopped",
        }
    }
}

/// What `create` records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The container id.
    pub id: String,
    /// The bundle (absolute).
    pub bundle: PathBuf,
    /// The monitor's pid (0 while creating).
    pub pid: i32,
    /// The monitor's start time (`/proc/<pid>/stat` field 22).
    pub pid_start: u64,
    /// The sandbox's first process (its agent), whose namespaces are the
    /// container's: what another container joining this one's joins.
    #[serde(default)]
    pub ns_pid: i32,
    /// When it was created (RFC 3339, UTC).
    pub created: String,
    /// The boxdesk sandbox it is (`boxdesk ls` lists it).
    pub sandbox: String,
    /// The config's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The capabilities its processes have.
    pub caps: Vec<String>,
    /// Its rlimits, `(RLIMIT_*, soft, hard)`: every process's.
    #[serde(default)]
    pub rlimits: Vec<(i32, u64, u64)>,
    /// Its OOM score adjustment: every process's.
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
}

/// The runtime's root dir.
#[derive(Debug, Clone)]
pub struct Root(pub PathBuf);

impl Root {
    /// The default: `/run/boxdesk-oci` for root, else
    /// `$XDG_RUNTIME_DIR/boxdesk-oci`, else `oci` in boxdesk's own runtime
    /// dir (never a shared `/tmp` path another user could make first).
    pub fn default_path() -> Result<PathBuf, StateError> {
        if boxdesk_platform::euid() == 0 {
            return Ok("/run/boxdesk-oci".into());
        }
        match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| Path::new(d).is_absolute()) {
            Some(d) => Ok(Path::new(&d).join("boxdesk-oci")),
            None => Ok(boxdesk_platform::dirs::runtime_dir()?.join("oci")),
        }
    }

    /// Makes the root (0700) if missing, and refuses one that is not this
    /// user's own (a symlink, another owner, writable by others): whoever
    /// controls it controls the containers' sockets and the pids `kill`
    /// signals. Engines make theirs 0700 or 0711.
    pub fn ensure(&self) -> Result<(), StateError> {
        use std::os::unix::fs::MetadataExt as _;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.0)
            .map_err(io_err("cannot make the state root", &self.0))?;
        let meta = fs::symlink_metadata(&self.0).map_err(io_err("cannot inspect", &self.0))?;
        // SAFETY: geteuid has no arguments and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
            return Err(StateError::Unsafe(self.0.clone()));
        }
        Ok(())
    }

    /// The dir of container `id`, after checking the id.
    pub fn dir(&self, id: &str) -> Result<PathBuf, StateError> {
        check_id(id)?;
        Ok(self.0.join(id))
    }

    /// Claims `id`: makes its dir, or says it exists.
    pub fn claim(&self, id: &str) -> Result<PathBuf, StateError> {
        self.ensure()?;
        let dir = self.dir(id)?;
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(StateError::Exists(id.to_owned()))
            }
            Err(e) => Err(io_err("cannot make", &dir)(e)),
        }
    }

    /// Every container id under the root, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = fs::read_dir(&self.0)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|id| check_id(id).is_ok())
            .collect();
        ids.sort();
        ids
    }
}

/// A usable id: one path component of `[A-Za-z0-9_+.-]` not starting
/// with `.` (the root's own dirs do).
pub fn check_id(id: &str) -> Result<(), StateError> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StateError::BadId(id.to_owned()))
    }
}

/// Writes `record` as `dir/state.json`, whole (a temporary file renamed).
pub fn write(dir: &Path, record: &Record) -> Result<(), StateError> {
    let tmp = dir.join(".state.json.tmp");
    let path = dir.join("state.json");
    let body = serde_json::to_vec_pretty(record).map_err(|source| StateError::Corrupt {
        id: record.id.clone(),
        source,
    })?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io_err("cannot write", &tmp))?;
    f.write_all(&body).map_err(io_err("cannot write", &tmp))?;
    fs::rename(&tmp, &path).map_err(io_err("cannot write", &path))
}

/// Marks `dir` as being created by this process (`creating`: its pid and
/// start time), until `state.json` is written.
pub fn mark_creating(dir: &Path) -> Result<(), StateError> {
    let me = std::process::id() as i32;
    let path = dir.join("creating");
    let body = format!("{me} {}", start_time(me).unwrap_or(0));
    fs::write(&path, body).map_err(io_err("cannot write", &path))
}

/// The process creating the container in `dir`, while it runs.
pub fn creator(dir: &Path) -> Option<i32> {
    let text = fs::read_to_string(dir.join("creating")).ok()?;
    let (pid, start) = text.split_once(' ')?;
    let (pid, start) = (pid.parse().ok()?, start.parse().ok()?);
    alive(pid, start).then_some(pid)
}

/// Reads container `id`'s record: a `creating` one (pid 0) while `create`
/// runs and has not written it yet.
pub fn read(root: &Root, id: &str) -> Result<Record, StateError> {
    let dir = root.dir(id)?;
    let path = dir.join("state.json");
    let body = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if creator(&dir).is_some() {
                return Ok(Record {
                    id: id.to_owned(),
                    bundle: PathBuf::new(),
                    pid: 0,
                    pid_start: 0,
                    ns_pid: 0,
                    created: String::new(),
                    sandbox: String::new(),
                    annotations: BTreeMap::new(),
                    caps: Vec::new(),
                    rlimits: Vec::new(),
                    oom_score_adj: None,
                });
            }
            return Err(StateError::Missing(id.to_owned()));
        }
        Err(e) => return Err(io_err("cannot read", &path)(e)),
    };
    serde_json::from_slice(&body).map_err(|source| StateError::Corrupt {
        id: id.to_owned(),
        source,
    })
}

/// The status of a recorded container.
pub fn status(dir: &Path, record: &Record) -> Status {
    if record.pid <= 0 {
        return Status::Creating;
    }
    if !alive(record.pid, record.pid_start) {
        return Status::Stopped;
    }
    if dir.join("started").exists() {
        Status::Running
    } else {
        Status::Created
    }
}

pub use boxdesk_platform::procstat::{alive, start_time};

/// Now as RFC 3339 UTC (`2026-12-06T06:21:49.499760765Z`).
pub fn now_rfc3339() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, dd) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_one_safe_path_component() {
        for ok in ["abc", "a-b_c.d+e", "0123456789abcdef"] {
            check_id(ok).unwrap();
        }
        for bad in ["", ".", "..", ".run", "a/b", "../x", "a b", "a\0b"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_dead_or_reused_pid_is_stopped_and_a_live_one_created_until_started() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id() as i32;
        let mut r = Record {
            id: "c".into(),
            bundle: "/b".into(),
            pid: me,
            pid_start: start_time(me).unwrap(),
            ns_pid: 0,
            created: now_rfc3339(),
            sandbox: "oci-c".into(),
            annotations: BTreeMap::new(),
            caps: vec![],
            rlimits: vec![],
            oom_score_adj: None,
        };
        assert_eq!(status(dir.path(), &r), Status::Created);
        fs::write(dir.path().join("started"), b"").unwrap();
        assert_eq!(status(dir.path(), &r), Status::Running);
        r.pid_start += 1;
        assert_eq!(status(dir.path(), &r), Status::Stopped, "a reused pid");
        r.pid = 0;
        assert_eq!(status(dir.path(), &r), Status::Creating);
    }

    #[test]
    fn records_round_trip_and_a_second_claim_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root(dir.path().join("r"));
        let d = root.claim("c1").unwrap();
        assert!(matches!(root.claim("c1"), Err(StateError::Exists(_))));
        let r = Record {
            id: "c1".into(),
            bundle: "/b".into(),
            pid: 1,
            pid_start: 2,
            ns_pid: 3,
            created: now_rfc3339(),
            sandbox: "oci-c1".into(),
            annotations: [("k".to_owned(), "v".to_owned())].into(),
            caps: vec!["CAP_KILL".into()],
            rlimits: vec![(7, 1024, 1024)],
            oom_score_adj: Some(100),
        };
        write(&d, &r).unwrap();
        assert_eq!(read(&root, "c1").unwrap(), r);
        assert!(matches!(read(&root, "nope"), Err(StateError::Missing(_))));
        assert_eq!(root.ids(), vec!["c1".to_owned()]);
    }

    #[test]
    fn a_container_being_created_reads_as_creating_until_its_creator_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root(dir.path().join("r"));
        let d = root.claim("c2").unwrap();
        assert!(matches!(read(&root, "c2"), Err(StateError::Missing(_))));
        mark_creating(&d).unwrap();
        let r = read(&root, "c2").unwrap();
        assert_eq!(status(&d, &r), Status::Creating);
        fs::write(d.join("creating"), "999999999 1").unwrap();
        assert!(
            matches!(read(&root, "c2"), Err(StateError::Missing(_))),
            "a dead creator"
        );
    }

    #[test]
    fn a_state_root_others_can_reach_or_a_symlink_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(Root(open).ensure(), Err(StateError::Unsafe(_))));
        let link = dir.path().join("link");
        let target = dir.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(Root(link).ensure(), Err(StateError::Unsafe(_))));
        Root(dir.path().join("new")).ensure().unwrap();
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_793), (2026, 12, 6));
        let t = now_rfc3339();
        assert!(t.ends_with('Z') && t.len() == 30, "{t}");
    }
}
