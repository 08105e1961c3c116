//! Control exits: HLT, registers, kicks, PSCI, the in-kernel irqchip, and
//! failing fast on what the hypervisor cannot run.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

#[cfg(target_arch = "aarch64")]
use crate::a64;
use crate::support::Skip;
#[cfg(target_arch = "x86_64")]
use crate::x86::{self, Asm, Mode};
use std::io::Write;

use boxdesk_hv::{Probe, Vcpu, VcpuExit, VcpuKick, Vm};

/// How long a kicked vCPU may take to return: generous, the latency itself
/// belongs to the benchmark.
const KICK_DEADLINE: Duration = Duration::from_secs(5);

conformance! {
    fn hlt_exits_to_the_caller_without_an_in_kernel_irqchip<H>(hv: &H) {
        #[cfg(target_arch = "aarch64")]
        return Err(Skip("KVM arm64 waits out WFI in the kernel: there is no halt exit".into()));
        #[cfg(target_arch = "x86_64")]
        {
            for mode in x86::MODES {
                let mut a = Asm::new(mode);
                a.hlt().mov_dx(0x10).out_dx(1).hlt(); // hlt; out 0x10, al; hlt
                let mut g = x86::guest(hv, mode, &a.bytes, &[]);
                assert_eq!(g.run(), VcpuExit::Hlt, "{mode:?}");
                g.expect_pio_out(0x10, &[0]);
                assert_eq!(g.run(), VcpuExit::Hlt, "{mode:?}: runs on after a halt");
            }
            Ok(())
        }
    }
}

conformance! {
    fn registers_set_read_back_unchanged_and_reach_the_guest<H>(hv: &H) {
        #[cfg(target_arch = "x86_64")]
        {
            let mut a = Asm::new(Mode::Long);
            a.out_dx(4).mov_acc(8, 0xfeed_0000_beef).hlt(); // out dx, eax; mov rax, ..; hlt
            let mut g = x86::guest(hv, Mode::Long, &a.bytes, &[]);
            let mut regs = g.vcpu.get_regs().unwrap();
            let gp = &mut regs.gp;
            let values = [
                &mut gp.rax, &mut gp.rbx, &mut gp.rcx, &mut gp.rsi, &mut gp.rdi, &mut gp.rsp,
                &mut gp.rbp, &mut gp.r8, &mut gp.r9, &mut gp.r10, &mut gp.r11, &mut gp.r12,
                &mut gp.r13, &mut gp.r14, &mut gp.r15,
            ];
            for (i, r) in values.into_iter().enumerate() {
                *r = 0x1111_1111_0000_0000 * (i as u64 + 1) + i as u64;
            }
            gp.rdx = 0x3f8;
            gp.rflags |= 1 << 0; // CF
            regs.sregs.cr2 = 0xdead_b000;
            regs.sregs.gs.base = 0x7000_0000;
            g.vcpu.set_regs(&regs).unwrap();
            assert_eq!(g.vcpu.get_regs().unwrap(), regs);
            g.expect_pio_out(0x3f8, &regs.gp.rax.to_le_bytes()[..4]);
            assert_eq!(g.run(), VcpuExit::Hlt);
            let after = g.vcpu.get_regs().unwrap();
            assert_eq!(after.gp.rax, 0xfeed_0000_beef, "the guest's write is visible");
            assert_eq!(after.gp.r15, regs.gp.r15);
            assert_eq!(after.gp.rip, x86::CODE + a.bytes.len() as u64);
        }
        #[cfg(target_arch = "aarch64")]
        {
            let mut code = a64::mov64(0, a64::MMIO);
            code.extend([a64::str(8, 7, 0)]); // str x7, [x0]
            code.extend(a64::mov64(9, 0xfeed_0000_beef));
            code.extend([a64::str(8, 9, 0), a64::B_SELF]); // str x9, [x0]
            let mut g = a64::guest(hv, &code, &[]);
            let mut regs = g.vcpu.get_regs().unwrap();
            for (i, x) in regs.x.iter_mut().enumerate() {
                *x = 0x1111_1111_0000_0000 * (i as u64 % 15 + 1) + i as u64;
            }
            regs.sp = 0x8_0000;
            regs.sp_el1 = 0x9_0000;
            regs.elr_el1 = 0x1234;
            regs.spsr_el1 = 0x3c5;
            regs.pstate |= 1 << 29; // C
            g.vcpu.set_regs(&regs).unwrap();
            assert_eq!(g.vcpu.get_regs().unwrap(), regs);
            g.expect_mmio_write(a64::MMIO, &regs.x[7].to_le_bytes());
            g.expect_mmio_write(a64::MMIO, &0xfeed_0000_beefu64.to_le_bytes());
            let after = g.vcpu.get_regs().unwrap();
            assert_eq!(after.x[9], 0xfeed_0000_beef, "the guest's write is visible");
            assert_eq!(after.sp_el1, regs.sp_el1);
        }
        Ok(())
    }
}

#[cfg(target_arch = "x86_64")]
fn spinning<H: boxdesk_hv::Hypervisor>(hv: &H) -> crate::support::Guest<H> {
    let mut a = Asm::new(Mode::Long);
    a.jmp_self(); // 1: jmp 1b
    x86::guest(hv, Mode::Long, &a.bytes, &[])
}

#[cfg(target_arch = "aarch64")]
fn spinning<H: boxdesk_hv::Hypervisor>(hv: &H) -> crate::support::Guest<H> {
    a64::guest(hv, &[a64::B_SELF], &[])
}

