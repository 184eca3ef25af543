//! Registers by name or number, and their values explained field by field.
//!
//! [`RegisterId::from_name`] accepts SDM names without regard to case
//! (`IA32_RTIT_CTL`, `msr_lbr_select`, `IA32_RTIT_ADDR1_B`,
//! `MSR_LASTBRANCH_5_FROM_IP`, ...); [`RegisterId::from_msr`] accepts MSR
//! numbers. [`explain`] turns a raw value into named fields with their
//! meaning, plus the reserved bits that are set; [`build`] goes the other way.
//! Where a layout depends on the processor (DEBUGCTL, MSR_LBR_SELECT, the
//! LBR records), a [`Context`] chooses it.

use crate::field::{BitRange, ComposeError, FieldDef, FieldName, Meaning, RegisterDef, compose};
use crate::lbr::LbrFormat;
use crate::uarch::Uarch;
use crate::{arch_lbr, debugctl, ds, lbr, lbr_select, msr, rtit, topa};
use core::fmt;

/// A register hwtrace can explain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RegisterId {
    /// IA32_RTIT_CTL.
    RtitCtl,
    /// IA32_RTIT_STATUS.
    RtitStatus,
    /// IA32_RTIT_OUTPUT_BASE.
    RtitOutputBase,
    /// IA32_RTIT_OUTPUT_MASK_PTRS.
    RtitOutputMaskPtrs,
    /// IA32_RTIT_CR3_MATCH.
    RtitCr3Match,
    /// IA32_RTIT_ADDRn_A.
    RtitAddrA(u8),
    /// IA32_RTIT_ADDRn_B.
    RtitAddrB(u8),
    /// IA32_DEBUGCTL (MSR_DEBUGCTLA on NetBurst).
    DebugCtl,
    /// IA32_DS_AREA.
    DsArea,
    /// IA32_PERF_CAPABILITIES.
    PerfCapabilities,
    /// MSR_LBR_SELECT.
    LbrSelect,
    /// MSR_LASTBRANCH_TOS.
    LastBranchTos,
    /// MSR_LASTBRANCH_n_FROM_IP.
    LastBranchFromIp(u8),
    /// MSR_LASTBRANCH_n_TO_IP.
    LastBranchToIp(u8),
    /// MSR_LBR_INFO_n.
    LbrInfo(u8),
    /// IA32_LBR_CTL.
    LbrCtl,
    /// IA32_LBR_DEPTH.
    LbrDepth,
    /// IA32_LBR_n_FROM_IP.
    ArchLbrFromIp(u8),
    /// IA32_LBR_n_TO_IP.
    ArchLbrToIp(u8),
    /// IA32_LBR_n_INFO.
    ArchLbrInfo(u8),
    /// A ToPA table entry (memory, not an MSR).
    TopaEntry,
}

/// Why a register cannot be found or explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExplainError {
    /// No register of that name.
    #[error(
        "no register named `{0}` (try IA32_RTIT_CTL, IA32_DEBUGCTL, MSR_LBR_SELECT, MSR_LASTBRANCH_0_FROM_IP, TOPA_ENTRY, ...)"
    )]
    UnknownName(FieldName),
    /// No register at that MSR number.
    #[error("MSR {0:#x} is not a register hwtrace knows")]
    UnknownMsr(u32),
    /// The LBR record layout needs the LBR format.
    #[error(
        "{0} depends on the LBR format: give a micro-architecture or the IA32_PERF_CAPABILITIES LBR format"
    )]
    NeedsLbrFormat(RegisterId),
    /// The register does not exist on this micro-architecture.
    #[error("{register} does not exist on {uarch}")]
    NotOnUarch {
        /// The register.
        register: RegisterId,
        /// The micro-architecture.
        uarch: Uarch,
    },
    /// MSR_LBR_INFO_n with a format that has no such MSR.
    #[error(
        "LBR format {0:?} has no MSR_LBR_INFO_n registers (only formats 000101b and 000111b do)"
    )]
    NoInfoMsr(LbrFormat),
}

