//! The page-table self-map: a top-level entry that points at its own table.
//!
//! If entry `i` of the PML4 holds the PML4's own frame, then walking an
//! address whose PML4 index is `i` treats the PML4 as a PDPT, and every
//! paging structure of the address space appears in the 512 GiB window of
//! slot `i` (seed 004; Windows has done this since NT, at index 0x1ED until
//! Windows 10 1607 and at a boot-time random kernel-half index since).
//! Repeating the index `k` times selects ever higher tables:
//!
//! | table | indices (4-level) | Windows name |
//! |---|---|---|
//! | PT   | `i`, then the address's bits | `MmPteBase` |
//! | PD   | `i, i` | `MmPdeBase` |
//! | PDPT | `i, i, i` | `MmPpeBase` |
//! | PML4 | `i, i, i, i` | `MmPxeBase` |
//!
//! With 5-level paging the same holds with one more repetition (PML5 base).
//! The hardware side is SDM vol. 3A, §4.5: nothing forbids an entry from
//! referencing the table it is in.

use crate::paging::{Level, PageTables, PagingMode, WalkError, WalkErrorKind};
use hwtrace_types::{Ip, PhysAddr, PhysMemory};

/// A self-referencing index in the top-level table, and the virtual
/// addresses it places every paging structure at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SelfMap {
    index: u16,
    mode: PagingMode,
}

impl SelfMap {
    /// The self-map at `index` (0..512) of the top-level table; `None` if
    /// the index is out of range.
    pub fn new(index: u16, mode: PagingMode) -> Option<Self> {
        (index < 512).then_some(Self { index, mode })
    }

    /// Finds the self-map of an address space: the first present entry of
    /// the top-level table whose frame is the table itself (kernel-half
    /// entries first, as Windows places it there). `Ok(None)` if there is
    /// none; an error if the top-level table is not in the dump.
    pub fn find<M: PhysMemory>(tables: &PageTables<M>) -> Result<Option<Self>, WalkError> {
        let all = Self::find_all(tables)?;
        Ok(all
            .iter()
            .find(|s| s.index >= 256)
            .or_else(|| all.first())
            .copied())
    }

    /// Every self-referencing entry of the top-level table, by index.
    pub fn find_all<M: PhysMemory>(tables: &PageTables<M>) -> Result<Vec<Self>, WalkError> {
        let config = tables.config();
        let top = config.mode.top();
        let root = tables.root();
        let mut found = Vec::new();
        for index in 0..512u16 {
            let step = tables
                .read_entry(top, root, index)
                .map_err(|kind| WalkError {
                    va: Ip(config.mode.canonicalize(u64::from(index) << top.shift())),
                    kind,
                })?;
            if step.entry.present() && step.entry.address(config) == root {
                found.push(Self {
                    index,
                    mode: config.mode,
                });
            }
        }
        Ok(found)
    }

    /// The self-referencing index.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// The paging mode.
    pub fn mode(&self) -> PagingMode {
        self.mode
    }

    /// How many times the index repeats at the top of the address of a
    /// table of `level`: 1 for page tables, up to all levels for the
    /// top-level table.
    fn repeats(&self, level: Level) -> Option<usize> {
        let levels = self.mode.levels();
        let depth = levels.iter().position(|l| *l == level)?;
        Some(levels.len() - depth)
    }

    /// The virtual base of the region where the tables of `level` appear
    /// (canonical); `None` if `level` is not used in this paging mode.
    /// For the top level this is the one page holding the top-level table.
    pub fn table_base(&self, level: Level) -> Option<Ip> {
        let repeats = self.repeats(level)?;
        let index = u64::from(self.index);
        let va = self
            .mode
            .levels()
            .iter()
            .take(repeats)
            .fold(0u64, |va, l| va | (index << l.shift()));
        Some(Ip(self.mode.canonicalize(va)))
    }

