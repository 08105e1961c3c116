//! The method table: a method name → its handler, with its parameters
//! decoded. The one place that knows which methods exist; it never does a
//! method's work itself.

use std::sync::Arc;

use serde_json::Value;

use super::params::params;
use super::{folders, processes, sdk, session_dirs, spawn, vm, MethodError, Outcome};
use crate::profile::Profile;
use crate::server::Server;

/// Runs `method` for profile `p`.
pub async fn call(server: &Arc<Server>, p: &Arc<Profile>, method: &str, raw: Value) -> Outcome {
    match method {
        "configure" => vm::configure(server, p, params(method, raw)?),
        "createVM" => vm::create(p, params(method, raw)?),
        "startVM" => vm::start(p, params(method, raw)?).await,
        "stopVM" => vm::stop(p).await,
        "isRunning" => vm::is_running(p),
        "isGuestConnected" => vm::is_connected(p),
        "setDebugLogging" => vm::set_debug(server, params(method, raw)?),
        "addApprovedOauthToken" => vm::add_token(p, params(method, raw)?),
        "getNetworkDrives" => vm::network_drives(),
        "sendGuestResponse" => vm::guest_response(params(method, raw)?),
        "spawn" => spawn::spawn(server, p, params(method, raw)?).await,
        "kill" => processes::kill(p, params(method, raw)?),
        "writeStdin" => processes::write_stdin(p, params(method, raw)?),
        "isProcessRunning" => processes::is_running(p, params(method, raw)?),
        "mountPath" => folders::mount_path(server, p, params(method, raw)?).await,
        "readFile" => folders::read_file(p, params(method, raw)?).await,
        "getSessionsDiskInfo" => session_dirs::disk_info(p, params(method, raw)?).await,
        "deleteSessionDirs" => session_dirs::delete(p, params(method, raw)?).await,
        "pruneSessionCaches" => session_dirs::prune(p, params(method, raw)?).await,
        "installSdk" => sdk::install(server, p, params(method, raw)?).await,
        other => Err(MethodError::UnknownMethod(other.to_owned())),
    }
}
