//! The parallel decode: workers on a rayon pool, seams, and the in-order
//! merge with its sequential fallback.

use super::driver::{Flow, FlowItem, Seam, SeamAt, Skipped};
use super::pool::SourcePool;
use super::segment::{Splitter, Unit};
use super::{PassedRun, Probe, StepSource};
use crate::ErrorKind;
use hwtrace_types::TraceOffset;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// The most units [`ParallelConfig::new`] keeps in flight, whatever the
/// number of threads: bounds the items held.
pub const MAX_ITEM_WINDOW: usize = 8;

/// How a parallel decode is split and run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParallelConfig {
    /// Worker threads (at least 1).
    pub threads: usize,
    /// The least trace bytes a work unit covers (units start at PSBs).
    pub unit_bytes: u64,
    /// The most units decoded ahead of the one being handed out: bounds
    /// memory (each holds its unit's items).
    pub window: usize,
    /// Instructions without trace before a flow gives up
    /// ([`super::MAX_STALL`]).
    pub max_stall: u64,
    /// The most items (and runs) a worker keeps for one unit: past it the
    /// worker stops and the merging thread decodes on from where it
    /// stopped, so how densely the trace packs instructions (thousands per
    /// byte where a long loop runs on TNT bits) cannot blow up what a
    /// unit holds. Sinks that only count are not held to it.
    pub unit_items: usize,
    /// Items handed out per batch by the merging thread's own decoding.
    pub batch: usize,
}

impl ParallelConfig {
    /// `threads` workers for a caller that keeps an item per instruction
    /// (the default sink, [`decode`]): units of 16 KiB (a few PSB periods:
    /// a unit's fixed costs, its seam and a decoder's warm-up, stay small
    /// next to its decode), as many units in flight as workers (at least
    /// two, at most [`MAX_ITEM_WINDOW`]), and at most 32 Ki items kept per
    /// unit (3 MiB: an item takes 96 bytes, and a trace byte holds from a
    /// few instructions to thirty in gzip's loops, thousands in a long loop
    /// on TNT bits). Whoever takes the items (a printer, say) is slower
    /// than one decoding thread anyway, so more in flight would only hold
    /// more of them: 64 KiB units, four per worker and no item budget held
    /// 780 MiB on two threads.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Self {
            threads,
            unit_bytes: 16 << 10,
            window: threads.clamp(2, MAX_ITEM_WINDOW),
            max_stall: super::MAX_STALL,
            unit_items: 1 << 15,
            batch: 1 << 12,
        }
    }

    /// For a caller whose sink only counts, so that a unit's items cost
    /// no memory: units as large as still keep every thread busy (16 per
    /// thread over the trace's `trace_len` bytes), between 64 KiB and
    /// 8 MiB. A unit has fixed costs — the next unit's anchor found twice,
    /// the decode past its end up to that anchor, the first instructions
    /// after its PSB and those before the seam stepped without bursts —
    /// that cost about 15% of the CPU with 64 KiB units on the benchmark
    /// corpus and about 4% with 4 MiB ones; 8 MiB units made `--jobs 2`
    /// 1.02x as fast on its 1 GiB trace (7 runs each in turn), for 10 MiB
    /// more of the trace resident (the units in flight). Two units in
    /// flight per worker are enough lookahead for units that large.
    pub fn counting(threads: usize, trace_len: u64) -> Self {
        let mut config = Self::new(threads);
        let per_thread = trace_len / (16 * config.threads as u64);
        config.unit_bytes = per_thread.clamp(64 << 10, 8 << 20);
        config.window = 2 * config.threads;
        config
    }
}

/// How a parallel decode went: how many units were spliced on at their
/// seams, and how many the decode from the start had to go through on
/// the merging thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParallelStats {
    /// Work units the trace was split into (when the decode runs on one
    /// thread: as far as it had been split to find that out).
    pub units: usize,
    /// Units whose own decode was spliced on at their anchor.
    pub spliced: usize,
    /// Units the merging thread decoded through (no seam found).
    pub continued: usize,
}

