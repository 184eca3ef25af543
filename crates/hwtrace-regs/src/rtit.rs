//! The Intel PT configuration MSRs: IA32_RTIT_CTL, IA32_RTIT_STATUS,
//! IA32_RTIT_OUTPUT_BASE, IA32_RTIT_OUTPUT_MASK_PTRS, IA32_RTIT_CR3_MATCH and
//! IA32_RTIT_ADDRn_A/B.
//!
//! Layouts from the Intel SDM Vol. 3C, chapter 33 “Intel Processor Trace”
//! (§33.2.7 “Trace Output” and §33.2.8 “Enabling and Configuration MSRs”).

use crate::field::{FieldDef, FieldKind, Meaning, RegisterDef};
use crate::macros::{flags, numbers, raw_register};

/// IA32_RTIT_CTL (MSR 570H): the Intel PT control register
/// (SDM Vol. 3C §33.2.8.2 “IA32_RTIT_CTL MSR”).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtitCtl(u64);
raw_register!(RtitCtl);

impl RtitCtl {
    /// Bits the SDM reserves: 18, 23, 30:28, 54:48 and 63:57.
    pub const RESERVED: u64 = 0xFE7F_0000_7084_0000;

    flags! {
        /// TraceEn (bit 0): packet generation is enabled.
        trace_en, with_trace_en = 0;
        /// CYCEn (bit 1): cycle-accurate mode, CYC packets.
        cyc_en, with_cyc_en = 1;
        /// OS (bit 2): trace when CPL = 0.
        os, with_os = 2;
        /// User (bit 3): trace when CPL > 0.
        user, with_user = 3;
        /// PwrEvtEn (bit 4): power event trace packets.
        pwr_evt_en, with_pwr_evt_en = 4;
        /// FUPonPTW (bit 5): a FUP follows each PTW packet.
        fup_on_ptw, with_fup_on_ptw = 5;
        /// FabricEn (bit 6): output goes to the trace transport subsystem, not memory.
        fabric_en, with_fabric_en = 6;
        /// CR3Filter (bit 7): trace only while CR3 equals IA32_RTIT_CR3_MATCH.
        cr3_filter, with_cr3_filter = 7;
        /// ToPA (bit 8): ToPA output (1) or single-range output (0).
        topa, with_topa = 8;
        /// MTCEn (bit 9): MTC timing packets.
        mtc_en, with_mtc_en = 9;
        /// TSCEn (bit 10): TSC packets.
        tsc_en, with_tsc_en = 10;
        /// DisRETC (bit 11): disable return compression.
        dis_retc, with_dis_retc = 11;
        /// PTWEn (bit 12): PTWRITE packets.
        ptw_en, with_ptw_en = 12;
        /// BranchEn (bit 13): COFI packets (TNT, TIP, FUP, MODE).
        branch_en, with_branch_en = 13;
        /// EventEn (bit 31): event trace packets.
        event_en, with_event_en = 31;
        /// DisTNT (bit 55): no TNT packets.
        dis_tnt, with_dis_tnt = 55;
        /// InjectPsbPmiOnEnable (bit 56): pending PSB and PMI are delivered on enable.
        inject_psb_pmi_on_enable, with_inject_psb_pmi_on_enable = 56;
    }

    numbers! {
        /// MTCFreq (bits 17:14): MTC sent each time ART bit `n` toggles.
        mtc_freq, with_mtc_freq = "MTCFreq", 17:14;
        /// CYCThresh (bits 22:19): minimum cycles between CYC packets, encoded.
        cyc_thresh, with_cyc_thresh = "CYCThresh", 22:19;
        /// PSBFreq (bits 27:24): PSB about every 2^(n+11) output bytes.
        psb_freq, with_psb_freq = "PSBFreq", 27:24;
    }

    /// ADDRn_CFG (bits 35:32, 39:36, 43:40, 47:44) for range `n` (0..=3).
    /// `None` for `n > 3`.
    pub const fn addr_cfg(self, n: u8) -> Option<AddrCfg> {
        if n > 3 {
            return None;
        }
        Some(AddrCfg::from_bits(
            ((self.0 >> (32 + 4 * n as u32)) & 0xF) as u8,
        ))
    }

    /// Returns a copy with ADDRn_CFG set; `None` for `n > 3`.
    #[must_use]
    pub const fn with_addr_cfg(self, n: u8, cfg: AddrCfg) -> Option<Self> {
        if n > 3 {
            return None;
        }
        let shift = 32 + 4 * n as u32;
        Some(Self(
            (self.0 & !(0xF << shift)) | ((cfg.bits() as u64) << shift),
        ))
    }

