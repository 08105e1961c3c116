//! Loading an arm64 `Image` and an initrd into guest RAM, per the kernel's
//! `Documentation/arch/arm64/booting.rst`.
//!
//! The 64-byte `Image` header says where the kernel goes (`text_offset` from
//! a 2 MiB-aligned base) and how much RAM it takes (`image_size`, BSS
//! included). linux-loader's PE loader does this only when compiled for an
//! aarch64 host; parsing the header here keeps the checks (and their tests)
//! on every host and the errors ours. The kernel goes at the start of RAM,
//! the FDT in the last 2 MiB block, the initrd just below the FDT.

use std::io::{self, Read, Seek, SeekFrom};

use vm_memory::{Bytes, GuestAddress, GuestMemory, GuestMemoryMmap, ReadVolatile};

use super::layout::{FDT_MAX_SIZE, RAM_START};
use super::ArchError;

/// `"ARM\x64"`, little-endian, at offset 56.
pub const IMAGE_MAGIC: u32 = 0x644d_5241;
/// The header's size.
pub const HEADER_LEN: usize = 64;
/// `text_offset` of kernels before 3.17, whose `image_size` is 0.
const LEGACY_TEXT_OFFSET: u64 = 0x8_0000;
/// Initrd placement granule (HVF's page size; also fine for 4 KiB pages).
const PAGE: u64 = 0x4000;

/// The fields of an `Image` header that matter for loading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// Offset of the kernel from its 2 MiB-aligned base.
    pub text_offset: u64,
    /// Bytes of RAM the kernel occupies from its load address.
    pub image_size: u64,
    /// Bit 0: big-endian kernel; bits 1–2: page size; bit 3: may be placed
    /// anywhere in RAM.
    pub flags: u64,
}

impl ImageHeader {
    /// Parses and checks the header of a file of `file_len` bytes.
    pub fn parse(h: &[u8; HEADER_LEN], file_len: u64) -> Result<Self, ArchError> {
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or_default());
        let magic = u32::from_le_bytes(h[56..60].try_into().unwrap_or_default());
        if magic != IMAGE_MAGIC {
            return Err(ArchError::NotAnImage { found: magic });
        }
        let (mut text_offset, mut image_size, flags) = (u64_at(8), u64_at(16), u64_at(24));
        if image_size == 0 {
            // Before 3.17: text_offset is unreliable and the size unknown;
            // the file's length (no BSS) is the best lower bound.
            text_offset = LEGACY_TEXT_OFFSET;
            image_size = file_len;
        }
        if flags & 1 != 0 {
            return Err(ArchError::UnsupportedKernel(
                "a big-endian kernel (header flags bit 0)".into(),
            ));
        }
        if image_size < file_len {
            return Err(ArchError::UnsupportedKernel(format!(
                "the header's image_size {image_size:#x} is smaller than the file ({file_len:#x} bytes)"
            )));
        }
        if text_offset >= super::layout::KERNEL_ALIGN || text_offset % 4096 != 0 {
            return Err(ArchError::UnsupportedKernel(format!(
                "text_offset {text_offset:#x} is not a page-aligned offset within 2 MiB"
            )));
        }
        Ok(Self {
            text_offset,
            image_size,
            flags,
        })
    }
}

/// Where the kernel went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedKernel {
    /// Its entry point (the load address: the header's first instruction).
    pub entry: GuestAddress,
    /// The end of its `image_size`: nothing else may go below this.
    pub end: u64,
}

/// Where the FDT goes in RAM of `mem_bytes`: the last 2 MiB block.
pub fn fdt_address(mem_bytes: u64) -> u64 {
    RAM_START + mem_bytes.saturating_sub(FDT_MAX_SIZE)
}

