//! The `boxdesk-guest-agent` binary: everything lives in the library so
//! that `boxdesk __agent` can run the same code.

#[cfg(target_os = "linux")]
fn main() {
    boxdesk_guest_agent::main_entry()
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("boxdesk-guest-agent runs only on Linux");
    std::process::exit(2);
}
