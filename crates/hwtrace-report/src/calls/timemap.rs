//! [`TimeMap`]: the time at any point of the flow, from the timestamps the
//! trace gives now and then.
//!
//! A trace gives a timestamp only at some events (a PSB+, an enable: every
//! few KiB of trace), so a point's own time is the last timestamp before
//! it: functions shorter than the gap between two timestamps took no time,
//! and a timeline of them is a few columns of zero-width calls. Here the
//! time between two timestamps is spread by instructions executed: the
//! instruction count when timestamp `t0` came and the one when `t1` came
//! are at `t0` and `t1`, those between evenly in between; past the last
//! one, the last interval's rate goes on. A point is mapped once the
//! timestamp after it has come ([`TimeMap::knows`]): callers hold what
//! they write until then.

use super::tracker::Stamp;
use hwtrace_types::Tsc;

/// How many points a caller holds waiting for the timestamp after them at
/// most: past that (a trace whose timestamps stopped), the oldest go with
/// the last interval's rate.
pub const MAX_WAITING: usize = 1 << 16;

/// How many timestamps are kept where they came at most (16 bytes each):
/// past that, every other one of the older half is let go, so the
/// interpolation is coarser where only long-open frames (a `main`) still
/// start, and memory stays bounded however long the trace.
pub const MAX_KNOTS: usize = 1 << 16;

/// Where each timestamp came: the instructions executed before it and its
/// TSC, in trace order (one per change of the time), thinned out in the
/// past (65,536 at most).
#[derive(Clone, Debug, Default)]
pub struct TimeMap {
    knots: Vec<(u64, u64)>,
}

impl TimeMap {
    /// No timestamp yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A timestamp: `now.tsc` holds from `now.insns` on.
    pub fn note(&mut self, now: Stamp) {
        let Some(Tsc(t)) = now.tsc else {
            return;
        };
        match self.knots.last_mut() {
            Some(last) if last.1 == t => {}
            // Two at one point: the later one holds from there on.
            Some(last) if last.0 == now.insns => last.1 = t,
            _ => self.knots.push((now.insns, t)),
        }
        if self.knots.len() > MAX_KNOTS {
            // The first stays; every other one of the older half goes.
            let old = MAX_KNOTS / 2;
            let mut i = 0;
            self.knots.retain(|_| {
                i += 1;
                i > old || i % 2 == 1
            });
        }
    }

    /// Whether a timestamp came after `insns` instructions (a point there
    /// is mapped for good).
    pub fn knows(&self, insns: u64) -> bool {
        self.knots.last().is_some_and(|&(n, _)| n > insns)
    }

    /// Whether the oldest of `waiting` items held for the time, one that
    /// ends at `end`, is to be written now: it has no time to wait for,
    /// the timestamp after it has come, too many wait (65,536),
    /// or the flow is over (`ending`).
    pub fn settled(&self, end: Stamp, waiting: usize, ending: bool) -> bool {
        ending || end.tsc.is_none() || waiting > MAX_WAITING || self.knows(end.insns)
    }

    /// The ticks from one point to another, `None` where either has no
    /// time.
    pub fn span(&self, start: Stamp, end: Stamp) -> Option<u64> {
        Some(self.ticks(end)?.saturating_sub(self.ticks(start)?))
    }

    /// The TSC at a point (instructions executed before it, and the time
    /// it carries): the last timestamp before it moved on by the
    /// instructions since it came, at the rate to the next one (or, past
    /// the last, the rate from the one before); a point with no time has
    /// none, one before every timestamp kept its own. Monotonic in the
    /// instructions (timestamps going back, from another CPU's stream,
    /// hold still) and equal to each timestamp where it came, so a frame's
    /// children stay inside it.
    pub fn ticks(&self, at: Stamp) -> Option<u64> {
        let (insns, t) = (at.insns, at.tsc?.0);
        let after = self.knots.partition_point(|&(n, _)| n <= insns);
        let Some(k) = after.checked_sub(1) else {
            return Some(t);
        };
        let (n0, t0) = self.knots[k];
        // (None where the time goes back: it holds still.)
        let rate = match self.knots.get(k + 1) {
            Some(&(n1, t1)) => t1.checked_sub(t0).map(|dt| (n1 - n0, dt)),
            None => k
                .checked_sub(1)
                .and_then(|p| self.knots.get(p))
                .and_then(|&(np, tp)| t0.checked_sub(tp).map(|dt| (n0 - np, dt))),
        };
        let Some((dn, dt)) = rate.filter(|&(dn, _)| dn > 0) else {
            return Some(t0);
        };
        let moved = u128::from(insns - n0) * u128::from(dt) / u128::from(dn);
        Some(t0.saturating_add(u64::try_from(moved).unwrap_or(u64::MAX)))
    }

    /// The timestamps kept (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.knots.len()
    }

    /// Whether the kept timestamps rise in instructions and time (tests).
    #[cfg(test)]
    pub(crate) fn rising(&self) -> bool {
        self.knots
            .windows(2)
            .all(|k| k[0].0 < k[1].0 && k[0].1 < k[1].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(insns: u64, tsc: u64) -> Stamp {
        Stamp {
            insns,
            tsc: Some(Tsc(tsc)),
        }
    }

    #[test]
    fn time_is_spread_between_timestamps_and_goes_on_past_the_last() {
        let mut m = TimeMap::new();
        m.note(at(0, 1000));
        assert!(!m.knows(0));
        m.note(at(10, 2000));
        assert!(m.knows(9) && !m.knows(10));
        let t = |m: &TimeMap, n| m.ticks(at(n, 1)).unwrap();
        assert_eq!(
            [t(&m, 0), t(&m, 5), t(&m, 10), t(&m, 15)],
            [1000, 1500, 2000, 2500]
        );
        assert_eq!(
            m.ticks(Stamp {
                insns: 3,
                tsc: None
            }),
            None
        );
        // Going back (another CPU's stream): held still, not backwards.
        m.note(at(20, 500));
        assert_eq!(t(&m, 15), 2000);
    }
}
