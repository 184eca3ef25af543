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

use std::collections::VecDeque;
use std::sync::Mutex;

/// Decoders waiting for their next unit, oldest returned first.
#[derive(Debug)]
pub(super) struct SourcePool<S> {
    free: Mutex<VecDeque<S>>,
}

impl<S> SourcePool<S> {
    /// A pool of `n` sources from `make`.
    pub(super) fn new(n: usize, make: impl Fn() -> S) -> Self {
        Self {
            free: Mutex::new((0..n).map(|_| make()).collect()),
        }
    }

    /// The source returned longest ago, or a new one if none is free.
    pub(super) fn take(&self, make: impl Fn() -> S) -> S {
        let free = self.free.lock().ok().and_then(|mut q| q.pop_front());
        free.unwrap_or_else(make)
    }

    /// Returns `src` for a later unit.
    pub(super) fn give_back(&self, src: S) {
        if let Ok(mut q) = self.free.lock() {
            q.push_back(src);
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
            let s = pool.take(make);
            order.push(s);
            pool.give_back(s);
        }
        assert_eq!(order, [1, 2, 3, 1, 2, 3]);
        // More at once than made up front: one more is made.
        let held: Vec<_> = (0..4).map(|_| pool.take(make)).collect();
        assert_eq!(held, [1, 2, 3, 4]);
        assert_eq!((made.get(), pool.free()), (4, 0));
    }
}
