//! The device tree checked three ways: against a golden DTS (decompiled by
//! Debian's `dtc`, which also lints it: any warning fails), through a
//! dtb → dts → dtb → dts round trip, and by what varies with the config.
//! Set `BOXDESK_BLESS=1` to rewrite the golden file after a deliberate
//! change.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::*;

const MIB: u64 = 1 << 20;

fn config<'a>(vcpus: u32, virtio: &'a [(u64, u32)], psci: PsciMethod) -> FdtConfig<'a> {
    FdtConfig {
        vcpus,
        mem_bytes: 512 * MIB,
        cmdline: "console=ttyAMA0 panic=-1 rdinit=/init",
        initrd: Some((GuestAddress(0x9f00_0000), 0x12_3400)),
        virtio,
        psci,
    }
}

const TWO_SLOTS: [(u64, u32); 2] = [(0x0a00_0000, 16), (0x0a00_4000, 17)];

/// `dtc -I FROM -O TO` of `input`: stdout, or `None` (printing why) when
/// dtc is not installed. Panics on any warning or error. From DTS, the
/// `clocks_property` check is off: a decompiled source has phandles as bare
/// numbers, which that check (made for `&label` sources) calls
/// non-references; the blob itself passed every check on the way out.
fn dtc(from: &str, to: &str, input: &[u8]) -> Option<Vec<u8>> {
    let quiet: &[&str] = if from == "dts" {
        &["-W", "no-clocks_property"]
    } else {
        &[]
    };
    let child = Command::new("dtc")
        .args(quiet)
        .args(["-I", from, "-O", to, "-o", "-", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("skipped: dtc is not installed (apt-get install device-tree-compiler)");
            return None;
        }
        Err(e) => panic!("dtc: {e}"),
    };
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.is_empty(),
        "dtc -I {from} -O {to}: {stderr}"
    );
    Some(out.stdout)
}

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/arch/aarch64/testdata/fdt-2cpu.dts")
}

#[test]
fn the_tree_decompiles_without_a_dtc_warning_and_matches_the_golden_dts() {
    let blob = build(&config(2, &TWO_SLOTS, PsciMethod::Hvc)).unwrap();
    let Some(dts) = dtc("dtb", "dts", &blob) else {
        return;
    };
    let dts = String::from_utf8(dts).unwrap();
    if std::env::var_os("BOXDESK_BLESS").is_some() {
        std::fs::write(golden(), &dts).unwrap();
    }
    let want =
        std::fs::read_to_string(golden()).expect("the golden DTS (BOXDESK_BLESS=1 writes it)");
    assert_eq!(
        dts, want,
        "the device tree changed; rerun with BOXDESK_BLESS=1 if on purpose"
    );
}

#[test]
fn dtb_to_dts_to_dtb_to_dts_is_stable() {
    let blob = build(&config(4, &TWO_SLOTS, PsciMethod::Smc)).unwrap();
    let Some(dts) = dtc("dtb", "dts", &blob) else {
        return;
    };
    let blob2 = dtc("dts", "dtb", &dts).unwrap();
    assert_eq!(dtc("dtb", "dts", &blob2).unwrap(), dts);
}

#[test]
fn cpus_psci_initrd_and_virtio_nodes_follow_the_config() {
    let blob = build(&config(3, &TWO_SLOTS[..1], PsciMethod::Smc)).unwrap();
    let Some(dts) = dtc("dtb", "dts", &blob) else {
        return;
    };
    let dts = String::from_utf8(dts).unwrap();
    for cpu in ["cpu@0 {", "cpu@1 {", "cpu@2 {"] {
        assert!(dts.contains(cpu), "{cpu}: {dts}");
    }
    assert!(!dts.contains("cpu@3"), "{dts}");
    assert!(dts.contains("method = \"smc\";"), "{dts}");
    assert_eq!(dts.matches("virtio_mmio@").count(), 1, "{dts}");
    assert!(
        dts.contains("linux,initrd-start = <0x00 0x9f000000>;"),
        "{dts}"
    );
    assert!(
        dts.contains("linux,initrd-end = <0x00 0x9f123400>;"),
        "{dts}"
    );

    let mut no_initrd = config(1, &[], PsciMethod::Hvc);
    no_initrd.initrd = None;
    let dts = String::from_utf8(dtc("dtb", "dts", &build(&no_initrd).unwrap()).unwrap()).unwrap();
    assert!(!dts.contains("initrd"), "{dts}");
    assert!(!dts.contains("virtio_mmio"), "{dts}");
    assert!(dts.contains("method = \"hvc\";"), "{dts}");
}

#[test]
fn the_redistributor_window_grows_with_the_vcpus() {
    let [_, (_, one)] = layout::gic_regions(1);
    let [_, (_, eight)] = layout::gic_regions(8);
    assert_eq!(eight, 8 * one);
    let blob = build(&config(8, &[], PsciMethod::Hvc)).unwrap();
    let Some(dts) = dtc("dtb", "dts", &blob) else {
        return;
    };
    let dts = String::from_utf8(dts).unwrap();
    assert!(
        dts.contains(&format!(
            "reg = <0x00 0x8000000 0x00 0x10000 0x00 0x80a0000 0x00 {eight:#x}>;"
        )),
        "{dts}"
    );
}

#[test]
fn zero_or_too_many_vcpus_and_a_nul_in_the_command_line_are_refused() {
    let e = build(&config(0, &[], PsciMethod::Hvc)).unwrap_err();
    assert!(matches!(e, ArchError::VcpuCount { vcpus: 0, .. }), "{e}");
    let e = build(&config(layout::MAX_VCPUS + 1, &[], PsciMethod::Hvc)).unwrap_err();
    assert!(matches!(e, ArchError::VcpuCount { .. }), "{e}");
    let mut c = config(1, &[], PsciMethod::Hvc);
    c.cmdline = "a\0b";
    assert!(matches!(build(&c), Err(ArchError::CmdlineNul)));
}

#[test]
fn the_blob_is_written_in_the_last_two_mib_of_ram_with_its_magic() {
    let mem = GuestMemoryMmap::from_ranges(&layout::ram_regions(512 * MIB)).unwrap();
    let at = write(&mem, &config(2, &TWO_SLOTS, PsciMethod::Hvc)).unwrap();
    assert_eq!(at.0, RAM_START + 510 * MIB);
    let magic: u32 = mem.read_obj(at).unwrap();
    assert_eq!(u32::from_be(magic), 0xd00d_feed);
}
