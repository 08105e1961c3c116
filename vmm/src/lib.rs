//! The VMM: one microVM assembled from `boxdesk-hv` (the hypervisor:
//! KVM on Linux, Hypervisor.framework on macOS), `boxdesk-devices` (console,
//! virtio-mmio vsock and blk, …) and the host arch's machine of [`arch`]
//! (x86_64: 8250 + i8042 + zero page; aarch64: GICv3 + PL011 + PL031 +
//! FDT). It owns the VM's life — memory, vCPU threads, the buses every exit
//! goes to — and reports how it ended ([`VmEnd`]). It never decides sandbox
//! policy: the helper does.
//!
//! Threads: one per vCPU (a vCPU is bound to the thread that created it,
//! [`vcpu`]), the devices' own (vsock's event thread, virtio-gpu's, virtio-fs's
//! workers) and, on KVM, the thread that turns queue kicks (ioeventfds)
//! into notifications (`notify`). A stop kicks every
//! vCPU, whose `run` then returns `Cancelled`.

#![deny(missing_docs)]

pub mod arch;
pub mod image;
mod irq;
#[cfg(target_os = "linux")]
pub mod jail;
pub mod mounts;
#[cfg(target_os = "linux")]
mod notify;
pub mod oom;
pub mod sandbox;
mod vcpu;

use boxdesk_platform::sync::lock;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use arch::host;
use boxdesk_devices::bus::Bus;
use boxdesk_devices::console::SharedConsole;
#[cfg(target_os = "linux")]
use boxdesk_devices::fs;
use boxdesk_devices::gpu::Gpu;
use boxdesk_devices::input::{Input, Inputs};
use boxdesk_devices::virtio::mmio::MmioTransport;
use boxdesk_devices::virtio::{Memory, VirtioDevice};
use boxdesk_hv::{DefaultHypervisor, Hypervisor, MapFlags, Vm as _};
use boxdesk_platform::screen::Screen;
use vm_memory::{GuestAddress, GuestRegionMmap, MmapRegion};

/// The host's hypervisor VM type (KVM on Linux, HVF on macOS).
pub type HvVm = <DefaultHypervisor as Hypervisor>::Vm;
/// The host's hypervisor vCPU type, one per vCPU thread.
pub type HvVcpu = <HvVm as boxdesk_hv::Vm>::Vcpu;

/// Why a VM could not be built or started.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// The hypervisor refused something.
    #[error("hypervisor: {0}")]
    Hv(boxdesk_hv::HvError),
    /// The guest layout could not be written (kernel, initrd, tables).
    #[error(transparent)]
    Arch(#[from] arch::ArchError),
    /// A kernel, initrd or disk file could not be opened.
    #[error("cannot open {}: {error}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The memory asked for (`--mem`, cowork's `memoryMB`) is outside
    /// what a VM can have.
    #[error("guest memory of {0} MiB is out of range (64 to 65536 MiB)")]
    Memory(u32),
    /// The vCPUs asked for (`--cpus`, cowork's `cpuCount`) are outside
    /// what a VM can have.
    #[error("{0} vCPUs is out of range (1 to {1})")]
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
    /// The helper could not be jailed, so the VM does not run.
    #[cfg(target_os = "linux")]
    #[error("cannot jail the VM helper")]
    Jail(#[from] jail::JailError),
    /// Core dumps could not be turned off, so the VM does not run.
    #[cfg(not(target_os = "linux"))]
    #[error("cannot turn core dumps off: {0}")]
    CoreDumps(std::io::Error),
}

/// By hand, not `#[from]`: the cause is in the message, so it is not a
/// `source()` too (a `{e:#}` chain prints it once).
impl From<boxdesk_hv::HvError> for VmmError {
    fn from(e: boxdesk_hv::HvError) -> Self {
        VmmError::Hv(e)
    }
}

/// What a VM is made of.
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
    pub console: Box<dyn std::io::Write + Send>,
    /// A disk image attached as virtio-blk, and whether it is writable.
    pub rootfs: Option<(PathBuf, bool)>,
    /// Host folders (virtio-fs), and the host's system as the root.
    pub mounts: mounts::VmMounts,
    /// Guest loopback ports the agent relays to the host's vsock port of
    /// the same number (`boxdesk.relay=`), where the muxer hands each
    /// connection to `<vsock_uds>_<port>`.
    pub relays: Vec<u16>,
    /// A display of this width and height: virtio-gpu presenting into a
    /// [`Screen`], a virtio-input keyboard and tablet.
    pub display: Option<(u32, u32)>,
    /// Jail this process once the VM is built, before a vCPU runs
    /// ([`jail`] on Linux; on macOS only core dumps go).
    pub jail: bool,
}

