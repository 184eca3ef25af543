//! Walker and iteration tests over tables built in memory.

use super::entry::{A, D, G, P, PS, RW, US, XD};
use super::*;
use crate::phys::SparseMemory;
use hwtrace_types::{Cr3, Ip, PhysAddr};

fn tables(b: &PageTableBuilder) -> PageTables<&SparseMemory> {
    PageTables::new(b.memory(), b.cr3(), PagingConfig::with_mode(b.mode()))
}

/// Seed 004's hand walk of the IDT base, entry for entry: CR3 52c76000,
/// PML4E 00c08063, PDPTE 00c09063, PDE 00ca7063, PTE 89000000`0588e121.
#[test]
fn seed_004_walk_reproduces_the_articles_physical_address() {
    let mut mem = SparseMemory::new();
    mem.write_u64(PhysAddr(0x52c76000 + 0x1f0 * 8), 0x0000_0000_00c0_8063);
    mem.write_u64(PhysAddr(0xc08000 + 0xd * 8), 0x0000_0000_00c0_9063);
    mem.write_u64(PhysAddr(0xc09000 + 0x1c4 * 8), 0x0000_0000_00ca_7063);
    mem.write_u64(PhysAddr(0xca7000 + 0x8e * 8), 0x8900_0000_0588_e121);
    let pt = PageTables::new(&mem, Cr3(0x52c76000), PagingConfig::default());
    let t = pt.translate(Ip(0xffff_f803_7888_e000)).unwrap();
    assert_eq!(t.pa, PhysAddr(0x588e000));
    assert_eq!(t.page_size, PageSize::Size4K);
    let path: Vec<_> = t
        .path
        .steps()
        .map(|s| (s.level, s.index, s.entry_addr.0))
        .collect();
    assert_eq!(
        path,
        [
            (Level::Pml4, 0x1f0, 0x52c76f80),
            (Level::Pdpt, 0xd, 0xc08068),
            (Level::Pd, 0x1c4, 0xc09e20),
            (Level::Pt, 0x8e, 0xca7470),
        ]
    );
    assert_eq!(
        t.perms,
        Perms {
            writable: false,
            user: false,
            no_execute: true
        }
    );
    assert_eq!(t.path.leaf().map(|s| s.entry.global()), Some(Some(true)));
}

#[test]
fn four_kib_two_mib_and_one_gib_pages_translate_with_offsets() {
    for mode in [PagingMode::Level4, PagingMode::Level5] {
        let mut b = PageTableBuilder::new(mode, PhysAddr(0x1000));
        b.map(
            Ip(0x40_0000),
            PhysAddr(0x7000_0000),
            PageSize::Size4K,
            RW | US,
        )
        .unwrap();
        b.map(
            Ip(0xffff_ffff_8000_0000),
            PhysAddr(0x20_0000),
            PageSize::Size2M,
            G,
        )
        .unwrap();
        b.map(
            Ip(0xffff_8880_0000_0000),
            PhysAddr(0x4000_0000),
            PageSize::Size1G,
            RW | XD,
        )
        .unwrap();
        let pt = tables(&b);
        let cases = [
            (0x40_0123, 0x7000_0123, PageSize::Size4K, "urwx"),
            (0xffff_ffff_801f_fff0, 0x3f_fff0, PageSize::Size2M, "-r-x"),
            (0xffff_8880_3fff_ffff, 0x7fff_ffff, PageSize::Size1G, "-rw-"),
        ];
        for (va, pa, size, perms) in cases {
            let t = pt.translate(Ip(va)).unwrap();
            assert_eq!((t.pa.0, t.page_size), (pa, size), "{mode} {va:#x}");
            assert_eq!(t.perms.to_string(), perms);
            let levels = mode.levels().len();
            let expect_steps = match size {
                PageSize::Size4K => levels,
                PageSize::Size2M => levels - 1,
                PageSize::Size1G => levels - 2,
            };
            assert_eq!(t.path.steps().count(), expect_steps);
            assert_eq!(t.path.at(mode.top()).map(|s| s.level), Some(mode.top()));
        }
    }
}

#[test]
fn five_level_uses_bits_56_to_48() {
    let mut b = PageTableBuilder::new(PagingMode::Level5, PhysAddr(0x10_0000));
    let va = 0xff12_3456_789a_b000u64; // canonical under LA57 only
    assert!(!PagingMode::Level4.is_canonical(va));
    b.map(Ip(va), PhysAddr(0x9000), PageSize::Size4K, 0)
        .unwrap();
    let t = tables(&b).translate(Ip(va + 0x10)).unwrap();
    assert_eq!(t.pa, PhysAddr(0x9010));
    let first = t.path.steps().next().unwrap();
    assert_eq!(
        (first.level, first.index),
        (Level::Pml5, Level::Pml5.index_of(va))
    );
    assert_eq!(first.index, 0x112);
}

