//! Crystal-clock (CTC) arithmetic shared by [`Time`](super::Time) and
//! [`TimeCal`](super::TimeCal).
//!
//! MTC packets carry 8 bits of the CTC counter starting at bit
//! `mtc_freq`; TMA packets carry its low 16 bits (SDM vol. 3, "MTC Packet"
//! and "TMA Packet"). Shifts are done with checked operations so that a
//! nonsensical `mtc_freq` gives nonsensical numbers, never a panic.

use super::{TimeConfig, TimeError};

/// The number of CTC bits an MTC packet carries.
pub(super) const MTC_BITS: u32 = 8;
/// The number of CTC bits a TMA packet carries.
pub(super) const TMA_CTC_BITS: u32 = 16;
/// The CTC bits a TMA packet carries, as a mask.
pub(super) const TMA_CTC_MASK: u32 = (1 << TMA_CTC_BITS) - 1;

/// `1 << shift` in 32 bits, or zero if the bit falls off the top.
pub(super) fn bit32(shift: u32) -> u32 {
    1u32.checked_shl(shift).unwrap_or(0)
}

/// `value << shift` in 32 bits, or zero if everything falls off the top.
pub(super) fn shl32(value: u32, shift: u32) -> u32 {
    value.checked_shl(shift).unwrap_or(0)
}

/// The CTC value an MTC payload stands for.
pub(super) fn mtc_ctc(payload: u8, config: &TimeConfig) -> u32 {
    shl32(u32::from(payload), u32::from(config.mtc_freq))
}

/// The number of CTC bits MTC packets cover: `mtc_freq + 8`.
pub(super) fn mtc_high_bit(config: &TimeConfig) -> u32 {
    u32::from(config.mtc_freq) + MTC_BITS
}

/// The CTC ticks from `last` to `now`, allowing for one wrap-around of the
/// bits MTC packets cover.
pub(super) fn ctc_delta(now: u32, last: u32, config: &TimeConfig) -> Result<u32, TimeError> {
    let mut now = now;
    if now < last {
        now = now.wrapping_add(bit32(mtc_high_bit(config)));
        if now < last {
            return Err(TimeError::BadPacket);
        }
    }
    Ok(now - last)
}

/// Converts CTC ticks to fast-counter (TSC) ticks with the CPUID leaf 0x15
/// ratio: `ctc * ebx / eax`.
pub(super) fn ctc_to_fc(ctc: u64, config: &TimeConfig) -> Result<u64, TimeError> {
    let eax = u64::from(config.cpuid_0x15_eax);
    let ebx = u64::from(config.cpuid_0x15_ebx);
    if eax == 0 || ebx == 0 {
        return Err(TimeError::BadConfig);
    }
    Ok(ctc.wrapping_mul(ebx) / eax)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mtc_freq: u8) -> TimeConfig {
        TimeConfig {
            mtc_freq,
            cpuid_0x15_eax: 2,
            cpuid_0x15_ebx: 6,
            ..TimeConfig::default()
        }
    }

    #[test]
    fn delta_without_wrap() {
        assert_eq!(ctc_delta(0x30, 0x10, &config(0)), Ok(0x20));
    }

    #[test]
    fn delta_corrects_one_wrap() {
        // With mtc_freq 2 the MTC bits cover CTC[9:2]: wrap at 0x400.
        assert_eq!(ctc_delta(0x004, 0x3fc, &config(2)), Ok(8));
    }

    #[test]
    fn delta_rejects_two_wraps() {
        assert_eq!(
            ctc_delta(0x0, 0x1000, &config(0)),
            Err(TimeError::BadPacket)
        );
    }

    #[test]
    fn fc_uses_cpuid_ratio() {
        assert_eq!(ctc_to_fc(5, &config(0)), Ok(15));
        let no_ratio = TimeConfig::default();
        assert_eq!(ctc_to_fc(5, &no_ratio), Err(TimeError::BadConfig));
    }

    #[test]
    fn absurd_mtc_freq_does_not_panic() {
        let cfg = config(200);
        assert_eq!(mtc_ctc(0xff, &cfg), 0);
        assert_eq!(ctc_delta(1, 2, &cfg), Err(TimeError::BadPacket));
    }
}
