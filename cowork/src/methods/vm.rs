//! The VM-named methods: the profile's lifecycle (`startVM`, `stopVM`,
//! whether it runs) and what it records for later (`configure`,
//! `createVM`, the approved token, debug logging). The names are the
//! client's; what backs the profile is the profile's business. These
//! handlers never touch a process or a folder.

use std::sync::Arc;

use serde_json::json;

use super::params::{ConfigureParams, DebugParams, IdParams, StartParams, TokenParams};
use super::{values, MethodError, Outcome};
use crate::profile::Profile;
use crate::server::Server;

/// `configure`: memory and CPUs for sandboxes started from now on (0:
/// no limit), and the app's log directory, which gets a copy of this
/// server's log (one that cannot be used never fails `configure`).
pub(super) fn configure(server: &Server, p: &Profile, c: ConfigureParams) -> Outcome {
    {
        let mut s = p.settings();
        s.memory_mb = limit(c.memory_mb, s.memory_mb);
        s.cpu_count = limit(c.cpu_count, s.cpu_count);
    }
    if let Some(dir) = c.log_dir.as_deref().filter(|d| !d.is_empty()) {
        server.set_log_dir(dir);
    }
    Ok(json!({}))
}

/// A limit as `configure`/`startVM` set it: absent keeps the old one, 0
/// means none.
fn limit(given: Option<u64>, old: Option<u64>) -> Option<u64> {
    match given {
        None => old,
        Some(0) => None,
        Some(n) => Some(n),
    }
}

/// `createVM`: records the bundle path and `diskSizeGB`, the sessions
/// dir's quota (reported by `getSessionsDiskInfo`; the namespace backend
/// cannot enforce one on a plain directory); nothing starts.
pub(super) fn create(p: &Profile, c: StartParams) -> Outcome {
    let mut s = p.settings();
    if c.bundle_path.is_some() {
        s.bundle_path = c.bundle_path;
    }
    if let Some(gb) = c.disk_size_gb {
        s.disk_quota = Some(values::scaled(gb, 1 << 30)).filter(|&b| b > 0);
    }
    Ok(json!({}))
}

/// `startVM`: records its settings, then starts the profile (idempotent).
pub(super) async fn start(p: &Arc<Profile>, c: StartParams) -> Outcome {
    {
        let mut s = p.settings();
        if c.bundle_path.is_some() {
            s.bundle_path = c.bundle_path;
        }
        if let Some(gb) = c.memory_gb {
            if !gb.is_finite() || gb <= 0.0 {
                return Err(MethodError::BadMemory(gb));
            }
            s.memory_mb = Some(values::scaled(gb, 1024)).filter(|&m| m > 0);
        }
        s.cpu_count = limit(c.cpu_count, s.cpu_count);
    }
    p.start(c.api_probe_url)
        .await
        .map_err(MethodError::Sandbox)?;
    Ok(json!({}))
}

/// `stopVM`: kills every process and ends the profile's sandboxes.
pub(super) async fn stop(p: &Profile) -> Outcome {
    p.stop().await;
    Ok(json!({}))
}

/// `isRunning`.
pub(super) fn is_running(p: &Profile) -> Outcome {
    Ok(json!({"running": p.is_running()}))
}

/// `isGuestConnected`.
pub(super) fn is_connected(p: &Profile) -> Outcome {
    Ok(json!({"connected": p.is_connected()}))
}

/// `setDebugLogging`: the server's, for every profile.
pub(super) fn set_debug(server: &Server, d: DebugParams) -> Outcome {
    server.set_debug(d.enabled);
    Ok(json!({}))
}

/// `addApprovedOauthToken`: the token spawns get when they bring none.
pub(super) fn add_token(p: &Profile, t: TokenParams) -> Outcome {
    p.settings().token = Some(t.token.0);
    Ok(json!({}))
}

/// `getNetworkDrives`: none are shared.
pub(super) fn network_drives() -> Outcome {
    Ok(json!({"drives": []}))
}

/// `sendGuestResponse`: no guest in a namespace sandbox sends requests,
/// so no reply is ever pending; a response nobody waits for (a late answer
/// to a request that timed out) is accepted and dropped.
pub(super) fn guest_response(i: IdParams) -> Outcome {
    let id = crate::logged(i.id.key());
    tracing::debug!("sendGuestResponse {id}: no guest request is pending; dropped");
    Ok(json!({}))
}