    /// Reserved bits that are set.
    pub const fn reserved_set(self) -> u64 {
        self.0 & Self::RESERVED
    }
}

/// The meaning of an ADDRn_CFG field (SDM Vol. 3C §33.2.4.3 “Filtering by IP”).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrCfg {
    /// 0: the range is not used.
    Unused,
    /// 1: FilterEn — trace only while the IP is inside ADDRn_A..=ADDRn_B.
    Filter,
    /// 2: TraceStop — stop tracing when execution enters the range.
    TraceStop,
    /// 3..=15: reserved; WRMSR faults (#GP).
    Reserved(u8),
}

impl AddrCfg {
    /// Decodes the 4-bit field.
    pub const fn from_bits(v: u8) -> Self {
        match v & 0xF {
            0 => Self::Unused,
            1 => Self::Filter,
            2 => Self::TraceStop,
            r => Self::Reserved(r),
        }
    }

    /// The 4-bit encoding.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Unused => 0,
            Self::Filter => 1,
            Self::TraceStop => 2,
            Self::Reserved(r) => r & 0xF,
        }
    }
}

fn mtc_freq_meaning(v: u64) -> Meaning {
    Meaning::Period {
        log2: v as u32,
        unit: "crystal-clock (ART) ticks, when MTCEn=1",
    }
}

fn cyc_thresh_meaning(v: u64) -> Meaning {
    if v == 0 {
        Meaning::Text("CYC may be sent on any cycle (no threshold)")
    } else {
        Meaning::Period {
            log2: (v - 1) as u32,
            unit: "core cycles at least between CYC packets",
        }
    }
}

fn psb_freq_meaning(v: u64) -> Meaning {
    Meaning::Period {
        log2: v as u32 + 11,
        unit: "bytes of trace output (approximately)",
    }
}

const ADDR_CFG: &[(u64, &str)] = &[
    (0, "range not used"),
    (
        1,
        "FilterEn: trace only while IP is inside ADDRn_A..ADDRn_B",
    ),
    (
        2,
        "TraceStop: stop tracing when execution enters ADDRn_A..ADDRn_B",
    ),
];

/// Layout of IA32_RTIT_CTL.
pub static RTIT_CTL: RegisterDef = RegisterDef {
    name: "IA32_RTIT_CTL",
    sdm: "SDM Vol. 3C §33.2.8.2 “IA32_RTIT_CTL MSR”",
    reserved: RtitCtl::RESERVED,
    width: 64,
    fields: &[
        FieldDef::flag(
            "TraceEn",
            0,
            "packet generation enabled",
            "packet generation disabled",
        ),
        FieldDef::flag(
            "CYCEn",
            1,
            "cycle-accurate mode: CYC packets",
            "no CYC packets",
        ),
        FieldDef::flag("OS", 2, "trace at CPL 0", "do not trace at CPL 0"),
        FieldDef::flag("User", 3, "trace at CPL > 0", "do not trace at CPL > 0"),
        FieldDef::flag(
            "PwrEvtEn",
            4,
            "power event packets (PWRE, PWRX, ...)",
            "no power event packets",
        ),
        FieldDef::flag(
            "FUPonPTW",
            5,
            "a FUP follows each PTW packet",
            "no FUP after PTW",
        ),
        FieldDef::flag(
            "FabricEn",
            6,
            "output to the trace transport subsystem",
            "output to memory (ToPA or single range)",
        ),
        FieldDef::flag(
            "CR3Filter",
            7,
            "trace only while CR3 = IA32_RTIT_CR3_MATCH",
            "no CR3 filtering",
        ),
        FieldDef::flag(
            "ToPA",
            8,
            "ToPA output (OUTPUT_BASE points at a ToPA table)",
            "single-range output",
        ),
        FieldDef::flag("MTCEn", 9, "MTC timing packets", "no MTC packets"),
        FieldDef::flag("TSCEn", 10, "TSC packets", "no TSC packets"),
        FieldDef::flag(
            "DisRETC",
            11,
            "return compression disabled: every RET gives a TIP",
            "return compression enabled",
        ),
        FieldDef::flag("PTWEn", 12, "PTWRITE packets", "PTWRITE does not trace"),
        FieldDef::flag(
            "BranchEn",
            13,
            "COFI packets (TNT, TIP, FUP, MODE)",
            "no control-flow packets",
        ),
        FieldDef::field("MTCFreq", 17, 14, FieldKind::Computed(mtc_freq_meaning)),
        FieldDef::field("CYCThresh", 22, 19, FieldKind::Computed(cyc_thresh_meaning)),
        FieldDef::field("PSBFreq", 27, 24, FieldKind::Computed(psb_freq_meaning)),
        FieldDef::flag(
            "EventEn",
            31,
            "event trace packets (CFE, EVD)",
            "no event trace packets",
        ),
        FieldDef::field("ADDR0_CFG", 35, 32, FieldKind::Enum(ADDR_CFG)),
        FieldDef::field("ADDR1_CFG", 39, 36, FieldKind::Enum(ADDR_CFG)),
        FieldDef::field("ADDR2_CFG", 43, 40, FieldKind::Enum(ADDR_CFG)),
        FieldDef::field("ADDR3_CFG", 47, 44, FieldKind::Enum(ADDR_CFG)),
        FieldDef::flag(
            "DisTNT",
            55,
            "no TNT packets",
            "TNT packets for conditional branches",
        ),
        FieldDef::flag(
            "InjectPsbPmiOnEnable",
            56,
            "a pending PSB or ToPA PMI is delivered when TraceEn is set",
            "pending PSB/PMI state is not preserved",
        ),
    ],
};

