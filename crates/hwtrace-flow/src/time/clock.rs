//! [`Time`]: the estimated time-stamp counter.

use hwtrace_types::Tsc;

use super::ctc::{
    TMA_CTC_BITS, TMA_CTC_MASK, bit32, ctc_delta, ctc_to_fc, mtc_ctc, mtc_high_bit, shl32,
};
use super::{Fcr, TimeConfig, TimeError};

/// The result of a time query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TscEstimate {
    /// The estimated TSC. Before the first TSC packet this counts from
    /// zero, i.e. it is time relative to the start of decoding.
    pub tsc: Tsc,
    /// MTC packets that could not be used since the last TSC packet.
    pub lost_mtc: u32,
    /// CYC packets that could not be used (no calibration yet) since the
    /// last TSC or MTC packet.
    pub lost_cyc: u32,
}

/// Tracks the estimated TSC from timing packets.
///
/// Feed it every TSC, CBR, TMA, MTC and CYC packet in trace order. The
/// estimate is `base + fc`: `base` moves with TSC and MTC packets, `fc` (the
/// fast counter since the last MTC) grows with CYC packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Time {
    /// The estimated TSC.
    tsc: u64,
    /// The TSC at the last TSC or MTC packet (after TMA: at the CTC tick
    /// the TMA refers to).
    base: u64,
    /// Fast-counter ticks since `base`, from CYC (and TMA).
    fc: u64,
    /// The CTC value of the last MTC (or the CTC bits of the TMA).
    ctc: u32,
    /// The CTC value at the moment `fc` was last reset.
    ctc_cyc: u32,
    lost_mtc: u32,
    lost_cyc: u32,
    cbr: u8,
    have_tsc: bool,
    have_cbr: bool,
    have_tma: bool,
    have_mtc: bool,
}

impl Time {
    /// No time known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The estimate, whether or not a TSC packet has been seen (relative
    /// time otherwise).
    pub fn estimate(&self) -> TscEstimate {
        TscEstimate {
            tsc: Tsc(self.tsc),
            lost_mtc: self.lost_mtc,
            lost_cyc: self.lost_cyc,
        }
    }

    /// The estimate, or [`TimeError::NoTime`] if no TSC packet has been seen
    /// (use [`Time::estimate`] to get relative time anyway).
    pub fn query_tsc(&self) -> Result<TscEstimate, TimeError> {
        if self.have_tsc {
            Ok(self.estimate())
        } else {
            Err(TimeError::NoTime)
        }
    }

    /// The last core:bus ratio, or [`TimeError::NoCbr`].
    pub fn query_cbr(&self) -> Result<u8, TimeError> {
        if self.have_cbr {
            Ok(self.cbr)
        } else {
            Err(TimeError::NoCbr)
        }
    }

    /// A TSC packet: the full time. Forgets MTC/TMA state and any losses.
    pub fn update_tsc(&mut self, tsc: Tsc) {
        self.have_tsc = true;
        self.have_tma = false;
        self.have_mtc = false;
        self.tsc = tsc.0;
        self.base = tsc.0;
        self.ctc = 0;
        self.fc = 0;
        self.lost_mtc = 0;
        self.lost_cyc = 0;
    }

    /// A CBR packet. A zero ratio is rejected.
    pub fn update_cbr(&mut self, ratio: u8) -> Result<(), TimeError> {
        if ratio == 0 {
            return Err(TimeError::BadPacket);
        }
        self.have_cbr = true;
        self.cbr = ratio;
        Ok(())
    }

    /// A TMA packet: the CTC and fast counter at the preceding TSC.
    ///
    /// It must follow a TSC, at most once per TSC.
    pub fn update_tma(&mut self, ctc: u16, fc: u16, config: &TimeConfig) -> Result<(), TimeError> {
        if !self.have_tsc || self.have_tma {
            return Err(TimeError::BadContext);
        }
        // MTCs between TSC and TMA are ignored, so none can have counted.
        if self.have_mtc {
            return Err(TimeError::Internal);
        }

        let fc = u64::from(fc);
        let high = mtc_high_bit(config);
        let ctc_mask = bit32(high).wrapping_sub(1);

        self.have_tma = true;
        self.base = self.base.wrapping_sub(fc);
        self.fc = self.fc.wrapping_add(fc);

        // If TMA carries every CTC bit MTC packets do, it serves as the
        // first MTC. Otherwise the next MTC fills in the missing high bits.
        if high <= TMA_CTC_BITS {
            self.have_mtc = true;
        }
        self.ctc = u32::from(ctc) & ctc_mask;
        self.ctc_cyc = self.ctc;
        Ok(())
    }