/// Loads the `Image` in `kernel` at the start of RAM (+ `text_offset`).
pub fn load_kernel<R>(mem: &GuestMemoryMmap, kernel: &mut R) -> Result<LoadedKernel, ArchError>
where
    R: Read + Seek + ReadVolatile,
{
    let file_len = kernel
        .seek(SeekFrom::End(0))
        .map_err(ArchError::KernelRead)?;
    kernel.rewind().map_err(ArchError::KernelRead)?;
    let mut h = [0u8; HEADER_LEN];
    match kernel.read_exact(&mut h) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(ArchError::NotAnImage { found: 0 })
        }
        Err(e) => return Err(ArchError::KernelRead(e)),
    }
    let header = ImageHeader::parse(&h, file_len)?;
    kernel.rewind().map_err(ArchError::KernelRead)?;

    let start = RAM_START + header.text_offset;
    let limit = fdt_address(ram_bytes(mem));
    let end = start
        .checked_add(header.image_size)
        .filter(|e| *e <= limit)
        .ok_or(ArchError::KernelTooLarge {
            start,
            end: start.saturating_add(header.image_size),
            limit,
        })?;
    let len =
        usize::try_from(file_len).map_err(|_| ArchError::KernelTooLarge { start, end, limit })?;
    mem.read_exact_volatile_from(GuestAddress(start), kernel, len)
        .map_err(|e| ArchError::KernelRead(io::Error::other(e)))?;
    Ok(LoadedKernel {
        entry: GuestAddress(start),
        end,
    })
}

/// Loads the initrd just below the FDT, above the kernel's `end`. Returns its
/// address and size.
pub fn load_initrd<R>(
    mem: &GuestMemoryMmap,
    initrd: &mut R,
    kernel_end: u64,
) -> Result<(GuestAddress, usize), ArchError>
where
    R: Seek + ReadVolatile,
{
    let size = initrd
        .seek(SeekFrom::End(0))
        .map_err(ArchError::InitrdRead)?;
    initrd.rewind().map_err(ArchError::InitrdRead)?;
    let limit = fdt_address(ram_bytes(mem));
    let too_large = ArchError::InitrdTooLarge {
        size,
        low: kernel_end,
        limit,
    };
    let start = match limit.checked_sub(size) {
        Some(top) if top & !(PAGE - 1) >= kernel_end => top & !(PAGE - 1),
        _ => return Err(too_large),
    };
    let len = usize::try_from(size).map_err(|_| too_large)?;
    mem.read_exact_volatile_from(GuestAddress(start), initrd, len)
        .map_err(|e| ArchError::InitrdRead(io::Error::other(e)))?;
    Ok((GuestAddress(start), len))
}

