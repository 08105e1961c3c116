//! The probe guest: a 3×10⁵-iteration countdown loop ending in one exit, in
//! 64-bit mode (x86_64 long mode with identity page tables; aarch64 EL1).

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestRegionMmap, MemoryRegionAddress, MmapRegion};

use super::Outcome;
use crate::{HvError, Hypervisor, MapFlags, Vcpu, VcpuExit, VcpuKick, Vm, VmConfig};

/// Loop iterations (two instructions each).
const ITERATIONS: u32 = 300_000;
/// Probe RAM: 64 KiB at guest address 0.
const RAM_SIZE: usize = 0x1_0000;
/// Where the code goes.
const CODE: u64 = 0x4000;

/// Runs the probe guest on backend `H`, kicking it after `deadline`.
pub(super) fn run<H: Hypervisor>(deadline: Duration) -> Outcome {
    match try_run::<H>(deadline) {
        Ok(outcome) => outcome,
        Err(e) => Outcome::Unavailable(e.to_string()),
    }
}

fn try_run<H: Hypervisor>(deadline: Duration) -> Result<Outcome, HvError> {
    let hv = H::open()?;
    let vm = hv.create_vm(&VmConfig::default())?;
    let ram = MmapRegion::new(RAM_SIZE).map_err(|_| HvError::Unsupported("probe memory"))?;
    let ram = GuestRegionMmap::new(ram, GuestAddress(0))
        .map(std::sync::Arc::new)
        .ok_or(HvError::Unsupported("probe memory"))?;
    let mut vcpu = vm.create_vcpu(0)?;
    vm.finalize()?;
    let mut regs = vcpu.get_regs()?;
    setup(&ram, &mut regs).map_err(|_| HvError::Unsupported("probe memory"))?;
    vm.map_memory(&ram, MapFlags::default())?;
    vcpu.set_regs(&regs)?;

    let kick = vcpu.kick_handle();
    let (done, timer) = mpsc::channel::<()>();
    let watchdog = thread::spawn(move || {
        if timer.recv_timeout(deadline).is_err() {
            kick.kick();
        }
    });
    let exit = vcpu.run();
    let _ = done.send(());
    let _ = watchdog.join();
    Ok(match exit? {
        VcpuExit::Cancelled => Outcome::TooSlow,
        VcpuExit::InternalError { reason } => Outcome::EmulationFailure(reason),
        e if is_final_exit(&e) => Outcome::Finished,
        other => Outcome::EmulationFailure(format!("unexpected exit {other:?}")),
    })
}

cfg_if::cfg_if! {
    if #[cfg(target_arch = "x86_64")] {
        use crate::arch::x86_64::{Segment, CR0_PE, CR0_PG, CR4_PAE, EFER_LMA, EFER_LME, RFLAGS_RESERVED};

        /// PML4, PDPT and PD pages; the PD maps 0..2 MiB with one large page.
        const PML4: u64 = 0x1000;

        fn setup(ram: &GuestRegionMmap, regs: &mut crate::Regs) -> Result<(), vm_memory::GuestMemoryError> {
            ram.write_obj(PML4 + 0x1000 + 3, MemoryRegionAddress(PML4))?;
            ram.write_obj(PML4 + 0x2000 + 3, MemoryRegionAddress(PML4 + 0x1000))?;
            ram.write_obj(0x83u64, MemoryRegionAddress(PML4 + 0x2000))?;
            let n = ITERATIONS.to_le_bytes();
            let code = [
                0xb9, n[0], n[1], n[2], n[3], // mov ecx, ITERATIONS
                0xff, 0xc9, // 1: dec ecx
                0x75, 0xfc, // jnz 1b
                0xe6, 0x10, // out 0x10, al
                0xf4, // hlt
            ];
            ram.write_slice(&code, MemoryRegionAddress(CODE))?;
            let s = &mut regs.sregs;
            s.cs = Segment::flat64(0x8, true);
            s.ds = Segment::flat64(0x10, false);
            (s.es, s.fs, s.gs, s.ss) = (s.ds, s.ds, s.ds, s.ds);
            s.cr3 = PML4;
            s.cr4 |= CR4_PAE;
            s.cr0 |= CR0_PE | CR0_PG;
            s.efer |= EFER_LME | EFER_LMA;
            regs.gp = Default::default();
            regs.gp.rip = CODE;
            regs.gp.rflags = RFLAGS_RESERVED;
            Ok(())
        }

        fn is_final_exit(exit: &VcpuExit) -> bool {
            matches!(exit, VcpuExit::Pio { port: 0x10, write: Some(_), .. })
        }
    } else if #[cfg(target_arch = "aarch64")] {
        /// An unmapped address the final store goes to.
        const MMIO: u64 = 0x10_0000;

        fn setup(ram: &GuestRegionMmap, regs: &mut crate::Regs) -> Result<(), vm_memory::GuestMemoryError> {
            let (lo, hi) = (ITERATIONS & 0xffff, ITERATIONS >> 16);
            let code: [u32; 6] = [
                0xd280_0001 | (lo << 5), // movz x1, #lo
                0xf2a0_0001 | (hi << 5), // movk x1, #hi, lsl #16
                0xf100_0421,             // 1: subs x1, x1, #1
                0x54ff_ffe1,             // b.ne 1b
                0xb900_0041,             // str w1, [x2]
                0x1400_0000,             // b .
            ];
            for (i, insn) in code.iter().enumerate() {
                ram.write_obj(*insn, MemoryRegionAddress(CODE + 4 * i as u64))?;
            }
            regs.x[2] = MMIO;
            regs.pc = CODE;
            regs.pstate = crate::arch::aarch64::PSTATE_EL1H_MASKED;
            Ok(())
        }

        fn is_final_exit(exit: &VcpuExit) -> bool {
            matches!(exit, VcpuExit::Mmio { addr: MMIO, write: Some(_), .. })
        }
    }
}