conformance! {
    fn a_kick_from_another_thread_cancels_a_spinning_guest<H>(hv: &H) {
        let mut g = spinning(hv);
        let kick = g.vcpu.kick_handle();
        let (tx, rx) = mpsc::channel();
        let kicker = thread::spawn(move || {
            thread::sleep(Duration::from_millis(50));
            let at = Instant::now();
            kick.kick();
            tx.send(at).unwrap();
        });
        assert_eq!(g.run(), VcpuExit::Cancelled);
        let returned = Instant::now();
        kicker.join().unwrap();
        let kicked = rx.recv().unwrap();
        let latency = returned.saturating_duration_since(kicked);
        assert!(latency < KICK_DEADLINE, "the kicked vCPU took {latency:?} to return");
        Ok(())
    }
}

conformance! {
    fn a_kick_before_run_is_remembered_and_the_guest_resumes_after_it<H>(hv: &H) {
        let mut g = spinning(hv);
        let kick = g.vcpu.kick_handle();
        kick.kick();
        kick.kick(); // kicks do not queue up: one cancelled run takes them all
        assert_eq!(g.run(), VcpuExit::Cancelled);
        let again = kick.clone();
        let kicker = thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            again.kick();
        });
        let started = Instant::now();
        assert_eq!(g.run(), VcpuExit::Cancelled, "the second run entered the guest again");
        assert!(started.elapsed() >= Duration::from_millis(90), "the first kick was consumed");
        kicker.join().unwrap();
        Ok(())
    }
}

conformance! {
    fn a_psci_system_off_call_ends_in_a_poweroff_system_event<H>(hv: &H) {
        #[cfg(target_arch = "x86_64")]
        return Err(Skip("psci is aarch64 only".into()));
        #[cfg(target_arch = "aarch64")]
        {
            let mut code = a64::mov64(0, boxdesk_hv::psci::SYSTEM_OFF.into()); // mov x0, SYSTEM_OFF
            code.extend([a64::HVC0, a64::B_SELF]); // hvc #0
            let mut g = a64::guest(hv, &code, &[]);
            let exit = g.run();
            assert_eq!(exit, VcpuExit::SystemEvent(boxdesk_hv::SystemEvent::Poweroff));
            Ok(())
        }
    }
}

conformance! {
    fn an_in_kernel_interrupt_controller_takes_line_changes_while_the_guest_runs<H>(hv: &H) {
        if !hv.capabilities().irqchip {
            return Err(Skip("the backend has no interrupt controller".into()));
        }
        #[cfg(target_arch = "x86_64")]
        let mut g = {
            // With an irqchip `hlt` would sleep in the kernel: end with an `out`.
            let config = boxdesk_hv::VmConfig { irqchip: true, tss_addr: Some(0xfffb_d000) };
            let mut a = Asm::new(Mode::Protected);
            a.spin(100).mov_dx(0x10).out_dx(1).jmp_self();
            x86::guest_with(hv, &config, Mode::Protected, &a.bytes, &[])
        };
        #[cfg(target_arch = "aarch64")]
        let mut g = {
            use boxdesk_hv::arch::aarch64::GicConfig;
            let gic = GicConfig { distributor: 0x0800_0000, redistributors: 0x080a_0000, spis: 64 };
            let config = boxdesk_hv::VmConfig { gic: Some(gic) };
            let mut code = a64::mov64(0, a64::MMIO);
            code.extend([a64::str(4, 0, 0), a64::B_SELF]);
            a64::guest_with(hv, &config, &code, &[])
        };
        for line in [4, 5, 10] {
            g.vm.set_irq_line(line, true).unwrap();
            g.vm.set_irq_line(line, false).unwrap();
        }
        #[cfg(target_arch = "x86_64")]
        g.expect_pio_out(0x10, &[0]);
        #[cfg(target_arch = "aarch64")]
        g.expect_mmio_write(a64::MMIO, &(a64::MMIO as u32).to_le_bytes());
        Ok(())
    }
}

conformance! {
    fn an_instruction_the_hypervisor_cannot_complete_fails_fast_instead_of_hanging<H>(hv: &H) {
        #[cfg(target_arch = "aarch64")]
        return Err(Skip("no aarch64 instruction is known to stop KVM's arm64 guests".into()));
        #[cfg(target_arch = "x86_64")]
        {
            // `int3` with an empty IDT: hardware escalates to a triple fault
            // (Shutdown); an emulating KVM reports an emulation failure.
            let mut a = Asm::new(Mode::Long);
            a.int3().jmp_self();
            let mut g = x86::guest(hv, Mode::Long, &a.bytes, &[]);
            let exit = g.run();
            assert!(
                matches!(exit, VcpuExit::Shutdown | VcpuExit::InternalError { .. }),
                "{exit:?}"
            );
            Ok(())
        }
    }
}

conformance! {
    fn the_probe_finds_this_host_s_hypervisor_and_says_whether_it_is_accelerated<H>(hv: &H) {
        let probe = boxdesk_hv::probe();
        let _ = writeln!(std::io::stderr(), "probe: {probe}");
        assert!(matches!(probe, Probe::Kvm { .. } | Probe::Hvf), "{probe:?}");
        if let Ok(want) = std::env::var("BOXDESK_EXPECT_ACCELERATED") {
            assert_eq!(probe.can_boot(), want == "1", "{probe}");
        }
        Ok(())
    }
}
