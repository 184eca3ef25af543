//! [`RunTally`]: a burst of runs from
//! [`FastDecoder::tally_runs`](super::FastDecoder::tally_runs) counted
//! instead of kept.
//!
//! A caller that only counts instructions needs from a burst its total
//! and where in the trace its last instructions were taken (a flow's
//! endless-loop count goes on from there), not the runs themselves; and
//! a replayed TNT path is many runs at once (a dozen on compiled code),
//! so copying them out was a third of the burst's time on gzip's trace.
//! A tally adds a path up from its record in one step.
//!
//! Two kinds of runs are still kept whole, in a [`RunBuffer`], for the
//! caller to hand out one at a time: the burst's last run when it was a
//! single block (the one run after which the decoder may have met an
//! error, which must follow exactly that run), and the runs taken at or
//! past a trace offset given when the burst starts (where a parallel
//! decode looks for a seam between runs; the burst stops there).

use super::blockcache::{PathRun, TntPath};
use super::runs::RunBuffer;
use hwtrace_packet::ExecMode;
use hwtrace_types::{AddressSpace, TraceOffset};

/// The counted part of a tally: runs added up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// How many runs.
    pub runs: usize,
    /// How many instructions.
    pub insns: u64,
    /// The trace offset the last counted run was taken at (the offset
    /// after the run before it), and the instructions of the counted
    /// runs taken there.
    pub last_at: TraceOffset,
    pub last_insns: u64,
    /// The trace offset after the last counted run (before the first kept
    /// one).
    pub end: TraceOffset,
}

impl Counted {
    /// Adds `insns` instructions taken at `at`, ending at `end`.
    #[inline]
    fn add(&mut self, at: TraceOffset, insns: u64, end: TraceOffset) {
        self.insns += insns;
        if at == self.last_at {
            self.last_insns += insns;
        } else {
            self.last_at = at;
            self.last_insns = insns;
        }
        self.end = end;
    }

    /// Counts one block's run, with the trace offset after it.
    #[inline(always)]
    pub(crate) fn count_run(&mut self, insns: u64, offset: TraceOffset) {
        self.runs += 1;
        let at = self.end;
        self.add(at, insns, offset);
    }

    /// Counts path `path`'s runs, taken at `offset`.
    #[inline(always)]
    pub(crate) fn count_path(&mut self, path: &TntPath, offset: TraceOffset) {
        self.count_runs(
            path.runs as usize,
            u64::from(path.first_insns),
            path.insns,
            offset,
        );
    }

    /// Counts `runs` runs of `insns` instructions, `first` in the first,
    /// all ending at trace offset `offset` (a path's, or the first runs of
    /// one).
    #[inline(always)]
    pub(crate) fn count_runs(&mut self, runs: usize, first: u64, insns: u64, offset: TraceOffset) {
        self.runs += runs;
        // The first run is taken where the run before it ended, the
        // others where the path's TNT packet leaves the trace: what
        // `add` for each leaves, without its branches.
        let rest = insns.saturating_sub(first);
        self.insns += first + rest;
        let at = self.end;
        if rest != 0 && offset != at {
            (self.last_at, self.last_insns) = (offset, rest);
        } else {
            let before = if at == self.last_at {
                self.last_insns
            } else {
                0
            };
            (self.last_at, self.last_insns) = (at, before + first + rest);
        }
        self.end = offset;
    }

    /// Counts a stretch of paths, `runs` runs of `insns` instructions,
    /// each path taken at a trace offset past the one before and with
    /// instructions after its first run, the last path's `rest` of them
    /// taken at `offset`: what [`count_runs`](Self::count_runs) for each
    /// path leaves, as only the last path's offset and runs after the
    /// first decide where the last instructions were taken.
    #[inline(always)]
    pub(crate) fn count_stretch(
        &mut self,
        runs: usize,
        insns: u64,
        rest: u64,
        offset: TraceOffset,
    ) {
        self.runs += runs;
        self.insns += insns;
        (self.last_at, self.last_insns, self.end) = (offset, rest, offset);
    }
}

/// How many runs a [`RunTally::new`] counts in a burst: more than a
/// [`RunBuffer`] holds, as counting a run costs no copy. Long bursts pay:
/// a burst goes back to its caller when it is full, and a full burst
/// stops between the bits of a TNT packet, so the next one starts on a
/// TNT path keyed by the bits left, which is rarely recorded and so goes
/// block by block. With 256 runs a tenth of the counting chains on gzip's
/// and Unzip's traces ended on such a path; with 4,096, `flow --quiet
/// --stats` runs 10-16% fewer instructions on the benchmark traces
/// (callgrind).
pub const DEFAULT_TALLY_CAPACITY: usize = 4096;