/// How a worker's decode ended.
enum End<S> {
    /// The trace (or the decode from the start) ended.
    Done,
    /// The next unit's anchor was reached: its items follow, unless that
    /// unit turns out untrusted, when `tail` (positioned just after the
    /// anchor) goes on.
    Spliced { seam: Box<Seam>, tail: Flow<S> },
    /// No seam: `flow` goes on after the items given.
    Open(Flow<S>),
    /// Nothing to continue (an untrusted or anchorless unit): the source,
    /// for reuse.
    Free(S),
}

/// Where a unit's items go: a buffer handed to the consumer in trace order
/// (a `Vec` of the items, or a consumer's own summary of them, so that
/// work proportional to the items runs on the workers too).
pub trait Sink: Send {
    /// Takes the next item.
    fn push(&mut self, item: FlowItem);
    /// Whether the sink only counts instructions and events: then runs of
    /// instructions (and the events a counting source passes over among
    /// them) are passed over ([`Flow::skip_runs`]) and handed in as
    /// [`push_skipped`](Self::push_skipped) instead of one item each.
    fn counts_only(&self) -> bool {
        false
    }
    /// Takes what was passed over, the last instructions at trace
    /// `offset` (only called when [`counts_only`](Self::counts_only)).
    fn push_skipped(&mut self, offset: TraceOffset, skipped: Skipped) {
        let _ = (offset, skipped);
    }
    /// Whether the sink keeps runs of plain code whole (and the step
    /// source hands them out whole, like
    /// [`FastSource::runs`](super::FastSource::runs)): then they are
    /// handed in as [`push_run`](Self::push_run) instead of an item per
    /// instruction ([`Flow::visit_runs`]). Not asked when
    /// [`counts_only`](Self::counts_only).
    fn keeps_runs(&self) -> bool {
        false
    }
    /// Takes a run of plain code passed over whole (only called when
    /// [`keeps_runs`](Self::keeps_runs)).
    fn push_run(&mut self, run: &PassedRun) {
        let _ = run;
    }
    /// Whether the sink folds what it takes into something that does not
    /// grow with the items (a coverage map, counts): then a unit's worker
    /// is not stopped at [`ParallelConfig::unit_items`], which bounds what
    /// sinks that keep their items hold.
    fn folds(&self) -> bool {
        false
    }
    /// The decoder's state where the sink's items start, before the first
    /// is pushed: after a unit's anchor, or where the merging thread's own
    /// decode starts a batch. A sink whose work depends on state the items
    /// before it set (the address space, say) takes it from here. Not
    /// called for the items from the start of the trace.
    fn starts_at(&mut self, probe: &Probe) {
        let _ = probe;
    }
}

/// The next item of `flow`, instructions passed over first when `sink`
/// only counts them or keeps runs: whole runs while the source is before
/// `until` (where the caller looks for a seam, or stops), so the caller
/// still sees the end of every run from there on ([`Flow::skip_runs`],
/// [`Flow::visit_runs`]). Also returns how many runs went into `sink`
/// (what was passed over counts as one): runs kept are visited at most
/// [`RUN_REACH`] bytes of trace at a time, so a caller batching them by
/// count bounds what a batch holds.
fn next_into<S: StepSource, K: Sink>(
    flow: &mut Flow<S>,
    sink: &mut K,
    until: TraceOffset,
) -> (Option<FlowItem>, usize) {
    let mut runs = 0;
    if sink.counts_only() {
        let skipped = flow.skip_runs(until);
        if skipped != Skipped::default() {
            sink.push_skipped(flow.source().offset(), skipped);
            // Counted like a run kept: a batch holding nothing but what
            // was passed over is still handed out.
            runs += 1;
        }
    } else if sink.keeps_runs() {
        let reach = TraceOffset(flow.source().offset().0.saturating_add(RUN_REACH));
        flow.visit_runs(until.min(reach), &mut |run| {
            sink.push_run(run);
            runs += 1;
        });
    }
    (flow.next(), runs)
}

