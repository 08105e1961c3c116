//! One connection after its session headers (`gate` exchanged them): the
//! file phase (PutFile, GetFile), then one Exec or ExecPty handed to
//! `exec`, or Shutdown.
//!
//! Owns which frames are allowed when, and which errors end the session:
//! a refused PutFile or GetFile is answered and the session continues;
//! anything else wrong (a frame stalled half-way included) is one Error
//! and the close. It must never let one session's failure reach
//! another session or the agent: no panic on input, no process exit except
//! through Shutdown.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use boxdesk_channel::Frame;

use crate::agent::Agent;
use crate::exec::After;
use crate::putfile::Puts;
use crate::wire::{Wire, WireError};

/// Why a session ended early (logged only; the peer was told if it can be).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The socket could not be set up.
    #[error("session setup: {0}")]
    Setup(std::io::Error),
    /// The stream failed or the peer misbehaved.
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// Serves one connection, whose headers are exchanged, until it ends.
pub fn serve(fd: OwnedFd, agent: Arc<Agent>) {
    let mut wire = match Wire::new(fd) {
        Ok(w) => w,
        Err(e) => {
            log!("{}", SessionError::Setup(e));
            return;
        }
    };
    let after = files_then_exec(&mut wire, &agent);
    match after {
        Ok(After::Close) => wire.close(),
        Ok(After::Shutdown) => {
            drop(wire);
            agent.shutdown();
        }
        Err(e) => {
            if e.is_protocol() {
                let _ = wire.queue(&Frame::error(e.to_string()));
                wire.close();
            }
        }
    }
}

/// The file phase, then whatever ends the session.
fn files_then_exec(wire: &mut Wire, agent: &Agent) -> Result<After, WireError> {
    let mut puts = Puts::default();
    loop {
        let Some(frame) = wire.recv_blocking()? else {
            // EOF: the last series ends here; no Error means all succeeded.
            if let Err(e) = puts.finish() {
                wire.queue(&Frame::error(e.to_string()))?;
            }
            return Ok(After::Close);
        };
        let continues = match &frame {
            Frame::PutFile { path, offset, .. } => puts.continues(path, *offset),
            _ => false,
        };
        if !continues {
            if let Err(e) = puts.finish() {
                answer(wire, &e)?;
            }
        }
        match frame {
            Frame::PutFile {
                path,
                mode,
                offset,
                data,
            } => {
                if let Err(e) = puts.chunk(&agent.root, path, mode, offset, &data) {
                    answer(wire, &e)?;
                }
            }
            Frame::GetFile(path) => crate::files::get_file(wire, &agent.root, &path)?,
            Frame::Exec(exec) => return Ok(crate::exec::run(wire, agent, exec, None)),
            Frame::ExecPty(exec, size) => {
                return Ok(crate::exec::run(wire, agent, exec, Some(size)))
            }
            Frame::Shutdown => return Ok(After::Shutdown),
            other => {
                wire.queue(&Frame::error(format!(
                    "unexpected {:?} frame before an Exec",
                    other.tag()
                )))?;
                return Ok(After::Close);
            }
        }
    }
}

/// Queues the Error for a refused PutFile without waiting for the socket:
/// a host busy sending more chunks is not reading yet, and waiting for it
/// could deadlock both sides. `recv_blocking` writes it out.
fn answer(wire: &mut Wire, e: &crate::putfile::PutError) -> Result<(), WireError> {
    wire.queue(&Frame::error(e.to_string()))?;
    Ok(wire.flush_some()?)
}
