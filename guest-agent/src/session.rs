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
use crate::conn::{Conn, ConnError};
use crate::exec::After;
use crate::putfile::Puts;

/// Why a session ended early (logged only; the peer was told if it can be).
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The socket could not be set up.
    #[error("session setup: {0}")]
    Setup(std::io::Error),
    /// The stream failed or the peer misbehaved.
    #[error(transparent)]
    Conn(#[from] ConnError),
}

/// Serves one connection, whose headers are exchanged, until it ends.
pub fn serve(fd: OwnedFd, agent: Arc<Agent>) {
    let mut conn = match Conn::new(fd) {
        Ok(w) => w,
        Err(e) => {
            log!("{}", SessionError::Setup(e));
            return;
        }
    };
    let after = files_then_exec(&mut conn, &agent);
    match after {
        Ok(After::Close) => conn.close(),
        Ok(After::Shutdown) => {
            drop(conn);
            agent.shutdown();
        }
        Err(e) => {
            if e.is_protocol() {
                let _ = conn.queue(&Frame::error(e.to_string()));
                conn.close();
            }
        }
    }
}

/// The file phase, then whatever ends the session.
fn files_then_exec(conn: &mut Conn, agent: &Agent) -> Result<After, ConnError> {
    let mut puts = Puts::default();
    loop {
        let Some(frame) = conn.recv_blocking()? else {
            // EOF: the last series ends here; no Error means all succeeded.
            if let Err(e) = puts.finish() {
                conn.queue(&Frame::error(e.to_string()))?;
            }
            return Ok(After::Close);
        };
        let continues = match &frame {
            Frame::PutFile { path, offset, .. } => puts.continues(path, *offset),
            _ => false,
        };
        if !continues {
            if let Err(e) = puts.finish() {
                answer(conn, &e)?;
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
                    answer(conn, &e)?;
                }
            }
            Frame::GetFile(path) => crate::files::get_file(conn, &agent.root, &path)?,
            Frame::Exec(exec) => return Ok(crate::exec::run(conn, agent, exec, None)),
            Frame::ExecPty(exec, size) => {
                return Ok(crate::exec::run(conn, agent, exec, Some(size)))
            }
            Frame::Shutdown => return Ok(After::Shutdown),
            other => {
                conn.queue(&Frame::error(format!(
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
fn answer(conn: &mut Conn, e: &crate::putfile::PutError) -> Result<(), ConnError> {
    conn.queue(&Frame::error(e.to_string()))?;
    Ok(conn.flush_some()?)
}
