//! `installSdk`: which `claude` spawns of `claude` run. Owns where an SDK
//! may be (under home, bound read-only into the home mirror at the same
//! path, or under `/usr`, which every sandbox shares); it never runs the
//! SDK.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::folders::check_name;
use super::params::SdkParams;
use super::{blocking, MethodError, Outcome};
use crate::mounts;
use crate::profile::{Profile, Sdk};
use crate::server::Server;

/// `installSdk`, on the blocking pool.
pub(super) async fn install(server: &Arc<Server>, p: &Arc<Profile>, s: SdkParams) -> Outcome {
    let (server, p) = (server.clone(), p.clone());
    blocking(move || install_now(&server, &p, s)).await
}

fn install_now(server: &Server, p: &Profile, s: SdkParams) -> Outcome {
    check_name("SDK version", &s.version)?;
    let comps = mounts::components(&s.sdk_subpath)?;
    let dir: PathBuf = std::iter::once("/")
        .chain(comps.iter().copied())
        .collect::<PathBuf>()
        .join(&s.version);
    let claude = dir.join("claude");
    let meta = std::fs::metadata(&claude).map_err(|reason| MethodError::NoSdk {
        path: claude.clone(),
        reason,
    })?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(MethodError::NotExecutable(claude));
    }
    let home = server.home();
    if let Ok(rel) = dir.strip_prefix(home) {
        // Under home: bind it read-only at the same path in the mirror.
        p.can_mount().map_err(MethodError::Sandbox)?;
        let src = mounts::resolve_in_home(home, &dir.to_string_lossy())?;
        let names: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        mounts::attach(&src, &p.layout.staged_home(), &names, true, &dir)?;
    } else if !visible_in_sandbox(&dir) {
        return Err(MethodError::SdkNotVisible {
            dir,
            home: home.to_owned(),
        });
    }
    p.settings().sdk = Some(Sdk { dir, claude });
    Ok(json!({}))
}

/// Whether `dir` is inside `/usr`, which every sandbox shares read-only.
fn visible_in_sandbox(dir: &Path) -> bool {
    dir.starts_with("/usr")
}