    /// The virtual address of the entry at `level` that maps `va` (for
    /// [`Level::Pt`], the PTE address Windows' `MiGetPteAddress` computes);
    /// `None` if `level` is not used in this paging mode.
    pub fn entry_va(&self, level: Level, va: Ip) -> Option<Ip> {
        let base = self.table_base(level)?;
        let offset = ((va.0 & self.mode.va_mask()) >> level.shift()) * 8;
        Some(Ip(self.mode.canonicalize(base.0.wrapping_add(offset))))
    }

    /// Checks through the walker that the top-level table's base address
    /// translates to the table itself: the proof that the self-map works.
    pub fn verify<M: PhysMemory>(&self, tables: &PageTables<M>) -> Result<PhysAddr, WalkError> {
        let base = self.table_base(self.mode.top()).ok_or(WalkError {
            va: Ip(0),
            kind: WalkErrorKind::NonCanonical { mode: self.mode },
        })?;
        tables.translate(base).map(|t| t.pa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_004_index_0x1f6_gives_pml4_base_fffffb7dbedf6000() {
        let s = SelfMap::new(0x1f6, PagingMode::Level4).unwrap();
        assert_eq!(s.table_base(Level::Pml4), Some(Ip(0xffff_fb7d_bedf_6000)));
        // The seed's shifts: PDPT = PML4 base >> 21 << 21, and so on.
        assert_eq!(s.table_base(Level::Pdpt), Some(Ip(0xffff_fb7d_bec0_0000)));
        assert_eq!(s.table_base(Level::Pd), Some(Ip(0xffff_fb7d_8000_0000)));
        assert_eq!(s.table_base(Level::Pt), Some(Ip(0xffff_fb00_0000_0000)));
        assert_eq!(s.table_base(Level::Pml5), None);
    }

    #[test]
    fn seed_004_index_0x11a_gives_pml4_base_ffff8d46a351a000() {
        let s = SelfMap::new(0x11a, PagingMode::Level4).unwrap();
        assert_eq!(s.table_base(Level::Pml4), Some(Ip(0xffff_8d46_a351_a000)));
    }

    #[test]
    fn windows_classic_index_0x1ed_gives_the_known_bases() {
        // Before randomisation: MmPteBase 0xFFFFF68000000000.
        let s = SelfMap::new(0x1ed, PagingMode::Level4).unwrap();
        assert_eq!(s.table_base(Level::Pt), Some(Ip(0xffff_f680_0000_0000)));
        assert_eq!(s.table_base(Level::Pd), Some(Ip(0xffff_f6fb_4000_0000)));
        assert_eq!(s.table_base(Level::Pdpt), Some(Ip(0xffff_f6fb_7da0_0000)));
        assert_eq!(s.table_base(Level::Pml4), Some(Ip(0xffff_f6fb_7dbe_d000)));
        // The PTE of the seed's IDT page, as MiGetPteAddress computes it.
        let pte = s.entry_va(Level::Pt, Ip(0xffff_f803_7888_e000)).unwrap();
        assert_eq!(
            pte,
            Ip(0xffff_f680_0000_0000 + ((0xf803_7888_e000u64 >> 12) << 3))
        );
        let pml4e = s.entry_va(Level::Pml4, Ip(0xffff_f803_7888_e000)).unwrap();
        assert_eq!(pml4e, Ip(0xffff_f6fb_7dbe_d000 + 0x1f0 * 8));
    }

    #[test]
    fn five_level_repeats_the_index_five_times() {
        let s = SelfMap::new(0x1ff, PagingMode::Level5).unwrap();
        assert_eq!(s.table_base(Level::Pt), Some(Ip(0xffff_0000_0000_0000)));
        assert_eq!(s.table_base(Level::Pml5), Some(Ip(0xffff_ffff_ffff_f000)));
        assert_eq!(SelfMap::new(512, PagingMode::Level5), None);
    }
}