/// Processor details that choose between layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    /// The micro-architecture, if known.
    pub uarch: Option<Uarch>,
    /// The LBR format (`IA32_PERF_CAPABILITIES[5:0]`); overrides the one `uarch` implies.
    pub lbr_format: Option<LbrFormat>,
}

const PLAIN: &[(&str, RegisterId)] = &[
    ("IA32_RTIT_CTL", RegisterId::RtitCtl),
    ("IA32_RTIT_STATUS", RegisterId::RtitStatus),
    ("IA32_RTIT_OUTPUT_BASE", RegisterId::RtitOutputBase),
    ("IA32_RTIT_OUTPUT_MASK_PTRS", RegisterId::RtitOutputMaskPtrs),
    ("IA32_RTIT_CR3_MATCH", RegisterId::RtitCr3Match),
    ("IA32_DEBUGCTL", RegisterId::DebugCtl),
    ("MSR_DEBUGCTLA", RegisterId::DebugCtl),
    ("IA32_DS_AREA", RegisterId::DsArea),
    ("IA32_PERF_CAPABILITIES", RegisterId::PerfCapabilities),
    ("MSR_LBR_SELECT", RegisterId::LbrSelect),
    ("MSR_LASTBRANCH_TOS", RegisterId::LastBranchTos),
    ("IA32_LBR_CTL", RegisterId::LbrCtl),
    ("IA32_LBR_DEPTH", RegisterId::LbrDepth),
    ("TOPA_ENTRY", RegisterId::TopaEntry),
];

type Indexed = (&'static str, &'static str, u8, fn(u8) -> RegisterId);

const INDEXED: &[Indexed] = &[
    (
        "IA32_RTIT_ADDR",
        "_A",
        msr::RTIT_MAX_ADDR_RANGES,
        RegisterId::RtitAddrA,
    ),
    (
        "IA32_RTIT_ADDR",
        "_B",
        msr::RTIT_MAX_ADDR_RANGES,
        RegisterId::RtitAddrB,
    ),
    (
        "MSR_LASTBRANCH_",
        "_FROM_IP",
        msr::LBR_MAX_ENTRIES,
        RegisterId::LastBranchFromIp,
    ),
    (
        "MSR_LASTBRANCH_",
        "_TO_IP",
        msr::LBR_MAX_ENTRIES,
        RegisterId::LastBranchToIp,
    ),
    (
        "MSR_LBR_INFO_",
        "",
        msr::LBR_MAX_ENTRIES,
        RegisterId::LbrInfo,
    ),
    (
        "IA32_LBR_",
        "_FROM_IP",
        msr::ARCH_LBR_MAX_ENTRIES,
        RegisterId::ArchLbrFromIp,
    ),
    (
        "IA32_LBR_",
        "_TO_IP",
        msr::ARCH_LBR_MAX_ENTRIES,
        RegisterId::ArchLbrToIp,
    ),
    (
        "IA32_LBR_",
        "_INFO",
        msr::ARCH_LBR_MAX_ENTRIES,
        RegisterId::ArchLbrInfo,
    ),
];

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

fn strip_suffix_ci<'a>(s: &'a str, suffix: &str) -> Option<&'a str> {
    let cut = s.len().checked_sub(suffix.len())?;
    let tail = s.get(cut..)?;
    tail.eq_ignore_ascii_case(suffix).then(|| &s[..cut])
}

impl RegisterId {
    /// Every register, with index 0 for the indexed ones (for listings and tests).
    pub const ALL: [RegisterId; 21] = [
        Self::RtitCtl,
        Self::RtitStatus,
        Self::RtitOutputBase,
        Self::RtitOutputMaskPtrs,
        Self::RtitCr3Match,
        Self::RtitAddrA(0),
        Self::RtitAddrB(0),
        Self::DebugCtl,
        Self::DsArea,
        Self::PerfCapabilities,
        Self::LbrSelect,
        Self::LastBranchTos,
        Self::LastBranchFromIp(0),
        Self::LastBranchToIp(0),
        Self::LbrInfo(0),
        Self::LbrCtl,
        Self::LbrDepth,
        Self::ArchLbrFromIp(0),
        Self::ArchLbrToIp(0),
        Self::ArchLbrInfo(0),
        Self::TopaEntry,
    ];

