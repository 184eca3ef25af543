//! Where the next trace byte goes: the arithmetic of IA32_RTIT_OUTPUT_BASE
//! and IA32_RTIT_OUTPUT_MASK_PTRS for single-range and ToPA output
//! (SDM Vol. 3C §33.2.7.1 “Single Range Output” and §33.2.7.2 “ToPA”).
//!
//! MASK_PTRS has three fields: LowerMask (6:0, forced to 1s),
//! MaskOrTableOffset (31:7) and OutputOffset (63:32). In single-range mode
//! bits 31:0 are the region mask and OutputOffset the offset into the region.
//! In ToPA mode MaskOrTableOffset is the current entry index (the table byte
//! offset is the index × 8, up to a 256 MiB table) and OutputOffset the offset
//! into that entry's region.

use crate::rtit::{RtitOutputBase, RtitOutputMaskPtrs};
use crate::topa::TopaEntry;
use hwtrace_types::PhysAddr;

/// Why an output configuration is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// Single-range mask whose 1s are not contiguous from bit 0.
    #[error(
        "single-range mask {mask:#x} is not of the form 2^n - 1: the 1s in MASK_PTRS[31:0] must be \
         contiguous from bit 0, or the region is not contiguous and enabling trace signals an \
         operational error"
    )]
    MaskNotContiguous {
        /// `MASK_PTRS[31:0]` with LowerMask forced to 7FH.
        mask: u32,
    },
    /// Single-range base with 1s where the mask has 1s.
    #[error(
        "single-range base {base} is not aligned to the region size of {size} bytes \
         (base and mask overlap: operational error on enable)"
    )]
    BaseNotAligned {
        /// The base.
        base: PhysAddr,
        /// The region size.
        size: u64,
    },
    /// OutputOffset outside the single range.
    #[error(
        "OutputOffset {offset:#x} is beyond the single-range mask {mask:#x} (operational error on enable)"
    )]
    OffsetBeyondMask {
        /// The offset.
        offset: u64,
        /// The mask.
        mask: u64,
    },
    /// A single-range size that cannot be expressed by the mask.
    #[error("single-range size {bytes:#x} must be a power of two from 128 bytes to 4 GiB")]
    BadRegionSize {
        /// The size asked for.
        bytes: u64,
    },
    /// ToPA table base with bits 11:7 set.
    #[error(
        "ToPA table base {base} is not 4 KiB aligned (bits 11:7 set: operational error on enable)"
    )]
    TopaBaseMisaligned {
        /// The base.
        base: PhysAddr,
    },
    /// OutputOffset not inside the current ToPA region.
    #[error(
        "OutputOffset {offset:#x} is not below the current ToPA region size {size:#x} (operational error)"
    )]
    OffsetBeyondRegion {
        /// The offset.
        offset: u64,
        /// The region size.
        size: u64,
    },
    /// The current ToPA entry is an END entry (the processor never rests on one).
    #[error("the current ToPA entry is an END entry, not an output region")]
    PositionOnEnd,
    /// An entry index that does not fit MaskOrTableOffset (25 bits).
    #[error("ToPA entry index {index} does not fit the 25-bit MaskOrTableOffset field")]
    EntryIndexTooLarge {
        /// The index.
        index: u64,
    },
}

/// A single-range output position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SingleRange {
    base: PhysAddr,
    mask: u64,
    offset: u64,
}

impl SingleRange {
    /// A region of `size` bytes at `base`, writing from offset 0.
    pub fn new(base: PhysAddr, size: u64) -> Result<Self, OutputError> {
        if !size.is_power_of_two() || !(128..=1 << 32).contains(&size) {
            return Err(OutputError::BadRegionSize { bytes: size });
        }
        let mask = size - 1;
        if base.0 & mask != 0 {
            return Err(OutputError::BaseNotAligned { base, size });
        }
        Ok(Self {
            base,
            mask,
            offset: 0,
        })
    }

