//! Integration tests of the `boxdesk` binary, one binary with a module per
//! area: `control` (the control and agent sockets), `cli` (commands, exit
//! codes, bad input), `namespace` (what a sandbox can and cannot see), and
//! `nested` (the L1-guest harness for KVM paths; see `tests/nested/`).
//!
//! Every test drives the real binary — `$BOXDESK_BIN`, else the one cargo
//! built — with its own fresh `XDG_RUNTIME_DIR`, `XDG_STATE_HOME` and
//! `HOME` (mode 0700, under the temp dir), so the same compiled tests run
//! as root and as an unprivileged user (`runuser -u nobody`), where bwrap
//! takes the user-namespace path. Tests that need root print
//! `skipped: needs root …` otherwise.

mod cli;
mod control;
mod cowork;
mod namespace;
mod nested;
mod support;
mod vm;
