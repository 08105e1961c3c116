//! Host folders in sandboxes and files read back out of them:
//! `mountPath`, `readFile`, and [`attach`], which `spawn` uses for its
//! `additionalMounts`. Owns the policy of what may be mounted (what this
//! user may read, never the kernel's filesystems or boxdesk's own
//! directories) and where a client may read; the
//! mounting itself is [`crate::mounts`]'s and the reading the agent's. It
//! never mounts by a path string the client chose.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::params::{MountPathParams, ReadFileParams};
use super::{blocking, MethodError, Outcome};
use crate::mounts;
use crate::names;
use crate::process::ProcError;
use crate::profile::Profile;
use crate::server::Server;

/// Largest file `readFile` returns.
const READ_MAX: u64 = 8 << 20;

/// Whether a mount is read-only: `ro`, or `rw` (the default, as the
/// app expects: it names folders a session writes its outputs to).
pub(super) fn read_only(mode: Option<&str>) -> Result<bool, MethodError> {
    match mode {
        Some("ro") => Ok(true),
        None | Some("rw") => Ok(false),
        Some(m) => Err(MethodError::BadMode(m.to_owned())),
    }
}

/// Checks a name the client chose for one path component.
pub(super) fn check_name(what: &'static str, name: &str) -> Result<(), MethodError> {
    names::check(name).map_err(|why| MethodError::BadName {
        what,
        name: name.to_owned(),
        why,
    })
}

/// Attaches host folder `subpath` (relative to `/`; the rules of
/// [`mounts::resolve_source`]) at `/sessions/<name>/mnt/<mount>`. A folder
/// holding or inside one of
/// boxdesk's own dirs is refused: the runtime dir (control and agent
/// sockets, staged mounts) and the state dir (each sandbox's `agent.sock`)
/// would let a sandbox drive another, the data dir holds other profiles'
/// sessions and tokens, and staged mounts would repeat themselves in every
/// copy.
pub(super) fn attach(
    server: &Server,
    p: &Profile,
    name: &str,
    mount: &str,
    subpath: &str,
    ro: bool,
) -> Result<(), MethodError> {
    p.can_mount().map_err(MethodError::Sandbox)?;
    check_name("mount name", mount)?;
    let src = mounts::resolve_source(server.home(), subpath)?;
    let real = mounts::real_path(&src).map_err(|reason| MethodError::Inspect {
        subpath: subpath.to_owned(),
        reason,
    })?;
    for own in server.own_roots() {
        if own.starts_with(&real) || real.starts_with(own) {
            return Err(MethodError::OwnDirectory {
                path: real,
                own: own.to_owned(),
            });
        }
    }
    let shown = Path::new("/sessions").join(name).join("mnt").join(mount);
    mounts::attach(
        &src,
        &p.layout.staged_sessions(),
        &[name, "mnt", mount],
        ro,
        &shown,
    )?;
    Ok(())
}

/// `mountPath`: a folder into the session of a process, at once visible
/// in every sandbox of the profile.
pub(super) async fn mount_path(
    server: &Arc<Server>,
    p: &Arc<Profile>,
    m: MountPathParams,
) -> Outcome {
    let (server, p) = (server.clone(), p.clone());
    blocking(move || {
        let key = m.process_id.key();
        let name = p.procs.name_of(&key).ok_or(ProcError::Unknown(key))?;
        let ro = read_only(m.mode.as_deref())?;
        attach(&server, &p, &name, &m.mount_name, &m.subpath, ro)?;
        Ok(json!({"guestPath": format!("/sessions/{name}/mnt/{}", m.mount_name)}))
    })
    .await
}

/// `readFile`: a file of a session, read through the agent, at most
/// [`READ_MAX`] bytes.
pub(super) async fn read_file(p: &Arc<Profile>, r: ReadFileParams) -> Outcome {
    check_name("process name", &r.process_name)?;
    let comps = mounts::components(&r.file_path)?;
    let inside: PathBuf = std::iter::once("/").chain(comps.iter().copied()).collect();
    let root = Path::new("/sessions").join(&r.process_name);
    if !inside.starts_with(&root) || inside == root {
        return Err(MethodError::OutsideSession {
            path: r.file_path,
            root,
        });
    }
    let sandbox = p.sandbox_for(None).await.map_err(MethodError::Sandbox)?;
    let bytes = crate::files::get_file(&sandbox, &inside, READ_MAX)
        .await
        .map_err(MethodError::ReadFile)?;
    Ok(json!({"content": String::from_utf8_lossy(&bytes)}))
}
