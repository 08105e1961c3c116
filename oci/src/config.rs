//! A bundle's `config.json` (runtime-spec 1.2), checked and turned into
//! what boxdesk runs: a [`Plan`]. It is read twice: by `oci-spec` into
//! typed values, and as plain JSON walked against the list of fields
//! boxdesk honours ([`HONOURED`]), so a field it does not know or cannot
//! honour is refused by name (`linux.intelRdt: not supported`), never
//! dropped. Empty values (`null`, `""`, `[]`, `{}`) ask nothing and pass.
//!
//! Honoured, on the namespace backend: the root (read-only or not), the
//! process (args, env, cwd, terminal and console size, uid/gid 0 only,
//! umask 022 only, capabilities in the sandbox's own user namespace,
//! rlimits, OOM score), the hostname, mounts (proc, a /dev tmpfs, devpts
//! under it, mqueue, sysfs and cgroup as the host's read-only `/sys`,
//! tmpfs, bind), the namespaces (pid, ipc, uts and mount are always new; a
//! new network namespace, or the host's; user and cgroup), memory, pids and
//! CPU quota limits, device rules (moot: the sandbox's /dev holds the
//! standard nodes only and none can be made), the seccomp
//! profile, masked and read-only paths. Always applied whatever the config
//! says, because every boxdesk sandbox has them: `no_new_privs`, a user
//! namespace, boxdesk's own seccomp filter.
//!
//! This module owns what boxdesk accepts of a bundle. It must never return
//! a plan for a config holding a field it does not honour.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use boxdesk_sandbox::container::{Join, Layout, Mount, Rlimit};
use oci_spec::runtime::{LinuxNamespaceType, PosixRlimitType, Process, Spec};
use serde_json::Value;

/// The annotation that picks the backend: `auto`, `namespace` or `vm`.
pub const BACKEND_ANNOTATION: &str = "io.boxdesk.backend";

/// Why a bundle cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or is not a runtime spec.
    #[error("cannot load {}", path.display())]
    Load {
        /// `config.json`.
        path: PathBuf,
        /// What oci-spec said.
        source: oci_spec::OciSpecError,
    },
    /// The file is not JSON (checked before oci-spec reads it).
    #[error("cannot read {}", path.display())]
    Json {
        /// `config.json`.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
    /// A field boxdesk does not honour.
    #[error("config.json: {field}: {why}")]
    Unsupported {
        /// The field, as a JSON path (`linux.resources.blockIO`).
        field: String,
        /// Why, or what is accepted.
        why: String,
    },
    /// The seccomp profile cannot be compiled.
    #[error("config.json")]
    Seccomp(#[from] crate::seccomp::SeccompError),
}

fn refuse(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Unsupported {
        field: field.into(),
        why: why.into(),
    }
}

/// Which backend runs the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// A VM where one boots, else namespaces.
    Auto,
    /// The namespace backend.
    Namespace,
    /// A VM.
    Vm,
}

/// The container's process (its init, or one `exec` runs).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessPlan {
    /// argv.
    pub args: Vec<String>,
    /// The environment, `K=V` each.
    pub env: Vec<String>,
    /// The working directory.
    pub cwd: String,
    /// On a terminal (the console socket's).
    pub terminal: bool,
    /// The terminal's rows and columns at start.
    pub console_size: Option<(u16, u16)>,
    /// The capabilities it asks for (its bounding set).
    pub caps: Vec<String>,
    /// Its rlimits, `(RLIMIT_*, soft, hard)`.
    #[serde(default)]
    pub rlimits: Vec<(i32, u64, u64)>,
    /// Its OOM score adjustment.
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
}

/// What boxdesk runs for a bundle.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sandbox's container layout.
    pub layout: Layout,
    /// The init process.
    pub process: ProcessPlan,
    /// Sysctls of the container's own namespaces (`net.*`, the IPC ones),
    /// set before its process starts.
    pub sysctls: Vec<(String, String)>,
    /// The host's network (no network namespace asked for).
    pub net_host: bool,
    /// Memory limit, bytes.
    pub mem_bytes: Option<u64>,
    /// Most tasks.
    pub pids: Option<u64>,
    /// The backend asked for.
    pub backend: BackendChoice,
    /// The config's annotations (reported by `state`).
    pub annotations: BTreeMap<String, String>,
}

