//! Paging-structure entries and every flag in them.
//!
//! SDM vol. 3A, §4.5, Tables 4-14 (PML5E), 4-15 (PML4E), 4-16 (PDPTE that
//! maps a 1-GByte page), 4-17 (PDPTE that references a page directory),
//! 4-18 (PDE that maps a 2-MByte page), 4-19 (PDE that references a page
//! table) and 4-20 (PTE that maps a 4-KByte page).

use super::{Level, PageSize, PagingConfig};
use core::fmt;
use hwtrace_types::PhysAddr;

/// Bit 0: present.
pub const P: u64 = 1 << 0;
/// Bit 1: read/write (0 = writes not allowed).
pub const RW: u64 = 1 << 1;
/// Bit 2: user/supervisor (0 = user-mode accesses not allowed).
pub const US: u64 = 1 << 2;
/// Bit 3: page-level write-through.
pub const PWT: u64 = 1 << 3;
/// Bit 4: page-level cache disable.
pub const PCD: u64 = 1 << 4;
/// Bit 5: accessed.
pub const A: u64 = 1 << 5;
/// Bit 6: dirty (leaf entries only; ignored otherwise).
pub const D: u64 = 1 << 6;
/// Bit 7: page size in PDPTEs and PDEs; PAT in PTEs; reserved in PML4Es
/// and PML5Es.
pub const PS: u64 = 1 << 7;
/// Bit 7 of a PTE: the PAT bit (SDM vol. 3A, §4.9.2, §11.12.3).
pub const PAT_4K: u64 = 1 << 7;
/// Bit 8: global (leaf entries only).
pub const G: u64 = 1 << 8;
/// Bit 12 of a PDPTE or PDE that maps a page: the PAT bit.
pub const PAT_LARGE: u64 = 1 << 12;
/// Bit 63: execute-disable, when IA32_EFER.NXE = 1.
pub const XD: u64 = 1 << 63;
/// Bits 62:59: protection key of a leaf entry (SDM vol. 3A, §4.6.2), used
/// when CR4.PKE (user pages) or CR4.PKS (supervisor pages) is 1.
pub const PKEY_MASK: u64 = 0xf << 59;

/// One paging-structure entry, read at a known level.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry {
    level: Level,
    raw: u64,
}

impl Entry {
    /// The entry `raw` found in a table of `level`.
    pub const fn new(level: Level, raw: u64) -> Self {
        Self { level, raw }
    }

    /// The level of the table the entry was read from.
    pub const fn level(&self) -> Level {
        self.level
    }

    /// The 64 bits as read.
    pub const fn raw(&self) -> u64 {
        self.raw
    }

    const fn bit(&self, mask: u64) -> bool {
        self.raw & mask != 0
    }

    /// P: the entry is used for translation.
    pub const fn present(&self) -> bool {
        self.bit(P)
    }

    /// R/W: writes are allowed through this entry.
    pub const fn writable(&self) -> bool {
        self.bit(RW)
    }

    /// U/S: user-mode accesses are allowed through this entry.
    pub const fn user(&self) -> bool {
        self.bit(US)
    }

    /// PWT: page-level write-through.
    pub const fn write_through(&self) -> bool {
        self.bit(PWT)
    }

    /// PCD: page-level cache disable.
    pub const fn cache_disable(&self) -> bool {
        self.bit(PCD)
    }

    /// A: the entry was used for a translation.
    pub const fn accessed(&self) -> bool {
        self.bit(A)
    }

    /// PS as written (bit 7), for a PDPTE or PDE: the entry maps a page.
    /// Always false for PTEs (where bit 7 is PAT) and for PML4Es and PML5Es
    /// (where bit 7 is reserved: see [`Entry::reserved_bits`]).
    pub const fn page_size_bit(&self) -> bool {
        matches!(self.level, Level::Pdpt | Level::Pd) && self.bit(PS)
    }

