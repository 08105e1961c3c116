//! What only a VM backend shows of cowork: a kernel of its own, and a
//! guest that dies. The rest of the suite runs on the VM backend too
//! (`BOXDESK_TEST_BACKEND=kvm`, inside the nested L1s); these tests say
//! `skipped:` elsewhere.

use serde_json::json;

use super::client::{on_vm, Cowork};

fn skip_unless_vm(test: &str) -> bool {
    if on_vm() {
        return false;
    }
    println!(
        "skipped: {test}: cowork runs on namespaces here (BOXDESK_TEST_BACKEND=kvm runs it in VMs)"
    );
    true
}

#[test]
fn in_a_vm_a_spawned_process_runs_on_a_kernel_of_its_own() {
    if skip_unless_vm("in_a_vm_a_spawned_process_runs_on_a_kernel_of_its_own") {
        return;
    }
    let c = Cowork::start();
    let mut p = c.boot("own");
    let mut ev = c.events("own");
    p.sh("u", "s", "uname -r; cat /proc/1/comm");
    assert_eq!(ev.exit_of("u")["exitCode"], 0, "{:?}", ev.seen);
    let out = ev.text("stdout", "u");
    let mut lines = out.lines();
    let guest = lines.next().unwrap_or_default().to_owned();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(!guest.is_empty(), "{out}");
    assert_ne!(guest, host.trim(), "the guest's kernel is the host's");
    // PID 1 is the guest agent, as in every boxdesk VM.
    assert_eq!(lines.next(), Some("init"), "{out}");
    let info = c.env.info(&super::kept_sandbox_of(&c, "own"));
    assert_eq!(info["isolation"], "vm", "{info:?}");
    assert_eq!(info["rootfs"], "host", "{info:?}");
}

#[test]
fn a_guest_kernel_panic_disconnects_with_a_fatal_error_and_start_vm_boots_a_fresh_vm() {
    if skip_unless_vm(
        "a_guest_kernel_panic_disconnects_with_a_fatal_error_and_start_vm_boots_a_fresh_vm",
    ) {
        return;
    }
    let c = Cowork::start();
    let mut p = c.boot("panic");
    let mut ev = c.events("panic");
    let first = super::kept_sandbox_of(&c, "panic");
    p.sh("boom", "s", "echo c > /proc/sysrq-trigger");
    let err = ev.until("a fatal error event", |v| {
        v["type"] == "error" && v["fatal"] == true && v.get("id").is_none()
    });
    assert!(
        err["message"].as_str().unwrap().contains("panicked"),
        "{err}"
    );
    // The process that was running is not left running.
    ev.exit_of("boom");
    p.poll("isGuestConnected", "/result/connected", json!(false));
    assert_eq!(p.call("isRunning", json!({}))["result"]["running"], false);

    // A new startVM boots a fresh VM that serves spawns.
    let mut p = c.boot("panic");
    p.sh("again", "s", "echo alive");
    assert_eq!(ev.exit_of("again")["exitCode"], 0, "{:?}", ev.seen);
    assert_eq!(ev.text("stdout", "again"), "alive\n");
    let second = super::kept_sandbox_of(&c, "panic");
    let info = c.env.info(&second);
    assert_eq!(info["state"], "running", "{info:?} (first was {first})");
}

/// Resident and mapped KiB of the largest mapping of process `pid` (a
/// VM's RAM in the server that runs it).
fn largest_mapping_kib(pid: u32) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut best, mut size) = ((0, 0), 0);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next().and_then(|kb| kb.parse().ok())) {
            (Some("Size:"), Some(kb)) => size = kb,
            (Some("Rss:"), Some(kb)) if size > best.1 => best = (kb, size),
            _ => {}
        }
    }
    best
}

#[test]
fn a_vms_ram_is_mapped_at_its_size_but_only_what_the_guest_touched_is_resident() {
    if skip_unless_vm("a_vms_ram_is_mapped_at_its_size_but_only_what_the_guest_touched_is_resident")
    {
        return;
    }
    let c = Cowork::start();
    let mut p = c.boot("ram");
    let mut ev = c.events("ram");
    p.sh("m", "s", "grep MemTotal /proc/meminfo");
    assert_eq!(ev.exit_of("m")["exitCode"], 0, "{:?}", ev.seen);
    let (resident, mapped) = largest_mapping_kib(c.child.0.id());
    // The default: 2048 MiB of guest RAM, mapped in the server.
    assert!(mapped >= 2048 * 1024, "largest mapping {mapped} KiB");
    assert!(
        resident < 512 * 1024,
        "{resident} KiB of the guest's {mapped} KiB resident after a boot and a spawn"
    );
    println!("guest RAM resident after boot and one spawn: {resident} of {mapped} KiB");
}
