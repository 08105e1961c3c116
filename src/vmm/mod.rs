//! The VMM: one microVM assembled from `boxdesk-hv` (the hypervisor),
//! `boxdesk-devices` (serial, i8042, virtio-mmio vsock and blk) and the
//! per-arch guest layout of [`arch`]. It owns the VM's life — memory,
//! vCPU threads, the bus every exit goes to — and reports how it ended
//! ([`VmEnd`]). It never decides sandbox policy: the helper does.
//!
//! Threads: one per vCPU (a vCPU is bound to the thread that created it),
//! plus the vsock device's event thread. A stop kicks every vCPU, whose
//! `run` then returns `Cancelled`.

pub mod arch;
pub mod image;
mod irq;

use crate::sync::lock;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use boxdesk_devices::bus::Bus;
use boxdesk_devices::i8042::I8042;
use boxdesk_devices::serial::Serial;
use boxdesk_devices::virtio::mmio::MmioTransport;
use boxdesk_devices::virtio::{Memory, VirtioDevice};
use boxdesk_hv::kvm::{Kvm, KvmKick, KvmVm};
use boxdesk_hv::{Hypervisor, MapFlags, Vcpu, VcpuExit, VcpuKick, Vm as _, VmConfig};
use vm_memory::{GuestAddress, GuestMemoryBackend as _};

/// Why a VM could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// The hypervisor refused something.
    #[error("hypervisor: {0}")]
    Hv(#[from] boxdesk_hv::HvError),
    /// The guest layout could not be written (kernel, initrd, tables).
    #[error(transparent)]
    Arch(#[from] arch::ArchError),
    /// A kernel, initrd or disk file could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// `--mem` is outside what a VM can have.
    #[error("--mem {0} MiB is out of range (64 to 65536 MiB)")]
    Memory(u32),
    /// `--cpus` is outside what a VM can have.
    #[error("--cpus {0} is out of range (1 to {1})")]
    Vcpus(u32, u32),
    /// Guest memory could not be allocated.
    #[error("cannot allocate guest memory: {0}")]
    Alloc(String),
    /// A device could not be created.
    #[error("device {what}: {why}")]
    Device {
        /// Which device.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
}

/// What a VM is made of.
#[derive(Debug)]
pub struct VmSpec {
    /// The kernel (ELF vmlinux or bzImage).
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// Guest memory in MiB.
    pub mem_mib: u32,
    /// vCPUs.
    pub vcpus: u32,
    /// The host side of the guest's vsock (`<name>.agent`).
    pub vsock_uds: PathBuf,
    /// Where the serial console goes.
    pub console: File,
    /// A disk image attached as virtio-blk, and whether it is writable.
    pub rootfs: Option<(PathBuf, bool)>,
}

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmEnd {
    /// The guest reset the machine (i8042 or triple fault): what boxdesk's
    /// agent does to power off, and what `reboot` in the guest does.
    Reset,
    /// The guest powered off.
    Poweroff,
    /// The VMM stopped it ([`RunningVm::kill`]).
    Killed,
    /// The guest crashed or a vCPU failed; `serial` is the console's tail.
    Crash {
        /// What happened.
        reason: String,
        /// The last lines the guest printed.
        serial: String,
    },
}

struct Ending {
    end: Mutex<Option<VmEnd>>,
    cv: Condvar,
    stop: AtomicBool,
}

impl Ending {
    /// Records the first end; later ones are ignored.
    fn set(&self, end: VmEnd) {
        let mut e = lock(&self.end);
        if e.is_none() {
            *e = Some(end);
            self.stop.store(true, Ordering::SeqCst);
            self.cv.notify_all();
        }
    }
}

/// A started VM.
pub struct RunningVm {
    ending: Arc<Ending>,
    kicks: Arc<Mutex<Vec<KvmKick>>>,
    serial: Arc<Mutex<Serial>>,
    // Held for the VM's life: memory, the VM fd and the devices.
    _mem: Memory,
    _vm: Arc<KvmVm>,
    _devices: Vec<Arc<Mutex<MmioTransport>>>,
}

impl std::fmt::Debug for RunningVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningVm").finish_non_exhaustive()
    }
}

/// The kernel command line: console on the 8250, reset through the
/// i8042, no PCI/ACPI probing, panics reboot at once (the VMM reports them),
/// one `virtio_mmio.device=` per device, and for a rootfs (`Some(writable)`;
/// the disk is the only virtio-blk, so `/dev/vda`) the agent's
/// `boxdesk.rootfs=` contract.
fn cmdline(devices: &[(u64, u32)], rootfs: Option<bool>) -> String {
    let mut c = String::from(
        "console=ttyS0 reboot=k panic=-1 pci=off nomodules i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd \
         tsc=reliable ipv6.disable=1 rdinit=/init quiet",
    );
    for (addr, irq) in devices {
        c.push_str(&format!(" virtio_mmio.device=4K@{addr:#x}:{irq}"));
    }
    match rootfs {
        Some(true) => c.push_str(" boxdesk.rootfs=/dev/vda boxdesk.rootfs_rw=1"),
        Some(false) => c.push_str(" boxdesk.rootfs=/dev/vda"),
        None => {}
    }
    c
}

