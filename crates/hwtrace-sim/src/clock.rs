//! The simulated clocks behind PT's timing packets (SDM vol. 3C, 33.3.7
//! "Timing Packets" and 33.8 "Calibration").
//!
//! One clock drives everything: the time-stamp counter of
//! [`TscModel`], `start + ticks_per_insn · i` when
//! instruction `i` (an index into [`Execution::insns`](crate::Execution::insns))
//! begins. The other clocks are fixed fractions of it:
//!
//! * **Core clock** (CYC packets, 33.3.6 "Cycle-Accurate Mode"): the core
//!   runs at `core_bus_ratio` × the bus clock and the TSC at
//!   `tsc_bus_ratio` × the bus clock (the nominal ratio,
//!   `MSR_PLATFORM_INFO[15:8]`), so the core cycles since the first
//!   instruction are `⌊(TSC − start) · core_bus_ratio / tsc_bus_ratio⌋`.
//!   `core_bus_ratio` is the CBR packet's payload (33.4.2.14).
//! * **Crystal clock / ART** (MTC and TMA packets, 33.3.7.2 "Mini Time
//!   Counter"): `TSC = ART · EBX / EAX` with CPUID.15H's EAX and EBX (the
//!   offset K of 33.8 is 0), so `ART = ⌊TSC · EAX / EBX⌋`. The common
//!   timestamp copy (CTC) is the ART.
//!
//! The TSC keeps counting with `TSCEn = 0`; without a [`TscModel`] the
//! encoder uses [`TscModel::DEFAULT_CLOCK`](crate::TscModel::DEFAULT_CLOCK).
//!
//! **Resolution** a decoder can reach from the packets (what
//! `tests/timing_filters.rs` checks with libipt): a TSC packet gives the TSC
//! exactly. With MTC alone, the TSC at an MTC is the TSC of an ART tick,
//! so between MTCs the estimate lags by up to one MTC period
//! (`2^MTCFreq · EBX / EAX` TSC ticks) plus one instruction's ticks. With
//! CYC before a packet, the estimate is within
//! `3 · ticks_per_insn + 3 + ⌈C / 256⌉` TSC ticks of the instruction's TSC,
//! where `C` is the core cycles in one MTC period
//! (`2^MTCFreq · EBX / EAX · core_bus_ratio / tsc_bus_ratio`): the MTC it
//! counts from lies up to one instruction before the boundary where it is
//! written (one instruction); a decoder that recalibrates the cycle:TSC
//! ratio from MTC to MTC (libipt and hwtrace-flow do, SDM 33.8.3) sees a
//! period's cycles quantised to whole instructions, and one instruction
//! more when the MTC fell where PacketEn = 0 and no CYC preceded it (after
//! a SYSCALL), which costs up to two instructions' ticks by the end of the
//! period; the ratio's 8 fraction bits lose up to `C / 256` ticks over a
//! period; the rest is rounding. Both bounds assume a whole number of
//! TSC ticks per MTC period (`2^MTCFreq · EBX / EAX`): decoders convert
//! each MTC's CTC step to TSC ticks with integer division (libipt's
//! `pt_time_ctc_fc`), so a fraction there is lost at every MTC and the
//! error grows with the MTCs since the last TSC packet.

use hwtrace_packet::Tma;

use crate::pt_encoder::TscModel;

/// The timing options of `IA32_RTIT_CTL` beyond TSCEn, and the clock ratios
/// the hardware would report (SDM vol. 3C, 33.2.8.2 "IA32_RTIT_CTL MSR").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Timing {
    /// `MTCEn = 1` with `MTCFreq = n`: an MTC packet whenever CTC bit `n`
    /// toggles, i.e. every `2^n` ART ticks (0..=15). Needs
    /// [`Timing::tsc_ctc_ratio`].
    pub mtc_freq: Option<u8>,
    /// `CYCEn = 1` with `CYCThresh = n` (0..=15): a CYC packet before a
    /// control-flow packet when at least `2^(n-1)` core cycles (any number
    /// for 0) passed since the last CYC. Needs [`Timing::cbr`].
    pub cyc_thresh: Option<u8>,
    /// The core:bus ratio: written as a CBR packet in every PSB+ when set,
    /// and (with [`Timing::tsc_bus_ratio`]) the speed of the core clock.
    pub cbr: Option<u8>,
    /// The TSC:bus ratio (the nominal ratio a decoder is given as
    /// `nom_freq`); must not be 0 when CYC is on.
    pub tsc_bus_ratio: u8,
    /// CPUID.15H `(EAX, EBX)`: the TSC ticks `EBX / EAX` times per ART
    /// tick. `EBX / EAX` must be below 512 so TMA's 9-bit fast counter can
    /// hold the TSC ticks into an ART tick.
    pub tsc_ctc_ratio: Option<(u32, u32)>,
}