impl std::fmt::Debug for VmSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmSpec")
            .field("kernel", &self.kernel)
            .field("initrd", &self.initrd)
            .field("mem_mib", &self.mem_mib)
            .field("vcpus", &self.vcpus)
            .field("vsock_uds", &self.vsock_uds)
            .field("rootfs", &self.rootfs)
            .field("mounts", &self.mounts)
            .field("relays", &self.relays)
            .field("display", &self.display)
            .field("jail", &self.jail)
            .finish_non_exhaustive()
    }
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

/// How the VM ended, once it has, and what stops its vCPU threads.
#[derive(Default)]
struct Ending {
    end: Mutex<Option<VmEnd>>,
    cv: Condvar,
    stop: AtomicBool,
    /// Run once the VM ends (however it ends): each vCPU's kick, and the
    /// wake-up of secondaries waiting for PSCI `CPU_ON`.
    on_stop: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl Ending {
    /// Records the first end and stops every vCPU; later ends are ignored.
    fn set(&self, end: VmEnd) {
        {
            let mut e = lock(&self.end);
            if e.is_some() {
                return;
            }
            *e = Some(end);
            self.stop.store(true, Ordering::SeqCst);
            self.cv.notify_all();
        }
        for stop in lock(&self.on_stop).iter() {
            stop();
        }
    }

    /// Adds something to run when the VM ends; runs it at once if it has.
    fn on_stop(&self, f: Box<dyn Fn() + Send + Sync>) {
        let mut all = lock(&self.on_stop);
        if self.stop.load(Ordering::SeqCst) {
            f();
        }
        all.push(f);
    }
}

/// A VM's screen and where its input goes.
#[derive(Clone)]
pub struct Display {
    /// The frame slots the guest presents into.
    pub screen: Arc<Screen>,
    /// Its keyboard and tablet.
    pub input: Arc<Inputs>,
}

/// A started VM.
pub struct RunningVm {
    ending: Arc<Ending>,
    console: SharedConsole,
    display: Option<Display>,
    // Held for the VM's life: memory, the VM and the devices.
    _mem: Memory,
    _vm: Arc<HvVm>,
    _devices: Vec<Arc<Mutex<MmioTransport>>>,
    /// Queue kicks through ioeventfds (KVM).
    #[cfg(target_os = "linux")]
    _notifier: notify::Notifier,
}

/// The buses a vCPU's exits go to: port I/O (x86_64 only) and MMIO.
#[derive(Debug, Default)]
pub struct Buses {
    /// x86 port I/O.
    pub pio: Bus,
    /// Memory-mapped I/O.
    pub mmio: Bus,
}

impl std::fmt::Debug for RunningVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningVm").finish_non_exhaustive()
    }
}

/// The agent's parameters, appended to either arch's command line: the
/// `boxdesk.rootfs=` contract for a rootfs disk (`Some(writable)`; it is
/// the only virtio-blk, so `/dev/vda`), then the shares' ([`mounts`]).
fn agent_args(rootfs: Option<bool>, mounts: &mounts::VmMounts, relays: &[u16]) -> String {
    let disk = match rootfs {
        Some(true) => " boxdesk.rootfs=/dev/vda boxdesk.rootfs_rw=1",
        Some(false) => " boxdesk.rootfs=/dev/vda",
        None => "",
    };
    let relays: String = relays
        .iter()
        .map(|p| format!(" boxdesk.relay={p}"))
        .collect();
    format!("{disk}{}{relays}", mounts.agent_args())
}

/// Where DAX window `index` sits: from the first 1 GiB boundary at or
/// above both 4 GiB and the end of RAM (`ram`), one per GiB.
#[cfg(target_os = "linux")]
fn dax_window_at(ram: &[(GuestAddress, usize)], index: usize) -> u64 {
    const GIB: u64 = 1 << 30;
    let top = (ram.iter())
        .map(|&(at, len)| at.0 + len as u64)
        .fold(4 * GIB, u64::max);
    top.div_ceil(GIB) * GIB + index as u64 * GIB
}

