//! A complete Intel PT configuration (IA32_RTIT_CTL, the output MSRs and the
//! filter MSRs) checked against CPUID leaf 14H, the way WRMSR and TraceEn=1
//! would check it, plus a builder that composes one from intentions.
//!
//! The rules come from SDM Vol. 3C §33.2.8.2 (IA32_RTIT_CTL), §33.3.1 (CPUID
//! leaf 14H: each capability bit says which fields #GP without it) and
//! §33.2.7 (output: operational errors on enable).

use crate::cpuid::PtCaps;
use crate::field::ComposeError;
use crate::output::{OutputError, SingleRange, TopaPosition};
use crate::rtit::{AddrCfg, RtitAddr, RtitCr3Match, RtitCtl, RtitOutputBase, RtitOutputMaskPtrs};
use hwtrace_types::{Cr3, Ip, PhysAddr};

/// Why a configuration is refused: each Display says what the processor
/// would do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PtConfigError {
    /// Reserved bits set.
    #[error("{register} has reserved bits {bits:#x} set: WRMSR raises #GP")]
    ReservedBits {
        /// The register.
        register: &'static str,
        /// The offending bits.
        bits: u64,
    },
    /// A field used without the CPUID capability that makes it writable.
    #[error("{field} is set but this processor lacks {capability}: WRMSR raises #GP")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// The missing capability and its CPUID bit.
        capability: &'static str,
    },
    /// ADDRn_CFG with a reserved encoding.
    #[error(
        "ADDR{range}_CFG = {value} is reserved (only 0 unused, 1 FilterEn, 2 TraceStop exist): WRMSR raises #GP"
    )]
    AddrCfgReserved {
        /// The range.
        range: u8,
        /// The encoding.
        value: u8,
    },
    /// ADDRn_CFG for a range CPUID does not report.
    #[error(
        "ADDR{range}_CFG is used but CPUID.(EAX=14H,ECX=1):EAX[2:0] reports only {available} \
         address range(s): WRMSR raises #GP"
    )]
    AddressRangeNotAvailable {
        /// The range.
        range: u8,
        /// Ranges the processor has.
        available: u8,
    },
    /// An ADDRn_A/B value that is not canonical.
    #[error(
        "IA32_RTIT_ADDR{range}_{which} = {value:#x} is not canonical (bits 63:48 must copy bit 47): WRMSR raises #GP"
    )]
    NonCanonical {
        /// The range.
        range: u8,
        /// `'A'` or `'B'`.
        which: char,
        /// The value.
        value: u64,
    },
    /// ADDRn_A above ADDRn_B: the range matches nothing.
    #[error(
        "IP range {range} starts at {a} above its end {b}: it can never match, so the filter silently traces nothing"
    )]
    RangeInverted {
        /// The range.
        range: u8,
        /// ADDRn_A.
        a: Ip,
        /// ADDRn_B.
        b: Ip,
    },
    /// A frequency or threshold encoding not in its CPUID bitmap.
    #[error(
        "{field} = {value} is not in the supported bitmap {bitmap:#06x} from {cpuid}: \
         the processor raises #GP"
    )]
    NotInBitmap {
        /// The field.
        field: &'static str,
        /// The encoding.
        value: u64,
        /// The bitmap.
        bitmap: u16,
        /// The CPUID bits holding the bitmap.
        cpuid: &'static str,
    },
    /// BranchEn=0 on a processor that cannot suppress COFI packets.
    #[error(
        "BranchEn = 0 with TraceEn = 1 needs COFI suppression (CPUID.(EAX=14H,ECX=0):EBX[3]); \
         this processor requires BranchEn = 1"
    )]
    BranchEnRequired,
    /// An address at or above MAXPHYADDR.
    #[error(
        "{register} = {value:#x} has bits at or above MAXPHYADDR ({max_phys_addr}): WRMSR raises #GP"
    )]
    BeyondMaxPhysAddr {
        /// The register.
        register: &'static str,
        /// The value.
        value: u64,
        /// MAXPHYADDR.
        max_phys_addr: u8,
    },
    /// The output MSRs describe an output the processor would refuse.
    #[error("output configuration")]
    Output(#[from] OutputError),
    /// A field value that does not fit its field.
    #[error(transparent)]
    Field(#[from] ComposeError),
    /// A builder argument out of range.
    #[error("IP range index {0} does not exist (the architecture has ranges 0 to 3)")]
    NoSuchRange(u8),
}

/// Every Intel PT MSR a driver writes before setting TraceEn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PtConfig {
    /// IA32_RTIT_CTL.
    pub ctl: RtitCtl,
    /// IA32_RTIT_OUTPUT_BASE.
    pub output_base: RtitOutputBase,
    /// IA32_RTIT_OUTPUT_MASK_PTRS.
    pub output_mask_ptrs: RtitOutputMaskPtrs,
    /// IA32_RTIT_CR3_MATCH.
    pub cr3_match: RtitCr3Match,
    /// IA32_RTIT_ADDRn_A and IA32_RTIT_ADDRn_B, n = 0..=3.
    pub addr: [(RtitAddr, RtitAddr); 4],
}

