//! One address space's view of the image: the visible pieces of its
//! sections as a sorted vector of non-overlapping regions, with a one-entry
//! cache of the last region a read hit.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A visible piece of a section: addresses `first..=last` (inclusive, so a
/// section may end at the top of the address space) served by source
/// `source`, whose byte `offset` holds address `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Region {
    pub first: u64,
    pub last: u64,
    pub source: u32,
    /// Byte offset in the source's bytes of `first` (for a page cache:
    /// unused, pages are found by address).
    pub offset: u64,
    /// Index of the section this piece belongs to (in add order).
    pub section: u32,
}

impl Region {
    #[inline]
    pub fn contains(&self, addr: u64) -> bool {
        self.first <= addr && addr <= self.last
    }

    /// This region cut to `first..=last` (which must lie inside it).
    fn cut(self, first: u64, last: u64) -> Self {
        Self {
            first,
            last,
            offset: self.offset.wrapping_add(first - self.first),
            ..self
        }
    }
}

/// The regions of one address space.
#[derive(Debug, Default)]
pub(super) struct SpaceMap {
    /// Sorted by `first`, pairwise disjoint.
    regions: Vec<Region>,
    /// Index of the region the last lookup hit (may be stale or out of
    /// range after an insert: it is only a hint, checked on use).
    hint: AtomicUsize,
}

impl SpaceMap {
    /// Adds `new` over whatever it overlaps: the older regions are trimmed
    /// or split so the newest section wins (libipt's image semantics).
    pub fn insert(&mut self, new: Region) {
        let lo = self.regions.partition_point(|r| r.last < new.first);
        let hi = self.regions.partition_point(|r| r.first <= new.last);
        let mut replacement = [None, Some(new), None];
        if lo < hi {
            let head = self.regions[lo];
            if head.first < new.first {
                replacement[0] = Some(head.cut(head.first, new.first - 1));
            }
            let tail = self.regions[hi - 1];
            if tail.last > new.last {
                replacement[2] = Some(tail.cut(new.last + 1, tail.last));
            }
        }
        self.regions
            .splice(lo..hi, replacement.into_iter().flatten());
        *self.hint.get_mut() = lo;
    }

    /// The region holding `addr` (the cached one if it still matches, its
    /// successor for sequential reads, else by binary search), or the first
    /// address above `addr` that some region holds.
    #[inline]
    pub fn lookup(&self, addr: u64) -> Result<&Region, Option<u64>> {
        let hint = self.hint.load(Ordering::Relaxed);
        if let Some(r) = self.regions.get(hint)
            && r.contains(addr)
        {
            return Ok(r);
        }
        if let Some(r) = self.regions.get(hint.wrapping_add(1))
            && r.contains(addr)
        {
            self.hint.store(hint + 1, Ordering::Relaxed);
            return Ok(r);
        }
        let i = self.regions.partition_point(|r| r.last < addr);
        match self.regions.get(i) {
            Some(r) if r.first <= addr => {
                self.hint.store(i, Ordering::Relaxed);
                Ok(r)
            }
            next => Err(next.map(|r| r.first)),
        }
    }

    /// The visible regions, ascending.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }
}
