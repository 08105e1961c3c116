//! boxdesk: sandboxes for Linux guests.
//!
//! The library half of the `boxdesk` binary: the host control socket
//! ([`control`]), the sandboxes behind it ([`sandbox`]) and the cowork
//! frontend for the Claude Desktop app ([`cowork`], Linux only). The
//! command line lives in the binary (`src/cli`), the only place that uses
//! `anyhow`.
//!
//! Linux-only parts are whole modules gated at their `mod` line: `cowork`
//! (the Claude Desktop helper on Linux) and `sandbox::{namespace,
//! seccomp}` (the namespace backend). Elsewhere the CLI keeps the same
//! commands and says plainly that they need Linux.

pub mod conn;
pub mod control;
#[cfg(target_os = "linux")]
pub mod cowork;
pub mod sandbox;
pub mod vmm;
