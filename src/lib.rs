//! boxdesk: sandboxes for Linux guests.
//!
//! The library half of the `boxdesk` binary: the host control socket
//! ([`control`]), the sandboxes behind it ([`sandbox`]) and the cowork
//! frontend for the Claude Desktop app ([`cowork`]). The command
//! line lives in the binary (`src/cli`), the only place that uses
//! `anyhow`.

pub mod control;
pub mod cowork;
pub mod sandbox;
pub mod sync;
pub mod vmm;