/// IA32_RTIT_STATUS (MSR 571H): tracing state (SDM Vol. 3C §33.2.8.4
/// “IA32_RTIT_STATUS MSR”).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtitStatus(u64);
raw_register!(RtitStatus);

impl RtitStatus {
    /// Bits the SDM reserves: 3, 31:8 and 63:49.
    pub const RESERVED: u64 = 0xFFFE_0000_FFFF_FF08;

    flags! {
        /// FilterEn (bit 0): the IP is inside a FilterEn range (read-only).
        filter_en, with_filter_en = 0;
        /// ContextEn (bit 1): CPL and CR3 conditions are met.
        context_en, with_context_en = 1;
        /// TriggerEn (bit 2): tracing is active.
        trigger_en, with_trigger_en = 2;
        /// Error (bit 4): an operational error stopped tracing.
        error, with_error = 4;
        /// Stopped (bit 5): a ToPA STOP entry or TraceStop range stopped tracing.
        stopped, with_stopped = 5;
        /// PendPSB (bit 6): a PSB is pending (InjectPsbPmiOnEnable).
        pend_psb, with_pend_psb = 6;
        /// PendTopaPMI (bit 7): a ToPA PMI is pending (InjectPsbPmiOnEnable).
        pend_topa_pmi, with_pend_topa_pmi = 7;
    }

    numbers! {
        /// PacketByteCnt (bits 48:32): bytes of output since the last PSB.
        packet_byte_cnt, with_packet_byte_cnt = "PacketByteCnt", 48:32;
    }
}

/// Layout of IA32_RTIT_STATUS.
pub static RTIT_STATUS: RegisterDef = RegisterDef {
    name: "IA32_RTIT_STATUS",
    sdm: "SDM Vol. 3C §33.2.8.4 “IA32_RTIT_STATUS MSR”",
    reserved: RtitStatus::RESERVED,
    width: 64,
    fields: &[
        FieldDef::flag(
            "FilterEn",
            0,
            "IP is inside a FilterEn range (or no IP filtering)",
            "IP is outside every FilterEn range",
        ),
        FieldDef::flag(
            "ContextEn",
            1,
            "CPL/CR3 conditions allow tracing",
            "CPL/CR3 conditions block tracing",
        ),
        FieldDef::flag(
            "TriggerEn",
            2,
            "tracing is triggered on",
            "tracing is off (TraceEn=0, Stopped or Error)",
        ),
        FieldDef::flag(
            "Error",
            4,
            "an operational error stopped tracing",
            "no operational error",
        ),
        FieldDef::flag(
            "Stopped",
            5,
            "tracing stopped by a ToPA STOP entry or a TraceStop range",
            "not stopped",
        ),
        FieldDef::flag(
            "PendPSB",
            6,
            "a PSB is pending and will be sent on enable",
            "no PSB pending",
        ),
        FieldDef::flag(
            "PendTopaPMI",
            7,
            "a ToPA PMI is pending and will be raised on enable",
            "no ToPA PMI pending",
        ),
        FieldDef::field("PacketByteCnt", 48, 32, FieldKind::Number),
    ],
};

/// IA32_RTIT_OUTPUT_BASE (MSR 560H): single-range base or current ToPA table
/// (SDM Vol. 3C §33.2.7.1 “Single Range Output”, §33.2.7.2 “ToPA”).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtitOutputBase(u64);
raw_register!(RtitOutputBase);

impl RtitOutputBase {
    /// Bits 6:0 are reserved; bits above MAXPHYADDR are too (checked by the
    /// configuration builder, which knows MAXPHYADDR).
    pub const RESERVED: u64 = 0x7F;