/// The bytes of RAM from [`RAM_START`] (the layout has one region).
fn ram_bytes(mem: &GuestMemoryMmap) -> u64 {
    mem.last_addr()
        .0
        .saturating_add(1)
        .saturating_sub(RAM_START)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use vm_memory::Bytes;

    use super::super::layout::ram_regions;
    use super::*;

    const MIB: u64 = 1 << 20;

    fn memory(bytes: u64) -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&ram_regions(bytes)).unwrap()
    }

    /// An Image of `len` bytes (at least the header) claiming `image_size`.
    fn image(len: usize, text_offset: u64, image_size: u64) -> Vec<u8> {
        let mut v = vec![0u8; len.max(HEADER_LEN)];
        v[0..4].copy_from_slice(&0x1400_0010u32.to_le_bytes()); // b +64
        v[8..16].copy_from_slice(&text_offset.to_le_bytes());
        v[16..24].copy_from_slice(&image_size.to_le_bytes());
        v[24..32].copy_from_slice(&0b1010u64.to_le_bytes()); // LE, 4K, anywhere
        v[56..60].copy_from_slice(&IMAGE_MAGIC.to_le_bytes());
        for (i, b) in v.iter_mut().enumerate().skip(HEADER_LEN) {
            *b = i as u8;
        }
        v
    }

    #[test]
    fn the_kernel_lands_at_ram_start_plus_text_offset_byte_for_byte() {
        let mem = memory(64 * MIB);
        let img = image(3 * MIB as usize, 0, 5 * MIB);
        let k = load_kernel(&mem, &mut Cursor::new(img.clone())).unwrap();
        assert_eq!(k.entry, GuestAddress(RAM_START));
        assert_eq!(k.end, RAM_START + 5 * MIB, "image_size, BSS included");
        let mut back = vec![0u8; img.len()];
        mem.read_slice(&mut back, GuestAddress(RAM_START)).unwrap();
        assert_eq!(back, img);

        let k = load_kernel(&mem, &mut Cursor::new(image(4096, 0x8_0000, 8192))).unwrap();
        assert_eq!(k.entry, GuestAddress(RAM_START + 0x8_0000));
    }

    #[test]
    fn a_bad_magic_or_a_short_file_is_not_an_image() {
        let mem = memory(64 * MIB);
        let mut img = image(4096, 0, 8192);
        img[56] ^= 1;
        let e = load_kernel(&mem, &mut Cursor::new(img)).unwrap_err();
        assert!(
            matches!(e, ArchError::NotAnImage { found } if found == IMAGE_MAGIC ^ 1),
            "{e}"
        );
        let e = load_kernel(&mem, &mut Cursor::new(vec![0x7f, b'E', b'L', b'F'])).unwrap_err();
        assert!(matches!(e, ArchError::NotAnImage { found: 0 }), "{e}");
        assert!(e.to_string().contains("not an arm64 Image"));
    }

    #[test]
    fn big_endian_kernels_and_impossible_headers_are_refused() {
        let mem = memory(64 * MIB);
        let mut be = image(4096, 0, 8192);
        be[24] |= 1;
        let e = load_kernel(&mem, &mut Cursor::new(be)).unwrap_err();
        assert!(e.to_string().contains("big-endian"), "{e}");
        let e = load_kernel(&mem, &mut Cursor::new(image(8192, 0, 4096))).unwrap_err();
        assert!(e.to_string().contains("smaller than the file"), "{e}");
        let e = load_kernel(&mem, &mut Cursor::new(image(4096, 0x20_0000, 8192))).unwrap_err();
        assert!(e.to_string().contains("text_offset"), "{e}");
        let e = load_kernel(&mem, &mut Cursor::new(image(4096, 0x123, 8192))).unwrap_err();
        assert!(e.to_string().contains("text_offset"), "{e}");
    }

    #[test]
    fn a_kernel_that_would_reach_the_fdt_block_is_refused_with_the_numbers() {
        let mem = memory(64 * MIB);
        let e = load_kernel(&mem, &mut Cursor::new(image(4096, 0, 63 * MIB))).unwrap_err();
        let ArchError::KernelTooLarge { start, end, limit } = e else {
            panic!("{e}")
        };
        assert_eq!(
            (start, end, limit),
            (RAM_START, RAM_START + 63 * MIB, RAM_START + 62 * MIB)
        );
        let e = load_kernel(&mem, &mut Cursor::new(image(4096, 0, u64::MAX))).unwrap_err();
        assert!(matches!(e, ArchError::KernelTooLarge { .. }), "{e}");
    }

    #[test]
    fn a_legacy_header_without_image_size_loads_at_the_old_offset() {
        let mem = memory(64 * MIB);
        let k = load_kernel(&mem, &mut Cursor::new(image(8192, 0x1000, 0))).unwrap();
        assert_eq!(k.entry, GuestAddress(RAM_START + 0x8_0000));
        assert_eq!(k.end, RAM_START + 0x8_0000 + 8192);
    }

    #[test]
    fn the_initrd_goes_below_the_fdt_and_never_over_the_kernel() {
        let mem = memory(64 * MIB);
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let (at, len) =
            load_initrd(&mem, &mut Cursor::new(data.clone()), RAM_START + 8 * MIB).unwrap();
        assert_eq!(len, data.len());
        assert_eq!(at.0 % PAGE, 0);
        assert!(at.0 + len as u64 <= fdt_address(64 * MIB));
        assert!(fdt_address(64 * MIB) - (at.0 + len as u64) < PAGE);
        let mut back = vec![0u8; len];
        mem.read_slice(&mut back, at).unwrap();
        assert_eq!(back, data);

        let big = vec![0u8; 60 * MIB as usize];
        let e = load_initrd(&mem, &mut Cursor::new(big), RAM_START + 8 * MIB).unwrap_err();
        let ArchError::InitrdTooLarge { size, low, limit } = e else {
            panic!("{e}")
        };
        assert_eq!(
            (size, low, limit),
            (60 * MIB, RAM_START + 8 * MIB, RAM_START + 62 * MIB)
        );
    }

    #[test]
    fn the_fdt_takes_the_last_two_mib_of_ram() {
        assert_eq!(fdt_address(64 * MIB), RAM_START + 62 * MIB);
        assert_eq!(fdt_address(1 << 30) % FDT_MAX_SIZE, 0);
    }
}
