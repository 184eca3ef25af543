//! Finding the address spaces a dump holds: which top-level tables (PML4
//! or PML5 pages) are in physical memory, when only one CR3 is known.
//!
//! A dump names one CR3 per vCPU, but holds the page tables of every
//! process. Linux gives every process the same kernel half: a new PGD
//! copies entries 256..512 of the kernel's (`pgd_ctor`), and those entries
//! never change afterwards (the kernel's upper-level tables are allocated
//! at boot). So a page whose entries 256..512 equal the kernel half of the
//! known CR3's table is the top-level table of another address space. The
//! comparison ignores the bits the processor writes (A, SDM vol. 3A,
//! §4.8) and XD, which Linux's page-table isolation sets on user entries of
//! the kernel copy.
//!
//! With page-table isolation (PTI) each process has two tables in one
//! 8 KiB-aligned pair: the kernel's at the even page and, 4 KiB above it,
//! the one user mode runs on, whose user half mirrors the kernel copy's and
//! whose kernel half holds only the entry code. The user copy fails the
//! kernel-half comparison, so it is found from its partner and reported as
//! [`TopTableKind::PtiUser`]; a reference CR3 naming a user copy (a vCPU
//! stopped in user mode) is compared through its partner's kernel half.
//!
//! A candidate must also look like a table: no present entry with reserved
//! bits set (SDM vol. 3A, §4.5, Tables 4-14 and 4-15), and every present
//! entry pointing inside the dump. Freed tables of exited processes can
//! pass these checks: the scan finds tables, not live processes.

use super::{Entry, MergeBy, Merged, PageTables, PagingConfig, Range, WalkError};
use crate::phys::Region;
use hwtrace_types::{Cr3, PhysAddr, PhysMemory};

/// Entry bits that differ between copies of one kernel half: A (bit 5, set
/// by the processor), bit 6 (ignored in non-leaf entries) and XD (set by
/// PTI on the kernel copy's user entries).
const VOLATILE: u64 = (1 << 5) | (1 << 6) | (1 << 63);

/// How many tables a scan reports at most; past it the scan stops and says
/// so ([`Scan::truncated`]). Far more than the processes of a real guest.
pub const DEFAULT_MAX_TABLES_FOUND: usize = 4096;

/// Why a scan could not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScanError {
    /// The reference CR3's table is not in the dump.
    #[error("the top-level table of CR3 {cr3} at {table} is outside the dump")]
    ReferenceOutsideDump {
        /// The reference CR3.
        cr3: Cr3,
        /// Its table's physical address.
        table: PhysAddr,
    },
    /// The reference table has no present entry in its kernel half: there
    /// is nothing to recognise other tables by.
    #[error(
        "the top-level table of CR3 {cr3} at {table} has no kernel half (entries 256..512 are all not present)"
    )]
    NoKernelHalf {
        /// The reference CR3.
        cr3: Cr3,
        /// Its table's physical address.
        table: PhysAddr,
    },
}

/// What kind of address space a table found is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopTableKind {
    /// A table with the shared kernel half and user entries: a process (or
    /// a freed table of one).
    Process,
    /// The shared kernel half and no user entry: the kernel's own table
    /// (Linux's `swapper_pg_dir`) or a process without user mappings.
    KernelOnly,
    /// The PTI user copy 4 KiB above the kernel copy `kernel`: its user
    /// half mirrors that table's, its kernel half holds only entry code.
    PtiUser {
        /// The CR3 of the kernel copy.
        kernel: Cr3,
    },
}

/// One top-level table found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopTable {
    /// The CR3 value naming it (the table's address; no PCID or flags).
    pub cr3: Cr3,
    /// What it is.
    pub kind: TopTableKind,
    /// Present entries in its user half (0..256).
    pub user_entries: u16,
}

/// The result of a scan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The tables found, by physical address.
    pub tables: Vec<TopTable>,
    /// Pages looked at.
    pub pages_scanned: u64,
    /// Pages whose kernel half matched but which failed the sanity checks.
    pub rejected: u64,
    /// The scan stopped at its limit on tables found.
    pub truncated: bool,
}

/// A whole table's 512 entries.
type Table = [u64; 512];

fn read_table<M: PhysMemory>(mem: &M, at: PhysAddr) -> Option<Box<Table>> {
    let mut bytes = [0u8; 4096];
    mem.read_phys(at, &mut bytes).ok()?;
    let mut table = Box::new([0u64; 512]);
    for (e, chunk) in table.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(chunk);
        *e = u64::from_le_bytes(b);
    }
    Some(table)
}