/// Why a timing configuration cannot be simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimingError {
    /// MTCFreq or CYCThresh above 15 (4-bit fields of IA32_RTIT_CTL).
    #[error("{field} {value} does not fit IA32_RTIT_CTL's 4-bit field")]
    FieldTooLarge {
        /// `MTCFreq` or `CYCThresh`.
        field: &'static str,
        /// The value given.
        value: u8,
    },
    /// MTC (or TMA) needs the CPUID.15H ratio.
    #[error("MTC needs the CPUID.15H TSC/ART ratio (EAX, EBX both non-zero)")]
    NoCtcRatio,
    /// The CPUID.15H ratio is 512 or more TSC ticks per ART tick.
    #[error(
        "CPUID.15H ratio {ebx}/{eax}: 512 or more TSC ticks per ART tick do not fit TMA's fast counter"
    )]
    CtcRatioTooLarge {
        /// CPUID.15H EAX.
        eax: u32,
        /// CPUID.15H EBX.
        ebx: u32,
    },
    /// CYC needs the core clock: a core:bus ratio and a TSC:bus ratio.
    #[error("CYC needs a non-zero core:bus ratio (CBR) and TSC:bus ratio")]
    NoCoreClock,
}

impl Timing {
    /// The clock ratios hwtrace's simulated captures use (no MTC, no CYC
    /// until asked): core 32 × bus clock, TSC 24 × bus clock (decoders:
    /// nominal frequency 24), CPUID.15H EAX = 2, EBX = 216: 108 TSC ticks
    /// per crystal tick, a whole number for every MTCFreq, which is what
    /// lets decoders keep the resolution the module documentation gives.
    pub const WHOLE_RATIOS: Timing = Timing {
        mtc_freq: None,
        cyc_thresh: None,
        cbr: Some(32),
        tsc_bus_ratio: 24,
        tsc_ctc_ratio: Some((2, 216)),
    };

    /// [`WHOLE_RATIOS`](Self::WHOLE_RATIOS) with MTC packets every
    /// `2^mtc_freq` crystal ticks and CYC packets at `cyc_thresh` as
    /// asked; `None` when neither is (then no CBR either: the default).
    pub fn with_whole_ratios(mtc_freq: Option<u8>, cyc_thresh: Option<u8>) -> Option<Timing> {
        (mtc_freq.is_some() || cyc_thresh.is_some()).then_some(Timing {
            mtc_freq,
            cyc_thresh,
            ..Self::WHOLE_RATIOS
        })
    }

    /// Refuses what cannot be simulated, in words.
    pub fn validate(&self) -> Result<(), TimingError> {
        for (field, value) in [("MTCFreq", self.mtc_freq), ("CYCThresh", self.cyc_thresh)] {
            if let Some(value) = value.filter(|&v| v > 15) {
                return Err(TimingError::FieldTooLarge { field, value });
            }
        }
        if self.mtc_freq.is_some() {
            match self.tsc_ctc_ratio {
                Some((eax, ebx)) if eax == 0 || ebx == 0 => return Err(TimingError::NoCtcRatio),
                None => return Err(TimingError::NoCtcRatio),
                Some((eax, ebx)) if u64::from(ebx) >= 512 * u64::from(eax) => {
                    return Err(TimingError::CtcRatioTooLarge { eax, ebx });
                }
                Some(_) => {}
            }
        }
        if self.cyc_thresh.is_some() && (self.cbr.unwrap_or(0) == 0 || self.tsc_bus_ratio == 0) {
            return Err(TimingError::NoCoreClock);
        }
        Ok(())
    }

    /// The core cycles CYCThresh asks to pass before the next CYC
    /// (33.3.6: `2^(CYCThresh-1)`, 1 for 0).
    pub fn cyc_threshold_cycles(&self) -> Option<u64> {
        self.cyc_thresh
            .map(|n| if n == 0 { 1 } else { 1 << (n - 1) })
    }
}

