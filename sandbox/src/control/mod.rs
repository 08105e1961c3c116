//! The host control socket `<name>.sock` (docs/CONTROL.md):
//! the pure protocol, the helper's server and the CLI's client.
//!
//! This module owns the wire contract of that socket and nothing about
//! sandboxes themselves: what `info` says and what `stop` does are the
//! helper's (`boxdesk __vmm`, in the `boxdesk` binary).

pub mod client;
pub mod display;
pub mod input;
pub mod protocol;
pub mod server;
#[doc(hidden)]
pub mod testing;

pub use client::{ClientError, ControlClient};
pub use server::Controlled;
