//! Virtual memory of a physical dump: reads translated through the page
//! tables of the CR3 each read names, with a small translation cache.
//!
//! This is what lets the flow decoder read kernel (or process) code
//! straight from a dump: PIP packets give the CR3 (SDM vol. 3C, §32.4.2.12
//! "Paging Information (PIP) Packet"), the decoder passes it in the
//! [`AddressSpace`], and every CR3 is its own address space.

use crate::paging::{PageTables, PagingConfig, Translation, WalkError};
use hwtrace_types::{AddressSpace, Cr3, Ip, MemoryError, PhysAddr, PhysMemory, ReadMemory};
use std::sync::Mutex;

/// Translation-cache slots (direct-mapped by page number).
const TLB_SLOTS: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TlbEntry {
    root: u64,
    vpn: u64,
    frame: u64,
}

/// Virtual reads over physical memory and page tables.
#[derive(Debug)]
pub struct DumpMemory<M> {
    mem: M,
    default_cr3: Option<Cr3>,
    config: PagingConfig,
    tlb: Mutex<Vec<Option<TlbEntry>>>,
}

impl<M: PhysMemory> DumpMemory<M> {
    /// Reads of `mem` translated under `config`; reads whose address space
    /// names no CR3 use `default_cr3` (or fail if it is `None`).
    pub fn new(mem: M, default_cr3: Option<Cr3>, config: PagingConfig) -> Self {
        Self {
            mem,
            default_cr3,
            config,
            tlb: Mutex::new(vec![None; TLB_SLOTS]),
        }
    }

    /// The physical memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// The page tables of `cr3`.
    pub fn tables(&self, cr3: Cr3) -> PageTables<&M> {
        PageTables::new(&self.mem, cr3, self.config)
    }

    /// The CR3 a read in `space` uses.
    pub fn cr3_for(&self, space: AddressSpace) -> Option<Cr3> {
        space.cr3.or(self.default_cr3)
    }

    /// Translates `va` in `space` with the full path (uncached).
    pub fn translate(&self, space: AddressSpace, va: Ip) -> Option<Result<Translation, WalkError>> {
        let cr3 = self.cr3_for(space)?;
        Some(self.tables(cr3).translate(va))
    }

    /// Forgets every cached translation (after the tables changed).
    pub fn flush(&self) {
        let mut tlb = self.tlb.lock().unwrap_or_else(|e| e.into_inner());
        tlb.iter_mut().for_each(|e| *e = None);
    }

    /// The physical address of the 4 KiB page holding `va`.
    fn page_frame(&self, cr3: Cr3, va: u64) -> Option<u64> {
        let root = self.config.root_table(cr3).0;
        let vpn = va >> 12;
        let slot = (vpn as usize) % TLB_SLOTS;
        let mut tlb = self.tlb.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(e)) = tlb.get(slot)
            && e.root == root
            && e.vpn == vpn
        {
            return Some(e.frame);
        }
        let t = self.tables(cr3).translate(Ip(va & !0xfff)).ok()?;
        if let Some(e) = tlb.get_mut(slot) {
            *e = Some(TlbEntry {
                root,
                vpn,
                frame: t.pa.0,
            });
        }
        Some(t.pa.0)
    }
}

impl<M: PhysMemory> ReadMemory for DumpMemory<M> {
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let cr3 = self.cr3_for(space).ok_or(MemoryError::Unmapped { addr })?;
        let mut done = 0;
        while done < buf.len() {
            let va = addr.0.wrapping_add(done as u64);
            let Some(frame) = self.page_frame(cr3, va) else {
                return if done == 0 {
                    Err(MemoryError::Unmapped { addr })
                } else {
                    Ok(done)
                };
            };
            let in_page = (va & 0xfff) as usize;
            let n = (4096 - in_page).min(buf.len() - done);
            let pa = PhysAddr(frame | in_page as u64);
            if let Err(e) = self.mem.read_phys(pa, &mut buf[done..done + n]) {
                return if done == 0 { Err(e) } else { Ok(done) };
            }
            done += n;
        }
        Ok(done)
    }
}