    /// Reads the position from the two MSRs, refusing what the processor
    /// would refuse when TraceEn is set.
    pub fn from_msrs(base: RtitOutputBase, ptrs: RtitOutputMaskPtrs) -> Result<Self, OutputError> {
        let mask = (ptrs.raw() & 0xFFFF_FFFF) | 0x7F;
        if mask & (mask + 1) != 0 {
            return Err(OutputError::MaskNotContiguous { mask: mask as u32 });
        }
        let base = PhysAddr(base.base_phys_addr());
        if base.0 & mask != 0 {
            return Err(OutputError::BaseNotAligned {
                base,
                size: mask + 1,
            });
        }
        let offset = ptrs.output_offset();
        if offset > mask {
            return Err(OutputError::OffsetBeyondMask { offset, mask });
        }
        Ok(Self { base, mask, offset })
    }

    /// The region base.
    pub const fn base(&self) -> PhysAddr {
        self.base
    }

    /// The region size in bytes (mask + 1).
    pub const fn size(&self) -> u64 {
        self.mask + 1
    }

    /// The current offset into the region.
    pub const fn offset(&self) -> u64 {
        self.offset
    }

    /// Physical address of the next byte:
    /// `(OutputBase & !OutputMask) + (OutputOffset & OutputMask)`.
    pub const fn write_address(&self) -> PhysAddr {
        PhysAddr((self.base.0 & !self.mask) + (self.offset & self.mask))
    }

    /// The position after `bytes` more bytes of output; the region wraps.
    #[must_use]
    pub const fn advance(self, bytes: u64) -> Self {
        Self {
            offset: self.offset.wrapping_add(bytes) & self.mask,
            ..self
        }
    }

    /// The IA32_RTIT_OUTPUT_BASE value.
    pub const fn output_base(&self) -> RtitOutputBase {
        RtitOutputBase::from_raw(self.base.0)
    }

    /// The IA32_RTIT_OUTPUT_MASK_PTRS value.
    pub const fn mask_ptrs(&self) -> RtitOutputMaskPtrs {
        RtitOutputMaskPtrs::from_raw((self.offset << 32) | self.mask)
    }
}

/// A ToPA output position: current table, entry and offset in its region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopaPosition {
    table: PhysAddr,
    entry: u32,
    offset: u32,
}

impl TopaPosition {
    /// The start of the table at `table`.
    pub fn start(table: PhysAddr) -> Result<Self, OutputError> {
        Self::new(table, 0, 0)
    }

    /// Entry `entry` of the table at `table`, `offset` bytes into its region.
    pub fn new(table: PhysAddr, entry: u64, offset: u32) -> Result<Self, OutputError> {
        if table.0 & 0xFFF != 0 {
            return Err(OutputError::TopaBaseMisaligned { base: table });
        }
        if entry >= 1 << 25 {
            return Err(OutputError::EntryIndexTooLarge { index: entry });
        }
        Ok(Self {
            table,
            entry: entry as u32,
            offset,
        })
    }

    /// Reads the position from the two MSRs.
    pub fn from_msrs(base: RtitOutputBase, ptrs: RtitOutputMaskPtrs) -> Result<Self, OutputError> {
        Self::new(
            PhysAddr(base.base_phys_addr()),
            ptrs.mask_or_table_offset(),
            ptrs.output_offset() as u32,
        )
    }

    /// The current table's base.
    pub const fn table(&self) -> PhysAddr {
        self.table
    }

    /// Index of the current entry.
    pub const fn entry_index(&self) -> u32 {
        self.entry
    }

    /// Offset into the current region.
    pub const fn offset(&self) -> u32 {
        self.offset
    }

    /// Physical address of the current entry: table base + index × 8.
    pub const fn entry_address(&self) -> PhysAddr {
        PhysAddr(self.table.0 + ((self.entry as u64) << 3))
    }

    /// Physical address of the next byte, given the current entry as read
    /// from [`entry_address`](Self::entry_address).
    pub fn write_address(&self, entry: TopaEntry) -> Result<PhysAddr, OutputError> {
        if entry.end() {
            return Err(OutputError::PositionOnEnd);
        }
        let size = entry.size().bytes();
        if u64::from(self.offset) >= size {
            return Err(OutputError::OffsetBeyondRegion {
                offset: u64::from(self.offset),
                size,
            });
        }
        Ok(PhysAddr(entry.base().0 + u64::from(self.offset)))
    }

    /// The IA32_RTIT_OUTPUT_BASE value.
    pub const fn output_base(&self) -> RtitOutputBase {
        RtitOutputBase::from_raw(self.table.0)
    }

