//! boxdesk-channel: the AGCH v3 wire protocol between a host and the guest
//! agent (`docs/CHANNEL.md`, byte by byte).
//!
//! A session starts with both sides writing a 6-byte header (`"AGCH"`, `u16`
//! version 3) and reading the peer's. Then frames flow both ways:
//! `tag: u8 · len: u32 LE · payload[len]`, `len ≤` [`MAX_PAYLOAD`].
//!
//! The crate owns the bytes and nothing else: it never spawns processes or
//! touches files. Its layers, bottom up:
//!
//! * [`wire`] — `u32`-prefixed byte strings and lists inside a payload;
//! * [`frame`] — the typed [`Frame`] enum, [`FrameHeader`] and the one
//!   decoder core ([`FrameHeader::parse`] + [`Frame::decode_payload`]) that
//!   every reader shares;
//! * [`sanitize`] — [`sanitize_error`] for Error frames, applied on both ends;
//! * [`blocking`] — [`FrameReader`]/[`FrameWriter`] over `Read`/`Write` and the
//!   header [`handshake`];
//! * `codec` (feature `tokio`) — a `tokio_util` codec over the same core;
//! * [`hybrid`] — the hybrid-vsock preamble (`CONNECT <port>\n`, `OK <port>\n`
//!   or `ERR <why>\n`): its grammar and rules, for the client and both servers;
//! * [`session`] — a client [`Session`] over Unix sockets, the VMM's hybrid
//!   vsock socket and, on Linux, AF_VSOCK.
//!
//! ```
//! use boxdesk_channel::{Frame, FrameReader, FrameWriter};
//!
//! let mut wire = Vec::new();
//! FrameWriter::new(&mut wire).write_frame(&Frame::Exit(3)).unwrap();
//! assert_eq!(wire, [4, 4, 0, 0, 0, 3, 0, 0, 0]);
//! let mut reader = FrameReader::new(&wire[..]);
//! assert_eq!(reader.read_frame().unwrap(), Some(Frame::Exit(3)));
//! assert_eq!(reader.read_frame().unwrap(), None); // clean EOF
//! ```
#![deny(missing_docs)]

pub mod blocking;
#[cfg(feature = "tokio")]
pub mod codec;
mod error;
pub mod frame;
pub mod hybrid;
pub mod sanitize;
pub mod secret;
pub mod session;
pub mod wire;

pub use blocking::{handshake, FrameReader, FrameWriter};
#[cfg(feature = "tokio")]
pub use codec::AgchCodec;
pub use error::ChannelError;
pub use frame::{Exec, Frame, FrameError, FrameHeader, Tag, WinSize};
pub use sanitize::sanitize_error;
pub use secret::SecretBytes;
pub use session::{Session, Stream};

/// The 4 magic bytes every session starts with, in both directions.
pub const MAGIC: [u8; 4] = *b"AGCH";
/// The protocol version this crate speaks (`u16`, little-endian on the wire).
pub const VERSION: u16 = 3;
/// Length of the session header: magic + version.
pub const HEADER_LEN: usize = 6;
/// Largest payload a frame may carry (1 MiB). A larger length is refused
/// before anything is allocated.
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// Largest Error message, in bytes, after sanitising.
pub const ERROR_MSG_CAP: usize = 4096;
/// The vsock port the guest agent listens on.
pub const AGENT_PORT: u32 = 1024;
/// The guest's default vsock context id.
pub const GUEST_CID: u32 = 3;

/// The session header this side writes: `"AGCH"` then version 3.
pub const fn session_header() -> [u8; HEADER_LEN] {
    let v = VERSION.to_le_bytes();
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], v[0], v[1]]
}