/// The fields boxdesk honours, as JSON paths; `*` is any array element
/// or map key. A field under one of these is read (and checked) below.
const HONOURED: &[&str] = &[
    "ociVersion",
    "root.path",
    "root.readonly",
    "process.terminal",
    "process.consoleSize.height",
    "process.consoleSize.width",
    "process.user.uid",
    "process.user.gid",
    "process.user.umask",
    "process.user.additionalGids",
    "process.args",
    "process.env",
    "process.cwd",
    "process.capabilities.bounding",
    "process.capabilities.effective",
    "process.capabilities.inheritable",
    "process.capabilities.permitted",
    "process.capabilities.ambient",
    "process.rlimits.*.type",
    "process.rlimits.*.soft",
    "process.rlimits.*.hard",
    "process.noNewPrivileges",
    "process.oomScoreAdj",
    "hostname",
    "mounts.*.destination",
    "mounts.*.type",
    "mounts.*.source",
    "mounts.*.options",
    "annotations",
    "linux.resources.devices.*.allow",
    "linux.resources.devices.*.access",
    "linux.resources.devices.*.type",
    "linux.resources.devices.*.major",
    "linux.resources.devices.*.minor",
    "linux.resources.memory.limit",
    "linux.resources.memory.swap",
    "linux.resources.pids.limit",
    "linux.resources.cpu.quota",
    "linux.resources.cpu.shares",
    "linux.resources.cpu.period",
    "linux.cgroupsPath",
    "linux.namespaces.*.type",
    "linux.namespaces.*.path",
    "linux.seccomp.defaultAction",
    "linux.seccomp.defaultErrnoRet",
    "linux.seccomp.architectures",
    "linux.seccomp.flags",
    "linux.seccomp.listenerPath",
    "linux.seccomp.listenerMetadata",
    "linux.seccomp.syscalls.*.names",
    "linux.seccomp.syscalls.*.action",
    "linux.seccomp.syscalls.*.errnoRet",
    "linux.seccomp.syscalls.*.args.*.index",
    "linux.seccomp.syscalls.*.args.*.value",
    "linux.seccomp.syscalls.*.args.*.valueTwo",
    "linux.seccomp.syscalls.*.args.*.op",
    "linux.maskedPaths",
    "linux.readonlyPaths",
    "linux.rootfsPropagation",
    "linux.sysctl",
];

/// The most bytes of a `config.json` or `process.json` read: engines
/// write a few KiB; anything near this is not a runtime spec.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// Reads a config file, refusing one larger than [`MAX_CONFIG_BYTES`]
/// before reading it.
fn read_capped(path: &Path) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read as _;
    let load = |e| ConfigError::Load {
        path: path.to_owned(),
        source: oci_spec::OciSpecError::Io(e),
    };
    let f = std::fs::File::open(path).map_err(load)?;
    let mut text = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(load)?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(refuse(
            path.display().to_string(),
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    Ok(text)
}

/// Reads and checks `bundle/config.json`.
pub fn load(bundle: &Path) -> Result<Plan, ConfigError> {
    let path = bundle.join("config.json");
    let text = read_capped(&path)?;
    let raw: Value = serde_json::from_slice(&text).map_err(|source| ConfigError::Json {
        path: path.clone(),
        source,
    })?;
    check_fields(&raw, "", "")?;
    let spec: Spec = serde_json::from_value(raw).map_err(|e| ConfigError::Load {
        path: path.clone(),
        source: oci_spec::OciSpecError::SerDe(e),
    })?;
    plan(&spec, bundle)
}

/// Refuses any non-empty field outside [`HONOURED`]; `at` is the path
/// matched against it (`*` for an element), `shown` the one an error names
/// (`[3]` for an element).
fn check_fields(value: &Value, at: &str, shown: &str) -> Result<(), ConfigError> {
    if is_empty(value) {
        return Ok(());
    }
    if !at.is_empty() && HONOURED.iter().any(|h| matches(h, at)) {
        return Ok(());
    }
    let join = |base: &str, key: &str| {
        if base.is_empty() {
            key.to_owned()
        } else {
            format!("{base}.{key}")
        }
    };
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                check_fields(v, &join(at, k), &join(shown, k))?;
            }
            Ok(())
        }
        Value::Array(items) if HONOURED.iter().any(|h| h.starts_with(&format!("{at}.*"))) => {
            for (i, v) in items.iter().enumerate() {
                check_fields(v, &join(at, "*"), &format!("{shown}[{i}]"))?;
            }
            Ok(())
        }
        _ => Err(refuse(
            shown,
            "not supported by boxdesk (see `boxdesk oci features`)",
        )),
    }
}

