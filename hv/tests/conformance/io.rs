//! Port I/O and MMIO exits, with data both ways.

#[cfg(target_arch = "aarch64")]
use crate::a64;
#[cfg(target_arch = "aarch64")]
use crate::support::Skip;
#[cfg(target_arch = "x86_64")]
use crate::x86::{self, Asm, Mode, MODES};
use boxdesk_hv::{HvError, Vcpu, VcpuExit};

conformance! {
    fn port_io_moves_data_both_ways_in_real_protected_and_long_mode<H>(hv: &H) {
        #[cfg(target_arch = "aarch64")]
        return Err(Skip("aarch64 has no port i/o".into()));
        #[cfg(target_arch = "x86_64")]
        {
            for mode in MODES {
                let mut a = Asm::new(mode);
                a.mov_dx(0x3f8);
                for size in [1, 2, 4] {
                    a.in_dx(size).add_acc(size, 1).out_dx(size); // in; add 1; out
                }
                a.hlt();
                let mut g = x86::guest(hv, mode, &a.bytes, &[]);
                g.answer_pio_in(0x3f8, &[0x41]);
                g.expect_pio_out(0x3f8, &[0x42]);
                g.answer_pio_in(0x3f8, &[0x34, 0x12]);
                g.expect_pio_out(0x3f8, &[0x35, 0x12]);
                g.answer_pio_in(0x3f8, &[0xfe, 0xff, 0xff, 0x7f]);
                g.expect_pio_out(0x3f8, &[0xff, 0xff, 0xff, 0x7f]);
                assert_eq!(g.run(), VcpuExit::Hlt, "{mode:?}");
            }
            Ok(())
        }
    }
}

conformance! {
    fn mmio_of_1_2_4_and_8_bytes_carries_data_both_ways<H>(hv: &H) {
        let written = 0x8877_6655_4433_2211u64;
        let answer = 0x0102_0304_0506_0708u64;
        #[cfg(target_arch = "x86_64")]
        for mode in MODES {
            let sizes: &[usize] = if mode == Mode::Long { &[1, 2, 4, 8] } else { &[1, 2, 4] };
            for &size in sizes {
                let mut a = Asm::new(mode);
                a.mov_mmio_addr(0x10) // mov bx, MMIO + 0x10
                    .mov_acc(size, written) // mov acc, written
                    .store(size) // mov [bx], acc
                    .load(size) // mov acc, [bx]
                    .mov_dx(0x80)
                    .out_dx(size.min(4)); // out dx, acc
                if size == 8 {
                    a.shr_rax_32().out_dx(4); // shr rax, 32; out dx, eax
                }
                a.hlt();
                let mut g = x86::guest(hv, mode, &a.bytes, &[]);
                let addr = mode.mmio(0x10);
                g.expect_mmio_write(addr, &written.to_le_bytes()[..size]);
                g.answer_mmio_read(addr, &answer.to_le_bytes()[..size]);
                g.expect_pio_out(0x80, &answer.to_le_bytes()[..size.min(4)]);
                if size == 8 {
                    g.expect_pio_out(0x80, &answer.to_le_bytes()[4..]);
                }
                assert_eq!(g.run(), VcpuExit::Hlt, "{mode:?} size {size}");
            }
        }
        #[cfg(target_arch = "aarch64")]
        for size in [1, 2, 4, 8] {
            let mut code = a64::mov64(0, a64::MMIO + 0x10); // mov x0, MMIO + 0x10
            code.extend(a64::mov64(1, written)); // mov x1, written
            code.extend(a64::mov64(2, a64::MMIO + 0x80)); // mov x2, MMIO + 0x80
            code.push(a64::str(size, 1, 0)); // str{b,h} w1|x1, [x0]
            code.push(a64::ldr(size, 3, 0)); // ldr{b,h} w3|x3, [x0]
            code.push(a64::str(8, 3, 2)); // str x3, [x2]
            code.push(a64::B_SELF);
            let mut g = a64::guest(hv, &code, &[]);
            g.expect_mmio_write(a64::MMIO + 0x10, &written.to_le_bytes()[..size]);
            g.answer_mmio_read(a64::MMIO + 0x10, &answer.to_le_bytes()[..size]);
            let mut loaded = [0u8; 8];
            loaded[..size].copy_from_slice(&answer.to_le_bytes()[..size]);
            g.expect_mmio_write(a64::MMIO + 0x80, &loaded);
        }
        Ok(())
    }
}

