//! Loading the kernel (vmlinux ELF or bzImage, through `linux-loader`) and
//! the initrd into guest memory.
//!
//! Before handing an image to `linux-loader`, its headers are checked here
//! against the file's length and the guest's low RAM, so a truncated, foreign
//! or oversized file ends in a clear [`ArchError`] rather than a confusing
//! loader error or a panic. Both formats are booted through the Linux 64-bit
//! boot protocol: an ELF's entry point is its `e_entry` (vmlinux's
//! `startup_64`); a bzImage's protected-mode code is loaded at 1 MiB and its
//! 64-bit entry is 0x200 bytes in.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

use linux_loader::loader::bootparam::{setup_header, XLF_KERNEL_64};
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, ReadVolatile};

use super::layout::{low_ram_end, HIMEM_START, INITRD_ADDR_LIMIT};
use super::ArchError;

/// Offset of a bzImage's 64-bit entry point from its load address.
pub const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

const PAGE: u64 = 0x1000;
const ELF_HEADER_LEN: usize = 64;
const ELF_PHDR_LEN: u64 = 56;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const EM_X86_64: u16 = 62;
/// Offset of the setup header in a bzImage, and its end (boot protocol 2.15).
const SETUP_HEADER_START: usize = 0x1f1;
const SETUP_HEADER_END: usize = 0x26c;

/// Which image format the kernel was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// An uncompressed `vmlinux` ELF.
    Elf,
    /// A compressed `bzImage`.
    BzImage,
}

/// A kernel in guest memory, and what the zero page needs to know about it.
#[derive(Debug, Clone, Copy)]
pub struct LoadedKernel {
    /// The image format.
    pub format: KernelFormat,
    /// The 64-bit entry point (RIP of the boot vCPU).
    pub entry: GuestAddress,
    /// Lowest address the image was loaded at.
    pub load_addr: GuestAddress,
    /// End (exclusive) of the memory the kernel needs: ELF segments including
    /// bss, or for a bzImage the larger of its payload and its decompression
    /// footprint (`init_size` from the preferred address).
    pub end: u64,
    /// A bzImage's setup header (with `code32_start` set to the load
    /// address), copied into the zero page; `None` for an ELF.
    pub setup_header: Option<setup_header>,
    /// The PVH (Xen `PHYS32_ENTRY`) entry an ELF announces, if any. Not used
    /// for booting: boxdesk always enters at [`entry`](Self::entry).
    pub pvh_entry: Option<GuestAddress>,
}

/// Loads a vmlinux ELF (tried first) or a bzImage into `mem` above 1 MiB.
/// Fails with [`ArchError::NotAKernel`], [`ArchError::KernelTruncated`],
/// [`ArchError::UnsupportedKernel`] or [`ArchError::KernelPlacement`] for a
/// file that cannot be booted.
pub fn load_kernel(mem: &GuestMemoryMmap, kernel: &mut File) -> Result<LoadedKernel, ArchError> {
    load_kernel_from(mem, kernel)
}

/// [`load_kernel`] from any seekable reader.
pub(crate) fn load_kernel_from<R>(
    mem: &GuestMemoryMmap,
    image: &mut R,
) -> Result<LoadedKernel, ArchError>
where
    R: Read + Seek + ReadVolatile,
{
    let len = image
        .seek(SeekFrom::End(0))
        .map_err(ArchError::KernelRead)?;
    let mut head = [0u8; SETUP_HEADER_END];
    let n = read_at(image, 0, &mut head).map_err(ArchError::KernelRead)?;
    let head = &head[..n];
    if head.starts_with(b"\x7fELF") {
        load_elf(mem, image, head, len)
    } else if head.get(0x202..0x206) == Some(b"HdrS") {
        load_bzimage(mem, image, head, len)
    } else {
        Err(ArchError::NotAKernel)
    }
}

