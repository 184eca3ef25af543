//! How decoders read memory without knowing where it comes from.

use crate::{Cr3, Ip, PhysAddr};
use core::fmt;

/// Which address space a virtual read goes to.
///
/// Intel PT reports CR3 changes with PIP packets and VMCS changes with VMCS
/// packets; a memory source may keep one image per CR3 (a process, or the
/// user half of one) and fall back to a shared one (the kernel) when the
/// address space is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AddressSpace {
    /// The CR3 the code ran under, if the trace has told us.
    pub cr3: Option<Cr3>,
    /// The VMCS base address, if the trace has told us (virtualised guests).
    pub vmcs: Option<u64>,
}

impl AddressSpace {
    /// An address space of which nothing is known: images loaded without
    /// a CR3 serve it.
    pub const UNKNOWN: Self = Self {
        cr3: None,
        vmcs: None,
    };

    /// The address space of the given CR3.
    pub const fn with_cr3(cr3: Cr3) -> Self {
        Self {
            cr3: Some(cr3),
            vmcs: None,
        }
    }
}

/// Why a read of memory failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryError {
    /// Nothing is mapped at this virtual address.
    Unmapped {
        /// The first address that could not be read.
        addr: Ip,
    },
    /// Nothing is known at this physical address (outside the dump, or a
    /// hole in a sparse dump).
    NoPhysical {
        /// The first physical address that could not be read.
        addr: PhysAddr,
    },
    /// The backing store failed (an I/O error of a file, say).
    Backing {
        /// The address whose read failed.
        addr: Ip,
    },
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unmapped { addr } => write!(f, "no memory mapped at {addr}"),
            Self::NoPhysical { addr } => write!(f, "no physical memory at {addr}"),
            Self::Backing { addr } => write!(f, "backing store failed reading {addr}"),
        }
    }
}

impl core::error::Error for MemoryError {}

/// Virtual memory as the traced code saw it.
///
/// The flow decoder reads instruction bytes only through this trait, so it
/// works the same over ELF images, raw dumps, page caches, or a physical
/// memory dump walked through page tables.
pub trait ReadMemory {
    /// Reads up to `buf.len()` bytes at `addr` in `space` and returns how
    /// many were read: fewer than asked when the mapping ends early, and an
    /// error when not even the first byte is mapped.
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError>;
}

impl<T: ReadMemory + ?Sized> ReadMemory for &T {
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        (**self).read_memory(space, addr, buf)
    }
}

/// Bytes at one address, the same in every address space: the smallest
/// code image there is — a raw blob at its load address, or a test's few
/// hand-assembled instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BytesAt<'a> {
    /// The address of the first byte.
    pub base: Ip,
    /// The bytes.
    pub bytes: &'a [u8],
}

impl<'a> BytesAt<'a> {
    /// `bytes` at `base`.
    pub const fn new(base: Ip, bytes: &'a [u8]) -> Self {
        Self { base, bytes }
    }
}

impl ReadMemory for BytesAt<'_> {
    fn read_memory(&self, _: AddressSpace, addr: Ip, buf: &mut [u8]) -> Result<usize, MemoryError> {
        let rest = usize::try_from(addr.0.wrapping_sub(self.base.0))
            .ok()
            .and_then(|at| self.bytes.get(at..))
            .filter(|rest| !rest.is_empty())
            .ok_or(MemoryError::Unmapped { addr })?;
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
}

/// Physical memory, as a dump of a machine or a guest holds it.
pub trait PhysMemory {
    /// Reads exactly `buf.len()` bytes at `addr`, or fails naming the first
    /// byte that is not present.
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError>;

    /// Reads one little-endian 64-bit value (a page-table entry, say).
    fn read_phys_u64(&self, addr: PhysAddr) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read_phys(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

impl<T: PhysMemory + ?Sized> PhysMemory for &T {
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        (**self).read_phys(addr, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_at_reads_its_bytes_and_nothing_else() {
        let mem = BytesAt::new(Ip(0x1000), &[1, 2, 3]);
        let mut buf = [0u8; 8];
        assert_eq!(
            mem.read_memory(AddressSpace::UNKNOWN, Ip(0x1001), &mut buf),
            Ok(2)
        );
        assert_eq!(buf[..2], [2, 3]);
        let mut one = [0u8; 1];
        assert_eq!(
            mem.read_memory(AddressSpace::UNKNOWN, Ip(0x1000), &mut one),
            Ok(1)
        );
        assert_eq!(one, [1]);
        for addr in [0x1003, 0xfff, 0, u64::MAX] {
            assert_eq!(
                mem.read_memory(AddressSpace::UNKNOWN, Ip(addr), &mut buf),
                Err(MemoryError::Unmapped { addr: Ip(addr) })
            );
        }
    }
}
