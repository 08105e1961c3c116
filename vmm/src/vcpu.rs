//! The vCPU threads: each creates its vCPU (a vCPU belongs to the thread
//! that created it), sets up its boot state through the host's machine,
//! reports ready, waits for [`Go::start`], enters the vCPU jail (when the
//! process is jailed: `crate::jail`), and turns every exit into one
//! bus call until the VM ends. An exit the VMM cannot serve ends the VM as
//! a crash with the console's tail. With VMM-side PSCI (aarch64 on
//! Hypervisor.framework) the machine's `before_run` holds a secondary until
//! the guest's `CPU_ON`, and `psci` answers the calls the backend leaves.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use boxdesk_devices::console::SharedConsole;
use boxdesk_devices::virtio::Memory;
use boxdesk_hv::{SystemEvent, Vcpu, VcpuExit, VcpuKick, Vm as _};
use boxdesk_platform::threads::Class;

use super::arch::host;
use super::{console_tail, Buses, Ending, HvVcpu, HvVm, VmEnd, VmmError};

/// What every vCPU thread shares.
#[derive(Clone)]
pub(super) struct Shared {
    pub vm: Arc<HvVm>,
    pub mem: Memory,
    pub buses: Arc<Buses>,
    pub ending: Arc<Ending>,
    pub console: SharedConsole,
    pub boot: Arc<host::Boot>,
    pub vcpus: u32,
    /// Backs what it can of guest pages the host could not provide (a
    /// DAX window's pages past a file's end); whether it changed anything.
    pub on_memory_fault: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// The vCPU threads, set up and waiting for [`Go::start`]; dropped without
/// it, they end without running the guest.
pub(super) struct Go(Vec<Sender<()>>);

impl Go {
    /// Lets every vCPU enter the guest.
    pub fn start(self) {
        for tx in &self.0 {
            let _ = tx.send(());
        }
    }
}

/// Starts one thread per vCPU, one after the other: each has its vCPU set
/// up before the next starts; the threads then wait for [`Go::start`].
/// Fails with the first setup error, or when a thread died before
/// reporting.
///
/// One at a time because KVM arm64 before Linux 6.4 keeps the virtual
/// counter's offset per vCPU and, as each vCPU is created, sets every
/// listed vCPU's offset to "now". A vCPU created alongside another, and not
/// yet listed when the other's creation ran, keeps an older offset: the
/// guest's CPUs then read counters that disagree, and its timekeeping runs
/// away (seconds accumulated one by one over decades) on the first CPU
/// that reads the counter behind after the one ahead. In order, each vCPU's
/// KVM index is also its id.
pub(super) fn start_all(shared: &Shared) -> Result<Go, VmmError> {
    let boot = shared.boot.clone();
    shared.ending.on_stop(Box::new(move || boot.wake_all()));
    let mut go = Go(Vec::new());
    for id in 0..shared.vcpus {
        let (ready, ready_rx) = channel();
        let (go_tx, go_rx) = channel();
        go.0.push(go_tx);
        let s = shared.clone();
        std::thread::Builder::new()
            .name(format!("vcpu{id}"))
            .spawn(move || {
                let Some(mut vcpu) = setup(id, &s, ready) else {
                    return;
                };
                if go_rx.recv().is_ok() {
                    boxdesk_platform::threads::enter(Class::Vcpu);
                    #[cfg(target_os = "linux")]
                    super::jail::test_forbidden_call();
                    run(id, &mut vcpu, &s);
                }
                let _ = std::io::stderr().flush();
            })
            .map_err(VmmError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(VmmError::Thread(std::io::Error::other(
                    "a vCPU thread died during setup",
                )))
            }
        }
    }
    Ok(go)
}

/// Creates vCPU `id` on this thread and sets up its boot state.
fn setup(id: u32, s: &Shared, ready: Sender<Result<(), VmmError>>) -> Option<HvVcpu> {
    let vcpu =
        s.vm.create_vcpu(id)
            .map_err(VmmError::from)
            .and_then(|mut v| {
                host::setup_vcpu(&mut v, &s.mem, id, s.vcpus, &s.boot)?;
                Ok(v)
            });
    match vcpu {
        Ok(vcpu) => {
            let kick = vcpu.kick_handle();
            s.ending.on_stop(Box::new(move || kick.kick()));
            let _ = ready.send(Ok(()));
            Some(vcpu)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            None
        }
    }
}

/// Ends the VM as a crash of vCPU `id`.
fn crash(s: &Shared, id: u32, what: impl std::fmt::Display) {
    s.ending.set(VmEnd::Crash {
        reason: format!("vCPU {id}: {what}"),
        serial: console_tail(&s.console),
    });
}

/// Runs vCPU `id` until the VM ends.
fn run(id: u32, vcpu: &mut HvVcpu, s: &Shared) {
    let stop = &s.ending.stop;
    match host::before_run(vcpu, id, &s.boot, stop) {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => return crash(s, id, e),
    }
    let mut buf = [0u8; 8];
    // Memory faults in a row that nothing was found to repair: the first
    // may have been repaired by another vCPU meanwhile, the second not.
    let mut unrepaired = 0;
    while !stop.load(Ordering::SeqCst) {
        let exit = match vcpu.run() {
            Ok(exit) => exit,
            Err(e) => return crash(s, id, e),
        };
        if !matches!(exit, VcpuExit::MemoryFault) {
            unrepaired = 0;
        }
        match exit {
            VcpuExit::MemoryFault => {
                let repaired = (s.on_memory_fault)();
                tracing::warn!(
                    "vCPU {id}: the host could not back a guest page; {}",
                    if repaired {
                        "pages past a shrunk file's end now read as zeros"
                    } else {
                        "nothing found to repair"
                    }
                );
                if repaired {
                    unrepaired = 0;
                } else {
                    unrepaired += 1;
                    if unrepaired > 1 {
                        return crash(
                            s,
                            id,
                            "the guest touched memory the host cannot back \
                             (no file page behind a DAX window page)",
                        );
                    }
                }
            }
            VcpuExit::Pio { port, len, write } => match write {
                Some(data) => {
                    s.buses.pio.write(u64::from(port), &data);
                }
                None => {
                    let b = &mut buf[..len.min(8)];
                    b.fill(0xff);
                    s.buses.pio.read(u64::from(port), b);
                    let _ = vcpu.complete_read(b);
                }
            },
            VcpuExit::Mmio { addr, len, write } => match write {
                Some(data) => {
                    s.buses.mmio.write(addr, &data);
                }
                None => {
                    let b = &mut buf[..len.min(8)];
                    b.fill(0);
                    s.buses.mmio.read(addr, b);
                    let _ = vcpu.complete_read(b);
                }
            },
            VcpuExit::Hlt | VcpuExit::Cancelled => {}
            VcpuExit::Shutdown | VcpuExit::SystemEvent(SystemEvent::Reset) => {
                s.ending.set(VmEnd::Reset)
            }
            VcpuExit::SystemEvent(SystemEvent::Poweroff) => s.ending.set(VmEnd::Poweroff),
            #[cfg(target_arch = "aarch64")]
            VcpuExit::Psci(call) => match host::psci(vcpu, id, call, &s.boot, stop) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return crash(s, id, e),
            },
            other => return crash(s, id, format_args!("{other:?}")),
        }
    }
}
