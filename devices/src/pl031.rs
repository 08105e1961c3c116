//! The Arm PrimeCell PL031 real-time clock (`vm_superio::Rtc`) as a
//! [`BusDevice`] of [`PL031_SIZE`] bytes: the aarch64 guest's wall clock,
//! read by Linux's `rtc-pl031` driver at boot. It counts seconds since the
//! Unix epoch from the host's clock, offset by whatever the guest loads.
//!
//! No interrupt line is wired: the alarm (the match register) is stored
//! but never fires (`vm_superio` does not implement it), and Linux's boot
//! does not wait for it. The FDT node may still name an interrupt, which
//! then simply never comes.
//!
//! Owns: the RTC's registers (load value, offset from the host clock,
//! match, mask). Must never: panic on any access (anything but an aligned
//! 4-byte access is ignored and reads as 0; so is an access to the time
//! while the host clock reads before 1970, which `vm_superio` would panic
//! on), or change the host's clock.

use std::time::{SystemTime, UNIX_EPOCH};

use tracing::debug;
use vm_superio::rtc_pl031::RtcEvents;
use vm_superio::Rtc;

use crate::bus::BusDevice;

/// The length of the PL031's bus range.
pub const PL031_SIZE: u64 = 0x1000;

/// Data: the current time (read-only).
const RTCDR: u64 = 0x000;
/// Load: sets the current time (write).
const RTCLR: u64 = 0x008;

/// What the RTC ignored (debug logs only: the guest never sees an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Pl031Error {
    /// An access other than 4 aligned bytes inside the device.
    #[error("ignored {len}-byte access at offset {offset:#x}")]
    BadAccess {
        /// The offset into the device.
        offset: u64,
        /// The width of the access.
        len: usize,
    },
    /// The host clock reads before the Unix epoch.
    #[error("host clock before 1970: time access at offset {0:#x} ignored")]
    HostClock(u64),
}

/// `vm_superio`'s invalid-access callbacks, as debug logs.
#[derive(Debug, Clone, Copy)]
struct DebugLog;

impl RtcEvents for DebugLog {
    fn invalid_read(&self) {
        debug!("pl031: read of a reserved or write-only offset");
    }

    fn invalid_write(&self) {
        debug!("pl031: write to a reserved or read-only offset");
    }
}

/// The PL031.
#[derive(Debug)]
pub struct Pl031 {
    rtc: Rtc<DebugLog>,
}

impl Default for Pl031 {
    fn default() -> Self {
        Self::new()
    }
}

impl Pl031 {
    /// An RTC showing the host's time.
    pub fn new() -> Self {
        Self {
            rtc: Rtc::with_events(DebugLog),
        }
    }

    /// The register at `offset` for a `len`-byte access, if the access is
    /// one the device serves.
    fn register(offset: u64, len: usize) -> Option<u16> {
        let reg = u16::try_from(offset)
            .ok()
            .filter(|_| len == 4 && offset < PL031_SIZE && offset % 4 == 0);
        if reg.is_none() {
            debug!("pl031: {}", Pl031Error::BadAccess { offset, len });
        }
        reg
    }

    /// `vm_superio` panics on reading the host clock if it is before
    /// 1970; the registers that read it are refused then instead.
    fn clock_usable(offset: u64) -> bool {
        let ok = SystemTime::now().duration_since(UNIX_EPOCH).is_ok();
        if !ok {
            debug!("pl031: {}", Pl031Error::HostClock(offset));
        }
        ok
    }
}

impl BusDevice for Pl031 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(reg) = Self::register(offset, data.len()) else {
            return;
        };
        if offset == RTCDR && !Self::clock_usable(offset) {
            return;
        }
        let mut word = [0u8; 4];
        self.rtc.read(reg, &mut word);
        data.copy_from_slice(&word);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(reg) = Self::register(offset, data.len()) else {
            return;
        };
        let Ok(word) = <&[u8; 4]>::try_from(data) else {
            return;
        };
        if offset == RTCLR && !Self::clock_usable(offset) {
            return;
        }
        self.rtc.write(reg, word);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> u32 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as u32
    }

    fn r32(rtc: &mut Pl031, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        rtc.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn the_time_register_reads_the_host_wall_clock() {
        let mut rtc = Pl031::new();
        let before = now();
        let t = r32(&mut rtc, RTCDR);
        assert!((before..=now()).contains(&t), "{t} outside [{before}, now]");
        assert!(t > 1_700_000_000, "a time after 2023");
    }

    #[test]
    fn the_primecell_and_peripheral_ids_read_back_as_a_pl031() {
        let mut rtc = Pl031::new();
        let ids: Vec<u32> = (0..8).map(|i| r32(&mut rtc, 0xfe0 + 4 * i)).collect();
        assert_eq!(ids, [0x31, 0x10, 0x04, 0x00, 0x0d, 0xf0, 0x05, 0xb1]);
    }

    #[test]
    fn a_time_the_guest_loads_is_the_time_it_reads_back() {
        let mut rtc = Pl031::new();
        let then = now() - 86_400;
        rtc.write(RTCLR, &then.to_le_bytes());
        let t = r32(&mut rtc, RTCDR);
        assert!((then..=then + 2).contains(&t), "{t} vs {then}");
        assert_eq!(r32(&mut rtc, RTCLR), then);
    }

    #[test]
    fn accesses_other_than_four_aligned_bytes_are_ignored_and_read_zero() {
        let mut rtc = Pl031::new();
        let offsets = (0..PL031_SIZE + 8).chain([u64::MAX - 3, u64::MAX]);
        for offset in offsets.clone() {
            for len in 1..=8usize {
                let mut data = [0xaau8; 8];
                rtc.read(offset, &mut data[..len]);
                if len != 4 || offset % 4 != 0 || offset >= PL031_SIZE {
                    assert!(data[..len].iter().all(|&b| b == 0), "{len} at {offset:#x}");
                }
            }
        }
        // A narrow write to the load register changes nothing.
        rtc.write(RTCLR, &[1, 0]);
        assert_eq!(r32(&mut rtc, RTCLR), 0);
        for offset in offsets {
            for len in 1..=8usize {
                rtc.write(offset, &[0x11; 8][..len]);
            }
        }
    }
}