/// Trace bytes whose runs one call of [`next_into`] keeps at most.
const RUN_REACH: u64 = 16 << 10;

impl Sink for Vec<FlowItem> {
    fn push(&mut self, item: FlowItem) {
        Vec::push(self, item);
    }
}

/// A worker's result for one unit.
struct Decoded<S, K> {
    unit: Unit,
    /// The state after the unit's first instruction (`None`: the unit's
    /// own decode found no instruction, or is not trusted).
    anchor: Option<Seam>,
    /// The items after the anchor (for the first unit: all), through the
    /// next unit's anchor when `end` is [`End::Spliced`].
    items: K,
    end: End<S>,
}

/// Decodes `trace` on `config.threads` threads and hands the items to
/// `emit` in trace order, in batches, exactly as [`Flow::new`] over one
/// source would produce them. `make` creates a step source over `trace`
/// (called once per worker and per unit in flight at most).
///
/// An error from `emit` stops the decode (workers in flight finish their
/// unit) and is returned.
pub fn decode<S, F, E>(
    trace: &[u8],
    config: &ParallelConfig,
    make: F,
    emit: impl FnMut(Vec<FlowItem>) -> Result<(), E>,
) -> Result<ParallelStats, E>
where
    S: StepSource + Send,
    F: Fn() -> S + Sync,
{
    decode_into(trace, config, make, Vec::with_capacity, emit)
}

/// [`decode`] with the items of each stretch collected by a [`Sink`]
/// from `new_sink` (given a guess of how many items will come) and the
/// sinks handed to `emit` in trace order.
pub fn decode_into<S, F, K, N, E>(
    trace: &[u8],
    config: &ParallelConfig,
    make: F,
    new_sink: N,
    mut emit: impl FnMut(K) -> Result<(), E>,
) -> Result<ParallelStats, E>
where
    S: StepSource + Send,
    F: Fn() -> S + Sync,
    K: Sink,
    N: Fn(usize) -> K + Sync,
{
    let mut split = Splitter::new(trace, config.unit_bytes);
    let several = split.get(1).is_some();
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.max(1))
        .thread_name(|i| format!("hwtrace-flow-{i}"))
        .build()
    {
        Ok(pool) if several => pool,
        // One unit, or no threads to be had: the sequential decode is the
        // answer.
        _ => {
            let mut merge = Merge::new(config, &new_sink, &mut emit);
            merge.finish_open(Flow::new(make()).with_max_stall(config.max_stall))?;
            merge.stats.units = split.found();
            merge.stats.continued = split.found();
            return Ok(merge.stats);
        }
    };
    let window = config.window.max(1);
    // Every unit of the window may hold a decoder (decoding, or waiting
    // to be merged with the one it ended with), the merging thread holds
    // one, and one is on its way back.
    let sources = SourcePool::new(window + 2, &make);
    let cancel = AtomicBool::new(false);
    let (max_stall, unit_items) = (config.max_stall, config.unit_items.max(1));
    pool.in_place_scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, std::thread::Result<Decoded<S, K>>)>();
        let mut ready: BTreeMap<usize, Decoded<S, K>> = BTreeMap::new();
        let mut spawned = 0;
        let mut merge = Merge::new(config, &new_sink, &mut emit);
        let (sources, cancel, make, new_sink) = (&sources, &cancel, &make, &new_sink);
        let mut result = Ok(());
        let mut i = 0;
        while let Some(unit) = split.get(i) {
            while spawned < i + window {
                let Some(job) = split.get(spawned) else { break };
                let next = split.get(spawned + 1);
                let tx = tx.clone();
                let at = spawned;
                scope.spawn(move |_| {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let src = sources.take(make, S::warm_from);
                        work(at, job, next, src, make, new_sink, (max_stall, unit_items))
                    }));
                    // The receiver only goes away once all is merged.
                    let _ = tx.send((at, decoded));
                });
                spawned += 1;
            }
            let decoded = loop {
                if let Some(d) = ready.remove(&i) {
                    break d;
                }
                match rx.recv() {
                    Ok((at, Ok(d))) => {
                        ready.insert(at, d);
                    }
                    Ok((_, Err(panic))) => {
                        cancel.store(true, Ordering::Relaxed);
                        std::panic::resume_unwind(panic);
                    }
                    // Every sender gone without unit `i`: cannot happen
                    // (each job sends), but never wait forever.
                    Err(_) => {
                        break Decoded {
                            unit,
                            anchor: None,
                            items: new_sink(0),
                            end: End::Done,
                        };
                    }
                }
            };
            if let Err(e) = merge.unit(i, decoded, sources) {
                result = Err(e);
                break;
            }
            i += 1;
        }
        if result.is_ok() {
            result = match std::mem::replace(&mut merge.carry, Carry::Done) {
                // The last unit's worker stopped early (its item budget):
                // the decode from there runs to the end here.
                Carry::Open(flow) => merge.finish_open(flow),
                _ => merge.flush(),
            };
        }
        cancel.store(true, Ordering::Relaxed);
        merge.stats.units = split.found();
        result.map(|()| merge.stats)
    })
}

