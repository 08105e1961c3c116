//! Exit round-trip cost through the `boxdesk-hv` traits against a raw
//! `kvm-ioctls` loop in the same run (target ratio ≤ 1.05), and kick latency
//! (p50/p99). Not a timed test: it prints figures.
//!
//! x86_64: a real-mode `out` loop, one port-I/O exit per iteration. aarch64:
//! a `str` loop to an unmapped address, one MMIO exit per iteration.
//!
//! `cargo bench -p boxdesk-hv --bench pio [-- EXITS]`

#[cfg(kvm)]
fn main() {
    kvm::main();
}

#[cfg(not(kvm))]
fn main() {
    println!("skipped: the exit benchmark compares against raw KVM (Linux only)");
}

#[cfg(kvm)]
mod kvm {
    use std::sync::mpsc;
    use std::thread;
    use std::time::{Duration, Instant};

    use boxdesk_hv::{
        DefaultHypervisor, Hypervisor, MapFlags, Vcpu, VcpuExit, VcpuKick, Vm, VmConfig,
    };
    use kvm_ioctls::VcpuExit as RawExit;
    use vm_memory::{Bytes, GuestAddress, GuestRegionMmap, MemoryRegionAddress, MmapRegion};

    const RAM: usize = 0x1_0000;
    const CODE: u64 = 0x1000;
    const ROUNDS: usize = 5;

    /// The exit loop, hand-assembled.
    #[cfg(target_arch = "x86_64")]
    fn exit_loop() -> Vec<u8> {
        vec![
            0xba, 0x10, 0x00, // mov dx, 0x10
            0xee, // 1: out dx, al
            0xeb, 0xfd, // jmp 1b
        ]
    }

    #[cfg(target_arch = "aarch64")]
    fn exit_loop() -> Vec<u8> {
        let code: [u32; 3] = [
            0xd2a0_0200, // movz x0, #0x10, lsl #16: 0x10_0000, unmapped
            0xb900_0001, // 1: str w1, [x0]
            0x17ff_ffff, // b 1b
        ];
        code.iter().flat_map(|i| i.to_le_bytes()).collect()
    }

    /// The spin loop for the kick benchmark.
    fn spin_loop() -> Vec<u8> {
        if cfg!(target_arch = "x86_64") {
            vec![0xeb, 0xfe] // 1: jmp 1b
        } else {
            0x1400_0000u32.to_le_bytes().to_vec() // 1: b 1b
        }
    }

    fn ram(code: &[u8]) -> std::sync::Arc<GuestRegionMmap> {
        let ram = GuestRegionMmap::new(MmapRegion::new(RAM).unwrap(), GuestAddress(0)).unwrap();
        ram.write_slice(code, MemoryRegionAddress(CODE)).unwrap();
        std::sync::Arc::new(ram)
    }

    /// Points a trait vCPU at CODE: real mode at 0 (x86_64), EL1h (aarch64).
    fn start_at_code(vcpu: &mut impl Vcpu) {
        let mut regs = vcpu.get_regs().unwrap();
        #[cfg(target_arch = "x86_64")]
        {
            use boxdesk_hv::arch::x86_64::Segment;
            regs.sregs.cs = Segment::real_mode(0, true);
            regs.gp.rip = CODE;
            regs.gp.rflags = 2;
        }
        #[cfg(target_arch = "aarch64")]
        {
            regs.pc = CODE;
            regs.pstate = boxdesk_hv::arch::aarch64::PSTATE_EL1H_MASKED;
        }
        vcpu.set_regs(&regs).unwrap();
    }

    fn is_loop_exit(exit: &VcpuExit) -> bool {
        matches!(
            exit,
            VcpuExit::Pio { write: Some(_), .. } | VcpuExit::Mmio { write: Some(_), .. }
        )
    }

    /// ns per exit through the traits.
    fn through_traits(exits: u32) -> f64 {
        let hv = DefaultHypervisor::open().unwrap();
        let vm = hv.create_vm(&VmConfig::default()).unwrap();
        let ram = ram(&exit_loop());
        vm.map_memory(&ram, MapFlags::default()).unwrap();
        let mut vcpu = vm.create_vcpu(0).unwrap();
        start_at_code(&mut vcpu);
        for _ in 0..100 {
            assert!(is_loop_exit(&vcpu.run().unwrap()));
        }
        let start = Instant::now();
        for _ in 0..exits {
            let exit = vcpu.run().unwrap();
            if !is_loop_exit(&exit) {
                panic!("unexpected {exit:?}");
            }
        }
        start.elapsed().as_nanos() as f64 / f64::from(exits)
    }