    /// Looks a register up by SDM name, ignoring case.
    pub fn from_name(name: &str) -> Result<Self, ExplainError> {
        let name = name.trim();
        if let Some((_, id)) = PLAIN.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) {
            return Ok(*id);
        }
        for (prefix, suffix, limit, make) in INDEXED {
            let index = strip_prefix_ci(name, prefix)
                .and_then(|rest| strip_suffix_ci(rest, suffix))
                .filter(|digits| {
                    !digits.is_empty()
                        && digits.len() <= 2
                        && digits.bytes().all(|b| b.is_ascii_digit())
                })
                .and_then(|digits| digits.parse::<u8>().ok());
            if let Some(n) = index.filter(|n| n < limit) {
                return Ok(make(n));
            }
        }
        Err(ExplainError::UnknownName(FieldName::new(name)))
    }

    /// Looks a register up by MSR number.
    pub fn from_msr(number: u32) -> Result<Self, ExplainError> {
        let in_block = |base: u32, count: u8| {
            number
                .checked_sub(base)
                .filter(|d| *d < u32::from(count))
                .map(|d| d as u8)
        };
        Ok(match number {
            msr::IA32_RTIT_CTL => Self::RtitCtl,
            msr::IA32_RTIT_STATUS => Self::RtitStatus,
            msr::IA32_RTIT_OUTPUT_BASE => Self::RtitOutputBase,
            msr::IA32_RTIT_OUTPUT_MASK_PTRS => Self::RtitOutputMaskPtrs,
            msr::IA32_RTIT_CR3_MATCH => Self::RtitCr3Match,
            msr::IA32_DEBUGCTL => Self::DebugCtl,
            msr::IA32_DS_AREA => Self::DsArea,
            msr::IA32_PERF_CAPABILITIES => Self::PerfCapabilities,
            msr::MSR_LBR_SELECT => Self::LbrSelect,
            msr::MSR_LASTBRANCH_TOS => Self::LastBranchTos,
            msr::IA32_LBR_CTL => Self::LbrCtl,
            msr::IA32_LBR_DEPTH => Self::LbrDepth,
            _ => {
                if let Some(d) = in_block(msr::IA32_RTIT_ADDR0_A, 2 * msr::RTIT_MAX_ADDR_RANGES) {
                    if d % 2 == 0 {
                        Self::RtitAddrA(d / 2)
                    } else {
                        Self::RtitAddrB(d / 2)
                    }
                } else if let Some(n) =
                    in_block(msr::MSR_LASTBRANCH_0_FROM_IP, msr::LBR_MAX_ENTRIES)
                {
                    Self::LastBranchFromIp(n)
                } else if let Some(n) = in_block(msr::MSR_LASTBRANCH_0_TO_IP, msr::LBR_MAX_ENTRIES)
                {
                    Self::LastBranchToIp(n)
                } else if let Some(n) = in_block(msr::MSR_LBR_INFO_0, msr::LBR_MAX_ENTRIES) {
                    Self::LbrInfo(n)
                } else if let Some(n) = in_block(msr::IA32_LBR_0_FROM_IP, msr::ARCH_LBR_MAX_ENTRIES)
                {
                    Self::ArchLbrFromIp(n)
                } else if let Some(n) = in_block(msr::IA32_LBR_0_TO_IP, msr::ARCH_LBR_MAX_ENTRIES) {
                    Self::ArchLbrToIp(n)
                } else if let Some(n) = in_block(msr::IA32_LBR_0_INFO, msr::ARCH_LBR_MAX_ENTRIES) {
                    Self::ArchLbrInfo(n)
                } else {
                    return Err(ExplainError::UnknownMsr(number));
                }
            }
        })
    }

    /// Looks up a name, or a number written in hex (`0x570`, `570h`) or decimal.
    pub fn parse(s: &str) -> Result<Self, ExplainError> {
        match parse_number(s) {
            Some(n) => u32::try_from(n)
                .map_err(|_| ExplainError::UnknownName(FieldName::new(s)))
                .and_then(Self::from_msr),
            None => Self::from_name(s),
        }
    }

    /// The MSR number; `None` for memory structures.
    pub const fn msr(self) -> Option<u32> {
        Some(match self {
            Self::RtitCtl => msr::IA32_RTIT_CTL,
            Self::RtitStatus => msr::IA32_RTIT_STATUS,
            Self::RtitOutputBase => msr::IA32_RTIT_OUTPUT_BASE,
            Self::RtitOutputMaskPtrs => msr::IA32_RTIT_OUTPUT_MASK_PTRS,
            Self::RtitCr3Match => msr::IA32_RTIT_CR3_MATCH,
            Self::RtitAddrA(n) => msr::IA32_RTIT_ADDR0_A + 2 * n as u32,
            Self::RtitAddrB(n) => msr::IA32_RTIT_ADDR0_A + 2 * n as u32 + 1,
            Self::DebugCtl => msr::IA32_DEBUGCTL,
            Self::DsArea => msr::IA32_DS_AREA,
            Self::PerfCapabilities => msr::IA32_PERF_CAPABILITIES,
            Self::LbrSelect => msr::MSR_LBR_SELECT,
            Self::LastBranchTos => msr::MSR_LASTBRANCH_TOS,
            Self::LastBranchFromIp(n) => msr::MSR_LASTBRANCH_0_FROM_IP + n as u32,
            Self::LastBranchToIp(n) => msr::MSR_LASTBRANCH_0_TO_IP + n as u32,
            Self::LbrInfo(n) => msr::MSR_LBR_INFO_0 + n as u32,
            Self::LbrCtl => msr::IA32_LBR_CTL,
            Self::LbrDepth => msr::IA32_LBR_DEPTH,
            Self::ArchLbrFromIp(n) => msr::IA32_LBR_0_FROM_IP + n as u32,
            Self::ArchLbrToIp(n) => msr::IA32_LBR_0_TO_IP + n as u32,
            Self::ArchLbrInfo(n) => msr::IA32_LBR_0_INFO + n as u32,
            Self::TopaEntry => return None,
        })
    }

    /// The layout of this register under `ctx`.
    pub fn def(self, ctx: &Context) -> Result<&'static RegisterDef, ExplainError> {
        let format = || {
            ctx.lbr_format
                .or_else(|| ctx.uarch.and_then(Uarch::lbr_format))
        };
        Ok(match self {
            Self::RtitCtl => &rtit::RTIT_CTL,
            Self::RtitStatus => &rtit::RTIT_STATUS,
            Self::RtitOutputBase => &rtit::RTIT_OUTPUT_BASE,
            Self::RtitOutputMaskPtrs => &rtit::RTIT_OUTPUT_MASK_PTRS,
            Self::RtitCr3Match => &rtit::RTIT_CR3_MATCH,
            Self::RtitAddrA(_) | Self::RtitAddrB(_) => &rtit::RTIT_ADDR,
            Self::DebugCtl => match ctx.uarch {
                Some(Uarch::NetBurst) => &debugctl::DEBUGCTL_NETBURST,
                _ => &debugctl::DEBUGCTL_MODERN,
            },
            Self::DsArea => &ds::DS_AREA,
            Self::PerfCapabilities => &lbr::PERF_CAPABILITIES,
            Self::LbrSelect => match ctx.uarch {
                None => &lbr_select::LBR_SELECT_HASWELL,
                Some(u) => {
                    lbr_select::semantics_def(u.lbr_select().ok_or(ExplainError::NotOnUarch {
                        register: self,
                        uarch: u,
                    })?)
                }
            },
            Self::LastBranchTos => lbr::tos_def_for_depth(ctx.uarch.map_or(32, Uarch::lbr_depth)),
            Self::LastBranchFromIp(_) => format()
                .ok_or(ExplainError::NeedsLbrFormat(self))?
                .from_def(),
            Self::LastBranchToIp(_) => format().ok_or(ExplainError::NeedsLbrFormat(self))?.to_def(),
            Self::LbrInfo(_) => match format() {
                Some(f) if !f.has_info_msr() => return Err(ExplainError::NoInfoMsr(f)),
                _ => &lbr::LBR_INFO,
            },
            Self::LbrCtl => &arch_lbr::LBR_CTL,
            Self::LbrDepth => &arch_lbr::LBR_DEPTH,
            Self::ArchLbrFromIp(_) => &lbr::LBR_FROM_64,
            Self::ArchLbrToIp(_) => &lbr::LBR_TO_64,
            Self::ArchLbrInfo(_) => &arch_lbr::ARCH_LBR_INFO,
            Self::TopaEntry => &topa::TOPA_ENTRY,
        })
    }
}

