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

/// Trace bytes whose runs [`RunEndItems`] gathers at a time: bounds what
/// it holds whatever the trace.
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
    let mut last = Insn::empty(run.end_ip.0, run.mode, run.speculative);
    last.class = run.end_class;
    last.size = run.end_size;
    push(Item::Insn { offset, insn: last });
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

/// The items of a [`RunFlow`] with each run passed over whole given by its
/// ends ([`run_ends`]); the instructions between are added to `beyond`.
pub struct RunEndItems<'c, F> {
    flow: F,
    queued: VecDeque<Item>,
    beyond: &'c Cell<u64>,
}

impl<'c, F: RunFlow> RunEndItems<'c, F> {
    /// The run ends of `flow`.
    pub fn new(flow: F, beyond: &'c Cell<u64>) -> Self {
        Self {
            flow,
            queued: VecDeque::new(),
            beyond,
        }
    }
}

impl<F: RunFlow> Iterator for RunEndItems<'_, F> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if let Some(item) = self.queued.pop_front() {
            return Some(item);
        }
        let until = TraceOffset(self.flow.offset().0.saturating_add(REACH));
        let (queued, beyond) = (&mut self.queued, self.beyond);
        self.flow.visit_runs_until(until, &mut |r| {
            let n = run_ends(r, |item| queued.push_back(item));
            beyond.set(beyond.get() + n);
        });
        match self.queued.pop_front() {
            Some(item) => Some(item),
            None => self.flow.next_item(),
        }
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