impl RunningVm {
    /// Builds and starts the VM of `spec`: every error about files, sizes
    /// and images comes before any vCPU runs.
    pub fn start(spec: VmSpec) -> Result<RunningVm, VmmError> {
        if !(64..=65536).contains(&spec.mem_mib) {
            return Err(VmmError::Memory(spec.mem_mib));
        }
        let hv = Kvm::open()?;
        let max = hv.capabilities().max_vcpus.clamp(1, 64);
        if spec.vcpus == 0 || spec.vcpus > max {
            return Err(VmmError::Vcpus(spec.vcpus, max));
        }
        let mem_bytes = u64::from(spec.mem_mib) << 20;
        let mem = Memory::from_ranges(&arch::x86_64::layout::ram_regions(mem_bytes))
            .map_err(|e| VmmError::Alloc(e.to_string()))?;
        let open = |p: &PathBuf| {
            File::open(p).map_err(|source| VmmError::Open {
                path: p.clone(),
                source,
            })
        };
        let kernel = arch::x86_64::load_kernel(&mem, &mut open(&spec.kernel)?)?;
        let initrd = arch::x86_64::load_initrd(&mem, &mut open(&spec.initrd)?)?;

        let vm = Arc::new(hv.create_vm(&VmConfig {
            irqchip: true,
            tss_addr: Some(arch::x86_64::layout::KVM_TSS_ADDR),
        })?);
        for region in mem.iter() {
            vm.map_memory(region, MapFlags::default())?;
        }

        let ending = Arc::new(Ending {
            end: Mutex::new(None),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut pio = Bus::default();
        let mut mmio = Bus::default();
        let serial_irq = irq::KvmIrq::new(&vm, 4)?;
        let serial = Arc::new(Mutex::new(Serial::new(
            Box::new(spec.console),
            Arc::new(serial_irq),
        )));
        pio.insert(0x3f8, 8, serial.clone())
            .map_err(dev("serial"))?;
        let e = ending.clone();
        let i8042 = I8042::new(Box::new(move || e.set(VmEnd::Reset)));
        pio.insert(0x60, 5, Arc::new(Mutex::new(i8042)))
            .map_err(dev("i8042"))?;

        let mut virtio: Vec<Box<dyn VirtioDevice>> = Vec::new();
        let vsock = boxdesk_devices::vsock::Vsock::new(3, &spec.vsock_uds).map_err(dev("vsock"))?;
        virtio.push(Box::new(vsock));
        if let Some((path, writable)) = &spec.rootfs {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(*writable)
                .open(path)
                .map_err(|source| VmmError::Open {
                    path: path.clone(),
                    source,
                })?;
            let blk = boxdesk_devices::blk::Blk::new(f, !writable, "boxdesk-rootfs")
                .map_err(dev("blk"))?;
            virtio.push(Box::new(blk));
        }
        let mut slots = Vec::new();
        let mut devices = Vec::new();
        for (i, d) in virtio.into_iter().enumerate() {
            let (addr, gsi) = arch::x86_64::layout::mmio_slot(i).ok_or(VmmError::Device {
                what: "virtio-mmio",
                why: "out of slots".into(),
            })?;
            let line = Arc::new(irq::KvmIrq::new(&vm, gsi)?);
            let t = Arc::new(Mutex::new(MmioTransport::new(d, mem.clone(), line)));
            mmio.insert(addr, 0x1000, t.clone())
                .map_err(dev("virtio-mmio"))?;
            slots.push((addr, gsi));
            devices.push(t);
        }
        arch::x86_64::configure_system(
            &mem,
            &kernel,
            &cmdline(&slots, spec.rootfs.as_ref().map(|r| r.1)),
            Some(initrd),
            mem_bytes,
            spec.vcpus as u8,
        )?;

        let kicks = Arc::new(Mutex::new(Vec::new()));
        let buses = Arc::new((pio, mmio));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        for id in 0..spec.vcpus {
            let (vm, mem, buses, ending, kicks, ready, serial) = (
                vm.clone(),
                mem.clone(),
                buses.clone(),
                ending.clone(),
                kicks.clone(),
                ready_tx.clone(),
                serial.clone(),
            );
            let entry = kernel.entry;
            let n = spec.vcpus;
            std::thread::Builder::new()
                .name(format!("vcpu{id}"))
                .spawn(move || {
                    vcpu_thread(
                        id, n, entry, &vm, &mem, &buses, &ending, &kicks, ready, &serial,
                    )
                })
                .map_err(VmmError::Thread)?;
        }
        drop(ready_tx);
        for _ in 0..spec.vcpus {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let vm = RunningVm {
                        ending,
                        kicks,
                        serial,
                        _mem: mem,
                        _vm: vm,
                        _devices: devices,
                    };
                    vm.kill();
                    return Err(e);
                }
                Err(_) => break,
            }
        }
        vm.finalize()?;
        Ok(RunningVm {
            ending,
            kicks,
            serial,
            _mem: mem,
            _vm: vm,
            _devices: devices,
        })
    }

