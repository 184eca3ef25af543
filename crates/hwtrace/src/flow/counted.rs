//! The counting decode, on one thread or many: what `hwtrace flow --quiet`
//! and `hwtrace perf decode --stats` print is counts and the failures
//! along the way, so runs of plain code are only added up (the fast
//! decoder's counting source, no instruction expanded) and nothing per
//! instruction crosses threads: each stretch of the trace comes back as
//! a [`Tally`], in trace order.

use super::{Item, Stats};
use hwtrace_flow::parallel::{self, Flow, FlowItem, ParallelConfig, Sink, Skipped, StepSource};
use hwtrace_types::TraceOffset;

/// What the counting decode keeps of a stretch of items: counts, and the
/// failures in it (errors, endless loops and the gaps they leave), for
/// the caller to report in order.
#[derive(Debug)]
pub struct Tally {
    trace_len: u64,
    /// The trace offset of the last instruction.
    pub offset: u64,
    pub stats: Stats,
    /// [`Item::Error`], [`Item::Stuck`] and [`Item::Resync`] items.
    pub failures: Vec<Item>,
}

impl Tally {
    /// An empty tally of a trace of `trace_len` bytes.
    pub fn new(trace_len: u64) -> Self {
        Self {
            trace_len,
            offset: 0,
            stats: Stats::default(),
            failures: Vec::new(),
        }
    }
}

impl Sink for Tally {
    fn counts_only(&self) -> bool {
        true
    }

    fn push_skipped(&mut self, offset: TraceOffset, skipped: Skipped) {
        self.stats.insns += skipped.insns;
        self.stats.events += skipped.events;
        self.offset = offset.0;
    }

    fn push(&mut self, item: FlowItem) {
        let item = Item::from(item);
        match item {
            Item::Insn { offset, .. } => {
                self.stats.insns += 1;
                self.offset = offset;
            }
            Item::Error(_) | Item::Stuck { .. } | Item::Resync { .. } => self.failures.push(item),
            _ => {}
        }
        self.stats.count(&item, self.trace_len);
    }
}

/// Decodes `bytes` with the counting step sources `make` creates, on
/// `jobs` threads (split as `parallel` says), handing `summed` the tallies
/// in trace order: on one thread, one at each failure and every
/// [`STRETCH`] bytes of trace, so a caller that lets decoded pages go or
/// reports failures does so as the decode goes.
pub fn count<S: StepSource + Send>(
    bytes: &[u8],
    jobs: usize,
    parallel: &ParallelConfig,
    make: impl Fn() -> S + Sync,
    mut summed: impl FnMut(Tally),
) {
    let trace_len = bytes.len() as u64;
    if jobs > 1 {
        let each = |t: Tally| -> Result<(), std::convert::Infallible> {
            summed(t);
            Ok(())
        };
        match parallel::decode_into(bytes, parallel, make, |_| Tally::new(trace_len), each) {
            Ok(_) => {}
            Err(never) => match never {},
        }
        return;
    }
    // One flow, its runs passed over whole as the workers pass over theirs.
    let mut flow = Flow::new(make()).with_max_stall(parallel.max_stall);
    let mut tally = Tally::new(trace_len);
    let mut mark = STRETCH;
    loop {
        let skipped = flow.skip_runs(TraceOffset(mark));
        if skipped != Skipped::default() {
            tally.push_skipped(flow.source().offset(), skipped);
        }
        let Some(item) = flow.next() else { break };
        tally.push(item);
        let at = flow.source().offset().0;
        if !tally.failures.is_empty() || at >= mark {
            summed(std::mem::replace(&mut tally, Tally::new(trace_len)));
            mark = mark.max(at.saturating_add(STRETCH));
        }
    }
    summed(tally);
}

/// How much trace a single-thread counting decode takes between tallies.
pub const STRETCH: u64 = 4 << 20;