/// Whether `item` may be a unit decode going wrong for want of the state
/// before its PSB, so the unit's items after it cannot be trusted.
///
/// After its anchor a unit decode is in the state of the decode from the
/// start but for the return stack, which holds only the calls since the
/// unit's PSB: the newest entries of the full decode's stack (both keep
/// the newest [`RETSTACK_SIZE`](crate::insn::RETSTACK_SIZE)). The two pop
/// the same addresses until the unit's stack runs dry; the first time it
/// does, the unit decode fails with [`ErrorKind::RetStackEmpty`] where
/// the full decode may go on. Nothing else can differ, so that error is
/// the one that makes a unit untrusted, and only before the unit decode's
/// first resynchronisation: synchronising clears the return stack in
/// both decodes alike (any other error, a bad packet or missing code, is
/// the full decode's error too, at the same offset, and so is its
/// resynchronisation).
fn needs_earlier_state(item: &FlowItem) -> bool {
    matches!(item, FlowItem::Error(e) if e.kind == ErrorKind::RetStackEmpty)
}

/// The state after the first instruction a decode from `unit.start`
/// produces, or `None` if it produces none before the unit's end.
///
/// Errors on the way (a bad PSB+, an overflow, code missing) do not stop
/// it: the decode resynchronises as the decode from the start would, and
/// a seam is sound wherever the two states coincide, whatever either
/// decode went through before (the items before an anchor are never
/// used).
fn anchor<S: StepSource>(flow: &mut Flow<S>, unit: Unit) -> Option<Seam> {
    while let Some(item) = flow.next() {
        if let Some(seam) = flow.seam(&item) {
            return Some(seam);
        }
        if flow.source().offset() >= unit.end {
            return None;
        }
    }
    None
}

/// Trace bytes before a unit's PSB whose timing packets warm its clock.
/// The CYC calibration a decode from the start has at a PSB was measured
/// over the last MTC period with cycles counted, a few hundred bytes of
/// trace back at the MTC frequencies perf uses (an MTC every 8 crystal
/// ticks, ~320 ns) and within this at up to 64 times that period. The
/// scan is a packet decode (several times faster than the decode proper)
/// and only sources that stamp times do it.
const WARM_WINDOW: u64 = 16 << 10;

/// A decode of `unit` from its PSB, its clock warmed over the
/// [`WARM_WINDOW`] before it ([`StepSource::warm_clock`]): the same for
/// the unit's own worker and the one looking for its anchor.
fn at_unit<S: StepSource>(mut src: S, unit: Unit) -> Flow<S> {
    src.warm_clock(WARM_WINDOW);
    Flow::at(src, unit.start)
}

