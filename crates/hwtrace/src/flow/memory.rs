//! [`FlowMemory`]: where `hwtrace flow` reads the traced code.

use hwtrace_mem::image::Image;
use hwtrace_mem::phys::Dump;
use hwtrace_mem::virt::DumpMemory;
use hwtrace_types::{AddressSpace, Ip, MemoryError, PhysMemory, ReadMemory};

/// Code images (per CR3, from `--image`/`--elf`/`--pe`/`--pages`) in front
/// of a physical memory dump read through page tables (`--dump`).
///
/// Every read names the address space the decoder is in: the CR3 the last
/// PIP packet reported. Images loaded for that CR3 (or for every CR3) are
/// tried first; the dump then translates the address through that CR3's
/// page tables (or the default CR3's, before any PIP), so a trace that
/// switches processes reads each one's code.
#[derive(Debug)]
pub struct FlowMemory<P = Dump> {
    image: Option<Image>,
    dump: Option<DumpMemory<P>>,
}

impl<P: PhysMemory> FlowMemory<P> {
    /// Reads from `image`, then from `dump`.
    pub fn new(image: Option<Image>, dump: Option<DumpMemory<P>>) -> Self {
        Self { image, dump }
    }
}

impl<P: PhysMemory> ReadMemory for FlowMemory<P> {
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let from_image = self.image.as_ref().map(|i| i.read_memory(space, addr, buf));
        match (from_image, &self.dump) {
            (Some(Ok(n)), _) => Ok(n),
            (_, Some(dump)) => dump.read_memory(space, addr, buf),
            (Some(Err(e)), None) => Err(e),
            (None, None) => Err(MemoryError::Unmapped { addr }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_mem::paging::{PageSize, PageTableBuilder, PagingConfig, PagingMode};
    use hwtrace_mem::phys::SparseMemory;
    use hwtrace_types::{Cr3, PhysAddr};

    #[test]
    fn reads_follow_the_cr3_of_the_space() {
        let mut a = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x10_0000));
        a.map(Ip(0x40_0000), PhysAddr(0x5000), PageSize::Size4K, 0)
            .unwrap();
        a.write(PhysAddr(0x5000), b"A");
        let mut b = PageTableBuilder::new(PagingMode::Level4, PhysAddr(0x20_0000));
        b.map(Ip(0x40_0000), PhysAddr(0x7000), PageSize::Size4K, 0)
            .unwrap();
        b.write(PhysAddr(0x7000), b"B");
        let mut mem: SparseMemory = a.memory().clone();
        for (base, page) in b.memory().pages() {
            mem.write(base, page);
        }
        let (cr3_a, cr3_b) = (a.cr3(), b.cr3());
        let dump = DumpMemory::new(mem, Some(cr3_a), PagingConfig::default());
        let flow = FlowMemory::new(None, Some(dump));
        let mut byte = [0u8; 1];
        for (space, want) in [
            (AddressSpace::UNKNOWN, b"A"),
            (AddressSpace::with_cr3(cr3_a), b"A"),
            (AddressSpace::with_cr3(cr3_b), b"B"),
        ] {
            assert_eq!(flow.read_memory(space, Ip(0x40_0000), &mut byte), Ok(1));
            assert_eq!(&byte, want);
        }
        let miss = Ip(0x50_0000);
        assert_eq!(
            flow.read_memory(AddressSpace::with_cr3(Cr3(cr3_b.0)), miss, &mut byte),
            Err(MemoryError::Unmapped { addr: miss })
        );
        let none: FlowMemory<SparseMemory> = FlowMemory::new(None, None);
        assert_eq!(
            none.read_memory(AddressSpace::UNKNOWN, miss, &mut byte),
            Err(MemoryError::Unmapped { addr: miss })
        );
    }
}
