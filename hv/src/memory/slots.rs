//! The slot table: which guest ranges are mapped, to which host pages.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use vm_memory::bitmap::Bitmap;
use vm_memory::{GuestMemoryRegion, GuestRegionMmap};

use super::{MapFlags, MemoryError};

/// One mapped region.
pub(crate) struct Slot {
    /// Guest-physical start.
    pub guest: u64,
    /// Size in bytes.
    pub size: u64,
    /// Host virtual address of the first byte.
    pub host: usize,
    /// How it is mapped.
    pub flags: MapFlags,
    /// Keeps the host mapping alive while the guest can reach it.
    pub _owner: Arc<dyn Any + Send + Sync>,
}

impl Slot {
    /// The slot for `region`: its guest range and host pages, holding the
    /// host mapping alive for as long as the slot exists.
    pub fn of_region<B>(region: &Arc<GuestRegionMmap<B>>, flags: MapFlags) -> Self
    where
        B: Bitmap + Send + Sync + 'static,
    {
        Self {
            guest: region.start_addr().0,
            size: region.len(),
            host: region.as_ptr() as usize,
            flags,
            _owner: region.clone(),
        }
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}+{:#x} {:?}", self.guest, self.size, self.flags)
    }
}

impl Slot {
    /// Whether `gpa` falls inside this slot.
    pub fn contains(&self, gpa: u64) -> bool {
        gpa >= self.guest && gpa - self.guest < self.size
    }
}

/// Slots by number, checked for alignment and overlap.
#[derive(Debug)]
pub(crate) struct SlotTable {
    granule: u64,
    limit: u32,
    slots: BTreeMap<u32, Slot>,
}

impl SlotTable {
    /// A table for a backend mapping in `granule`-byte pages with at most
    /// `limit` slots.
    pub fn new(granule: u64, limit: u32) -> Self {
        Self {
            granule,
            limit,
            slots: BTreeMap::new(),
        }
    }

    /// Checks `slot` and files it under the lowest free number.
    pub fn insert(&mut self, slot: Slot) -> Result<u32, MemoryError> {
        let g = self.granule;
        if slot.size == 0 {
            return Err(MemoryError::Empty(slot.guest));
        }
        if slot.guest % g != 0 || slot.size % g != 0 || slot.host as u64 % g != 0 {
            return Err(MemoryError::Unaligned {
                guest: slot.guest,
                size: slot.size,
                granule: g,
            });
        }
        let end = slot
            .guest
            .checked_add(slot.size)
            .ok_or(MemoryError::Unaligned {
                guest: slot.guest,
                size: slot.size,
                granule: g,
            })?;
        if let Some((&id, _)) = self
            .slots
            .iter()
            .find(|(_, s)| slot.guest < s.guest + s.size && s.guest < end)
        {
            return Err(MemoryError::Overlap {
                guest: slot.guest,
                size: slot.size,
                slot: id,
            });
        }
        let id = (0..self.limit)
            .find(|id| !self.slots.contains_key(id))
            .ok_or(MemoryError::NoFreeSlot(self.limit))?;
        self.slots.insert(id, slot);
        Ok(id)
    }

    /// Removes and returns slot `id`.
    pub fn remove(&mut self, id: u32) -> Result<Slot, MemoryError> {
        self.slots.remove(&id).ok_or(MemoryError::NoSuchSlot(id))
    }

    /// Slot `id`.
    pub fn get(&self, id: u32) -> Result<&Slot, MemoryError> {
        self.slots.get(&id).ok_or(MemoryError::NoSuchSlot(id))
    }

    /// The slot holding `gpa`, with its number.
    pub fn find(&self, gpa: u64) -> Option<(u32, &Slot)> {
        self.slots
            .iter()
            .find(|(_, s)| s.contains(gpa))
            .map(|(&id, s)| (id, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(guest: u64, size: u64) -> Slot {
        Slot {
            guest,
            size,
            host: 0x7f00_0000_0000,
            flags: MapFlags::default(),
            _owner: Arc::new(()),
        }
    }

    #[test]
    fn slots_get_the_lowest_free_number() {
        let mut t = SlotTable::new(0x1000, 8);
        assert_eq!(t.insert(slot(0, 0x1000)), Ok(0));
        assert_eq!(t.insert(slot(0x1000, 0x1000)), Ok(1));
        assert!(t.remove(0).is_ok());
        assert_eq!(t.insert(slot(0x8000, 0x1000)), Ok(0));
    }

    #[test]
    fn an_overlapping_region_is_refused_and_names_the_slot() {
        let mut t = SlotTable::new(0x1000, 8);
        t.insert(slot(0x1_0000, 0x1_0000)).unwrap();
        let err = t.insert(slot(0x1_f000, 0x2000)).unwrap_err();
        assert_eq!(
            err,
            MemoryError::Overlap {
                guest: 0x1_f000,
                size: 0x2000,
                slot: 0
            }
        );
        assert!(t.insert(slot(0x2_0000, 0x1000)).is_ok(), "adjacent is fine");
    }

    #[test]
    fn a_region_off_the_16k_granule_is_refused_where_the_granule_is_16k() {
        let mut t = SlotTable::new(0x4000, 8);
        assert!(matches!(
            t.insert(slot(0x1000, 0x4000)),
            Err(MemoryError::Unaligned { .. })
        ));
        assert!(matches!(
            t.insert(slot(0, 0x5000)),
            Err(MemoryError::Unaligned { .. })
        ));
        assert!(t.insert(slot(0x4000, 0x8000)).is_ok());
    }

    #[test]
    fn empty_and_wrapping_regions_are_refused() {
        let mut t = SlotTable::new(0x1000, 8);
        assert_eq!(t.insert(slot(0, 0)), Err(MemoryError::Empty(0)));
        assert!(t.insert(slot(u64::MAX - 0xfff, 0x2000)).is_err());
    }

    #[test]
    fn the_slot_limit_is_enforced() {
        let mut t = SlotTable::new(0x1000, 2);
        t.insert(slot(0, 0x1000)).unwrap();
        t.insert(slot(0x1000, 0x1000)).unwrap();
        assert_eq!(
            t.insert(slot(0x2000, 0x1000)),
            Err(MemoryError::NoFreeSlot(2))
        );
    }

    #[test]
    fn find_returns_the_slot_holding_an_address() {
        let mut t = SlotTable::new(0x1000, 8);
        t.insert(slot(0, 0x2000)).unwrap();
        t.insert(slot(0x4000, 0x1000)).unwrap();
        assert_eq!(t.find(0x4fff).map(|(id, _)| id), Some(1));
        assert!(t.find(0x2000).is_none());
    }
}
