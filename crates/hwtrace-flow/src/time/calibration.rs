//! [`TimeCal`]: estimating the fast-counter ratio (TSC ticks per cycle).

use super::ctc::{bit32, ctc_delta, ctc_to_fc, mtc_ctc};
use super::{Fcr, TimeConfig, TimeError};

/// The largest value that can be shifted left by [`Fcr::FRACTION_BITS`]
/// without losing bits.
const MAX_UNSHIFTED: u64 = u64::MAX >> Fcr::FRACTION_BITS;

/// Cycles one CYC wrap stands for on processors with erratum SKL168, less a
/// margin for normal variation.
const SKL168_WRAP_CYCLES: u64 = 0xf00;

/// The highest MTC frequency setting for which a dropped wrap CYC packet is
/// noticeable enough to look for.
const SKL168_MAX_MTC_FREQ: u8 = 10;

/// Estimates the fast-counter ratio from timing packets.
///
/// Preferred source: the cycles counted (CYC) between two MTC packets,
/// compared with the TSC ticks the MTC period stands for. Without MTC, the
/// cycles between two TSC packets in PSB+ are used; a CBR packet gives a
/// ratio directly when the nominal frequency is configured.
///
/// Packets inside PSB+ go to the `header_*` methods, the others to the
/// `update_*` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeCal {
    /// The current ratio; meaningful once `min_fcr <= max_fcr`.
    fcr: u64,
    min_fcr: u64,
    max_fcr: u64,
    /// The last TSC, for calibrating at the next TSC in PSB+.
    tsc: u64,
    /// Cycles since the last TSC.
    cyc_tsc: u64,
    /// Cycles since the last MTC.
    cyc_mtc: u64,
    /// The CTC value of the last MTC.
    ctc: u32,
    /// MTC packets that did not give a calibration since the last one that
    /// did.
    lost_mtc: u32,
    have_mtc: bool,
    /// Set at PSB when erratum SKL168 applies; checked at the next MTC.
    check_skl168: bool,
}

impl Default for TimeCal {
    fn default() -> Self {
        Self::new()
    }
}

impl TimeCal {
    /// No calibration yet.
    pub fn new() -> Self {
        Self {
            fcr: 0,
            min_fcr: u64::MAX,
            max_fcr: 0,
            tsc: 0,
            cyc_tsc: 0,
            cyc_mtc: 0,
            ctc: 0,
            lost_mtc: 0,
            have_mtc: false,
            check_skl168: false,
        }
    }

    /// Forgets everything, including the ratio.
    pub fn reset(&mut self) {
        *self = Self::new();
    }

    fn have_fcr(&self) -> bool {
        self.min_fcr <= self.max_fcr
    }

    /// The current ratio, or [`TimeError::NoTime`] if there is none yet.
    pub fn fcr(&self) -> Result<Fcr, TimeError> {
        if self.have_fcr() {
            Ok(Fcr(self.fcr))
        } else {
            Err(TimeError::NoTime)
        }
    }

    /// The same calibration with the history only the past needs left
    /// out: the smallest and largest ratios measured so far decide nothing
    /// but whether there is one, and the count of MTC packets that gave
    /// none ([`lost_mtc`](Self::lost_mtc)) decides nothing. Two decoders
    /// whose settled calibrations are equal time what follows alike,
    /// however differently they got there ([`ClockState`](super::ClockState)
    /// compares these).
    pub fn settled(&self) -> TimeCal {
        let (min_fcr, max_fcr) = if self.have_fcr() {
            (self.fcr, self.fcr)
        } else {
            (u64::MAX, 0)
        };
        TimeCal {
            min_fcr,
            max_fcr,
            lost_mtc: 0,
            ..*self
        }
    }

    /// The number of MTC packets since the last successful MTC calibration
    /// that did not give one.
    pub fn lost_mtc(&self) -> u32 {
        self.lost_mtc
    }

    /// Sets the ratio, e.g. an initial guess before the trace provides one.
    pub fn set_fcr(&mut self, fcr: Fcr) {
        self.fcr = fcr.0;
        self.min_fcr = self.min_fcr.min(fcr.0);
        self.max_fcr = self.max_fcr.max(fcr.0);
    }

    /// A PSB packet.
    pub fn update_psb(&mut self, config: &TimeConfig) {
        if config.skl168 {
            self.check_skl168 = true;
        }
    }

    /// A TSC packet outside PSB+. It may follow a loss of time, so it is not
    /// used for calibration, only remembered for the next one in PSB+.
    pub fn update_tsc(&mut self, tsc: u64) {
        self.tsc = tsc;
        self.cyc_tsc = 0;
    }

