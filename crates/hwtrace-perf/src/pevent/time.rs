//! perf time ↔ TSC conversion.
//!
//! perf stamps records with `perf_clock` nanoseconds; the kernel publishes
//! the inverse of its TSC → ns conversion in `perf_event_mmap_page`
//! (`time_zero`, `time_shift`, `time_mult`, valid when `cap_user_time_zero`).
//! libipt-sb (`pev_time_to_tsc`) converts
//!
//! ```text
//! t    = time - time_zero                       (wrapping)
//! tsc  = (t / mult) << shift  +  ((t % mult) << shift) / mult
//! ```
//!
//! i.e. quotient and remainder are shifted separately, so the result is
//! `floor(t << shift / mult)` as long as `(t % mult) << shift` fits in 64 bits;
//! all operations wrap like their C `uint64_t` counterparts. A time of 0 marks
//! records perf synthesized (e.g. the initial MMAPs) and converts to TSC 0.

use hwtrace_types::Tsc;
use thiserror::Error;

/// The conversion parameters (`--pevent:time-zero/-shift/-mult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeConversion {
    /// `perf_event_mmap_page.time_zero`.
    pub zero: u64,
    /// `perf_event_mmap_page.time_shift`.
    pub shift: u16,
    /// `perf_event_mmap_page.time_mult`.
    pub mult: u32,
}

impl Default for TimeConversion {
    /// libipt's tools default: zero 0, shift 0, mult 1 (perf time is TSC).
    fn default() -> Self {
        Self {
            zero: 0,
            shift: 0,
            mult: 1,
        }
    }
}

/// The conversion cannot be done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TimeError {
    /// `time_mult` is zero (libipt: "bad configuration").
    #[error("time-mult is zero")]
    ZeroMult,
}

impl TimeConversion {
    /// `shift` as the x86 shift instruction uses it (the count is masked to
    /// 6 bits; C leaves larger counts undefined).
    fn shift(&self) -> u32 {
        u32::from(self.shift) & 63
    }

    /// perf time → TSC, with libipt's rounding.
    pub fn time_to_tsc(&self, time: u64) -> Result<Tsc, TimeError> {
        if time == 0 {
            return Ok(Tsc(0));
        }
        if self.mult == 0 {
            return Err(TimeError::ZeroMult);
        }
        let mult = u64::from(self.mult);
        let t = time.wrapping_sub(self.zero);
        let quot = (t / mult).wrapping_shl(self.shift());
        let rem = (t % mult).wrapping_shl(self.shift()) / mult;
        Ok(Tsc(quot.wrapping_add(rem)))
    }

    /// TSC → perf time (libipt's `pev_time_from_tsc`): the shifted-out low
    /// bits are scaled separately, then `time_zero` is added back.
    pub fn tsc_to_time(&self, tsc: Tsc) -> Result<u64, TimeError> {
        if self.mult == 0 {
            return Err(TimeError::ZeroMult);
        }
        let mult = u64::from(self.mult);
        let shift = self.shift();
        let quot = (tsc.0 >> shift).wrapping_mul(mult);
        let low_mask = (1u64 << shift).wrapping_sub(1);
        let rem = (tsc.0 & low_mask).wrapping_mul(mult) >> shift;
        Ok(self.zero.wrapping_add(quot).wrapping_add(rem))
    }
}

/// Moves a record's TSC `offset` ticks earlier (`--pevent:tsc-offset`), the way
/// libipt-sb does: a positive offset clamps at zero instead of wrapping, and
/// a "negative" offset (top bit set) moves records later by its magnitude.
pub fn apply_tsc_offset(tsc: Tsc, offset: u64) -> Tsc {
    let t = tsc.0;
    if offset <= t {
        Tsc(t - offset)
    } else if (offset as i64) >= 0 {
        Tsc(0)
    } else {
        // Here t < offset, so libipt takes the wrapping subtraction, which
        // adds the two's complement magnitude of the negative offset.
        Tsc(t.wrapping_sub(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_with_defaults() {
        let c = TimeConversion::default();
        assert_eq!(c.time_to_tsc(0x1234), Ok(Tsc(0x1234)));
        assert_eq!(c.tsc_to_time(Tsc(0x1234)), Ok(0x1234));
    }

    #[test]
    fn time_zero_maps_to_tsc_zero() {
        let c = TimeConversion {
            zero: 100,
            shift: 3,
            mult: 7,
        };
        assert_eq!(c.time_to_tsc(0), Ok(Tsc(0)));
    }

    #[test]
    fn rounding_splits_quotient_and_remainder() {
        // t = 1000 - 10 = 990; 990 / 7 = 141 r 3; 141 << 4 = 2256;
        // (3 << 4) / 7 = 48 / 7 = 6; floor(990 * 16 / 7) = floor(2262.857) = 2262.
        let c = TimeConversion {
            zero: 10,
            shift: 4,
            mult: 7,
        };
        assert_eq!(c.time_to_tsc(1000), Ok(Tsc(2262)));
        // Back: 2262 >> 4 = 141, * 7 = 987; (2262 & 15) = 6, * 7 = 42 >> 4 = 2;
        // 10 + 987 + 2 = 999 (truncation loses one ns).
        assert_eq!(c.tsc_to_time(Tsc(2262)), Ok(999));
    }

    #[test]
    fn realistic_round_trip_within_one_tick() {
        // A 2.1 GHz TSC: perf ns = tsc * mult >> shift with mult/2^shift ≈ 1/2.1.
        let c = TimeConversion {
            zero: 0xffff_8000_0000,
            shift: 31,
            mult: 1_022_611_260,
        };
        for tsc in [1u64, 1 << 20, 123_456_789_012, 1 << 50] {
            let time = c.tsc_to_time(Tsc(tsc)).unwrap();
            let back = c.time_to_tsc(time).unwrap().0;
            assert!(back <= tsc && tsc - back <= 3, "{tsc} -> {time} -> {back}");
        }
    }

    #[test]
    fn zero_mult_is_an_error() {
        let c = TimeConversion {
            zero: 0,
            shift: 0,
            mult: 0,
        };
        assert_eq!(c.time_to_tsc(5), Err(TimeError::ZeroMult));
        assert_eq!(c.tsc_to_time(Tsc(5)), Err(TimeError::ZeroMult));
        // Synthesized records still convert.
        assert_eq!(c.time_to_tsc(0), Ok(Tsc(0)));
    }

    #[test]
    fn huge_shift_does_not_panic() {
        let c = TimeConversion {
            zero: 0,
            shift: u16::MAX,
            mult: 3,
        };
        let _ = c.time_to_tsc(u64::MAX);
        let _ = c.tsc_to_time(Tsc(u64::MAX));
    }

    #[test]
    fn tsc_offset_like_libipt() {
        assert_eq!(apply_tsc_offset(Tsc(10), 3), Tsc(7));
        assert_eq!(apply_tsc_offset(Tsc(10), 10), Tsc(0));
        // Positive offsets clamp at zero.
        assert_eq!(apply_tsc_offset(Tsc(2), 3), Tsc(0));
        // Negative offsets (two's complement) move records later.
        assert_eq!(apply_tsc_offset(Tsc(2), (-5i64) as u64), Tsc(7));
        assert_eq!(apply_tsc_offset(Tsc(0), (-1i64) as u64), Tsc(1));
    }
}
