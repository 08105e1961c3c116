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
        boxdesk_guest_agent::main_with_args(std::env::args_os().skip(2));
    }
    std::process::exit(cli::main());
}
