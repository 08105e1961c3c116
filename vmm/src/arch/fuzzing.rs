//! The kernel loaders with hostile files, for the fuzz target
//! `kernel_loaders` (`fuzz/`) and the replay of its regressions in `cargo
//! test`: [`run`] loads the input as a kernel or an initrd into a real
//! `GuestMemoryMmap` laid out as the VMM lays out a guest's RAM.
//!
//! Byte 0 picks the loader (modulo 4): x86_64 vmlinux ELF or bzImage (by
//! content, as the VMM picks), x86_64 initrd placement, the arm64 `Image`
//! (header and placement), arm64 initrd placement above a kernel end taken
//! from bytes 2–5; byte 1 the guest's RAM (16–79 MiB). The rest is the
//! file. Every outcome is an `Ok` inside RAM or an `ArchError`; anything
//! else (a panic, a write outside RAM) is a bug.

use std::io::Cursor;

use vm_memory::GuestMemoryMmap;

use super::aarch64;

const MIB: u64 = 1 << 20;

/// Feeds one input through the loader it picks; panics only on a bug.
pub fn run(data: &[u8]) {
    let (Some(&which), Some(&ram)) = (data.first(), data.get(1)) else {
        return;
    };
    let mem_bytes = (16 + u64::from(ram % 64)) * MIB;
    let file = data.get(2..).unwrap_or_default();
    match which % 4 {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        0 => {
            use super::x86_64::{layout, loader};
            use vm_memory::GuestMemory;
            let Ok(mem) = GuestMemoryMmap::from_ranges(&layout::ram_regions(mem_bytes)) else {
                return;
            };
            if let Ok(k) = loader::load_kernel_from(&mem, &mut Cursor::new(file)) {
                assert!(mem.address_in_range(k.load_addr));
                assert!(k.end <= mem.last_addr().0 + 1);
            }
        }
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        1 => {
            use super::x86_64::{layout, loader};
            use vm_memory::{Address, GuestMemory};
            let Ok(mem) = GuestMemoryMmap::from_ranges(&layout::ram_regions(mem_bytes)) else {
                return;
            };
            if let Ok((at, len)) = loader::load_initrd_from(&mem, &mut Cursor::new(file)) {
                assert_eq!(len, file.len());
                assert!(at.0 >= MIB && at.0 % 4096 == 0);
                assert!(at
                    .checked_add(len as u64)
                    .is_some_and(|end| end.0 <= mem.last_addr().0 + 1));
            }
        }
        2 => {
            let regions = aarch64::layout::ram_regions(mem_bytes);
            let Ok(mem) = GuestMemoryMmap::from_ranges(&regions) else {
                return;
            };
            if let Ok(k) = aarch64::loader::load_kernel(&mem, &mut Cursor::new(file)) {
                assert!(k.entry.0 >= aarch64::layout::RAM_START);
                assert!(k.end <= aarch64::loader::fdt_address(mem_bytes));
            }
        }
        3 => {
            let Ok(mem) = GuestMemoryMmap::from_ranges(&aarch64::layout::ram_regions(mem_bytes))
            else {
                return;
            };
            let mut end = [0u8; 4];
            for (d, s) in end.iter_mut().zip(file) {
                *d = *s;
            }
            let kernel_end = aarch64::layout::RAM_START + u64::from(u32::from_le_bytes(end));
            if let Ok((at, len)) =
                aarch64::loader::load_initrd(&mem, &mut Cursor::new(file), kernel_end)
            {
                assert!(at.0 >= kernel_end && at.0 % 4096 == 0);
                assert!(at.0 + len as u64 <= aarch64::loader::fdt_address(mem_bytes));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    /// The fuzz target's saved inputs (`fuzz/regressions/kernel_loaders`),
    /// replayed on every `cargo test`.
    #[test]
    fn every_saved_hostile_kernel_and_initrd_loads_or_is_refused_without_a_panic() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions/kernel_loaders");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            super::run(&std::fs::read(entry.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0);
    }
}
