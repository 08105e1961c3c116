//! `spawn`: one process in the profile's sandbox for its `allowedDomains`
//! (the host-network one without), in its session's directory with the
//! session's mounts, its environment built here (PATH, HOME, the SDK, the
//! proxy, the client's variables, the approved token). Owns that set-up
//! only; the running process is [`crate::process`]'s, which reports its
//! output and end as events. A spawn refused for its allowlist still ends
//! with `error` and `exit` events, never an id stuck "running".

use std::path::Path;
use std::sync::Arc;

use boxdesk_channel::{Exec, SecretBytes};
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use super::folders::{attach, check_name, read_only};
use super::params::{MountSpec, SpawnParams};
use super::{blocking, MethodError, Outcome};
use crate::allowlist::Allowlist;
use crate::logged;
use crate::mounts;
use crate::process;
use crate::profile::{Profile, Sdk};
use crate::server::Server;

/// The file-system half of a spawn, run off the async worker (a mount
/// source on a hung network share must not stall the server): the session
/// dir, its mounts and its home. Returns the failed mounts and `HOME`.
fn prepare_session(
    server: &Server,
    p: &Profile,
    s: &SpawnParams,
) -> Result<(Vec<String>, String), MethodError> {
    p.sessions.create(&s.name)?;
    mounts::dir_beneath(&p.layout.sessions, &[&s.name, "mnt"])?;
    let mut failed = Vec::new();
    for (mount, spec) in &s.additional_mounts {
        let outcome = serde_json::from_value::<MountSpec>(spec.clone())
            .map_err(|e| MethodError::BadMountSpec(e.to_string()))
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
        mounts::dir_beneath(&p.layout.sessions, &[&s.name, "home"])?;
        format!("/sessions/{}/home", s.name)
    } else {
        server.home().display().to_string()
    };
    Ok((failed, home))
}

/// `spawn`: the session dir and its mounts, then the process, run by a
/// task of its own; its output and exit arrive as events.
pub(super) async fn spawn(server: &Arc<Server>, p: &Arc<Profile>, s: SpawnParams) -> Outcome {
    check_name("session name", &s.name)?;
    if s.command.is_empty() {
        return Err(MethodError::EmptyCommand);
    }
    let allowed = match s.allowed_domains.as_deref().map(Allowlist::new) {
        Some(Ok(a)) if !a.key().is_empty() => Some(a),
        Some(Err(e)) => {
            // Refused like a program that cannot start: an error event the
            // app shows, and an exit, so the id never stays "running".
            let key = s.id.key();
            let (generation, _) = p.procs.register(&key, &s.name, s.one_shot)?;
            let why = format!("allowedDomains: {e}");
            tracing::info!("spawn {} refused: {}", logged(&key), logged(&why));
            process::refuse(&p.events, &p.procs, &key, &s.id.json(), generation, &why);
            return Ok(json!({}));
        }
        _ => None,
    };
    let sandbox = p.sandbox_for(allowed).await.map_err(MethodError::Sandbox)?;
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
    let env = environment(
        &s,
        &home,
        sdk.as_ref(),
        approved.as_ref(),
        sandbox.proxy_env(),
    )?;
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
        // Sessions of one profile share a sandbox: each spawn gets a
        // Landlock domain of its own, so none reads another's environment
        // (its OAuth token) or signals its processes.
        flags: Exec::ISOLATE,
    };
    let key = s.id.key();
    let (generation, inbox) = p.procs.register(&key, &s.name, s.one_shot)?;
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

/// The environment of a spawned process, in the order the agent sets it:
/// what every session has (PATH with the SDK first, HOME, USER, TERM,
/// LANG), the sandbox's proxy, the client's variables, then the OAuth
/// token unless the client set one.
fn environment(
    s: &SpawnParams,
    home: &str,
    sdk: Option<&Sdk>,
    approved: Option<&Zeroizing<String>>,
    proxy: Vec<(&'static str, String)>,
) -> Result<Vec<(Vec<u8>, SecretBytes)>, MethodError> {
    let mut env: Vec<(Vec<u8>, SecretBytes)> = Vec::with_capacity(s.env.len() + 12);
    let mut set =
        |k: &str, v: &str| env.push((k.as_bytes().to_vec(), SecretBytes::copy_from(v.as_bytes())));
    let path = match sdk {
        Some(sdk) => format!(
            "{}:{}",
            sdk.dir.display(),
            boxdesk_sandbox::running::AGENT_PATH
        ),
        None => boxdesk_sandbox::running::AGENT_PATH.to_owned(),
    };
    set("PATH", &path);
    set("HOME", home);
    set("USER", &s.name);
    set("LOGNAME", &s.name);
    set("TERM", "xterm-256color");
    if let Ok(lang) = std::env::var("LANG") {
        set("LANG", &lang);
    }
    for (k, v) in proxy {
        set(k, &v);
    }
    for (k, v) in &s.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(MethodError::BadEnvName(k.clone()));
        }
        set(k, v);
    }
    if !s.env.contains_key("CLAUDE_CODE_OAUTH_TOKEN") {
        if let Some(t) = s.oauth_token.as_ref().map(|t| &t.0).or(approved) {
            set("CLAUDE_CODE_OAUTH_TOKEN", t);
        }
    }
    Ok(env)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
