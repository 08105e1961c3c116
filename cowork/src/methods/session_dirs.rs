//! The methods on the sessions' directories on disk:
//! `getSessionsDiskInfo`, `deleteSessionDirs` and `pruneSessionCaches`.
//! The file-system work is [`crate::sessions`]'s and runs on the blocking
//! pool; these handlers add only that a session with a running process is
//! never touched and that its mounts come off before its dir goes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::params::{DiskInfoParams, NamesParams, PruneParams};
use super::{blocking, Outcome};
use crate::mounts;
use crate::profile::Profile;
use crate::sessions::PruneOptions;

/// How old a session's `tmp` entry must be to be pruned when the client
/// does not say.
const TMP_AGE: Duration = Duration::from_secs(86_400);

/// `getSessionsDiskInfo`: under `createVM`'s `diskSizeGB` when one was
/// recorded. `lowWaterBytes` is checked and logged, not used: the result
/// has no field it could drive.
pub(super) async fn disk_info(p: &Profile, q: DiskInfoParams) -> Outcome {
    if let Some(low) = q.low_water_bytes {
        tracing::debug!("getSessionsDiskInfo lowWaterBytes {low} (not used)");
    }
    let s = p.sessions.clone();
    let quota = p.settings().disk_quota;
    let info = blocking(move || Ok(s.disk_info()?.within(quota))).await?;
    let sessions: Vec<Value> = info
        .sessions
        .iter()
        .map(|u| json!({"name": u.name, "bytes": u.bytes}))
        .collect();
    Ok(json!({"totalBytes": info.total_bytes, "freeBytes": info.free_bytes, "sessions": sessions}))
}

/// `deleteSessionDirs`: each named session that runs nothing.
pub(super) async fn delete(p: &Arc<Profile>, n: NamesParams) -> Outcome {
    let (s, procs) = (p.sessions.clone(), p.procs.clone());
    let staged = p.layout.staged_sessions();
    let r = blocking(move || {
        // A session's folders are mounted on its staged view; take them
        // off (never through them) before its dir goes.
        for name in n.names.iter().filter(|n| !procs.session_busy(n)) {
            mounts::detach_all(&staged, Some(name));
        }
        Ok(s.delete(&n.names, &|name| procs.session_busy(name)))
    })
    .await?;
    Ok(json!({"deleted": r.deleted, "errors": r.errors}))
}

/// `pruneSessionCaches`: caches (and, if asked, old `tmp` entries) of the
/// sessions that run nothing.
pub(super) async fn prune(p: &Arc<Profile>, q: PruneParams) -> Outcome {
    let opts = PruneOptions {
        only_if_free_bytes_below: q.only_if_free_bytes_below,
        include_session_tmp: q.include_session_tmp,
        session_tmp_older_than: q
            .session_tmp_older_than_seconds
            .map_or(TMP_AGE, Duration::from_secs),
        quota: p.settings().disk_quota,
    };
    let (s, procs) = (p.sessions.clone(), p.procs.clone());
    let r = blocking(move || Ok(s.prune(&opts, &|name| procs.session_busy(name)))).await?;
    Ok(json!({
        "prunedSessions": r.pruned_sessions, "skippedSessions": r.skipped_sessions,
        "freedBytes": r.freed_bytes, "errors": r.errors,
    }))
}
