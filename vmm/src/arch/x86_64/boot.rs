//! [`configure_system`]: everything in guest memory a loaded kernel needs
//! besides itself and its initrd — command line, MP table, zero page.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{
    in_memory, ram_regions, CMDLINE_MAX_SIZE, CMDLINE_START, HIMEM_START, MAX_VCPUS,
};
use super::loader::{KernelFormat, LoadedKernel};
use super::{mptable, zeropage, ArchError};

/// Writes the command line at [`CMDLINE_START`], the MP table for `vcpus`
/// and the zero page (setup header, initrd, e820 map of
/// [`ram_regions(mem_bytes)`](ram_regions)) for `kernel`. `mem` must hold
/// those regions; `initrd` is what [`load_initrd`](super::load_initrd)
/// returned.
pub fn configure_system(
    mem: &GuestMemoryMmap,
    kernel: &LoadedKernel,
    cmdline: &str,
    initrd: Option<(GuestAddress, usize)>,
    mem_bytes: u64,
    vcpus: u8,
) -> Result<(), ArchError> {
    if vcpus == 0 || u32::from(vcpus) > MAX_VCPUS {
        return Err(ArchError::VcpuCount {
            id: 0,
            vcpus: vcpus.into(),
            max: MAX_VCPUS,
        });
    }
    let regions = ram_regions(mem_bytes);
    match regions.first() {
        Some(&(start, size)) if start.0 == 0 && size as u64 > HIMEM_START => {}
        _ => {
            return Err(ArchError::GuestMemory {
                what: "kernel (guest RAM must extend past 1 MiB)",
                addr: HIMEM_START,
                len: 0,
            })
        }
    }
    for &(start, size) in &regions {
        if !in_memory(mem, start.0, size) {
            return Err(ArchError::GuestMemory {
                what: "RAM the e820 map announces",
                addr: start.0,
                len: size,
            });
        }
    }
    if let Some((addr, size)) = initrd {
        check_initrd(mem, kernel, addr.0, size)?;
    }
    let cmdline_len = write_cmdline(mem, kernel, cmdline)?;
    mptable::setup_mptable(mem, vcpus)?;
    zeropage::write_zero_page(mem, kernel, cmdline_len, initrd, &regions)
}

fn check_initrd(
    mem: &GuestMemoryMmap,
    kernel: &LoadedKernel,
    start: u64,
    size: usize,
) -> Result<(), ArchError> {
    let end = start.saturating_add(size as u64);
    if !in_memory(mem, start, size) || end > u64::from(u32::MAX) {
        return Err(ArchError::GuestMemory {
            what: "initrd",
            addr: start,
            len: size,
        });
    }
    if start < kernel.end && end > HIMEM_START {
        return Err(ArchError::InitrdOverlapsKernel {
            start,
            end,
            kernel_end: kernel.end,
        });
    }
    if let Some(hdr) = kernel.setup_header {
        let max = u64::from(hdr.initrd_addr_max);
        if size > 0 && end - 1 > max {
            return Err(ArchError::InitrdAboveKernelLimit { end, max });
        }
    }
    Ok(())
}