    /// Waits up to `limit` for the VM to end.
    pub fn wait_timeout(&self, limit: Duration) -> Option<VmEnd> {
        let guard = lock(&self.ending.end);
        let (guard, _) = self
            .ending
            .cv
            .wait_timeout_while(guard, limit, |e| e.is_none())
            .unwrap_or_else(|p| p.into_inner());
        guard.clone()
    }

    /// Waits for the VM to end.
    pub fn wait(&self) -> VmEnd {
        loop {
            if let Some(e) = self.wait_timeout(Duration::from_secs(3600)) {
                return e;
            }
        }
    }

    /// Stops every vCPU; the VM ends as [`VmEnd::Killed`] unless it ended
    /// already.
    pub fn kill(&self) {
        self.ending.set(VmEnd::Killed);
        for k in lock(&self.kicks).iter() {
            k.kick();
        }
    }

    /// The serial console's last output.
    pub fn serial_tail(&self) -> String {
        serial_tail(&self.serial)
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        self.kill();
    }
}

fn serial_tail(serial: &Mutex<Serial>) -> String {
    let tail = lock(serial).tail();
    String::from_utf8_lossy(&tail).into_owned()
}

fn dev<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> VmmError {
    move |e| VmmError::Device {
        what,
        why: e.to_string(),
    }
}

/// One vCPU: created and set up on this thread, then run until the VM
/// ends. Every exit goes to the bus; an exit the VMM cannot serve ends the
/// VM as a crash with the serial tail.
#[allow(clippy::too_many_arguments)]
fn vcpu_thread(
    id: u32,
    vcpus: u32,
    entry: GuestAddress,
    vm: &Arc<KvmVm>,
    mem: &Memory,
    buses: &(Bus, Bus),
    ending: &Ending,
    kicks: &Mutex<Vec<KvmKick>>,
    ready: std::sync::mpsc::Sender<Result<(), VmmError>>,
    serial: &Mutex<Serial>,
) {
    let mut vcpu = match vm.create_vcpu(id) {
        Ok(v) => v,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return;
        }
    };
    if let Err(e) = arch::x86_64::setup_vcpu(&mut vcpu, mem, id, vcpus, entry) {
        let _ = ready.send(Err(e.into()));
        return;
    }
    lock(kicks).push(vcpu.kick_handle());
    let _ = ready.send(Ok(()));
    let (pio, mmio) = buses;
    let mut buf = [0u8; 8];
    while !ending.stop.load(Ordering::SeqCst) {
        let exit = match vcpu.run() {
            Ok(exit) => exit,
            Err(e) => {
                ending.set(VmEnd::Crash {
                    reason: format!("vCPU {id}: {e}"),
                    serial: serial_tail(serial),
                });
                break;
            }
        };
        match exit {
            VcpuExit::Pio { port, len, write } => match write {
                Some(data) => {
                    pio.write(u64::from(port), &data);
                }
                None => {
                    let b = &mut buf[..len.min(8)];
                    b.fill(0xff);
                    pio.read(u64::from(port), b);
                    let _ = vcpu.complete_read(b);
                }
            },
            VcpuExit::Mmio { addr, len, write } => match write {
                Some(data) => {
                    mmio.write(addr, &data);
                }
                None => {
                    let b = &mut buf[..len.min(8)];
                    b.fill(0);
                    mmio.read(addr, b);
                    let _ = vcpu.complete_read(b);
                }
            },
            VcpuExit::Hlt | VcpuExit::Cancelled => {}
            VcpuExit::Shutdown | VcpuExit::SystemEvent(boxdesk_hv::SystemEvent::Reset) => {
                ending.set(VmEnd::Reset)
            }
            VcpuExit::SystemEvent(boxdesk_hv::SystemEvent::Poweroff) => ending.set(VmEnd::Poweroff),
            other => ending.set(VmEnd::Crash {
                reason: format!("vCPU {id}: {other:?}"),
                serial: serial_tail(serial),
            }),
        }
    }
    let _ = std::io::stderr().flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_announces_every_virtio_mmio_device() {
        let c = cmdline(&[(0xd000_0000, 5), (0xd000_1000, 6)], Some(false));
        assert!(c.ends_with(" boxdesk.rootfs=/dev/vda"), "{c}");
        assert!(
            c.contains("virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"),
            "{c}"
        );
        assert!(c.starts_with("console=ttyS0 reboot=k panic=-1"));
    }
}