/// All clocks at instruction boundaries, derived from one [`TscModel`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    tsc: TscModel,
    timing: Timing,
}

impl Clock {
    pub(crate) fn new(tsc: TscModel, timing: Timing) -> Self {
        Clock { tsc, timing }
    }

    /// The TSC (full 64 bits) when instruction `index` begins.
    pub(crate) fn tsc(&self, index: usize) -> u64 {
        self.tsc
            .start
            .wrapping_add(self.tsc.ticks_per_insn.wrapping_mul(index as u64))
    }

    /// Core cycles since the first instruction, when `index` begins.
    pub(crate) fn cycles(&self, index: usize) -> u64 {
        let ticks = u128::from(self.tsc.ticks_per_insn) * index as u128;
        let core = u128::from(self.timing.cbr.unwrap_or(0));
        let tsc = u128::from(self.timing.tsc_bus_ratio.max(1));
        (ticks * core / tsc) as u64
    }

    /// The ART (= CTC) when instruction `index` begins.
    pub(crate) fn art(&self, index: usize) -> u64 {
        let (eax, ebx) = self.timing.tsc_ctc_ratio.unwrap_or((1, 1));
        (u128::from(self.tsc(index)) * u128::from(eax) / u128::from(ebx.max(1))) as u64
    }

    /// The MTC period count (`CTC >> MTCFreq`) when `index` begins.
    pub(crate) fn mtc_period(&self, index: usize, mtc_freq: u8) -> u64 {
        self.art(index) >> mtc_freq
    }

    /// The TMA after the TSC of instruction `index` (33.4.2.12): `CTC[15:0]`
    /// and the TSC ticks since that CTC tick (the fast counter).
    pub(crate) fn tma(&self, index: usize) -> Tma {
        let (eax, ebx) = self.timing.tsc_ctc_ratio.unwrap_or((1, 1));
        let art = self.art(index);
        let at_tick = u128::from(art) * u128::from(ebx) / u128::from(eax.max(1));
        let fc = u128::from(self.tsc(index)).saturating_sub(at_tick);
        Tma {
            ctc: art as u16,
            fc: (fc as u16) & 0x1ff,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            mtc_freq: Some(2),
            cyc_thresh: Some(0),
            cbr: Some(32),
            tsc_bus_ratio: 16,
            tsc_ctc_ratio: Some((2, 7)),
        }
    }

    #[test]
    fn clocks_follow_the_ratios() {
        let c = Clock::new(
            TscModel {
                start: 1000,
                ticks_per_insn: 3,
            },
            timing(),
        );
        assert_eq!(c.tsc(10), 1030);
        // The core runs twice as fast as the TSC.
        assert_eq!(c.cycles(10), 60);
        // ART = TSC · 2 / 7.
        assert_eq!(c.art(10), 1030 * 2 / 7);
        assert_eq!(c.mtc_period(10, 2), (1030 * 2 / 7) >> 2);
        let tma = c.tma(10);
        assert_eq!(u64::from(tma.ctc), 1030 * 2 / 7);
        // 294 ART ticks are at TSC 1029; one tick later is the TSC.
        assert_eq!(tma.fc, 1);
    }

    #[test]
    fn validation_names_what_is_missing() {
        assert_eq!(timing().validate(), Ok(()));
        let t = Timing {
            tsc_ctc_ratio: None,
            ..timing()
        };
        assert_eq!(t.validate(), Err(TimingError::NoCtcRatio));
        let t = Timing {
            cbr: None,
            ..timing()
        };
        assert_eq!(t.validate(), Err(TimingError::NoCoreClock));
        let t = Timing {
            mtc_freq: Some(16),
            ..timing()
        };
        assert!(matches!(
            t.validate(),
            Err(TimingError::FieldTooLarge { value: 16, .. })
        ));
        let t = Timing {
            tsc_ctc_ratio: Some((1, 512)),
            ..timing()
        };
        assert!(matches!(
            t.validate(),
            Err(TimingError::CtcRatioTooLarge { .. })
        ));
        assert_eq!(timing().cyc_threshold_cycles(), Some(1));
        let t = Timing {
            cyc_thresh: Some(4),
            ..timing()
        };
        assert_eq!(t.cyc_threshold_cycles(), Some(8));
    }
}