/// One worker's job: unit `i` from its PSB, then on to the next unit's
/// anchor.
fn work<S: StepSource, K: Sink>(
    i: usize,
    unit: Unit,
    next: Option<Unit>,
    src: S,
    make: &(impl Fn() -> S + Sync),
    new_sink: &(impl Fn(usize) -> K + Sync),
    (max_stall, unit_items): (u64, usize),
) -> Decoded<S, K> {
    // The next unit's anchor, found as its own worker will find it.
    let (next_anchor, src) = match next {
        Some(n) => {
            let mut flow = at_unit(src, n).with_max_stall(max_stall);
            (anchor(&mut flow, n), flow.into_source())
        }
        None => (None, src),
    };
    let mut own = None;
    let mut flow = if i == 0 {
        // From the trace's first PSB, as the sequential decode goes: a
        // new source, whose synchronisation starts at the beginning.
        drop(src);
        Flow::new(make()).with_max_stall(max_stall)
    } else {
        let mut flow = at_unit(src, unit).with_max_stall(max_stall);
        own = anchor(&mut flow, unit);
        if own.is_none() {
            return Decoded {
                unit,
                anchor: None,
                items: new_sink(0),
                end: End::Free(flow.into_source()),
            };
        }
        flow
    };
    // About four instructions per trace byte is typical: reserve once
    // rather than grow by copying.
    let guess = (unit.end.0 - unit.start.0).saturating_mul(4).min(1 << 20);
    let mut items = new_sink(usize::try_from(guess).unwrap_or(0));
    if let Some(anchor) = &own {
        items.starts_at(&anchor.probe);
    }
    let mut resynced = false;
    // Where the loop below first looks at the flow's state: the next
    // unit's anchor, or just past the next unit's start.
    let until = match (next, next_anchor) {
        (None, _) => TraceOffset(u64::MAX),
        (Some(_), Some(a)) => a.offset,
        (Some(n), None) => TraceOffset(n.start.0.saturating_add(1)),
    };
    // Items and runs kept so far (a counting sink keeps none).
    let mut kept = 0usize;
    let budget = if items.counts_only() || items.folds() {
        usize::MAX
    } else {
        unit_items
    };
    while let (Some(item), runs) = next_into(&mut flow, &mut items, until) {
        kept += runs + 1;
        resynced |= matches!(item, FlowItem::Resync { .. });
        if i > 0 && !resynced && needs_earlier_state(&item) {
            // A return from before the unit's PSB: the decode from the
            // start goes through this unit instead.
            return Decoded {
                unit,
                anchor: None,
                items: new_sink(0),
                end: End::Free(flow.into_source()),
            };
        }
        items.push(item);
        if kept >= budget {
            // Dense code: the merging thread goes on from here.
            break;
        }
        let Some(n) = next else { continue };
        match next_anchor {
            Some(a) => match flow.seam_at(&item, a.offset) {
                SeamAt::Before => {}
                SeamAt::Here(seam) if *seam == a => {
                    return Decoded {
                        unit,
                        anchor: own,
                        items,
                        end: End::Spliced { seam, tail: flow },
                    };
                }
                SeamAt::Here(_) => {}
                SeamAt::Past => break,
            },
            None => {
                if flow.source().offset() > n.start {
                    break;
                }
            }
        }
    }
    let end = if flow.is_done() {
        End::Done
    } else {
        End::Open(flow)
    };
    Decoded {
        unit,
        anchor: own,
        items,
        end,
    }
}

/// What the merge carries from one unit to the next.
enum Carry<S> {
    /// Before the first unit.
    Start,
    /// The last unit ended at the next one's anchor.
    Spliced { seam: Box<Seam>, tail: Flow<S> },
    /// The decode from the start goes on here.
    Open(Flow<S>),
    /// The trace is done.
    Done,
}

