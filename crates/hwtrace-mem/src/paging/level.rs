//! Paging modes, paging-structure levels and page sizes.
//!
//! Intel SDM vol. 3A, §4.5 "4-Level Paging and 5-Level Paging": a linear
//! address is split 9-9-9-9-12 (4-level, 48-bit linear addresses) or
//! 9-9-9-9-9-12 (5-level, CR4.LA57 = 1, 57-bit linear addresses); each 9-bit
//! field indexes one 512-entry paging structure (Figures 4-8 to 4-11).

use core::fmt;
use hwtrace_types::Ip;

/// Which paging mode the address space uses (SDM vol. 3A, §4.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PagingMode {
    /// 4-level paging: CR4.LA57 = 0, 48-bit linear addresses.
    #[default]
    Level4,
    /// 5-level paging: CR4.LA57 = 1, 57-bit linear addresses.
    Level5,
}

impl PagingMode {
    /// The levels a walk goes through, from the table CR3 names down.
    pub const fn levels(self) -> &'static [Level] {
        match self {
            Self::Level4 => &[Level::Pml4, Level::Pdpt, Level::Pd, Level::Pt],
            Self::Level5 => &[Level::Pml5, Level::Pml4, Level::Pdpt, Level::Pd, Level::Pt],
        }
    }

    /// The level of the table CR3 points to.
    pub const fn top(self) -> Level {
        match self {
            Self::Level4 => Level::Pml4,
            Self::Level5 => Level::Pml5,
        }
    }

    /// How many linear-address bits translate (48 or 57).
    pub const fn va_bits(self) -> u32 {
        match self {
            Self::Level4 => 48,
            Self::Level5 => 57,
        }
    }

    /// Whether `va` is canonical: bits 63 down to `va_bits - 1` all equal
    /// (SDM vol. 1, §3.3.7.1 "Canonical Addressing").
    pub const fn is_canonical(self, va: u64) -> bool {
        self.canonicalize(va) == va
    }

    /// Sign-extends bit `va_bits - 1` into the bits above it.
    pub const fn canonicalize(self, va: u64) -> u64 {
        let unused = 64 - self.va_bits();
        (((va << unused) as i64) >> unused) as u64
    }

    /// The part of `va` that translates (the low `va_bits` bits).
    pub const fn va_mask(self) -> u64 {
        (1u64 << self.va_bits()) - 1
    }
}

impl fmt::Display for PagingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Level4 => "4-level",
            Self::Level5 => "5-level",
        })
    }
}

/// One level of paging structures (SDM vol. 3A, Table 4-14 to Table 4-20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// PML5 table (5-level paging only); entries are PML5Es.
    Pml5,
    /// PML4 table; entries are PML4Es.
    Pml4,
    /// Page-directory-pointer table; entries are PDPTEs (may map 1 GiB).
    Pdpt,
    /// Page directory; entries are PDEs (may map 2 MiB).
    Pd,
    /// Page table; entries are PTEs (map 4 KiB).
    Pt,
}

impl Level {
    /// The name of an entry at this level, as the SDM writes it.
    pub const fn entry_name(self) -> &'static str {
        match self {
            Self::Pml5 => "PML5E",
            Self::Pml4 => "PML4E",
            Self::Pdpt => "PDPTE",
            Self::Pd => "PDE",
            Self::Pt => "PTE",
        }
    }

    /// The name of a table at this level.
    pub const fn table_name(self) -> &'static str {
        match self {
            Self::Pml5 => "PML5",
            Self::Pml4 => "PML4",
            Self::Pdpt => "PDPT",
            Self::Pd => "PD",
            Self::Pt => "PT",
        }
    }

    /// The lowest linear-address bit of this level's 9-bit index: an entry
    /// here covers `1 << shift` bytes.
    pub const fn shift(self) -> u32 {
        match self {
            Self::Pml5 => 48,
            Self::Pml4 => 39,
            Self::Pdpt => 30,
            Self::Pd => 21,
            Self::Pt => 12,
        }
    }

    /// How many bytes of linear address space one entry covers.
    pub const fn entry_span(self) -> u64 {
        1u64 << self.shift()
    }

    /// This level's index (0..512) in `va`.
    pub const fn index_of(self, va: u64) -> u16 {
        ((va >> self.shift()) & 0x1ff) as u16
    }

    /// The next level down, or `None` after the page table.
    pub const fn next(self) -> Option<Self> {
        match self {
            Self::Pml5 => Some(Self::Pml4),
            Self::Pml4 => Some(Self::Pdpt),
            Self::Pdpt => Some(Self::Pd),
            Self::Pd => Some(Self::Pt),
            Self::Pt => None,
        }
    }

    /// The page an entry at this level maps when it is a leaf, or `None` if
    /// this level never maps a page (PML5E, PML4E).
    pub const fn page_size(self) -> Option<PageSize> {
        match self {
            Self::Pml5 | Self::Pml4 => None,
            Self::Pdpt => Some(PageSize::Size1G),
            Self::Pd => Some(PageSize::Size2M),
            Self::Pt => Some(PageSize::Size4K),
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.entry_name())
    }
}

