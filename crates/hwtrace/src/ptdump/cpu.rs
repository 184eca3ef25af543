//! `--cpu f/m[/s]` and the processor errata that follow from it.
//!
//! The table says which documented Intel PT errata a family/model has, as
//! Intel's reference decoder (libipt) knows them, so that decoding with
//! `--cpu` applies the same workarounds. Only SKZ84 (packet layer) and
//! SKL168 (timing) change what ptdump prints; the others matter to the
//! flow decoders and are kept here so the table is complete.

use std::fmt;

/// A processor as `--cpu` names it (all Intel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    /// The display family (CPUID.1:EAX family + extended family).
    pub family: u16,
    /// The display model (model + extended model << 4).
    pub model: u8,
    /// The stepping (not used by the errata table).
    pub stepping: u8,
}

/// `--cpu` value that is not `f/m[/s]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCpu;

impl fmt::Display for BadCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cpu must be specified as f/m[/s]")
    }
}

impl std::error::Error for BadCpu {}

impl Cpu {
    /// Parses `family/model[/stepping]`; each number in C notation
    /// (decimal, `0x` hex or leading-zero octal).
    pub fn parse(text: &str) -> Result<Self, BadCpu> {
        let mut parts = text.split('/');
        let family = parts.next().and_then(super::options::parse_c_number);
        let model = parts.next().and_then(super::options::parse_c_number);
        let stepping = match parts.next() {
            None => Some(0),
            Some(s) => super::options::parse_c_number(s),
        };
        if parts.next().is_some() {
            return Err(BadCpu);
        }
        match (family, model, stepping) {
            (Some(f), Some(m), Some(s)) => Ok(Self {
                family: u16::try_from(f).map_err(|_| BadCpu)?,
                model: u8::try_from(m).map_err(|_| BadCpu)?,
                stepping: u8::try_from(s).map_err(|_| BadCpu)?,
            }),
            _ => Err(BadCpu),
        }
    }

    /// The processor this program runs on, from `/proc/cpuinfo`.
    pub fn current() -> Option<Self> {
        let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let field = |name: &str| -> Option<u64> {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split(':').nth(1))
                .and_then(|v| v.trim().parse().ok())
        };
        if !info.contains("GenuineIntel") {
            return None;
        }
        Some(Self {
            family: u16::try_from(field("cpu family")?).ok()?,
            model: u8::try_from(field("model")?).ok()?,
            stepping: u8::try_from(field("stepping")?).ok()?,
        })
    }
}

/// The Intel PT errata a processor has (names from Intel's specification
/// updates).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Errata {
    /// BDM70: PSB+ may contain FUP/MODE.Exec before a TIP.PGE.
    pub bdm70: bool,
    /// BDM64: a TSX abort may report a wrong branch.
    pub bdm64: bool,
    /// SKD007: a PSB+ may contain a spurious OVF.
    pub skd007: bool,
    /// SKD022: VM entry after a VMCS packet may lose a TIP.PGD.
    pub skd022: bool,
    /// SKD010: FUP/TIP may be missing after an IP filter match.
    pub skd010: bool,
    /// SKL014: a FUP may be missing before an IP filter disable.
    pub skl014: bool,
    /// APL12: PSB+ after OVF may come without FUP.
    pub apl12: bool,
    /// APL11: PT may report a wrong IP after OVF.
    pub apl11: bool,
    /// SKL168: CYC packets right before a PSB may be dropped.
    pub skl168: bool,
    /// SKZ84: TSC scaling/offsetting may corrupt TMA packets.
    pub skz84: bool,
}

/// The family/model has no errata entry: libipt reports "unknown cpu".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownCpu;

impl fmt::Display for UnknownCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown cpu")
    }
}

impl std::error::Error for UnknownCpu {}

impl Errata {
    /// The errata of `cpu`, or [`UnknownCpu`] for processors not in the
    /// table (decoding then proceeds without workarounds).
    pub fn for_cpu(cpu: Cpu) -> Result<Self, UnknownCpu> {
        let none = Self::default();
        // Groups of models sharing one set of errata.
        let broadwell = Self {
            bdm70: true,
            bdm64: true,
            ..none
        };
        let skylake = Self {
            bdm70: true,
            skd007: true,
            skd022: true,
            skd010: true,
            skl014: true,
            skl168: true,
            ..none
        };
        let server = Self {
            bdm70: true,
            skl014: true,
            skd022: true,
            skz84: true,
            ..none
        };
        let client = Self {
            bdm70: true,
            skl014: true,
            skd022: true,
            ..none
        };
        let hybrid = Self {
            apl11: true,
            ..client
        };
        let goldmont = Self {
            apl12: true,
            apl11: true,
            ..none
        };
        let atom = Self {
            apl11: true,
            ..none
        };

        match (cpu.family, cpu.model) {
            (0x6, 0x3d | 0x47 | 0x4f | 0x56) => Ok(broadwell),
            (0x6, 0x4e | 0x5e | 0x8e | 0x9e | 0xa5 | 0xa6) => Ok(skylake),
            (0x6, 0x55 | 0x6a | 0x6c | 0x8f | 0xad | 0xae | 0xcf) => Ok(server),
            (0x6, 0x66 | 0x7d | 0x7e | 0x8c | 0x8d | 0xa7 | 0xa8) => Ok(client),
            (
                0x6,
                0x97 | 0x9a | 0xbf | 0xb7 | 0xb5 | 0xaa | 0xac | 0xba | 0xcc | 0xbd | 0xc5 | 0xc6
                | 0xd5,
            ) => Ok(hybrid),
            (0x6, 0x5c | 0x5f) => Ok(goldmont),
            (0x6, 0x7a | 0x86 | 0x96 | 0x9c | 0xb6 | 0xaf | 0xdd) => Ok(atom),
            (0x12, 0x01 | 0x03) => Ok(hybrid),
            (0x13, 0x01) => Ok(server),
            _ => Err(UnknownCpu),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_family_model_stepping() {
        assert_eq!(
            Cpu::parse("6/142"),
            Ok(Cpu {
                family: 6,
                model: 142,
                stepping: 0
            })
        );
        assert_eq!(
            Cpu::parse("0x6/0x8e/3"),
            Ok(Cpu {
                family: 6,
                model: 0x8e,
                stepping: 3
            })
        );
        assert_eq!(Cpu::parse("6"), Err(BadCpu));
        assert_eq!(Cpu::parse("6/x"), Err(BadCpu));
        assert_eq!(Cpu::parse("6/300"), Err(BadCpu));
        assert_eq!(Cpu::parse("6/1/2/3"), Err(BadCpu));
    }

    #[test]
    fn skylake_has_skl168_and_server_skz84() {
        let skl = Errata::for_cpu(Cpu::parse("6/142").unwrap()).unwrap();
        assert!(skl.skl168 && !skl.skz84);
        let icx = Errata::for_cpu(Cpu::parse("6/106").unwrap()).unwrap();
        assert!(icx.skz84 && !icx.skl168);
    }

    #[test]
    fn unknown_models_are_reported() {
        assert_eq!(Errata::for_cpu(Cpu::parse("0/0").unwrap()), Err(UnknownCpu));
        assert_eq!(Errata::for_cpu(Cpu::parse("6/1").unwrap()), Err(UnknownCpu));
    }
}
