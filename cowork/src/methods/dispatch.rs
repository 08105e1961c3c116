//! The method table: a method name → its handler, with its parameters
//! decoded. The one place that knows which methods exist; it never does a
//! method's work itself.

use std::sync::Arc;

use serde_json::Value;

use super::params::{
    params, ConfigureParams, DebugParams, DiskInfoParams, IdParams, KillParams, MountPathParams,
    NamesParams, PruneParams, ReadFileParams, SdkParams, SpawnParams, StartParams, StdinParams,
    TokenParams,
};
use super::{folders, processes, sdk, session_dirs, spawn, vm, MethodError, Outcome};
use crate::profile::Profile;
use crate::server::Server;

/// One request's method with its parameters decoded: what [`call`] runs.
/// Decoding is all of it that looks at the client's bytes, so the fuzz
/// target `cowork_frames` drives it through [`check`] without acting.
#[derive(Debug)]
pub(super) enum Call {
    /// `configure`.
    Configure(ConfigureParams),
    /// `createVM`.
    Create(StartParams),
    /// `startVM`.
    Start(StartParams),
    /// `stopVM`.
    Stop,
    /// `isRunning`.
    IsRunning,
    /// `isGuestConnected`.
    IsConnected,
    /// `setDebugLogging`.
    SetDebug(DebugParams),
    /// `addApprovedOauthToken`.
    AddToken(TokenParams),
    /// `getNetworkDrives`.
    NetworkDrives,
    /// `sendGuestResponse`.
    GuestResponse(IdParams),
    /// `spawn`.
    Spawn(SpawnParams),
    /// `kill`.
    Kill(KillParams),
    /// `writeStdin`.
    WriteStdin(StdinParams),
    /// `isProcessRunning`.
    IsProcessRunning(IdParams),
    /// `mountPath`.
    MountPath(MountPathParams),
    /// `readFile`.
    ReadFile(ReadFileParams),
    /// `getSessionsDiskInfo`.
    DiskInfo(DiskInfoParams),
    /// `deleteSessionDirs`.
    DeleteSessionDirs(NamesParams),
    /// `pruneSessionCaches`.
    PruneSessionCaches(PruneParams),
    /// `installSdk`.
    InstallSdk(SdkParams),
}

impl Call {
    /// `method` with its parameters `raw` decoded, or why not (an unknown
    /// method, parameters that do not fit, naming the method).
    pub(super) fn decode(method: &str, raw: Value) -> Result<Call, MethodError> {
        Ok(match method {
            "configure" => Call::Configure(params(method, raw)?),
            "createVM" => Call::Create(params(method, raw)?),
            "startVM" => Call::Start(params(method, raw)?),
            "stopVM" => Call::Stop,
            "isRunning" => Call::IsRunning,
            "isGuestConnected" => Call::IsConnected,
            "setDebugLogging" => Call::SetDebug(params(method, raw)?),
            "addApprovedOauthToken" => Call::AddToken(params(method, raw)?),
            "getNetworkDrives" => Call::NetworkDrives,
            "sendGuestResponse" => Call::GuestResponse(params(method, raw)?),
            "spawn" => Call::Spawn(params(method, raw)?),
            "kill" => Call::Kill(params(method, raw)?),
            "writeStdin" => Call::WriteStdin(params(method, raw)?),
            "isProcessRunning" => Call::IsProcessRunning(params(method, raw)?),
            "mountPath" => Call::MountPath(params(method, raw)?),
            "readFile" => Call::ReadFile(params(method, raw)?),
            "getSessionsDiskInfo" => Call::DiskInfo(params(method, raw)?),
            "deleteSessionDirs" => Call::DeleteSessionDirs(params(method, raw)?),
            "pruneSessionCaches" => Call::PruneSessionCaches(params(method, raw)?),
            "installSdk" => Call::InstallSdk(params(method, raw)?),
            other => return Err(MethodError::UnknownMethod(other.to_owned())),
        })
    }
}

/// Whether `method` exists and `raw` are parameters it takes: the
/// decoding [`call`] does, without acting (the fuzz target's entry).
pub fn check(method: &str, raw: Value) -> Result<(), MethodError> {
    Call::decode(method, raw).map(drop)
}

/// Runs `method` for profile `p`.
pub async fn call(server: &Arc<Server>, p: &Arc<Profile>, method: &str, raw: Value) -> Outcome {
    match Call::decode(method, raw)? {
        Call::Configure(c) => vm::configure(server, p, c),
        Call::Create(c) => vm::create(p, c),
        Call::Start(c) => vm::start(p, c).await,
        Call::Stop => vm::stop(p).await,
        Call::IsRunning => vm::is_running(p),
        Call::IsConnected => vm::is_connected(p),
        Call::SetDebug(d) => vm::set_debug(server, d),
        Call::AddToken(t) => vm::add_token(p, t),
        Call::NetworkDrives => vm::network_drives(),
        Call::GuestResponse(i) => vm::guest_response(i),
        Call::Spawn(s) => spawn::spawn(server, p, s).await,
        Call::Kill(k) => processes::kill(p, k),
        Call::WriteStdin(w) => processes::write_stdin(p, w),
        Call::IsProcessRunning(i) => processes::is_running(p, i),
        Call::MountPath(m) => folders::mount_path(server, p, m).await,
        Call::ReadFile(r) => folders::read_file(p, r).await,
        Call::DiskInfo(q) => session_dirs::disk_info(p, q).await,
        Call::DeleteSessionDirs(n) => session_dirs::delete(p, n).await,
        Call::PruneSessionCaches(q) => session_dirs::prune(p, q).await,
        Call::InstallSdk(s) => sdk::install(server, p, s).await,
    }
}