/// Reads as much of `buf` as the file has from `offset`; returns the count.
fn read_at<R: Read + Seek>(image: &mut R, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
    image.seek(SeekFrom::Start(offset))?;
    let mut done = 0;
    while done < buf.len() {
        match image.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    let mut v = [0u8; 2];
    if let Some(s) = b.get(off..off + 2) {
        v.copy_from_slice(s);
    }
    u16::from_le_bytes(v)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut v = [0u8; 4];
    if let Some(s) = b.get(off..off + 4) {
        v.copy_from_slice(s);
    }
    u32::from_le_bytes(v)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(off..off + 8) {
        v.copy_from_slice(s);
    }
    u64::from_le_bytes(v)
}

fn load_elf<R>(
    mem: &GuestMemoryMmap,
    image: &mut R,
    head: &[u8],
    len: u64,
) -> Result<LoadedKernel, ArchError>
where
    R: Read + Seek + ReadVolatile,
{
    if head.len() < ELF_HEADER_LEN {
        return Err(ArchError::truncated(format!(
            "an ELF header needs {ELF_HEADER_LEN} bytes, the file has {len}"
        )));
    }
    if head[4] != 2 {
        return Err(ArchError::UnsupportedKernel(
            "a 32-bit ELF; boxdesk boots a 64-bit x86_64 vmlinux".into(),
        ));
    }
    if head[5] != 1 {
        return Err(ArchError::UnsupportedKernel("a big-endian ELF".into()));
    }
    let machine = u16_at(head, 18);
    if machine != EM_X86_64 {
        return Err(ArchError::UnsupportedKernel(format!(
            "an ELF for machine {machine}, not x86_64 ({EM_X86_64})"
        )));
    }
    let entry = u64_at(head, 24);
    let phoff = u64_at(head, 32);
    let phentsize = u16_at(head, 54);
    let phnum = u16_at(head, 56);
    if u64::from(phentsize) != ELF_PHDR_LEN {
        return Err(ArchError::UnsupportedKernel(format!(
            "ELF program headers of {phentsize} bytes (expected {ELF_PHDR_LEN})"
        )));
    }
    let table_len = u64::from(phnum) * ELF_PHDR_LEN;
    let table_end = phoff.checked_add(table_len).filter(|&end| end <= len);
    if table_end.is_none() || phoff < ELF_HEADER_LEN as u64 {
        return Err(ArchError::truncated(format!(
            "{phnum} program headers at byte {phoff} run past the end of the file ({len} bytes)"
        )));
    }
    let mut table = vec![0u8; table_len as usize];
    let n = read_at(image, phoff, &mut table).map_err(ArchError::KernelRead)?;
    if n < table.len() {
        return Err(ArchError::truncated(
            "the program headers could not be read in full",
        ));
    }

    let low_end = low_ram_end(mem);
    let ram = |what: String| {
        ArchError::KernelPlacement(format!(
            "{what} is outside guest RAM [{HIMEM_START:#x}, {low_end:#x})"
        ))
    };
    if entry < HIMEM_START || entry >= low_end {
        return Err(ram(format!("the entry point {entry:#x}")));
    }
    let mut lowest = u64::MAX;
    for (i, ph) in table.chunks_exact(ELF_PHDR_LEN as usize).enumerate() {
        let kind = u32_at(ph, 0);
        let offset = u64_at(ph, 8);
        let paddr = u64_at(ph, 24);
        let filesz = u64_at(ph, 32);
        let memsz = u64_at(ph, 40);
        if kind != PT_LOAD && kind != PT_NOTE || filesz == 0 {
            continue;
        }
        match offset.checked_add(filesz) {
            Some(end) if end <= len => {}
            _ => {
                return Err(ArchError::truncated(format!(
                    "segment {i} needs bytes {offset}..{} of the file, which has {len}",
                    offset.saturating_add(filesz)
                )))
            }
        }
        if kind == PT_LOAD {
            let end = paddr.checked_add(memsz.max(filesz));
            if paddr < HIMEM_START || end.is_none_or(|end| end > low_end) {
                return Err(ram(format!(
                    "segment {i} [{paddr:#x}, {:#x})",
                    paddr.saturating_add(memsz.max(filesz))
                )));
            }
            lowest = lowest.min(paddr);
        }
    }
    if lowest == u64::MAX {
        return Err(ArchError::UnsupportedKernel(
            "an ELF without loadable segments".into(),
        ));
    }

    let loaded = Elf::load(mem, None, image, Some(GuestAddress(HIMEM_START)))
        .map_err(ArchError::KernelLoad)?;
    let pvh_entry = match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(addr) => Some(addr),
        _ => None,
    };
    Ok(LoadedKernel {
        format: KernelFormat::Elf,
        entry: GuestAddress(entry),
        load_addr: GuestAddress(lowest),
        end: loaded.kernel_end,
        setup_header: None,
        pvh_entry,
    })
}

