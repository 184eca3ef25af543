//! The CPU state QEMU's `dump-guest-memory` stores in ELF notes named
//! "QEMU": general registers, segments and control registers per vCPU.
//!
//! The layout is QEMU's `QEMUCPUState` for x86-64 (target/i386/arch_dump.c):
//! `u32 version, u32 size`, 18 general registers (rax..r15, rip, rflags),
//! ten 24-byte segment descriptors (cs, ds, es, fs, gs, ss, ldt, tr, gdt,
//! idt), `cr[5]`, then optional fields (kernel_gs_base) that `size` tells
//! apart. Control-register bits: SDM vol. 3A, §2.5.

use crate::paging::PagingMode;
use hwtrace_types::Cr3;

/// Offset of `cr[0]` in the note's descriptor.
pub(crate) const CR_OFFSET: usize = 8 + 18 * 8 + 10 * 24;
/// The note's size with every field QEMU writes today.
pub(crate) const STATE_SIZE: usize = CR_OFFSET + 5 * 8 + 8;
/// Offset of `rip`.
const RIP_OFFSET: usize = 8 + 16 * 8;
/// Offset of `rsp`.
const RSP_OFFSET: usize = 8 + 6 * 8;

/// CR4.LA57 (bit 12): 5-level paging.
pub const CR4_LA57: u64 = 1 << 12;
/// CR0.PG (bit 31): paging enabled.
pub const CR0_PG: u64 = 1 << 31;

/// One vCPU's state from a QEMU note.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct QemuCpuState {
    /// The note's version field (1 so far).
    pub version: u32,
    /// RIP.
    pub rip: u64,
    /// RSP.
    pub rsp: u64,
    /// CR0, CR1 (unused), CR2, CR3, CR4.
    pub cr: [u64; 5],
}

impl QemuCpuState {
    /// Parses a note descriptor; `None` if it is too short to hold the
    /// control registers.
    pub fn parse(desc: &[u8]) -> Option<Self> {
        let u64_at = |off: usize| -> Option<u64> {
            let b = desc.get(off..off + 8)?;
            Some(u64::from_le_bytes(b.try_into().ok()?))
        };
        let version = u32::from_le_bytes(desc.get(0..4)?.try_into().ok()?);
        let mut cr = [0u64; 5];
        for (i, c) in cr.iter_mut().enumerate() {
            *c = u64_at(CR_OFFSET + 8 * i)?;
        }
        Some(Self {
            version,
            rip: u64_at(RIP_OFFSET)?,
            rsp: u64_at(RSP_OFFSET)?,
            cr,
        })
    }

    /// Serialises the state as QEMU lays it out (fields not kept are zero).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; STATE_SIZE];
        out[0..4].copy_from_slice(&self.version.to_le_bytes());
        out[4..8].copy_from_slice(&(STATE_SIZE as u32).to_le_bytes());
        out[RIP_OFFSET..RIP_OFFSET + 8].copy_from_slice(&self.rip.to_le_bytes());
        out[RSP_OFFSET..RSP_OFFSET + 8].copy_from_slice(&self.rsp.to_le_bytes());
        for (i, c) in self.cr.iter().enumerate() {
            let at = CR_OFFSET + 8 * i;
            out[at..at + 8].copy_from_slice(&c.to_le_bytes());
        }
        out
    }

    /// CR3.
    pub fn cr3(&self) -> Cr3 {
        Cr3(self.cr[3])
    }

    /// Whether paging was on (CR0.PG).
    pub fn paging_enabled(&self) -> bool {
        self.cr[0] & CR0_PG != 0
    }

    /// 5-level paging if CR4.LA57 is set, else 4-level.
    pub fn paging_mode(&self) -> PagingMode {
        if self.cr[4] & CR4_LA57 != 0 {
            PagingMode::Level5
        } else {
            PagingMode::Level4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_qemu_and_round_trips() {
        // QEMUCPUState: cr[] after 8 + 18*8 + 10*24 bytes, 440 bytes in all.
        assert_eq!(CR_OFFSET, 392);
        assert_eq!(STATE_SIZE, 440);
        let s = QemuCpuState {
            version: 1,
            rip: 0xffff_ffff_8100_0000,
            rsp: 0xffff_c900_0000_0000,
            cr: [CR0_PG | 1, 0, 0x1234, 0x10_2000, CR4_LA57],
        };
        let back = QemuCpuState::parse(&s.to_bytes()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.cr3(), Cr3(0x10_2000));
        assert!(back.paging_enabled());
        assert_eq!(back.paging_mode(), PagingMode::Level5);
        assert_eq!(QemuCpuState::parse(&s.to_bytes()[..420]), None);
    }
}