/// A burst of runs, counted; see the module documentation.
#[derive(Clone, Debug)]
pub struct RunTally {
    cap: usize,
    counted: Counted,
    /// Runs kept whole, after the counted ones.
    kept: RunBuffer,
    /// Runs taken at or past this offset are kept, and end the burst.
    until: TraceOffset,
    reached: bool,
    /// Events passed over between runs (tracing disabled at a branch and
    /// enabled again elsewhere), none of them a status update.
    events: u64,
    /// Whether bursts may pass over events ([`Self::set_passes_toggles`]).
    toggles: bool,
}

impl Default for RunTally {
    fn default() -> Self {
        Self::new()
    }
}

impl RunTally {
    /// A tally of bursts of up to [`DEFAULT_TALLY_CAPACITY`] runs.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_TALLY_CAPACITY)
    }

    /// A tally of bursts of up to `cap` runs (at least one).
    pub fn with_capacity(cap: usize) -> Self {
        let cap = cap.max(1);
        Self {
            cap,
            counted: Counted::default(),
            kept: RunBuffer::with_capacity(cap),
            until: TraceOffset(u64::MAX),
            reached: false,
            events: 0,
            toggles: false,
        }
    }

    /// Lets bursts pass over a TIP.PGD right followed by a TIP.PGE (the
    /// disable and enable events, counted in [`events`](Self::events))
    /// instead of ending there: for a caller that only counts events.
    pub fn set_passes_toggles(&mut self, on: bool) {
        self.toggles = on;
    }

    /// Whether bursts may pass over disable/enable pairs.
    pub const fn passes_toggles(&self) -> bool {
        self.toggles
    }

    /// The runs of the burst, counted and kept.
    pub fn len(&self) -> usize {
        self.counted.runs + self.kept.len()
    }

    /// Whether the burst holds no run.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The instructions of all the burst's runs.
    pub fn insns(&self) -> u64 {
        self.counted.insns + self.kept.insns()
    }

    /// The events the burst passed over, between its runs: a TIP.PGD and
    /// the TIP.PGE right after it are two (tracing disabled at a branch,
    /// enabled again where execution came back into the traced code).
    /// None is a status update.
    pub const fn events(&self) -> u64 {
        self.events
    }

    /// The counted runs (all of them, unless some are [`kept`](Self::kept)).
    pub const fn counted(&self) -> &Counted {
        &self.counted
    }

    /// The runs after the counted ones, kept whole.
    pub const fn kept(&self) -> &RunBuffer {
        &self.kept
    }

    /// The kept runs, for a caller that takes them over (swapping in an
    /// empty buffer of the same capacity).
    pub(crate) fn kept_mut(&mut self) -> &mut RunBuffer {
        &mut self.kept
    }

    /// Whether a run was taken at or past the offset the burst was asked
    /// to stop at (it is among the kept ones).
    pub const fn reached_until(&self) -> bool {
        self.reached
    }

    /// Counts the kept runs too (the caller needs none of them whole).
    pub fn count_kept(&mut self) {
        for (insns, offset) in self.kept.counts() {
            self.counted.count_run(u64::from(insns), offset);
        }
        self.kept.clear();
    }

    /// Empties the tally (no burst).
    pub(crate) fn clear(&mut self) {
        self.counted = Counted::default();
        self.kept.clear();
        self.reached = false;
        self.events = 0;
    }

    /// Empties the tally for a burst starting at trace offset `before`,
    /// stopping at the first run taken at or past `until`.
    pub(crate) fn start(
        &mut self,
        space: AddressSpace,
        mode: ExecMode,
        speculative: bool,
        before: TraceOffset,
        until: TraceOffset,
    ) {
        self.counted = Counted {
            last_at: before,
            end: before,
            ..Counted::default()
        };
        self.kept.start(space, mode, speculative);
        self.until = until;
        self.reached = false;
        self.events = 0;
    }

    /// `n` events passed over after the runs so far; the next run is
    /// taken at trace offset `offset`.
    #[inline]
    pub(crate) fn pass_events(&mut self, n: u64, offset: TraceOffset) {
        self.count_kept();
        self.counted.end = offset;
        self.events += n;
    }

    /// Whether no further run fits.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.reached || self.len() >= self.cap
    }

    /// How many more runs fit.
    #[inline]
    pub(crate) fn room(&self) -> usize {
        if self.reached {
            0
        } else {
            self.cap.saturating_sub(self.len())
        }
    }

    /// A block's run, with the trace offset after it: kept (it may be
    /// the last), the one kept before counted.
    #[inline]
    pub(crate) fn push(&mut self, run: &PathRun, offset: TraceOffset) {
        self.count_kept();
        self.kept.push(run, offset);
        self.reached |= offset >= self.until;
    }

    /// Whether a TNT path taken at `offset` is counted whole: only before
    /// `until` (from there on the burst goes block by block, and stops).
    #[inline]
    pub(crate) const fn takes_path_at(&self, offset: TraceOffset) -> bool {
        offset.0 < self.until.0
    }

    /// The runs of TNT path `path`, all with the trace offset after them:
    /// counted from the path's record, unless past `until` (a burst asks
    /// [`takes_path_at`](Self::takes_path_at) first; kept if not).
    #[inline(always)]
    pub(crate) fn push_path(&mut self, path: &TntPath, runs: &[PathRun], offset: TraceOffset) {
        if !self.kept.is_empty() || offset >= self.until {
            return self.push_path_slow(path, runs, offset);
        }
        self.count_path(path, offset);
    }

    /// [`push_path`](Self::push_path) with runs kept before it, or past
    /// `until`.
    #[cold]
    #[inline(never)]
    fn push_path_slow(&mut self, path: &TntPath, runs: &[PathRun], offset: TraceOffset) {
        self.count_kept();
        if offset >= self.until {
            self.kept.push_path(runs, offset);
            self.reached = true;
            return;
        }
        self.count_path(path, offset);
    }

    /// Counts path `path`'s runs, taken at `offset`.
    #[inline(always)]
    fn count_path(&mut self, path: &TntPath, offset: TraceOffset) {
        self.counted.count_path(path, offset);
    }

    /// For a burst counting runs itself: how many more fit, and the
    /// offset runs must be taken before to be counted (`None` once one
    /// was taken there).
    #[inline(always)]
    pub(crate) fn count_room(&self) -> Option<(usize, TraceOffset)> {
        (!self.reached).then(|| (self.cap.saturating_sub(self.len()), self.until))
    }

    /// The counted runs, the kept ones counted first: for a burst that
    /// counts on by itself and hands them back ([`put_counted`](Self::put_counted)).
    #[inline(always)]
    pub(crate) fn take_counted(&mut self) -> Counted {
        self.count_kept();
        self.counted
    }

    /// The counted runs back from [`take_counted`](Self::take_counted)'s
    /// caller, with its runs added, and the events it passed over after
    /// them (as [`pass_events`](Self::pass_events) counts them: the
    /// offset after them is `counted`'s end).
    #[inline(always)]
    pub(crate) fn put_counted(&mut self, counted: Counted, events: u64) {
        debug_assert!(self.kept.is_empty());
        self.counted = counted;
        self.events += events;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::classify::InsnClass;
    use hwtrace_types::Ip;

    fn run(ip: u64, insns: u32) -> PathRun {
        PathRun {
            ip: Ip(ip),
            end_ip: Ip(ip + u64::from(insns) - 1),
            insns,
            class: InsnClass::CondJump,
            end_size: 2,
        }
    }

    /// A tally of bursts of up to `cap` runs, started at `before` to stop
    /// at `until`.
    fn started(cap: usize, before: u64, until: u64) -> RunTally {
        let mut t = RunTally::with_capacity(cap);
        t.start(
            AddressSpace::UNKNOWN,
            ExecMode::Bits64,
            false,
            TraceOffset(before),
            TraceOffset(until),
        );
        t
    }

    /// What a [`RunBuffer`] with the same runs says of them.
    fn counted_by_buffer(before: u64, runs: &[(PathRun, u64)]) -> Counted {
        let mut c = Counted {
            last_at: TraceOffset(before),
            end: TraceOffset(before),
            ..Counted::default()
        };
        for (r, offset) in runs {
            c.runs += 1;
            let at = c.end;
            c.add(at, u64::from(r.insns), TraceOffset(*offset));
        }
        c
    }

    #[test]
    fn runs_counted_at_once_count_as_added_one_by_one() {
        // Every case `count_runs` tells apart: the last counted offset at
        // the end or before it, instructions there or none, a path with
        // one run's instructions or more, its offset new or the end's.
        for (last_at, end) in [(5, 5), (3, 5)] {
            for last_insns in [0, 7] {
                for (first, insns) in [(4, 4), (4, 9), (0, 0)] {
                    for offset in [5, 8] {
                        let before = Counted {
                            runs: 1,
                            insns: 10,
                            last_at: TraceOffset(last_at),
                            last_insns,
                            end: TraceOffset(end),
                        };
                        let mut at_once = before;
                        at_once.count_runs(2, first, insns, TraceOffset(offset));
                        let mut one_by_one = before;
                        one_by_one.runs += 2;
                        one_by_one.add(TraceOffset(end), first, TraceOffset(offset));
                        if insns > first {
                            one_by_one.add(TraceOffset(offset), insns - first, TraceOffset(offset));
                        }
                        assert_eq!(
                            at_once, one_by_one,
                            "{last_at} {end} {last_insns} {first} {insns} {offset}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn stretches_count_as_their_paths_one_by_one() {
        // Paths at rising offsets, each with instructions after its first
        // run (what a sprint's stretch holds), from ends before and at the
        // last counted offset.
        let paths = [(3, 4, 9), (5, 1, 2), (2, 6, 30), (4, 0, 5)];
        for (last_at, end) in [(5, 5), (3, 5)] {
            for n in 1..=paths.len() {
                let before = Counted {
                    runs: 1,
                    insns: 10,
                    last_at: TraceOffset(last_at),
                    last_insns: 7,
                    end: TraceOffset(end),
                };
                let mut one_by_one = before;
                let (mut runs, mut insns) = (0, 0);
                for (i, &(r, first, all)) in paths[..n].iter().enumerate() {
                    one_by_one.count_runs(r, first, all, TraceOffset(8 + i as u64));
                    (runs, insns) = (runs + r, insns + all);
                }
                let (_, first, all) = paths[n - 1];
                let mut at_once = before;
                at_once.count_stretch(runs, insns, all - first, TraceOffset(7 + n as u64));
                assert_eq!(at_once, one_by_one, "{last_at} {end} {n}");
            }
        }
    }

    #[test]
    fn paths_count_as_their_runs_would() {
        let runs = [run(0x10, 3), run(0x20, 4), run(0x30, 5)];
        let path = TntPath::for_test(&runs);
        let mut t = started(64, 100, u64::MAX);
        t.push(&run(0x1, 2), TraceOffset(100));
        t.push_path(&path, &runs, TraceOffset(104));
        t.push(&run(0x2, 7), TraceOffset(104));
        t.push_path(&path, &runs, TraceOffset(110));
        assert_eq!(t.len(), 8);
        assert_eq!(t.insns(), 2 + 12 + 7 + 12);
        // The last block is kept, whole.
        assert_eq!(t.kept().len(), 0);
        t.push(&run(0x3, 1), TraceOffset(110));
        assert_eq!(t.kept().len(), 1);
        assert_eq!(t.kept().get(0).map(|r| r.ip), Some(Ip(0x3)));
        let mut all = vec![(run(0x1, 2), 100)];
        all.extend(runs.iter().map(|r| (*r, 104)));
        all.push((run(0x2, 7), 104));
        all.extend(runs.iter().map(|r| (*r, 110)));
        let before_last = counted_by_buffer(100, &all);
        assert_eq!(*t.counted(), before_last);
        all.push((run(0x3, 1), 110));
        t.count_kept();
        assert_eq!(*t.counted(), counted_by_buffer(100, &all));
        assert!(t.kept().is_empty());
    }

    #[test]
    fn runs_past_until_are_kept_and_end_the_burst() {
        let runs = [run(0x10, 3), run(0x20, 4)];
        let path = TntPath::for_test(&runs);
        let mut t = started(64, 0, 50);
        // A burst asks first: paths are counted whole only before `until`.
        assert!(t.takes_path_at(TraceOffset(49)) && !t.takes_path_at(TraceOffset(50)));
        t.push_path(&path, &runs, TraceOffset(49));
        assert!(!t.is_full());
        t.push_path(&path, &runs, TraceOffset(50));
        assert!(t.reached_until() && t.is_full() && t.room() == 0);
        assert_eq!(t.counted().insns, 7);
        assert_eq!(t.kept().len(), 2);
        assert_eq!(t.insns(), 14);
    }

    #[test]
    fn capacity_counts_every_run() {
        let runs = [run(0x10, 3), run(0x20, 4), run(0x30, 1)];
        let path = TntPath::for_test(&runs);
        let mut t = started(4, 0, u64::MAX);
        t.push_path(&path, &runs, TraceOffset(3));
        assert_eq!(t.room(), 1);
        t.push(&run(0x40, 2), TraceOffset(5));
        assert!(t.is_full());
    }
}
