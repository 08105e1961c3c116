//! Guest memory as the hypervisor sees it: slots, mapping flags, dirty logs.
//!
//! The memory itself is owned by [`vm_memory`]; a backend keeps a reference
//! to each mapped region's `MmapRegion` so the host pages outlive the
//! mapping. This module owns the portable bookkeeping (alignment, overlap,
//! slot numbers, dirty bitmaps) and never calls a hypervisor.

// The dirty tracker and address lookup serve backends without a kernel
// dirty log or MMIO decoding (Hypervisor.framework).
#[cfg_attr(not(hvf), allow(dead_code))]
mod dirty;
#[cfg_attr(not(hvf), allow(dead_code))]
mod slots;

#[cfg(hvf)]
pub(crate) use dirty::DirtyTracker;
pub(crate) use slots::{Slot, SlotTable};

/// How a region is mapped into the guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapFlags {
    /// The guest may not write it; a write exits as
    /// [`VcpuExit::Mmio`](crate::VcpuExit::Mmio) (KVM; on
    /// Hypervisor.framework as well).
    pub read_only: bool,
    /// Record which pages the guest writes, read with
    /// [`Vm::dirty_log`](crate::Vm::dirty_log).
    pub log_dirty: bool,
}

/// A mapped region, as returned by [`Vm::map_memory`](crate::Vm::map_memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemorySlot(pub u32);

/// Why a mapping was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    /// Guest address, size or host address is not a multiple of the
    /// backend's granule (4 KiB on KVM, 16 KiB on Hypervisor.framework).
    #[error("region {guest:#x}+{size:#x} is not aligned to the {granule:#x}-byte granule")]
    Unaligned {
        /// Guest-physical start.
        guest: u64,
        /// Size in bytes.
        size: u64,
        /// The backend's granule.
        granule: u64,
    },
    /// The region is empty.
    #[error("region at {0:#x} is empty")]
    Empty(u64),
    /// The region overlaps one already mapped.
    #[error("region {guest:#x}+{size:#x} overlaps slot {slot}")]
    Overlap {
        /// Guest-physical start.
        guest: u64,
        /// Size in bytes.
        size: u64,
        /// The slot it overlaps.
        slot: u32,
    },
    /// Every slot the backend offers is in use.
    #[error("all {0} memory slots are in use")]
    NoFreeSlot(u32),
    /// No region is mapped under this slot.
    #[error("no memory slot {0}")]
    NoSuchSlot(u32),
    /// The slot was mapped without [`MapFlags::log_dirty`].
    #[error("memory slot {0} does not log dirty pages")]
    NotLogged(u32),
}

/// Which pages of one slot the guest wrote since the last read of its log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyLog {
    base: u64,
    page_size: u64,
    pages: usize,
    bitmap: Vec<u64>,
}

impl DirtyLog {
    /// Wraps a bitmap (bit n = page n of the slot, LSB first in each word).
    pub fn new(base: u64, page_size: u64, pages: usize, bitmap: Vec<u64>) -> Self {
        Self {
            base,
            page_size,
            pages,
            bitmap,
        }
    }

    /// The backend's page size: what one bit covers.
    pub fn page_size(&self) -> u64 {
        self.page_size
    }

    /// Guest-physical addresses of the dirty pages, ascending.
    pub fn dirty_pages(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.pages)
            .filter(|&i| {
                self.bitmap
                    .get(i / 64)
                    .is_some_and(|w| w & (1 << (i % 64)) != 0)
            })
            .map(|i| self.base + i as u64 * self.page_size)
    }

    /// Whether the page holding `gpa` is dirty.
    pub fn is_dirty(&self, gpa: u64) -> bool {
        let Some(i) = gpa.checked_sub(self.base).map(|off| off / self.page_size) else {
            return false;
        };
        let i = i as usize;
        i < self.pages
            && self
                .bitmap
                .get(i / 64)
                .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dirty_log_lists_the_set_bits_as_guest_addresses() {
        let log = DirtyLog::new(0x10_0000, 0x1000, 70, vec![0b1010, 1 << 5]);
        let pages: Vec<_> = log.dirty_pages().collect();
        assert_eq!(pages, [0x10_1000, 0x10_3000, 0x10_0000 + 69 * 0x1000]);
        assert!(log.is_dirty(0x10_3fff));
        assert!(!log.is_dirty(0x10_4000));
        assert!(!log.is_dirty(0xf_f000));
    }

    #[test]
    fn bits_past_the_last_page_are_ignored() {
        let log = DirtyLog::new(0, 0x4000, 2, vec![u64::MAX]);
        assert_eq!(log.dirty_pages().count(), 2);
    }
}