impl PtConfig {
    /// Checks every MSR against `caps` and MAXPHYADDR, in the order the
    /// processor would meet them: WRMSR faults first, then enable-time
    /// operational errors.
    pub fn validate(&self, caps: &PtCaps, max_phys_addr: u8) -> Result<(), PtConfigError> {
        let ctl = self.ctl;
        if ctl.reserved_set() != 0 {
            return Err(PtConfigError::ReservedBits {
                register: "IA32_RTIT_CTL",
                bits: ctl.reserved_set(),
            });
        }
        check_features(ctl, caps)?;
        check_timing(ctl, caps)?;
        self.check_ranges(caps)?;
        self.check_cr3(caps)?;
        self.check_output(caps, max_phys_addr)
    }

    fn check_ranges(&self, caps: &PtCaps) -> Result<(), PtConfigError> {
        for n in 0..4u8 {
            let cfg = ctl_addr_cfg(self.ctl, n);
            if let AddrCfg::Reserved(value) = cfg {
                return Err(PtConfigError::AddrCfgReserved { range: n, value });
            }
            if cfg == AddrCfg::Unused {
                continue;
            }
            if !caps.ip_filtering() {
                return Err(PtConfigError::Unsupported {
                    field: ADDR_CFG_NAMES[usize::from(n)],
                    capability: "IP filtering (CPUID.(EAX=14H,ECX=0):EBX[2])",
                });
            }
            if n >= caps.num_address_ranges() {
                return Err(PtConfigError::AddressRangeNotAvailable {
                    range: n,
                    available: caps.num_address_ranges(),
                });
            }
            let (a, b) = self.addr[usize::from(n)];
            for (reg, which) in [(a, 'A'), (b, 'B')] {
                if !reg.is_canonical() {
                    return Err(PtConfigError::NonCanonical {
                        range: n,
                        which,
                        value: reg.raw(),
                    });
                }
            }
            if a.ip().0 > b.ip().0 {
                return Err(PtConfigError::RangeInverted {
                    range: n,
                    a: a.ip(),
                    b: b.ip(),
                });
            }
        }
        Ok(())
    }

    fn check_cr3(&self, caps: &PtCaps) -> Result<(), PtConfigError> {
        let reserved = self.cr3_match.raw() & RtitCr3Match::RESERVED;
        if reserved != 0 {
            return Err(PtConfigError::ReservedBits {
                register: "IA32_RTIT_CR3_MATCH",
                bits: reserved,
            });
        }
        if self.cr3_match.raw() != 0 && !caps.cr3_filtering() {
            return Err(PtConfigError::Unsupported {
                field: "IA32_RTIT_CR3_MATCH",
                capability: "CR3 filtering (CPUID.(EAX=14H,ECX=0):EBX[0])",
            });
        }
        Ok(())
    }