/// One virtio-fs device per share of `mounts`, after the others. Each
/// `--share` device gets a DAX window, mapped into `vm` above RAM, unless
/// `BOXDESK_DAX=off`; the host's system dirs (`--root host`) do not (their
/// small reads and `exec`s gain nothing from one). The windows, for the
/// vCPUs' repair of pages past a file's end ([`fs::dax::Window::trim`]).
#[cfg(target_os = "linux")]
fn fs_devices(
    vm: &HvVm,
    ram: &[(GuestAddress, usize)],
    mem_bytes: u64,
    mounts: &mounts::VmMounts,
    virtio: &mut Vec<Box<dyn VirtioDevice>>,
) -> Result<Vec<Arc<fs::dax::Window>>, VmmError> {
    let dax = std::env::var_os("BOXDESK_DAX").is_none_or(|v| v != "off");
    let mut windows = Vec::new();
    for (i, share) in mounts.fs_shares().into_iter().enumerate() {
        let mut fs = fs::Fs::new(share).map_err(dev("virtio-fs"))?;
        if i >= mounts.system.len() && dax {
            let at = GuestAddress(dax_window_at(ram, windows.len()));
            let window = fs::dax::Window::new(at, fs::dax::window_size(mem_bytes))
                .map_err(dev("virtio-fs"))?;
            vm.map_memory(window.region(), MapFlags::default())?;
            fs = fs.with_window(window.clone());
            windows.push(window);
        }
        virtio.push(Box::new(fs));
    }
    Ok(windows)
}

/// No virtio-fs server on this host: a VM with shares is refused.
#[cfg(not(target_os = "linux"))]
fn fs_devices(
    _vm: &HvVm,
    _ram: &[(GuestAddress, usize)],
    _mem_bytes: u64,
    mounts: &mounts::VmMounts,
    _virtio: &mut Vec<Box<dyn VirtioDevice>>,
) -> Result<Vec<std::convert::Infallible>, VmmError> {
    if mounts.is_empty() {
        Ok(Vec::new())
    } else {
        Err(VmmError::Device {
            what: "virtio-fs",
            why: mounts::NO_SERVER.into(),
        })
    }
}

/// What a vCPU does when the host could not back a page the guest
/// touched: trims every DAX window (a file shrunk on the host under a
/// mapping); whether that changed anything.
#[cfg(target_os = "linux")]
fn on_memory_fault(windows: Vec<Arc<fs::dax::Window>>) -> Arc<dyn Fn() -> bool + Send + Sync> {
    Arc::new(move || windows.iter().filter(|w| w.trim()).count() > 0)
}

/// No DAX windows here: nothing to repair.
#[cfg(not(target_os = "linux"))]
fn on_memory_fault(_: Vec<std::convert::Infallible>) -> Arc<dyn Fn() -> bool + Send + Sync> {
    Arc::new(|| false)
}

/// Jails the calling process ([`jail::lock_down`] in the mode
/// `BOXDESK_SECCOMP` says).
#[cfg(target_os = "linux")]
fn jail_process(serves_files: bool) -> Result<(), VmmError> {
    Ok(jail::lock_down(jail::Mode::from_env(), serves_files)?)
}

/// What macOS allows without a sandbox profile (which needs the App
/// Sandbox entitlement at signing time): no core dumps, so guest memory
/// never lands in a core file.
#[cfg(not(target_os = "linux"))]
fn jail_process(_serves_files: bool) -> Result<(), VmmError> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(|e| VmmError::CoreDumps(e.into()))
}

/// The display's devices, after the others: virtio-gpu, then the
/// keyboard and the tablet.
fn display_devices(
    width: u32,
    height: u32,
    virtio: &mut Vec<Box<dyn VirtioDevice>>,
) -> Result<Display, VmmError> {
    let screen = Arc::new(Screen::new(width, height).map_err(dev("virtio-gpu"))?);
    let keyboard = Input::keyboard();
    let pointer = Input::tablet(width, height);
    let input = Arc::new(Inputs {
        keyboard: keyboard.handle(),
        pointer: pointer.handle(),
    });
    virtio.push(Box::new(Gpu::new(screen.clone())));
    virtio.push(Box::new(keyboard));
    virtio.push(Box::new(pointer));
    Ok(Display { screen, input })
}

/// A virtio-fs DAX window the vCPUs repair pages of (none off Linux).
#[cfg(target_os = "linux")]
type DaxWindow = Arc<fs::dax::Window>;
/// No DAX windows off Linux.
#[cfg(not(target_os = "linux"))]
type DaxWindow = std::convert::Infallible;

