//! CPUID leaves that enumerate the trace hardware: leaf 07H (Intel PT
//! present) and leaf 14H sub-leaves 0 and 1 (Intel PT capabilities).
//!
//! Layouts from the Intel SDM Vol. 2A “CPUID” and Vol. 3C §33.3.1 “Detection
//! of Intel Processor Trace and Capability Enumeration”.

use crate::field::{FieldDef, FieldKind, RegisterDef};

/// The four output registers of one CPUID query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CpuidRegs {
    /// EAX.
    pub eax: u32,
    /// EBX.
    pub ebx: u32,
    /// ECX.
    pub ecx: u32,
    /// EDX.
    pub edx: u32,
}

/// The 12-byte vendor string of CPUID leaf 0 (EBX, EDX, ECX in that order):
/// `GenuineIntel`, `AuthenticAMD`, ...
pub fn vendor(leaf0: &CpuidRegs) -> [u8; 12] {
    let mut v = [0u8; 12];
    v[0..4].copy_from_slice(&leaf0.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&leaf0.edx.to_le_bytes());
    v[8..12].copy_from_slice(&leaf0.ecx.to_le_bytes());
    v
}

/// CPUID.(EAX=07H,ECX=0):EBX bit 25: Intel Processor Trace is supported.
pub const fn has_intel_pt(leaf7_sub0: &CpuidRegs) -> bool {
    leaf7_sub0.ebx & (1 << 25) != 0
}

/// MAXPHYADDR from `CPUID.80000008H:EAX[7:0]` (physical address width).
pub const fn max_phys_addr(leaf_80000008: &CpuidRegs) -> u8 {
    (leaf_80000008.eax & 0xFF) as u8
}

/// Intel PT capabilities, CPUID leaf 14H sub-leaves 0 and 1
/// (SDM Vol. 3C §33.3.1, “CPUID Leaf 14H Enumeration of Intel Processor Trace
/// Capabilities”).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PtCaps {
    /// Sub-leaf 0.
    pub sub0: CpuidRegs,
    /// Sub-leaf 1 (all zero if sub-leaf 0 EAX reports no sub-leaf 1).
    pub sub1: CpuidRegs,
}