fn load_bzimage<R>(
    mem: &GuestMemoryMmap,
    image: &mut R,
    head: &[u8],
    len: u64,
) -> Result<LoadedKernel, ArchError>
where
    R: Read + Seek + ReadVolatile,
{
    if head.len() < SETUP_HEADER_END {
        return Err(ArchError::truncated(format!(
            "a bzImage setup header ends at byte {SETUP_HEADER_END}, the file has {len}"
        )));
    }
    let version = u16_at(head, 0x206);
    if version < 0x020c {
        return Err(ArchError::UnsupportedKernel(format!(
            "a bzImage of boot protocol {}.{:02} has no 64-bit entry point (2.12 or later needed)",
            version >> 8,
            version & 0xff
        )));
    }
    if head[0x211] & 1 == 0 {
        return Err(ArchError::UnsupportedKernel(
            "a zImage (loaded below 1 MiB), not a bzImage".into(),
        ));
    }
    if u32::from(u16_at(head, 0x236)) & XLF_KERNEL_64 == 0 {
        return Err(ArchError::UnsupportedKernel(
            "a bzImage without a 64-bit entry point (XLF_KERNEL_64 clear)".into(),
        ));
    }
    let setup_sects = match head[SETUP_HEADER_START] {
        0 => 4,
        n => u64::from(n),
    };
    let setup_len = (setup_sects + 1) * 512;
    let payload_len = u64::from(u32_at(head, 0x1f4)) * 16;
    let needed = setup_len + payload_len.max(1);
    if len < needed {
        return Err(ArchError::truncated(format!(
            "its setup code and payload need {needed} bytes, the file has {len}"
        )));
    }
    let kernel_len = len - setup_len;
    let pref_address = u64_at(head, 0x258);
    let init_size = u64::from(u32_at(head, 0x260));
    let load = HIMEM_START;
    let end = (load + kernel_len).max(pref_address.max(load).saturating_add(init_size));
    let low_end = low_ram_end(mem);
    if end > low_end {
        return Err(ArchError::KernelPlacement(format!(
            "it needs guest RAM up to {end:#x}, low RAM ends at {low_end:#x}"
        )));
    }

    let loaded =
        BzImage::load(mem, Some(GuestAddress(load)), image, None).map_err(ArchError::KernelLoad)?;
    Ok(LoadedKernel {
        format: KernelFormat::BzImage,
        entry: GuestAddress(load + BZIMAGE_64BIT_ENTRY_OFFSET),
        load_addr: GuestAddress(load),
        end,
        setup_header: loaded.setup_header,
        pvh_entry: None,
    })
}

/// Loads the initrd at the top of low RAM: page-aligned, ending at or below
/// both the MMIO hole and [`INITRD_ADDR_LIMIT`], starting at or above 1 MiB.
/// Returns its address and size. Fails with [`ArchError::InitrdTooLarge`]
/// when it does not fit.
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    initrd: &mut File,
) -> Result<(GuestAddress, usize), ArchError> {
    load_initrd_from(mem, initrd)
}

/// [`load_initrd`] from any seekable reader.
pub(crate) fn load_initrd_from<R>(
    mem: &GuestMemoryMmap,
    image: &mut R,
) -> Result<(GuestAddress, usize), ArchError>
where
    R: Seek + ReadVolatile,
{
    let size = image
        .seek(SeekFrom::End(0))
        .map_err(ArchError::InitrdRead)?;
    image.rewind().map_err(ArchError::InitrdRead)?;
    let limit = low_ram_end(mem).min(INITRD_ADDR_LIMIT);
    let too_large = ArchError::InitrdTooLarge {
        size,
        low: HIMEM_START,
        limit,
    };
    let start = match limit.checked_sub(size) {
        Some(top) if top & !(PAGE - 1) >= HIMEM_START => top & !(PAGE - 1),
        _ => return Err(too_large),
    };
    let len = usize::try_from(size).map_err(|_| too_large)?;
    mem.read_exact_volatile_from(GuestAddress(start), image, len)
        .map_err(|e| ArchError::InitrdRead(io::Error::other(e)))?;
    Ok((GuestAddress(start), len))
}

#[cfg(test)]
pub(super) mod tests {
    use std::io::Cursor;

    use super::super::layout::{ram_regions, MMIO_HOLE_START};
    use super::*;

    const MIB: u64 = 1 << 20;

