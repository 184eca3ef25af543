//! MSR numbers of the trace hardware.
//!
//! Defined here from the Intel SDM Vol. 4 (“Model-Specific Registers”) rather
//! than taken from a crate: several published tables carry stale LBR numbers.

/// IA32_DEBUGCTL (SDM Vol. 3B §18.4.1; NetBurst calls it MSR_DEBUGCTLA).
pub const IA32_DEBUGCTL: u32 = 0x1D9;
/// IA32_DS_AREA: linear address of the DS buffer management area (SDM Vol. 3B §18.4.9).
pub const IA32_DS_AREA: u32 = 0x600;
/// IA32_PERF_CAPABILITIES: LBR format and PEBS capabilities (SDM Vol. 3B §20.8, Vol. 4 Table 2-2).
pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
/// MSR_LBR_SELECT: LBR filtering, Nehalem and later (SDM Vol. 3B, “Filtering of Last Branch Records”).
pub const MSR_LBR_SELECT: u32 = 0x1C8;
/// MSR_LASTBRANCH_TOS: index of the most recent LBR entry (Core 2 and later).
pub const MSR_LASTBRANCH_TOS: u32 = 0x1C9;
/// MSR_LASTBRANCH_0_FROM_IP; entry `n` is at `+ n` (Nehalem and later, up to 32 entries).
pub const MSR_LASTBRANCH_0_FROM_IP: u32 = 0x680;
/// MSR_LASTBRANCH_0_TO_IP; entry `n` is at `+ n`.
pub const MSR_LASTBRANCH_0_TO_IP: u32 = 0x6C0;
/// MSR_LBR_INFO_0 (LBR format 000101b and later); entry `n` is at `+ n`.
pub const MSR_LBR_INFO_0: u32 = 0xDC0;
/// Number of non-architectural LBR entries modelled (Skylake has 32).
pub const LBR_MAX_ENTRIES: u8 = 32;

/// IA32_LBR_CTL: architectural LBR enable and filters (SDM Vol. 3B §19.1, “Architectural LBRs”).
pub const IA32_LBR_CTL: u32 = 0x14CE;
/// IA32_LBR_DEPTH: number of architectural LBR entries in use.
pub const IA32_LBR_DEPTH: u32 = 0x14CF;
/// IA32_LBR_0_INFO; entry `n` is at `+ n`.
pub const IA32_LBR_0_INFO: u32 = 0x1200;
/// IA32_LBR_0_FROM_IP; entry `n` is at `+ n`.
pub const IA32_LBR_0_FROM_IP: u32 = 0x1500;
/// IA32_LBR_0_TO_IP; entry `n` is at `+ n`.
pub const IA32_LBR_0_TO_IP: u32 = 0x1600;
/// Architectural LBR depth limit (IA32_LBR_DEPTH allows up to 64).
pub const ARCH_LBR_MAX_ENTRIES: u8 = 64;

/// IA32_RTIT_OUTPUT_BASE (SDM Vol. 3C §33.2.7).
pub const IA32_RTIT_OUTPUT_BASE: u32 = 0x560;
/// IA32_RTIT_OUTPUT_MASK_PTRS (SDM Vol. 3C §33.2.7).
pub const IA32_RTIT_OUTPUT_MASK_PTRS: u32 = 0x561;
/// IA32_RTIT_CTL (SDM Vol. 3C §33.2.8.2).
pub const IA32_RTIT_CTL: u32 = 0x570;
/// IA32_RTIT_STATUS (SDM Vol. 3C §33.2.8.4).
pub const IA32_RTIT_STATUS: u32 = 0x571;
/// IA32_RTIT_CR3_MATCH (SDM Vol. 3C §33.2.8.6).
pub const IA32_RTIT_CR3_MATCH: u32 = 0x572;
/// IA32_RTIT_ADDR0_A; range `n` uses `+ 2n` (A) and `+ 2n + 1` (B), n = 0..=3.
pub const IA32_RTIT_ADDR0_A: u32 = 0x580;
/// Number of IP filter ranges the architecture defines (CPUID may report fewer).
pub const RTIT_MAX_ADDR_RANGES: u8 = 4;