/// Refuses a vCPU count of 0 or more than the hypervisor (and boxdesk's
/// layouts) allow.
fn check_vcpus(hv: &DefaultHypervisor, vcpus: u32) -> Result<(), VmmError> {
    let max = hv
        .capabilities()
        .max_vcpus
        .clamp(1, host::MAX_VCPUS.min(64));
    if vcpus == 0 || vcpus > max {
        return Err(VmmError::Vcpus(vcpus, max));
    }
    Ok(())
}

/// Loads `spec`'s kernel and initramfs into guest memory.
fn load_guest(spec: &VmSpec, mem: &Memory) -> Result<host::Loaded, VmmError> {
    let open = |p: &PathBuf| {
        File::open(p).map_err(|source| VmmError::Open {
            path: p.clone(),
            error: source,
        })
    };
    Ok(host::load(
        mem,
        &mut open(&spec.kernel)?,
        &mut open(&spec.initrd)?,
    )?)
}

/// The VM's virtio devices in slot order: vsock, the root disk (`--rootfs`),
/// one virtio-fs per share, then the display's; with the shares' DAX
/// windows and the display.
#[allow(clippy::type_complexity)]
fn virtio_devices(
    spec: &VmSpec,
    vm: &HvVm,
    ram: &[(GuestAddress, usize)],
    mem_bytes: u64,
) -> Result<(Vec<Box<dyn VirtioDevice>>, Vec<DaxWindow>, Option<Display>), VmmError> {
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
                error: source,
            })?;
        let blk =
            boxdesk_devices::blk::Blk::new(f, !writable, "boxdesk-rootfs").map_err(dev("blk"))?;
        virtio.push(Box::new(blk));
    }
    let windows = fs_devices(vm, ram, mem_bytes, &spec.mounts, &mut virtio)?;
    let display = match spec.display {
        Some((w, h)) => Some(display_devices(w, h, &mut virtio)?),
        None => None,
    };
    Ok((virtio, windows, display))
}

/// The transports of a VM's devices, in slot order.
type Transports = Vec<Arc<Mutex<MmioTransport>>>;

/// Puts each device behind a virtio-mmio transport in the next slot (its
/// address on the MMIO bus, its interrupt line); the slots, for the boot
/// tables, and the transports.
fn attach_virtio(
    virtio: Vec<Box<dyn VirtioDevice>>,
    mem: &Memory,
    irqs: &mut irq::Lines,
    buses: &mut Buses,
) -> Result<(Vec<(u64, u32)>, Transports), VmmError> {
    let mut slots = Vec::new();
    let mut devices = Vec::new();
    for (i, d) in virtio.into_iter().enumerate() {
        let (addr, line) = host::virtio_slot(i).ok_or(VmmError::Device {
            what: "virtio-mmio",
            why: "out of slots".into(),
        })?;
        let t = Arc::new(Mutex::new(MmioTransport::new(
            d,
            mem.clone(),
            irqs.line(line)?,
        )));
        buses
            .mmio
            .insert(addr, 0x1000, t.clone())
            .map_err(dev("virtio-mmio"))?;
        slots.push((addr, line));
        devices.push(t);
    }
    Ok((slots, devices))
}

/// Once the VM ends, however it ends, its devices stop: their threads go
/// and their host sockets close, so a client waiting on the guest learns
/// at once (a dead VM's muxer must not keep its connections open while
/// its owner still holds the VM); the display's leaseholders get `end
/// stopped`.
fn stop_with_the_vm(ending: &Ending, devices: &Transports, display: Option<&Display>) {
    let stopped = devices.clone();
    let screen = display.map(|d| d.screen.clone());
    ending.on_stop(Box::new(move || {
        for t in &stopped {
            lock(t).stop();
        }
        if let Some(s) = &screen {
            s.stop();
        }
    }));
}

