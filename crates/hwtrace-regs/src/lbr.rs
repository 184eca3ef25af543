//! Non-architectural LBR MSRs: the record format reported by
//! `IA32_PERF_CAPABILITIES[5:0]`, MSR_LASTBRANCH_n_FROM_IP / _TO_IP and
//! MSR_LBR_INFO_n decoded per format, and MSR_LASTBRANCH_TOS
//! (SDM Vol. 3B §18.4.8.1 “LBR Stack and Intel 64 Processors”, and the
//! per-micro-architecture LBR sections).

use crate::field::{FieldDef, FieldKind, RegisterDef};
use hwtrace_types::Ip;

/// The LBR record format, `IA32_PERF_CAPABILITIES[5:0]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbrFormat {
    /// 000000b: 32-bit addresses.
    Bits32,
    /// 000001b: 64-bit linear addresses (CS base included).
    Lip,
    /// 000010b: 64-bit effective addresses.
    Eip,
    /// 000011b: FROM bit 63 = mispredicted, IP in 62:0 (Nehalem … Ivy Bridge).
    EipWithFlags,
    /// 000100b: FROM bits 63 mispredicted, 62 IN_TSX, 61 TSX_ABORT, IP in 60:0 (Haswell, Broadwell).
    EipWithFlagsTsx,
    /// 000101b: full 64-bit FROM/TO; flags and cycles in MSR_LBR_INFO_n (Skylake).
    EipWithFlagsInfo,
    /// 000110b: FROM bit 63 mispredicted; TO bits 63:48 cycle count, IP in 47:0 (Goldmont).
    LipWithFlagsCycles,
    /// 000111b: as 000101b with linear addresses (Goldmont Plus).
    LipWithFlagsInfo,
}

/// Errors decoding or encoding LBR values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbrError {
    /// `IA32_PERF_CAPABILITIES[5:0]` holds a format the SDM does not define.
    #[error("LBR format {0:#08b} is not defined by the SDM (known formats are 000000b to 000111b)")]
    UnknownFormat(u8),
    /// The address cannot be stored in this format's IP field.
    #[error(
        "address {ip} does not fit the {bits}-bit sign-extended IP field of LBR format {format:?}"
    )]
    AddressDoesNotFit {
        /// The address.
        ip: Ip,
        /// Width of the IP field.
        bits: u32,
        /// The format.
        format: LbrFormat,
    },
    /// A flag this format has no bit for.
    #[error("LBR format {format:?} has no place for {what}")]
    NotInFormat {
        /// The format.
        format: LbrFormat,
        /// What was asked for.
        what: &'static str,
    },
    /// A TOS value beyond the stack depth.
    #[error("TOS {tos} is beyond an LBR stack of {depth} entries")]
    TosOutOfRange {
        /// The TOS value.
        tos: u64,
        /// The depth.
        depth: u8,
    },
}

impl LbrFormat {
    /// Decodes the 6-bit encoding.
    pub const fn from_encoding(v: u8) -> Result<Self, LbrError> {
        Ok(match v {
            0 => Self::Bits32,
            1 => Self::Lip,
            2 => Self::Eip,
            3 => Self::EipWithFlags,
            4 => Self::EipWithFlagsTsx,
            5 => Self::EipWithFlagsInfo,
            6 => Self::LipWithFlagsCycles,
            7 => Self::LipWithFlagsInfo,
            other => return Err(LbrError::UnknownFormat(other)),
        })
    }

    /// The format reported by an IA32_PERF_CAPABILITIES value.
    pub const fn from_perf_capabilities(raw: u64) -> Result<Self, LbrError> {
        Self::from_encoding((raw & 0x3F) as u8)
    }

    /// The 6-bit encoding.
    pub const fn encoding(self) -> u8 {
        self as u8
    }

    /// Whether flags and cycles live in MSR_LBR_INFO_n.
    pub const fn has_info_msr(self) -> bool {
        matches!(self, Self::EipWithFlagsInfo | Self::LipWithFlagsInfo)
    }

    /// Width of the sign-extended IP field in FROM_IP (64 = the whole MSR).
    pub const fn from_ip_bits(self) -> u32 {
        match self {
            Self::Bits32 => 32,
            Self::EipWithFlags | Self::LipWithFlagsCycles => 63,
            Self::EipWithFlagsTsx => 61,
            Self::Lip | Self::Eip | Self::EipWithFlagsInfo | Self::LipWithFlagsInfo => 64,
        }
    }

    /// Width of the sign-extended IP field in TO_IP.
    pub const fn to_ip_bits(self) -> u32 {
        match self {
            Self::Bits32 => 32,
            Self::LipWithFlagsCycles => 48,
            _ => 64,
        }
    }

