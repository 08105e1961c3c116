//! Integration tests of the guest agent: the real binary on a Unix socket,
//! driven with `boxdesk_channel::Session`. One test binary, a module per
//! area.

#![cfg(target_os = "linux")]

#[path = "agent/support.rs"]
mod support;

#[path = "agent/exec.rs"]
mod exec;
#[path = "agent/files.rs"]
mod files;
#[path = "agent/flood.rs"]
mod flood;
#[path = "agent/lifecycle.rs"]
mod lifecycle;
#[path = "agent/pid1.rs"]
mod pid1;
#[path = "agent/protocol.rs"]
mod protocol;
#[path = "agent/pty.rs"]
mod pty;
#[path = "agent/results.rs"]
mod results;
#[path = "agent/startup.rs"]
mod startup;
#[path = "agent/streams.rs"]
mod streams;
#[path = "agent/tree.rs"]
mod tree;