fn present(raw: u64) -> bool {
    raw & 1 != 0
}

fn same(a: u64, b: u64) -> bool {
    a & !VOLATILE == b & !VOLATILE
}

/// The 4 KiB pages wholly inside `regions`, in address order, lazily (a
/// dump of many GiB costs no memory to list).
pub fn region_pages(regions: &[Region]) -> impl Iterator<Item = PhysAddr> + use<> {
    let mut sorted = regions.to_vec();
    sorted.sort_by_key(|r| r.phys.0);
    sorted.into_iter().flat_map(|r| {
        let first = r.phys.0.div_ceil(4096).saturating_mul(4096);
        let end = r.phys.0.saturating_add(r.len);
        (first..end.saturating_sub(4095))
            .step_by(4096)
            .map(PhysAddr)
    })
}

/// Finds the top-level tables among `pages` (page addresses, e.g.
/// [`region_pages`]) of `mem` whose kernel half is the one of `reference`
/// (the CR3 of a vCPU), reading one page at a time (memory stays bounded
/// whatever the dump's size) and at most `max_found` tables.
///
/// Every page is first checked at one entry (the reference's highest
/// present kernel entry), so a 256 MiB dump costs one 8-byte read per page
/// plus a full read of the few pages that pass.
pub fn find_top_tables<M: PhysMemory>(
    mem: &M,
    pages: impl IntoIterator<Item = PhysAddr>,
    config: &PagingConfig,
    reference: Cr3,
    max_found: usize,
) -> Result<Scan, ScanError> {
    let ref_table = config.root_table(reference);
    let mut kernel = read_table(mem, ref_table).ok_or(ScanError::ReferenceOutsideDump {
        cr3: reference,
        table: ref_table,
    })?;
    // A vCPU stopped in user mode under PTI runs on the user copy, whose
    // kernel half is only the entry code: compare with its kernel copy.
    if ref_table.0 % 0x2000 == 0x1000
        && let Some(partner) = read_table(mem, PhysAddr(ref_table.0 - 0x1000))
        && pti_user_copy(mem, config, &partner, ref_table.0).is_some()
    {
        kernel = partner;
    }
    let probe = (256..512)
        .rev()
        .find(|&i| present(kernel[i]))
        .ok_or(ScanError::NoKernelHalf {
            cr3: reference,
            table: ref_table,
        })?;
    let top = config.mode.top();
    let mut scan = Scan::default();
    for PhysAddr(page) in pages {
        if page % 4096 != 0 {
            continue;
        }
        scan.pages_scanned += 1;
        let Some(Ok(raw)) = page
            .checked_add(probe as u64 * 8)
            .map(|at| mem.read_phys_u64(PhysAddr(at)))
        else {
            continue;
        };
        if !same(raw, kernel[probe]) {
            continue;
        }
        let Some(table) = read_table(mem, PhysAddr(page)) else {
            continue;
        };
        if !(256..512).all(|i| same(table[i], kernel[i])) {
            continue;
        }
        let sane = table.iter().filter(|&&e| present(e)).all(|&e| {
            let entry = Entry::new(top, e);
            entry.reserved_bits(config) == 0 && mem.read_phys_u64(entry.address(config)).is_ok()
        });
        if !sane {
            scan.rejected += 1;
            continue;
        }
        if scan.tables.len() >= max_found {
            scan.truncated = true;
            break;
        }
        let user_entries = table[..256].iter().filter(|&&e| present(e)).count() as u16;
        let kind = if user_entries == 0 {
            TopTableKind::KernelOnly
        } else {
            TopTableKind::Process
        };
        scan.tables.push(TopTable {
            cr3: Cr3(page),
            kind,
            user_entries,
        });
        if user_entries > 0
            && page % 0x2000 == 0
            && let Some(user) = page
                .checked_add(0x1000)
                .and_then(|at| pti_user_copy(mem, config, &table, at))
        {
            if scan.tables.len() >= max_found {
                scan.truncated = true;
                break;
            }
            scan.tables.push(user);
        }
    }
    scan.tables.sort_by_key(|t| t.cr3.0);
    scan.tables.dedup_by_key(|t| t.cr3.0);
    Ok(scan)
}

