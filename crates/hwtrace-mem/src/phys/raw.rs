//! Raw physical memory dumps: the bytes of physical memory as a file,
//! whole from a base address or as sparse regions.

use super::{Region, RegionError, RegionMap};
use crate::backing::Backing;
use hwtrace_types::{MemoryError, PhysAddr, PhysMemory};
use std::io;
use std::path::Path;

/// A raw dump, memory-mapped.
#[derive(Debug)]
pub struct RawDump {
    bytes: Backing,
    regions: RegionMap,
}

impl RawDump {
    /// The whole file at `path` is physical memory from `base` on.
    pub fn open(path: &Path, base: PhysAddr) -> io::Result<Self> {
        let bytes = Backing::map(path)?;
        let len = bytes.bytes().len() as u64;
        let whole = Region {
            phys: base,
            file_offset: 0,
            len,
        };
        Self::with_regions(bytes, vec![whole])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The file at `path` holds the given regions (physical base, file
    /// offset, length); everything else is a hole.
    pub fn open_sparse(path: &Path, regions: Vec<Region>) -> io::Result<Self> {
        let bytes = Backing::map(path)?;
        Self::with_regions(bytes, regions)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// A dump of bytes already in memory.
    pub fn from_bytes(bytes: Vec<u8>, regions: Vec<Region>) -> Result<Self, RegionError> {
        Self::with_regions(Backing::Owned(bytes), regions)
    }

    fn with_regions(bytes: Backing, regions: Vec<Region>) -> Result<Self, RegionError> {
        let regions = RegionMap::new(regions, bytes.bytes().len() as u64)?;
        Ok(Self { bytes, regions })
    }

    /// The regions of physical memory the dump holds.
    pub fn regions(&self) -> &[Region] {
        self.regions.regions()
    }
}

impl PhysMemory for RawDump {
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.regions.read(self.bytes.bytes(), addr, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_at_a_base_reads_back() {
        let dir = std::env::temp_dir().join(format!("hwtrace-mem-raw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ram.bin");
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let dump = RawDump::open(&path, PhysAddr(0x10_0000)).unwrap();
        let mut b = [0u8; 4];
        dump.read_phys(PhysAddr(0x10_0ffe), &mut b).unwrap();
        assert_eq!(b, [data[0xffe], data[0xfff], data[0x1000], data[0x1001]]);
        assert_eq!(
            dump.read_phys(PhysAddr(0xf_ffff), &mut b),
            Err(MemoryError::NoPhysical {
                addr: PhysAddr(0xf_ffff)
            })
        );
        let sparse = RawDump::open_sparse(
            &path,
            vec![Region {
                phys: PhysAddr(0),
                file_offset: 0x1000,
                len: 0x1000,
            }],
        )
        .unwrap();
        assert_eq!(
            sparse.read_phys_u64(PhysAddr(0)).unwrap(),
            u64::from_le_bytes(data[0x1000..0x1008].try_into().unwrap())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
