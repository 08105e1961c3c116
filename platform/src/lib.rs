//! boxdesk-platform: the host-OS facts boxdesk relies on before it trusts
//! anything — where its sockets live and whether that place is private,
//! what a sandbox may be called, who is on the other end of a Unix socket,
//! what this machine can run (`boxdesk doctor`), how a path is resolved
//! beneath a directory without following symlinks (the agent's PutFile and
//! GetFile, the host side of `boxdesk cp`), the descriptor limit a
//! server raises before it accepts, the one mutex `lock` that outlives
//! a panicked holder, and an error said with its causes (`report`).
//!
//! It is a leaf crate: it knows nothing of the channel protocol, the VMM or
//! the CLI. OS-specific code is cfg-gated here so the rest of the workspace
//! does not have to be.
//!
//! ```no_run
//! use boxdesk_platform::{dirs, names::SandboxPaths, socket};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = dirs::runtime_dir()?; // created 0700, owner and mode checked
//! let paths = SandboxPaths::new(&dir, "dev-1")?;
//! let listener = socket::bind_exclusive(&paths.sock)?; // never steals a live socket
//! for stream in listener.incoming() {
//!     let stream = stream?;
//!     if socket::ensure_same_uid(&stream).is_err() {
//!         continue; // another user: drop the connection
//!     }
//!     // serve the control protocol on `stream`
//! }
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod beneath;
pub mod dirs;
pub mod limits;
pub mod mountinfo;
pub mod names;
pub mod pathcode;
pub mod probe;
pub mod procstat;
pub mod report;
pub mod screen;
pub mod socket;
pub mod sync;
pub mod threads;

pub use dirs::DirError;
pub use names::{NameError, SandboxPaths, SUN_PATH_MAX};
pub use probe::Probe;
pub use socket::{SocketError, Staleness};

/// The effective uid of this process: the only uid whose directories,
/// sockets and peers boxdesk trusts.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}