    /// BasePhysAddr (bits MAXPHYADDR-1:7), in place.
    pub const fn base_phys_addr(self) -> u64 {
        self.0 & !Self::RESERVED
    }
}

/// Layout of IA32_RTIT_OUTPUT_BASE.
pub static RTIT_OUTPUT_BASE: RegisterDef = RegisterDef {
    name: "IA32_RTIT_OUTPUT_BASE",
    sdm: "SDM Vol. 3C §33.2.7 “Trace Output” (IA32_RTIT_OUTPUT_BASE)",
    reserved: RtitOutputBase::RESERVED,
    width: 64,
    fields: &[FieldDef::field("BasePhysAddr", 63, 7, FieldKind::Address)],
};

/// IA32_RTIT_OUTPUT_MASK_PTRS (MSR 561H): the write position
/// (SDM Vol. 3C §33.2.7 “Trace Output”). See [`crate::topa`] for the arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtitOutputMaskPtrs(u64);
raw_register!(RtitOutputMaskPtrs);

impl RtitOutputMaskPtrs {
    numbers! {
        /// LowerMask (bits 6:0): forced to 1s by the processor.
        lower_mask, with_lower_mask = "LowerMask", 6:0;
        /// MaskOrTableOffset (bits 31:7): mask bits 31:7 (single range) or the
        /// current ToPA entry index (ToPA, table byte offset = index × 8).
        mask_or_table_offset, with_mask_or_table_offset = "MaskOrTableOffset", 31:7;
        /// OutputOffset (bits 63:32): offset into the region being written.
        output_offset, with_output_offset = "OutputOffset", 63:32;
    }
}

fn lower_mask_meaning(v: u64) -> Meaning {
    if v == 0x7F {
        Meaning::Text("all ones, as the processor forces them")
    } else {
        Meaning::Text("not all ones: the processor ignores writes and reads back 7FH")
    }
}

fn mask_or_table_offset_meaning(v: u64) -> Meaning {
    Meaning::MaskOrTableOffset(v)
}

/// Layout of IA32_RTIT_OUTPUT_MASK_PTRS.
pub static RTIT_OUTPUT_MASK_PTRS: RegisterDef = RegisterDef {
    name: "IA32_RTIT_OUTPUT_MASK_PTRS",
    sdm: "SDM Vol. 3C §33.2.7 “Trace Output” (IA32_RTIT_OUTPUT_MASK_PTRS)",
    reserved: 0,
    width: 64,
    fields: &[
        FieldDef::field("LowerMask", 6, 0, FieldKind::Computed(lower_mask_meaning)),
        FieldDef::field(
            "MaskOrTableOffset",
            31,
            7,
            FieldKind::Computed(mask_or_table_offset_meaning),
        ),
        FieldDef::field("OutputOffset", 63, 32, FieldKind::Number),
    ],
};

/// IA32_RTIT_CR3_MATCH (MSR 572H): the CR3 value CR3Filter compares against
/// (SDM Vol. 3C §33.2.4.2 “Filtering by CR3”).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtitCr3Match(u64);
raw_register!(RtitCr3Match);

impl RtitCr3Match {
    /// Bits 4:0 are reserved.
    pub const RESERVED: u64 = 0x1F;

    /// The CR3 value to match (bits 63:5 in place).
    pub const fn cr3(self) -> hwtrace_types::Cr3 {
        hwtrace_types::Cr3(self.0 & !Self::RESERVED)
    }
}

/// Layout of IA32_RTIT_CR3_MATCH.
pub static RTIT_CR3_MATCH: RegisterDef = RegisterDef {
    name: "IA32_RTIT_CR3_MATCH",
    sdm: "SDM Vol. 3C §33.2.4.2 “Filtering by CR3” (IA32_RTIT_CR3_MATCH)",
    reserved: RtitCr3Match::RESERVED,
    width: 64,
    fields: &[FieldDef::field("CR3", 63, 5, FieldKind::Address)],
};

/// IA32_RTIT_ADDRn_A / IA32_RTIT_ADDRn_B (MSRs 580H..587H): the bounds of IP
/// range `n` (SDM Vol. 3C §33.2.4.3 “Filtering by IP”). Bits 63:48 must be the
/// sign extension of bit 47 (a canonical address), or WRMSR faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtitAddr(u64);
raw_register!(RtitAddr);

impl RtitAddr {
    /// The linear address (bits 47:0, sign-extended).
    pub const fn ip(self) -> hwtrace_types::Ip {
        hwtrace_types::Ip((((self.0 << 16) as i64) >> 16) as u64)
    }