    /// Whether the entry maps a page rather than referencing a table.
    pub const fn is_leaf(&self) -> bool {
        matches!(self.level, Level::Pt) || self.page_size_bit()
    }

    /// The size of the page a leaf entry maps.
    pub const fn page_size(&self) -> Option<PageSize> {
        if self.is_leaf() {
            self.level.page_size()
        } else {
            None
        }
    }

    /// D: the page was written (leaf entries only).
    pub const fn dirty(&self) -> Option<bool> {
        if self.is_leaf() {
            Some(self.bit(D))
        } else {
            None
        }
    }

    /// G: the translation is global (leaf entries only, with CR4.PGE = 1).
    pub const fn global(&self) -> Option<bool> {
        if self.is_leaf() {
            Some(self.bit(G))
        } else {
            None
        }
    }

    /// PAT: bit 7 of a PTE or bit 12 of a PDPTE/PDE that maps a page
    /// (leaf entries only).
    pub const fn pat(&self) -> Option<bool> {
        match (self.level, self.is_leaf()) {
            (Level::Pt, _) => Some(self.bit(PAT_4K)),
            (_, true) => Some(self.bit(PAT_LARGE)),
            _ => None,
        }
    }

    /// XD (bit 63): instruction fetches are not allowed through this entry
    /// (when IA32_EFER.NXE = 1).
    pub const fn no_execute(&self) -> bool {
        self.bit(XD)
    }

    /// The protection key, bits 62:59 (leaf entries only).
    pub const fn protection_key(&self) -> Option<u8> {
        if self.is_leaf() {
            Some(((self.raw & PKEY_MASK) >> 59) as u8)
        } else {
            None
        }
    }

    /// The physical address the entry holds: the next table, or the base of
    /// the page it maps (bits (MAXPHYADDR-1):12, :21 or :30).
    pub fn address(&self, config: &PagingConfig) -> PhysAddr {
        let align = match self.page_size() {
            Some(size) => size.bytes() - 1,
            None => 0xfff,
        };
        PhysAddr(self.raw & config.frame_mask() & !align)
    }

    /// The reserved bits that are set in the entry (zero if none). A present
    /// entry with a reserved bit set causes a page fault with the RSVD flag
    /// (SDM vol. 3A, §4.7).
    pub fn reserved_bits(&self, config: &PagingConfig) -> u64 {
        let mut reserved = config.reserved_phys_mask();
        if !config.nxe {
            reserved |= XD;
        }
        match self.level {
            // Bit 7 must be 0 in a PML5E and a PML4E.
            Level::Pml5 | Level::Pml4 => reserved |= PS,
            // Bits 29:13 of a 1-GByte mapping.
            Level::Pdpt if self.is_leaf() => reserved |= mask(13, 29),
            // Bits 20:13 of a 2-MByte mapping.
            Level::Pd if self.is_leaf() => reserved |= mask(13, 20),
            _ => {}
        }
        self.raw & reserved
    }

    /// The decoded flags, printable.
    pub const fn flags(&self) -> Flags {
        Flags(*self)
    }
}

/// Bits `lo..=hi` set.
const fn mask(lo: u32, hi: u32) -> u64 {
    ((1u64 << (hi - lo + 1)) - 1) << lo
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#018x} {})", self.level, self.raw, self.flags())
    }
}

/// The flags of an entry, printed as their SDM names (only those set; the
/// protection key of a leaf entry always, as `PK=n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags(pub Entry);

impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0;
        let mut names: [&str; 12] = [""; 12];
        let mut n = 0;
        let mut push = |on: bool, name: &'static str| {
            if on {
                names[n] = name;
                n += 1;
            }
        };
        push(e.present(), "P");
        push(e.writable(), "RW");
        push(e.user(), "US");
        push(e.write_through(), "PWT");
        push(e.cache_disable(), "PCD");
        push(e.accessed(), "A");
        push(e.dirty() == Some(true), "D");
        push(e.page_size_bit(), "PS");
        push(e.global() == Some(true), "G");
        push(e.pat() == Some(true), "PAT");
        push(e.no_execute(), "NX");
        if n == 0 {
            f.write_str("-")?;
        }
        for (i, name) in names[..n].iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(name)?;
        }
        if let Some(key) = e.protection_key() {
            write!(f, " PK={key}")?;
        }
        Ok(())
    }
}

/// Access rights of a translation, combined across levels (SDM vol. 3A,
/// §4.6.1): writable only if every level allows writes, user-accessible only
/// if every level allows user accesses, execute-disabled if any level says
/// so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Perms {
    /// R/W = 1 at every level.
    pub writable: bool,
    /// U/S = 1 at every level.
    pub user: bool,
    /// XD = 1 at some level (and IA32_EFER.NXE = 1).
    pub no_execute: bool,
}

impl Perms {
    /// Rights before any entry has been seen: everything allowed.
    pub const ALL: Self = Self {
        writable: true,
        user: true,
        no_execute: false,
    };

    /// These rights narrowed by one more entry on the path.
    pub fn and_entry(self, entry: &Entry, config: &PagingConfig) -> Self {
        Self {
            writable: self.writable && entry.writable(),
            user: self.user && entry.user(),
            no_execute: self.no_execute || (config.nxe && entry.no_execute()),
        }
    }
}

impl fmt::Display for Perms {
    /// `urwx` style: `u` or `-`, then `r`, then `w` or `-`, then `x` or `-`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}r{}{}",
            if self.user { 'u' } else { '-' },
            if self.writable { 'w' } else { '-' },
            if self.no_execute { '-' } else { 'x' },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(max_phys: u8) -> PagingConfig {
        PagingConfig {
            max_phys_addr: max_phys,
            ..PagingConfig::default()
        }
    }

    #[test]
    fn each_low_flag_decodes_on_its_own() {
        type Getter = fn(&Entry) -> bool;
        let checks: [(u64, Getter); 6] = [
            (P, Entry::present),
            (RW, Entry::writable),
            (US, Entry::user),
            (PWT, Entry::write_through),
            (PCD, Entry::cache_disable),
            (A, Entry::accessed),
        ];
        for level in [Level::Pml5, Level::Pml4, Level::Pdpt, Level::Pd, Level::Pt] {
            for (bit, get) in checks {
                assert!(get(&Entry::new(level, bit)), "{level} {bit:#x}");
                assert!(!get(&Entry::new(level, !bit)), "{level} !{bit:#x}");
            }
            assert!(Entry::new(level, XD).no_execute());
        }
    }

    #[test]
    fn bit7_is_ps_in_pdpte_and_pde_pat_in_pte_reserved_above() {
        let pde = Entry::new(Level::Pd, P | PS);
        assert!(pde.is_leaf());
        assert_eq!(pde.page_size(), Some(PageSize::Size2M));
        assert_eq!(pde.pat(), Some(false));
        let pdpte = Entry::new(Level::Pdpt, P | PS | PAT_LARGE);
        assert_eq!(pdpte.page_size(), Some(PageSize::Size1G));
        assert_eq!(pdpte.pat(), Some(true));
        let pte = Entry::new(Level::Pt, P | PAT_4K);
        assert!(pte.is_leaf());
        assert!(!pte.page_size_bit());
        assert_eq!(pte.pat(), Some(true));
        let pml4e = Entry::new(Level::Pml4, P | PS);
        assert!(!pml4e.is_leaf());
        assert_eq!(pml4e.reserved_bits(&cfg(52)), PS);
        assert_eq!(Entry::new(Level::Pml5, P | PS).reserved_bits(&cfg(52)), PS);
        // Bit 12 of a PDE that references a page table is an address bit.
        let table_pde = Entry::new(Level::Pd, P | PAT_LARGE);
        assert_eq!(table_pde.pat(), None);
        assert_eq!(table_pde.address(&cfg(52)), PhysAddr(0x1000));
    }

