//! The methods of COWORK.md: typed parameters, what each one does, and its
//! result. Every failure is an `Err(message)` that becomes `success:
//! false`; nothing a client sends can panic here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use boxdesk_channel::{Exec, SecretBytes};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use super::allowlist::Allowlist;
use super::logged;
use super::mounts;
use super::process::{self, Ended, ProcError, Status};
use super::profile::{Profile, Sdk};
use super::server::Server;
use super::sessions::PruneOptions;

/// What a method answers: a result or an error message.
pub type Outcome = Result<Value, String>;

fn params<T: DeserializeOwned>(method: &str, p: Value) -> Result<T, String> {
    serde_json::from_value(p).map_err(|e| format!("invalid params for {method}: {e}"))
}

/// A string that may be a secret (a token, stdin): wiped when dropped and
/// never shown by `Debug`.
#[derive(Deserialize)]
#[serde(transparent)]
struct Secret(Zeroizing<String>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A process id: the client sends strings, numbers are accepted too.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Id {
    S(String),
    N(serde_json::Number),
}

impl Id {
    fn key(&self) -> String {
        match self {
            Id::S(s) => s.clone(),
            Id::N(n) => n.to_string(),
        }
    }
    fn json(&self) -> Value {
        match self {
            Id::S(s) => json!(s),
            Id::N(n) => Value::Number(n.clone()),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigureParams {
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
    cpu_count: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StartParams {
    bundle_path: Option<String>,
    #[serde(rename = "memoryGB")]
    memory_gb: Option<f64>,
    cpu_count: Option<u64>,
    #[serde(rename = "apiProbeURL")]
    api_probe_url: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MountSpec {
    path: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpawnParams {
    id: Id,
    name: String,
    command: String,
    #[serde(default)]
    args: Vec<String>,
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Mount name → spec, in the client's order (the first visible one is
    /// the default cwd).
    #[serde(default)]
    additional_mounts: Map<String, Value>,
    allowed_domains: Option<Vec<String>>,
    #[serde(default)]
    one_shot: bool,
    #[serde(default)]
    mount_skeleton_home: bool,
    #[serde(default)]
    is_resume: bool,
    oauth_token: Option<Secret>,
}

#[derive(Debug, Deserialize)]
struct IdParams {
    id: Id,
}

#[derive(Debug, Deserialize)]
struct KillParams {
    id: Id,
    #[serde(default)]
    signal: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct StdinParams {
    id: Id,
    data: Secret,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MountPathParams {
    process_id: Id,
    subpath: String,
    mount_name: String,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadFileParams {
    process_name: String,
    file_path: String,
}

#[derive(Debug, Deserialize)]
struct NamesParams {
    names: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PruneParams {
    only_if_free_bytes_below: Option<u64>,
    #[serde(default)]
    include_session_tmp: bool,
    session_tmp_older_than_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SdkParams {
    sdk_subpath: String,
    version: String,
}

#[derive(Debug, Deserialize)]
struct TokenParams {
    token: Secret,
}

#[derive(Debug, Deserialize)]
struct DebugParams {
    enabled: bool,
}

/// Runs `method` for profile `p`.
pub async fn call(server: &Arc<Server>, p: &Arc<Profile>, method: &str, raw: Value) -> Outcome {
    match method {
        "configure" => {
            let c: ConfigureParams = params(method, raw)?;
            let mut s = p.settings();
            s.memory_mb = c.memory_mb.or(s.memory_mb);
            s.cpu_count = c.cpu_count.or(s.cpu_count);
            Ok(json!({}))
        }
        "createVM" => {
            let c: StartParams = params(method, raw)?;
            if c.bundle_path.is_some() {
                p.settings().bundle_path = c.bundle_path;
            }
            Ok(json!({}))
        }
        "startVM" => {
            let c: StartParams = params(method, raw)?;
            {
                let mut s = p.settings();
                if c.bundle_path.is_some() {
                    s.bundle_path = c.bundle_path;
                }
                if let Some(gb) = c.memory_gb {
                    if !gb.is_finite() || gb <= 0.0 {
                        return Err(format!(
                            "startVM: memoryGB must be a positive number, not {gb}"
                        ));
                    }
                    s.memory_mb = Some((gb * 1024.0) as u64);
                }
                s.cpu_count = c.cpu_count.or(s.cpu_count);
            }
            p.start(c.api_probe_url).await.map(|()| json!({}))
        }
        "stopVM" => {
            p.stop().await;
            Ok(json!({}))
        }
        "isRunning" => Ok(json!({"running": p.is_running()})),
        "isGuestConnected" => Ok(json!({"connected": p.is_connected()})),
        "spawn" => spawn(server, p, params(method, raw)?).await,
        "kill" => {
            let k: KillParams = params(method, raw)?;
            let sig = match &k.signal {
                None | Some(Value::Null) => libc::SIGTERM,
                Some(v) => process::parse_signal(v).ok_or_else(|| format!("unknown signal {v}"))?,
            };
            match p.procs.signal(&k.id.key(), sig) {
                // Killing a process that already ended is not an error.
                Ok(()) | Err(ProcError::Exited(_)) => Ok(json!({})),
                Err(e) => Err(e.to_string()),
            }
        }
        "writeStdin" => {
            let w: StdinParams = params(method, raw)?;
            if w.data.is_empty() {
                // An empty Stdin frame would be EOF; empty data is nothing.
                return Ok(json!({}));
            }
            p.procs
                .write_stdin(&w.id.key(), w.data.0.as_bytes())
                .map(|()| json!({}))
                .map_err(|e| e.to_string())
        }
        "isProcessRunning" => {
            let i: IdParams = params(method, raw)?;
            Ok(match p.procs.status(&i.id.key()) {
                Status::Unknown => json!({"running": false}),
                Status::Running => json!({"running": true}),
                Status::Exited(Ended::Code(c)) => json!({"running": false, "exitCode": c}),
                Status::Exited(Ended::Signal(s)) => {
                    json!({"running": false, "exitCode": null, "signal": process::signal_name(s)})
                }
            })
        }
        "sendGuestResponse" => {
            // No guest in a namespace sandbox sends requests, so no reply
            // can be pending.
            let i: IdParams = params(method, raw)?;
            Err(format!("no pending guest request {}", i.id.key()))
        }
        "setDebugLogging" => {
            let d: DebugParams = params(method, raw)?;
            server.set_debug(d.enabled);
            Ok(json!({}))
        }
        "mountPath" => {
            let m: MountPathParams = params(method, raw)?;
            let (server, p) = (server.clone(), p.clone());
            blocking(move || mount_path(&server, &p, m)).await
        }
        "readFile" => read_file(p, params(method, raw)?).await,
        "getSessionsDiskInfo" => {
            let s = p.sessions.clone();
            let info = blocking(move || s.disk_info().map_err(|e| e.to_string())).await?;
            let sessions: Vec<Value> = info
                .sessions
                .iter()
                .map(|u| json!({"name": u.name, "bytes": u.bytes}))
                .collect();
            Ok(
                json!({"totalBytes": info.total_bytes, "freeBytes": info.free_bytes, "sessions": sessions}),
            )
        }
        "deleteSessionDirs" => {
            let n: NamesParams = params(method, raw)?;
            let (s, procs) = (p.sessions.clone(), p.procs.clone());
            let staged = p.layout.staged_sessions();
            let r = blocking(move || {
                // A session's folders are mounted on its staged view; take
                // them off (never through them) before its dir goes.
                for name in n.names.iter().filter(|n| !procs.session_busy(n)) {
                    mounts::detach_all(&staged, Some(name));
                }
                Ok(s.delete(&n.names, &|name| procs.session_busy(name)))
            })
            .await?;
            Ok(json!({"deleted": r.deleted, "errors": r.errors}))
        }
        "pruneSessionCaches" => {
            let q: PruneParams = params(method, raw)?;
            let opts = PruneOptions {
                only_if_free_bytes_below: q.only_if_free_bytes_below,
                include_session_tmp: q.include_session_tmp,
                session_tmp_older_than: std::time::Duration::from_secs(
                    q.session_tmp_older_than_seconds.unwrap_or(86_400),
                ),
            };
            let (s, procs) = (p.sessions.clone(), p.procs.clone());
            let r = blocking(move || Ok(s.prune(&opts, &|name| procs.session_busy(name)))).await?;
            Ok(json!({
                "prunedSessions": r.pruned_sessions, "skippedSessions": r.skipped_sessions,
                "freedBytes": r.freed_bytes, "errors": r.errors,
            }))
        }
        "installSdk" => {
            let q: SdkParams = params(method, raw)?;
            let (server, p) = (server.clone(), p.clone());
            blocking(move || install_sdk(&server, &p, q)).await
        }
        "addApprovedOauthToken" => {
            let t: TokenParams = params(method, raw)?;
            p.settings().token = Some(t.token.0);
            Ok(json!({}))
        }
        "getNetworkDrives" => Ok(json!({"drives": []})),
        other => Err(format!("Unknown method: {other}")),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("internal error: {e}"))?
}

fn read_only(mode: Option<&str>) -> Result<bool, String> {
    match mode {
        None | Some("ro") => Ok(true),
        Some("rw") => Ok(false),
        Some(m) => Err(format!("mode must be \"ro\" or \"rw\", not {m:?}")),
    }
}

/// Attaches host folder `subpath` (relative to `/`, under home) at
/// `/sessions/<name>/mnt/<mount>`. A folder holding boxdesk's own runtime
/// dir (agent sockets, staged mounts) or inside its data is refused: its
/// sockets would let a sandbox reach another, and its mounts would repeat
/// themselves in every copy.
fn attach(
    server: &Server,
    p: &Profile,
    name: &str,
    mount: &str,
    subpath: &str,
    ro: bool,
) -> Result<(), String> {
    p.can_mount()?;
    mounts::check_name(mount).map_err(|e| e.to_string())?;
    let src = mounts::resolve_in_home(server.home(), subpath).map_err(|e| e.to_string())?;
    let real = mounts::real_path(&src).map_err(|e| format!("cannot inspect {subpath:?}: {e}"))?;
    for own in [server.runtime_root(), server.data_root()] {
        if own.starts_with(&real) || real.starts_with(own) {
            return Err(format!(
                "{} holds or is inside boxdesk's own {}: not mountable",
                real.display(),
                own.display()
            ));
        }
    }
    let shown = Path::new("/sessions").join(name).join("mnt").join(mount);
    mounts::attach(
        &src,
        &p.layout.staged_sessions(),
        &[name, "mnt", mount],
        ro,
        &shown,
    )
    .map_err(|e| e.to_string())
}

/// The file-system half of a spawn, run off the async worker (a mount
/// source on a hung network share must not stall the server): the session
/// dir, its mounts and its home. Returns the failed mounts and `HOME`.
fn prepare_session(
    server: &Server,
    p: &Profile,
    s: &SpawnParams,
) -> Result<(Vec<String>, String), String> {
    p.sessions.create(&s.name).map_err(|e| e.to_string())?;
    mounts::dir_beneath(&p.layout.sessions, &[&s.name, "mnt"]).map_err(|e| e.to_string())?;
    let mut failed = Vec::new();
    for (mount, spec) in &s.additional_mounts {
        let outcome = serde_json::from_value::<MountSpec>(spec.clone())
            .map_err(|e| format!("bad mount spec: {e}"))
            .and_then(|spec| {
                read_only(spec.mode.as_deref())
                    .and_then(|ro| attach(server, p, &s.name, mount, &spec.path, ro))
            });
        if let Err(e) = outcome {
            let (id, shown, e) = (logged(s.id.key()), logged(mount), logged(e));
            tracing::warn!("spawn {id}: mount {shown} failed: {e}");
            failed.push(mount.clone());
        }
    }
    let home = if s.mount_skeleton_home {
        mounts::dir_beneath(&p.layout.sessions, &[&s.name, "home"]).map_err(|e| e.to_string())?;
        format!("/sessions/{}/home", s.name)
    } else {
        server.home().display().to_string()
    };
    Ok((failed, home))
}

async fn spawn(server: &Arc<Server>, p: &Arc<Profile>, s: SpawnParams) -> Outcome {
    mounts::check_name(&s.name).map_err(|e| format!("bad session name: {e}"))?;
    if s.command.is_empty() {
        return Err("command is empty".into());
    }
    let allowed = match s.allowed_domains.as_deref().map(Allowlist::new) {
        Some(Ok(a)) if !a.key().is_empty() => Some(a),
        Some(Err(e)) => {
            // Refused like a program that cannot start: an error event the
            // app shows, and an exit, so the id never stays "running".
            let key = s.id.key();
            let (generation, _) = p
                .procs
                .register(&key, &s.name, s.one_shot)
                .map_err(|e| e.to_string())?;
            let why = format!("allowedDomains: {e}");
            tracing::info!("spawn {} refused: {}", logged(&key), logged(&why));
            process::refuse(&p.events, &p.procs, &key, &s.id.json(), generation, &why);
            return Ok(json!({}));
        }
        _ => None,
    };
    let sandbox = p.sandbox_for(allowed).await?;
    let (server2, p2) = (server.clone(), p.clone());
    let (s, (failed, home)) = blocking(move || {
        let r = prepare_session(&server2, &p2, &s);
        r.map(|r| (s, r))
    })
    .await?;
    let (sdk, approved) = {
        let st = p.settings();
        (st.sdk.clone(), st.token.clone())
    };
    let session_dir = format!("/sessions/{}", s.name);
    let mut env: Vec<(Vec<u8>, SecretBytes)> = Vec::with_capacity(s.env.len() + 12);
    let mut set =
        |k: &str, v: &str| env.push((k.as_bytes().to_vec(), SecretBytes::copy_from(v.as_bytes())));
    let path = match &sdk {
        Some(sdk) => format!(
            "{}:{}",
            sdk.dir.display(),
            boxdesk_sandbox::namespace::PATH_INSIDE
        ),
        None => boxdesk_sandbox::namespace::PATH_INSIDE.to_owned(),
    };
    set("PATH", &path);
    set("HOME", &home);
    set("USER", &s.name);
    set("LOGNAME", &s.name);
    set("TERM", "xterm-256color");
    if let Ok(lang) = std::env::var("LANG") {
        set("LANG", &lang);
    }
    for (k, v) in sandbox.proxy_env() {
        set(k, &v);
    }
    for (k, v) in &s.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(format!("bad environment variable name {k:?}"));
        }
        set(k, v);
    }
    if !s.env.contains_key("CLAUDE_CODE_OAUTH_TOKEN") {
        if let Some(t) = s.oauth_token.as_ref().map(|t| &t.0).or(approved.as_ref()) {
            set("CLAUDE_CODE_OAUTH_TOKEN", t);
        }
    }
    let command = match &sdk {
        Some(sdk)
            if Path::new(&s.command)
                .file_name()
                .is_some_and(|n| n == "claude") =>
        {
            sdk.claude.display().to_string()
        }
        _ => s.command.clone(),
    };
    let cwd = match &s.cwd {
        Some(c) if !c.is_empty() => c.clone(),
        _ => default_cwd(&session_dir, &s.additional_mounts, &failed),
    };
    if s.is_resume {
        let (id, name) = (logged(s.id.key()), logged(&s.name));
        tracing::info!("spawn {id} resumes session {name}");
    }
    let exec = Exec {
        command: command.into_bytes(),
        args: s.args.into_iter().map(String::into_bytes).collect(),
        cwd: cwd.into_bytes(),
        env,
        timeout_ms: 0,
    };
    let key = s.id.key();
    let (generation, inbox) = p
        .procs
        .register(&key, &s.name, s.one_shot)
        .map_err(|e| e.to_string())?;
    let run = process::Run {
        events: p.events.clone(),
        procs: p.procs.clone(),
        sandbox,
        key,
        id: s.id.json(),
        generation,
        exec,
    };
    tokio::spawn(process::run(run, inbox));
    Ok(if failed.is_empty() {
        json!({})
    } else {
        json!({"failedMounts": failed})
    })
}

/// The first mount that is not hidden, not `uploads` and not failed,
/// else the session dir (what the client expects as a session's working
/// dir).
fn default_cwd(session_dir: &str, mounts: &Map<String, Value>, failed: &[String]) -> String {
    match mounts
        .keys()
        .find(|m| !m.starts_with('.') && *m != "uploads" && !failed.contains(m))
    {
        Some(m) => format!("{session_dir}/mnt/{m}"),
        None => session_dir.to_owned(),
    }
}

fn mount_path(server: &Server, p: &Profile, m: MountPathParams) -> Outcome {
    let name = p
        .procs
        .name_of(&m.process_id.key())
        .ok_or_else(|| format!("no process with id {}", m.process_id.key()))?;
    let ro = read_only(m.mode.as_deref())?;
    attach(server, p, &name, &m.mount_name, &m.subpath, ro)?;
    Ok(json!({"guestPath": format!("/sessions/{name}/mnt/{}", m.mount_name)}))
}

/// Largest file `readFile` returns.
const READ_MAX: u64 = 8 << 20;

async fn read_file(p: &Arc<Profile>, r: ReadFileParams) -> Outcome {
    mounts::check_name(&r.process_name).map_err(|e| e.to_string())?;
    let comps = mounts::components(&r.file_path).map_err(|e| e.to_string())?;
    let inside: PathBuf = std::iter::once("/").chain(comps.iter().copied()).collect();
    let root = Path::new("/sessions").join(&r.process_name);
    if !inside.starts_with(&root) || inside == root {
        return Err(format!("{:?} is not under {}", r.file_path, root.display()));
    }
    let sandbox = p.sandbox_for(None).await?;
    let bytes = super::files::get_file(&sandbox, &inside, READ_MAX).await?;
    Ok(json!({"content": String::from_utf8_lossy(&bytes)}))
}

fn install_sdk(server: &Server, p: &Profile, s: SdkParams) -> Outcome {
    mounts::check_name(&s.version).map_err(|e| e.to_string())?;
    let comps = mounts::components(&s.sdk_subpath).map_err(|e| e.to_string())?;
    let dir: PathBuf = std::iter::once("/")
        .chain(comps.iter().copied())
        .collect::<PathBuf>()
        .join(&s.version);
    let claude = dir.join("claude");
    let meta =
        std::fs::metadata(&claude).map_err(|e| format!("no SDK at {}: {e}", claude.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("{} is not an executable file", claude.display()));
    }
    let home = server.home();
    if let Ok(rel) = dir.strip_prefix(home) {
        // Under home: bind it read-only at the same path in the mirror.
        p.can_mount()?;
        let src =
            mounts::resolve_in_home(home, &dir.to_string_lossy()).map_err(|e| e.to_string())?;
        let names: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        mounts::attach(&src, &p.layout.staged_home(), &names, true, &dir)
            .map_err(|e| e.to_string())?;
    } else if !visible_in_sandbox(&dir) {
        return Err(format!(
            "the SDK dir {} must be under the home directory {}",
            dir.display(),
            home.display()
        ));
    }
    p.settings().sdk = Some(Sdk { dir, claude });
    Ok(json!({}))
}

/// Whether `dir` is inside `/usr`, which every sandbox shares read-only.
fn visible_in_sandbox(dir: &Path) -> bool {
    dir.starts_with("/usr")
}

/// The debug view of a request: values that may hold secrets replaced.
pub fn redacted(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let hidden = matches!(
                        k.as_str(),
                        "token" | "oauthToken" | "env" | "data" | "resultJson"
                    );
                    (
                        k.clone(),
                        if hidden {
                            json!("<redacted>")
                        } else {
                            redacted(v)
                        },
                    )
                })
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redacted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_logs_never_show_tokens_env_or_stdin() {
        let v = json!({"id": "1", "oauthToken": "sekrit", "env": {"A": "sekrit"}, "nested": [{"token": "sekrit"}], "data": "sekrit"});
        let shown = redacted(&v).to_string();
        assert!(!shown.contains("sekrit"), "{shown}");
        assert!(shown.contains("\"id\":\"1\""));
    }

    #[test]
    fn the_default_cwd_is_the_first_visible_mount() {
        let mut m = Map::new();
        m.insert(".skills".to_owned(), json!({"path": "x"}));
        m.insert("uploads".to_owned(), json!({"path": "x"}));
        assert_eq!(default_cwd("/sessions/a", &m, &[]), "/sessions/a");
        m.insert("proj".to_owned(), json!({"path": "x"}));
        m.insert("docs".to_owned(), json!({"path": "x"}));
        assert_eq!(
            default_cwd("/sessions/a", &m, &[]),
            "/sessions/a/mnt/proj",
            "the client's order, not sorted"
        );
    }

    #[test]
    fn spawn_params_with_wrong_types_are_refused_with_the_method_name() {
        let e = params::<SpawnParams>("spawn", json!({"id": "1", "name": "s", "command": 5}))
            .unwrap_err();
        assert!(e.starts_with("invalid params for spawn"), "{e}");
        let ok: SpawnParams = params("spawn", json!({"id": 7, "name": "s", "command": "true", "additionalMounts": {"p": {"path": "home/u/p", "mode": "rw"}}})).unwrap();
        assert_eq!(ok.id.key(), "7");
        assert_eq!(ok.additional_mounts["p"]["mode"], "rw");
    }
}