    /// Whether bits 63:48 are the sign extension of bit 47.
    pub const fn is_canonical(self) -> bool {
        self.ip().0 == self.0
    }
}

fn sign_ext_meaning(v: u64) -> Meaning {
    match v {
        0 | 0xFFFF => Meaning::Text("sign extension (canonical only if it matches bit 47)"),
        _ => Meaning::Text("not a sign extension: WRMSR faults (#GP)"),
    }
}

/// Layout of IA32_RTIT_ADDRn_A and IA32_RTIT_ADDRn_B.
pub static RTIT_ADDR: RegisterDef = RegisterDef {
    name: "IA32_RTIT_ADDRn_A/B",
    sdm: "SDM Vol. 3C §33.2.4.3 “Filtering by IP” (IA32_RTIT_ADDRn_A/B)",
    reserved: 0,
    width: 64,
    fields: &[
        FieldDef::field("VirtAddr", 47, 0, FieldKind::Address),
        FieldDef::field("SignExt", 63, 48, FieldKind::Computed(sign_ext_meaning)),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_accessors_and_table_agree_on_every_flag() {
        let all = RtitCtl::new()
            .with_trace_en(true)
            .with_cyc_en(true)
            .with_os(true)
            .with_user(true)
            .with_pwr_evt_en(true)
            .with_fup_on_ptw(true)
            .with_fabric_en(true)
            .with_cr3_filter(true)
            .with_topa(true)
            .with_mtc_en(true)
            .with_tsc_en(true)
            .with_dis_retc(true)
            .with_ptw_en(true)
            .with_branch_en(true)
            .with_event_en(true)
            .with_dis_tnt(true)
            .with_inject_psb_pmi_on_enable(true);
        let table_flags = RTIT_CTL
            .fields
            .iter()
            .filter(|f| f.bits.width() == 1)
            .fold(0u64, |acc, f| acc | f.bits.mask());
        assert_eq!(all.raw(), table_flags);
        assert_eq!(all.reserved_set(), 0);
    }

    #[test]
    fn table_and_reserved_mask_partition_the_register() {
        for def in [
            &RTIT_CTL,
            &RTIT_STATUS,
            &RTIT_OUTPUT_BASE,
            &RTIT_OUTPUT_MASK_PTRS,
            &RTIT_CR3_MATCH,
            &RTIT_ADDR,
        ] {
            let mut seen = def.reserved;
            for f in def.fields {
                assert_eq!(
                    seen & f.bits.mask(),
                    0,
                    "{} overlaps in {}",
                    f.name,
                    def.name
                );
                seen |= f.bits.mask();
            }
            if def.name == "IA32_RTIT_CTL" || def.name == "IA32_RTIT_STATUS" {
                // Gaps are exactly the reserved bits.
                assert_eq!(seen, u64::MAX, "{}", def.name);
            }
        }
    }

    #[test]
    fn addr_cfg_round_trips_for_every_range() {
        let ctl = RtitCtl::new()
            .with_addr_cfg(0, AddrCfg::Filter)
            .and_then(|c| c.with_addr_cfg(3, AddrCfg::TraceStop))
            .expect("ranges 0 and 3 exist");
        assert_eq!(ctl.raw(), (1 << 32) | (2 << 44));
        assert_eq!(ctl.addr_cfg(0), Some(AddrCfg::Filter));
        assert_eq!(ctl.addr_cfg(1), Some(AddrCfg::Unused));
        assert_eq!(ctl.addr_cfg(3), Some(AddrCfg::TraceStop));
        assert_eq!(ctl.addr_cfg(4), None);
        assert_eq!(RtitCtl::new().with_addr_cfg(4, AddrCfg::Filter), None);
    }

    #[test]
    fn numeric_fields_refuse_values_that_do_not_fit() {
        assert!(RtitCtl::new().with_mtc_freq(15).is_ok());
        assert!(RtitCtl::new().with_mtc_freq(16).is_err());
        let c = RtitCtl::new().with_psb_freq(5).expect("fits");
        assert_eq!(c.raw(), 5 << 24);
    }

    #[test]
    fn addresses_sign_extend_from_bit_47() {
        assert_eq!(
            RtitAddr::from_raw(0xFFFF_8000_0000_1000).ip().0,
            0xFFFF_8000_0000_1000
        );
        assert!(RtitAddr::from_raw(0xFFFF_8000_0000_1000).is_canonical());
        assert!(!RtitAddr::from_raw(0x0000_8000_0000_1000).is_canonical());
    }
}