macro_rules! cap_bits {
    ($( $(#[$meta:meta])* $name:ident = $reg:ident . $field:ident [$bit:expr]; )*) => {
        $(
            $(#[$meta])*
            pub const fn $name(&self) -> bool {
                (self.$reg.$field >> $bit) & 1 != 0
            }
        )*
    };
}

impl PtCaps {
    /// Capabilities from the raw registers of both sub-leaves.
    pub const fn new(sub0: CpuidRegs, sub1: CpuidRegs) -> Self {
        Self { sub0, sub1 }
    }

    /// Maximum valid sub-leaf (sub-leaf 0 EAX).
    pub const fn max_sub_leaf(&self) -> u32 {
        self.sub0.eax
    }

    cap_bits! {
        /// `EBX[0]`: CR3 filtering (CR3Filter, IA32_RTIT_CR3_MATCH).
        cr3_filtering = sub0.ebx[0];
        /// `EBX[1]`: configurable PSB frequency and cycle-accurate mode (PSBFreq, CYCEn, CYCThresh).
        configurable_psb_and_cyc = sub0.ebx[1];
        /// `EBX[2]`: IP filtering, TraceStop, and preservation of PT MSRs across warm reset.
        ip_filtering = sub0.ebx[2];
        /// `EBX[3]`: MTC timing packets and suppression of COFI packets (MTCEn, BranchEn=0).
        mtc = sub0.ebx[3];
        /// `EBX[4]`: PTWRITE (PTWEn, FUPonPTW).
        ptwrite = sub0.ebx[4];
        /// `EBX[5]`: power event trace (PwrEvtEn).
        power_event_trace = sub0.ebx[5];
        /// `EBX[6]`: PSB and PMI preservation (InjectPsbPmiOnEnable, PendPSB, PendTopaPMI).
        psb_pmi_preservation = sub0.ebx[6];
        /// `EBX[7]`: event trace (EventEn).
        event_trace = sub0.ebx[7];
        /// `EBX[8]`: TNT disable (DisTNT).
        tnt_disable = sub0.ebx[8];
        /// `ECX[0]`: ToPA output.
        topa = sub0.ecx[0];
        /// `ECX[1]`: ToPA tables may hold more than one output entry.
        topa_multiple_entries = sub0.ecx[1];
        /// `ECX[2]`: single-range output.
        single_range = sub0.ecx[2];
        /// `ECX[3]`: output to the trace transport subsystem (FabricEn).
        trace_transport = sub0.ecx[3];
        /// `ECX[31]`: IP payloads are linear addresses (LIP, CS base included), not RIP.
        lip = sub0.ecx[31];
    }

    /// Sub-leaf 1 `EAX[2:0]`: number of ADDRn_A/B ranges (0 when IP filtering
    /// is absent or sub-leaf 1 is not reported).
    pub const fn num_address_ranges(&self) -> u8 {
        if !self.ip_filtering() || self.max_sub_leaf() < 1 {
            return 0;
        }
        (self.sub1.eax & 0x7) as u8
    }

    /// Sub-leaf 1 `EAX[31:16]`: bit `n` set means MTCFreq = `n` is supported.
    pub const fn mtc_period_bitmap(&self) -> u16 {
        (self.sub1.eax >> 16) as u16
    }

    /// Sub-leaf 1 `EBX[15:0]`: bit `n` set means CYCThresh = `n` is supported.
    pub const fn cyc_threshold_bitmap(&self) -> u16 {
        self.sub1.ebx as u16
    }

    /// Sub-leaf 1 `EBX[31:16]`: bit `n` set means PSBFreq = `n` is supported.
    pub const fn psb_freq_bitmap(&self) -> u16 {
        (self.sub1.ebx >> 16) as u16
    }

    /// Every capability (for tests and tools that want "anything goes").
    pub const fn everything() -> Self {
        Self {
            sub0: CpuidRegs {
                eax: 1,
                ebx: 0x1FF,
                ecx: 0x8000_000F,
                edx: 0,
            },
            sub1: CpuidRegs {
                eax: 0xFFFF_0004,
                ebx: 0xFFFF_FFFF,
                ecx: 0,
                edx: 0,
            },
        }
    }
}

/// Layout of CPUID.(EAX=07H,ECX=0):EBX, as far as tracing cares.
pub static CPUID_07_0_EBX: RegisterDef = RegisterDef {
    name: "CPUID.(EAX=07H,ECX=0):EBX",
    sdm: "SDM Vol. 2A “CPUID”, Structured Extended Feature Flags",
    reserved: 0,
    width: 32,
    fields: &[FieldDef::flag(
        "Intel PT",
        25,
        "Intel Processor Trace supported",
        "no Intel Processor Trace",
    )],
};

/// Layout of CPUID.(EAX=14H,ECX=0):EAX.
pub static CPUID_14_0_EAX: RegisterDef = RegisterDef {
    name: "CPUID.(EAX=14H,ECX=0):EAX",
    sdm: "SDM Vol. 3C §33.3.1 (CPUID leaf 14H)",
    reserved: 0,
    width: 32,
    fields: &[FieldDef::field("MaxSubLeaf", 31, 0, FieldKind::Number)],
};

/// Layout of CPUID.(EAX=14H,ECX=0):EBX.
pub static CPUID_14_0_EBX: RegisterDef = RegisterDef {
    name: "CPUID.(EAX=14H,ECX=0):EBX",
    sdm: "SDM Vol. 3C §33.3.1 (CPUID leaf 14H)",
    reserved: 0xFFFF_FE00,
    width: 32,
    fields: &[
        FieldDef::flag(
            "CR3Filtering",
            0,
            "CR3Filter and IA32_RTIT_CR3_MATCH supported",
            "CR3 filtering absent (CR3Filter=1 faults)",
        ),
        FieldDef::flag(
            "ConfigurablePsbCyc",
            1,
            "PSBFreq, CYCEn and CYCThresh configurable",
            "no configurable PSB frequency, no cycle-accurate mode",
        ),
        FieldDef::flag(
            "IpFiltering",
            2,
            "IP filtering and TraceStop supported (ADDRn_CFG); PT MSRs kept across warm reset",
            "no IP filtering",
        ),
        FieldDef::flag(
            "MTC",
            3,
            "MTC packets and COFI suppression (BranchEn=0) supported",
            "no MTC",
        ),
        FieldDef::flag(
            "PTWRITE",
            4,
            "PTWRITE supported (PTWEn, FUPonPTW)",
            "no PTWRITE",
        ),
        FieldDef::flag(
            "PowerEventTrace",
            5,
            "power event trace supported (PwrEvtEn)",
            "no power event trace",
        ),
        FieldDef::flag(
            "PsbPmiPreservation",
            6,
            "PSB and PMI preservation supported (InjectPsbPmiOnEnable)",
            "no PSB/PMI preservation",
        ),
        FieldDef::flag(
            "EventTrace",
            7,
            "event trace supported (EventEn)",
            "no event trace",
        ),
        FieldDef::flag(
            "TntDisable",
            8,
            "TNT disable supported (DisTNT)",
            "no TNT disable",
        ),
    ],
};

/// Layout of CPUID.(EAX=14H,ECX=0):ECX.
pub static CPUID_14_0_ECX: RegisterDef = RegisterDef {
    name: "CPUID.(EAX=14H,ECX=0):ECX",
    sdm: "SDM Vol. 3C §33.3.1 (CPUID leaf 14H)",
    reserved: 0x7FFF_FFF0,
    width: 32,
    fields: &[
        FieldDef::flag("ToPAOutput", 0, "ToPA output supported", "no ToPA output"),
        FieldDef::flag(
            "ToPAMultipleEntries",
            1,
            "ToPA tables may hold any number of output entries",
            "one output entry per ToPA table, followed by END back to the table",
        ),
        FieldDef::flag(
            "SingleRangeOutput",
            2,
            "single-range output supported",
            "no single-range output",
        ),
        FieldDef::flag(
            "TraceTransport",
            3,
            "output to the trace transport subsystem (FabricEn)",
            "no trace transport output",
        ),
        FieldDef::flag(
            "LIP",
            31,
            "IP payloads are linear addresses (CS base included)",
            "IP payloads are RIP (CS base excluded)",
        ),
    ],
};

/// Layout of CPUID.(EAX=14H,ECX=1):EAX.
pub static CPUID_14_1_EAX: RegisterDef = RegisterDef {
    name: "CPUID.(EAX=14H,ECX=1):EAX",
    sdm: "SDM Vol. 3C §33.3.1 (CPUID leaf 14H)",
    reserved: 0x0000_FFF8,
    width: 32,
    fields: &[
        FieldDef::field("NumAddressRanges", 2, 0, FieldKind::Number),
        FieldDef::field("MtcPeriodBitmap", 31, 16, FieldKind::Number),
    ],
};

/// Layout of CPUID.(EAX=14H,ECX=1):EBX.
pub static CPUID_14_1_EBX: RegisterDef = RegisterDef {
    name: "CPUID.(EAX=14H,ECX=1):EBX",
    sdm: "SDM Vol. 3C §33.3.1 (CPUID leaf 14H)",
    reserved: 0,
    width: 32,
    fields: &[
        FieldDef::field("CycThresholdBitmap", 15, 0, FieldKind::Number),
        FieldDef::field("PsbFreqBitmap", 31, 16, FieldKind::Number),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 000: `cpuid(7,0)` returned EBX = 0x02942607; bit 25 is set.
    #[test]
    fn seed_000_leaf_7_reports_intel_pt() {
        let leaf7 = CpuidRegs {
            ebx: 0x0294_2607,
            ..CpuidRegs::default()
        };
        assert!(has_intel_pt(&leaf7));
        assert!(!has_intel_pt(&CpuidRegs {
            ebx: 0x0294_2607 & !(1 << 25),
            ..leaf7
        }));
    }

    /// Seed 000: `cpuid(0x14,1)` returned EAX = 0x02490002: two address
    /// ranges, MTC periods 0, 3, 6 and 9.
    #[test]
    fn seed_000_leaf_14_sub_1_has_two_ranges() {
        let caps = PtCaps::new(
            CpuidRegs {
                eax: 1,
                ebx: 0b0100,
                ecx: 0,
                edx: 0,
            },
            CpuidRegs {
                eax: 0x0249_0002,
                ..CpuidRegs::default()
            },
        );
        assert_eq!(caps.num_address_ranges(), 2);
        assert_eq!(caps.mtc_period_bitmap(), 0x0249);
        assert!(caps.ip_filtering());
        assert!(!caps.mtc());
    }

    #[test]
    fn no_ranges_without_ip_filtering_or_sub_leaf_1() {
        let sub1 = CpuidRegs {
            eax: 2,
            ..CpuidRegs::default()
        };
        assert_eq!(
            PtCaps::new(
                CpuidRegs {
                    eax: 1,
                    ..CpuidRegs::default()
                },
                sub1
            )
            .num_address_ranges(),
            0
        );
        assert_eq!(
            PtCaps::new(
                CpuidRegs {
                    eax: 0,
                    ebx: 4,
                    ..CpuidRegs::default()
                },
                sub1
            )
            .num_address_ranges(),
            0
        );
    }

    #[test]
    fn vendor_string_is_ebx_edx_ecx() {
        let amd = CpuidRegs {
            eax: 0x10,
            ebx: 0x6874_7541,
            ecx: 0x444D_4163,
            edx: 0x6974_6E65,
        };
        assert_eq!(&vendor(&amd), b"AuthenticAMD");
    }
}
