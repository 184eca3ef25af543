//! What a walk needs to know about the processor besides the tables.

use super::PagingMode;
use hwtrace_types::{Cr3, PhysAddr};

/// The processor state that decides how entries are read: the paging mode
/// (CR4.LA57), MAXPHYADDR (`CPUID.80000008H:EAX[7:0]`) and IA32_EFER.NXE.
///
/// SDM vol. 3A, §4.5: bits from MAXPHYADDR to 51 of every entry are
/// reserved, and bit 63 (XD) is reserved when IA32_EFER.NXE = 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagingConfig {
    /// 4-level or 5-level paging.
    pub mode: PagingMode,
    /// The physical-address width, 36 to 52.
    pub max_phys_addr: u8,
    /// IA32_EFER.NXE: whether bit 63 means execute-disable (else reserved).
    pub nxe: bool,
}

impl Default for PagingConfig {
    fn default() -> Self {
        Self {
            mode: PagingMode::Level4,
            max_phys_addr: 52,
            nxe: true,
        }
    }
}

impl PagingConfig {
    /// The default configuration in `mode`.
    pub fn with_mode(mode: PagingMode) -> Self {
        Self {
            mode,
            ..Self::default()
        }
    }

    /// MAXPHYADDR clamped to what the architecture allows (12..=52), so a
    /// nonsensical value from a user cannot make masks overflow.
    pub fn phys_bits(&self) -> u32 {
        u32::from(self.max_phys_addr).clamp(12, 52)
    }

    /// Bits 51:MAXPHYADDR: set in an entry, they are reserved.
    pub fn reserved_phys_mask(&self) -> u64 {
        ((1u64 << 52) - 1) & !((1u64 << self.phys_bits()) - 1)
    }

    /// Bits (MAXPHYADDR-1):12: the frame bits of a 4 KiB-aligned address.
    pub fn frame_mask(&self) -> u64 {
        ((1u64 << self.phys_bits()) - 1) & !0xfff
    }

    /// The physical address of the top-level table CR3 names (SDM vol. 3A,
    /// Table 4-12: CR3 bits (MAXPHYADDR-1):12; the low 12 bits are flags or
    /// a PCID and bits 63:MAXPHYADDR are ignored here).
    pub fn root_table(&self, cr3: Cr3) -> PhysAddr {
        PhysAddr(cr3.0 & self.frame_mask())
    }
}