impl fmt::Display for RegisterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::RtitAddrA(n) => write!(f, "IA32_RTIT_ADDR{n}_A"),
            Self::RtitAddrB(n) => write!(f, "IA32_RTIT_ADDR{n}_B"),
            Self::LastBranchFromIp(n) => write!(f, "MSR_LASTBRANCH_{n}_FROM_IP"),
            Self::LastBranchToIp(n) => write!(f, "MSR_LASTBRANCH_{n}_TO_IP"),
            Self::LbrInfo(n) => write!(f, "MSR_LBR_INFO_{n}"),
            Self::ArchLbrFromIp(n) => write!(f, "IA32_LBR_{n}_FROM_IP"),
            Self::ArchLbrToIp(n) => write!(f, "IA32_LBR_{n}_TO_IP"),
            Self::ArchLbrInfo(n) => write!(f, "IA32_LBR_{n}_INFO"),
            Self::DebugCtl => f.write_str("IA32_DEBUGCTL"),
            other => {
                let name = PLAIN
                    .iter()
                    .find(|(_, id)| *id == other)
                    .map_or("?", |(n, _)| n);
                f.write_str(name)
            }
        }
    }
}

/// Parses `0x1c4`, `1C4h` or `452`; `None` if it is not a number.
pub fn parse_number(s: &str) -> Option<u64> {
    let s = s.trim();
    let cleaned = |t: &str| -> Option<u64> {
        let mut v: u64 = 0;
        let mut any = false;
        for c in t.chars().filter(|c| *c != '_') {
            v = v.checked_mul(16)?.checked_add(u64::from(c.to_digit(16)?))?;
            any = true;
        }
        any.then_some(v)
    };
    if let Some(hex) = strip_prefix_ci(s, "0x") {
        return cleaned(hex);
    }
    if let Some(hex) = strip_suffix_ci(s, "h")
        && hex.chars().next().is_some_and(|c| c.is_ascii_digit())
    {
        return cleaned(hex);
    }
    if s.chars().all(|c| c.is_ascii_digit() || c == '_') && s.chars().any(|c| c.is_ascii_digit()) {
        return s.chars().filter(|c| *c != '_').try_fold(0u64, |v, c| {
            v.checked_mul(10)?.checked_add(u64::from(c.to_digit(10)?))
        });
    }
    None
}