/// The in-order merge on the calling thread.
struct Merge<'e, S, K, N, E, G: FnMut(K) -> Result<(), E>> {
    emit: &'e mut G,
    new_sink: &'e N,
    carry: Carry<S>,
    batch: K,
    /// Items in `batch`, and how many make a batch.
    batched: usize,
    batch_len: usize,
    /// Whether anything was decoded or handed out yet (a batch from the
    /// start of the trace needs no [`Sink::starts_at`]).
    started: bool,
    stats: ParallelStats,
}

impl<'e, S, K, N, E, G> Merge<'e, S, K, N, E, G>
where
    S: StepSource,
    K: Sink,
    N: Fn(usize) -> K,
    G: FnMut(K) -> Result<(), E>,
{
    fn new(config: &ParallelConfig, new_sink: &'e N, emit: &'e mut G) -> Self {
        let batch_len = config.batch.max(1);
        Self {
            emit,
            new_sink,
            carry: Carry::Start,
            batch: new_sink(batch_len),
            batched: 0,
            batch_len,
            started: false,
            stats: ParallelStats::default(),
        }
    }

    fn push(&mut self, item: FlowItem) -> Result<(), E> {
        self.batch.push(item);
        self.batched += 1;
        if self.batched >= self.batch_len {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), E> {
        if self.batched == 0 {
            return Ok(());
        }
        self.batched = 0;
        let batch = std::mem::replace(&mut self.batch, (self.new_sink)(self.batch_len));
        (self.emit)(batch)
    }

    /// Hands out a worker's items (after whatever the merge decoded
    /// itself).
    fn hand_out(&mut self, items: K) -> Result<(), E> {
        self.started = true;
        self.flush()?;
        (self.emit)(items)
    }

    /// The next item of `flow` (instructions passed over into the batch
    /// first when it only counts them or keeps runs, while the flow is
    /// before `until`; runs count towards the batch's size like items).
    fn next(&mut self, flow: &mut Flow<S>, until: TraceOffset) -> Option<FlowItem> {
        if self.batched == 0 && self.started {
            self.batch.starts_at(&flow.source().probe());
        }
        self.started = true;
        let (item, runs) = next_into(flow, &mut self.batch, until);
        self.batched += runs;
        item
    }

    /// Decodes `flow` to the end of the trace.
    fn finish_open(&mut self, mut flow: Flow<S>) -> Result<(), E> {
        while let Some(item) = self.next(&mut flow, TraceOffset(u64::MAX)) {
            self.push(item)?;
        }
        self.carry = Carry::Done;
        self.flush()
    }

    /// Merges unit `i`'s result.
    fn unit(&mut self, i: usize, d: Decoded<S, K>, sources: &SourcePool<S>) -> Result<(), E> {
        match std::mem::replace(&mut self.carry, Carry::Done) {
            Carry::Start if i == 0 => {
                self.stats.spliced += 1;
                self.hand_out(d.items)?;
                self.carry = carry(d.end, sources);
                Ok(())
            }
            Carry::Spliced { seam, tail } if d.anchor == Some(*seam) => {
                self.stats.spliced += 1;
                sources.give_back(tail.into_source());
                self.hand_out(d.items)?;
                self.carry = carry(d.end, sources);
                Ok(())
            }
            Carry::Spliced { tail: flow, .. } | Carry::Open(flow) => {
                self.carry = self.go_on(flow, d, sources)?;
                Ok(())
            }
            Carry::Start | Carry::Done => {
                release(d.end, sources);
                Ok(())
            }
        }
    }

    /// The decode from the start, `flow`, goes on into `d`'s unit: up to
    /// its anchor, where `d`'s items take over, or through the unit.
    fn go_on(
        &mut self,
        mut flow: Flow<S>,
        d: Decoded<S, K>,
        sources: &SourcePool<S>,
    ) -> Result<Carry<S>, E> {
        if let Some(a) = d.anchor {
            while let Some(item) = self.next(&mut flow, a.offset) {
                self.push(item)?;
                match flow.seam_at(&item, a.offset) {
                    SeamAt::Before => {}
                    SeamAt::Here(seam) if *seam == a => {
                        self.stats.spliced += 1;
                        sources.give_back(flow.into_source());
                        self.hand_out(d.items)?;
                        return Ok(carry(d.end, sources));
                    }
                    SeamAt::Here(_) => {}
                    SeamAt::Past => break,
                }
            }
        }
        self.stats.continued += 1;
        release(d.end, sources);
        // Through the unit: up to the next unit's start.
        let end: TraceOffset = d.unit.end;
        if flow.source().offset() <= end {
            while let Some(item) = self.next(&mut flow, TraceOffset(end.0.saturating_add(1))) {
                self.push(item)?;
                if flow.source().offset() > end {
                    break;
                }
            }
        }
        Ok(if flow.is_done() {
            Carry::Done
        } else {
            Carry::Open(flow)
        })
    }
}

fn carry<S>(end: End<S>, sources: &SourcePool<S>) -> Carry<S> {
    match end {
        End::Done => Carry::Done,
        End::Spliced { seam, tail } => Carry::Spliced { seam, tail },
        End::Open(flow) => Carry::Open(flow),
        End::Free(src) => {
            sources.give_back(src);
            Carry::Done
        }
    }
}

fn release<S>(end: End<S>, sources: &SourcePool<S>) {
    match end {
        End::Done => {}
        End::Spliced { tail: flow, .. } | End::Open(flow) => sources.give_back(flow.into_source()),
        End::Free(src) => sources.give_back(src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::insn::InsnDecoder;
    use crate::parallel::psb_offsets;
    use crate::{Config, Error};
    use hwtrace_packet::{Packet, Tnt, TraceBuilder};
    use hwtrace_types::{BytesAt, Ip};

    /// 1000: call 1010; 1005: jnz 1000; 1007: ret;
    /// 1010: jz 1012; 1012: nop; 1013: ret.
    const CODE: [u8; 0x14] = [
        0xe8, 0x0b, 0x00, 0x00, 0x00, 0x75, 0xf9, 0xc3, 0, 0, 0, 0, 0, 0, 0, 0, 0x74, 0x00, 0x90,
        0xc3,
    ];

    /// `CODE` at 0x1000.
    fn code() -> BytesAt<'static> {
        BytesAt::new(Ip(0x1000), &CODE)
    }

    /// A trace that breaks the SDM's rule for return compression: the
    /// return at 0x1013 is compressed although its call came before the
    /// second PSB. The decode from the start has the call on its return
    /// stack; a decode from the second PSB does not.
    fn call_across_psb() -> Vec<u8> {
        let mut t = TraceBuilder::new();
        t.psb_plus_64(0x1000).unwrap();
        // The call is direct: no packet until jz at 0x1010 asks.
        t.psb_plus_64(0x1010).unwrap();
        // jz taken, ret (compressed) to 0x1005, jnz not taken.
        t.push(Packet::Tnt(Tnt {
            bits: 0b110,
            len: 3,
            long: false,
        }))
        .unwrap();
        t.finish()
    }

    fn parallel(trace: &[u8]) -> (Vec<FlowItem>, ParallelStats) {
        let config = ParallelConfig {
            unit_bytes: 1,
            ..ParallelConfig::new(2)
        };
        let mut got = Vec::new();
        let stats = decode(
            trace,
            &config,
            || InsnDecoder::new(trace, Config::default(), code()),
            |batch| {
                got.extend(batch);
                Ok::<(), ()>(())
            },
        )
        .unwrap();
        (got, stats)
    }

    fn errors(items: &[FlowItem]) -> Vec<Error> {
        items
            .iter()
            .filter_map(|i| match i {
                FlowItem::Error(e) => Some(*e),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn counting_units_grow_with_the_trace_up_to_8_mib() {
        assert_eq!(ParallelConfig::counting(2, 1 << 20).unit_bytes, 64 << 10);
        assert_eq!(ParallelConfig::counting(2, 64 << 20).unit_bytes, 2 << 20);
        assert_eq!(ParallelConfig::counting(2, 1 << 30).unit_bytes, 8 << 20);
        assert_eq!(ParallelConfig::counting(2, 1 << 32).unit_bytes, 8 << 20);
        assert_eq!(ParallelConfig::counting(0, 1 << 30).threads, 1);
        let c = ParallelConfig::counting(8, 256 << 20);
        assert_eq!((c.unit_bytes, c.window), (2 << 20, 16));
    }

    #[test]
    fn a_unit_missing_a_return_from_before_its_psb_is_decoded_from_the_start() {
        let trace = call_across_psb();
        let want: Vec<FlowItem> =
            Flow::new(InsnDecoder::new(&trace, Config::default(), code())).collect();
        // From the start: call, jz, nop, ret, jnz (then the end).
        let ips: Vec<u64> = want
            .iter()
            .filter_map(|i| match i {
                FlowItem::Insn { insn, .. } => Some(insn.ip),
                _ => None,
            })
            .collect();
        assert_eq!(ips, [0x1000, 0x1010, 0x1012, 0x1013, 0x1005]);
        assert_eq!(errors(&want), []);
        // From the second PSB alone the return fails, after the anchor.
        let second = psb_offsets(&trace)[1];
        let alone: Vec<FlowItem> =
            Flow::at(InsnDecoder::new(&trace, Config::default(), code()), second).collect();
        let kinds: Vec<ErrorKind> = errors(&alone).iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [ErrorKind::RetStackEmpty]);
        // So that unit is not trusted: the decode from the start goes
        // through it, and the result is the sequential decode's.
        let (got, stats) = parallel(&trace);
        assert_eq!(got, want);
        assert_eq!(stats.units, 2);
        assert_eq!(stats.continued, 1, "{stats:?}");
    }

    #[test]
    fn a_unit_with_an_error_of_its_own_is_still_spliced() {
        // The same, but every return compressed only after its own call,
        // and code missing at 0x2000 in the second unit: an error the
        // decode from the start meets too.
        let mut t = TraceBuilder::new();
        t.psb_plus_64(0x1000).unwrap();
        t.psb_plus_64(0x1010).unwrap();
        // jz taken, then the return is not compressed: to 0x2000.
        t.push(Packet::Tnt(Tnt {
            bits: 0b1,
            len: 1,
            long: false,
        }))
        .unwrap();
        t.ip(Packet::Tip, 0x2000).unwrap();
        // Read ahead when the error is found: the resynchronisation
        // looks for a PSB after it.
        t.push(Packet::Tnt(Tnt {
            bits: 0b1,
            len: 1,
            long: false,
        }))
        .unwrap();
        t.psb_plus_64(0x1010).unwrap();
        t.push(Packet::Tnt(Tnt {
            bits: 0b0,
            len: 1,
            long: false,
        }))
        .unwrap();
        t.ip(Packet::Tip, 0x1005).unwrap();
        t.push(Packet::Tnt(Tnt {
            bits: 0b0,
            len: 1,
            long: false,
        }))
        .unwrap();
        let trace = t.finish();
        let want: Vec<FlowItem> =
            Flow::new(InsnDecoder::new(&trace, Config::default(), code())).collect();
        let kinds: Vec<ErrorKind> = errors(&want).iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [ErrorKind::NoMap]);
        let (got, stats) = parallel(&trace);
        assert_eq!(got, want);
        assert_eq!(stats.units, 3);
        assert_eq!((stats.spliced, stats.continued), (3, 0), "{stats:?}");
    }
}
