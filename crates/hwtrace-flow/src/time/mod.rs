//! Timing: turning TSC, TMA, MTC, CYC and CBR packets into an estimated
//! time-stamp counter value.
//!
//! Two small state machines work side by side, each fed one packet at a
//! time by whoever walks the trace (ptdump's printer, the event decoder):
//!
//! - [`TimeCal`] estimates how many fast-counter ticks (TSC units) one core
//!   cycle takes, the *fast-counter ratio* ([`Fcr`]), from CYC packets
//!   counted between two MTC packets, between two TSC packets in PSB+, or
//!   from CBR and the nominal frequency.
//! - [`Time`] keeps the estimated TSC: a TSC packet sets it, TMA places the
//!   following MTC packets on the same clock, MTC advances it by whole
//!   crystal-clock periods and CYC interpolates between them using the
//!   ratio from [`TimeCal`].
//!
//! The arithmetic follows Intel's reference decoder (libipt) so that tools
//! built on it print the same numbers; see the Intel SDM, vol. 3, chapter
//! "Intel Processor Trace", section "Timing Packets" and the CPUID leaf 0x15
//! description for the TSC / crystal clock relation.
//!
//! The module is free of I/O; errors are [`TimeError`] values whose Display
//! is the wording ptdump uses.

mod calibration;
mod clock;
mod ctc;

pub use calibration::TimeCal;
pub use clock::{Time, TscEstimate};

/// A decoder's timing state, as far as it decides the times of the items
/// it decodes next: two decoders of one trace whose states are equal stamp
/// the same times from there on. Compared where a parallel decode splices
/// one unit's decode onto the decode before it
/// ([`Probe`](crate::parallel::Probe)): a unit starts at its PSB with
/// only what the timing packets shortly before it told its clock, and its
/// first items' times (an MTC period's length, a CYC's cycles turned into
/// TSC ticks) may hang on what the decode before it learned earlier. The
/// calibration is compared [`settled`](TimeCal::settled): what it keeps
/// only about the past is left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockState {
    /// The estimate as the packets so far left it.
    pub time: Time,
    /// The fast-counter calibration, once a CYC packet was seen (CYC
    /// packets are the only ones it times; before, it cannot decide
    /// anything, and leaving it out lets traces without CYC splice).
    pub cal: Option<TimeCal>,
    /// The estimate at the last answer to the instruction layer (the time
    /// its items are stamped with).
    pub answered: Time,
}

use core::fmt;

/// What the timing code needs to know about the tracing configuration.
///
/// All fields default to zero / false, which is what ptdump assumes when
/// no option says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimeConfig {
    /// The MTC frequency as programmed in IA32_RTIT_CTL.MTCFreq (bits
    /// 17:14): one MTC packet every 2^`mtc_freq` crystal-clock (CTC) ticks.
    pub mtc_freq: u8,
    /// The nominal core:bus ratio (MSR_PLATFORM_INFO bits 15:8); zero if
    /// unknown. With it, a CBR packet alone gives a calibration.
    pub nom_freq: u8,
    /// CPUID.(EAX=15H):EAX, the denominator of the TSC / crystal clock
    /// ratio. Zero if unknown: MTC packets then cannot advance the time.
    pub cpuid_0x15_eax: u32,
    /// CPUID.(EAX=15H):EBX, the numerator of the TSC / crystal clock ratio.
    pub cpuid_0x15_ebx: u32,
    /// Erratum SKL168 (CYC packets may be dropped right before a PSB):
    /// when set, calibration distrusts the first MTC period after a PSB if
    /// it looks like cycles went missing.
    pub skl168: bool,
}

/// Why a timing update or query failed.
///
/// The Display text is the wording of Intel's reference decoder, so that
/// tools printing these errors match its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeError {
    /// No TSC packet has been seen yet (or, for calibration, there is no
    /// fast-counter ratio yet): only relative time is known.
    NoTime,
    /// No CBR packet has been seen yet.
    NoCbr,
    /// A CYC packet arrived without a calibration; it was counted as lost.
    NoCalibration,
    /// A packet's payload cannot be used: a zero core:bus ratio, or a CTC
    /// value that went backwards by more than one wrap-around.
    BadPacket,
    /// A packet arrived where it makes no sense: a TMA without a preceding
    /// TSC, or a second TMA for one TSC.
    BadContext,
    /// The configuration cannot convert CTC ticks to TSC ticks: CPUID leaf
    /// 0x15 EAX or EBX is zero.
    BadConfig,
    /// The internal state is inconsistent, or an intermediate value would
    /// overflow.
    Internal,
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeError::NoTime => "no timing information",
            TimeError::NoCbr => "no core:bus ratio",
            TimeError::NoCalibration => "no calibration",
            TimeError::BadPacket => "unknown packet",
            TimeError::BadContext => "unexpected packet context",
            TimeError::BadConfig => "bad configuration",
            TimeError::Internal => "internal error",
        })
    }
}

impl core::error::Error for TimeError {}

/// The fast-counter ratio: TSC ticks per core cycle, as a fixed-point
/// number with [`Fcr::FRACTION_BITS`] fractional bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Fcr(pub u64);

impl Fcr {
    /// The number of fractional bits in the fixed-point representation.
    pub const FRACTION_BITS: u32 = 8;

    /// The ratio as a floating-point number (for display).
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / (1u64 << Self::FRACTION_BITS) as f64
    }
}