#[test]
fn errors_name_level_entry_and_address() {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    b.map(Ip(0x20_0000), PhysAddr(0x5000), PageSize::Size4K, 0)
        .unwrap();
    let pt = tables(&b);

    let e = pt.translate(Ip(0x20_1000)).unwrap_err();
    let WalkErrorKind::NotPresent(step) = e.kind else {
        panic!("{e}")
    };
    assert_eq!((step.level, step.index), (Level::Pt, 1));
    assert_eq!(
        e.to_string(),
        format!(
            "translating 0x201000: PTE[0x001] at {} = 0x0000000000000000 is not present",
            step.entry_addr
        )
    );

    let e = pt.translate(Ip(0x8000_0000_0000)).unwrap_err();
    assert_eq!(
        e.kind,
        WalkErrorKind::NonCanonical {
            mode: PagingMode::Level4
        }
    );

    let e = pt.translate(Ip(0x7f00_0000_0000)).unwrap_err();
    assert!(matches!(
        e.kind,
        WalkErrorKind::NotPresent(Step {
            level: Level::Pml4,
            index: 0xfe,
            ..
        })
    ));

    // A PML4E with PS set: reserved.
    let mut bad = b.clone();
    bad.set_entry(PhysAddr(0x1000), 0, 0x2000 | P | RW | US | PS);
    let e = tables(&bad).translate(Ip(0x20_0000)).unwrap_err();
    assert_eq!(
        e.kind,
        WalkErrorKind::ReservedBits {
            step: Step {
                level: Level::Pml4,
                index: 0,
                entry_addr: PhysAddr(0x1000),
                entry: Entry::new(Level::Pml4, 0x2000 | P | RW | US | PS)
            },
            bits: PS
        }
    );

    // An address bit above MAXPHYADDR.
    let narrow = PageTables::new(
        b.memory(),
        b.cr3(),
        PagingConfig {
            max_phys_addr: 36,
            ..PagingConfig::default()
        },
    );
    let mut far = b.clone();
    far.map(Ip(0x40_0000), PhysAddr(0x10_0000_0000), PageSize::Size4K, 0)
        .unwrap();
    let narrow_far = PageTables::new(far.memory(), far.cr3(), *narrow.config());
    let e = narrow_far.translate(Ip(0x40_0000)).unwrap_err();
    assert!(
        matches!(
            e.kind,
            WalkErrorKind::ReservedBits {
                bits: 0x10_0000_0000,
                ..
            }
        ),
        "{e}"
    );

    // A table outside the dump.
    let mut out = b.clone();
    out.set_entry(PhysAddr(0x1000), 3, 0xdead_0000 | P);
    let e = tables(&out).translate(Ip(3 << 39)).unwrap_err();
    assert_eq!(
        e.kind,
        WalkErrorKind::OutsideDump {
            level: Level::Pdpt,
            index: 0,
            addr: PhysAddr(0xdead_0000)
        }
    );
    assert!(
        e.to_string()
            .contains("PDPTE[0x000] at 0xdead0000 is outside the dump"),
        "{e}"
    );
}

#[test]
fn rights_combine_across_levels() {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    b.set_table_flags(US | XD);
    b.map(
        Ip(0x1000),
        PhysAddr(0x9000),
        PageSize::Size4K,
        RW | US | A | D,
    )
    .unwrap();
    let t = tables(&b).translate(Ip(0x1000)).unwrap();
    assert_eq!(
        t.perms,
        Perms {
            writable: false,
            user: true,
            no_execute: true
        }
    );
    let leaf = t.path.leaf().unwrap().entry;
    assert_eq!(leaf.dirty(), Some(true));
    assert_eq!(leaf.flags().to_string(), "P RW US A D PK=0");
}

#[test]
fn mappings_come_in_address_order_and_merge_by_rights() {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    for i in 0..4u64 {
        // Physically scattered, virtually contiguous: one range.
        b.map(
            Ip(0x40_0000 + i * 0x1000),
            PhysAddr(0x80_0000 - i * 0x1000),
            PageSize::Size4K,
            US,
        )
        .unwrap();
    }
    b.map(Ip(0x40_4000), PhysAddr(0x9000), PageSize::Size4K, US | RW)
        .unwrap();
    b.map(
        Ip(0xffff_ffff_8000_0000),
        PhysAddr(0x20_0000),
        PageSize::Size2M,
        XD,
    )
    .unwrap();
    b.map(
        Ip(0xffff_ffff_8020_0000),
        PhysAddr(0x40_0000),
        PageSize::Size2M,
        0,
    )
    .unwrap();
    let pt = tables(&b);
    let maps: Vec<_> = pt.mappings().collect::<Result<_, _>>().unwrap();
    assert_eq!(maps.len(), 7);
    assert!(maps.windows(2).all(|w| w[0].va < w[1].va));
    assert_eq!(maps[6].va, Ip(0xffff_ffff_8020_0000));

    let ranges: Vec<_> = Merged::new(pt.mappings(), MergeBy::Perms)
        .collect::<Result<_, _>>()
        .unwrap();
    let shown: Vec<_> = ranges
        .iter()
        .map(|r| format!("{:x}-{:x} {}", r.start, r.end(), r.perms))
        .collect();
    assert_eq!(
        shown,
        [
            "400000-404000 ur-x",
            "404000-405000 urwx",
            "ffffffff80000000-ffffffff80200000 -r--",
            "ffffffff80200000-ffffffff80400000 -r-x",
        ]
    );
    // QEMU's `info mem` ignores XD: the two kernel pages merge.
    let qemu: Vec<_> = Merged::new(pt.mappings(), MergeBy::UserWrite)
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(qemu.len(), 3);
    assert_eq!(qemu[2].size, 0x40_0000);
}

