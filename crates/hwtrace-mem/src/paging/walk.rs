//! Translating one linear address, keeping the path.
//!
//! SDM vol. 3A, §4.5.4 "Linear-Address Translation with 4-Level Paging and
//! 5-Level Paging": CR3 locates the top table; each 9-bit field of the
//! address selects an entry whose address bits locate the next table, until
//! an entry maps a page (PS = 1 in a PDPTE or PDE, or any PTE). A walk has
//! at most five steps, so even a cyclic structure terminates.

use super::{Entry, Level, PageSize, PagingConfig, Perms, Step, WalkError, WalkErrorKind};
use hwtrace_types::{Cr3, Ip, PhysAddr, PhysMemory};

/// The paging structures of one address space: physical memory, a CR3 and
/// the processor configuration.
#[derive(Clone, Copy, Debug)]
pub struct PageTables<M> {
    mem: M,
    cr3: Cr3,
    config: PagingConfig,
}

/// The path of a walk: one step per level, at most five.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Path {
    steps: [Option<Step>; 5],
    len: usize,
}

impl Path {
    const fn new() -> Self {
        Self {
            steps: [None; 5],
            len: 0,
        }
    }

    fn push(&mut self, step: Step) {
        if let Some(slot) = self.steps.get_mut(self.len) {
            *slot = Some(step);
            self.len += 1;
        }
    }

    /// The steps taken, top level first.
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.steps[..self.len].iter().flatten()
    }

    /// The step at `level`, if the walk went through it.
    pub fn at(&self, level: Level) -> Option<&Step> {
        self.steps().find(|s| s.level == level)
    }

    /// The last step (the entry that mapped the page).
    pub fn leaf(&self) -> Option<&Step> {
        self.steps().last()
    }
}

/// A successful translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The linear address translated.
    pub va: Ip,
    /// The physical address it maps to.
    pub pa: PhysAddr,
    /// The size of the page that maps it.
    pub page_size: PageSize,
    /// Access rights combined over the path.
    pub perms: Perms,
    /// Every entry used, top level first.
    pub path: Path,
}

impl<M: PhysMemory> PageTables<M> {
    /// The address space whose top table CR3 names.
    pub fn new(mem: M, cr3: Cr3, config: PagingConfig) -> Self {
        Self { mem, cr3, config }
    }

    /// The physical memory the tables are read from.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The CR3 value.
    pub fn cr3(&self) -> Cr3 {
        self.cr3
    }

    /// The processor configuration.
    pub fn config(&self) -> &PagingConfig {
        &self.config
    }

    /// The physical address of the top-level table.
    pub fn root(&self) -> PhysAddr {
        self.config.root_table(self.cr3)
    }

    /// Reads the entry `index` of the table at `table` of `level`.
    pub fn read_entry(
        &self,
        level: Level,
        table: PhysAddr,
        index: u16,
    ) -> Result<Step, WalkErrorKind> {
        let entry_addr = PhysAddr(table.0 + u64::from(index & 0x1ff) * 8);
        let raw = self
            .mem
            .read_phys_u64(entry_addr)
            .map_err(|_| WalkErrorKind::OutsideDump {
                level,
                index,
                addr: entry_addr,
            })?;
        Ok(Step {
            level,
            index,
            entry_addr,
            entry: Entry::new(level, raw),
        })
    }

    /// Translates `va`, returning every entry on the way, or the entry
    /// that stopped the walk.
    pub fn translate(&self, va: Ip) -> Result<Translation, WalkError> {
        let fail = |kind| WalkError { va, kind };
        let mode = self.config.mode;
        if !mode.is_canonical(va.0) {
            return Err(fail(WalkErrorKind::NonCanonical { mode }));
        }
        let mut table = self.root();
        let mut perms = Perms::ALL;
        let mut path = Path::new();
        for &level in mode.levels() {
            let step = self
                .read_entry(level, table, level.index_of(va.0))
                .map_err(fail)?;
            let entry = step.entry;
            if !entry.present() {
                return Err(fail(WalkErrorKind::NotPresent(step)));
            }
            let bits = entry.reserved_bits(&self.config);
            if bits != 0 {
                return Err(fail(WalkErrorKind::ReservedBits { step, bits }));
            }
            perms = perms.and_entry(&entry, &self.config);
            path.push(step);
            if let Some(page_size) = entry.page_size() {
                let pa = PhysAddr(entry.address(&self.config).0 | page_size.offset_of(va.0));
                return Ok(Translation {
                    va,
                    pa,
                    page_size,
                    perms,
                    path,
                });
            }
            table = entry.address(&self.config);
        }
        // Unreachable for well-formed levels: the PT level always maps.
        Err(fail(WalkErrorKind::TooManyTables {
            limit: mode.levels().len(),
        }))
    }
}
