//! Guest memory: mapping, sharing with the host, holes, read-only regions,
//! the dirty log, and lazily backed RAM.

#[cfg(target_arch = "aarch64")]
use crate::a64;
use crate::support::{rss_bytes, Skip};
#[cfg(target_arch = "x86_64")]
use crate::x86::{self, Asm, Mode, MODES};
use boxdesk_hv::{MapFlags, Vm};
use vm_memory::{Bytes, MemoryRegionAddress};

/// A second region, after a hole of 64 KiB above the default RAM.
const SECOND: u64 = 0x3_0000;
const SECOND_SIZE: usize = 0x1_0000;
/// In the hole between RAM and [`SECOND`].
const HOLE: u64 = 0x2_8000;

conformance! {
    fn what_the_guest_writes_the_host_reads_and_what_the_host_writes_the_guest_reads<H>(hv: &H) {
        #[cfg(target_arch = "x86_64")]
        for mode in MODES {
            let mut a = Asm::new(mode);
            a.mov_addr(x86::DATA) // mov bx, DATA
                .load(4) // mov eax, [bx]
                .add_acc(4, 1) // add eax, 1
                .store(4) // mov [bx], eax
                .mov_dx(0x10)
                .out_dx(1) // out dx, al: done
                .hlt();
            let mut g = x86::guest(hv, mode, &a.bytes, &[]);
            let ram = &g.regions[0].0;
            ram.write_obj(0xcafe_f00du32, MemoryRegionAddress(x86::DATA)).unwrap();
            g.expect_pio_out(0x10, &[0x0e]);
            let got: u32 = g.regions[0].0.read_obj(MemoryRegionAddress(x86::DATA)).unwrap();
            assert_eq!(got, 0xcafe_f00e, "{mode:?}");
        }
        #[cfg(target_arch = "aarch64")]
        {
            let mut code = a64::mov64(0, a64::DATA);
            code.extend(a64::mov64(2, a64::MMIO));
            code.extend([
                a64::ldr(4, 1, 0), // ldr w1, [x0]
                0x1100_0421,       // add w1, w1, #1
                a64::str(4, 1, 0), // str w1, [x0]
                a64::str(4, 1, 2), // str w1, [x2]: done
                a64::B_SELF,
            ]);
            let mut g = a64::guest(hv, &code, &[]);
            g.regions[0].0.write_obj(0xcafe_f00du32, MemoryRegionAddress(a64::DATA)).unwrap();
            g.expect_mmio_write(a64::MMIO, &0xcafe_f00eu32.to_le_bytes());
            let got: u32 = g.regions[0].0.read_obj(MemoryRegionAddress(a64::DATA)).unwrap();
            assert_eq!(got, 0xcafe_f00e);
        }
        Ok(())
    }
}

conformance! {
    fn two_regions_work_and_the_hole_between_them_exits_as_mmio<H>(hv: &H) {
        let second = [(SECOND, SECOND_SIZE, Default::default())];
        #[cfg(target_arch = "x86_64")]
        let g = {
            let mode = Mode::Protected;
            let mut a = Asm::new(mode);
            a.mov_acc(4, 0x1111_1111).mov_addr(x86::DATA).store(4) // [DATA] = 0x11111111
                .mov_acc(4, 0x2222_2222).mov_addr(SECOND + 0x100).store(4) // [SECOND+0x100] = 0x22222222
                .mov_addr(HOLE).load(4) // eax = [HOLE]
                .mov_dx(0x10).out_dx(4) // out dx, eax
                .hlt();
            let mut g = x86::guest(hv, mode, &a.bytes, &second);
            g.answer_mmio_read(HOLE, &[1, 2, 3, 4]);
            g.expect_pio_out(0x10, &[1, 2, 3, 4]);
            g
        };
        #[cfg(target_arch = "aarch64")]
        let g = {
            let mut code = a64::mov64(1, 0x1111_1111);
            code.extend(a64::mov64(0, a64::DATA));
            code.push(a64::str(4, 1, 0)); // str w1, [DATA]
            code.extend(a64::mov64(1, 0x2222_2222));
            code.extend(a64::mov64(0, SECOND + 0x100));
            code.push(a64::str(4, 1, 0)); // str w1, [SECOND + 0x100]
            code.extend(a64::mov64(0, HOLE));
            code.push(a64::ldr(4, 1, 0)); // ldr w1, [HOLE]
            code.extend(a64::mov64(0, a64::MMIO));
            code.extend([a64::str(4, 1, 0), a64::B_SELF]); // str w1, [MMIO]
            let mut g = a64::guest(hv, &code, &second);
            g.answer_mmio_read(HOLE, &[1, 2, 3, 4]);
            g.expect_mmio_write(a64::MMIO, &[1, 2, 3, 4]);
            g
        };
        let first: u32 = g.regions[0].0.read_obj(MemoryRegionAddress(0xa000)).unwrap();
        let second: u32 = g.regions[1].0.read_obj(MemoryRegionAddress(0x100)).unwrap();
        assert_eq!((first, second), (0x1111_1111, 0x2222_2222));
        Ok(())
    }
}

