//! Queue notifications without an exit to userspace (KVM): each virtio
//! queue's `QueueNotify` write is an ioeventfd, so the vCPU that kicks a
//! queue goes straight back into the guest while one thread of the VMM
//! ([`Notifier`]) reads the eventfds and tells the device. Without this,
//! every kick (one per FUSE request, per vsock packet batch) costs a full
//! exit to the vCPU thread and the bus lookup — under nested KVM several
//! emulated world switches each.
//!
//! Writes the ioeventfds do not match (another value, another size) still
//! exit and reach the transport through the MMIO bus, as on
//! Hypervisor.framework, which has no ioeventfds and does not use this
//! module.
//!
//! This module owns the eventfds and the thread; it must never touch a
//! device except through its transport's lock, the same way a vCPU does.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use boxdesk_devices::virtio::mmio::{MmioTransport, QUEUE_NOTIFY_OFFSET};
use boxdesk_platform::sync::lock;
use boxdesk_platform::threads::{self, Class};
use vmm_sys_util::eventfd::EventFd;

use crate::{HvVm, VmmError};

/// The thread that turns signalled queue eventfds into notifications;
/// dropping it stops and joins the thread.
pub(crate) struct Notifier {
    stop: EventFd,
    thread: Option<JoinHandle<()>>,
}

/// One queue's eventfd and where it goes.
struct Kick {
    event: EventFd,
    transport: Arc<Mutex<MmioTransport>>,
    queue: u32,
}

impl Notifier {
    /// Registers an ioeventfd for every queue of every device (`(window
    /// address, transport)`) and starts the thread serving them. Call it
    /// before any vCPU runs.
    pub(crate) fn start(
        vm: &HvVm,
        devices: &[(u64, Arc<Mutex<MmioTransport>>)],
    ) -> Result<Notifier, VmmError> {
        let fail = |e: std::io::Error| VmmError::Device {
            what: "queue eventfd",
            why: e.to_string(),
        };
        let mut kicks = Vec::new();
        for (addr, transport) in devices {
            let queues = lock(transport).queue_count();
            for queue in 0..queues as u32 {
                let event = EventFd::new(libc::EFD_NONBLOCK).map_err(fail)?;
                vm.register_ioevent(&event, addr + QUEUE_NOTIFY_OFFSET, queue)?;
                kicks.push(Kick {
                    event,
                    transport: transport.clone(),
                    queue,
                });
            }
        }
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(fail)?;
        let their_stop = stop.try_clone().map_err(fail)?;
        let thread = std::thread::Builder::new()
            .name("virtio-notify".into())
            .spawn(move || serve(&kicks, &their_stop))
            .map_err(VmmError::Thread)?;
        Ok(Notifier {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits on every kick and `stop`; a signalled kick notifies its queue.
fn serve(kicks: &[Kick], stop: &EventFd) {
    let mut fds: Vec<libc::pollfd> = kicks
        .iter()
        .map(|k| k.event.as_raw_fd())
        .chain([stop.as_raw_fd()])
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut entered = false;
    loop {
        // SAFETY: `fds` is a live, exclusively borrowed array of `len`
        // pollfds whose descriptors `kicks` and `stop` keep open.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            // EINTR, or ENOMEM for a moment: the descriptors and the array
            // are valid by construction, so poll again.
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!("virtio-notify: poll: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        if fds[kicks.len()].revents != 0 {
            return;
        }
        // Started before the process was jailed: the thread narrows itself
        // at its first wake after that, before it touches a device.
        if !entered && threads::jailed() {
            threads::enter(Class::Device);
            entered = true;
        }
        for (kick, fd) in kicks.iter().zip(&mut fds) {
            if fd.revents == 0 {
                continue;
            }
            fd.revents = 0;
            // Reading resets the counter: kicks that came together are one
            // notification, as the device serves whatever is on the queue.
            if kick.event.read().is_ok() {
                lock(&kick.transport).notify(kick.queue);
            }
        }
    }
}
