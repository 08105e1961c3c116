//! Self-tests of the nested harness, each run on both arches: L1 has a real
//! KVM, exit codes, deadlines and files come back faithfully, and the host's
//! root is shared. Every assertion is on what L1's end marker and output say,
//! never on timing. Skipped (with a line saying so) where the harness is not
//! set up, unless `BOXDESK_NESTED=1`.

use super::{ready, run, run_with, unavailable, Arch, Options, Status};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// One `#[test]` per arch for each check below, in modules named after the
/// arch: `nested::selftest::aarch64::a_failing_commands_exit_code_comes_back`.
macro_rules! on_both_arches {
    ($($check:ident),* $(,)?) => {
        mod x86_64 {
            $( #[test] fn $check() { super::$check(super::Arch::X86_64) } )*
        }
        mod aarch64 {
            $( #[test] fn $check() { super::$check(super::Arch::Aarch64) } )*
        }
    };
}

on_both_arches!(
    l1_has_dev_kvm_and_the_probe_guest_makes_its_expected_exit,
    a_failing_commands_exit_code_comes_back,
    a_hung_command_is_killed_at_its_deadline_and_reported_as_timed_out,
    a_silent_l1_is_examined_through_qemu_and_its_own_kernel_before_it_is_killed,
    l1s_keyboard_is_pressed_every_few_seconds_so_no_wake_up_stays_lost,
    a_file_passed_in_arrives_byte_identical,
    the_hosts_root_is_shared_read_only_at_host,
);

fn sha256_on_host(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(out.status.success(), "sha256sum {}", path.display());
    first_word(&String::from_utf8_lossy(&out.stdout))
}

/// The real path of `arch`'s qemu binary (known to exist once [`ready`]).
fn qemu_binary(arch: Arch) -> PathBuf {
    let name = format!("qemu-system-{}", arch.name());
    let out = Command::new("sh")
        .args(["-c", "command -v \"$1\"", "sh", &name])
        .output()
        .expect("sh");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    std::fs::canonicalize(&path).unwrap_or_else(|e| panic!("{name} at {path:?}: {e}"))
}

fn first_word(text: &str) -> String {
    text.split_whitespace().next().unwrap_or("").to_owned()
}

/// The static KVM probe for `arch` (tests/nested/kvm_probe_<arch>.c), built
/// or taken from the cache; `None` after reporting why it could not be.
fn kvm_probe(arch: Arch) -> Option<PathBuf> {
    let out = Command::new("bash")
        .arg(super::script("build-probe.sh"))
        .arg(arch.name())
        .output()
        .expect("bash");
    if !out.status.success() {
        unavailable(&format!(
            "build-probe.sh {} failed: {}",
            arch.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
        return None;
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn l1_has_dev_kvm_and_the_probe_guest_makes_its_expected_exit(arch: Arch) {
    if !ready(arch) {
        return;
    }
    let Some(probe) = kvm_probe(arch) else { return };
    let out = run(
        arch,
        &[(&probe, "/bin/kvm-probe")],
        &[
            "sh",
            "-c",
            "test -c /dev/kvm && echo dev-kvm-present; exec kvm-probe",
        ],
    );
    out.assert_exit(0);
    assert!(out.output.contains("dev-kvm-present\n"), "{}", out.output);
    let expected = match arch {
        // A long-mode loop, then `out dx, al` with dx=0x3f8, al=0x42.
        Arch::X86_64 => "KVM_EXIT_IO dir=out port=0x3f8 size=1 count=1 value=0x42 rcx=0\n",
        // KVM_ARM_VCPU_INIT, a loop, then `str w1, [x0]` to unbacked 0x10000000.
        Arch::Aarch64 => "KVM_EXIT_MMIO addr=0x10000000 len=4 write=1 data=0x42 x2=0 ",
    };
    assert!(
        out.output.contains(expected),
        "want {expected:?} in:\n{}",
        out.output
    );
}

fn a_failing_commands_exit_code_comes_back(arch: Arch) {
    if !ready(arch) {
        return;
    }
    let out = run(arch, &[], &["sh", "-c", "echo before-exit; exit 3"]);
    out.assert_exit(3);
    assert_eq!(out.output, "before-exit\n");
    let started = out.cmd_started_after.expect("the start marker was seen");
    println!(
        "{}: command started {started:?} after qemu (host wall time)",
        arch.name()
    );
}

fn a_hung_command_is_killed_at_its_deadline_and_reported_as_timed_out(arch: Arch) {
    if !ready(arch) {
        return;
    }
    let opts = Options {
        deadline: Duration::from_secs(3),
        ..Options::default()
    };
    let out = run_with(arch, &[], &["sleep", "1000"], &opts);
    assert_eq!(out.status, Status::TimedOut, "console:\n{}", out.console);
    // The guest said so itself: the end marker carries "timeout".
    assert!(out.console.contains(":end timeout@@"), "{}", out.console);
}

/// An L1 silent past `--stall` (here: a 5 s stall against a heartbeat a
/// minute, so a healthy L1 stands in for a frozen one) is examined before
/// qemu is killed: qemu's threads from the host, the vCPUs from qemu's
/// monitor, L1's kernel through sysrq from its keyboard and, on x86_64, the
/// panic an NMI gives it, which prints even with interrupts off.
fn a_silent_l1_is_examined_through_qemu_and_its_own_kernel_before_it_is_killed(arch: Arch) {
    if !ready(arch) {
        return;
    }
    let opts = Options {
        stall: Some(Duration::from_secs(5)),
        ..Options::default()
    };
    let out = run_with(
        arch,
        &[],
        &["sh", "-c", "echo going quiet; sleep 300"],
        &opts,
    );
    match &out.status {
        Status::Failed(why) => assert!(why.contains("L1 stopped responding"), "{why}"),
        other => panic!("a silent L1 should fail as frozen, not {other:?}"),
    }
    let report = &out.freeze;
    for seen in [
        "going quiet",                       // the last thing CMD printed
        "--- qemu's threads' kernel stacks", // the host's view
        "(qemu) info registers -a",          // the monitor's
        "sysrq: Show Blocked State",         // L1's kernel, through its keyboard
        "sysrq: Show State",
    ] {
        assert!(
            report.contains(seen),
            "no {seen:?} in the report:\n{report}"
        );
    }
    assert!(
        report.contains("CPU#0") && !report.contains("did not answer"),
        "the monitor showed no vCPU:\n{report}"
    );
    if arch == Arch::X86_64 {
        assert!(
            report.contains("Kernel panic - not syncing: NMI"),
            "L1 did not panic on the NMI:\n{report}"
        );
    }
    // The kernel's messages went to its own port, and stayed off the output
    // port.
    assert!(out.kernel.contains("sysrq: Show State"), "{}", out.kernel);
    assert!(!out.console.contains("sysrq:"), "{}", out.console);
}

/// run.sh's kick reaches L1: its keyboard (the i8042 on x86_64, the virtio
/// keyboard's event queue on arm64) interrupts while CMD sleeps. That
/// interrupt is what wakes a vCPU qemu's TCG left halted with its timer
/// pending (docs/NESTED-FREEZE.md).
fn l1s_keyboard_is_pressed_every_few_seconds_so_no_wake_up_stays_lost(arch: Arch) {
    if !ready(arch) {
        return;
    }
    // (the virtio keyboard: the virtio device of type 18)
    let find = "kb=none; for d in /sys/bus/virtio/devices/*; do \
                [ \"$(cat $d/device 2>/dev/null)\" = 0x0012 ] && kb=${d##*/}; done";
    let count = "grep -E \"i8042|$kb-\" /proc/interrupts | \
                 awk '{ for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) n += $i } END { print n + 0 }'";
    let script = format!("{find}; a=$({count}); sleep 9; b=$({count}); echo kicks $a $b");
    let out = run(arch, &[], &["sh", "-c", &script]);
    out.assert_exit(0);
    let counts: Vec<u64> = out
        .output
        .split_whitespace()
        .skip_while(|w| *w != "kicks")
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(counts.len(), 2, "{}", out.output);
    // A press and a release every 2 s: at least 2 interrupts in 9 s even
    // where both come in one (the virtio queue), allowing for a loaded host.
    assert!(
        counts[1] >= counts[0] + 2,
        "the keyboard interrupted {} times in 9 s",
        counts[1] - counts[0]
    );
}

fn a_file_passed_in_arrives_byte_identical(arch: Arch) {
    if !ready(arch) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("random.bin");
    let mut bytes = vec![0u8; 1 << 20];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    std::fs::write(&src, &bytes).expect("write the random file");

    let out = run(
        arch,
        &[(&src, "/data/in/random.bin")],
        &[
            "sh",
            "-c",
            "stat -c %s /data/in/random.bin && sha256sum /data/in/random.bin",
        ],
    );
    out.assert_exit(0);
    let mut lines = out.output.lines();
    assert_eq!(lines.next(), Some("1048576"), "{}", out.output);
    assert_eq!(
        first_word(lines.next().unwrap_or("")),
        sha256_on_host(&src),
        "{}",
        out.output
    );
}

fn the_hosts_root_is_shared_read_only_at_host(arch: Arch) {
    if !ready(arch) {
        return;
    }
    // A host file outside the paths L1 mounts over (/tmp, /run, /proc, /sys,
    // /dev), where a clone or a temporary file might be: the qemu binary.
    let host_file = qemu_binary(arch);
    let l1_file = format!("/host{}", host_file.display());
    // Host programs run only in an x86_64 L1; an aarch64 L1 reads host files.
    let chroot = match arch {
        Arch::X86_64 => "chroot /host /bin/true && echo chroot-ran-host-true",
        Arch::Aarch64 => "echo chroot-ran-host-true",
    };
    let script = format!(
        "{chroot}; sha256sum '{l1_file}'; touch /host/boxdesk-nested-write 2>/dev/null || echo read-only"
    );
    let opts = Options {
        hostroot: true,
        ..Options::default()
    };
    let out = run_with(arch, &[], &["sh", "-c", &script], &opts);
    out.assert_exit(0);
    let lines: Vec<&str> = out.output.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.output);
    assert_eq!(lines[0], "chroot-ran-host-true");
    assert_eq!(first_word(lines[1]), sha256_on_host(&host_file));
    assert_eq!(lines[2], "read-only");
}