    /// An MTC packet with its 8-bit CTC payload.
    pub fn update_mtc(&mut self, payload: u8, config: &TimeConfig) -> Result<(), TimeError> {
        let (have_tsc, have_tma, have_mtc) = (self.have_tsc, self.have_tma, self.have_mtc);

        // Between TSC and TMA we cannot relate the CTC to the TSC yet.
        if have_tsc && !have_tma {
            return Ok(());
        }

        let mut last_ctc = self.ctc;
        let ctc = mtc_ctc(payload, config);

        // Remember where the CYC count restarts if it was (or would have
        // been) reset here.
        if self.fc != 0 || self.lost_cyc != 0 || !have_mtc {
            self.ctc_cyc = ctc;
        }

        self.have_mtc = true;
        self.fc = 0;
        self.ctc = ctc;
        self.lost_cyc = 0;

        if !have_mtc {
            // Without TMA the first MTC only gives a starting point: we do
            // not know where in its period tracing began.
            if !have_tma {
                return Ok(());
            }
            if last_ctc & !TMA_CTC_MASK != 0 {
                return Err(TimeError::Internal);
            }
            // TMA gave the low CTC bits only; borrow the high bits from this
            // MTC, one period earlier if the low bits wrapped in between.
            let low = ctc & TMA_CTC_MASK;
            let mut high = ctc & !TMA_CTC_MASK;
            if low < last_ctc {
                high =
                    high.wrapping_sub(1 << TMA_CTC_BITS) & shl32(0xff, u32::from(config.mtc_freq));
            }
            last_ctc |= high;
        }

        let delta = match ctc_delta(ctc, last_ctc, config) {
            Ok(delta) => delta,
            Err(err) => {
                self.lost_mtc += 1;
                return Err(err);
            }
        };
        let fc = ctc_to_fc(u64::from(delta), config)?;

        self.base = self.base.wrapping_add(fc);
        self.tsc = self.base;
        Ok(())
    }

    /// A CYC packet with its cycle count, given the current calibration.
    ///
    /// Without a calibration (`None` or a zero ratio) the packet is counted
    /// as lost and [`TimeError::NoCalibration`] is returned; the state is
    /// otherwise unchanged, so decoding can go on.
    pub fn update_cyc(
        &mut self,
        cycles: u64,
        config: &TimeConfig,
        fcr: Option<Fcr>,
    ) -> Result<(), TimeError> {
        let fcr = match fcr {
            Some(Fcr(0)) | None => {
                self.lost_cyc += 1;
                return Err(TimeError::NoCalibration);
            }
            Some(Fcr(fcr)) => fcr,
        };

        let mut cycles = cycles;
        if self.fc == 0 {
            cycles = self.cycles_in_this_period(cycles, config, fcr)?;
        }

        let fc = self
            .fc
            .wrapping_add(cycles.wrapping_mul(fcr) >> Fcr::FRACTION_BITS);
        self.fc = fc;
        self.tsc = self.base.wrapping_add(fc);
        Ok(())
    }

    /// The first CYC after an MTC may count cycles from earlier MTC periods
    /// (CYC packets are only sent when enough cycles passed). Subtract the
    /// cycles the calibration says those earlier periods took, so the MTC's
    /// time is not counted twice; never go below zero.
    fn cycles_in_this_period(
        &self,
        cycles: u64,
        config: &TimeConfig,
        fcr: u64,
    ) -> Result<u64, TimeError> {
        if self.ctc == self.ctc_cyc {
            return Ok(cycles);
        }
        let delta = ctc_delta(self.ctc, self.ctc_cyc, config)?;
        let fc = ctc_to_fc(u64::from(delta), config)?;
        let earlier = fc.wrapping_shl(Fcr::FRACTION_BITS) / fcr;
        Ok(cycles.max(earlier) - earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TSC ticks 3x as fast as the crystal clock.
    fn config(mtc_freq: u8) -> TimeConfig {
        TimeConfig {
            mtc_freq,
            cpuid_0x15_eax: 1,
            cpuid_0x15_ebx: 3,
            ..TimeConfig::default()
        }
    }

    fn tsc(time: &Time) -> u64 {
        time.estimate().tsc.0
    }

    #[test]
    fn no_time_before_tsc() {
        let time = Time::new();
        assert_eq!(time.query_tsc(), Err(TimeError::NoTime));
        assert_eq!(time.query_cbr(), Err(TimeError::NoCbr));
        assert_eq!(tsc(&time), 0);
    }

    #[test]
    fn tsc_sets_time() {
        let mut time = Time::new();
        time.update_tsc(Tsc(0x1000));
        assert_eq!(time.query_tsc().map(|e| e.tsc), Ok(Tsc(0x1000)));
    }

    #[test]
    fn cbr_zero_is_rejected() {
        let mut time = Time::new();
        assert_eq!(time.update_cbr(0), Err(TimeError::BadPacket));
        assert_eq!(time.update_cbr(0x20), Ok(()));
        assert_eq!(time.query_cbr(), Ok(0x20));
    }

    #[test]
    fn tma_needs_tsc_and_comes_once() {
        let cfg = config(0);
        let mut time = Time::new();
        assert_eq!(time.update_tma(0, 0, &cfg), Err(TimeError::BadContext));
        time.update_tsc(Tsc(0x100));
        assert_eq!(time.update_tma(0, 0, &cfg), Ok(()));
        assert_eq!(time.update_tma(0, 0, &cfg), Err(TimeError::BadContext));
    }

    #[test]
    fn mtc_advances_by_ctc_periods() {
        // mtc_freq 0: TMA carries all MTC bits and acts as the first MTC.
        let cfg = config(0);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x1000));
        time.update_tma(0x10, 0x6, &cfg).unwrap();
        // The TSC was 6 fast-counter ticks after CTC 0x10.
        assert_eq!(tsc(&time), 0x1000);
        time.update_mtc(0x11, &cfg).unwrap();
        assert_eq!(tsc(&time), 0x1000 - 6 + 3);
        time.update_mtc(0x13, &cfg).unwrap();
        assert_eq!(tsc(&time), 0x1000 - 6 + 9);
    }