    pub fn memory(bytes: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&ram_regions(bytes)).unwrap()
    }

    /// A minimal x86_64 ELF: one PT_LOAD of `code` at 16 MiB (entry there)
    /// with 4 KiB of bss.
    pub fn tiny_elf(code: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 64 + 56];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2; // ELFCLASS64
        f[5] = 1; // little-endian
        f[6] = 1; // EV_CURRENT
        f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        f[18..20].copy_from_slice(&EM_X86_64.to_le_bytes());
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // e_entry
        f[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        f[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        f[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        f[56..58].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let ph = &mut f[64..];
        ph[0..4].copy_from_slice(&PT_LOAD.to_le_bytes());
        ph[4..8].copy_from_slice(&5u32.to_le_bytes()); // R+X
        ph[8..16].copy_from_slice(&0x1000u64.to_le_bytes()); // p_offset
        ph[16..24].copy_from_slice(&0xffff_ffff_8100_0000u64.to_le_bytes()); // p_vaddr
        ph[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes()); // p_paddr
        ph[32..40].copy_from_slice(&(code.len() as u64).to_le_bytes()); // p_filesz
        ph[40..48].copy_from_slice(&(code.len() as u64 + 0x1000).to_le_bytes()); // p_memsz
        f.resize(0x1000, 0);
        f.extend_from_slice(code);
        f
    }

    /// A minimal bzImage header (protocol 2.15, 64-bit entry) with one setup
    /// sector and `payload` as the protected-mode code.
    pub fn tiny_bzimage(payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 2 * 512];
        f[0x1f1] = 1; // setup_sects
        f[0x1f4..0x1f8].copy_from_slice(&(payload.len() as u32).div_ceil(16).to_le_bytes());
        f[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
        f[0x202..0x206].copy_from_slice(b"HdrS");
        f[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        f[0x211] = 1; // LOADED_HIGH
        f[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes()); // code32_start
        f[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes()); // initrd_addr_max
        f[0x230..0x234].copy_from_slice(&0x20_0000u32.to_le_bytes()); // kernel_alignment
        f[0x234] = 1; // relocatable
        f[0x236..0x238].copy_from_slice(&((XLF_KERNEL_64 | 2) as u16).to_le_bytes());
        f[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes()); // cmdline_size
        f[0x258..0x260].copy_from_slice(&0x100_0000u64.to_le_bytes()); // pref_address
        f[0x260..0x264].copy_from_slice(&0x10_0000u32.to_le_bytes()); // init_size
        f.extend_from_slice(payload);
        f
    }

    fn load(mem: &GuestMemoryMmap, bytes: Vec<u8>) -> Result<LoadedKernel, ArchError> {
        load_kernel_from(mem, &mut Cursor::new(bytes))
    }

    #[test]
    fn load_kernel_loads_an_elf_at_its_physical_address_with_its_entry() {
        let mem = memory(64 * MIB);
        let k = load(&mem, tiny_elf(&[0x90, 0xf4])).unwrap();
        assert_eq!(k.format, KernelFormat::Elf);
        assert_eq!(k.entry, GuestAddress(0x100_0000));
        assert_eq!(k.load_addr, GuestAddress(0x100_0000));
        assert_eq!(k.end, 0x100_0000 + 2 + 0x1000);
        assert!(k.setup_header.is_none());
        let mut code = [0u8; 2];
        mem.read_slice(&mut code, GuestAddress(0x100_0000)).unwrap();
        assert_eq!(code, [0x90, 0xf4]);
    }

    #[test]
    fn load_kernel_loads_a_bzimage_at_1_mib_with_the_64_bit_entry_0x200_in() {
        let mem = memory(64 * MIB);
        let payload: Vec<u8> = (0..0x400u32).map(|i| i as u8).collect();
        let k = load(&mem, tiny_bzimage(&payload)).unwrap();
        assert_eq!(k.format, KernelFormat::BzImage);
        assert_eq!(k.load_addr, GuestAddress(HIMEM_START));
        assert_eq!(k.entry, GuestAddress(HIMEM_START + 0x200));
        assert_eq!(k.end, 0x100_0000 + 0x10_0000);
        let hdr = k.setup_header.unwrap();
        assert_eq!({ hdr.code32_start }, 0x10_0000);
        assert_eq!({ hdr.kernel_alignment }, 0x20_0000);
        let mut back = vec![0u8; payload.len()];
        mem.read_slice(&mut back, GuestAddress(HIMEM_START))
            .unwrap();
        assert_eq!(back, payload);
    }

    #[test]
    fn load_kernel_on_a_garbage_file_says_it_is_not_a_kernel() {
        let mem = memory(64 * MIB);
        let garbage: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        assert!(matches!(load(&mem, garbage), Err(ArchError::NotAKernel)));
        assert!(matches!(load(&mem, Vec::new()), Err(ArchError::NotAKernel)));
        let msg = load(&mem, b"#!/bin/sh\n".to_vec()).unwrap_err().to_string();
        assert!(msg.contains("neither a vmlinux ELF nor a bzImage"), "{msg}");
    }

    #[test]
    fn load_kernel_on_a_truncated_elf_says_it_is_truncated() {
        let mem = memory(64 * MIB);
        let elf = tiny_elf(&[0x90; 0x800]);
        for cut in [10, 63, 64 + 20, 0x1000 + 0x400] {
            let err = load(&mem, elf[..cut].to_vec()).unwrap_err();
            assert!(
                matches!(err, ArchError::KernelTruncated(_)),
                "cut at {cut}: {err}"
            );
            assert!(err.to_string().contains("truncated"));
        }
    }

    #[test]
    fn load_kernel_on_a_truncated_bzimage_says_it_is_truncated() {
        let mem = memory(64 * MIB);
        let image = tiny_bzimage(&[0x90; 0x800]);
        for cut in [0x210, 0x300, 1024, 1024 + 0x400] {
            let err = load(&mem, image[..cut].to_vec()).unwrap_err();
            assert!(
                matches!(err, ArchError::KernelTruncated(_)),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn load_kernel_refuses_a_32_bit_or_foreign_elf_and_an_old_bzimage() {
        let mem = memory(64 * MIB);
        let mut elf32 = tiny_elf(&[0x90]);
        elf32[4] = 1;
        assert!(matches!(
            load(&mem, elf32),
            Err(ArchError::UnsupportedKernel(_))
        ));
        let mut arm = tiny_elf(&[0x90]);
        arm[18..20].copy_from_slice(&183u16.to_le_bytes());
        assert!(matches!(
            load(&mem, arm),
            Err(ArchError::UnsupportedKernel(_))
        ));
        let mut old = tiny_bzimage(&[0x90; 16]);
        old[0x206..0x208].copy_from_slice(&0x020au16.to_le_bytes());
        assert!(matches!(
            load(&mem, old),
            Err(ArchError::UnsupportedKernel(_))
        ));
        let mut no64 = tiny_bzimage(&[0x90; 16]);
        no64[0x236] = 0;
        assert!(matches!(
            load(&mem, no64),
            Err(ArchError::UnsupportedKernel(_))
        ));
    }

    #[test]
    fn load_kernel_refuses_segments_outside_low_ram() {
        let small = memory(8 * MIB); // the ELF wants 16 MiB
        let err = load(&small, tiny_elf(&[0x90])).unwrap_err();
        assert!(matches!(err, ArchError::KernelPlacement(_)), "{err}");
        let mut low = tiny_elf(&[0x90]);
        low[64 + 24..64 + 32].copy_from_slice(&0x8000u64.to_le_bytes()); // over the page tables
        let err = load(&memory(64 * MIB), low).unwrap_err();
        assert!(matches!(err, ArchError::KernelPlacement(_)), "{err}");
        let mut huge = tiny_elf(&[0x90]);
        huge[64 + 40..64 + 48].copy_from_slice(&u64::MAX.to_le_bytes()); // p_memsz
        let err = load(&memory(64 * MIB), huge).unwrap_err();
        assert!(matches!(err, ArchError::KernelPlacement(_)), "{err}");
        let err = load(&memory(8 * MIB), tiny_bzimage(&[0x90; 16])).unwrap_err();
        assert!(matches!(err, ArchError::KernelPlacement(_)), "{err}");
    }

    #[test]
    fn load_kernel_survives_hostile_header_values() {
        let mem = memory(64 * MIB);
        let elf = tiny_elf(&[0x90; 64]);
        for (off, len) in [
            (32, 8),
            (56, 2),
            (64 + 8, 8),
            (64 + 32, 8),
            (64 + 24, 8),
            (24, 8),
        ] {
            for value in [u64::MAX, u64::MAX / 2, 1 << 40, 0] {
                let mut f = elf.clone();
                f[off..off + len].copy_from_slice(&value.to_le_bytes()[..len]);
                let _ = load(&mem, f);
                let mut f = elf.clone();
                f[64..68].copy_from_slice(&PT_NOTE.to_le_bytes());
                f[off..off + len].copy_from_slice(&value.to_le_bytes()[..len]);
                let _ = load(&mem, f);
            }
        }
        let bz = tiny_bzimage(&[0x90; 64]);
        for (off, len) in [(0x1f1, 1), (0x1f4, 4), (0x258, 8), (0x260, 4), (0x214, 4)] {
            for value in [u64::MAX, 0, 1 << 31] {
                let mut f = bz.clone();
                f[off..off + len].copy_from_slice(&value.to_le_bytes()[..len]);
                let _ = load(&mem, f);
            }
        }
    }

    #[test]
    fn load_kernel_reads_a_real_file() {
        let path = std::env::temp_dir().join(format!("scratch-arch-kernel-{}", std::process::id()));
        std::fs::write(&path, tiny_elf(&[0xf4])).unwrap();
        let mut file = File::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let k = load_kernel(&memory(64 * MIB), &mut file).unwrap();
        assert_eq!(k.entry, GuestAddress(0x100_0000));
    }

    #[test]
    fn initrd_goes_page_aligned_at_the_top_of_low_ram() {
        let mem = memory(64 * MIB);
        let data = vec![0xabu8; 5000];
        let (addr, size) = load_initrd_from(&mem, &mut Cursor::new(data.clone())).unwrap();
        assert_eq!(size, 5000);
        assert_eq!(addr.0 % 4096, 0);
        assert!(addr.0 + 5000 <= 64 * MIB && addr.0 + 5000 + 4096 > 64 * MIB);
        let mut back = vec![0u8; 5000];
        mem.read_slice(&mut back, addr).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn initrd_of_a_large_guest_stays_below_the_hole_and_the_initrd_limit() {
        let mem = memory(4 << 30);
        let (addr, size) = load_initrd_from(&mem, &mut Cursor::new(vec![1u8; 8192])).unwrap();
        assert!(addr.0 + size as u64 <= INITRD_ADDR_LIMIT);
        assert!(addr.0 + size as u64 <= MMIO_HOLE_START);
        assert_eq!(addr.0, INITRD_ADDR_LIMIT - 8192);
    }

    #[test]
    fn initrd_too_large_is_an_error() {
        let mem = memory(16 * MIB);
        let err =
            load_initrd_from(&mem, &mut Cursor::new(vec![0u8; 15 * MIB as usize + 1])).unwrap_err();
        assert!(matches!(err, ArchError::InitrdTooLarge { .. }), "{err}");
        assert!(err.to_string().contains("does not fit"));
        let tiny = memory(MIB);
        let err = load_initrd_from(&tiny, &mut Cursor::new(vec![0u8; 1])).unwrap_err();
        assert!(matches!(err, ArchError::InitrdTooLarge { .. }), "{err}");
    }

    /// Real kernels named in `BOXDESK_TEST_KERNELS` (colon-separated paths
    /// to vmlinux or bzImage files) load, and so many truncations of each
    /// fail cleanly. Skipped when the variable is unset.
    #[test]
    fn load_kernel_loads_real_kernels_and_refuses_their_truncations() {
        let Ok(paths) = std::env::var("BOXDESK_TEST_KERNELS") else {
            eprintln!("skipped: BOXDESK_TEST_KERNELS is unset");
            return;
        };
        let mem = memory(512 * MIB);
        for path in paths.split(':').filter(|p| !p.is_empty()) {
            let bytes = std::fs::read(path).unwrap();
            let k = load(&mem, bytes.clone()).unwrap_or_else(|e| panic!("{path}: {e}"));
            eprintln!("{path}: {k:x?}");
            assert!(k.entry.0 >= HIMEM_START && k.end > k.entry.0);
            // Cut inside the loaded data: an ELF may lose its tail (symbols,
            // section headers) and a bzImage its appended signature and still
            // boot.
            let last = match k.format {
                KernelFormat::Elf => 3 << 20,
                KernelFormat::BzImage => bytes.len() / 2,
            };
            for cut in [1, 100, 0x1f0, 0x300, 4096, last] {
                let err = load(&mem, bytes[..cut].to_vec()).unwrap_err();
                assert!(
                    matches!(err, ArchError::KernelTruncated(_) | ArchError::NotAKernel),
                    "{path} cut at {cut}: {err}"
                );
            }
        }
    }
}