    fn check_output(&self, caps: &PtCaps, max_phys_addr: u8) -> Result<(), PtConfigError> {
        let base = self.output_base.raw();
        if base & RtitOutputBase::RESERVED != 0 {
            return Err(PtConfigError::ReservedBits {
                register: "IA32_RTIT_OUTPUT_BASE",
                bits: base & RtitOutputBase::RESERVED,
            });
        }
        if max_phys_addr < 64 && base >> max_phys_addr != 0 {
            return Err(PtConfigError::BeyondMaxPhysAddr {
                register: "IA32_RTIT_OUTPUT_BASE",
                value: base,
                max_phys_addr,
            });
        }
        if self.ctl.fabric_en() {
            return Ok(());
        }
        if self.ctl.topa() {
            if !caps.topa() {
                return Err(PtConfigError::Unsupported {
                    field: "ToPA",
                    capability: "ToPA output (CPUID.(EAX=14H,ECX=0):ECX[0])",
                });
            }
            TopaPosition::from_msrs(self.output_base, self.output_mask_ptrs)?;
        } else {
            if !caps.single_range() {
                return Err(PtConfigError::Unsupported {
                    field: "ToPA = 0 (single-range output)",
                    capability: "single-range output (CPUID.(EAX=14H,ECX=0):ECX[2])",
                });
            }
            SingleRange::from_msrs(self.output_base, self.output_mask_ptrs)?;
        }
        Ok(())
    }
}

const ADDR_CFG_NAMES: [&str; 4] = ["ADDR0_CFG", "ADDR1_CFG", "ADDR2_CFG", "ADDR3_CFG"];

fn ctl_addr_cfg(ctl: RtitCtl, n: u8) -> AddrCfg {
    ctl.addr_cfg(n).unwrap_or(AddrCfg::Unused)
}

fn check_features(ctl: RtitCtl, caps: &PtCaps) -> Result<(), PtConfigError> {
    let rules: [(bool, bool, &str, &str); 10] = [
        (
            ctl.cr3_filter(),
            caps.cr3_filtering(),
            "CR3Filter",
            "CR3 filtering (CPUID.(EAX=14H,ECX=0):EBX[0])",
        ),
        (
            ctl.cyc_en(),
            caps.configurable_psb_and_cyc(),
            "CYCEn",
            "cycle-accurate mode (CPUID.(EAX=14H,ECX=0):EBX[1])",
        ),
        (
            ctl.mtc_en(),
            caps.mtc(),
            "MTCEn",
            "MTC (CPUID.(EAX=14H,ECX=0):EBX[3])",
        ),
        (
            ctl.ptw_en(),
            caps.ptwrite(),
            "PTWEn",
            "PTWRITE (CPUID.(EAX=14H,ECX=0):EBX[4])",
        ),
        (
            ctl.fup_on_ptw(),
            caps.ptwrite(),
            "FUPonPTW",
            "PTWRITE (CPUID.(EAX=14H,ECX=0):EBX[4])",
        ),
        (
            ctl.pwr_evt_en(),
            caps.power_event_trace(),
            "PwrEvtEn",
            "power event trace (CPUID.(EAX=14H,ECX=0):EBX[5])",
        ),
        (
            ctl.inject_psb_pmi_on_enable(),
            caps.psb_pmi_preservation(),
            "InjectPsbPmiOnEnable",
            "PSB and PMI preservation (CPUID.(EAX=14H,ECX=0):EBX[6])",
        ),
        (
            ctl.event_en(),
            caps.event_trace(),
            "EventEn",
            "event trace (CPUID.(EAX=14H,ECX=0):EBX[7])",
        ),
        (
            ctl.dis_tnt(),
            caps.tnt_disable(),
            "DisTNT",
            "TNT disable (CPUID.(EAX=14H,ECX=0):EBX[8])",
        ),
        (
            ctl.fabric_en(),
            caps.trace_transport(),
            "FabricEn",
            "trace transport output (CPUID.(EAX=14H,ECX=0):ECX[3])",
        ),
    ];
    for (used, present, field, capability) in rules {
        if used && !present {
            return Err(PtConfigError::Unsupported { field, capability });
        }
    }
    if ctl.trace_en() && !ctl.branch_en() && !caps.mtc() {
        return Err(PtConfigError::BranchEnRequired);
    }
    Ok(())
}

