//! Arbitrary bytes as physical memory scanned for the top-level page
//! tables of other address spaces (`hwtrace mem --scan`): the scan and the
//! summary of each table found must neither panic nor loop, and what they
//! report must stay within the dump and the limits asked for.
#![no_main]

use hwtrace_mem::paging::{
    PageTables, PagingConfig, PagingMode, TopTableKind, find_top_tables, region_pages,
    summarize_user,
};
use hwtrace_mem::phys::{RawDump, Region};
use hwtrace_types::{Cr3, PhysAddr};
use libfuzzer_sys::fuzz_target;

const PAGE: usize = 4096;

fuzz_target!(|data: &[u8]| {
    // 8 bytes of parameters, then the memory.
    let Some((params, mem)) = data.split_first_chunk::<8>() else {
        return;
    };
    let flags = params[0];
    let config = PagingConfig {
        mode: if flags & 1 != 0 {
            PagingMode::Level5
        } else {
            PagingMode::Level4
        },
        max_phys_addr: params[1],
        nxe: flags & 2 != 0,
    };
    let mut mem = mem.to_vec();
    let pages = mem.len() / PAGE;
    // The reference CR3: a page of the dump, with low flag bits (PCID)
    // the scan must ignore.
    let reference = (usize::from(params[2]) % pages.max(1)) * PAGE;
    if flags & 4 != 0 && pages > 1 {
        // Copy the reference table's kernel half into the pages `params[3]`
        // selects, as a kernel does into every process's table, so the
        // fuzzer reaches the checks after the first comparison.
        let half: Vec<u8> = mem[reference + PAGE / 2..reference + PAGE].to_vec();
        for p in (0..pages.min(8)).filter(|p| params[3] >> p & 1 != 0) {
            mem[p * PAGE + PAGE / 2..(p + 1) * PAGE].copy_from_slice(&half);
        }
    }
    // One region from physical 0, or two with a hole between them.
    let len = mem.len() as u64;
    let regions = if flags & 8 != 0 && pages > 2 {
        let cut = (u64::from(params[4]) % (pages as u64 - 1) + 1) * PAGE as u64;
        let hole = u64::from(params[5]) * PAGE as u64;
        vec![
            Region {
                phys: PhysAddr(0),
                file_offset: 0,
                len: cut,
            },
            Region {
                phys: PhysAddr(cut + hole),
                file_offset: cut,
                len: len - cut,
            },
        ]
    } else {
        vec![Region {
            phys: PhysAddr(0),
            file_offset: 0,
            len,
        }]
    };
    let Ok(dump) = RawDump::from_bytes(mem, regions.clone()) else {
        return;
    };
    let max_found = usize::from(params[6] % 16) + 1;
    let cr3 = Cr3(reference as u64 | u64::from(params[7] & 0x1f) << 3);
    let in_dump = |at: u64| {
        regions
            .iter()
            .any(|r| at >= r.phys.0 && at < r.phys.0 + r.len)
    };
    let listed = region_pages(&regions).count() as u64;
    let Ok(scan) = find_top_tables(&dump, region_pages(&regions), &config, cr3, max_found) else {
        return;
    };
    assert!(scan.tables.len() <= max_found);
    assert!(!scan.truncated || scan.tables.len() == max_found);
    assert!(scan.pages_scanned <= listed);
    for t in &scan.tables {
        assert_eq!(t.cr3.0 % PAGE as u64, 0, "{t:?}");
        assert!(in_dump(t.cr3.0), "{t:?} outside the dump");
        assert!(t.user_entries <= 256);
        if let TopTableKind::PtiUser { kernel } = t.kind {
            assert_eq!(kernel.0 + PAGE as u64, t.cr3.0, "{t:?}");
        }
        let tables = PageTables::new(&dump, t.cr3, config);
        let summary = summarize_user(&tables, 64);
        assert!(summary.exec_ranges.len() as u64 <= summary.pages.max(1));
    }
});
