//! Reading a file back through a sandbox's agent (`readFile`): one channel
//! session, one GetFile, through `boxdesk_sandbox::client`, which
//! reassembles the File frames.
//!
//! The agent resolves the path beneath its root without following any
//! symlink and refuses `..`; the client refuses a file over the size cap
//! from its announced size and never trusts the agent's sizes for an
//! allocation beyond it.

use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::sync::Arc;

use boxdesk_sandbox::client::{self, AgentError};

use super::sandbox::Sandbox;

/// Reads `path` (as the sandbox sees it), at most `max` bytes.
pub async fn get_file(sandbox: &Arc<Sandbox>, path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let stream = sandbox.session().await.map_err(|e| e.to_string())?;
    client::get_file_async(stream, path.as_os_str().as_bytes(), max)
        .await
        .map_err(|e| match e {
            AgentError::Refused(msg) => format!("cannot read {}: {msg}", path.display()),
            e => e.to_string(),
        })
}
