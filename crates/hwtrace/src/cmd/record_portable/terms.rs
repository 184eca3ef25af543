//! `--terms` for the portable capture: the `intel_pt` PMU config terms of
//! a real capture (`tsc,mtc,mtc_period=3,cyc,noretcomp,psb_period=2,...`),
//! read against the formats Linux gives the PMU ([`Pmu::linux_intel_pt`]), and turned into what the
//! simulated hardware writes: the same IA32_RTIT_CTL fields, the timing
//! packets from hwtrace-sim's clock, and the attribute config and
//! AUXTRACE_INFO words perf then reads, as a real capture has them.
//!
//! The clock is the simulator's ([`hwtrace_sim::clock`]): the TSC starts
//! at [`TSC_START`] and ticks once per instruction, the core runs at 32 ×
//! and the TSC at 24 × the bus clock, and CPUID.15H is 2 / 216; perf time
//! is the TSC (the conversion written is the identity), so an instruction
//! lasts a nanosecond on perf's time line. Terms the simulator has no
//! model for (power events, PTWRITE) are refused by name.

use anyhow::{Result, bail};
use hwtrace_perf::capture::plan::default_pt_terms;
use hwtrace_perf::capture::pmu::Pmu;
use hwtrace_perf::data::{IntelPtInfo, TscConversion};
use hwtrace_sim::{PtConfig, Timing, TscModel};

/// Terms with no model in the simulator.
const UNSIMULATED: &[(&str, &str)] = &[
    ("pwr_evt", "power events"),
    ("fup_on_ptw", "PTWRITE"),
    ("ptw", "PTWRITE"),
];

/// The TSC at the first instruction: one second on perf's time line.
pub const TSC_START: u64 = 1_000_000_000;

/// The clock ratios of the simulated processor (see the module docs).
const TIMING: Timing = Timing::WHOLE_RATIOS;

/// The `intel_pt` config of a portable capture, and the fields the
/// simulator reads from it (by the PMU's formats, as the kernel would).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtTerms {
    /// The attribute's config word.
    pub config: u64,
    tsc: bool,
    noretcomp: bool,
    branch: bool,
    /// MTCFreq when `mtc` is on, CYCThresh when `cyc` is.
    mtc: Option<u8>,
    cyc: Option<u8>,
    /// PSBFreq.
    psb_period: u8,
}

impl PtTerms {
    /// Without `--terms`, what a real capture takes by default
    /// ([`default_pt_terms`] on a PMU with MTC): `pt,branch,tsc,mtc,
    /// mtc_period=3`.
    pub fn real_default(pmu_type: u32) -> Self {
        let mut pmu = Pmu::linux_intel_pt(pmu_type);
        pmu.caps.insert("mtc".into(), "1".into());
        Self::parse(&default_pt_terms(&pmu), pmu_type)
            .expect("the default terms are Linux's intel_pt terms")
    }

    /// Reads `terms` (comma-separated `name` or `name=value`, as `perf
    /// record -e intel_pt/TERMS/` takes them; they replace the defaults).
    pub fn parse(terms: &str, pmu_type: u32) -> Result<Self> {
        let pmu = Pmu::linux_intel_pt(pmu_type);
        let values = pmu
            .build_config(terms)
            .map_err(|e| anyhow::anyhow!("--terms: {e}"))?;
        let value = |name| pmu.term_value(&values, name);
        for &(name, what) in UNSIMULATED {
            if value(name) != 0 {
                bail!("--terms: `{name}`: the portable capture does not simulate {what}");
            }
        }
        if value("pt") == 0 {
            bail!("--terms: give `pt` (PacketEn: without it there is no trace to simulate)");
        }
        // Each field fits its format's bits (`build_config` checked), so
        // in a byte.
        let field = |name| value(name) as u8;
        Ok(Self {
            config: values.config,
            tsc: value("tsc") != 0,
            noretcomp: value("noretcomp") != 0,
            branch: value("branch") != 0,
            mtc: (value("mtc") != 0).then(|| field("mtc_period")),
            cyc: (value("cyc") != 0).then(|| field("cyc_thresh")),
            psb_period: field("psb_period"),
        })
    }

