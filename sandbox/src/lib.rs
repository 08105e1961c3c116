//! boxdesk-sandbox: a sandbox's life on the host, whatever backs it, and
//! the namespace backend.
//!
//! * [`running`] — the [`Sandbox`] trait every backend implements (the
//!   namespace backend's here, the VM's in `boxdesk-vmm`) and the
//!   [`running::SandboxSpec`] they start from.
//! * [`keeper`] — the name's lock, control socket and state dir around
//!   one `dyn Sandbox`: what makes a sandbox one `boxdesk ls` lists.
//! * [`state`], [`trash`], [`lock`], [`log`] — the per-sandbox state dir
//!   and its removal (moved aside first, so `stop` frees the name at once
//!   and nothing races the removal of a deep tree), the one-helper-per-name
//!   `flock`, and `<name>.log` (the one log opener: 0600, no symlink, ours;
//!   capped and rotated; its tail).
//! * [`control`] — the control socket `<name>.sock`: the protocol, the
//!   helper's server and the client the CLI and cowork use.
//! * [`client`] — the host side of the agent protocol, blocking and tokio:
//!   connect, exec, PutFile/GetFile, and the one mapping from an exec's end
//!   to an exit status ([`client::status`]); the CLI and cowork both use it.
//! * [`forward`] — the hybrid `<name>.agent` socket in front of a namespace
//!   sandbox's agent.
//! * [`conn`] — what every host server shares about connections: the cap,
//!   the first-request deadline, the lobby and the relay threads.
//! * [`namespace`], [`seccomp`], [`cgroup`] — the namespace backend (Linux
//!   only, gated at their `mod` line): the bwrap command line and spec, the
//!   seccomp programs, per-sandbox cgroups.
//!
//! This crate knows no hypervisor and no VMM: it must never depend on
//! `boxdesk-hv`, `boxdesk-devices` or `boxdesk-vmm`, so cowork can build on
//! it alone. Which backend runs a sandbox, and the helper process around a
//! [`keeper::Keeper`], are the `boxdesk` binary's.

#![deny(missing_docs)]

#[cfg(target_os = "linux")]
pub mod cgroup;
pub mod client;
pub mod conn;
pub mod container;
pub mod control;
pub mod forward;
pub mod host_system;
pub mod keeper;
pub mod lock;
pub mod log;
#[cfg(target_os = "linux")]
pub mod namespace;
pub mod running;
#[cfg(target_os = "linux")]
pub mod seccomp;
pub mod share_arg;
pub mod state;
pub mod trash;

pub use running::Sandbox;

/// Default cap on a namespace sandbox's processes and threads (`--pids`).
pub const DEFAULT_PIDS: u64 = 4096;
/// Default size of a namespace sandbox's `/tmp` and `/dev/shm` (`--tmp`).
pub const DEFAULT_TMP_BYTES: u64 = 256 << 20;
