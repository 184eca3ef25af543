//! Runs of plain code as the two instructions [`Branches`](super::Branches)
//! looks at: `--branches` without an item per instruction.
//!
//! A runs-keeping decode ([`FastSource::runs`](hwtrace_flow::parallel::FastSource::runs))
//! hands code in which nothing but its last instruction can branch out
//! whole ([`PassedRun`]). Reshaping instructions into taken branches only
//! looks at the instruction after a branch (where it went) and at
//! branches, so a run's first and last instruction give the same branches
//! as all of them. Every other step still comes as exact items.

use super::Item;
use hwtrace_flow::insn::{Insn, InsnClass};
use hwtrace_flow::parallel::{Flow, FlowItem, PassedRun, Sink, StepSource};
use hwtrace_types::TraceOffset;
use std::cell::Cell;
use std::collections::VecDeque;

/// Trace bytes whose runs [`RunSteps`] gathers at a time: bounds what it
/// holds whatever the trace (a KiB of compiled code's trace can be two
/// thousand runs), while each stretch is long enough that the runs
/// handed out one by one where it ends (a burst stops at the first run
/// past it) are few.
const REACH: u64 = 16 << 10;

/// Hands `r`'s first instruction (a plain one without bytes, when the run
/// has more than one) and its last to `push`, both at the trace offset
/// before the run. Returns how many instructions the run holds beyond
/// those items, for callers that count instructions.
fn run_ends(r: &PassedRun, mut push: impl FnMut(Item)) -> u64 {
    let run = &r.run;
    let offset = r.before.0;
    if run.insns > 1 {
        let mut first = Insn::empty(run.ip.0, run.mode, run.speculative);
        first.class = InsnClass::Other;
        push(Item::Insn {
            offset,
            insn: first,
        });
    }
    push(Item::Insn {
        offset,
        insn: run.last_insn(),
    });
    u64::from(run.insns.saturating_sub(2))
}

/// A decode that hands runs of plain code out whole where it can
/// ([`Flow::visit_runs`] over a runs-keeping source) and items otherwise:
/// a [`Flow`] itself, or a driver around one.
pub trait RunFlow {
    /// Where the decode is in the trace.
    fn offset(&self) -> TraceOffset;
    /// Passes over whole runs before `until`, handing each to `visit`.
    fn visit_runs_until(&mut self, until: TraceOffset, visit: &mut dyn FnMut(&PassedRun));
    /// The next item.
    fn next_item(&mut self) -> Option<Item>;
}

impl<S: StepSource> RunFlow for Flow<S> {
    fn offset(&self) -> TraceOffset {
        self.source().offset()
    }

    fn visit_runs_until(&mut self, until: TraceOffset, visit: &mut dyn FnMut(&PassedRun)) {
        Flow::visit_runs(self, until, visit);
    }

    fn next_item(&mut self) -> Option<Item> {
        self.next().map(Item::from)
    }
}

/// What a run a [`RunFlow`] passes over whole becomes in the stream of a
/// [`RunSteps`].
pub trait RunStep<T> {
    /// Queues what run `r` becomes.
    fn run(&mut self, r: &PassedRun, out: &mut VecDeque<T>);
}

/// A [`RunFlow`]'s steps: each run passed over whole turned into steps by
/// `per_run`, every other item as it comes.
pub struct RunSteps<F, T, P> {
    flow: F,
    queued: VecDeque<T>,
    per_run: P,
}

impl<F: RunFlow, T: From<Item>, P: RunStep<T>> RunSteps<F, T, P> {
    /// The steps of `flow`, runs turned into steps by `per_run`.
    pub fn with(flow: F, per_run: P) -> Self {
        Self {
            flow,
            queued: VecDeque::new(),
            per_run,
        }
    }
}

impl<F: RunFlow, T: From<Item>, P: RunStep<T>> Iterator for RunSteps<F, T, P> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        if let Some(step) = self.queued.pop_front() {
            return Some(step);
        }
        let until = TraceOffset(self.flow.offset().0.saturating_add(REACH));
        let (queued, per_run) = (&mut self.queued, &mut self.per_run);
        self.flow
            .visit_runs_until(until, &mut |r| per_run.run(r, queued));
        match self.queued.pop_front() {
            Some(step) => Some(step),
            None => self.flow.next_item().map(T::from),
        }
    }
}

/// Runs as their ends ([`run_ends`]), the instructions between added to
/// `beyond`.
pub struct RunEnds<'c> {
    beyond: &'c Cell<u64>,
}

impl RunStep<Item> for RunEnds<'_> {
    fn run(&mut self, r: &PassedRun, out: &mut VecDeque<Item>) {
        let n = run_ends(r, |item| out.push_back(item));
        self.beyond.set(self.beyond.get() + n);
    }
}

/// The items of a [`RunFlow`] with each run passed over whole given by its
/// ends ([`run_ends`]); the instructions between are added to `beyond`.
pub type RunEndItems<'c, F> = RunSteps<F, Item, RunEnds<'c>>;

impl<'c, F: RunFlow> RunSteps<F, Item, RunEnds<'c>> {
    /// The run ends of `flow`.
    pub fn new(flow: F, beyond: &'c Cell<u64>) -> Self {
        Self::with(flow, RunEnds { beyond })
    }
}

/// A parallel decode's stretch of items with runs given by their ends
/// ([`run_ends`]): what the workers hand the printing thread for
/// `--branches`.
#[derive(Debug, Default)]
pub struct RunEndBatch {
    /// The items, in trace order.
    pub items: Vec<Item>,
    /// Instructions of the runs beyond their ends.
    pub beyond: u64,
}

impl RunEndBatch {
    /// An empty batch with room for `n` items.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            items: Vec::with_capacity(n),
            beyond: 0,
        }
    }
}

impl Sink for RunEndBatch {
    fn push(&mut self, item: FlowItem) {
        self.items.push(Item::from(item));
    }

    fn keeps_runs(&self) -> bool {
        true
    }

    fn push_run(&mut self, run: &PassedRun) {
        let items = &mut self.items;
        self.beyond += run_ends(run, |item| items.push(item));
    }
}