fn check_timing(ctl: RtitCtl, caps: &PtCaps) -> Result<(), PtConfigError> {
    let in_bitmap = |v: u64, bitmap: u16| v < 16 && (bitmap >> v) & 1 != 0;
    if ctl.mtc_en() || ctl.mtc_freq() != 0 {
        if !caps.mtc() {
            return Err(PtConfigError::Unsupported {
                field: "MTCFreq",
                capability: "MTC (CPUID.(EAX=14H,ECX=0):EBX[3])",
            });
        }
        if !in_bitmap(ctl.mtc_freq(), caps.mtc_period_bitmap()) {
            return Err(PtConfigError::NotInBitmap {
                field: "MTCFreq",
                value: ctl.mtc_freq(),
                bitmap: caps.mtc_period_bitmap(),
                cpuid: "CPUID.(EAX=14H,ECX=1):EAX[31:16]",
            });
        }
    }
    let configurable = caps.configurable_psb_and_cyc();
    if ctl.cyc_en() || ctl.cyc_thresh() != 0 {
        if !configurable {
            return Err(PtConfigError::Unsupported {
                field: "CYCThresh",
                capability: "cycle-accurate mode (CPUID.(EAX=14H,ECX=0):EBX[1])",
            });
        }
        if !in_bitmap(ctl.cyc_thresh(), caps.cyc_threshold_bitmap()) {
            return Err(PtConfigError::NotInBitmap {
                field: "CYCThresh",
                value: ctl.cyc_thresh(),
                bitmap: caps.cyc_threshold_bitmap(),
                cpuid: "CPUID.(EAX=14H,ECX=1):EBX[15:0]",
            });
        }
    }
    if ctl.psb_freq() != 0 {
        if !configurable {
            return Err(PtConfigError::Unsupported {
                field: "PSBFreq",
                capability: "configurable PSB frequency (CPUID.(EAX=14H,ECX=0):EBX[1])",
            });
        }
        if !in_bitmap(ctl.psb_freq(), caps.psb_freq_bitmap()) {
            return Err(PtConfigError::NotInBitmap {
                field: "PSBFreq",
                value: ctl.psb_freq(),
                bitmap: caps.psb_freq_bitmap(),
                cpuid: "CPUID.(EAX=14H,ECX=1):EBX[31:16]",
            });
        }
    }
    Ok(())
}

/// Composes a [`PtConfig`] from intentions and validates it on `build`.
#[derive(Debug, Clone, Copy)]
pub struct PtConfigBuilder {
    caps: PtCaps,
    max_phys_addr: u8,
    config: PtConfig,
    error: Option<PtConfigError>,
}

impl PtConfigBuilder {
    /// Starts from all-zero MSRs with BranchEn set, for a processor with
    /// `caps` and physical address width `max_phys_addr`.
    pub fn new(caps: PtCaps, max_phys_addr: u8) -> Self {
        let config = PtConfig {
            ctl: RtitCtl::new().with_branch_en(true),
            ..PtConfig::default()
        };
        Self {
            caps,
            max_phys_addr,
            config,
            error: None,
        }
    }

    /// Applies `f` to IA32_RTIT_CTL (for options without a dedicated method).
    #[must_use]
    pub fn ctl(mut self, f: impl FnOnce(RtitCtl) -> RtitCtl) -> Self {
        self.config.ctl = f(self.config.ctl);
        self
    }

    /// TraceEn.
    #[must_use]
    pub fn enable(self, on: bool) -> Self {
        self.ctl(|c| c.with_trace_en(on))
    }

    /// Trace CPL 0 (OS) and/or CPL > 0 (User).
    #[must_use]
    pub fn privilege(self, kernel: bool, user: bool) -> Self {
        self.ctl(|c| c.with_os(kernel).with_user(user))
    }

    /// TSC packets.
    #[must_use]
    pub fn tsc(self, on: bool) -> Self {
        self.ctl(|c| c.with_tsc_en(on))
    }

    /// Return compression off (DisRETC).
    #[must_use]
    pub fn disable_ret_compression(self, on: bool) -> Self {
        self.ctl(|c| c.with_dis_retc(on))
    }