/// Whether JSON path `at` lies under honoured path `h`.
fn matches(h: &str, at: &str) -> bool {
    let (mut hs, mut ats) = (h.split('.'), at.split('.'));
    loop {
        match (hs.next(), ats.next()) {
            (None, _) => return true,
            (Some(_), None) => return false,
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn plan(spec: &Spec, bundle: &Path) -> Result<Plan, ConfigError> {
    let root = spec
        .root()
        .as_ref()
        .ok_or_else(|| refuse("root", "required"))?;
    let root_path = bundle.join(root.path());
    if !root_path.is_dir() {
        return Err(refuse(
            "root.path",
            format!("{} is not a directory", root_path.display()),
        ));
    }
    let root_path = std::fs::canonicalize(&root_path)
        .map_err(|e| refuse("root.path", format!("{}: {e}", root_path.display())))?;
    if root_path == Path::new("/") {
        return Err(refuse(
            "root.path",
            "is the host's own root: a container never gets it",
        ));
    }
    plan_at(spec, root_path)
}

/// Checks a config's bytes as [`load`] does, its root taken as the temp
/// dir (no bundle): what the `oci_config` fuzz target drives.
pub fn check_bytes(bytes: &[u8]) -> Result<Plan, ConfigError> {
    let raw: Value = serde_json::from_slice(bytes).map_err(|source| ConfigError::Json {
        path: "config.json".into(),
        source,
    })?;
    check_fields(&raw, "", "")?;
    let spec: Spec = serde_json::from_value(raw).map_err(|e| ConfigError::Load {
        path: "config.json".into(),
        source: oci_spec::OciSpecError::SerDe(e),
    })?;
    plan_at(&spec, std::env::temp_dir())
}

/// The plan of `spec` over its resolved root.
fn plan_at(spec: &Spec, root_path: PathBuf) -> Result<Plan, ConfigError> {
    if !spec.version().starts_with("1.") {
        return Err(refuse(
            "ociVersion",
            format!("{:?}: boxdesk runs runtime-spec 1.x", spec.version()),
        ));
    }
    let root = spec
        .root()
        .as_ref()
        .ok_or_else(|| refuse("root", "required"))?;
    let process = spec
        .process()
        .as_ref()
        .ok_or_else(|| refuse("process", "required by create"))?;
    let proc_plan = process_plan(process)?;
    let linux = spec.linux().clone().unwrap_or_default();

    let mut layout = Layout {
        root: root_path,
        root_writable: !root.readonly().unwrap_or(false),
        hostname: spec.hostname().clone().filter(|h| !h.is_empty()),
        caps: proc_plan.caps.clone(),
        rlimits: rlimits(process)?,
        oom_score_adj: process.oom_score_adj(),
        ..Layout::default()
    };
    layout.mounts = mounts(spec.mounts().as_deref().unwrap_or_default())?;
    if !layout
        .mounts
        .iter()
        .any(|m| matches!(m, Mount::Proc { .. }))
    {
        return Err(refuse(
            "mounts",
            "a proc mount is required (the agent runs from /proc/self/fd)",
        ));
    }
    layout.masked = kernel_paths("linux.maskedPaths", linux.masked_paths())?;
    layout.readonly = kernel_paths("linux.readonlyPaths", linux.readonly_paths())?;
    if let Some(seccomp) = linux.seccomp() {
        layout.seccomp = crate::seccomp::compile(seccomp)?;
    }
    if let Some(p) = linux.rootfs_propagation().as_deref() {
        if !matches!(p, "" | "private" | "rprivate" | "slave" | "rslave") {
            return Err(refuse(
                "linux.rootfsPropagation",
                format!("{p:?}: a sandbox's mounts are private (slave of the host's)"),
            ));
        }
    }
    let (net_host, joins) = namespaces(&linux)?;
    layout.joins = joins;
    let mut sysctls: Vec<(String, String)> = Vec::new();
    for (key, value) in linux.sysctl().iter().flatten() {
        if let Err(why) = check_sysctl(key, net_host) {
            return Err(refuse(format!("linux.sysctl.{key}"), why));
        }
        sysctls.push((key.clone(), value.clone()));
    }
    sysctls.sort();
    let (mem_bytes, pids, (cpu_quota, cpu_shares)) = resources(&linux)?;
    layout.cpu_quota = cpu_quota;
    layout.cpu_shares = cpu_shares;

    let annotations: BTreeMap<String, String> = spec
        .annotations()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let backend = match annotations.get(BACKEND_ANNOTATION).map(String::as_str) {
        None | Some("auto") => BackendChoice::Auto,
        Some("namespace") => BackendChoice::Namespace,
        Some("vm") => BackendChoice::Vm,
        Some(other) => {
            return Err(refuse(
                format!("annotations.{BACKEND_ANNOTATION}"),
                format!("{other:?}: auto, namespace or vm"),
            ))
        }
    };
    Ok(Plan {
        layout,
        process: proc_plan,
        sysctls,
        net_host,
        mem_bytes,
        pids,
        backend,
        annotations,
    })
}

/// Reads an `exec --process` file (a runtime-spec `process` object).
pub fn load_process(path: &Path) -> Result<ProcessPlan, ConfigError> {
    let text = read_capped(path)?;
    let raw: Value = serde_json::from_slice(&text).map_err(|source| ConfigError::Json {
        path: path.to_owned(),
        source,
    })?;
    let wrapped = serde_json::json!({ "process": raw });
    check_fields(&wrapped, "", "")?;
    let p: Process = serde_json::from_value(raw).map_err(|e| ConfigError::Load {
        path: path.to_owned(),
        source: oci_spec::OciSpecError::SerDe(e),
    })?;
    process_plan(&p)
}

/// The IPC sysctls, which the container's own IPC namespace has.
const IPC_SYSCTLS: &[&str] = &[
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
];

/// Whether sysctl `key` belongs to a namespace of the container's own
/// (as runc allows): `net.*` with a network namespace, the IPC ones,
/// `fs.mqueue.*`. Its path under `/proc/sys` is the key with `/` for `.`.
pub fn check_sysctl(key: &str, net_host: bool) -> Result<(), String> {
    let well_formed = !key.is_empty()
        && key.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
        });
    if !well_formed {
        return Err("not a sysctl name".into());
    }
    if key.starts_with("net.") {
        if net_host {
            return Err(
                "the container shares the host's network: its net sysctls are the host's".into(),
            );
        }
        return Ok(());
    }
    if IPC_SYSCTLS.contains(&key) || key.starts_with("fs.mqueue.") {
        return Ok(());
    }
    Err(
        "only the sysctls of the container's own namespaces (net.*, IPC, fs.mqueue.*) can be set"
            .into(),
    )
}

/// Masked or read-only paths: beneath `/proc` or `/sys` only, the kernel's
/// views the sandbox shares with the host (an image's own path would be
/// looked up on the host by bubblewrap, so it is refused, not guessed).
fn kernel_paths(field: &str, paths: &Option<Vec<String>>) -> Result<Vec<PathBuf>, ConfigError> {
    let mut out = Vec::new();
    for (i, p) in paths.iter().flatten().enumerate() {
        let path = PathBuf::from(p);
        let plain = path.is_absolute()
            && path.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            });
        if !plain || !(path.starts_with("/proc/") || path.starts_with("/sys/")) {
            return Err(refuse(
                format!("{field}[{i}]"),
                format!("{p:?}: only paths beneath /proc or /sys are supported"),
            ));
        }
        out.push(path);
    }
    Ok(out)
}

