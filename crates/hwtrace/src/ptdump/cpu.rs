//! `--cpu f/m[/s]` and the processor errata that follow from it (the errata
//! table itself is `hwtrace_flow::errata`).
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

    /// The processor a perf.data file was recorded on, from its
    /// `HEADER_CPUID` feature (`GenuineIntel,6,85,4`: vendor, family,
    /// model, stepping, as perf writes them on x86); `None` for another
    /// vendor or form.
    pub fn from_perf_cpuid(text: &str) -> Option<Self> {
        let mut parts = text.trim_end_matches('\0').split(',');
        if parts.next()? != "GenuineIntel" {
            return None;
        }
        let mut number = || parts.next()?.trim().parse::<u64>().ok();
        let (family, model, stepping) = (number()?, number()?, number().unwrap_or(0));
        Some(Self {
            family: u16::try_from(family).ok()?,
            model: u8::try_from(model).ok()?,
            stepping: u8::try_from(stepping).ok()?,
        })
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

pub use hwtrace_flow::errata::{Errata, UnknownCpu};

impl Cpu {
    /// The errata of this processor (the table lives in `hwtrace-flow`,
    /// which applies most of them), or [`UnknownCpu`] for processors not in
    /// the table (decoding then proceeds without workarounds).
    pub fn errata(self) -> Result<Errata, UnknownCpu> {
        Errata::for_model(self.family, self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_cpuid_headers_name_intel_processors_only() {
        let cpu = |f, m, s| {
            Some(Cpu {
                family: f,
                model: m,
                stepping: s,
            })
        };
        assert_eq!(Cpu::from_perf_cpuid("GenuineIntel,6,85,4"), cpu(6, 85, 4));
        assert_eq!(
            Cpu::from_perf_cpuid("GenuineIntel,6,78,3\0\0"),
            cpu(6, 78, 3)
        );
        assert_eq!(Cpu::from_perf_cpuid("GenuineIntel,6,142"), cpu(6, 142, 0));
        assert_eq!(Cpu::from_perf_cpuid("AuthenticAMD,25,1,1"), None);
        assert_eq!(Cpu::from_perf_cpuid("GenuineIntel,6,x,1"), None);
        assert_eq!(Cpu::from_perf_cpuid("GenuineIntel,6,999,1"), None);
        assert_eq!(Cpu::from_perf_cpuid(""), None);
    }

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
        let skl = Cpu::parse("6/142").unwrap().errata().unwrap();
        assert!(skl.skl168 && !skl.skz84);
        let icx = Cpu::parse("6/106").unwrap().errata().unwrap();
        assert!(icx.skz84 && !icx.skl168);
    }

    #[test]
    fn unknown_models_are_reported() {
        assert_eq!(Cpu::parse("0/0").unwrap().errata(), Err(UnknownCpu));
        assert_eq!(Cpu::parse("6/1").unwrap().errata(), Err(UnknownCpu));
    }
}