    /// The IA32_RTIT_OUTPUT_MASK_PTRS value (LowerMask written as 7FH).
    pub const fn mask_ptrs(&self) -> RtitOutputMaskPtrs {
        RtitOutputMaskPtrs::from_raw(
            ((self.offset as u64) << 32) | ((self.entry as u64) << 7) | 0x7F,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topa::TopaSize;

    /// Seed 000: single-range output with `MASK_PTRS = (1 << PAGE_SHIFT) - 1`,
    /// a 4 KiB region.
    #[test]
    fn seed_000_single_range_4k_mask() {
        let base = RtitOutputBase::from_raw(0x1234_5000);
        let ptrs = RtitOutputMaskPtrs::from_raw((1 << 12) - 1);
        assert_eq!(ptrs.lower_mask(), 0x7F);
        assert_eq!(ptrs.mask_or_table_offset(), 0x1F);
        assert_eq!(ptrs.output_offset(), 0);
        let r = SingleRange::from_msrs(base, ptrs).expect("contiguous 4 KiB mask");
        assert_eq!(r.size(), 4096);
        assert_eq!(r.write_address(), PhysAddr(0x1234_5000));
        let later = r.advance(4096 + 0x10);
        assert_eq!(
            later.write_address(),
            PhysAddr(0x1234_5010),
            "wraps within the page"
        );
        assert_eq!(later.mask_ptrs().raw(), (0x10 << 32) | 0xFFF);
        assert_eq!(SingleRange::new(PhysAddr(0x1234_5000), 4096), Ok(r));
    }

    #[test]
    fn non_contiguous_mask_and_misaligned_base_are_refused() {
        let base = RtitOutputBase::from_raw(0x10_0000);
        assert_eq!(
            SingleRange::from_msrs(base, RtitOutputMaskPtrs::from_raw(0x2FFF)),
            Err(OutputError::MaskNotContiguous { mask: 0x2FFF })
        );
        assert_eq!(
            SingleRange::from_msrs(
                RtitOutputBase::from_raw(0x10_0800),
                RtitOutputMaskPtrs::from_raw(0xFFF)
            ),
            Err(OutputError::BaseNotAligned {
                base: PhysAddr(0x10_0800),
                size: 4096
            })
        );
        assert_eq!(
            SingleRange::from_msrs(base, RtitOutputMaskPtrs::from_raw((0x1000 << 32) | 0xFFF)),
            Err(OutputError::OffsetBeyondMask {
                offset: 0x1000,
                mask: 0xFFF
            })
        );
        assert_eq!(
            SingleRange::new(PhysAddr(0x10_0000), 64),
            Err(OutputError::BadRegionSize { bytes: 64 })
        );
    }

    /// Seed 000's ToPA start: LowerMask 7FH, MaskOrTableOffset 0, OutputOffset 0.
    #[test]
    fn seed_000_topa_position_arithmetic() {
        let start = TopaPosition::start(PhysAddr(0x7_0000)).expect("aligned");
        assert_eq!(start.mask_ptrs().raw(), 0x7F);
        let p = TopaPosition::from_msrs(
            RtitOutputBase::from_raw(0x7_0000),
            RtitOutputMaskPtrs::from_raw((0x123 << 32) | (3 << 7) | 0x7F),
        )
        .expect("aligned table");
        assert_eq!(p.entry_index(), 3);
        assert_eq!(p.entry_address(), PhysAddr(0x7_0018));
        let e = TopaEntry::output(PhysAddr(0x9_F000), TopaSize::SIZE_4K, true, true);
        assert_eq!(p.write_address(e), Ok(PhysAddr(0x9_F123)));
        assert_eq!(
            p.write_address(TopaEntry::end_link(PhysAddr(0x7_0000))),
            Err(OutputError::PositionOnEnd)
        );
        let far = TopaPosition::new(PhysAddr(0x7_0000), 0, 0x2000).expect("valid");
        assert!(matches!(
            far.write_address(e),
            Err(OutputError::OffsetBeyondRegion { .. })
        ));
        assert!(TopaPosition::start(PhysAddr(0x7_0080)).is_err());
    }
}
