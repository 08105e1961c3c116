//! The `boxdesk` command line. `boxdesk __agent …` is the guest agent
//! itself (linked in, so an installed boxdesk needs no separate agent
//! binary) and is dispatched before anything else runs; everything else
//! goes through [`cli`] — started as `cowork-linux-helper` (the name the
//! Claude Desktop app starts its helper by), boxdesk is that helper.
//!
//! The binary is the glue over the library crates: [`backend`] (which
//! backend runs a sandbox: it needs the VMM's image lookup and the
//! hypervisor probe), [`helper`] (`boxdesk __vmm`, the process that owns
//! one sandbox), [`images`] (`boxdesk images fetch`: a release's guest
//! image, downloaded, checked and installed), `apparmor` (Linux: the
//! AppArmor profile that lets boxdesk make user namespaces where Ubuntu
//! restricts them), and the command line. The sandboxes, the control
//! socket and the namespace backend are `boxdesk_sandbox`'s, the VMM is
//! `boxdesk_vmm`, cowork is `boxdesk_cowork`.
//!
//! This file is the binary's edge: the only place besides `cli` where
//! `anyhow` errors become a message and exit code 125.

#[cfg(target_os = "linux")]
mod apparmor;
mod backend;
mod cli;
mod helper;
mod images;

fn main() {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    if args.next().is_some_and(|a| a == "__agent") {
        agent();
    }
    // Under the name the Claude Desktop app starts its helper by, boxdesk
    // is that helper: `cowork-linux-helper -socket PATH`.
    if cli::started_as_cowork_helper(&argv0) {
        std::process::exit(cli::as_cowork_helper());
    }
    // Under the runtime's name, boxdesk is an OCI runtime (runc's command
    // line): what podman's `--runtime` and containerd's `BinaryName` run.
    #[cfg(target_os = "linux")]
    if cli::oci::started_as_runtime(&argv0) {
        std::process::exit(cli::oci::main(std::env::args_os().skip(1)));
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