/// The size of a mapped page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageSize {
    /// 4 KiB, mapped by a PTE.
    Size4K,
    /// 2 MiB, mapped by a PDE with PS = 1.
    Size2M,
    /// 1 GiB, mapped by a PDPTE with PS = 1.
    Size1G,
}

impl PageSize {
    /// The size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            Self::Size4K => 1 << 12,
            Self::Size2M => 1 << 21,
            Self::Size1G => 1 << 30,
        }
    }

    /// The offset of `va` inside its page.
    pub const fn offset_of(self, va: u64) -> u64 {
        va & (self.bytes() - 1)
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Size4K => "4K",
            Self::Size2M => "2M",
            Self::Size1G => "1G",
        })
    }
}

/// The indices of a linear address, 9-9-9-9-12 (or 9-9-9-9-9-12), as seed
/// 004 and every paging tutorial write them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VaIndices {
    /// The address split.
    pub va: Ip,
    /// The paging mode the split is for.
    pub mode: PagingMode,
}

impl VaIndices {
    /// Splits `va` for `mode`.
    pub const fn new(va: Ip, mode: PagingMode) -> Self {
        Self { va, mode }
    }

    /// The index at `level`.
    pub const fn index(&self, level: Level) -> u16 {
        level.index_of(self.va.0)
    }

    /// The byte offset in a 4 KiB page (bits 11:0).
    pub const fn offset(&self) -> u16 {
        (self.va.0 & 0xfff) as u16
    }
}

impl fmt::Display for VaIndices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for level in self.mode.levels() {
            write!(f, "{} {:#x} ", level.table_name(), self.index(*level))?;
        }
        write!(f, "offset {:#x}", self.offset())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_004_idt_address_splits_as_in_the_article() {
        // Seed 004 splits the IDT base fffff803`7888e000 by hand.
        let split = VaIndices::new(Ip(0xffff_f803_7888_e000), PagingMode::Level4);
        assert_eq!(split.index(Level::Pml4), 0x1f0);
        assert_eq!(split.index(Level::Pdpt), 0xd);
        assert_eq!(split.index(Level::Pd), 0x1c4);
        assert_eq!(split.index(Level::Pt), 0x8e);
        assert_eq!(split.offset(), 0);
        assert_eq!(
            split.to_string(),
            "PML4 0x1f0 PDPT 0xd PD 0x1c4 PT 0x8e offset 0x0"
        );
    }

    #[test]
    fn canonical_form_per_mode() {
        let m4 = PagingMode::Level4;
        assert!(m4.is_canonical(0x0000_7fff_ffff_ffff));
        assert!(m4.is_canonical(0xffff_8000_0000_0000));
        assert!(!m4.is_canonical(0x0000_8000_0000_0000));
        assert_eq!(m4.canonicalize(0xfb7d_bedf_6000), 0xffff_fb7d_bedf_6000);
        let m5 = PagingMode::Level5;
        assert!(m5.is_canonical(0x0000_8000_0000_0000));
        assert!(!m5.is_canonical(0x0100_0000_0000_0000));
        assert_eq!(
            m5.canonicalize(0x0100_0000_0000_0000),
            0xff00_0000_0000_0000
        );
    }

    #[test]
    fn levels_chain_down_to_the_page_table() {
        for mode in [PagingMode::Level4, PagingMode::Level5] {
            let levels = mode.levels();
            assert_eq!(levels[0], mode.top());
            for pair in levels.windows(2) {
                assert_eq!(pair[0].next(), Some(pair[1]));
                assert_eq!(pair[0].shift(), pair[1].shift() + 9);
            }
            assert_eq!(levels.last().copied().and_then(Level::next), None);
        }
        assert_eq!(Level::Pdpt.page_size().map(PageSize::bytes), Some(1 << 30));
        assert_eq!(Level::Pml4.page_size(), None);
    }
}