    #[test]
    fn mtc_between_tsc_and_tma_is_ignored() {
        let cfg = config(0);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x1000));
        time.update_mtc(0x50, &cfg).unwrap();
        assert_eq!(tsc(&time), 0x1000);
        assert_eq!(time.update_tma(0x10, 0, &cfg), Ok(()));
    }

    #[test]
    fn mtc_wraps_once() {
        let cfg = config(0);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x1000));
        time.update_tma(0xfe, 0, &cfg).unwrap();
        time.update_mtc(0x01, &cfg).unwrap();
        assert_eq!(tsc(&time), 0x1000 + 3 * 3);
    }

    #[test]
    fn infrequent_mtc_borrows_high_bits_from_first_mtc() {
        // mtc_freq 9: MTC covers CTC[16:9], TMA only CTC[15:0].
        let cfg = config(9);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x10000));
        time.update_tma(0xfe00, 0, &cfg).unwrap();
        // MTC payload 0x80 is CTC 0x10000: one period (0x200 ticks) later.
        time.update_mtc(0x80, &cfg).unwrap();
        assert_eq!(tsc(&time), 0x10000 + 0x200 * 3);
    }

    #[test]
    fn first_mtc_without_tsc_only_starts_the_clock() {
        let cfg = config(0);
        let mut time = Time::new();
        time.update_mtc(0x10, &cfg).unwrap();
        assert_eq!(tsc(&time), 0);
        time.update_mtc(0x12, &cfg).unwrap();
        assert_eq!(tsc(&time), 6);
        assert_eq!(time.query_tsc(), Err(TimeError::NoTime));
    }

    #[test]
    fn mtc_without_cpuid_ratio_is_a_config_error() {
        let cfg = TimeConfig::default();
        let mut time = Time::new();
        time.update_mtc(1, &cfg).unwrap();
        assert_eq!(time.update_mtc(2, &cfg), Err(TimeError::BadConfig));
    }

    #[test]
    fn cyc_without_calibration_is_lost() {
        let cfg = config(0);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x100));
        assert_eq!(
            time.update_cyc(4, &cfg, None),
            Err(TimeError::NoCalibration)
        );
        assert_eq!(time.estimate().lost_cyc, 1);
        assert_eq!(tsc(&time), 0x100);
        // The next TSC recovers.
        time.update_tsc(Tsc(0x200));
        assert_eq!(time.estimate().lost_cyc, 0);
    }

    #[test]
    fn cyc_interpolates_with_ratio() {
        let cfg = config(0);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x100));
        // Two TSC ticks per cycle.
        let fcr = Some(Fcr(2 << Fcr::FRACTION_BITS));
        time.update_cyc(4, &cfg, fcr).unwrap();
        assert_eq!(tsc(&time), 0x108);
        time.update_cyc(1, &cfg, fcr).unwrap();
        assert_eq!(tsc(&time), 0x10a);
    }

    #[test]
    fn first_cyc_after_mtcs_drops_earlier_periods() {
        let cfg = config(0);
        let mut time = Time::new();
        time.update_tsc(Tsc(0x1000));
        time.update_tma(0x10, 0, &cfg).unwrap();
        let fcr = Some(Fcr(1 << Fcr::FRACTION_BITS));
        // fc is zero after TMA with fc 0: CTC unchanged, nothing to drop.
        time.update_cyc(2, &cfg, fcr).unwrap();
        assert_eq!(tsc(&time), 0x1002);
        // Two MTC periods of 3 TSC ticks each; the first CYC after them
        // spans both: 8 cycles, 3 of which belong to the first period.
        time.update_mtc(0x11, &cfg).unwrap();
        time.update_mtc(0x12, &cfg).unwrap();
        assert_eq!(tsc(&time), 0x1006);
        time.update_cyc(8, &cfg, fcr).unwrap();
        assert_eq!(tsc(&time), 0x1006 + 5);
    }
}
