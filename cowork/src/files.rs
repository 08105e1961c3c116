//! Reading a file back through a sandbox's agent (`readFile`): one channel
//! session, one GetFile, File frames until the whole file arrived.
//!
//! The agent resolves the path beneath its root without following any
//! symlink and refuses `..`; this module adds the size cap and never trusts
//! the agent's sizes for an allocation beyond it.

use std::path::Path;
use std::sync::Arc;

use boxdesk_channel::Frame;
use futures_util::{SinkExt, StreamExt};

use super::sandbox::Sandbox;

/// Reads `path` (as the sandbox sees it), at most `max` bytes.
pub async fn get_file(sandbox: &Arc<Sandbox>, path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt as _;
    let stream = sandbox.session().await.map_err(|e| e.to_string())?;
    let mut s = tokio_util::codec::Framed::new(stream, boxdesk_channel::AgchCodec);
    s.send(Frame::GetFile(path.as_os_str().as_bytes().to_vec()))
        .await
        .map_err(|e| e.to_string())?;
    let mut out: Vec<u8> = Vec::new();
    loop {
        match s.next().await {
            Some(Ok(Frame::File {
                offset,
                total_size,
                data,
                ..
            })) => {
                if total_size > max {
                    return Err(format!(
                        "{} is {total_size} bytes, over the {max}-byte limit",
                        path.display()
                    ));
                }
                if offset != out.len() as u64 {
                    return Err("the agent sent the file out of order".into());
                }
                if out.is_empty() {
                    out.reserve_exact(total_size as usize);
                }
                out.extend_from_slice(&data);
                if out.len() as u64 >= total_size {
                    return Ok(out);
                }
            }
            Some(Ok(Frame::Error(msg))) => {
                return Err(format!("cannot read {}: {msg}", path.display()))
            }
            Some(Ok(other)) => {
                return Err(format!("unexpected {:?} frame from the agent", other.tag()))
            }
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("the agent closed the channel".into()),
        }
    }
}