    /// ns per exit with kvm-ioctls alone.
    fn raw(exits: u32) -> f64 {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let ram = ram(&exit_loop());
        let region = kvm_bindings::kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: RAM as u64,
            userspace_addr: ram.as_ptr() as u64,
        };
        // SAFETY: `ram` outlives the VM, which is dropped at the end of this fn first.
        unsafe { vm.set_user_memory_region(region) }.unwrap();
        let mut vcpu = vm.create_vcpu(0).unwrap();
        #[cfg(target_arch = "x86_64")]
        {
            // The same CPUID boxdesk-hv gives its vCPUs.
            let cpuid = kvm
                .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
                .unwrap();
            vcpu.set_cpuid2(&cpuid).unwrap();
            let mut sregs = vcpu.get_sregs().unwrap();
            sregs.cs.base = 0;
            sregs.cs.selector = 0;
            vcpu.set_sregs(&sregs).unwrap();
            let regs = kvm_bindings::kvm_regs {
                rip: CODE,
                rflags: 2,
                ..Default::default()
            };
            vcpu.set_regs(&regs).unwrap();
        }
        #[cfg(target_arch = "aarch64")]
        {
            let mut init = kvm_bindings::kvm_vcpu_init::default();
            vm.get_preferred_target(&mut init).unwrap();
            vcpu.vcpu_init(&init).unwrap();
            let core = |off: u64| 0x6030_0000_0010_0000u64 | (off / 4);
            vcpu.set_one_reg(core(256), &CODE.to_le_bytes()).unwrap(); // pc
            vcpu.set_one_reg(core(264), &0x3c5u64.to_le_bytes())
                .unwrap(); // pstate
        }
        let mut run = |n: u32| {
            for _ in 0..n {
                match vcpu.run().unwrap() {
                    RawExit::IoOut(..) | RawExit::MmioWrite(..) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
        };
        run(100);
        let start = Instant::now();
        run(exits);
        let ns = start.elapsed().as_nanos() as f64 / f64::from(exits);
        drop(vcpu);
        drop(vm);
        drop(ram);
        ns
    }

    /// Kick → Cancelled latency, `samples` times, sorted.
    fn kick_latencies(samples: usize) -> Vec<Duration> {
        let (kick_tx, kick_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<Instant>();
        let runner = thread::spawn(move || {
            let hv = DefaultHypervisor::open().unwrap();
            let vm = hv.create_vm(&VmConfig::default()).unwrap();
            let ram = ram(&spin_loop());
            vm.map_memory(&ram, MapFlags::default()).unwrap();
            let mut vcpu = vm.create_vcpu(0).unwrap();
            start_at_code(&mut vcpu);
            kick_tx.send(vcpu.kick_handle()).unwrap();
            for _ in 0..samples {
                assert_eq!(vcpu.run().unwrap(), VcpuExit::Cancelled);
                done_tx.send(Instant::now()).unwrap();
            }
        });
        let kick = kick_rx.recv().unwrap();
        let mut out = Vec::with_capacity(samples);
        for i in 0..samples {
            thread::sleep(Duration::from_micros(500 + (i as u64 * 7919) % 1500));
            let at = Instant::now();
            kick.kick();
            let returned = done_rx.recv().unwrap();
            out.push(returned.saturating_duration_since(at));
        }
        runner.join().unwrap();
        out.sort();
        out
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    pub fn main() {
        let exits: u32 = std::env::args()
            .skip(1)
            .find_map(|a| a.parse().ok())
            .unwrap_or(20_000);
        if let Err(e) = DefaultHypervisor::open() {
            println!("skipped: no kvm here ({e})");
            return;
        }
        println!("probe: {}", boxdesk_hv::probe());
        let kind = if cfg!(target_arch = "x86_64") {
            "pio"
        } else {
            "mmio"
        };
        let (mut traits, mut raws) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            raws.push(raw(exits));
            traits.push(through_traits(exits));
        }
        println!(
            "  rounds raw   {:?}",
            raws.iter().map(|v| *v as u64).collect::<Vec<_>>()
        );
        println!(
            "  rounds trait {:?}",
            traits.iter().map(|v| *v as u64).collect::<Vec<_>>()
        );
        let (t, r) = (median(traits), median(raws));
        println!("{kind} exit round trip, {exits} exits x {ROUNDS} rounds (median):");
        println!("  raw kvm-ioctls   {r:>9.0} ns/exit");
        println!("  boxdesk-hv trait {t:>9.0} ns/exit");
        println!("  ratio            {:>9.3} (target <= 1.05)", t / r);
        let lat = kick_latencies(200);
        let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)];
        println!("kick -> Cancelled latency, {} samples:", lat.len());
        println!(
            "  p50 {:?}  p99 {:?}  max {:?}",
            pct(50),
            pct(99),
            lat[lat.len() - 1]
        );
    }
}
