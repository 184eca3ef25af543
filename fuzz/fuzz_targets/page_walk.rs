//! Arbitrary bytes as physical memory holding page tables: translating any
//! address and iterating every mapping must neither panic nor loop.
#![no_main]

use hwtrace_mem::paging::{MergeBy, Merged, PageTables, PagingConfig, PagingMode};
use hwtrace_mem::phys::{RawDump, Region};
use hwtrace_types::{Cr3, Ip, PhysAddr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // 16 bytes of parameters, then the memory (physical 0 up).
    let Some((params, mem)) = data.split_first_chunk::<16>() else {
        return;
    };
    let va = u64::from_le_bytes(params[..8].try_into().unwrap_or_default());
    let flags = params[8];
    let cr3 = u64::from(params[9]) << 12;
    let config = PagingConfig {
        mode: if flags & 1 != 0 {
            PagingMode::Level5
        } else {
            PagingMode::Level4
        },
        max_phys_addr: params[10],
        nxe: flags & 2 != 0,
    };
    let region = Region {
        phys: PhysAddr(0),
        file_offset: 0,
        len: mem.len() as u64,
    };
    let Ok(dump) = RawDump::from_bytes(mem.to_vec(), vec![region]) else {
        return;
    };
    let tables = PageTables::new(&dump, Cr3(cr3), config);
    if let Ok(t) = tables.translate(Ip(va)) {
        assert!(t.path.steps().count() <= 5);
    }
    let merged = Merged::new(tables.mappings_capped(256), MergeBy::Perms);
    assert!(merged.take(1 << 20).count() < 1 << 20);
});
