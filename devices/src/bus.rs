//! The bus: an address → device map. A vCPU turns each MMIO (or, on
//! x86_64, port-I/O) exit into one [`Bus::read`] or [`Bus::write`]; devices
//! see an offset into their own range and never a hypervisor type.

use std::sync::{Arc, Mutex};

/// A device on the bus.
pub trait BusDevice: Send {
    /// The guest reads `data.len()` bytes at `offset` into the device's range.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset` into the device's range.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// Why a device cannot be inserted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BusError {
    /// The range is empty or overlaps a device already there.
    #[error("bus range {base:#x}+{len:#x} is empty or overlaps another device")]
    Overlap {
        /// Start of the range.
        base: u64,
        /// Its length.
        len: u64,
    },
}

/// A device as the bus holds it (shared with the VMM, locked per access).
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// One bus (MMIO or PIO).
#[derive(Default, Clone)]
pub struct Bus {
    /// `(base, len, device)`, sorted by base; ranges never overlap.
    devices: Vec<(u64, u64, SharedDevice)>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.devices.iter().map(|(b, l, _)| (b, l)))
            .finish()
    }
}

impl Bus {
    /// Puts `dev` at `[base, base + len)`.
    pub fn insert(&mut self, base: u64, len: u64, dev: SharedDevice) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::Overlap { base, len })?;
        if self
            .devices
            .iter()
            .any(|(b, l, _)| base < b + l && *b < end)
        {
            return Err(BusError::Overlap { base, len });
        }
        let at = self.devices.partition_point(|(b, _, _)| *b < base);
        self.devices.insert(at, (base, len, dev));
        Ok(())
    }

    fn find(&self, addr: u64) -> Option<(u64, &SharedDevice)> {
        let i = self
            .devices
            .partition_point(|(b, _, _)| *b <= addr)
            .checked_sub(1)?;
        let (base, len, dev) = &self.devices[i];
        (addr - base < *len).then_some((addr - base, dev))
    }

    /// A guest read at `addr`; `false` (data untouched) when no device is there.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((off, dev)) => {
                dev.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .read(off, data);
                true
            }
            None => false,
        }
    }

    /// A guest write at `addr`; `false` when no device is there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.find(addr) {
            Some((off, dev)) => {
                dev.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .write(off, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Reg(u8);
    impl BusDevice for Reg {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(self.0.wrapping_add(offset as u8));
        }
        fn write(&mut self, _offset: u64, data: &[u8]) {
            self.0 = data[0];
        }
    }

    #[test]
    fn accesses_reach_the_device_at_their_offset_and_gaps_reach_nothing() {
        let mut bus = Bus::default();
        bus.insert(0x1000, 0x10, Arc::new(Mutex::new(Reg(1))))
            .unwrap();
        bus.insert(0x3000, 0x10, Arc::new(Mutex::new(Reg(7))))
            .unwrap();
        let mut b = [0u8; 1];
        assert!(bus.read(0x1004, &mut b));
        assert_eq!(b, [5]);
        assert!(!bus.read(0x1010, &mut b));
        assert!(bus.write(0x3000, &[9]));
        assert!(bus.read(0x3001, &mut b));
        assert_eq!(b, [10]);
        assert!(bus.insert(0x100f, 2, Arc::new(Mutex::new(Reg(0)))).is_err());
        assert!(bus
            .insert(u64::MAX, 2, Arc::new(Mutex::new(Reg(0))))
            .is_err());
    }
}