    /// MTC packets at encoding `freq`, or none.
    #[must_use]
    pub fn mtc(mut self, freq: Option<u8>) -> Self {
        let ctl = self.config.ctl.with_mtc_en(freq.is_some());
        self.config.ctl = self.record(ctl.with_mtc_freq(u64::from(freq.unwrap_or(0))), ctl);
        self
    }

    /// Cycle-accurate mode with threshold encoding `thresh`, or off.
    #[must_use]
    pub fn cyc(mut self, thresh: Option<u8>) -> Self {
        let ctl = self.config.ctl.with_cyc_en(thresh.is_some());
        self.config.ctl = self.record(ctl.with_cyc_thresh(u64::from(thresh.unwrap_or(0))), ctl);
        self
    }

    /// PSB frequency encoding.
    #[must_use]
    pub fn psb_freq(mut self, freq: u8) -> Self {
        let ctl = self.config.ctl;
        self.config.ctl = self.record(ctl.with_psb_freq(u64::from(freq)), ctl);
        self
    }

    /// Trace only while CR3 equals `cr3` (bits 4:0 must be zero).
    #[must_use]
    pub fn cr3_filter(mut self, cr3: Option<Cr3>) -> Self {
        self.config.ctl = self.config.ctl.with_cr3_filter(cr3.is_some());
        self.config.cr3_match = RtitCr3Match::from_raw(cr3.map_or(0, |c| c.0));
        self
    }

    /// IP range `n` (0..=3) from `a` to `b` inclusive, used as `cfg`.
    #[must_use]
    pub fn ip_range(mut self, n: u8, cfg: AddrCfg, a: Ip, b: Ip) -> Self {
        match self.config.ctl.with_addr_cfg(n, cfg) {
            Some(ctl) => {
                self.config.ctl = ctl;
                self.config.addr[usize::from(n)] =
                    (RtitAddr::from_raw(a.0), RtitAddr::from_raw(b.0));
            }
            None => self.error = self.error.or(Some(PtConfigError::NoSuchRange(n))),
        }
        self
    }

    /// ToPA output from the start of the table at `table`.
    #[must_use]
    pub fn output_topa(mut self, table: PhysAddr) -> Self {
        self.config.ctl = self.config.ctl.with_topa(true).with_fabric_en(false);
        self.config.output_base = RtitOutputBase::from_raw(table.0);
        self.config.output_mask_ptrs = RtitOutputMaskPtrs::from_raw(0x7F);
        self
    }

    /// Single-range output of `size` bytes at `base`.
    #[must_use]
    pub fn output_single_range(mut self, base: PhysAddr, size: u64) -> Self {
        self.config.ctl = self.config.ctl.with_topa(false).with_fabric_en(false);
        self.config.output_base = RtitOutputBase::from_raw(base.0);
        match SingleRange::new(base, size) {
            Ok(r) => self.config.output_mask_ptrs = r.mask_ptrs(),
            Err(e) => self.error = self.error.or(Some(e.into())),
        }
        self
    }

    fn record(&mut self, result: Result<RtitCtl, ComposeError>, fallback: RtitCtl) -> RtitCtl {
        result.unwrap_or_else(|e| {
            self.error = self.error.or(Some(e.into()));
            fallback
        })
    }

