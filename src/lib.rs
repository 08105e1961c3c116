//! boxdesk: sandboxes for Linux guests.
//!
//! The library half of the `boxdesk` binary: which backend runs a sandbox
//! ([`backend`]), the helper process that owns one ([`helper`]) and the
//! cowork frontend for the Claude Desktop app ([`cowork`], Linux only).
//! The sandboxes themselves, the control socket and the namespace backend
//! are `boxdesk_sandbox`'s; the VMM is `boxdesk_vmm`. The command line
//! lives in the binary (`src/cli`), the only place that uses `anyhow`.

pub mod backend;
#[cfg(target_os = "linux")]
pub mod cowork;
pub mod helper;