/// The process part every process shares, init or exec'd.
pub fn process_plan(p: &Process) -> Result<ProcessPlan, ConfigError> {
    let user = p.user();
    if user.uid() != 0 || user.gid() != 0 {
        return Err(refuse(
            "process.user",
            format!(
                "uid {} gid {}: a boxdesk container runs as root of its own user namespace (uid 0, gid 0) only",
                user.uid(),
                user.gid()
            ),
        ));
    }
    if user.additional_gids().iter().flatten().any(|&g| g != 0) {
        return Err(refuse(
            "process.user.additionalGids",
            "only gid 0 exists in the sandbox's user namespace",
        ));
    }
    if let Some(umask) = user.umask() {
        if umask != 0o022 {
            return Err(refuse(
                "process.user.umask",
                format!("{umask:04o}: only 0022 is supported"),
            ));
        }
    }
    if p.user()
        .username()
        .as_deref()
        .is_some_and(|u| !u.is_empty())
    {
        return Err(refuse("process.user.username", "not supported on Linux"));
    }
    let args = p.args().clone().unwrap_or_default();
    if args.is_empty() || args[0].is_empty() {
        return Err(refuse("process.args", "required: at least the program"));
    }
    let env = p.env().clone().unwrap_or_default();
    if let Some(bad) = env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
        return Err(refuse("process.env", format!("{bad:?} is not K=V")));
    }
    let cwd = p.cwd().to_string_lossy().into_owned();
    if !cwd.starts_with('/') {
        return Err(refuse("process.cwd", format!("{cwd:?} is not absolute")));
    }
    let mut caps = Vec::new();
    if let Some(c) = p.capabilities() {
        let names = |set: &Option<oci_spec::runtime::Capabilities>| -> Vec<String> {
            let mut v: Vec<String> = set.iter().flatten().map(|c| format!("CAP_{c}")).collect();
            v.sort();
            v
        };
        caps = names(c.bounding());
        for (field, set) in [
            ("effective", c.effective()),
            ("permitted", c.permitted()),
            ("inheritable", c.inheritable()),
            ("ambient", c.ambient()),
        ] {
            if let Some(extra) = names(set).into_iter().find(|n| !caps.contains(n)) {
                return Err(refuse(
                    format!("process.capabilities.{field}"),
                    format!("{extra} is not in the bounding set"),
                ));
            }
        }
    }
    Ok(ProcessPlan {
        args,
        env,
        cwd,
        terminal: p.terminal().unwrap_or(false),
        console_size: p.console_size().map(|b| {
            (
                b.height().min(u16::MAX as u64) as u16,
                b.width().min(u16::MAX as u64) as u16,
            )
        }),
        caps,
        rlimits: rlimits(p)?
            .into_iter()
            .map(|r| (r.resource, r.soft, r.hard))
            .collect(),
        oom_score_adj: p.oom_score_adj(),
    })
}