/// The PTI user copy at `at` of the kernel copy `kernel`, if the page is
/// one: the same present user entries, and fewer present kernel entries.
fn pti_user_copy<M: PhysMemory>(
    mem: &M,
    config: &PagingConfig,
    kernel: &Table,
    at: u64,
) -> Option<TopTable> {
    let user = read_table(mem, PhysAddr(at))?;
    let mirrors = (0..256).all(|i| {
        present(kernel[i]) == present(user[i]) && (!present(kernel[i]) || same(kernel[i], user[i]))
    });
    let kernel_present = kernel[256..].iter().filter(|&&e| present(e)).count();
    let user_kernel_present = user[256..].iter().filter(|&&e| present(e)).count();
    let top = config.mode.top();
    let sane = user.iter().filter(|&&e| present(e)).all(|&e| {
        let entry = Entry::new(top, e);
        entry.reserved_bits(config) == 0 && mem.read_phys_u64(entry.address(config)).is_ok()
    });
    (mirrors && sane && user_kernel_present < kernel_present).then(|| TopTable {
        cr3: Cr3(at),
        kind: TopTableKind::PtiUser {
            kernel: Cr3(at - 0x1000),
        },
        user_entries: user[..256].iter().filter(|&&e| present(e)).count() as u16,
    })
}

/// What an address space maps in its user half.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserSummary {
    /// User-accessible pages (of any size) below the kernel half.
    pub pages: u64,
    /// Bytes of user-accessible pages below the kernel half.
    pub bytes: u64,
    /// Supervisor-only pages below the kernel half (a trampoline's
    /// identity map, say: not a process's).
    pub supervisor_pages: u64,
    /// Runs of user-accessible, executable pages (contiguous, same rights).
    pub exec_ranges: Vec<Range>,
    /// Entries that could not be followed (reserved bits, tables outside
    /// the dump), or the table cap reached.
    pub errors: Vec<WalkError>,
}

