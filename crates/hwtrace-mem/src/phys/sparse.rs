//! Physical memory held in memory, 4 KiB page by page: for tests, and for
//! building page tables and dumps programmatically.

use hwtrace_types::{MemoryError, PhysAddr, PhysMemory};
use std::collections::BTreeMap;

const PAGE: u64 = 4096;

/// Sparse physical memory: pages that were never written are absent, and
/// reading them fails with [`MemoryError::NoPhysical`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SparseMemory {
    pages: BTreeMap<u64, Box<[u8; 4096]>>,
}

impl SparseMemory {
    /// Empty memory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the page holding `addr` present (zero-filled) if it is not.
    pub fn add_page(&mut self, addr: PhysAddr) {
        self.pages
            .entry(addr.0 / PAGE)
            .or_insert_with(|| Box::new([0; 4096]));
    }

    /// Writes `data` at `addr`, creating the pages it touches. Addresses
    /// past 2^64 are dropped.
    pub fn write(&mut self, addr: PhysAddr, data: &[u8]) {
        let mut at = addr.0;
        let mut rest = data;
        while !rest.is_empty() {
            let page = self
                .pages
                .entry(at / PAGE)
                .or_insert_with(|| Box::new([0; 4096]));
            let off = (at % PAGE) as usize;
            let n = rest.len().min(4096 - off);
            page[off..off + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            match at.checked_add(n as u64) {
                Some(next) => at = next,
                None => break,
            }
        }
    }

    /// Writes one little-endian 64-bit value.
    pub fn write_u64(&mut self, addr: PhysAddr, value: u64) {
        self.write(addr, &value.to_le_bytes());
    }

    /// The present pages, as (physical base, bytes), in address order.
    pub fn pages(&self) -> impl Iterator<Item = (PhysAddr, &[u8; 4096])> {
        self.pages.iter().map(|(n, p)| (PhysAddr(n * PAGE), &**p))
    }

    /// The present memory as contiguous runs of (physical base, bytes):
    /// what a sparse raw dump or an ELF core's PT_LOAD segments hold.
    pub fn runs(&self) -> Vec<(PhysAddr, Vec<u8>)> {
        let mut runs: Vec<(PhysAddr, Vec<u8>)> = Vec::new();
        for (base, bytes) in self.pages() {
            match runs.last_mut() {
                Some((start, run)) if start.0 + run.len() as u64 == base.0 => {
                    run.extend_from_slice(bytes)
                }
                _ => runs.push((base, bytes.to_vec())),
            }
        }
        runs
    }
}

impl PhysMemory for SparseMemory {
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        let mut at = addr.0;
        let mut done = 0;
        while done < buf.len() {
            let page = self
                .pages
                .get(&(at / PAGE))
                .ok_or(MemoryError::NoPhysical { addr: PhysAddr(at) })?;
            let off = (at % PAGE) as usize;
            let n = (buf.len() - done).min(4096 - off);
            buf[done..done + n].copy_from_slice(&page[off..off + n]);
            done += n;
            at = match at.checked_add(n as u64) {
                Some(next) => next,
                None if done == buf.len() => break,
                None => {
                    return Err(MemoryError::NoPhysical {
                        addr: PhysAddr(u64::MAX),
                    });
                }
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_pages_and_names_the_hole() {
        let mut m = SparseMemory::new();
        m.write(PhysAddr(0x1ffc), &[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut b = [0u8; 8];
        m.read_phys(PhysAddr(0x1ffc), &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        let mut c = [0u8; 8];
        assert_eq!(
            m.read_phys(PhysAddr(0x2ffc), &mut c),
            Err(MemoryError::NoPhysical {
                addr: PhysAddr(0x3000)
            })
        );
        assert_eq!(m.runs().len(), 1);
        assert_eq!(m.runs()[0].0, PhysAddr(0x1000));
        assert_eq!(m.runs()[0].1.len(), 0x2000);
    }

    #[test]
    fn top_of_the_address_space_does_not_overflow() {
        let mut m = SparseMemory::new();
        m.write(PhysAddr(u64::MAX - 3), &[9; 8]);
        let mut b = [0u8; 8];
        assert!(m.read_phys(PhysAddr(u64::MAX - 3), &mut b).is_err());
        let mut four = [0u8; 4];
        m.read_phys(PhysAddr(u64::MAX - 3), &mut four).unwrap();
        assert_eq!(four, [9; 4]);
    }
}