fn rlimits(p: &Process) -> Result<Vec<Rlimit>, ConfigError> {
    let mut out = Vec::new();
    for r in p.rlimits().iter().flatten() {
        let resource = match r.typ() {
            PosixRlimitType::RlimitCpu => libc::RLIMIT_CPU,
            PosixRlimitType::RlimitFsize => libc::RLIMIT_FSIZE,
            PosixRlimitType::RlimitData => libc::RLIMIT_DATA,
            PosixRlimitType::RlimitStack => libc::RLIMIT_STACK,
            PosixRlimitType::RlimitCore => libc::RLIMIT_CORE,
            PosixRlimitType::RlimitRss => libc::RLIMIT_RSS,
            PosixRlimitType::RlimitNproc => libc::RLIMIT_NPROC,
            PosixRlimitType::RlimitNofile => libc::RLIMIT_NOFILE,
            PosixRlimitType::RlimitMemlock => libc::RLIMIT_MEMLOCK,
            PosixRlimitType::RlimitAs => libc::RLIMIT_AS,
            PosixRlimitType::RlimitLocks => libc::RLIMIT_LOCKS,
            PosixRlimitType::RlimitSigpending => libc::RLIMIT_SIGPENDING,
            PosixRlimitType::RlimitMsgqueue => libc::RLIMIT_MSGQUEUE,
            PosixRlimitType::RlimitNice => libc::RLIMIT_NICE,
            PosixRlimitType::RlimitRtprio => libc::RLIMIT_RTPRIO,
            PosixRlimitType::RlimitRttime => libc::RLIMIT_RTTIME,
        } as i32;
        if r.soft() > r.hard() {
            return Err(refuse(
                "process.rlimits",
                format!("{}: soft {} above hard {}", r.typ(), r.soft(), r.hard()),
            ));
        }
        // The agent raises its open-file limit to the hard one (its
        // processes inherit it) and sets its own task limit.
        if (resource == libc::RLIMIT_NOFILE as i32 || resource == libc::RLIMIT_NPROC as i32)
            && r.soft() != r.hard()
        {
            return Err(refuse(
                "process.rlimits",
                format!("{}: soft {} below hard {}: boxdesk supports only equal soft and hard limits here", r.typ(), r.soft(), r.hard()),
            ));
        }
        out.push(Rlimit {
            resource,
            soft: r.soft(),
            hard: r.hard(),
        });
    }
    Ok(out)
}