conformance! {
    fn a_read_completion_of_the_wrong_length_is_refused_and_a_right_one_accepted<H>(hv: &H) {
        #[cfg(target_arch = "x86_64")]
        let mut g = {
            let mut a = Asm::new(Mode::Protected);
            a.mov_mmio_addr(0).load(4).hlt(); // mov ebx, MMIO; mov eax, [ebx]; hlt
            x86::guest(hv, Mode::Protected, &a.bytes, &[])
        };
        #[cfg(target_arch = "aarch64")]
        let mut g = {
            let mut code = a64::mov64(0, a64::MMIO);
            code.extend([a64::ldr(4, 1, 0), a64::B_SELF]); // ldr w1, [x0]
            a64::guest(hv, &code, &[])
        };
        assert!(matches!(g.vcpu.complete_read(&[0; 4]), Err(HvError::NoPendingRead)));
        let exit = g.run();
        assert!(matches!(exit, VcpuExit::Mmio { len: 4, write: None, .. }), "{exit:?}");
        let err = g.vcpu.complete_read(&[0; 2]).unwrap_err();
        assert!(matches!(err, HvError::ReadLength { want: 4, got: 2 }), "{err:?}");
        g.vcpu.complete_read(&[1, 2, 3, 4]).unwrap();
        Ok(())
    }
}

/// KVM only: a `QueueNotify`-style write of the registered value signals
/// the ioeventfd in the kernel and the vCPU goes on without an exit; a
/// write of another value to the same address still exits.
#[cfg(target_os = "linux")]
#[test]
fn a_write_matching_an_ioeventfd_signals_it_without_an_exit_and_another_value_still_exits() {
    use vmm_sys_util::eventfd::EventFd;
    fn body(hv: &boxdesk_hv::DefaultHypervisor) -> Result<(), crate::support::Skip> {
        #[cfg(target_arch = "x86_64")]
        let (mut g, addr) = {
            let mut a = Asm::new(Mode::Long);
            a.mov_mmio_addr(0x50) // mov rbx, MMIO + 0x50
                .mov_acc(4, 3)
                .store(4) // mov [rbx], eax (3: matched)
                .mov_acc(4, 4)
                .store(4) // mov [rbx], eax (4: exits)
                .hlt();
            (
                x86::guest(hv, Mode::Long, &a.bytes, &[]),
                Mode::Long.mmio(0x50),
            )
        };
        #[cfg(target_arch = "aarch64")]
        let (mut g, addr) = {
            let mut code = a64::mov64(0, a64::MMIO + 0x50);
            code.extend(a64::mov64(1, 3));
            code.push(a64::str(4, 1, 0)); // str w1, [x0] (3: matched)
            code.extend(a64::mov64(1, 4));
            code.push(a64::str(4, 1, 0)); // str w1, [x0] (4: exits)
            code.push(a64::B_SELF);
            (a64::guest(hv, &code, &[]), a64::MMIO + 0x50)
        };
        let event = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        g.vm.register_ioevent(&event, addr, 3).unwrap();
        g.expect_mmio_write(addr, &4u32.to_le_bytes());
        assert_eq!(event.read().unwrap(), 1, "the matched write signalled once");
        assert!(event.read().is_err(), "and only once");
        Ok(())
    }
    crate::support::each_backend(
        "a_write_matching_an_ioeventfd_signals_it_without_an_exit_and_another_value_still_exits",
        body,
    );
}