#[test]
fn iteration_reports_bad_entries_and_goes_on() {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    b.map(Ip(0x1000), PhysAddr(0x9000), PageSize::Size4K, 0)
        .unwrap();
    b.map(Ip(0x7f00_0000_0000), PhysAddr(0xa000), PageSize::Size4K, 0)
        .unwrap();
    b.set_entry(PhysAddr(0x1000), 5, 0xbad_0000 | P); // table outside the dump
    b.set_entry(PhysAddr(0x1000), 6, 0x2000 | P | PS); // reserved bit
    let items: Vec<_> = tables(&b).mappings().collect();
    assert_eq!(items.len(), 4);
    assert!(items[0].is_ok());
    let e1 = items[1].unwrap_err();
    assert_eq!(e1.va, Ip(5 << 39));
    assert!(matches!(
        e1.kind,
        WalkErrorKind::OutsideDump {
            level: Level::Pml4,
            index: 5,
            ..
        }
    ));
    assert!(matches!(
        items[2].unwrap_err().kind,
        WalkErrorKind::ReservedBits { .. }
    ));
    assert_eq!(items[3].unwrap().va, Ip(0x7f00_0000_0000));
}

#[test]
fn cyclic_tables_hit_the_cap_instead_of_looping() {
    // Every entry of every level points back at the root: 512^3 tables.
    let mut mem = SparseMemory::new();
    for i in 0..512u64 {
        mem.write_u64(PhysAddr(0x1000 + i * 8), 0x1000 | P | RW);
    }
    let pt = PageTables::new(&mem, Cr3(0x1000), PagingConfig::default());
    let items: Vec<_> = pt.mappings_capped(1000).collect();
    let last = items.last().unwrap().unwrap_err();
    assert_eq!(last.kind, WalkErrorKind::TooManyTables { limit: 1000 });
    assert!(items.len() > 1000, "leaves were found before the cap");
    // One translation still terminates: four steps at most.
    let t = pt.translate(Ip(0x1234)).unwrap();
    assert_eq!(t.pa, PhysAddr(0x1234));
}

#[test]
fn root_outside_the_dump_is_one_error() {
    let mem = SparseMemory::new();
    let pt = PageTables::new(&mem, Cr3(0x5000), PagingConfig::default());
    let items: Vec<_> = pt.mappings().collect();
    assert_eq!(items.len(), 1);
    assert!(matches!(
        items[0].unwrap_err().kind,
        WalkErrorKind::OutsideDump {
            level: Level::Pml4,
            ..
        }
    ));
}

#[test]
fn cr3_low_bits_and_high_bits_are_not_address() {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x3000));
    b.map(Ip(0x1000), PhysAddr(0x9000), PageSize::Size4K, 0)
        .unwrap();
    // PCID 0x5 in bits 11:0, bit 63 (no-flush) set.
    let cr3 = Cr3(0x3000 | 0x5 | (1 << 63));
    let pt = PageTables::new(b.memory(), cr3, PagingConfig::default());
    assert_eq!(pt.root(), PhysAddr(0x3000));
    assert_eq!(pt.translate(Ip(0x1000)).unwrap().pa, PhysAddr(0x9000));
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Arbitrary bytes as page tables: translation never panics, and a
        /// capped iteration ends.
        #[test]
        fn arbitrary_tables_never_panic(
            pages in proptest::collection::vec(proptest::collection::vec(any::<u64>(), 512), 1..6),
            va in any::<u64>(),
            five in any::<bool>(),
            max_phys in 0u8..70,
        ) {
            let mut mem = SparseMemory::new();
            for (i, page) in pages.iter().enumerate() {
                for (j, raw) in page.iter().enumerate() {
                    // Point entries at the pages that exist, most of the time.
                    let raw = if raw % 4 == 0 { *raw } else { (raw & !0x000f_ffff_ffff_f000) | (((raw >> 12) % pages.len() as u64) << 12) };
                    mem.write_u64(PhysAddr(((i as u64) << 12) | ((j as u64) * 8)), raw);
                }
            }
            let mode = if five { PagingMode::Level5 } else { PagingMode::Level4 };
            let config = PagingConfig { mode, max_phys_addr: max_phys, nxe: va & 1 == 0 };
            let pt = PageTables::new(&mem, Cr3(0), config);
            if let Ok(t) = pt.translate(Ip(va)) {
                prop_assert!(t.path.steps().count() <= mode.levels().len());
            }
            let n = Merged::new(pt.mappings_capped(64), MergeBy::Perms).take(1 << 16).count();
            prop_assert!(n < 1 << 16);
        }
    }
}
