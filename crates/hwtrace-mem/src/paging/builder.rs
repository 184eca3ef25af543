//! Building paging structures in [`SparseMemory`]: the byte-building DSL of
//! the walker's tests, and a way to make small guests for the simulator and
//! the CLI's tests.

use super::entry::{P, PS, RW, US};
use super::{Entry, Level, PageSize, PagingConfig, PagingMode};
use crate::phys::SparseMemory;
use hwtrace_types::{Cr3, Ip, PhysAddr, PhysMemory};

/// Why a mapping could not be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The address is not canonical or not aligned to the page size.
    #[error("{va} is not a canonical address aligned to {size}")]
    BadAddress {
        /// The address.
        va: Ip,
        /// The page size asked for.
        size: PageSize,
    },
    /// A larger page already maps the address at `level`.
    #[error("{va} is already mapped by a larger page at {level}")]
    LargePageInTheWay {
        /// The address.
        va: Ip,
        /// The level of the leaf in the way.
        level: Level,
    },
}

/// Page tables under construction.
#[derive(Clone, Debug)]
pub struct PageTableBuilder {
    mem: SparseMemory,
    mode: PagingMode,
    root: PhysAddr,
    next_frame: u64,
    table_flags: u64,
}

impl PageTableBuilder {
    /// Starts with an empty top-level table at `first_frame`; further
    /// tables take the 4 KiB frames after it.
    pub fn new(mode: PagingMode, first_frame: PhysAddr) -> Self {
        let root = PhysAddr(first_frame.0 & !0xfff);
        let mut mem = SparseMemory::new();
        mem.add_page(root);
        Self {
            mem,
            mode,
            root,
            next_frame: root.0 + 0x1000,
            table_flags: P | RW | US,
        }
    }

    /// Flags of the non-leaf entries created from now on (default P|RW|US,
    /// so that the leaf entry alone decides the rights).
    pub fn set_table_flags(&mut self, flags: u64) {
        self.table_flags = flags | P;
    }

    /// The CR3 value naming the top-level table.
    pub fn cr3(&self) -> Cr3 {
        Cr3(self.root.0)
    }

    /// The paging mode.
    pub fn mode(&self) -> PagingMode {
        self.mode
    }

    /// A zeroed 4 KiB frame not used by any table.
    pub fn alloc_frame(&mut self) -> PhysAddr {
        let frame = PhysAddr(self.next_frame);
        self.mem.add_page(frame);
        self.next_frame += 0x1000;
        frame
    }

    /// Writes entry `index` of the table at `table` (any raw value: tests
    /// use it for malformed entries).
    pub fn set_entry(&mut self, table: PhysAddr, index: u16, raw: u64) {
        self.mem
            .write_u64(PhysAddr(table.0 + u64::from(index & 0x1ff) * 8), raw);
    }

    /// Makes entry `index` of the top-level table point at the table itself
    /// (the self-map of seed 004), with `flags` (P is added).
    pub fn self_map(&mut self, index: u16, flags: u64) {
        let root = self.root;
        self.set_entry(root, index, root.0 | flags | P);
    }

    /// Maps the page at `va` to `pa` with leaf `flags` (P is added, and PS
    /// for 2 MiB and 1 GiB pages), creating the tables on the way.
    pub fn map(
        &mut self,
        va: Ip,
        pa: PhysAddr,
        size: PageSize,
        flags: u64,
    ) -> Result<(), BuildError> {
        let aligned = va.0.is_multiple_of(size.bytes()) && pa.0.is_multiple_of(size.bytes());
        if !aligned || !self.mode.is_canonical(va.0) {
            return Err(BuildError::BadAddress { va, size });
        }
        let config = PagingConfig::with_mode(self.mode);
        let mut table = self.root;
        for &level in self.mode.levels() {
            let index = level.index_of(va.0);
            if level.page_size() == Some(size) {
                let ps = if size == PageSize::Size4K { 0 } else { PS };
                self.set_entry(table, index, pa.0 | flags | ps | P);
                return Ok(());
            }
            let slot = PhysAddr(table.0 + u64::from(index) * 8);
            let entry = Entry::new(level, self.mem.read_phys_u64(slot).unwrap_or(0));
            table = if !entry.present() {
                let next = self.alloc_frame();
                self.set_entry(table, index, next.0 | self.table_flags);
                next
            } else if entry.is_leaf() {
                return Err(BuildError::LargePageInTheWay { va, level });
            } else {
                entry.address(&config)
            };
        }
        Err(BuildError::BadAddress { va, size })
    }

    /// Writes bytes into physical memory (page contents).
    pub fn write(&mut self, pa: PhysAddr, data: &[u8]) {
        self.mem.write(pa, data);
    }

    /// The memory built so far.
    pub fn memory(&self) -> &SparseMemory {
        &self.mem
    }

    /// The memory, giving up the builder.
    pub fn into_memory(self) -> SparseMemory {
        self.mem
    }
}
