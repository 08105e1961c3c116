//! The VM-named methods: the profile's lifecycle (`startVM`, `stopVM`,
//! whether it runs) and what it records for later (`configure`,
//! `createVM`, the approved token, debug logging). The names are the
//! client's; what backs the profile is the profile's business. These
//! handlers never touch a process or a folder.

use std::sync::Arc;

use serde_json::json;

use super::params::{ConfigureParams, DebugParams, IdParams, StartParams, TokenParams};
use super::{MethodError, Outcome};
use crate::profile::Profile;
use crate::server::Server;

/// `configure`: memory and CPUs for sandboxes started from now on.
pub(super) fn configure(p: &Profile, c: ConfigureParams) -> Outcome {
    let mut s = p.settings();
    s.memory_mb = c.memory_mb.or(s.memory_mb);
    s.cpu_count = c.cpu_count.or(s.cpu_count);
    Ok(json!({}))
}

/// `createVM`: records the bundle path; nothing starts.
pub(super) fn create(p: &Profile, c: StartParams) -> Outcome {
    if c.bundle_path.is_some() {
        p.settings().bundle_path = c.bundle_path;
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
            s.memory_mb = Some((gb * 1024.0) as u64);
        }
        s.cpu_count = c.cpu_count.or(s.cpu_count);
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
/// so no reply can be pending.
pub(super) fn guest_response(i: IdParams) -> Outcome {
    Err(MethodError::NoPendingRequest(i.id.key()))
}