    /// Whether TSC packets are written (perf then times the trace).
    pub fn timed(&self) -> bool {
        self.tsc
    }

    /// What the simulated hardware writes under this config (the IP
    /// filter aside).
    pub fn pt_config(&self) -> PtConfig {
        let mut config = PtConfig {
            return_compression: !self.noretcomp,
            branch_en: self.branch,
            ..PtConfig::default()
        };
        // The PSB period is a config field: 2^(N+11) bytes.
        config.psb_period =
            PtConfig::psb_period_for_freq(self.psb_period).unwrap_or(config.psb_period);
        if self.tsc {
            config.tsc = Some(TscModel {
                start: TSC_START,
                ticks_per_insn: 1,
            });
        }
        if let Some(timing) = Timing::with_whole_ratios(self.mtc, self.cyc) {
            config.timing = timing;
        }
        config
    }

    /// AUXTRACE_INFO for this config: Linux's bits, and with timing the
    /// clock's ratios and the identity TSC conversion.
    pub fn info(&self, pmu_type: u32) -> IntelPtInfo {
        let mut info = IntelPtInfo::linux_pmu(pmu_type);
        if self.tsc {
            info.tsc = TscConversion {
                time_shift: 0,
                time_mult: 1,
                time_zero: 0,
                cap_user_time_zero: true,
            };
        }
        if self.mtc.is_some() || self.cyc.is_some() {
            let (eax, ebx) = TIMING.tsc_ctc_ratio.unwrap_or((0, 0));
            info.tsc_ctc_ratio_n = Some(u64::from(ebx));
            info.tsc_ctc_ratio_d = Some(u64::from(eax));
            info.max_non_turbo_ratio = Some(u64::from(TIMING.tsc_bus_ratio));
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_set_the_simulated_fields() {
        let t = PtTerms::parse(
            "pt,branch,tsc,mtc,mtc_period=3,cyc,cyc_thresh=2,noretcomp,psb_period=1",
            8,
        )
        .unwrap();
        let c = t.pt_config();
        assert!(t.timed() && !c.return_compression && c.branch_en);
        assert_eq!(c.psb_period, 4096);
        assert_eq!((c.timing.mtc_freq, c.timing.cyc_thresh), (Some(3), Some(2)));
        assert_eq!(c.tsc.map(|m| m.start), Some(TSC_START));
        let info = t.info(8);
        assert_eq!(
            (info.tsc_ctc_ratio_n, info.tsc_ctc_ratio_d),
            (Some(216), Some(2))
        );
        assert_eq!(info.max_non_turbo_ratio, Some(24));
        assert_eq!(info.tsc.time_mult, 1);
        assert_eq!(
            t.config,
            1 | 1 << 1 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 13 | 3 << 14 | 2 << 19 | 1 << 24
        );
    }

    #[test]
    fn plain_branch_tracing_is_untimed() {
        let t = PtTerms::parse("pt,branch", 8).unwrap();
        assert_eq!(t.config, 1 | 1 << 13);
        let c = t.pt_config();
        assert!(c.return_compression && c.branch_en && c.tsc.is_none());
        // PSBFreq 0: every 2 KiB.
        assert_eq!(c.psb_period, 2048);
    }

    #[test]
    fn the_default_is_a_real_capture_s_timed_one() {
        let t = PtTerms::real_default(8);
        let c = t.pt_config();
        assert!(t.timed() && c.return_compression && c.branch_en);
        assert_eq!((c.timing.mtc_freq, c.timing.cyc_thresh), (Some(3), None));
        // psb_period=0: a PSB every 2 KiB.
        assert_eq!(c.psb_period, 2048);
    }

    #[test]
    fn unknown_unsimulated_and_out_of_range_terms_are_refused_by_name() {
        let err = |t: &str| format!("{:#}", PtTerms::parse(t, 8).unwrap_err());
        assert!(err("pt,bogus").contains("bogus"), "{}", err("pt,bogus"));
        assert!(err("pt,pwr_evt").contains("power events"));
        assert!(err("pt,ptw").contains("PTWRITE"));
        assert!(err("pt,mtc_period=16").contains("mtc_period"));
        assert!(err("branch,tsc").contains("give `pt`"));
    }
}