    /// The FROM_IP layout table.
    pub const fn from_def(self) -> &'static RegisterDef {
        match self {
            Self::Bits32 => &LBR_FROM_32,
            Self::EipWithFlags | Self::LipWithFlagsCycles => &LBR_FROM_FLAGS,
            Self::EipWithFlagsTsx => &LBR_FROM_TSX,
            Self::Lip | Self::Eip | Self::EipWithFlagsInfo | Self::LipWithFlagsInfo => &LBR_FROM_64,
        }
    }

    /// The TO_IP layout table.
    pub const fn to_def(self) -> &'static RegisterDef {
        match self {
            Self::Bits32 => &LBR_TO_32,
            Self::LipWithFlagsCycles => &LBR_TO_CYCLES,
            _ => &LBR_TO_64,
        }
    }
}

/// Sign-extends the low `bits` bits of `v`; 32-bit fields zero-extend.
const fn extend(v: u64, bits: u32) -> u64 {
    if bits >= 64 {
        v
    } else if bits == 32 {
        v & 0xFFFF_FFFF
    } else {
        let shift = 64 - bits;
        (((v << shift) as i64) >> shift) as u64
    }
}

const fn field_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

fn fit(ip: Ip, bits: u32, format: LbrFormat) -> Result<u64, LbrError> {
    if extend(ip.0 & field_mask(bits), bits) != ip.0 {
        return Err(LbrError::AddressDoesNotFit { ip, bits, format });
    }
    Ok(ip.0 & field_mask(bits))
}

/// A decoded MSR_LASTBRANCH_n_FROM_IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbrFrom {
    /// Source address, sign-extended.
    pub ip: Ip,
    /// Bit 63 on formats 000011b, 000100b, 000110b.
    pub mispredicted: Option<bool>,
    /// Bit 62 on format 000100b.
    pub in_tsx: Option<bool>,
    /// Bit 61 on format 000100b.
    pub tsx_abort: Option<bool>,
}

impl LbrFrom {
    /// Decodes `raw` in `format`.
    pub fn decode(raw: u64, format: LbrFormat) -> Self {
        let bits = format.from_ip_bits();
        let flag = |b: u32| Some((raw >> b) & 1 != 0);
        let (mispredicted, in_tsx, tsx_abort) = match format {
            LbrFormat::EipWithFlags | LbrFormat::LipWithFlagsCycles => (flag(63), None, None),
            LbrFormat::EipWithFlagsTsx => (flag(63), flag(62), flag(61)),
            _ => (None, None, None),
        };
        Self {
            ip: Ip(extend(raw & field_mask(bits), bits)),
            mispredicted,
            in_tsx,
            tsx_abort,
        }
    }

    /// Encodes into `format`; flags the format lacks must be `None`.
    pub fn encode(&self, format: LbrFormat) -> Result<u64, LbrError> {
        let mut raw = fit(self.ip, format.from_ip_bits(), format)?;
        let lacks = |what| LbrError::NotInFormat { format, what };
        for (value, bit, what) in [
            (self.mispredicted, 63, "a mispredicted flag"),
            (self.in_tsx, 62, "IN_TSX"),
            (self.tsx_abort, 61, "TSX_ABORT"),
        ] {
            let Some(on) = value else { continue };
            let has = match format {
                LbrFormat::EipWithFlags | LbrFormat::LipWithFlagsCycles => bit == 63,
                LbrFormat::EipWithFlagsTsx => true,
                _ => false,
            };
            if !has {
                return Err(lacks(what));
            }
            raw |= u64::from(on) << bit;
        }
        Ok(raw)
    }
}

/// A decoded MSR_LASTBRANCH_n_TO_IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbrTo {
    /// Destination address, sign-extended.
    pub ip: Ip,
    /// Bits 63:48 on format 000110b: core cycles since the previous LBR entry.
    pub cycles: Option<u16>,
}

impl LbrTo {
    /// Decodes `raw` in `format`.
    pub const fn decode(raw: u64, format: LbrFormat) -> Self {
        let bits = format.to_ip_bits();
        let cycles = match format {
            LbrFormat::LipWithFlagsCycles => Some((raw >> 48) as u16),
            _ => None,
        };
        Self {
            ip: Ip(extend(raw & field_mask(bits), bits)),
            cycles,
        }
    }

