//! Integration tests of boxdesk-platform against the real filesystem and
//! real sockets in temp dirs: one binary, a module per area.

mod beneath;
mod dirs;
mod limits;
mod names;
mod socket;

/// Whether the tests that need another uid can run; says so when not.
fn is_root(why: &str) -> bool {
    let root = boxdesk_platform::euid() == 0;
    if !root {
        println!("skipped: needs root to {why}");
    }
    root
}

/// The uid the root-only tests hand files to.
const NOBODY: u32 = 65534;