/// Summarises the user half of `tables`: every mapping below the kernel
/// half is visited (reading at most `max_tables` tables), the executable
/// user ones merged into ranges.
pub fn summarize_user<M: PhysMemory>(tables: &PageTables<M>, max_tables: usize) -> UserSummary {
    let mode = tables.config().mode;
    // The first address of the kernel half: bit 47 (or 56) set.
    let kernel_half = mode.canonicalize(1u64 << (mode.va_bits() - 1));
    let mut summary = UserSummary::default();
    let user_half = tables
        .mappings_capped(max_tables)
        .take_while(|m| m.as_ref().map_or(true, |m| m.va.0 < kernel_half));
    let counted = user_half.inspect(|m| match m {
        Ok(m) if m.perms.user => {
            summary.pages += 1;
            summary.bytes += m.size.bytes();
        }
        Ok(_) => summary.supervisor_pages += 1,
        Err(_) => {}
    });
    let mut errors = Vec::new();
    let mut exec = Vec::new();
    for item in Merged::new(counted, MergeBy::Perms) {
        match item {
            Ok(r) if r.perms.user && !r.perms.no_execute => exec.push(r),
            Ok(_) => {}
            Err(e) if e.va.0 < kernel_half => errors.push(e),
            Err(_) => {}
        }
    }
    summary.exec_ranges = exec;
    summary.errors = errors;
    summary
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paging::entry::{P, RW, US, XD};
    use crate::paging::{PageSize, PageTableBuilder, PagingMode};
    use crate::phys::SparseMemory;
    use hwtrace_types::Ip;

    /// One physical memory with a kernel table (entries 256, 300 and 511
    /// pointing at kernel tables) and processes that copy its kernel half.
    struct Guest {
        mem: SparseMemory,
        kernel: Cr3,
    }

    fn guest(mode: PagingMode) -> Guest {
        let mut k = PageTableBuilder::new(mode, PhysAddr(0x10_0000));
        let top = mode.top().shift();
        for index in [256u64, 300, 511] {
            let va = Ip(mode.canonicalize(index << top));
            let frame = k.alloc_frame();
            k.map(va, frame, PageSize::Size4K, RW).expect("kernel page");
        }
        let kernel = k.cr3();
        Guest {
            mem: k.into_memory(),
            kernel,
        }
    }

    impl Guest {
        fn table(&self, cr3: Cr3) -> Table {
            *read_table(&self.mem, PhysAddr(cr3.0)).expect("table")
        }

        /// A process at `at`: the kernel half copied (with A set, as the
        /// processor leaves it), `user` entries pointing at fresh tables.
        fn process(&mut self, at: u64, user: &[u16]) -> Cr3 {
            let kernel = self.table(self.kernel);
            self.mem.add_page(PhysAddr(at));
            for (i, &k) in kernel.iter().enumerate().skip(256) {
                let e = if present(k) { k | 1 << 5 } else { 0 };
                self.mem.write_u64(PhysAddr(at + i as u64 * 8), e);
            }
            for (n, &i) in user.iter().enumerate() {
                let next = at + 0x10_0000 + n as u64 * 0x1000;
                self.mem.add_page(PhysAddr(next));
                self.mem
                    .write_u64(PhysAddr(at + u64::from(i) * 8), next | P | RW | US);
            }
            Cr3(at)
        }

        fn scan(&self, mode: PagingMode) -> Scan {
            let pages: Vec<PhysAddr> = self.mem.pages().map(|(a, _)| a).collect();
            find_top_tables(
                &self.mem,
                pages,
                &PagingConfig::with_mode(mode),
                self.kernel,
                DEFAULT_MAX_TABLES_FOUND,
            )
            .expect("scan")
        }
    }

    #[test]
    fn finds_every_table_with_the_kernel_half() {
        for mode in [PagingMode::Level4, PagingMode::Level5] {
            let mut g = guest(mode);
            let a = g.process(0x40_0000, &[0, 1]);
            let b = g.process(0x40_3000, &[0]);
            // A page holding the kernel half but also a reserved bit (PS in
            // a top-level entry) is not a table.
            let bad = g.process(0x40_5000, &[2]);
            let e = g.mem.read_phys_u64(PhysAddr(bad.0 + 16)).expect("entry");
            g.mem.write_u64(PhysAddr(bad.0 + 16), e | 1 << 7);
            // One pointing outside the memory is not either.
            let outside = g.process(0x40_7000, &[3]);
            g.mem
                .write_u64(PhysAddr(outside.0 + 24), 0x7000_0000 | P | RW | US);
            let scan = g.scan(mode);
            let found: Vec<(Cr3, TopTableKind, u16)> = scan
                .tables
                .iter()
                .map(|t| (t.cr3, t.kind, t.user_entries))
                .collect();
            assert_eq!(
                found,
                [
                    (g.kernel, TopTableKind::KernelOnly, 0),
                    (a, TopTableKind::Process, 2),
                    (b, TopTableKind::Process, 1),
                ],
                "{mode:?}"
            );
            assert_eq!(scan.rejected, 2);
            assert!(!scan.truncated);
            assert_eq!(scan.pages_scanned, g.mem.pages().count() as u64);
        }
    }

    #[test]
    fn a_pti_pair_reports_the_user_copy() {
        let mode = PagingMode::Level4;
        let mut g = guest(mode);
        let kernel_copy = g.process(0x40_0000, &[0, 5]);
        // The user copy: the same user entries (without XD, which PTI sets
        // on the kernel copy's), one kernel entry (the entry code).
        for i in [0u64, 5] {
            let e = g.mem.read_phys_u64(PhysAddr(0x40_0000 + i * 8)).expect("e");
            g.mem.write_u64(PhysAddr(0x40_0000 + i * 8), e | XD);
            g.mem.write_u64(PhysAddr(0x40_1000 + i * 8), e);
        }
        let k511 = g.table(g.kernel)[511];
        g.mem.write_u64(PhysAddr(0x40_1000 + 511 * 8), k511);
        let scan = g.scan(mode);
        let kinds: Vec<(Cr3, TopTableKind)> = scan.tables.iter().map(|t| (t.cr3, t.kind)).collect();
        // A vCPU stopped in user mode names the user copy: the same tables.
        let kernel = g.kernel;
        g.kernel = Cr3(0x40_1000);
        let from_user: Vec<(Cr3, TopTableKind)> = g
            .scan(mode)
            .tables
            .iter()
            .map(|t| (t.cr3, t.kind))
            .collect();
        assert_eq!(from_user, kinds);
        assert_eq!(
            kinds,
            [
                (kernel, TopTableKind::KernelOnly),
                (kernel_copy, TopTableKind::Process),
                (
                    Cr3(0x40_1000),
                    TopTableKind::PtiUser {
                        kernel: kernel_copy
                    }
                ),
            ]
        );
    }

    #[test]
    fn the_scan_is_bounded_and_errors_name_the_table() {
        let mode = PagingMode::Level4;
        let mut g = guest(mode);
        for n in 0..5 {
            g.process(0x40_0000 + n * 0x2000, &[1]);
        }
        let pages: Vec<PhysAddr> = g.mem.pages().map(|(a, _)| a).collect();
        let config = PagingConfig::with_mode(mode);
        let scan = find_top_tables(&g.mem, pages.clone(), &config, g.kernel, 3).expect("scan");
        assert_eq!(scan.tables.len(), 3);
        assert!(scan.truncated);

        let err = find_top_tables(&g.mem, pages.clone(), &config, Cr3(0x9000_0000), 3);
        assert_eq!(
            err,
            Err(ScanError::ReferenceOutsideDump {
                cr3: Cr3(0x9000_0000),
                table: PhysAddr(0x9000_0000)
            })
        );
        let user_only = g.process(0x80_0000, &[1]);
        g.mem.write(PhysAddr(user_only.0 + 256 * 8), &[0u8; 2048]);
        let err = find_top_tables(&g.mem, pages, &config, user_only, 3).unwrap_err();
        assert!(err.to_string().contains("no kernel half"), "{err}");
    }

    #[test]
    fn the_user_summary_lists_executable_ranges() {
        let mode = PagingMode::Level4;
        let mut b = PageTableBuilder::new(mode, PhysAddr(0x10_0000));
        for (va, flags) in [
            (0x40_0000u64, US),
            (0x40_1000, US),
            (0x40_2000, US | XD),
            (0x60_0000, US | RW | XD),
            (0x7fff_f000, US),
            (0x7fff_e000, 0),
        ] {
            let frame = b.alloc_frame();
            b.map(Ip(va), frame, PageSize::Size4K, flags).expect("map");
        }
        let frame = b.alloc_frame();
        b.map(Ip(0xffff_8000_0000_0000), frame, PageSize::Size4K, 0)
            .expect("kernel");
        let tables = PageTables::new(b.memory(), b.cr3(), PagingConfig::with_mode(mode));
        let s = summarize_user(&tables, 64);
        assert_eq!((s.pages, s.bytes, s.supervisor_pages), (5, 5 * 4096, 1));
        let exec: Vec<(u64, u64)> = s.exec_ranges.iter().map(|r| (r.start.0, r.size)).collect();
        assert_eq!(exec, [(0x40_0000, 0x2000), (0x7fff_f000, 0x1000)]);
        assert!(s.errors.is_empty());
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(100))]

            /// Arbitrary pages, any of them the reference: the scan never
            /// panics, reports only pages it was given, and the summary of
            /// every table found ends.
            #[test]
            fn arbitrary_pages_never_panic(
                pages in proptest::collection::vec(proptest::collection::vec(any::<u64>(), 512), 1..6),
                reference in 0usize..6,
                five in any::<bool>(),
                max_phys in 0u8..70,
            ) {
                let mut mem = SparseMemory::new();
                for (i, page) in pages.iter().enumerate() {
                    for (j, raw) in page.iter().enumerate() {
                        // Entries point at existing pages, most of the time,
                        // and some kernel halves are copies of page 0's.
                        let raw = if j >= 256 && i % 2 == 1 { pages[0][j] } else { *raw };
                        let raw = if raw % 4 == 0 { raw } else { (raw & !0x000f_ffff_ffff_f000) | (((raw >> 12) % pages.len() as u64) << 12) };
                        mem.write_u64(PhysAddr(((i as u64) << 12) | ((j as u64) * 8)), raw);
                    }
                }
                let mode = if five { PagingMode::Level5 } else { PagingMode::Level4 };
                let config = PagingConfig { mode, max_phys_addr: max_phys, nxe: true };
                let given: Vec<PhysAddr> = mem.pages().map(|(a, _)| a).collect();
                let reference = Cr3((reference % pages.len()) as u64 * 4096);
                if let Ok(scan) = find_top_tables(&mem, given.clone(), &config, reference, 8) {
                    prop_assert!(scan.tables.len() <= 8);
                    for t in &scan.tables {
                        prop_assert!(given.contains(&PhysAddr(t.cr3.0)));
                        let _ = summarize_user(&PageTables::new(&mem, t.cr3, config), 64);
                    }
                }
            }
        }
    }
}
