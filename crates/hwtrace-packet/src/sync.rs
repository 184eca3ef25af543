//! Finding PSB packets: the points where decoding can start.
//!
//! A PSB is `02 82` eight times (SDM vol. 3C, 33.4.2.17). The search scans
//! 8-byte-aligned words for the pattern, then walks to the end of the
//! repeated run and steps back one PSB length, so a run longer than one PSB
//! (a PSB preceded by bytes that happen to continue the pattern) resolves to
//! the PSB that really ends it. This is the same rule libipt applies, so both
//! find the same sync points.

/// The 16 bytes of a PSB packet.
pub const PSB: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];

const WORD: usize = 8;
const PATTERN_LOHI: u64 = 0x8202_8202_8202_8202;
const PATTERN_HILO: u64 = 0x0282_0282_0282_0282;

/// Whether a whole PSB starts at `at`.
pub fn is_psb_at(data: &[u8], at: usize) -> bool {
    data.get(at..at.saturating_add(PSB.len())) == Some(&PSB[..])
}

#[inline]
fn word_at(data: &[u8], at: usize) -> Option<u64> {
    let bytes = data.get(at..at + WORD)?;
    let mut a = [0u8; WORD];
    a.copy_from_slice(bytes);
    Some(u64::from_le_bytes(a))
}

/// Given a position inside a run of PSB pattern, the PSB that ends the run.
fn psb_ending_run(data: &[u8], mut pos: usize) -> Option<usize> {
    if data.get(pos) != Some(&0x02) {
        pos += 1;
    }
    while pos + 1 < data.len() && data[pos] == 0x02 && data[pos + 1] == 0x82 {
        pos += 2;
    }
    let start = pos.checked_sub(PSB.len())?;
    is_psb_at(data, start).then_some(start)
}

/// The first PSB at or after `start` (found through an aligned word at or
/// after `start`).
pub fn find_psb_forward(data: &[u8], start: usize) -> Option<usize> {
    let mut pos = start.checked_next_multiple_of(WORD)?;
    while pos + WORD <= data.len() {
        let at = pos;
        pos += WORD;
        let Some(w) = word_at(data, at) else { break };
        if w != PATTERN_LOHI && w != PATTERN_HILO {
            continue;
        }
        match psb_ending_run(data, at) {
            Some(found) if found >= start => return Some(found),
            _ => continue,
        }
    }
    None
}

/// The last PSB that starts before `end`, found through an aligned word
/// wholly before `end`.
pub fn find_psb_backward(data: &[u8], end: usize) -> Option<usize> {
    let mut pos = end.min(data.len()) / WORD * WORD;
    while pos >= WORD {
        pos -= WORD;
        let Some(w) = word_at(data, pos) else {
            continue;
        };
        if w != PATTERN_LOHI && w != PATTERN_HILO {
            continue;
        }
        // A run of pattern can continue past `end`; the PSB that ends it is
        // then not before `end`, and returning it would make a backward
        // search stand still (libipt returns it; we keep looking).
        match psb_ending_run(data, pos) {
            Some(found) if found < end => return Some(found),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;
    use std::vec::Vec;

    fn trace(prefix: usize, psbs: &[usize], len: usize) -> Vec<u8> {
        let mut t = std::vec![0u8; len];
        for &p in psbs {
            t[prefix + p..prefix + p + 16].copy_from_slice(&PSB);
        }
        t
    }

    #[test]
    fn finds_psb_at_any_alignment() {
        for at in 0..24 {
            let t = trace(0, &[at], 64);
            assert_eq!(find_psb_forward(&t, 0), Some(at), "at {at}");
            assert_eq!(find_psb_backward(&t, t.len()), Some(at), "at {at}");
        }
    }

    #[test]
    fn forward_skips_psbs_before_start() {
        let t = trace(0, &[0, 40], 80);
        assert_eq!(find_psb_forward(&t, 0), Some(0));
        assert_eq!(find_psb_forward(&t, 1), Some(40));
        assert_eq!(find_psb_forward(&t, 41), None);
    }

    #[test]
    fn a_longer_run_resolves_to_its_last_psb() {
        let mut t = std::vec![0u8; 64];
        for i in 0..12 {
            t[4 + 2 * i] = 0x02;
            t[5 + 2 * i] = 0x82;
        }
        // 24 bytes of pattern from offset 4: the PSB is the last 16 of them.
        assert_eq!(find_psb_forward(&t, 0), Some(12));
    }

    #[test]
    fn backward_never_returns_a_psb_at_or_after_its_start() {
        // Found by fuzzing: a pattern run that starts before `end` and ends
        // after it resolves to a PSB beyond `end`; the search must go on.
        let mut t = std::vec![0u8; 0x80];
        t[0x10..0x20].copy_from_slice(&PSB);
        for i in 0..10 {
            t[0x41 + 2 * i] = 0x02;
            t[0x42 + 2 * i] = 0x82;
        }
        assert_eq!(find_psb_backward(&t, t.len()), Some(0x45));
        assert_eq!(find_psb_backward(&t, 0x50), Some(0x45));
        assert_eq!(find_psb_backward(&t, 0x48), Some(0x10));
        assert_eq!(find_psb_backward(&t, 0x45), Some(0x10));
    }

    #[test]
    fn no_psb_in_noise() {
        let t: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(find_psb_forward(&t, 0), None);
        assert_eq!(find_psb_backward(&t, t.len()), None);
    }
}