/// `RLIMIT_NOFILE` for `libc::RLIMIT_NOFILE`, as configs name them.
pub fn rlimit_name(resource: i32) -> &'static str {
    const NAMES: &[(i32, &str)] = &[
        (libc::RLIMIT_CPU as i32, "RLIMIT_CPU"),
        (libc::RLIMIT_FSIZE as i32, "RLIMIT_FSIZE"),
        (libc::RLIMIT_DATA as i32, "RLIMIT_DATA"),
        (libc::RLIMIT_STACK as i32, "RLIMIT_STACK"),
        (libc::RLIMIT_CORE as i32, "RLIMIT_CORE"),
        (libc::RLIMIT_RSS as i32, "RLIMIT_RSS"),
        (libc::RLIMIT_NPROC as i32, "RLIMIT_NPROC"),
        (libc::RLIMIT_NOFILE as i32, "RLIMIT_NOFILE"),
        (libc::RLIMIT_MEMLOCK as i32, "RLIMIT_MEMLOCK"),
        (libc::RLIMIT_AS as i32, "RLIMIT_AS"),
        (libc::RLIMIT_LOCKS as i32, "RLIMIT_LOCKS"),
        (libc::RLIMIT_SIGPENDING as i32, "RLIMIT_SIGPENDING"),
        (libc::RLIMIT_MSGQUEUE as i32, "RLIMIT_MSGQUEUE"),
        (libc::RLIMIT_NICE as i32, "RLIMIT_NICE"),
        (libc::RLIMIT_RTPRIO as i32, "RLIMIT_RTPRIO"),
        (libc::RLIMIT_RTTIME as i32, "RLIMIT_RTTIME"),
    ];
    NAMES
        .iter()
        .find(|(r, _)| *r == resource)
        .map_or("RLIMIT_?", |(_, n)| n)
}

const MOUNT_OPTIONS: &[&str] = &[
    "bind",
    "rbind",
    "ro",
    "rw",
    "nosuid",
    "nodev",
    "noexec",
    "suid",
    "dev",
    "exec",
    "private",
    "rprivate",
    "slave",
    "rslave",
    "strictatime",
    "relatime",
    "norelatime",
    "noatime",
    "nodiratime",
    "newinstance",
    "async",
    "sync",
];