conformance! {
    fn an_unmapped_region_turns_into_mmio<H>(hv: &H) {
        let second = [(SECOND, SECOND_SIZE, Default::default())];
        #[cfg(target_arch = "x86_64")]
        let mut g = {
            let mut a = Asm::new(Mode::Long);
            a.mov_addr(SECOND).mov_acc(4, 7).store(4).hlt(); // mov [SECOND], 7; hlt
            x86::guest(hv, Mode::Long, &a.bytes, &second)
        };
        #[cfg(target_arch = "aarch64")]
        let mut g = {
            let mut code = a64::mov64(0, SECOND);
            code.extend(a64::mov64(1, 7));
            code.extend([a64::str(4, 1, 0), a64::B_SELF]); // str w1, [SECOND]
            a64::guest(hv, &code, &second)
        };
        g.vm.unmap_memory(g.regions[1].1).unwrap();
        g.expect_mmio_write(SECOND, &[7, 0, 0, 0]);
        Ok(())
    }
}

conformance! {
    fn a_guest_write_to_read_only_memory_exits_as_mmio_and_leaves_it_unchanged<H>(hv: &H) {
        if !hv.capabilities().read_only_memory {
            return Err(Skip("the backend has no read-only memory".into()));
        }
        let flags = boxdesk_hv::MapFlags { read_only: true, log_dirty: false };
        let rom = [(SECOND, SECOND_SIZE, flags)];
        #[cfg(target_arch = "x86_64")]
        let mut g = {
            let mut a = Asm::new(Mode::Protected);
            a.mov_addr(SECOND).load(4) // mov eax, [SECOND]
                .mov_dx(0x10).out_dx(4) // out dx, eax: what the rom holds
                .mov_acc(4, 0xdead).store(4) // mov [SECOND], 0xdead
                .hlt();
            x86::guest(hv, Mode::Protected, &a.bytes, &rom)
        };
        #[cfg(target_arch = "aarch64")]
        let mut g = {
            let mut code = a64::mov64(0, SECOND);
            code.extend(a64::mov64(2, a64::MMIO));
            code.extend(a64::mov64(3, 0xdead));
            code.extend([
                a64::ldr(4, 1, 0), // ldr w1, [SECOND]
                a64::str(4, 1, 2), // str w1, [MMIO]: what the rom holds
                a64::str(4, 3, 0), // str w3, [SECOND]
                a64::B_SELF,
            ]);
            a64::guest(hv, &code, &rom)
        };
        g.regions[1].0.write_obj(0x5a5a_5a5au32, MemoryRegionAddress(0)).unwrap();
        #[cfg(target_arch = "x86_64")]
        g.expect_pio_out(0x10, &[0x5a; 4]);
        #[cfg(target_arch = "aarch64")]
        g.expect_mmio_write(a64::MMIO, &[0x5a; 4]);
        g.expect_mmio_write(SECOND, &[0xad, 0xde, 0, 0]);
        let kept: u32 = g.regions[1].0.read_obj(MemoryRegionAddress(0)).unwrap();
        assert_eq!(kept, 0x5a5a_5a5a);
        Ok(())
    }
}

