//! **boxdesk-oci**: boxdesk as an OCI runtime (runtime-spec 1.2), the parts
//! that are not processes: a bundle's `config.json` checked against what
//! boxdesk honours and turned into a sandbox plan ([`config`]), its seccomp
//! profile compiled ([`seccomp`]), its mount points made safely in its root
//! ([`mountpoints`]), the namespaces it joins checked ([`joins`]), the container state under `--root`
//! ([`state`]) and what `features` prints ([`features`]). The command line
//! and the container's monitor process are the `boxdesk` binary's
//! (`src/cli/oci/`). Linux only: the crate is empty elsewhere.
#![deny(missing_docs)]

#[cfg(target_os = "linux")]
pub mod config;
#[cfg(target_os = "linux")]
pub mod features;
#[cfg(target_os = "linux")]
pub mod joins;
#[cfg(target_os = "linux")]
pub mod mountpoints;
#[cfg(target_os = "linux")]
pub mod seccomp;
#[cfg(target_os = "linux")]
pub mod state;