fn mounts(list: &[oci_spec::runtime::Mount]) -> Result<Vec<Mount>, ConfigError> {
    let mut out = Vec::with_capacity(list.len());
    let mut sysfs: Vec<PathBuf> = Vec::new();
    let mut dev: Option<PathBuf> = None;
    let mut binds: Vec<PathBuf> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let field = |k: &str| format!("mounts[{i}].{k}");
        let dest = m.destination().clone();
        if !dest.is_absolute()
            || dest
                .components()
                .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(refuse(
                field("destination"),
                format!("{} must be absolute, without ..", dest.display()),
            ));
        }
        let opts: Vec<&str> = m.options().iter().flatten().map(String::as_str).collect();
        let mut size = None;
        let mut mode = None;
        for o in &opts {
            if let Some(v) = o.strip_prefix("size=") {
                size = Some(
                    parse_size(v)
                        .ok_or_else(|| refuse(field("options"), format!("{o:?}: bad size")))?,
                );
            } else if let Some(v) = o.strip_prefix("mode=") {
                mode = Some(
                    u32::from_str_radix(v, 8)
                        .map_err(|_| refuse(field("options"), format!("{o:?}: bad mode")))?,
                );
            } else if o.starts_with("ptmxmode=") || o.starts_with("gid=") || o.starts_with("uid=") {
                // devpts and tmpfs ownership: bwrap's /dev/pts is its own.
            } else if !MOUNT_OPTIONS.contains(o) {
                return Err(refuse(field("options"), format!("{o:?} is not supported")));
            }
        }
        // bubblewrap resolves a destination as a path, and a bind's source
        // is a host directory the container may fill with symlinks: nothing
        // is mounted beneath one.
        if let Some(outer) = binds.iter().find(|b| dest.starts_with(b) && dest != **b) {
            return Err(refuse(
                field("destination"),
                format!(
                    "{} is beneath the bind mount at {}: not supported",
                    dest.display(),
                    outer.display()
                ),
            ));
        }
        let readonly = opts.contains(&"ro");
        let bind = opts.iter().any(|o| *o == "bind" || *o == "rbind");
        let typ = m.typ().as_deref().unwrap_or(if bind { "bind" } else { "" });
        let mount =
            match typ {
                _ if bind || typ == "bind" => {
                    let source = m
                        .source()
                        .clone()
                        .ok_or_else(|| refuse(field("source"), "a bind mount needs a source"))?;
                    if !source.is_absolute() {
                        return Err(refuse(
                            field("source"),
                            format!("{} is not absolute", source.display()),
                        ));
                    }
                    binds.push(dest.clone());
                    Mount::Bind {
                        source,
                        dest,
                        writable: !readonly,
                    }
                }
                "proc" => Mount::Proc { dest },
                "tmpfs" if dest == Path::new("/dev") => {
                    dev = Some(dest.clone());
                    Mount::Dev { dest }
                }
                "tmpfs" => Mount::Tmpfs {
                    dest,
                    size,
                    mode,
                    readonly,
                },
                "devpts" if dev.as_ref().is_some_and(|d| dest == d.join("pts")) => continue,
                "devpts" => return Err(refuse(
                    field("type"),
                    "devpts only at /dev/pts, after a /dev tmpfs (the sandbox's /dev has its own)",
                )),
                "mqueue" => Mount::Mqueue { dest },
                "sysfs" => {
                    if !readonly {
                        return Err(refuse(
                            field("options"),
                            "sysfs is the host's, read-only: add \"ro\"",
                        ));
                    }
                    sysfs.push(dest.clone());
                    Mount::Sysfs { dest }
                }
                "cgroup" | "cgroup2" if sysfs.iter().any(|s| dest.starts_with(s)) && readonly => {
                    continue
                }
                "cgroup" | "cgroup2" => return Err(refuse(
                    field("type"),
                    "cgroup only read-only beneath a sysfs mount (it is the host's /sys/fs/cgroup)",
                )),
                other => {
                    return Err(refuse(
                        field("type"),
                        format!("{other:?} mounts are not supported"),
                    ))
                }
            };
        out.push(mount);
    }
    Ok(out)
}

/// `65536k`, `64m`, `1g` or bytes.
fn parse_size(v: &str) -> Option<u64> {
    let (num, mult) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&v[..v.len() - 1], 1 << 20),
        b'g' | b'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// Checks the namespaces; true when the container shares the host's
