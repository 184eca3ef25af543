//! Every mapping of an address space, in address order, and merged ranges.
//!
//! The iteration visits the paging structures depth-first (SDM vol. 3A,
//! §4.5). The depth is at most five, but tables may point back at each
//! other (a self-map is one such loop, and legal), so the number of tables
//! visited is capped: past the cap the iterator yields
//! [`WalkErrorKind::TooManyTables`] and ends.

use super::{Entry, Level, PageSize, PageTables, Perms, Step, WalkError, WalkErrorKind};
use hwtrace_types::{Ip, PhysAddr, PhysMemory};
use std::fmt;

/// How many tables an iteration reads by default before giving up: 2^20
/// tables hold 4 GiB of paging structures, more than any real machine.
pub const DEFAULT_MAX_TABLES: usize = 1 << 20;

/// One page mapped by a leaf entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The first linear address of the page (canonical).
    pub va: Ip,
    /// The physical base of the page.
    pub pa: PhysAddr,
    /// The page size.
    pub size: PageSize,
    /// Access rights combined over the path.
    pub perms: Perms,
    /// The leaf entry.
    pub leaf: Entry,
}

/// A table being visited.
struct Frame {
    level: Level,
    table: PhysAddr,
    entries: Box<[u64; 512]>,
    /// Linear address bits above this level (not yet canonical).
    base: u64,
    next: usize,
    perms: Perms,
}

/// Iterator over every page mapped in an address space; see
/// [`PageTables::mappings`].
pub struct Mappings<'a, M> {
    tables: &'a PageTables<M>,
    stack: Vec<Frame>,
    visited: usize,
    max_tables: usize,
    done: bool,
}

impl<M> fmt::Debug for Mappings<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mappings")
            .field("depth", &self.stack.len())
            .field("visited", &self.visited)
            .finish()
    }
}

impl<M: PhysMemory> PageTables<M> {
    /// Every page mapped, in linear-address order, with the default table
    /// cap. Entries that are not present are skipped; entries with reserved
    /// bits and tables outside the dump are reported as errors and skipped.
    pub fn mappings(&self) -> Mappings<'_, M> {
        self.mappings_capped(DEFAULT_MAX_TABLES)
    }

    /// Like [`PageTables::mappings`], reading at most `max_tables` tables.
    pub fn mappings_capped(&self, max_tables: usize) -> Mappings<'_, M> {
        Mappings {
            tables: self,
            stack: Vec::with_capacity(5),
            visited: 0,
            max_tables,
            done: false,
        }
    }

    /// Reads one whole table.
    fn read_table(&self, table: PhysAddr) -> Option<Box<[u64; 512]>> {
        let mut bytes = [0u8; 4096];
        self.memory().read_phys(table, &mut bytes).ok()?;
        let mut entries = Box::new([0u64; 512]);
        for (e, chunk) in entries.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            *e = u64::from_le_bytes(b);
        }
        Some(entries)
    }
}

impl<M: PhysMemory> Mappings<'_, M> {
    /// Pushes the table at `table`; on failure returns the error to yield.
    fn enter(
        &mut self,
        level: Level,
        table: PhysAddr,
        base: u64,
        perms: Perms,
        via: Option<Step>,
    ) -> Result<(), WalkError> {
        let mode = self.tables.config().mode;
        let va = Ip(mode.canonicalize(base));
        if self.visited >= self.max_tables {
            self.done = true;
            return Err(WalkError {
                va,
                kind: WalkErrorKind::TooManyTables {
                    limit: self.max_tables,
                },
            });
        }
        self.visited += 1;
        match self.tables.read_table(table) {
            Some(entries) => {
                self.stack.push(Frame {
                    level,
                    table,
                    entries,
                    base,
                    next: 0,
                    perms,
                });
                Ok(())
            }
            None => {
                let (level, index) = via.map_or((level, 0), |s| (s.level, s.index));
                let addr = via.map_or(table, |s| s.entry_addr);
                Err(WalkError {
                    va,
                    kind: WalkErrorKind::OutsideDump { level, index, addr },
                })
            }
        }
    }
}