    /// Encodes into `format`.
    pub fn encode(&self, format: LbrFormat) -> Result<u64, LbrError> {
        let raw = fit(self.ip, format.to_ip_bits(), format)?;
        match (self.cycles, format) {
            (None, _) => Ok(raw),
            (Some(c), LbrFormat::LipWithFlagsCycles) => Ok(raw | (u64::from(c) << 48)),
            (Some(_), _) => Err(LbrError::NotInFormat {
                format,
                what: "a cycle count",
            }),
        }
    }
}

/// A decoded MSR_LBR_INFO_n (formats 000101b and 000111b).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbrInfo {
    /// Bit 63: the branch was mispredicted.
    pub mispredicted: bool,
    /// Bit 62: the branch was inside a TSX transaction.
    pub in_tsx: bool,
    /// Bit 61: the branch was a TSX abort.
    pub tsx_abort: bool,
    /// Bits 15:0: core cycles since the previous entry (saturating).
    pub cycles: u16,
}

impl LbrInfo {
    /// Decodes `raw` (reserved bits 60:16 ignored).
    pub const fn decode(raw: u64) -> Self {
        Self {
            mispredicted: (raw >> 63) & 1 != 0,
            in_tsx: (raw >> 62) & 1 != 0,
            tsx_abort: (raw >> 61) & 1 != 0,
            cycles: raw as u16,
        }
    }

    /// The raw MSR value.
    pub const fn encode(&self) -> u64 {
        ((self.mispredicted as u64) << 63)
            | ((self.in_tsx as u64) << 62)
            | ((self.tsx_abort as u64) << 61)
            | self.cycles as u64
    }
}

/// Checks a MSR_LASTBRANCH_TOS value against a stack depth and returns the
/// index of the most recent entry. The processor increments TOS, then
/// writes the entry at the new TOS (seed 003, “TOS 的工作方式”).
pub const fn tos_index(raw: u64, depth: u8) -> Result<u8, LbrError> {
    if depth == 0 || raw >= depth as u64 {
        return Err(LbrError::TosOutOfRange { tos: raw, depth });
    }
    Ok(raw as u8)
}

const LBR_FMT: &[(u64, &str)] = &[
    (0, "000000b: 32-bit record format"),
    (1, "000001b: 64-bit LIP record format"),
    (2, "000010b: 64-bit EIP record format"),
    (
        3,
        "000011b: 64-bit EIP with flags (FROM bit 63 = mispredicted)",
    ),
    (
        4,
        "000100b: 64-bit EIP with flags and TSX (FROM bits 63:61)",
    ),
    (5, "000101b: 64-bit EIP, flags and cycles in MSR_LBR_INFO_n"),
    (
        6,
        "000110b: 64-bit LIP with flags; cycle count in TO bits 63:48",
    ),
    (7, "000111b: 64-bit LIP, flags and cycles in MSR_LBR_INFO_n"),
];

/// Layout of IA32_PERF_CAPABILITIES (the fields hwtrace uses).
pub static PERF_CAPABILITIES: RegisterDef = RegisterDef {
    name: "IA32_PERF_CAPABILITIES",
    sdm: "SDM Vol. 3B §20.8 “IA32_PERF_CAPABILITIES MSR Enumeration”; LBR_FMT in §18.4.8.1",
    reserved: 0,
    width: 64,
    fields: &[
        FieldDef::field("LBR_FMT", 5, 0, FieldKind::Enum(LBR_FMT)),
        FieldDef::flag(
            "PEBS_TRAP",
            6,
            "PEBS records are trap-like (after the instruction)",
            "PEBS records are fault-like",
        ),
        FieldDef::flag(
            "PEBS_ARCH_REG",
            7,
            "PEBS saves architectural registers",
            "no architectural registers in PEBS",
        ),
        FieldDef::field("PEBS_REC_FMT", 11, 8, FieldKind::Number),
        FieldDef::flag(
            "SMM_FREEZE",
            12,
            "IA32_DEBUGCTL.FREEZE_WHILE_SMM supported",
            "no FREEZE_WHILE_SMM",
        ),
        FieldDef::flag(
            "FW_WRITE",
            13,
            "full-width counter writes (IA32_A_PMCx)",
            "no full-width writes",
        ),
        FieldDef::flag(
            "PEBS_BASELINE",
            14,
            "adaptive PEBS baseline",
            "no PEBS baseline",
        ),
        FieldDef::flag(
            "PERF_METRICS",
            15,
            "PERF_METRICS available",
            "no PERF_METRICS",
        ),
        FieldDef::flag(
            "PEBS_OUTPUT_PT",
            16,
            "PEBS output to Intel PT available",
            "no PEBS output to Intel PT",
        ),
    ],
};

