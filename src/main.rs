//! The `boxdesk` command line. `boxdesk __agent …` is the guest agent
//! itself (linked in, so an installed boxdesk needs no separate agent
//! binary) and is dispatched before anything else runs; everything else
//! goes through [`cli`].
//!
//! This file is the binary's edge: the only place besides `cli` where
//! `anyhow` errors become a message and exit code 125.

mod cli;

fn main() {
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == "__agent") {
        agent();
    }
    std::process::exit(cli::main());
}

/// `boxdesk __agent …`: the guest agent, linked in (Linux only).
#[cfg(target_os = "linux")]
fn agent() -> ! {
    boxdesk_guest_agent::main_with_args(std::env::args_os().skip(2))
}

/// `boxdesk __agent …` off Linux: the agent serves Linux sandboxes only.
#[cfg(not(target_os = "linux"))]
fn agent() -> ! {
    eprintln!("boxdesk: __agent is the guest agent, which runs only on Linux");
    std::process::exit(cli::EXIT_BOXDESK)
}