    /// The validated configuration, or the first reason it would fail.
    pub fn build(self) -> Result<PtConfig, PtConfigError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.config.validate(&self.caps, self.max_phys_addr)?;
        Ok(self.config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuid::CpuidRegs;

    /// A Skylake-like processor: CR3 filtering, PSB/CYC, IP filtering, MTC,
    /// PTWRITE, power events; ToPA with multiple entries, single range;
    /// two ranges, MTC bitmap 0x249, CYC bitmap 0x3FFF, PSB bitmap 0x3F.
    fn skylake() -> PtCaps {
        PtCaps::new(
            CpuidRegs {
                eax: 1,
                ebx: 0x3F,
                ecx: 0b111,
                edx: 0,
            },
            CpuidRegs {
                eax: 0x0249_0002,
                ebx: 0x003F_3FFF,
                ecx: 0,
                edx: 0,
            },
        )
    }

    /// Broadwell, the first generation: no configurable PSB, no MTC, one ToPA entry.
    fn broadwell() -> PtCaps {
        PtCaps::new(
            CpuidRegs {
                eax: 0,
                ebx: 0x1,
                ecx: 0b101,
                edx: 0,
            },
            CpuidRegs::default(),
        )
    }

    #[test]
    fn a_user_only_topa_trace_with_a_filter_range_builds() {
        let cfg = PtConfigBuilder::new(skylake(), 39)
            .enable(true)
            .privilege(false, true)
            .tsc(true)
            .mtc(Some(3))
            .psb_freq(2)
            .ip_range(0, AddrCfg::Filter, Ip(0x40_0000), Ip(0x40_FFFF))
            .output_topa(PhysAddr(0x7_0000))
            .build()
            .expect("valid on Skylake");
        assert_eq!(
            cfg.ctl.raw(),
            0x1 | 0x8 | 0x100 | 0x200 | 0x400 | 0x2000 | (3 << 14) | (2 << 24) | (1 << 32)
        );
        assert_eq!(cfg.output_mask_ptrs.raw(), 0x7F);
        assert_eq!(cfg.addr[0].0.raw(), 0x40_0000);
    }

    #[test]
    fn features_missing_from_cpuid_are_refused_with_the_bit_named() {
        let err = PtConfigBuilder::new(broadwell(), 39)
            .mtc(Some(0))
            .output_topa(PhysAddr(0x1000))
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            PtConfigError::Unsupported {
                field: "MTCEn",
                capability: "MTC (CPUID.(EAX=14H,ECX=0):EBX[3])"
            }
        );
        assert!(format!("{err}").contains("EBX[3]"));
        let err = PtConfigBuilder::new(broadwell(), 39)
            .ctl(|c| c.with_dis_tnt(true))
            .build()
            .unwrap_err();
        assert!(matches!(
            err,
            PtConfigError::Unsupported {
                field: "DisTNT",
                ..
            }
        ));
        let err = PtConfigBuilder::new(broadwell(), 39)
            .enable(true)
            .ctl(|c| c.with_branch_en(false))
            .build()
            .unwrap_err();
        assert_eq!(err, PtConfigError::BranchEnRequired);
    }

