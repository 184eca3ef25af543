//! Virtual reads over a physical dump: one address space per CR3, reads
//! across pages, and errors naming the address.

use hwtrace_mem::paging::{PageSize, PageTableBuilder, PagingConfig, PagingMode};
use hwtrace_mem::phys::SparseMemory;
use hwtrace_mem::virt::DumpMemory;
use hwtrace_types::{AddressSpace, Cr3, Ip, MemoryError, PhysAddr, PhysMemory, ReadMemory};

/// Two processes sharing a kernel page, each with its own code at the same
/// user address: the situation PIP packets switch between.
fn two_processes() -> (SparseMemory, Cr3, Cr3) {
    let mut a = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x10_0000));
    let kernel = PhysAddr(0x80_0000);
    a.map(Ip(0xffff_ffff_8100_0000), kernel, PageSize::Size2M, 0)
        .unwrap();
    a.map(Ip(0x40_0000), PhysAddr(0x5000), PageSize::Size4K, 0)
        .unwrap();
    a.map(Ip(0x40_1000), PhysAddr(0x3000), PageSize::Size4K, 0)
        .unwrap();
    a.write(PhysAddr(0x5ffc), b"AAAA");
    a.write(PhysAddr(0x3000), b"aaaa");
    a.write(PhysAddr(0x80_0000 + 0x1234), b"kernel");
    // Process B's tables live in their own frames, above A's.
    let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x20_0000));
    b.map(Ip(0xffff_ffff_8100_0000), kernel, PageSize::Size2M, 0)
        .unwrap();
    b.map(Ip(0x40_0000), PhysAddr(0x7000), PageSize::Size4K, 0)
        .unwrap();
    b.write(PhysAddr(0x7ffc), b"BBBB");
    let mut mem = a.memory().clone();
    for (base, page) in b.memory().pages() {
        mem.write(base, page);
    }
    (mem, a.cr3(), b.cr3())
}

#[test]
fn each_cr3_is_its_own_address_space() {
    let (mem, cr3_a, cr3_b) = two_processes();
    let dm = DumpMemory::new(mem, Some(cr3_a), PagingConfig::default());
    let mut buf = [0u8; 8];
    // Alternate to make the translation cache hold both.
    for _ in 0..3 {
        assert_eq!(
            dm.read_memory(AddressSpace::with_cr3(cr3_a), Ip(0x40_0ffc), &mut buf),
            Ok(8)
        );
        assert_eq!(&buf, b"AAAAaaaa");
        let mut four = [0u8; 4];
        assert_eq!(
            dm.read_memory(AddressSpace::with_cr3(cr3_b), Ip(0x40_0ffc), &mut four),
            Ok(4)
        );
        assert_eq!(&four, b"BBBB");
        // B has nothing at 0x401000: a read across stops at the page end.
        assert_eq!(
            dm.read_memory(AddressSpace::with_cr3(cr3_b), Ip(0x40_0ffc), &mut buf),
            Ok(4)
        );
    }
    // The shared kernel page reads the same in both, and in the default.
    for space in [
        AddressSpace::with_cr3(cr3_a),
        AddressSpace::with_cr3(cr3_b),
        AddressSpace::UNKNOWN,
    ] {
        let mut k = [0u8; 6];
        assert_eq!(
            dm.read_memory(space, Ip(0xffff_ffff_8100_1234), &mut k),
            Ok(6)
        );
        assert_eq!(&k, b"kernel");
    }
}

#[test]
fn misses_name_the_address() {
    let (mem, cr3_a, cr3_b) = two_processes();
    let dm = DumpMemory::new(&mem, None, PagingConfig::default());
    let mut b = [0u8; 4];
    let va = Ip(0x40_1000);
    assert_eq!(
        dm.read_memory(AddressSpace::with_cr3(cr3_b), va, &mut b),
        Err(MemoryError::Unmapped { addr: va })
    );
    // No CR3 in the read and no default: nothing is mapped.
    assert_eq!(
        dm.read_memory(AddressSpace::UNKNOWN, va, &mut b),
        Err(MemoryError::Unmapped { addr: va })
    );
    // A page that translates to physical memory outside the dump.
    let mut tables = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    tables
        .map(Ip(0x9000), PhysAddr(0xdead_0000), PageSize::Size4K, 0)
        .unwrap();
    let far = DumpMemory::new(tables.into_memory(), None, PagingConfig::default());
    assert_eq!(
        far.read_memory(AddressSpace::with_cr3(Cr3(0x1000)), Ip(0x9010), &mut b),
        Err(MemoryError::NoPhysical {
            addr: PhysAddr(0xdead_0010)
        })
    );
    let path = dm
        .translate(AddressSpace::with_cr3(cr3_a), va)
        .unwrap()
        .unwrap();
    assert_eq!(path.pa, PhysAddr(0x3000));
}

/// Memory the test can change behind the reader's back.
struct Shared(std::cell::RefCell<SparseMemory>);

impl PhysMemory for Shared {
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.0.borrow().read_phys(addr, buf)
    }
}

#[test]
fn flush_forgets_stale_translations() {
    let mut t = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x1000));
    t.map(Ip(0x40_0000), PhysAddr(0x5000), PageSize::Size4K, 0)
        .unwrap();
    t.write(PhysAddr(0x5000), b"old!");
    t.write(PhysAddr(0x6000), b"new!");
    let cr3 = t.cr3();
    let pte = hwtrace_mem::paging::PageTables::new(t.memory(), cr3, PagingConfig::default())
        .translate(Ip(0x40_0000))
        .unwrap()
        .path
        .leaf()
        .unwrap()
        .entry_addr;
    let dm = DumpMemory::new(
        Shared(t.into_memory().into()),
        Some(cr3),
        PagingConfig::default(),
    );
    let mut b = [0u8; 4];
    dm.read_memory(AddressSpace::UNKNOWN, Ip(0x40_0000), &mut b)
        .unwrap();
    assert_eq!(&b, b"old!");
    // Remap the page: the cached translation is stale until a flush, as a
    // TLB would be without INVLPG.
    dm.memory().0.borrow_mut().write_u64(pte, 0x6000 | 1);
    dm.read_memory(AddressSpace::UNKNOWN, Ip(0x40_0000), &mut b)
        .unwrap();
    assert_eq!(&b, b"old!");
    dm.flush();
    dm.read_memory(AddressSpace::UNKNOWN, Ip(0x40_0000), &mut b)
        .unwrap();
    assert_eq!(&b, b"new!");
}