/// Writes `cmdline` and its NUL at [`CMDLINE_START`]; returns the bytes
/// written.
fn write_cmdline(
    mem: &GuestMemoryMmap,
    kernel: &LoadedKernel,
    cmdline: &str,
) -> Result<usize, ArchError> {
    let bytes = cmdline.as_bytes();
    let mut max = CMDLINE_MAX_SIZE - 1;
    if let (KernelFormat::BzImage, Some(hdr)) = (kernel.format, kernel.setup_header) {
        // Protocol 2.06+ says how long a command line the kernel takes.
        if hdr.version >= 0x0206 && hdr.cmdline_size > 0 {
            max = max.min(hdr.cmdline_size as usize);
        }
    }
    if bytes.len() > max {
        return Err(ArchError::CmdlineTooLong {
            len: bytes.len(),
            max,
        });
    }
    if bytes.contains(&0) {
        return Err(ArchError::CmdlineNul);
    }
    let mut with_nul = Vec::with_capacity(bytes.len() + 1);
    with_nul.extend_from_slice(bytes);
    with_nul.push(0);
    let no_room = ArchError::GuestMemory {
        what: "command line",
        addr: CMDLINE_START,
        len: with_nul.len(),
    };
    if !in_memory(mem, CMDLINE_START, with_nul.len()) {
        return Err(no_room);
    }
    mem.write_slice(&with_nul, GuestAddress(CMDLINE_START))
        .map_err(|_| no_room)?;
    Ok(with_nul.len())
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use linux_loader::loader::bootparam::boot_params;

    use super::super::layout::{MMIO_HOLE_START, ZERO_PAGE_START};
    use super::super::loader::tests::{memory, tiny_bzimage, tiny_elf};
    use super::super::loader::{load_initrd_from, load_kernel_from};
    use super::super::zeropage::{E820_RAM, E820_RESERVED};
    use super::*;

    const MIB: u64 = 1 << 20;

    fn zero_page(mem: &GuestMemoryMmap) -> boot_params {
        mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap()
    }

    fn e820(p: &boot_params) -> Vec<(u64, u64, u32)> {
        p.e820_table[..usize::from(p.e820_entries)]
            .iter()
            .map(|e| (e.addr, e.size, e.type_))
            .collect()
    }

    #[test]
    fn zero_page_fields_and_e820_entries_read_back() {
        let mem = memory(128 * MIB);
        let kernel = load_kernel_from(&mem, &mut Cursor::new(tiny_elf(&[0xf4]))).unwrap();
        let initrd = load_initrd_from(&mem, &mut Cursor::new(vec![7u8; 3000])).unwrap();
        let cmdline = "console=ttyS0 reboot=k panic=1";
        configure_system(&mem, &kernel, cmdline, Some(initrd), 128 * MIB, 2).unwrap();

        let p = zero_page(&mem);
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
        assert_eq!({ p.hdr.boot_flag }, 0xaa55);
        assert_eq!({ p.hdr.header }, 0x5372_6448);
        assert_eq!({ p.hdr.kernel_alignment }, 0x100_0000);
        assert_eq!({ p.hdr.cmd_line_ptr }, 0x2_0000);
        assert_eq!({ p.hdr.cmdline_size } as usize, cmdline.len() + 1);
        assert_eq!({ p.hdr.ramdisk_image } as u64, initrd.0 .0);
        assert_eq!({ p.hdr.ramdisk_size }, 3000);
        assert_eq!(
            e820(&p),
            vec![
                (0, 0x9_fc00, E820_RAM),
                (0x9_fc00, 0x400, E820_RESERVED),
                (0x10_0000, 127 * MIB, E820_RAM),
            ]
        );
        let mut back = vec![0u8; cmdline.len() + 1];
        mem.read_slice(&mut back, GuestAddress(CMDLINE_START))
            .unwrap();
        assert_eq!(&back[..cmdline.len()], cmdline.as_bytes());
        assert_eq!(back[cmdline.len()], 0);
    }

    #[test]
    fn zero_page_of_a_bzimage_keeps_its_setup_header() {
        let mem = memory(64 * MIB);
        let kernel = load_kernel_from(&mem, &mut Cursor::new(tiny_bzimage(&[0x90; 64]))).unwrap();
        configure_system(&mem, &kernel, "quiet", None, 64 * MIB, 1).unwrap();
        let p = zero_page(&mem);
        assert_eq!({ p.hdr.version }, 0x020f);
        assert_eq!({ p.hdr.kernel_alignment }, 0x20_0000);
        assert_eq!({ p.hdr.code32_start }, 0x10_0000);
        assert_eq!({ p.hdr.initrd_addr_max }, 0x7fff_ffff);
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
        assert_eq!({ p.hdr.cmdline_size }, 6);
        assert_eq!({ p.hdr.ramdisk_size }, 0);
    }

    #[test]
    fn zero_page_of_a_guest_spanning_the_hole_lists_ram_above_4_gib() {
        let mem = memory(4 << 30);
        let kernel = load_kernel_from(&mem, &mut Cursor::new(tiny_elf(&[0xf4]))).unwrap();
        configure_system(&mem, &kernel, "", None, 4 << 30, 1).unwrap();
        let map = e820(&zero_page(&mem));
        assert_eq!(map.len(), 4);
        assert_eq!(map[2], (0x10_0000, MMIO_HOLE_START - 0x10_0000, E820_RAM));
        assert_eq!(map[3], (1 << 32, (4 << 30) - MMIO_HOLE_START, E820_RAM));
    }

    #[test]
    fn cmdline_too_long_is_an_error() {
        let mem = memory(64 * MIB);
        let kernel = load_kernel_from(&mem, &mut Cursor::new(tiny_elf(&[0xf4]))).unwrap();
        let long = "x".repeat(CMDLINE_MAX_SIZE);
        let err = configure_system(&mem, &kernel, &long, None, 64 * MIB, 1).unwrap_err();
        assert!(
            matches!(
                err,
                ArchError::CmdlineTooLong {
                    len: 4096,
                    max: 4095
                }
            ),
            "{err}"
        );
        let fits = "x".repeat(CMDLINE_MAX_SIZE - 1);
        configure_system(&mem, &kernel, &fits, None, 64 * MIB, 1).unwrap();
        // A bzImage's own cmdline_size (2047 in the test image) is the limit.
        let bz = load_kernel_from(&mem, &mut Cursor::new(tiny_bzimage(&[0x90; 64]))).unwrap();
        let err = configure_system(&mem, &bz, &"y".repeat(2048), None, 64 * MIB, 1).unwrap_err();
        assert!(
            matches!(err, ArchError::CmdlineTooLong { max: 2047, .. }),
            "{err}"
        );
        let err = configure_system(&mem, &kernel, "a\0b", None, 64 * MIB, 1).unwrap_err();
        assert!(matches!(err, ArchError::CmdlineNul));
    }

    #[test]
    fn initrd_over_the_kernel_is_an_error() {
        let mem = memory(64 * MIB);
        let kernel = load_kernel_from(&mem, &mut Cursor::new(tiny_elf(&[0xf4]))).unwrap();
        let initrd = Some((GuestAddress(0x100_0000), 4096));
        let err = configure_system(&mem, &kernel, "", initrd, 64 * MIB, 1).unwrap_err();
        assert!(
            matches!(err, ArchError::InitrdOverlapsKernel { .. }),
            "{err}"
        );
    }

    #[test]
    fn configure_system_refuses_bad_vcpu_counts_and_mismatched_memory() {
        let mem = memory(64 * MIB);
        let kernel = load_kernel_from(&mem, &mut Cursor::new(tiny_elf(&[0xf4]))).unwrap();
        let err = configure_system(&mem, &kernel, "", None, 64 * MIB, 0).unwrap_err();
        assert!(matches!(err, ArchError::VcpuCount { .. }));
        let err = configure_system(&mem, &kernel, "", None, 64 * MIB, 255).unwrap_err();
        assert!(matches!(err, ArchError::VcpuCount { .. }));
        let err = configure_system(&mem, &kernel, "", None, 128 * MIB, 1).unwrap_err();
        assert!(matches!(err, ArchError::GuestMemory { .. }), "{err}");
        let err = configure_system(&mem, &kernel, "", None, MIB, 1).unwrap_err();
        assert!(matches!(err, ArchError::GuestMemory { .. }), "{err}");
    }
}