impl<M: PhysMemory> Iterator for Mappings<'_, M> {
    type Item = Result<Mapping, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let config = *self.tables.config();
        if self.visited == 0 {
            let root = self.tables.root();
            if let Err(e) = self.enter(config.mode.top(), root, 0, Perms::ALL, None) {
                self.done = true;
                return Some(Err(e));
            }
        }
        loop {
            let frame = self.stack.last_mut()?;
            let Some(&raw) = frame.entries.get(frame.next) else {
                self.stack.pop();
                if self.stack.is_empty() {
                    self.done = true;
                }
                continue;
            };
            let index = frame.next as u16;
            frame.next += 1;
            let level = frame.level;
            let entry = Entry::new(level, raw);
            if !entry.present() {
                continue;
            }
            let base = frame.base | (u64::from(index) << level.shift());
            let va = Ip(config.mode.canonicalize(base));
            let step = Step {
                level,
                index,
                entry_addr: PhysAddr(frame.table.0 + u64::from(index) * 8),
                entry,
            };
            let bits = entry.reserved_bits(&config);
            if bits != 0 {
                return Some(Err(WalkError {
                    va,
                    kind: WalkErrorKind::ReservedBits { step, bits },
                }));
            }
            let perms = frame.perms.and_entry(&entry, &config);
            if let Some(size) = entry.page_size() {
                return Some(Ok(Mapping {
                    va,
                    pa: entry.address(&config),
                    size,
                    perms,
                    leaf: entry,
                }));
            }
            let Some(child) = level.next() else { continue };
            if let Err(e) = self.enter(child, entry.address(&config), base, perms, Some(step)) {
                return Some(Err(e));
            }
        }
    }
}

/// A run of linear addresses mapped with the same rights, as QEMU's
/// `info mem` prints them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// The first address.
    pub start: Ip,
    /// The length in bytes.
    pub size: u64,
    /// The rights over the whole range.
    pub perms: Perms,
}

impl Range {
    /// The address after the last byte (wrapping to 0 at the very top).
    pub fn end(&self) -> Ip {
        self.start.add(self.size)
    }
}

/// Which rights split ranges when merging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MergeBy {
    /// User, write and execute-disable.
    #[default]
    Perms,
    /// User and write only, as QEMU's `info mem` (which ignores XD).
    UserWrite,
}

impl MergeBy {
    fn key(self, p: Perms) -> Perms {
        match self {
            Self::Perms => p,
            Self::UserWrite => Perms {
                no_execute: false,
                ..p
            },
        }
    }
}

/// Merges consecutive mappings (contiguous in linear addresses, with the
/// same rights) into ranges; errors pass through and end the current range.
#[derive(Debug)]
pub struct Merged<I> {
    inner: I,
    by: MergeBy,
    pending: Option<Range>,
    held: Option<WalkError>,
}

impl<I> Merged<I> {
    /// Merges `inner`.
    pub fn new(inner: I, by: MergeBy) -> Self {
        Self {
            inner,
            by,
            pending: None,
            held: None,
        }
    }
}

impl<I: Iterator<Item = Result<Mapping, WalkError>>> Iterator for Merged<I> {
    type Item = Result<Range, WalkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.held.take() {
            return Some(Err(e));
        }
        loop {
            match self.inner.next() {
                None => return self.pending.take().map(Ok),
                Some(Err(e)) => match self.pending.take() {
                    Some(r) => {
                        self.held = Some(e);
                        return Some(Ok(r));
                    }
                    None => return Some(Err(e)),
                },
                Some(Ok(m)) => {
                    let perms = self.by.key(m.perms);
                    let next = Range {
                        start: m.va,
                        size: m.size.bytes(),
                        perms,
                    };
                    match &mut self.pending {
                        Some(r) if r.end() == m.va && r.perms == perms => r.size += next.size,
                        Some(r) => {
                            let done = *r;
                            self.pending = Some(next);
                            return Some(Ok(done));
                        }
                        None => self.pending = Some(next),
                    }
                }
            }
        }
    }
}