    #[test]
    fn more_ranges_than_cpuid_reports_are_refused() {
        let err = PtConfigBuilder::new(skylake(), 39)
            .ip_range(2, AddrCfg::Filter, Ip(0x1000), Ip(0x2000))
            .output_topa(PhysAddr(0x1000))
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            PtConfigError::AddressRangeNotAvailable {
                range: 2,
                available: 2
            }
        );
        assert_eq!(
            PtConfigBuilder::new(skylake(), 39)
                .ip_range(4, AddrCfg::Filter, Ip(0), Ip(1))
                .build(),
            Err(PtConfigError::NoSuchRange(4))
        );
        let inverted = PtConfigBuilder::new(skylake(), 39)
            .ip_range(1, AddrCfg::TraceStop, Ip(0x2000), Ip(0x1000))
            .output_topa(PhysAddr(0x1000))
            .build();
        assert!(matches!(
            inverted,
            Err(PtConfigError::RangeInverted { range: 1, .. })
        ));
        let reserved = PtConfig {
            ctl: RtitCtl::from_raw(3 << 36),
            ..PtConfig::default()
        };
        assert_eq!(
            reserved.validate(&skylake(), 39),
            Err(PtConfigError::AddrCfgReserved { range: 1, value: 3 })
        );
    }

    #[test]
    fn timing_encodings_must_be_in_the_bitmaps() {
        let err = PtConfigBuilder::new(skylake(), 39)
            .mtc(Some(4))
            .output_topa(PhysAddr(0x1000))
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            PtConfigError::NotInBitmap {
                field: "MTCFreq",
                value: 4,
                bitmap: 0x249,
                cpuid: "CPUID.(EAX=14H,ECX=1):EAX[31:16]"
            }
        );
        assert!(
            PtConfigBuilder::new(skylake(), 39)
                .mtc(Some(9))
                .output_topa(PhysAddr(0x1000))
                .build()
                .is_ok()
        );
        let err = PtConfigBuilder::new(skylake(), 39)
            .psb_freq(6)
            .output_topa(PhysAddr(0x1000))
            .build()
            .unwrap_err();
        assert!(matches!(
            err,
            PtConfigError::NotInBitmap {
                field: "PSBFreq",
                value: 6,
                ..
            }
        ));
        let err = PtConfigBuilder::new(skylake(), 39)
            .cyc(Some(14))
            .output_topa(PhysAddr(0x1000))
            .build()
            .unwrap_err();
        assert!(matches!(
            err,
            PtConfigError::NotInBitmap {
                field: "CYCThresh",
                value: 14,
                ..
            }
        ));
        assert!(
            PtConfigBuilder::new(skylake(), 39)
                .mtc(Some(16))
                .build()
                .is_err()
        );
    }

    #[test]
    fn output_errors_are_reported() {
        let err = PtConfigBuilder::new(skylake(), 39)
            .output_single_range(PhysAddr(0x1800), 4096)
            .build()
            .unwrap_err();
        assert!(matches!(
            err,
            PtConfigError::Output(OutputError::BaseNotAligned { .. })
        ));
        let cfg = PtConfig {
            output_mask_ptrs: RtitOutputMaskPtrs::from_raw(0x2FFF),
            output_base: RtitOutputBase::from_raw(0x10_0000),
            ..PtConfig::default()
        };
        assert_eq!(
            cfg.validate(&skylake(), 39),
            Err(PtConfigError::Output(OutputError::MaskNotContiguous {
                mask: 0x2FFF
            }))
        );
        let high = PtConfigBuilder::new(skylake(), 39)
            .output_topa(PhysAddr(1 << 40))
            .build()
            .unwrap_err();
        assert!(matches!(
            high,
            PtConfigError::BeyondMaxPhysAddr {
                max_phys_addr: 39,
                ..
            }
        ));
        let no_single = PtConfigBuilder::new(
            PtCaps::new(
                CpuidRegs {
                    ecx: 1,
                    ..CpuidRegs::default()
                },
                CpuidRegs::default(),
            ),
            39,
        )
        .output_single_range(PhysAddr(0x10_0000), 4096)
        .build();
        assert!(matches!(
            no_single,
            Err(PtConfigError::Unsupported {
                field: "ToPA = 0 (single-range output)",
                ..
            })
        ));
    }

    #[test]
    fn reserved_ctl_bits_are_refused_first() {
        let cfg = PtConfig {
            ctl: RtitCtl::from_raw(1 << 18),
            ..PtConfig::default()
        };
        let err = cfg.validate(&PtCaps::everything(), 52).unwrap_err();
        assert_eq!(
            err,
            PtConfigError::ReservedBits {
                register: "IA32_RTIT_CTL",
                bits: 1 << 18
            }
        );
        assert!(format!("{err}").contains("#GP"));
    }

    #[test]
    fn cr3_filter_needs_the_capability_and_clean_low_bits() {
        let caps = PtCaps::new(
            CpuidRegs {
                ecx: 1,
                ..CpuidRegs::default()
            },
            CpuidRegs::default(),
        );
        let err = PtConfigBuilder::new(caps, 39)
            .cr3_filter(Some(Cr3(0x1234_5000)))
            .output_topa(PhysAddr(0x1000))
            .build();
        assert!(matches!(
            err,
            Err(PtConfigError::Unsupported {
                field: "CR3Filter",
                ..
            })
        ));
        let err = PtConfigBuilder::new(skylake(), 39)
            .cr3_filter(Some(Cr3(0x1234_5007)))
            .output_topa(PhysAddr(0x1000))
            .build();
        assert_eq!(
            err,
            Err(PtConfigError::ReservedBits {
                register: "IA32_RTIT_CR3_MATCH",
                bits: 7
            })
        );
    }
}
