//! The methods of docs/COWORK.md: [`call`] (the method table, in
//! `dispatch`) decodes a request's parameters (`params`) and runs its
//! handler, grouped by what it acts on: `vm` (the profile's lifecycle
//! and settings), `processes` and `spawn` (the process table),
//! `folders` (mounts and `readFile`), `session_dirs` (the sessions'
//! directories on disk) and `sdk`; `values` is how loosely a parameter
//! may be written (any JSON number for a size, `null` for absent). Every
//! failure is a [`MethodError`] that becomes `success: false`; nothing a
//! client sends can panic here.

mod dispatch;
mod error;
mod folders;
mod params;
mod processes;
mod sdk;
mod session_dirs;
mod spawn;
mod values;
mod vm;

use serde_json::Value;

pub use dispatch::{call, check};
pub use error::MethodError;
pub use params::redacted;

/// What a method answers: a result or why it failed.
pub type Outcome = Result<Value, MethodError>;

/// Runs `f` on the blocking pool: file-system work (a mount source on a
/// hung network share, a large session dir) must not stall the server.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MethodError> + Send + 'static,
) -> Result<T, MethodError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(MethodError::Internal)?
}