/// One field of an explained value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExplainedField {
    /// The SDM name.
    pub name: &'static str,
    /// Where it lives.
    pub bits: BitRange,
    /// Its value (shifted down; addresses in place).
    pub value: u64,
    /// What the value means.
    pub meaning: Meaning,
}

/// A raw value read through a register layout.
#[derive(Debug, Clone, Copy)]
pub struct Explanation {
    /// The layout used.
    pub def: &'static RegisterDef,
    /// The raw value.
    pub raw: u64,
}

impl Explanation {
    /// Explains `raw` with layout `def`.
    pub const fn new(def: &'static RegisterDef, raw: u64) -> Self {
        Self { def, raw }
    }

    /// Every named field, lowest bit first.
    pub fn fields(&self) -> impl Iterator<Item = ExplainedField> + '_ {
        self.def.fields.iter().map(|f: &FieldDef| {
            let value = f.value(self.raw);
            ExplainedField {
                name: f.name,
                bits: f.bits,
                value,
                meaning: f.meaning(value),
            }
        })
    }

    /// Reserved bits (or bits beyond the register width) that are set.
    pub const fn reserved_set(&self) -> u64 {
        self.def.reserved_set(self.raw)
    }

    /// The set reserved bits as contiguous ranges, lowest first.
    pub fn reserved_ranges(&self) -> impl Iterator<Item = BitRange> {
        let mut rest = self.reserved_set();
        core::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let lo = rest.trailing_zeros();
            let run = (rest >> lo).trailing_ones();
            let hi = lo + run - 1;
            rest &= !BitRange::new(hi as u8, lo as u8).mask();
            Some(BitRange::new(hi as u8, lo as u8))
        })
    }
}

