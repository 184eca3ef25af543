//! A table of physical regions, each backed by a range of file bytes: the
//! shape shared by sparse raw dumps and ELF core PT_LOAD segments.

use hwtrace_types::{MemoryError, PhysAddr};

/// One run of physical memory stored contiguously in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The physical address of the first byte.
    pub phys: PhysAddr,
    /// Where the first byte is in the file.
    pub file_offset: u64,
    /// How many bytes.
    pub len: u64,
}

impl Region {
    /// One past its last byte ([`RegionMap::new`] refuses regions for
    /// which that would overflow).
    fn phys_end(&self) -> u64 {
        self.phys.0.saturating_add(self.len)
    }
}

/// Why a region table was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// A region runs past the end of the file.
    #[error("region at {} (file offset {:#x}, {:#x} bytes) runs past the end of the file ({file_len:#x} bytes)", region.phys, region.file_offset, region.len)]
    PastEndOfFile {
        /// The region.
        region: Region,
        /// The file's length.
        file_len: u64,
    },
    /// A region runs past the top of the physical address space (no
    /// machine has 2^64 bytes of it: a corrupt header).
    #[error("region at {} ({:#x} bytes) runs past the top of physical memory", region.phys, region.len)]
    PastTopOfMemory {
        /// The region.
        region: Region,
    },
    /// Two regions claim the same physical bytes.
    #[error("regions at {first} and {second} overlap")]
    Overlap {
        /// The lower region's base.
        first: PhysAddr,
        /// The higher region's base.
        second: PhysAddr,
    },
}

/// Regions sorted by physical address, non-overlapping, all inside a file
/// of known length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionMap {
    regions: Vec<Region>,
}

impl RegionMap {
    /// Checks and sorts `regions` for a file of `file_len` bytes. Empty
    /// regions are dropped.
    pub fn new(mut regions: Vec<Region>, file_len: u64) -> Result<Self, RegionError> {
        regions.retain(|r| r.len != 0);
        for r in &regions {
            if r.phys.0.checked_add(r.len).is_none() {
                return Err(RegionError::PastTopOfMemory { region: *r });
            }
            if r.file_offset
                .checked_add(r.len)
                .is_none_or(|end| end > file_len)
            {
                return Err(RegionError::PastEndOfFile {
                    region: *r,
                    file_len,
                });
            }
        }
        regions.sort_by_key(|r| r.phys);
        for pair in regions.windows(2) {
            if pair[0].phys_end() > pair[1].phys.0 {
                return Err(RegionError::Overlap {
                    first: pair[0].phys,
                    second: pair[1].phys,
                });
            }
        }
        Ok(Self { regions })
    }

    /// The regions, in physical-address order.
    pub fn regions(&self) -> &[Region] {
        &self.regions
    }

    /// The region holding `addr`.
    pub fn find(&self, addr: u64) -> Option<&Region> {
        let i = self.regions.partition_point(|r| r.phys.0 <= addr);
        let r = self.regions.get(i.checked_sub(1)?)?;
        (addr < r.phys_end()).then_some(r)
    }

    /// Copies `buf.len()` bytes at physical `addr` out of `file`, which
    /// must be the file the map was checked against.
    pub fn read(&self, file: &[u8], addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        let mut at = addr.0;
        let mut done = 0;
        while done < buf.len() {
            let missing = MemoryError::NoPhysical { addr: PhysAddr(at) };
            let r = self.find(at).ok_or(missing)?;
            let within = at - r.phys.0;
            let n = ((r.len - within) as usize).min(buf.len() - done);
            let start = usize::try_from(r.file_offset + within).map_err(|_| missing)?;
            let src = file.get(start..start + n).ok_or(missing)?;
            buf[done..done + n].copy_from_slice(src);
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

    fn region(phys: u64, file_offset: u64, len: u64) -> Region {
        Region {
            phys: PhysAddr(phys),
            file_offset,
            len,
        }
    }

    #[test]
    fn reads_span_adjacent_regions_and_stop_at_holes() {
        let file: Vec<u8> = (0..=255u8).collect();
        let map = RegionMap::new(
            vec![
                region(0x1010, 0x10, 0x10),
                region(0x1000, 0x80, 0x10),
                region(0x3000, 0, 4),
            ],
            256,
        )
        .unwrap();
        let mut b = [0u8; 4];
        map.read(&file, PhysAddr(0x100e), &mut b).unwrap();
        assert_eq!(b, [0x8e, 0x8f, 0x10, 0x11]);
        assert_eq!(
            map.read(&file, PhysAddr(0x101e), &mut b),
            Err(MemoryError::NoPhysical {
                addr: PhysAddr(0x1020)
            })
        );
        assert_eq!(
            map.read(&file, PhysAddr(0x0fff), &mut b),
            Err(MemoryError::NoPhysical {
                addr: PhysAddr(0x0fff)
            })
        );
    }

    #[test]
    fn refuses_overlaps_and_regions_past_the_file() {
        assert_eq!(
            RegionMap::new(vec![region(0, 0, 0x20), region(0x10, 0, 0x10)], 0x100),
            Err(RegionError::Overlap {
                first: PhysAddr(0),
                second: PhysAddr(0x10)
            })
        );
        assert!(matches!(
            RegionMap::new(vec![region(0, 0xf0, 0x20)], 0x100),
            Err(RegionError::PastEndOfFile { .. })
        ));
        assert!(matches!(
            RegionMap::new(vec![region(0, u64::MAX, 2)], 0x100),
            Err(RegionError::PastEndOfFile { .. })
        ));
        // Ending where its end is still a number is fine; a byte further
        // wraps past the top of the address space.
        assert!(RegionMap::new(vec![region(u64::MAX - 0x100, 0, 0x100)], 0x100).is_ok());
        assert!(matches!(
            RegionMap::new(vec![region(u64::MAX - 0xff, 0, 0x100)], 0x100),
            Err(RegionError::PastTopOfMemory { .. })
        ));
    }
}
