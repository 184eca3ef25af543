//! The self-map at every kernel-half index (Windows randomises it among
//! 0x100..=0x1FF): found by scanning the top table, and the derived table
//! addresses read back through the walker and the virtual-memory reader.

use hwtrace_mem::paging::entry::{RW, US, XD};
use hwtrace_mem::paging::{Level, PageSize, PageTableBuilder, PagingConfig, PagingMode};
use hwtrace_mem::selfmap::SelfMap;
use hwtrace_mem::virt::DumpMemory;
use hwtrace_types::{AddressSpace, Ip, PhysAddr, ReadMemory};

fn read_u64(mem: &impl ReadMemory, space: AddressSpace, va: Ip) -> u64 {
    let mut b = [0u8; 8];
    assert_eq!(mem.read_memory(space, va, &mut b), Ok(8), "read at {va}");
    u64::from_le_bytes(b)
}

fn check_index(mode: PagingMode, index: u16) {
    let mut b = PageTableBuilder::new(mode, PhysAddr(0x10_0000));
    let top_shift = mode.top().shift();
    // A kernel page in a slot other than the self-map's.
    let other = 0x100 + (index - 0x100 + 1) % 0x100;
    let kernel = Ip(mode.canonicalize(u64::from(other) << top_shift) + 0x20_3000);
    let user = Ip(0x7ffd_1234_5000);
    let kframe = b.alloc_frame();
    let uframe = b.alloc_frame();
    b.map(kernel, kframe, PageSize::Size4K, RW | XD).unwrap();
    b.map(user, uframe, PageSize::Size4K, RW | US).unwrap();
    b.write(kframe, b"kernel page");
    b.write(uframe, b"user page");
    b.self_map(index, RW | XD);
    let cr3 = b.cr3();
    let config = PagingConfig::with_mode(mode);
    let mem = DumpMemory::new(b.into_memory(), Some(cr3), config);
    let tables = mem.tables(cr3);

    let found = SelfMap::find(&tables).unwrap().unwrap();
    assert_eq!(found.index(), index);
    assert_eq!(SelfMap::find_all(&tables).unwrap(), [found]);
    assert_eq!(found.verify(&tables).unwrap(), tables.root());

    let space = AddressSpace::with_cr3(cr3);
    let top = found.table_base(mode.top()).unwrap();
    assert!(mode.is_canonical(top.0));
    // The self-map entry read through its own virtual address holds CR3.
    let self_entry = read_u64(&mem, space, top.add(u64::from(index) * 8));
    assert_eq!(self_entry & config.frame_mask(), cr3.0);

    // Each entry the walker used, read again at the address the self-map
    // gives it, is the same 64 bits.
    for va in [kernel, user] {
        let t = tables.translate(va).unwrap();
        for step in t.path.steps() {
            let at = found.entry_va(step.level, va).unwrap();
            assert_eq!(
                read_u64(&mem, space, at),
                step.entry.raw(),
                "{} of {va} at {at}",
                step.level
            );
            // And translating that address lands on the entry's physical address.
            let via = tables.translate(at).unwrap();
            assert_eq!(via.pa, step.entry_addr);
            assert_eq!(via.path.steps().next().unwrap().index, index);
            assert!(!via.perms.user, "tables are supervisor-only");
        }
    }
    let mut text = [0u8; 11];
    assert_eq!(mem.read_memory(space, kernel, &mut text), Ok(11));
    assert_eq!(&text, b"kernel page");
    // The page-table region of the user address is the PTE's page.
    let pte_page = found.entry_va(Level::Pt, user).unwrap().0 & !0xfff;
    assert_eq!(
        pte_page & !(found.table_base(Level::Pt).unwrap().0),
        ((user.0 >> 21) << 12) & mode.va_mask()
    );
}

#[test]
fn self_map_at_every_kernel_half_index_4_level() {
    for index in 0x100..=0x1ffu16 {
        check_index(PagingMode::Level4, index);
    }
}

#[test]
fn self_map_at_every_kernel_half_index_5_level() {
    for index in 0x100..=0x1ffu16 {
        check_index(PagingMode::Level5, index);
    }
}

#[test]
fn no_self_map_is_none_and_user_half_index_is_found() {
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    let frame = b.alloc_frame();
    b.map(Ip(0x1000), frame, PageSize::Size4K, 0).unwrap();
    let cr3 = b.cr3();
    let mem = DumpMemory::new(b.memory().clone(), Some(cr3), PagingConfig::default());
    assert_eq!(SelfMap::find(&mem.tables(cr3)).unwrap(), None);
    b.self_map(0x42, RW);
    let mem = DumpMemory::new(b.into_memory(), Some(cr3), PagingConfig::default());
    let s = SelfMap::find(&mem.tables(cr3)).unwrap().unwrap();
    assert_eq!(s.index(), 0x42);
    assert_eq!(s.table_base(Level::Pml4), Some(Ip(0x2110_8844_2000)));
}