const MISPRED: FieldDef = FieldDef::flag(
    "MISPRED",
    63,
    "branch was mispredicted",
    "branch was predicted",
);
const IN_TSX: FieldDef = FieldDef::flag(
    "IN_TSX",
    62,
    "inside a TSX transaction",
    "not in a transaction",
);
const TSX_ABORT: FieldDef = FieldDef::flag("TSX_ABORT", 61, "TSX abort", "not an abort");

/// FROM_IP, format 000000b.
pub static LBR_FROM_32: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_FROM_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (LBR format 000000b)",
    reserved: 0xFFFF_FFFF_0000_0000,
    width: 64,
    fields: &[FieldDef::field("FROM_IP", 31, 0, FieldKind::Address)],
};

/// FROM_IP, formats 000001b, 000010b, 000101b, 000111b.
pub static LBR_FROM_64: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_FROM_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (64-bit LBR formats without flags in FROM)",
    reserved: 0,
    width: 64,
    fields: &[FieldDef::field("FROM_IP", 63, 0, FieldKind::Address)],
};

/// FROM_IP, formats 000011b and 000110b.
pub static LBR_FROM_FLAGS: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_FROM_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (LBR formats 000011b, 000110b)",
    reserved: 0,
    width: 64,
    fields: &[
        FieldDef::field("FROM_IP", 62, 0, FieldKind::SignedAddress),
        MISPRED,
    ],
};

/// FROM_IP, format 000100b.
pub static LBR_FROM_TSX: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_FROM_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (LBR format 000100b)",
    reserved: 0,
    width: 64,
    fields: &[
        FieldDef::field("FROM_IP", 60, 0, FieldKind::SignedAddress),
        TSX_ABORT,
        IN_TSX,
        MISPRED,
    ],
};

/// TO_IP, format 000000b.
pub static LBR_TO_32: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_TO_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (LBR format 000000b)",
    reserved: 0xFFFF_FFFF_0000_0000,
    width: 64,
    fields: &[FieldDef::field("TO_IP", 31, 0, FieldKind::Address)],
};

/// TO_IP, 64-bit formats other than 000110b.
pub static LBR_TO_64: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_TO_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (64-bit LBR formats)",
    reserved: 0,
    width: 64,
    fields: &[FieldDef::field("TO_IP", 63, 0, FieldKind::Address)],
};

/// TO_IP, format 000110b.
pub static LBR_TO_CYCLES: RegisterDef = RegisterDef {
    name: "MSR_LASTBRANCH_n_TO_IP",
    sdm: "SDM Vol. 3B §18.4.8.1 (LBR format 000110b)",
    reserved: 0,
    width: 64,
    fields: &[
        FieldDef::field("TO_IP", 47, 0, FieldKind::SignedAddress),
        FieldDef::field("CYCLE_COUNT", 63, 48, FieldKind::Number),
    ],
};

/// MSR_LBR_INFO_n (formats 000101b, 000111b).
pub static LBR_INFO: RegisterDef = RegisterDef {
    name: "MSR_LBR_INFO_n",
    sdm: "SDM Vol. 3B, “LBR Stack Enhancement” (MSR_LBR_INFO_x, Skylake)",
    reserved: 0x1FFF_FFFF_FFFF_0000,
    width: 64,
    fields: &[
        FieldDef::field("CYC_CNT", 15, 0, FieldKind::Number),
        TSX_ABORT,
        IN_TSX,
        MISPRED,
    ],
};

/// MSR_LASTBRANCH_TOS for a 4-entry stack.
pub static LBR_TOS_4: RegisterDef = tos_def(&TOS_FIELDS[0], !0x3);
/// MSR_LASTBRANCH_TOS for a 16-entry stack.
pub static LBR_TOS_16: RegisterDef = tos_def(&TOS_FIELDS[1], !0xF);
/// MSR_LASTBRANCH_TOS for a 32-entry stack.
pub static LBR_TOS_32: RegisterDef = tos_def(&TOS_FIELDS[2], !0x1F);

const fn tos_def(field: &'static [FieldDef; 1], reserved: u64) -> RegisterDef {
    RegisterDef {
        name: "MSR_LASTBRANCH_TOS",
        sdm: "SDM Vol. 3B §18.4.8 “LBR Stack” (MSR_LASTBRANCH_TOS)",
        reserved,
        width: 64,
        fields: field,
    }
}

static TOS_FIELDS: [[FieldDef; 1]; 3] = [
    [FieldDef::field("TOS", 1, 0, FieldKind::Number)],
    [FieldDef::field("TOS", 3, 0, FieldKind::Number)],
    [FieldDef::field("TOS", 4, 0, FieldKind::Number)],
];

