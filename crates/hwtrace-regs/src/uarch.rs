//! Micro-architectures whose LBR/BTS registers differ in layout or meaning.

use crate::lbr::LbrFormat;
use core::fmt;

/// A processor family with its own DEBUGCTL, LBR or LBR_SELECT behaviour
/// (SDM Vol. 3B chapters on LBR per micro-architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Uarch {
    /// Pentium 4 / Xeon (NetBurst): DEBUGCTL (MSR_DEBUGCTLA) has TR/BTS/BTINT at bits 2..=4.
    NetBurst,
    /// Intel Core 2: modern DEBUGCTL, no LBR_SELECT.
    Core2,
    /// Nehalem: LBR_SELECT whose JMP filters also drop CALLs.
    Nehalem,
    /// Westmere: as Nehalem.
    Westmere,
    /// Sandy Bridge: JMP filters fixed.
    SandyBridge,
    /// Ivy Bridge.
    IvyBridge,
    /// Haswell: TSX bits in LBR_FROM, LBR call-stack mode.
    Haswell,
    /// Broadwell.
    Broadwell,
    /// Skylake and its derivatives (Kaby/Coffee/Comet Lake): LBR_INFO.
    Skylake,
    /// Goldmont (Atom): cycle counts in LBR_TO.
    Goldmont,
    /// Goldmont Plus (Atom): LBR_INFO, linear addresses.
    GoldmontPlus,
}

/// How MSR_LBR_SELECT's JMP filters behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbrSelectSemantics {
    /// Nehalem/Westmere: NEAR_REL_JMP also drops near relative CALLs and
    /// NEAR_IND_JMP also drops near indirect CALLs.
    JmpAlsoFiltersCalls,
    /// Sandy Bridge and later: each bit filters only its own branch class.
    Enhanced,
    /// Haswell and later: as `Enhanced`, plus EN_CALLSTACK (bit 9).
    EnhancedWithCallStack,
}

const NAMES: &[(&str, Uarch)] = &[
    ("netburst", Uarch::NetBurst),
    ("pentium4", Uarch::NetBurst),
    ("p4", Uarch::NetBurst),
    ("core2", Uarch::Core2),
    ("nehalem", Uarch::Nehalem),
    ("nhm", Uarch::Nehalem),
    ("westmere", Uarch::Westmere),
    ("wsm", Uarch::Westmere),
    ("sandybridge", Uarch::SandyBridge),
    ("snb", Uarch::SandyBridge),
    ("ivybridge", Uarch::IvyBridge),
    ("ivb", Uarch::IvyBridge),
    ("haswell", Uarch::Haswell),
    ("hsw", Uarch::Haswell),
    ("broadwell", Uarch::Broadwell),
    ("bdw", Uarch::Broadwell),
    ("skylake", Uarch::Skylake),
    ("skl", Uarch::Skylake),
    ("goldmont", Uarch::Goldmont),
    ("glm", Uarch::Goldmont),
    ("goldmontplus", Uarch::GoldmontPlus),
    ("glp", Uarch::GoldmontPlus),
];

/// The name was not a known micro-architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown micro-architecture `{0}`; known: netburst, core2, nehalem, westmere, sandybridge, \
     ivybridge, haswell, broadwell, skylake, goldmont, goldmontplus"
)]
pub struct UnknownUarch(pub crate::field::FieldName);

impl Uarch {
    /// Parses a name, ignoring case, `-`, `_` and spaces ("Sandy Bridge", "snb").
    pub fn from_name(name: &str) -> Result<Self, UnknownUarch> {
        let mut buf = [0u8; 24];
        let mut len = 0;
        for b in name.bytes().filter(|b| !matches!(b, b'-' | b'_' | b' ')) {
            if len == buf.len() {
                return Err(UnknownUarch(crate::field::FieldName::new(name)));
            }
            buf[len] = b.to_ascii_lowercase();
            len += 1;
        }
        NAMES
            .iter()
            .find(|(n, _)| n.as_bytes() == &buf[..len])
            .map(|(_, u)| *u)
            .ok_or(UnknownUarch(crate::field::FieldName::new(name)))
    }

    /// The LBR record format `IA32_PERF_CAPABILITIES[5:0]` reports on this
    /// family, where it is the same for every model.
    pub const fn lbr_format(self) -> Option<LbrFormat> {
        match self {
            Self::NetBurst | Self::Core2 => None,
            Self::Nehalem | Self::Westmere | Self::SandyBridge | Self::IvyBridge => {
                Some(LbrFormat::EipWithFlags)
            }
            Self::Haswell | Self::Broadwell => Some(LbrFormat::EipWithFlagsTsx),
            Self::Skylake => Some(LbrFormat::EipWithFlagsInfo),
            Self::Goldmont => Some(LbrFormat::LipWithFlagsCycles),
            Self::GoldmontPlus => Some(LbrFormat::LipWithFlagsInfo),
        }
    }

    /// Number of LBR stack entries.
    pub const fn lbr_depth(self) -> u8 {
        match self {
            Self::Core2 => 4,
            Self::NetBurst
            | Self::Nehalem
            | Self::Westmere
            | Self::SandyBridge
            | Self::IvyBridge
            | Self::Haswell
            | Self::Broadwell => 16,
            Self::Skylake | Self::Goldmont | Self::GoldmontPlus => 32,
        }
    }

    /// MSR_LBR_SELECT semantics, or `None` where the MSR does not exist.
    pub const fn lbr_select(self) -> Option<LbrSelectSemantics> {
        match self {
            Self::NetBurst | Self::Core2 => None,
            Self::Nehalem | Self::Westmere => Some(LbrSelectSemantics::JmpAlsoFiltersCalls),
            Self::SandyBridge | Self::IvyBridge => Some(LbrSelectSemantics::Enhanced),
            Self::Haswell
            | Self::Broadwell
            | Self::Skylake
            | Self::Goldmont
            | Self::GoldmontPlus => Some(LbrSelectSemantics::EnhancedWithCallStack),
        }
    }

    /// The canonical lower-case name.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, u)| *u == self)
            .map_or("?", |(n, _)| n)
    }
}

impl fmt::Display for Uarch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_loosely_and_print_canonically() {
        assert_eq!(Uarch::from_name("Sandy Bridge"), Ok(Uarch::SandyBridge));
        assert_eq!(Uarch::from_name("WSM"), Ok(Uarch::Westmere));
        assert_eq!(Uarch::from_name("pentium-4"), Ok(Uarch::NetBurst));
        assert!(Uarch::from_name("zen4").is_err());
        assert!(Uarch::from_name(&"x".repeat(100)).is_err());
        for (_, u) in NAMES {
            assert_eq!(Uarch::from_name(u.name()), Ok(*u));
        }
    }
}
