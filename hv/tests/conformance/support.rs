//! What every conformance body needs: a backend, a small guest, a watchdog,
//! and the `skipped: <why>` convention.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread;
use std::time::{Duration, Instant};

use boxdesk_hv::{Hypervisor, MapFlags, MemorySlot, Vcpu, VcpuExit, VcpuKick, Vm, VmConfig};
use vm_memory::{GuestAddress, GuestRegionMmap, MmapRegion};

/// How long one `run` may take before the watchdog kicks it: generous, the
/// emulating KVM runs ~2 million instructions per second.
pub const RUN_DEADLINE: Duration = Duration::from_secs(20);

/// A behaviour that cannot be checked on this backend, and why.
#[derive(Debug)]
pub struct Skip(pub String);

/// Declares a conformance test: `body` runs against each backend.
macro_rules! conformance {
    ($(#[$meta:meta])* fn $name:ident<$h:ident>($hv:ident: &H) $body:block) => {
        $(#[$meta])*
        #[test]
        fn $name() {
            #[allow(unused_variables)]
            fn body<$h: boxdesk_hv::Hypervisor>($hv: &$h) -> Result<(), $crate::support::Skip> $body
            $crate::support::each_backend(stringify!($name), body::<boxdesk_hv::DefaultHypervisor>);
        }
    };
}

/// Says `skipped: <why>` straight to stderr, past the test harness's
/// output capture, so skips show in every run.
fn say_skipped(name: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {name}: {why}");
}

/// Runs `body` against the backend, saying `skipped: <why>` when the
/// hypervisor is missing or the body says the behaviour does not apply.
pub fn each_backend<H: Hypervisor>(name: &str, body: fn(&H) -> Result<(), Skip>) {
    // Hypervisor.framework allows one VM per process: one body at a time there.
    static ONE_VM: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_vm =
        cfg!(target_os = "macos").then(|| ONE_VM.lock().unwrap_or_else(|e| e.into_inner()));
    let hv = match H::open() {
        Ok(hv) => hv,
        Err(e) => {
            say_skipped(name, &format!("no hypervisor here ({})", chain(&e)));
            return;
        }
    };
    if let Err(Skip(why)) = body(&hv) {
        say_skipped(name, &why);
    }
}

/// An error with its sources, one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        s += &format!(": {e}");
        source = e.source();
    }
    s
}

/// Anonymous guest RAM of `size` bytes at `guest`.
pub fn ram(guest: u64, size: usize) -> std::sync::Arc<GuestRegionMmap> {
    let region = GuestRegionMmap::new(MmapRegion::new(size).unwrap(), GuestAddress(guest));
    std::sync::Arc::new(region.unwrap())
}

/// A VM with one vCPU on this thread, and the regions it maps.
pub struct Guest<H: Hypervisor> {
    pub vm: H::Vm,
    pub vcpu: <H::Vm as Vm>::Vcpu,
    pub regions: Vec<(std::sync::Arc<GuestRegionMmap>, MemorySlot)>,
    watchdog: Watchdog,
}

impl<H: Hypervisor> Guest<H> {
    /// Creates the VM from `config`, maps `regions` (guest address, size,
    /// flags) and creates vCPU 0.
    pub fn new(hv: &H, config: &VmConfig, regions: &[(u64, usize, MapFlags)]) -> Self {
        let vm = hv
            .create_vm(config)
            .unwrap_or_else(|e| panic!("create_vm: {}", chain(&e)));
        let regions = regions
            .iter()
            .map(|&(guest, size, flags)| {
                let region = ram(guest, size);
                let slot = vm
                    .map_memory(&region, flags)
                    .unwrap_or_else(|e| panic!("map: {}", chain(&e)));
                (region, slot)
            })
            .collect();
        let vcpu = vm
            .create_vcpu(0)
            .unwrap_or_else(|e| panic!("create_vcpu: {}", chain(&e)));
        vm.finalize()
            .unwrap_or_else(|e| panic!("finalize: {}", chain(&e)));
        let watchdog = Watchdog::new(vcpu.kick_handle());
        Self {
            vm,
            vcpu,
            regions,
            watchdog,
        }
    }

    /// Runs the vCPU once; a run past [`RUN_DEADLINE`] fails the test.
    pub fn run(&mut self) -> VcpuExit {
        self.watchdog.arm(RUN_DEADLINE);
        let exit = self
            .vcpu
            .run()
            .unwrap_or_else(|e| panic!("run: {}", chain(&e)));
        self.watchdog.disarm();
        assert!(
            !matches!(exit, VcpuExit::Cancelled) || !self.watchdog.fired(),
            "the guest ran past {RUN_DEADLINE:?} (watchdog)"
        );
        exit
    }

    /// Runs and expects a write of `data` to `port`.
    #[cfg(target_arch = "x86_64")]
    pub fn expect_pio_out(&mut self, port: u16, data: &[u8]) {
        let exit = self.run();
        let VcpuExit::Pio {
            port: p,
            write: Some(w),
            len,
        } = &exit
        else {
            panic!("expected out {port:#x} {data:x?}, got {exit:?}");
        };
        assert_eq!((*p, &**w, *len), (port, data, data.len()), "{exit:?}");
    }

    /// Runs, expects a read of `data.len()` bytes from `port`, answers `data`.
    #[cfg(target_arch = "x86_64")]
    pub fn answer_pio_in(&mut self, port: u16, data: &[u8]) {
        let exit = self.run();
        assert_eq!(
            exit,
            VcpuExit::Pio {
                port,
                len: data.len(),
                write: None
            }
        );
        self.vcpu.complete_read(data).unwrap();
    }

    /// Runs and expects a write of `data` at guest-physical `addr`.
    pub fn expect_mmio_write(&mut self, addr: u64, data: &[u8]) {
        let exit = self.run();
        let VcpuExit::Mmio {
            addr: a,
            write: Some(w),
            len,
        } = &exit
        else {
            panic!("expected mmio write {addr:#x} {data:x?}, got {exit:?}");
        };
        assert_eq!((*a, &**w, *len), (addr, data, data.len()), "{exit:?}");
    }

    /// Runs, expects a read of `data.len()` bytes at `addr`, answers `data`.
    pub fn answer_mmio_read(&mut self, addr: u64, data: &[u8]) {
        let exit = self.run();
        assert_eq!(
            exit,
            VcpuExit::Mmio {
                addr,
                len: data.len(),
                write: None
            }
        );
        self.vcpu.complete_read(data).unwrap();
    }
}

/// Kicks a vCPU whose run outlives a deadline.
struct Watchdog {
    tx: Option<Sender<Option<Instant>>>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new<K: VcpuKick>(kick: K) -> Self {
        let (tx, rx) = mpsc::channel::<Option<Instant>>();
        let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = fired.clone();
        let thread = thread::spawn(move || {
            let mut deadline = None;
            loop {
                let msg = match deadline {
                    Some(d) => rx.recv_timeout(d - Instant::now().min(d)),
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match msg {
                    Ok(d) => deadline = d,
                    Err(RecvTimeoutError::Timeout) => {
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        kick.kick();
                        deadline = None;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        });
        Self {
            tx: Some(tx),
            fired,
            thread: Some(thread),
        }
    }

    fn arm(&self, after: Duration) {
        let _ = self.tx.as_ref().unwrap().send(Some(Instant::now() + after));
    }

    fn disarm(&self) {
        let _ = self.tx.as_ref().unwrap().send(None);
    }

    fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// This process's resident set in bytes, where the OS says (Linux /proc).
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Some(pages * page)
}
