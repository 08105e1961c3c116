//! The Claude Desktop app's install on this machine, as boxdesk meets it:
//! where its resources directory is and whether it can be written
//! ([`layout`]), putting boxdesk in the place of its helper and back
//! ([`install`]), starting a helper exactly as the app does and asking it
//! one thing ([`check`]), and the support gate the app evaluates before
//! it dials any helper at all ([`gate`]).
//!
//! This module never speaks the helper protocol as a server (the rest of
//! the crate does) and never changes anything outside the app's resources
//! directory; [`gate`] only reads.

pub mod check;
pub mod gate;
pub mod install;
pub mod layout;

/// The helper's file name in the app's resources directory; a boxdesk
/// started under this name is the helper (`cowork-linux-helper -socket
/// PATH`).
pub const HELPER: &str = "cowork-linux-helper";
