//! boxdesk: sandboxes for Linux guests.
//!
//! The library half of the `boxdesk` binary: the host control socket
//! ([`control`]) and the sandboxes behind it ([`sandbox`]). The command
//! line lives in the binary (`src/cli`), the only place that uses
//! `anyhow`.

pub mod control;
pub mod sandbox;