/// network (none asked for).
fn namespaces(linux: &oci_spec::runtime::Linux) -> Result<(bool, Vec<Join>), ConfigError> {
    let list = linux.namespaces().clone().unwrap_or_default();
    let mut net_host = true;
    let mut joins = Vec::new();
    for (i, ns) in list.iter().enumerate() {
        if let Some(path) = ns.path() {
            let join = match ns.typ() {
                LinuxNamespaceType::Network => Join::Net(path.clone()),
                LinuxNamespaceType::Ipc => Join::Ipc(path.clone()),
                LinuxNamespaceType::Uts => Join::Uts(path.clone()),
                other => {
                    return Err(refuse(
                        format!("linux.namespaces[{i}].path"),
                        format!("joining an existing {other} namespace is not supported (network, ipc and uts are)"),
                    ))
                }
            };
            if !path.is_absolute() {
                return Err(refuse(
                    format!("linux.namespaces[{i}].path"),
                    "not absolute",
                ));
            }
            joins.push(join);
        }
        match ns.typ() {
            LinuxNamespaceType::Network => net_host = false,
            LinuxNamespaceType::Time => {
                return Err(refuse(
                    format!("linux.namespaces[{i}]"),
                    "time namespaces are not supported",
                ))
            }
            _ => {}
        }
    }
    for want in [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
    ] {
        if !list.iter().any(|n| n.typ() == want) {
            return Err(refuse(
                "linux.namespaces",
                format!("no {want} namespace: a boxdesk sandbox always has its own, it cannot share the host's"),
            ));
        }
    }
    Ok((net_host, joins))
}

/// Memory bytes, pids, (CPU quota in CPUs, CPU shares).
type Limits = (Option<u64>, Option<u64>, (Option<f64>, Option<u64>));

fn resources(linux: &oci_spec::runtime::Linux) -> Result<Limits, ConfigError> {
    let Some(r) = linux.resources() else {
        return Ok((None, None, (None, None)));
    };
    // The device rules: the sandbox's /dev holds only the standard nodes
    // (null, zero, full, random, urandom, tty, its own pts) and no node
    // can be made in it (seccomp refuses mknod of a device), so no rule
    // can reach further than that; an engine's usual list (deny all, then
    // allow those) describes exactly it. Nothing to enforce, nothing lost.
    for (i, d) in r.devices().iter().flatten().enumerate() {
        if !d
            .access()
            .as_deref()
            .unwrap_or("rwm")
            .chars()
            .all(|c| "rwm".contains(c))
        {
            return Err(refuse(
                format!("linux.resources.devices[{i}].access"),
                "only r, w and m",
            ));
        }
    }
    let mut mem = None;
    if let Some(m) = r.memory() {
        if let Some(limit) = m.limit().filter(|&l| l > 0) {
            mem = Some(limit as u64);
        }
        // Memory plus swap: boxdesk limits memory only, so a total below
        // the memory limit cannot be held to.
        if let Some(swap) = m.swap().filter(|&s| s < -1) {
            return Err(refuse(
                "linux.resources.memory.swap",
                format!("{swap} is not a size"),
            ));
        }
        if let (Some(swap), Some(limit)) = (m.swap(), mem) {
            if swap != -1 && (swap as u64) < limit {
                return Err(refuse(
                    "linux.resources.memory.swap",
                    format!(
                        "{swap} is below the memory limit {limit}: boxdesk limits memory, not swap"
                    ),
                ));
            }
        }
    }
    let pids = r
        .pids()
        .as_ref()
        .map(|p| p.limit())
        .filter(|&l| l > 0)
        .map(|l| l as u64);
    let mut cpus = (None, None);
    if let Some(c) = r.cpu() {
        // The kernel's default period is 100 ms.
        if let Some(q) = c.quota().filter(|&q| q > 0) {
            let p = c.period().filter(|&p| p > 0).unwrap_or(100_000);
            cpus.0 = Some(q as f64 / p as f64);
        }
        // 0 means unset; 1024 is the kernel's default weight.
        cpus.1 = c.shares().filter(|&s| s != 0 && s != 1024);
    }
    Ok((mem, pids, cpus))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod replay {
    /// The `oci_config` fuzz target's saved inputs, through the same path.
    #[test]
    fn the_fuzz_targets_saved_configs_are_errors_or_plans_never_panics() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/oci_config");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let _ = super::check_bytes(&std::fs::read(e.path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no saved inputs in {}", dir.display());
    }
}
