//! The threads of a process that may be jailed: each has a [`Class`], and
//! [`spawn`] starts one that enters its class's jail before its body runs.
//!
//! The jail itself (a VM helper's seccomp filters) is the VMM's: it hands
//! this module a hook with [`install`], once per process. Until then (unit
//! tests, the namespace backend, cowork) [`spawn`] is a named
//! `std::thread` spawn and [`enter`] does nothing.
//!
//! A thread inherits the seccomp filters of the thread that creates it, so
//! once a hook is installed [`spawn`] does not create threads where it is
//! called: a vCPU thread activating a device must not hand its narrow
//! filter to the device's threads. It passes the spawn to a factory thread
//! started by [`install`] (before the process-wide filter, so it holds
//! only that one), which creates the thread and hands back its handle.

use std::io;
use std::sync::mpsc::{channel, sync_channel, Sender};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

/// What a thread does, which decides what it may ask of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Runs one vCPU: guest exits into the buses, nothing else.
    Vcpu,
    /// A device's event loop (vsock, virtio-gpu, the queue notifier).
    Device,
    /// Serves one connection of the control socket.
    Control,
    /// A virtio-fs worker: the host file system beneath a share.
    FileServer,
}

impl Class {
    /// Every class.
    pub const ALL: [Class; 4] = [
        Class::Vcpu,
        Class::Device,
        Class::Control,
        Class::FileServer,
    ];

    /// Its name in logs and reports.
    pub fn name(self) -> &'static str {
        match self {
            Class::Vcpu => "vcpu",
            Class::Device => "device",
            Class::Control => "control",
            Class::FileServer => "file-server",
        }
    }
}

/// What enters a thread into its class's jail; it returns only once the
/// thread is jailed, or ends the process.
pub type Enter = Box<dyn Fn(Class) + Send + Sync>;

type Job = Box<dyn FnOnce() + Send>;

struct Installed {
    enter: Enter,
    factory: Mutex<Sender<Job>>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Why [`install`] did nothing.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A hook is installed already (one jail per process).
    #[error("a thread jail is installed already")]
    Twice,
    /// The factory thread could not start.
    #[error("cannot start the thread factory")]
    Factory(#[source] io::Error),
}

/// Installs `enter` as the jail of every later [`spawn`] and [`enter`],
/// and starts the factory thread those spawns go through.
pub fn install(enter: Enter) -> Result<(), InstallError> {
    if INSTALLED.get().is_some() {
        return Err(InstallError::Twice);
    }
    let (tx, rx) = channel::<Job>();
    std::thread::Builder::new()
        .name("threads".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            for job in rx {
                job();
            }
        })
        .map_err(InstallError::Factory)?;
    INSTALLED
        .set(Installed {
            enter,
            factory: Mutex::new(tx),
        })
        .map_err(|_| InstallError::Twice)
}

/// Enters the calling thread into `class`'s jail, when one is installed.
pub fn enter(class: Class) {
    if let Some(i) = INSTALLED.get() {
        (i.enter)(class);
    }
}

/// Whether a jail is installed in this process.
pub fn jailed() -> bool {
    INSTALLED.get().is_some()
}

/// Starts a thread named `name` that enters `class`'s jail, then runs `f`.
pub fn spawn<F, T>(name: String, class: Class, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let body = move || {
        enter(class);
        f()
    };
    let Some(installed) = INSTALLED.get() else {
        return std::thread::Builder::new().name(name).spawn(body);
    };
    let (tx, rx) = sync_channel(1);
    let job: Job = Box::new(move || {
        let _ = tx.send(std::thread::Builder::new().name(name).spawn(body));
    });
    crate::sync::lock(&installed.factory)
        .send(job)
        .map_err(|_| io::Error::other("the thread factory is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the thread factory dropped a spawn"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_jail_a_spawned_thread_has_its_name_and_returns_its_value() {
        let t = spawn("probe".into(), Class::Device, || {
            std::thread::current().name().map(str::to_owned)
        })
        .unwrap();
        assert_eq!(t.join().unwrap().as_deref(), Some("probe"));
        assert!(!jailed());
    }
}
