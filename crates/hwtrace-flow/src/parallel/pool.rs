//! [`SourcePool`]: the step sources (decoders, with their caches) a
//! parallel decode passes from unit to unit.
//!
//! A decoder's block, path and instruction caches are most of its memory,
//! and they fill as it decodes, so the peak resident size of a parallel
//! decode is about the number of decoders that ever decoded, times a warm
//! decoder. A pool that creates decoders on demand and hands back the one
//! returned last keeps that number at the most that happened to be busy at
//! once — which depends on thread timing, and on how long the trace runs
//! for the worst moment to come. This pool makes the number part of the
//! configuration instead: it starts with as many decoders as a decode can
//! hold at once (every unit of the window decoding or waiting with the
//! decoder it ends with, the merging thread's own, one being handed over)
//! and hands them out in turn, oldest returned first, so all of them warm
//! up on every trace longer than a few units, and the peak is the same on
//! a trace of 256 MiB as on one of 1 GiB, from run to run. Should more be
//! needed at once after all, one more is created (a decode never waits
//! for a decoder).
//!
//! A decoder that has decoded nothing yet is handed out warmed from the
//! one returned last ([`StepSource::warm_from`](super::StepSource::warm_from)):
//! each would otherwise decode the trace's hot code and record its paths
//! again.

use std::collections::VecDeque;
use std::sync::Mutex;

/// Decoders waiting for their next unit, oldest returned first, each
/// with whether it has decoded (been given back) before.
#[derive(Debug)]
pub(super) struct SourcePool<S> {
    free: Mutex<VecDeque<(S, bool)>>,
}

impl<S> SourcePool<S> {
    /// A pool of `n` sources from `make`.
    pub(super) fn new(n: usize, make: impl Fn() -> S) -> Self {
        Self {
            free: Mutex::new((0..n).map(|_| (make(), false)).collect()),
        }
    }

    /// The source returned longest ago, or a new one if none is free;
    /// warmed from the one returned last (`warm`) if it has not decoded
    /// yet.
    pub(super) fn take(&self, make: impl Fn() -> S, warm: impl Fn(&mut S, &S)) -> S {
        let Ok(mut q) = self.free.lock() else {
            return make();
        };
        let (mut src, decoded) = q.pop_front().unwrap_or_else(|| (make(), false));
        if !decoded && let Some((last, true)) = q.back() {
            warm(&mut src, last);
        }
        src
    }

    /// Returns `src` for a later unit.
    pub(super) fn give_back(&self, src: S) {
        if let Ok(mut q) = self.free.lock() {
            q.push_back((src, true));
        }
    }

    /// How many sources are free.
    #[cfg(test)]
    pub(super) fn free(&self) -> usize {
        self.free.lock().map_or(0, |q| q.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn sources_are_made_up_front_and_handed_out_in_turn() {
        let made = Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            made.get()
        };
        let pool = SourcePool::new(3, make);
        assert_eq!((made.get(), pool.free()), (3, 3));
        // Oldest first: every source gets its turn, so all of them warm
        // up, however few are busy at once.
        let mut order = Vec::new();
        for _ in 0..6 {
            let s = pool.take(make, |_, _| {});
            order.push(s);
            pool.give_back(s);
        }
        assert_eq!(order, [1, 2, 3, 1, 2, 3]);
        // More at once than made up front: one more is made.
        let held: Vec<_> = (0..4).map(|_| pool.take(make, |_, _| {})).collect();
        assert_eq!(held, [1, 2, 3, 4]);
        assert_eq!((made.get(), pool.free()), (4, 0));
    }

    #[test]
    fn sources_that_never_decoded_are_warmed_from_the_last_returned() {
        // A source: its number, and the number it was warmed from.
        let made = Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            (made.get(), 0)
        };
        let warm = |s: &mut (i32, i32), from: &(i32, i32)| s.1 = from.0;
        let pool = SourcePool::new(3, make);
        // Nothing returned yet: nothing to warm from.
        let (a, b) = (pool.take(make, warm), pool.take(make, warm));
        assert_eq!((a, b), ((1, 0), (2, 0)));
        pool.give_back(b);
        pool.give_back(a);
        // The third has not decoded: warmed from the one returned last.
        assert_eq!(pool.take(make, warm), (3, 1));
        // Those that have decoded are handed out as they are.
        assert_eq!(pool.take(make, warm), (2, 0));
        assert_eq!(pool.take(make, warm), (1, 0));
        // None free: one more is made, with none to warm it from.
        assert_eq!(pool.take(make, warm), (4, 0));
    }
}