/// The TOS layout for a stack of `depth` entries (4, 16 or 32).
pub const fn tos_def_for_depth(depth: u8) -> &'static RegisterDef {
    match depth {
        0..=4 => &LBR_TOS_4,
        5..=16 => &LBR_TOS_16,
        _ => &LBR_TOS_32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: u64 = 0xFFFF_FFFF_8100_1234;

    #[test]
    fn every_format_round_trips_a_kernel_and_a_user_address() {
        for enc in 1..=7u8 {
            let f = LbrFormat::from_encoding(enc).expect("defined");
            assert_eq!(f.encoding(), enc);
            for ip in [KERNEL, 0x40_1000] {
                let from = LbrFrom::decode(LbrFrom::decode(0, f).encode(f).expect("zero fits"), f);
                let from = LbrFrom { ip: Ip(ip), ..from };
                let raw = from.encode(f).expect("canonical addresses fit");
                assert_eq!(LbrFrom::decode(raw, f), from, "{f:?}");
                let to = LbrTo {
                    ip: Ip(ip),
                    cycles: LbrTo::decode(0, f).cycles,
                };
                assert_eq!(LbrTo::decode(to.encode(f).expect("fits"), f), to, "{f:?}");
            }
        }
    }

    #[test]
    fn flags_sit_where_each_format_says() {
        let raw = (1 << 63) | (KERNEL & ((1 << 63) - 1));
        let d = LbrFrom::decode(raw, LbrFormat::EipWithFlags);
        assert_eq!(
            d,
            LbrFrom {
                ip: Ip(KERNEL),
                mispredicted: Some(true),
                in_tsx: None,
                tsx_abort: None
            }
        );
        let tsx = LbrFrom::decode((1 << 62) | 0x40_1000, LbrFormat::EipWithFlagsTsx);
        assert_eq!(tsx.in_tsx, Some(true));
        assert_eq!(tsx.tsx_abort, Some(false));
        assert_eq!(tsx.mispredicted, Some(false));
        let to = LbrTo::decode((0x1234 << 48) | 0x40_1000, LbrFormat::LipWithFlagsCycles);
        assert_eq!(
            to,
            LbrTo {
                ip: Ip(0x40_1000),
                cycles: Some(0x1234)
            }
        );
        assert_eq!(
            LbrFrom::decode(u64::MAX, LbrFormat::Bits32).ip,
            Ip(0xFFFF_FFFF)
        );
    }

    #[test]
    fn encoding_refuses_what_the_format_cannot_hold() {
        let wide = LbrFrom {
            ip: Ip(KERNEL),
            mispredicted: None,
            in_tsx: None,
            tsx_abort: None,
        };
        assert!(matches!(
            wide.encode(LbrFormat::Bits32),
            Err(LbrError::AddressDoesNotFit { bits: 32, .. })
        ));
        let noncanonical = LbrFrom {
            ip: Ip(0x4000_0000_0000_0000),
            ..wide
        };
        assert!(noncanonical.encode(LbrFormat::EipWithFlagsTsx).is_err());
        let flagged = LbrFrom {
            mispredicted: Some(true),
            ..wide
        };
        assert_eq!(
            flagged.encode(LbrFormat::Eip),
            Err(LbrError::NotInFormat {
                format: LbrFormat::Eip,
                what: "a mispredicted flag"
            })
        );
        let cyc = LbrTo {
            ip: Ip(0),
            cycles: Some(1),
        };
        assert!(cyc.encode(LbrFormat::EipWithFlagsInfo).is_err());
    }

    #[test]
    fn info_and_tos() {
        let info = LbrInfo {
            mispredicted: true,
            in_tsx: false,
            tsx_abort: true,
            cycles: 77,
        };
        assert_eq!(info.encode(), (1 << 63) | (1 << 61) | 77);
        assert_eq!(LbrInfo::decode(info.encode()), info);
        assert_eq!(
            LbrFormat::from_perf_capabilities(0x33C5),
            Ok(LbrFormat::EipWithFlagsInfo)
        );
        assert_eq!(LbrFormat::from_encoding(8), Err(LbrError::UnknownFormat(8)));
        // Seed 003: a full 16-entry stack on Westmere with TOS at entry 9.
        assert_eq!(tos_index(9, 16), Ok(9));
        assert_eq!(
            tos_index(16, 16),
            Err(LbrError::TosOutOfRange { tos: 16, depth: 16 })
        );
        assert_eq!(tos_def_for_depth(16).reserved, !0xF);
    }
}
