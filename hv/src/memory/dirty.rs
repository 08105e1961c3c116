//! Dirty-page tracking for backends without a kernel dirty log
//! (Hypervisor.framework): the backend write-protects a logged slot, marks
//! the page of each write fault here, re-opens that page for writing, and
//! write-protects the dirty pages again when the log is read.

use super::DirtyLog;

/// One slot's dirty bitmap.
#[derive(Debug, Clone)]
pub(crate) struct DirtyTracker {
    base: u64,
    page_size: u64,
    pages: usize,
    bitmap: Vec<u64>,
}

impl DirtyTracker {
    /// Tracks `size` bytes from guest-physical `base` in `page_size` pages.
    pub fn new(base: u64, size: u64, page_size: u64) -> Self {
        let pages = size.div_ceil(page_size) as usize;
        Self {
            base,
            page_size,
            pages,
            bitmap: vec![0; pages.div_ceil(64)],
        }
    }

    /// Marks the page holding `gpa`; returns its start, or `None` (nothing
    /// marked) when `gpa` is outside the slot or the page was already dirty.
    pub fn mark(&mut self, gpa: u64) -> Option<u64> {
        let i = (gpa.checked_sub(self.base)? / self.page_size) as usize;
        if i >= self.pages {
            return None;
        }
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if self.bitmap[word] & bit != 0 {
            return None;
        }
        self.bitmap[word] |= bit;
        Some(self.base + i as u64 * self.page_size)
    }

    /// Returns the log and starts a clean one.
    pub fn take(&mut self) -> DirtyLog {
        let bitmap = std::mem::replace(&mut self.bitmap, vec![0; self.pages.div_ceil(64)]);
        DirtyLog::new(self.base, self.page_size, self.pages, bitmap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marking_a_page_twice_reports_it_once() {
        let mut t = DirtyTracker::new(0x8000_0000, 0x10_0000, 0x4000);
        assert_eq!(t.mark(0x8000_4010), Some(0x8000_4000));
        assert_eq!(t.mark(0x8000_7fff), None);
        assert_eq!(t.mark(0x7fff_ffff), None);
        assert_eq!(t.mark(0x8010_0000), None);
    }

    #[test]
    fn take_returns_exactly_the_marked_pages_and_clears_them() {
        let mut t = DirtyTracker::new(0, 0x40_0000, 0x4000);
        for gpa in [0x4000, 0x3f_c000, 0x8123] {
            t.mark(gpa);
        }
        let pages: Vec<_> = t.take().dirty_pages().collect();
        assert_eq!(pages, [0x4000, 0x8000, 0x3f_c000]);
        assert_eq!(t.take().dirty_pages().count(), 0);
    }
}