impl RunningVm {
    /// Builds and starts the VM of `spec`: every error about files, sizes
    /// and images comes before any vCPU runs.
    pub fn start(mut spec: VmSpec) -> Result<RunningVm, VmmError> {
        if !(64..=65536).contains(&spec.mem_mib) {
            return Err(VmmError::Memory(spec.mem_mib));
        }
        let hv = DefaultHypervisor::open()?;
        check_vcpus(&hv, spec.vcpus)?;
        let mem_bytes = u64::from(spec.mem_mib) << 20;
        let ram = host::ram_regions(mem_bytes);
        let (mem, regions) = guest_ram(&ram)?;
        let loaded = load_guest(&spec, &mem)?;

        let vm = Arc::new(hv.create_vm(&host::vm_config(spec.vcpus))?);
        for region in &regions {
            vm.map_memory(region, MapFlags::default())?;
        }
        let ending = Arc::new(Ending::default());
        let mut buses = Buses::default();
        let mut irqs = irq::Lines::new(&vm);
        let e = ending.clone();
        let on_reset = Box::new(move || e.set(VmEnd::Reset));
        let out = std::mem::replace(&mut spec.console, Box::new(std::io::sink()));
        let console = host::add_devices(&mut irqs, out, on_reset, &mut buses)?;
        let (virtio, windows, display) = virtio_devices(&spec, &vm, &ram, mem_bytes)?;
        let (slots, devices) = attach_virtio(virtio, &mem, &mut irqs, &mut buses)?;
        stop_with_the_vm(&ending, &devices, display.as_ref());
        #[cfg(target_os = "linux")]
        let notifier = {
            let windows: Vec<_> = (slots.iter().map(|s| s.0))
                .zip(devices.iter().cloned())
                .collect();
            notify::Notifier::start(&vm, &windows)?
        };
        let agent = agent_args(
            spec.rootfs.as_ref().map(|r| r.1),
            &spec.mounts,
            &spec.relays,
        );
        let boot = host::write_boot(&mem, &loaded, &slots, &agent, spec.vcpus, mem_bytes)?;

        let vm = RunningVm {
            ending,
            console,
            display,
            _mem: mem,
            _vm: vm,
            _devices: devices,
            #[cfg(target_os = "linux")]
            _notifier: notifier,
        };
        vm.run(&spec, buses, irqs, boot, windows)
    }

    /// The last step of [`RunningVm::start`]: every vCPU is created and set
    /// up (on its own thread) before the VM is finalised (KVM arm64's vGIC
    /// init needs them all), the interrupt lines connected and the process
    /// jailed; only then may any vCPU run. On an error the VM is killed.
    fn run(
        self,
        spec: &VmSpec,
        buses: Buses,
        irqs: irq::Lines,
        boot: host::Boot,
        windows: Vec<DaxWindow>,
    ) -> Result<RunningVm, VmmError> {
        let go = vcpu::start_all(&vcpu::Shared {
            vm: self._vm.clone(),
            mem: self._mem.clone(),
            buses: Arc::new(buses),
            ending: self.ending.clone(),
            console: self.console.clone(),
            boot: Arc::new(boot),
            vcpus: spec.vcpus,
            on_memory_fault: on_memory_fault(windows),
        });
        let serves_files = !spec.mounts.is_empty();
        let ready = go.and_then(|go| {
            self._vm.finalize()?;
            irqs.connect()?;
            if spec.jail {
                jail_process(serves_files)?;
            }
            Ok(go)
        });
        match ready {
            Ok(go) => {
                go.start();
                Ok(self)
            }
            Err(e) => {
                self.kill();
                Err(e)
            }
        }
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
    }

    /// Its screen and input devices, when it has a display.
    pub fn display(&self) -> Option<&Display> {
        self.display.as_ref()
    }

    /// The serial console's last output.
    pub fn serial_tail(&self) -> String {
        console_tail(&self.console)
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Anonymous guest RAM over `ranges`, and its regions (the VM holds them
/// while they are mapped).
pub(crate) fn guest_ram(
    ranges: &[(GuestAddress, usize)],
) -> Result<(Memory, Vec<Arc<GuestRegionMmap>>), VmmError> {
    let alloc = |e: &dyn std::fmt::Display| VmmError::Alloc(e.to_string());
    let regions = ranges
        .iter()
        .map(|&(at, size)| {
            let mapping = MmapRegion::new(size).map_err(|e| alloc(&e))?;
            GuestRegionMmap::new(mapping, at)
                .map(Arc::new)
                .ok_or_else(|| alloc(&"a region past the end of the address space"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mem = Memory::from_arc_regions(regions.clone()).map_err(|e| alloc(&e))?;
    Ok((mem, regions))
}

fn console_tail(console: &SharedConsole) -> String {
    let tail = lock(console).tail();
    String::from_utf8_lossy(&tail).into_owned()
}

fn dev<E: std::error::Error>(what: &'static str) -> impl Fn(E) -> VmmError {
    move |e| VmmError::Device {
        what,
        why: boxdesk_platform::report::chain(&e),
    }
}
