//! Integration tests of the `boxdesk` binary, one binary with a module per
//! area: `claude` (the real Claude Code through `boxdesk cowork`, against
//! a Messages API stand-in on loopback), `control` (the control and agent sockets), `cli` (commands, exit
//! codes, bad input), `display` (`screenshot` and `view` against a real
//! screen behind the real control server; the window under Xvfb), `client` (the agent client against the real agent,
//! `boxdesk __agent`), `images` (`boxdesk images fetch` against a release
//! served on loopback), `namespace` (what a sandbox can and cannot see),
//! `nested` (the L1-guest harness for KVM paths; see `tests/nested/`), `oci`
//! (`boxdesk oci`, the OCI runtime, driven as an engine drives it), and
//! `release` (the release assets in `dist/`).
//!
//! Every test drives the real binary — `$BOXDESK_BIN`, else the one cargo
//! built — with its own fresh `XDG_RUNTIME_DIR`, `XDG_STATE_HOME` and
//! `HOME` (mode 0700, under the temp dir), so the same compiled tests run
//! as root and as an unprivileged user (`runuser -u nobody`), where bwrap
//! takes the user-namespace path. Tests that need root print
//! `skipped: needs root …` otherwise.
//!
//! The modules that start sandboxes are Linux-only, gated here: they run on
//! the namespace backend (`cli`, `control`, `namespace`, `cowork`) or on
//! KVM (`vm`, `nested`); `images` starts none but shares their Linux-only
//! `support`; elsewhere only `release` runs.

#[cfg(target_os = "linux")]
mod claude;
#[cfg(target_os = "linux")]
mod cli;
#[cfg(target_os = "linux")]
mod client;
#[cfg(target_os = "linux")]
mod control;
#[cfg(target_os = "linux")]
mod cowork;
#[cfg(target_os = "linux")]
mod display;
#[cfg(target_os = "linux")]
mod images;
#[cfg(target_os = "linux")]
mod namespace;
#[cfg(target_os = "linux")]
mod nested;
#[cfg(target_os = "linux")]
mod oci;
mod release;
#[cfg(target_os = "linux")]
mod support;
#[cfg(target_os = "linux")]
mod vm;