    #[test]
    fn leaf_only_flags_are_none_in_table_entries() {
        let table = Entry::new(Level::Pdpt, P | D | G | PKEY_MASK);
        assert_eq!(table.dirty(), None);
        assert_eq!(table.global(), None);
        assert_eq!(table.protection_key(), None);
        let leaf = Entry::new(Level::Pt, P | D | G | (0xb << 59));
        assert_eq!(leaf.dirty(), Some(true));
        assert_eq!(leaf.global(), Some(true));
        assert_eq!(leaf.protection_key(), Some(0xb));
    }

    #[test]
    fn reserved_bits_follow_maxphyaddr_and_page_size() {
        let e = Entry::new(Level::Pt, P | (1 << 39));
        assert_eq!(e.reserved_bits(&cfg(39)), 1 << 39);
        assert_eq!(e.reserved_bits(&cfg(40)), 0);
        let huge = Entry::new(Level::Pdpt, P | PS | (1 << 13));
        assert_eq!(huge.reserved_bits(&cfg(52)), 1 << 13);
        let big = Entry::new(Level::Pd, P | PS | (1 << 20) | (1 << 21));
        assert_eq!(big.reserved_bits(&cfg(52)), 1 << 20);
        let no_nx = PagingConfig {
            nxe: false,
            ..PagingConfig::default()
        };
        assert_eq!(Entry::new(Level::Pt, P | XD).reserved_bits(&no_nx), XD);
        // Bits 62:52 are ignored (or protection keys), never reserved.
        assert_eq!(
            Entry::new(Level::Pt, P | (0x7ff << 52)).reserved_bits(&cfg(52)),
            0
        );
    }

    #[test]
    fn addresses_are_aligned_to_the_page_or_table() {
        let c = cfg(46);
        let raw = 0x0000_3fff_ffff_f000 | P | PS | PAT_LARGE;
        assert_eq!(
            Entry::new(Level::Pdpt, raw).address(&c),
            PhysAddr(0x3fff_c000_0000)
        );
        assert_eq!(
            Entry::new(Level::Pd, raw).address(&c),
            PhysAddr(0x3fff_ffe0_0000)
        );
        assert_eq!(
            Entry::new(Level::Pt, raw).address(&c),
            PhysAddr(0x3fff_ffff_f000)
        );
    }

    #[test]
    fn seed_004_pte_flags() {
        // The PTE of the IDT page in seed 004: 89000000`0588e121.
        let pte = Entry::new(Level::Pt, 0x8900_0000_0588_e121);
        assert_eq!(pte.flags().to_string(), "P A G NX PK=1");
        assert_eq!(pte.address(&cfg(52)), PhysAddr(0x588e000));
        let pml4e = Entry::new(Level::Pml4, 0xc08063);
        assert_eq!(pml4e.flags().to_string(), "P RW A");
        assert_eq!(Entry::new(Level::Pt, 0).flags().to_string(), "- PK=0");
    }

    #[test]
    fn perms_and_rw_and_us_or_nx() {
        let c = PagingConfig::default();
        let p = Perms::ALL
            .and_entry(&Entry::new(Level::Pml4, P | RW | US), &c)
            .and_entry(&Entry::new(Level::Pdpt, P | US | XD), &c)
            .and_entry(&Entry::new(Level::Pd, P | RW | US), &c);
        assert_eq!(
            p,
            Perms {
                writable: false,
                user: true,
                no_execute: true
            }
        );
        assert_eq!(p.to_string(), "ur--");
        let no_nx = PagingConfig { nxe: false, ..c };
        let q = Perms::ALL.and_entry(&Entry::new(Level::Pt, P | XD), &no_nx);
        assert!(!q.no_execute);
    }
}