    /// A TSC packet inside PSB+: calibrates from the cycles since the last
    /// TSC, unless MTC packets are available (they are more precise).
    pub fn header_tsc(&mut self, tsc: u64) -> Result<(), TimeError> {
        let last_tsc = self.tsc;
        let cycles = self.cyc_tsc;

        self.tsc = tsc;
        self.cyc_tsc = 0;

        if last_tsc == 0 || cycles == 0 || self.have_mtc {
            return Ok(());
        }

        // TSC packets carry 56 bits; allow one wrap-around.
        let mut tsc = tsc;
        if tsc < last_tsc {
            tsc = tsc.wrapping_add(1 << 56);
            if tsc < last_tsc {
                return Err(TimeError::BadPacket);
            }
        }
        let delta = tsc - last_tsc;
        if delta > MAX_UNSHIFTED {
            return Err(TimeError::Internal);
        }
        self.set_fcr(Fcr((delta << Fcr::FRACTION_BITS) / cycles));
        Ok(())
    }

    /// A CBR packet outside PSB+: the frequency changed, so the old
    /// calibration is void. Starts over, from this CBR if possible.
    pub fn update_cbr(&mut self, ratio: u8, config: &TimeConfig) -> Result<(), TimeError> {
        self.reset();
        self.header_cbr(ratio, config)
    }

    /// A CBR packet inside PSB+: with a known nominal frequency, the
    /// ratio is nominal / current core:bus ratio.
    pub fn header_cbr(&mut self, ratio: u8, config: &TimeConfig) -> Result<(), TimeError> {
        let nominal = u64::from(config.nom_freq);
        if nominal == 0 {
            return Ok(());
        }
        if ratio == 0 {
            return Err(TimeError::BadPacket);
        }
        self.set_fcr(Fcr((nominal << Fcr::FRACTION_BITS) / u64::from(ratio)));
        Ok(())
    }

    /// An MTC packet: calibrates from the cycles counted since the last MTC.
    pub fn update_mtc(&mut self, payload: u8, config: &TimeConfig) -> Result<(), TimeError> {
        let last_ctc = self.ctc;
        let cycles = self.cyc_mtc;
        let check_skl168 = self.check_skl168;

        // Only the first MTC after a PSB is suspect.
        self.check_skl168 = false;

        let ctc = mtc_ctc(payload, config);

        if !self.have_mtc {
            self.cyc_mtc = 0;
            self.ctc = ctc;
            self.have_mtc = true;
            return Ok(());
        }

        // No cycles counted: spread the next ones over both periods.
        if cycles == 0 {
            return Ok(());
        }

        self.cyc_mtc = 0;
        self.ctc = ctc;
        // Counted as lost unless we get to the end.
        self.lost_mtc += 1;

        let delta = ctc_delta(ctc, last_ctc, config)?;
        let fc = ctc_to_fc(u64::from(delta), config)?;
        if fc > MAX_UNSHIFTED {
            return Err(TimeError::Internal);
        }
        let fcr = (fc << Fcr::FRACTION_BITS) / cycles;

        if check_skl168 && self.skl168_dropped_cycles(delta, fc, cycles, config) {
            return Ok(());
        }

        self.set_fcr(Fcr(fcr));
        self.lost_mtc = 0;
        Ok(())
    }

    /// Erratum SKL168: CYC packets right before a PSB may be dropped. The
    /// first MTC period after a PSB is not trusted if MTC packets were
    /// lost, or if (at high MTC frequencies, with a previous ratio to
    /// compare with) the period is shorter than even one more CYC wrap
    /// would make it, i.e. a wrap CYC looks dropped.
    fn skl168_dropped_cycles(&self, delta: u32, fc: u64, cycles: u64, config: &TimeConfig) -> bool {
        if bit32(u32::from(config.mtc_freq)) < delta {
            return true;
        }
        if config.mtc_freq < SKL168_MAX_MTC_FREQ && self.have_fcr() {
            let expected = self
                .fcr
                .wrapping_mul(cycles.wrapping_add(SKL168_WRAP_CYCLES))
                >> Fcr::FRACTION_BITS;
            if expected < fc {
                return true;
            }
        }
        false
    }

    /// A CYC packet: counts its cycles for the next calibration.
    pub fn update_cyc(&mut self, cycles: u64) {
        self.cyc_mtc = self.cyc_mtc.wrapping_add(cycles);
        self.cyc_tsc = self.cyc_tsc.wrapping_add(cycles);
    }