/// Explains `raw` as register `id` under `ctx`.
pub fn explain(id: RegisterId, raw: u64, ctx: &Context) -> Result<Explanation, ExplainError> {
    Ok(Explanation::new(id.def(ctx)?, raw))
}

/// Why [`build`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The register could not be resolved.
    #[error(transparent)]
    Register(#[from] ExplainError),
    /// A field setting was refused.
    #[error(transparent)]
    Field(#[from] ComposeError),
}

/// Composes a value of register `id` from named field values, starting at 0.
pub fn build<'a, I>(id: RegisterId, ctx: &Context, settings: I) -> Result<u64, BuildError>
where
    I: IntoIterator<Item = (&'a str, u64)>,
{
    Ok(compose(id.def(ctx)?, 0, settings)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_resolve_both_ways() {
        for id in RegisterId::ALL {
            let name = format!("{id}");
            assert_eq!(RegisterId::from_name(&name), Ok(id), "{name}");
            assert_eq!(
                RegisterId::from_name(&name.to_ascii_lowercase()),
                Ok(id),
                "{name}"
            );
            if let Some(n) = id.msr() {
                assert_eq!(RegisterId::from_msr(n), Ok(id), "{name}");
            }
        }
        assert_eq!(RegisterId::parse("0x583"), Ok(RegisterId::RtitAddrB(1)));
        assert_eq!(RegisterId::parse("1C8h"), Ok(RegisterId::LbrSelect));
        assert_eq!(
            RegisterId::parse("msr_lastbranch_15_to_ip"),
            Ok(RegisterId::LastBranchToIp(15))
        );
        assert_eq!(
            RegisterId::parse("IA32_LBR_63_INFO"),
            Ok(RegisterId::ArchLbrInfo(63))
        );
        assert!(RegisterId::parse("IA32_RTIT_ADDR4_A").is_err());
        assert!(RegisterId::parse("IA32_LBR__FROM_IP").is_err());
        assert!(RegisterId::parse("0x570000000000").is_err());
        assert_eq!(
            RegisterId::parse("0x10"),
            Err(ExplainError::UnknownMsr(0x10))
        );
    }

    #[test]
    fn numbers_parse_in_every_spelling() {
        assert_eq!(parse_number("0x2500"), Some(0x2500));
        assert_eq!(parse_number("2500h"), Some(0x2500));
        assert_eq!(parse_number("9_472"), Some(9472));
        assert_eq!(parse_number("0xFFFF_FFFF_FFFF_FFFF"), Some(u64::MAX));
        assert_eq!(parse_number("0x1_0000_0000_0000_0000"), None);
        assert_eq!(parse_number("MSR_LBR_SELECT"), None);
        assert_eq!(parse_number("h"), None);
        assert_eq!(parse_number("0x"), None);
    }

    /// The example: `hwtrace msr explain IA32_RTIT_CTL 0x2500`
    /// = BranchEn | TSCEn | ToPA.
    #[test]
    fn rtit_ctl_0x2500() {
        let e = explain(RegisterId::RtitCtl, 0x2500, &Context::default()).expect("known");
        let set: std::vec::Vec<_> = e
            .fields()
            .filter(|f| f.value != 0)
            .map(|f| f.name)
            .collect();
        assert_eq!(set, ["ToPA", "TSCEn", "BranchEn"]);
        assert_eq!(e.reserved_set(), 0);
    }

    #[test]
    fn reserved_ranges_are_grouped() {
        let e = explain(
            RegisterId::RtitCtl,
            (1 << 18) | (0b111 << 28) | (1 << 63),
            &Context::default(),
        )
        .expect("known");
        let r: std::vec::Vec<_> = e.reserved_ranges().collect();
        assert_eq!(
            r,
            [BitRange::bit(18), BitRange::new(30, 28), BitRange::bit(63)]
        );
    }

    #[test]
    fn context_chooses_the_layout() {
        let wsm = Context {
            uarch: Some(Uarch::Westmere),
            lbr_format: None,
        };
        let nb = Context {
            uarch: Some(Uarch::NetBurst),
            lbr_format: None,
        };
        assert_eq!(
            RegisterId::LbrSelect.def(&wsm).map(|d| d.sdm),
            Ok(lbr_select::LBR_SELECT_NEHALEM.sdm)
        );
        assert!(matches!(
            RegisterId::LbrSelect.def(&nb),
            Err(ExplainError::NotOnUarch { .. })
        ));
        assert_eq!(RegisterId::DebugCtl.def(&nb).map(|d| d.reserved), Ok(!0x7F));
        assert_eq!(
            RegisterId::LastBranchFromIp(0)
                .def(&Context::default())
                .err(),
            Some(ExplainError::NeedsLbrFormat(RegisterId::LastBranchFromIp(
                0
            )))
        );
        assert!(RegisterId::LastBranchFromIp(0).def(&wsm).is_ok());
        assert_eq!(
            RegisterId::LbrInfo(0).def(&wsm).err(),
            Some(ExplainError::NoInfoMsr(LbrFormat::EipWithFlags))
        );
        let quirk = explain(RegisterId::LbrSelect, 0x40, &wsm).expect("Westmere has LBR_SELECT");
        let jmp = quirk
            .fields()
            .find(|f| f.name == "NEAR_IND_JMP")
            .expect("field");
        assert!(format!("{}", jmp.meaning).contains("also drops near indirect CALLs"));
    }

    #[test]
    fn build_composes_by_name_and_refuses_bad_fields() {
        let ctx = Context::default();
        let v = build(RegisterId::RtitCtl, &ctx, [("TraceEnable", 1)]);
        assert_eq!(
            v,
            Err(BuildError::Field(ComposeError::UnknownField {
                register: "IA32_RTIT_CTL",
                field: FieldName::new("TraceEnable")
            }))
        );
        let v = build(
            RegisterId::RtitCtl,
            &ctx,
            [("traceen", 1), ("BranchEn", 1), ("mtcfreq", 3)],
        );
        assert_eq!(v, Ok(0x2001 | (3 << 14)));
        assert!(matches!(
            build(RegisterId::RtitCtl, &ctx, [("ADDR0_CFG", 3)]),
            Err(BuildError::Field(ComposeError::ReservedEncoding { .. }))
        ));
        assert!(matches!(
            build(RegisterId::TopaEntry, &ctx, [("OutputRegionBase", 0x1234)]),
            Err(BuildError::Field(
                ComposeError::AddressNotRepresentable { .. }
            ))
        ));
        let from = build(
            RegisterId::LastBranchFromIp(3),
            &Context {
                lbr_format: Some(LbrFormat::EipWithFlags),
                uarch: None,
            },
            [("FROM_IP", 0xFFFF_FFFF_8100_0000), ("MISPRED", 1)],
        );
        assert_eq!(from, Ok(0xFFFF_FFFF_8100_0000));
    }
}
