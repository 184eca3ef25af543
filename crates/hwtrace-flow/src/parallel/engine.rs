//! The parallel decode: workers on a rayon pool, seams, and the in-order
//! merge with its sequential fallback.

use super::StepSource;
use super::driver::{Flow, FlowItem, Seam, SeamAt};
use super::segment::{Splitter, Unit};
use hwtrace_types::TraceOffset;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

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
    /// Items handed out per batch by the merging thread's own decoding.
    pub batch: usize,
}

impl ParallelConfig {
    /// `threads` workers, units of 64 KiB (a few PSB periods: a unit's
    /// fixed costs, its seam and a decoder's warm-up, stay small next to
    /// its decode), four units in flight per worker.
    pub fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        Self {
            threads,
            unit_bytes: 64 << 10,
            window: 4 * threads,
            max_stall: super::MAX_STALL,
            batch: 1 << 12,
        }
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
    Spliced { seam: Seam, tail: Flow<S> },
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
    /// Whether the sink only counts instructions: then runs of them are
    /// passed over ([`Flow::skip_insns`]) and handed in as
    /// [`push_insns`](Self::push_insns) instead of one item each.
    fn counts_only(&self) -> bool {
        false
    }
    /// Takes `n` instructions executed at trace `offset` (only called when
    /// [`counts_only`](Self::counts_only)).
    fn push_insns(&mut self, offset: TraceOffset, n: u64) {
        let _ = (offset, n);
    }
}

/// The next item of `flow`, instructions passed over first when `sink`
/// only counts them.
fn next_into<S: StepSource, K: Sink>(flow: &mut Flow<S>, sink: &mut K) -> Option<FlowItem> {
    if sink.counts_only() {
        let n = flow.skip_insns();
        if n > 0 {
            sink.push_insns(flow.source().offset(), n);
        }
    }
    flow.next()
}

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
    let sources: Mutex<Vec<S>> = Mutex::new(Vec::new());
    let cancel = AtomicBool::new(false);
    let window = config.window.max(1);
    let max_stall = config.max_stall;
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
                        work(
                            at,
                            job,
                            next,
                            take_source(sources, make),
                            make,
                            new_sink,
                            max_stall,
                        )
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
            result = merge.flush();
        }
        cancel.store(true, Ordering::Relaxed);
        merge.stats.units = split.found();
        result.map(|()| merge.stats)
    })
}

fn take_source<S>(sources: &Mutex<Vec<S>>, make: &(impl Fn() -> S + Sync)) -> S {
    let reused = sources.lock().ok().and_then(|mut v| v.pop());
    reused.unwrap_or_else(make)
}

fn give_back<S>(sources: &Mutex<Vec<S>>, src: S) {
    if let Ok(mut v) = sources.lock() {
        v.push(src);
    }
}

/// Whether `item` reports something wrong.
fn is_failure(item: &FlowItem) -> bool {
    matches!(item, FlowItem::Error(_) | FlowItem::Stuck { .. })
}

/// The state after the first instruction a decode from `unit.start`
/// produces, or `None` if it produces none before the unit's end.
fn anchor<S: StepSource>(flow: &mut Flow<S>, unit: Unit) -> Option<Seam> {
    while let Some(item) = flow.next() {
        if is_failure(&item) {
            return None;
        }
        if let Some(seam) = flow.seam(&item) {
            return Some(seam);
        }
        if flow.source().offset() >= unit.end {
            return None;
        }
    }
    None
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
    max_stall: u64,
) -> Decoded<S, K> {
    // The next unit's anchor, found as its own worker will find it.
    let (next_anchor, src) = match next {
        Some(n) => {
            let mut flow = Flow::at(src, n.start).with_max_stall(max_stall);
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
        let mut flow = Flow::at(src, unit.start).with_max_stall(max_stall);
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
    while let Some(item) = next_into(&mut flow, &mut items) {
        if i > 0 && is_failure(&item) {
            // Perhaps state from before the unit was missing: the decode
            // from the start goes through this unit instead.
            return Decoded {
                unit,
                anchor: None,
                items: new_sink(0),
                end: End::Free(flow.into_source()),
            };
        }
        items.push(item);
        let Some(n) = next else { continue };
        match next_anchor {
            Some(a) => match flow.seam_at(&item, a.offset) {
                SeamAt::Before => {}
                SeamAt::Here(seam) if seam == a => {
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
    Spliced { seam: Seam, tail: Flow<S> },
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
        self.flush()?;
        (self.emit)(items)
    }

    /// The next item of `flow` (instructions passed over into the batch
    /// first when it only counts them).
    fn next(&mut self, flow: &mut Flow<S>) -> Option<FlowItem> {
        next_into(flow, &mut self.batch)
    }

    /// Decodes `flow` to the end of the trace.
    fn finish_open(&mut self, mut flow: Flow<S>) -> Result<(), E> {
        while let Some(item) = self.next(&mut flow) {
            self.push(item)?;
        }
        self.carry = Carry::Done;
        self.flush()
    }

    /// Merges unit `i`'s result.
    fn unit(&mut self, i: usize, d: Decoded<S, K>, sources: &Mutex<Vec<S>>) -> Result<(), E> {
        match std::mem::replace(&mut self.carry, Carry::Done) {
            Carry::Start if i == 0 => {
                self.stats.spliced += 1;
                self.hand_out(d.items)?;
                self.carry = carry(d.end, sources);
                Ok(())
            }
            Carry::Spliced { seam, tail } if d.anchor == Some(seam) => {
                self.stats.spliced += 1;
                give_back(sources, tail.into_source());
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
        sources: &Mutex<Vec<S>>,
    ) -> Result<Carry<S>, E> {
        if let Some(a) = d.anchor {
            while let Some(item) = self.next(&mut flow) {
                self.push(item)?;
                match flow.seam_at(&item, a.offset) {
                    SeamAt::Before => {}
                    SeamAt::Here(seam) if seam == a => {
                        self.stats.spliced += 1;
                        give_back(sources, flow.into_source());
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
            while let Some(item) = self.next(&mut flow) {
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

fn carry<S>(end: End<S>, sources: &Mutex<Vec<S>>) -> Carry<S> {
    match end {
        End::Done => Carry::Done,
        End::Spliced { seam, tail } => Carry::Spliced { seam, tail },
        End::Open(flow) => Carry::Open(flow),
        End::Free(src) => {
            give_back(sources, src);
            Carry::Done
        }
    }
}

fn release<S>(end: End<S>, sources: &Mutex<Vec<S>>) {
    match end {
        End::Done => {}
        End::Spliced { tail: flow, .. } | End::Open(flow) => give_back(sources, flow.into_source()),
        End::Free(src) => give_back(sources, src),
    }
}
