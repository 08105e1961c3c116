//! The VM's GICv3 on Hypervisor.framework: the framework's own (`hv_gic_*`,
//! macOS 15+, found with `dlsym` so the binary still loads on 13 and 14) or
//! the portable userspace model behind a lock.
//!
//! Set `BOXDESK_HVF_USERSPACE_GIC=1` to use the userspace model even where
//! the framework has one (for testing it on macOS 15).

use std::ffi::{c_void, CStr};
use std::sync::Mutex;

use applevisor_sys::{hv_ipa_t, hv_return_t, os_release};

use super::HvfError;
use crate::arch::aarch64::{GicConfig, GICD_SIZE, GICR_SIZE_PER_CPU};
use crate::gic::GicV3;

type ConfigCreate = unsafe extern "C" fn() -> *mut c_void;
type ConfigSetBase = unsafe extern "C" fn(*mut c_void, hv_ipa_t) -> hv_return_t;
type Create = unsafe extern "C" fn(*mut c_void) -> hv_return_t;
type SetSpi = unsafe extern "C" fn(u32, bool) -> hv_return_t;

/// The `hv_gic_*` entry points this backend uses.
#[derive(Debug, Clone, Copy)]
pub(super) struct FrameworkGic {
    config_create: ConfigCreate,
    set_distributor_base: ConfigSetBase,
    set_redistributor_base: ConfigSetBase,
    create: Create,
    set_spi: SetSpi,
}

fn symbol(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_DEFAULT searches the loaded images (Hypervisor.framework
    // is linked); `name` is NUL-terminated. dlsym has no other precondition.
    let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

impl FrameworkGic {
    /// The framework's GIC calls, or `None` before macOS 15.
    fn lookup() -> Option<Self> {
        if std::env::var_os("BOXDESK_HVF_USERSPACE_GIC").is_some_and(|v| v == "1") {
            return None;
        }
        let config_create = symbol(c"hv_gic_config_create")?;
        let set_distributor_base = symbol(c"hv_gic_config_set_distributor_base")?;
        let set_redistributor_base = symbol(c"hv_gic_config_set_redistributor_base")?;
        let create = symbol(c"hv_gic_create")?;
        let set_spi = symbol(c"hv_gic_set_spi")?;
        // SAFETY: each symbol is the framework function of that name, whose C
        // signature (hv_gic.h, macOS 15) is exactly the fn type it becomes.
        unsafe {
            Some(Self {
                config_create: std::mem::transmute::<*mut c_void, ConfigCreate>(config_create),
                set_distributor_base: std::mem::transmute::<*mut c_void, ConfigSetBase>(
                    set_distributor_base,
                ),
                set_redistributor_base: std::mem::transmute::<*mut c_void, ConfigSetBase>(
                    set_redistributor_base,
                ),
                create: std::mem::transmute::<*mut c_void, Create>(create),
                set_spi: std::mem::transmute::<*mut c_void, SetSpi>(set_spi),
            })
        }
    }

    /// `hv_gic_create` at the VMM's addresses; must follow `hv_vm_create`
    /// and precede every `hv_vcpu_create`.
    fn create_at(&self, config: &GicConfig) -> Result<(), HvfError> {
        // SAFETY: the calls follow hv_gic.h: create a config object, set its
        // bases, create the GIC from it, release the config (os_object).
        unsafe {
            let cfg = (self.config_create)();
            if cfg.is_null() {
                return Err(HvfError::Return("hv_gic_config_create", -1));
            }
            let rc = [
                (
                    "hv_gic_config_set_distributor_base",
                    (self.set_distributor_base)(cfg, config.distributor),
                ),
                (
                    "hv_gic_config_set_redistributor_base",
                    (self.set_redistributor_base)(cfg, config.redistributors),
                ),
            ]
            .into_iter()
            .find(|(_, rc)| *rc != 0);
            let rc = match rc {
                Some((what, rc)) => Err(HvfError::Return(what, rc)),
                None => match (self.create)(cfg) {
                    0 => Ok(()),
                    rc => Err(HvfError::Return("hv_gic_create", rc)),
                },
            };
            os_release(cfg);
            rc
        }
    }
}

/// The GIC of one VM.
#[derive(Debug)]
pub(super) enum Gic {
    /// No interrupt controller was asked for.
    None,
    /// The framework's GICv3 (macOS 15+).
    Framework(FrameworkGic),
    /// The userspace model, and where the VMM put it.
    Userspace(Mutex<GicV3>, GicConfig),
}

impl Gic {
    /// Creates the GIC `config` asks for, preferring the framework's.
    pub fn new(config: Option<GicConfig>) -> Result<Self, HvfError> {
        let Some(config) = config else {
            return Ok(Self::None);
        };
        match FrameworkGic::lookup() {
            Some(framework) => {
                framework.create_at(&config)?;
                Ok(Self::Framework(framework))
            }
            None => Ok(Self::Userspace(
                Mutex::new(GicV3::new(0, config.spis)),
                config,
            )),
        }
    }

    /// Drives SPI `spi`. Returns `true` when the userspace model changed
    /// (the caller re-evaluates vCPU IRQ lines).
    pub fn set_spi(&self, spi: u32, level: bool) -> Result<bool, HvfError> {
        match self {
            Self::None => Err(HvfError::Emulation(
                "no interrupt controller in this vm".into(),
            )),
            Self::Framework(f) => {
                // SAFETY: hv_gic_set_spi takes an INTID and a level; the GIC exists.
                match unsafe { (f.set_spi)(spi + 32, level) } {
                    0 => Ok(false),
                    rc => Err(HvfError::Return("hv_gic_set_spi", rc)),
                }
            }
            Self::Userspace(model, _) => {
                model
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .set_spi_level(spi, level);
                Ok(true)
            }
        }
    }

    /// The userspace model and its frames, when that is what this VM uses.
    pub fn userspace(&self) -> Option<(&Mutex<GicV3>, &GicConfig)> {
        match self {
            Self::Userspace(model, config) => Some((model, config)),
            _ => None,
        }
    }
}

/// Where a guest-physical address falls in the userspace GIC's frames.
pub(super) enum GicFrame {
    Distributor(u64),
    Redistributor(u64),
}

/// Classifies `ipa` against the GIC frames of `config` for `vcpus` vCPUs.
pub(super) fn frame(config: &GicConfig, vcpus: usize, ipa: u64) -> Option<GicFrame> {
    let dist = ipa
        .checked_sub(config.distributor)
        .filter(|off| *off < GICD_SIZE);
    let redist = ipa
        .checked_sub(config.redistributors)
        .filter(|off| *off < GICR_SIZE_PER_CPU * vcpus as u64);
    dist.map(GicFrame::Distributor)
        .or(redist.map(GicFrame::Redistributor))
}