conformance! {
    fn the_dirty_log_reports_exactly_the_pages_the_guest_wrote<H>(hv: &H) {
        if !hv.capabilities().dirty_log {
            return Err(Skip("the backend has no dirty log".into()));
        }
        let page = hv.capabilities().page_size;
        let logged = [(SECOND, 8 * page as usize, MapFlags { read_only: false, log_dirty: true })];
        let targets = [SECOND, SECOND + 2 * page + 0x10, SECOND + 6 * page - 4];
        #[cfg(target_arch = "x86_64")]
        let g = {
            // Protected mode: no page tables whose accessed bits could be written.
            let mut a = Asm::new(Mode::Protected);
            a.mov_acc(4, 0xabcd_ef01);
            for t in targets {
                a.mov_addr(t).store(4); // mov [t], eax
            }
            a.mov_addr(SECOND + page).load(4); // a read does not dirty
            a.mov_dx(0x10).out_dx(1).hlt();
            let mut g = x86::guest(hv, Mode::Protected, &a.bytes, &logged);
            g.expect_pio_out(0x10, &[0]);
            g
        };
        #[cfg(target_arch = "aarch64")]
        let g = {
            let mut code = a64::mov64(1, 0xabcd_ef01);
            for t in targets {
                code.extend(a64::mov64(0, t));
                code.push(a64::str(4, 1, 0)); // str w1, [t]
            }
            code.extend(a64::mov64(0, SECOND + page));
            code.push(a64::ldr(4, 2, 0)); // a read does not dirty
            code.extend(a64::mov64(0, a64::MMIO));
            code.extend([a64::str(4, 1, 0), a64::B_SELF]);
            let mut g = a64::guest(hv, &code, &logged);
            g.expect_mmio_write(a64::MMIO, &0xabcd_ef01u32.to_le_bytes());
            g
        };
        let slot = g.regions[1].1;
        let log = g.vm.dirty_log(slot).unwrap();
        let dirty: Vec<u64> = log.dirty_pages().collect();
        assert_eq!(dirty, [SECOND, SECOND + 2 * page, SECOND + 5 * page]);
        assert_eq!(g.vm.dirty_log(slot).unwrap().dirty_pages().count(), 0, "reading clears it");
        let unlogged = g.regions[0].1;
        assert!(g.vm.dirty_log(unlogged).is_err(), "a slot without logging has no log");
        Ok(())
    }
}

conformance! {
    fn a_1_gib_guest_ram_costs_no_resident_memory_until_touched<H>(hv: &H) {
        const GIB: u64 = 1 << 30;
        let Some(before) = rss_bytes() else {
            return Err(Skip("no resident-set figure on this OS".into()));
        };
        let big = [(GIB, GIB as usize, MapFlags::default())];
        let target = GIB + 0x1234_5678;
        #[cfg(target_arch = "x86_64")]
        let g = {
            let mut a = Asm::new(Mode::Long);
            a.mov_addr(target).mov_acc(8, 0x600d_600d).store(8) // mov [1 GiB + x], rax
                .mov_dx(0x10).out_dx(1).hlt();
            let mut g = x86::guest(hv, Mode::Long, &a.bytes, &big);
            g.expect_pio_out(0x10, &[0x0d]);
            g
        };
        #[cfg(target_arch = "aarch64")]
        let g = {
            let mut code = a64::mov64(0, target);
            code.extend(a64::mov64(1, 0x600d_600d));
            code.extend(a64::mov64(2, a64::MMIO));
            code.extend([a64::str(8, 1, 0), a64::str(4, 1, 2), a64::B_SELF]);
            let mut g = a64::guest(hv, &code, &big);
            g.expect_mmio_write(a64::MMIO, &0x600d_600du32.to_le_bytes());
            g
        };
        let after = rss_bytes().unwrap();
        let grown = after.saturating_sub(before);
        assert!(grown < 64 << 20, "1 GiB of guest RAM made RSS grow by {} MiB", grown >> 20);
        let got: u64 = g.regions[1].0.read_obj(MemoryRegionAddress(target - GIB)).unwrap();
        assert_eq!(got, 0x600d_600d);
        Ok(())
    }
}