    /// An OVF packet: cycles and CTC before it cannot be related to those
    /// after it. Keeps the ratio itself.
    pub fn update_ovf(&mut self) {
        self.tsc = 0;
        self.cyc_tsc = 0;
        self.cyc_mtc = 0;
        self.ctc = 0;
        self.have_mtc = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TSC ticks 4x as fast as the crystal clock.
    fn config(mtc_freq: u8) -> TimeConfig {
        TimeConfig {
            mtc_freq,
            cpuid_0x15_eax: 1,
            cpuid_0x15_ebx: 4,
            ..TimeConfig::default()
        }
    }

    const ONE: u64 = 1 << Fcr::FRACTION_BITS;

    #[test]
    fn nothing_before_calibration() {
        assert_eq!(TimeCal::new().fcr(), Err(TimeError::NoTime));
    }

    #[test]
    fn set_fcr_is_returned() {
        let mut tcal = TimeCal::new();
        tcal.set_fcr(Fcr(0x180));
        assert_eq!(tcal.fcr(), Ok(Fcr(0x180)));
        assert_eq!(Fcr(0x180).as_f64(), 1.5);
    }

    #[test]
    fn settled_calibrations_forget_how_they_got_there() {
        let cfg = config(0);
        // One decoder measured a ratio, then (after an MTC without
        // cycles) another; the other only the second.
        let mut long = TimeCal::new();
        long.update_mtc(1, &cfg).unwrap();
        long.update_cyc(8);
        long.update_mtc(2, &cfg).unwrap();
        long.update_mtc(3, &cfg).unwrap();
        let mut short = TimeCal::new();
        short.update_mtc(2, &cfg).unwrap();
        short.update_mtc(3, &cfg).unwrap();
        for t in [&mut long, &mut short] {
            t.update_tsc(100);
            t.update_cyc(4);
            t.update_mtc(4, &cfg).unwrap();
        }
        // 4 cycles over the two ticks since MTC 2 (MTC 3 counted none).
        assert_eq!(long.fcr(), Ok(Fcr(2 * ONE)));
        assert_ne!(long, short);
        assert_eq!(long.settled(), short.settled());
        assert_eq!(long.settled().fcr(), Ok(Fcr(2 * ONE)));
        // No ratio yet stays no ratio.
        assert_eq!(TimeCal::new().settled().fcr(), Err(TimeError::NoTime));
        assert_ne!(TimeCal::new().settled(), short.settled());
    }

    #[test]
    fn settled_calibrations_keep_what_times_the_packets_to_come() {
        // The cycles counted towards the next calibration and the TSC and
        // CTC they are counted from each decide a later ratio: two
        // decoders that differ in one of them alone must not compare equal.
        let cfg = config(0);
        let mut base = TimeCal::new();
        base.update_mtc(1, &cfg).unwrap();
        base.update_cyc(4);
        base.update_mtc(2, &cfg).unwrap();
        let at_tsc = |cyc: u64, tsc: u64| {
            let mut t = base;
            t.update_cyc(cyc);
            t.update_tsc(tsc);
            t
        };
        let at_mtc = |payload: u8| {
            let mut t = TimeCal::new();
            t.update_mtc(payload, &cfg).unwrap();
            t
        };
        let pairs = [
            ("cycles since the MTC", at_tsc(0, 100), at_tsc(3, 100)),
            ("the TSC", at_tsc(0, 100), at_tsc(0, 200)),
            ("the CTC", at_mtc(1), at_mtc(2)),
        ];
        for (what, a, b) in pairs {
            assert_ne!(a, b, "{what}");
            assert_ne!(a.settled(), b.settled(), "{what}");
        }
    }

    #[test]
    fn two_mtcs_with_cycles_calibrate() {
        let cfg = config(0);
        let mut tcal = TimeCal::new();
        tcal.update_mtc(1, &cfg).unwrap();
        tcal.update_cyc(8);
        // One CTC tick is 4 TSC ticks; 8 cycles: half a tick per cycle.
        tcal.update_mtc(2, &cfg).unwrap();
        assert_eq!(tcal.fcr(), Ok(Fcr(ONE / 2)));
        assert_eq!(tcal.lost_mtc(), 0);
    }

    #[test]
    fn mtc_without_cycles_extends_the_period() {
        let cfg = config(0);
        let mut tcal = TimeCal::new();
        tcal.update_mtc(1, &cfg).unwrap();
        tcal.update_mtc(2, &cfg).unwrap();
        assert_eq!(tcal.fcr(), Err(TimeError::NoTime));
        tcal.update_cyc(4);
        tcal.update_mtc(3, &cfg).unwrap();
        // 2 CTC ticks = 8 TSC ticks over 4 cycles.
        assert_eq!(tcal.fcr(), Ok(Fcr(2 * ONE)));
    }

    #[test]
    fn bad_mtc_counts_as_lost() {
        let cfg = TimeConfig::default();
        let mut tcal = TimeCal::new();
        tcal.update_mtc(1, &cfg).unwrap();
        tcal.update_cyc(4);
        assert_eq!(tcal.update_mtc(2, &cfg), Err(TimeError::BadConfig));
        assert_eq!(tcal.lost_mtc(), 1);
    }

    #[test]
    fn header_tsc_calibrates_without_mtc() {
        let mut tcal = TimeCal::new();
        tcal.update_tsc(0x1000);
        tcal.update_cyc(0x10);
        tcal.header_tsc(0x1020).unwrap();
        assert_eq!(tcal.fcr(), Ok(Fcr(2 * ONE)));
    }

    #[test]
    fn header_tsc_prefers_mtc() {
        let cfg = config(0);
        let mut tcal = TimeCal::new();
        tcal.update_mtc(1, &cfg).unwrap();
        tcal.update_tsc(0x1000);
        tcal.update_cyc(0x10);
        tcal.header_tsc(0x1020).unwrap();
        assert_eq!(tcal.fcr(), Err(TimeError::NoTime));
    }

    #[test]
    fn cbr_calibrates_with_nominal_frequency() {
        let cfg = TimeConfig {
            nom_freq: 8,
            ..config(0)
        };
        let mut tcal = TimeCal::new();
        tcal.header_cbr(0x10, &cfg).unwrap();
        assert_eq!(tcal.fcr(), Ok(Fcr(ONE / 2)));
        assert_eq!(tcal.header_cbr(0, &cfg), Err(TimeError::BadPacket));
        // Without the nominal frequency, CBR outside PSB+ only resets.
        let mut tcal = TimeCal::new();
        tcal.set_fcr(Fcr(ONE));
        tcal.update_cbr(0x10, &config(0)).unwrap();
        assert_eq!(tcal.fcr(), Err(TimeError::NoTime));
    }

    #[test]
    fn ovf_keeps_ratio_but_restarts_counting() {
        let cfg = config(0);
        let mut tcal = TimeCal::new();
        tcal.set_fcr(Fcr(ONE));
        tcal.update_mtc(1, &cfg).unwrap();
        tcal.update_cyc(8);
        tcal.update_ovf();
        tcal.update_mtc(2, &cfg).unwrap();
        assert_eq!(tcal.fcr(), Ok(Fcr(ONE)));
    }

    #[test]
    fn skl168_skips_first_mtc_after_lost_mtcs() {
        let cfg = TimeConfig {
            skl168: true,
            ..config(0)
        };
        let mut tcal = TimeCal::new();
        tcal.update_mtc(1, &cfg).unwrap();
        tcal.update_psb(&cfg);
        tcal.update_cyc(8);
        // Two CTC ticks with mtc_freq 0: an MTC was lost.
        tcal.update_mtc(3, &cfg).unwrap();
        assert_eq!(tcal.fcr(), Err(TimeError::NoTime));
        assert_eq!(tcal.lost_mtc(), 1);
        // The check applies once.
        tcal.update_cyc(8);
        tcal.update_mtc(4, &cfg).unwrap();
        assert_eq!(tcal.fcr(), Ok(Fcr(ONE / 2)));
    }

    #[test]
    fn skl168_skips_period_with_dropped_wrap_cyc() {
        // One CTC tick is 0x1000 TSC ticks.
        let base = TimeConfig {
            cpuid_0x15_ebx: 0x1000,
            ..config(0)
        };
        let period = |cfg: &TimeConfig| {
            let mut tcal = TimeCal::new();
            // One TSC tick per cycle so far.
            tcal.set_fcr(Fcr(ONE));
            tcal.update_mtc(1, cfg).unwrap();
            tcal.update_psb(cfg);
            // 0x10 cycles for 0x1000 ticks: even one more CYC wrap (0xf00
            // cycles at the old ratio) would not fill the period.
            tcal.update_cyc(0x10);
            tcal.update_mtc(2, cfg).unwrap();
            tcal.fcr()
        };
        let with_erratum = TimeConfig {
            skl168: true,
            ..base
        };
        assert_eq!(period(&with_erratum), Ok(Fcr(ONE)));
        assert_eq!(period(&base), Ok(Fcr(0x100 * ONE)));
    }
}
