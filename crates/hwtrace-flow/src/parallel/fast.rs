//! [`FastSource`]: the block-cached [`FastDecoder`] as a [`StepSource`],
//! so [`Flow`](super::Flow) and the parallel engine drive it exactly as
//! they drive [`InsnDecoder`](crate::insn::InsnDecoder).
//!
//! The fast decoder yields runs of instructions; the driver asks for one
//! instruction at a time. The source hands a run out instruction by
//! instruction, with what the instruction decoder would have said between
//! them: the trace offset before the run (the instructions before a run's
//! last read no trace), no event pending, and after the last one the
//! decoder's status or the error met after it. So the items a flow makes
//! are the instruction decoder's, item for item.
//!
//! Two ways to hand a run out:
//!
//! - [`FastSource::new`] expands it ([`FastDecoder::expand`]): every
//!   instruction with its address, bytes and class, for callers that
//!   print or reshape instructions;
//! - [`FastSource::counting`] does not: only a run's first and last
//!   instruction are filled in (the last as the decoder ended the run,
//!   address, class and mode), those between carry the run's first
//!   address and no bytes. For callers that only count instructions and
//!   place them in the trace, which is what decoding at full speed needs:
//!   expanding costs an instruction-cache lookup per instruction, the bulk
//!   of what the block cache saves. The one place a flow reports an
//!   instruction's address from a run's middle, an endless loop given up
//!   after `max_stall` instructions ([`super::FlowItem::Stuck`]), is kept
//!   exact: a run that may hold that instruction is expanded.
//!
//! A caller that only counts need not take the instructions one by one
//! at all: [`Flow::skip_runs`](super::Flow::skip_runs) passes over whole
//! runs ([`StepSource::take_runs`]), taken from the decoder a burst at a
//! time where the code is plain ([`FastDecoder::next_runs`]) and a few
//! comparisons each, and hands out as items only what it must (events,
//! the instruction an error follows, a run that may end an endless loop,
//! the runs where a caller looks for a seam: the rest of a burst is then
//! handed out run by run); [`Flow::skip_insns`](super::Flow::skip_insns)
//! passes over the middle of a run handed out one by one. In count mode
//! a burst also goes on past the commonest events of IP-filtered traces,
//! a TIP.PGD right followed by a TIP.PGE (code outside the traced ranges
//! ran in between: a library call), counting the two events
//! ([`Skipped::events`](super::Skipped::events)) instead of handing them
//! out, and past PSB+ status updates that say nothing new (those written
//! while tracing is off between them, the rest of one written where the
//! decoder is) ([`Skipped::status_updates`](super::Skipped::status_updates),
//! [`FastDecoder::pass_status_events`]); a caller that only counts sees
//! the same totals.
//!
//! Seams are only taken between runs handed out, never inside a run or
//! with runs of a burst still to come ([`StepSource::seam_ready`]): the
//! decoder underneath is already past them, and its state says nothing
//! about how much is still to come.

use super::{PassedRun, Probe, RunVisitor, StepSource, Taken};
use crate::Error;
use crate::ErrorKind;
use crate::event::{Event, Status};
use crate::insn::{
    BlockRun, DEFAULT_RUN_CAPACITY, DEFAULT_TALLY_CAPACITY, FastDecoder, FastStep, Insn, InsnClass,
    MAX_CACHED_BLOCK_INSNS, RunBuffer, RunTally,
};
use crate::time::ClockState;
use hwtrace_types::{Ip, ReadMemory, TraceOffset};

/// The fast decoder driven one instruction at a time.
#[derive(Debug)]
pub struct FastSource<'a, M> {
    dec: FastDecoder<'a, M>,
    /// Expand runs into instructions (else count mode).
    expand: bool,
    /// Runs may be passed over whole ([`StepSource::take_runs`]) in
    /// expand mode too ([`FastSource::runs`]).
    whole_runs: bool,
    /// The run being handed out, and how many of its instructions are
    /// still to come.
    run: Option<BlockRun>,
    left: u32,
    /// The run's instructions, expanded (expand mode, or a count-mode run
    /// that might end in an endless loop's last instruction).
    insns: Vec<Insn>,
    /// The trace offset before the run.
    before: TraceOffset,
    /// The driver's stall counter as this source sees it (never below the
    /// driver's own): the offset of the last instruction handed out and
    /// how many in a row were at it.
    stall_offset: TraceOffset,
    stall: u64,
    max_stall: u64,
    /// What [`StepSource::take_runs`] met instead of a run (an error, the
    /// end of the trace), for the next [`StepSource::next_insn`] to return
    /// as it would have met it.
    failed: Option<Error>,
    /// Its items' times are not read ([`untimed`](Self::untimed)): seams
    /// leave the timing state out.
    untimed: bool,
    /// A burst of runs from the decoder ([`FastDecoder::next_runs`],
    /// count mode), and the first of them still to hand out one by one
    /// (`burst.len()`: none) with the trace offset before it: the decoder
    /// is past them all.
    burst: RunBuffer,
    /// A burst counted ([`FastDecoder::tally_runs`]) when nobody looks at
    /// its runs; those it keeps whole are swapped into `burst`.
    tally: RunTally,
    queued: usize,
    queued_before: TraceOffset,
    /// Whether the run being handed out is the last of the decoder's step
    /// (its last instruction carries the decoder's status, else none).
    step_last: bool,
    /// Whether the last run handed out ended in a branch: a point where
    /// every decode's runs end, whatever it went through before, so the
    /// only place a seam is taken (a decode that synchronised at a PSB
    /// steps its first instructions one by one, another one passing over
    /// that PSB runs the same code as one block: they agree only at the
    /// block's end).
    at_branch: bool,
}

/// How many runs a burst holds, with `max_stall` the endless-loop limit:
/// as many as fit a quarter of it (a burst is only taken where no report
/// can fall inside it, and each of its runs may be a cached block's
/// [`MAX_CACHED_BLOCK_INSNS`]), from [`DEFAULT_RUN_CAPACITY`] to
/// [`DEFAULT_TALLY_CAPACITY`] (4,096 with the default [`super::MAX_STALL`];
/// why long bursts pay is said there).
fn burst_runs(max_stall: u64) -> usize {
    let fit = max_stall / 4 / u64::from(MAX_CACHED_BLOCK_INSNS);
    usize::try_from(fit)
        .unwrap_or(usize::MAX)
        .clamp(DEFAULT_RUN_CAPACITY, DEFAULT_TALLY_CAPACITY)
}

impl<'a, M: ReadMemory> FastSource<'a, M> {
    /// Hands `dec`'s runs out as fully decoded instructions.
    pub fn new(dec: FastDecoder<'a, M>) -> Self {
        Self::with_mode(dec, true, u64::MAX)
    }

    /// Hands `dec`'s runs out for counting (see the module doc):
    /// `max_stall` must be the driving flow's ([`super::MAX_STALL`]
    /// unless set otherwise) for its endless-loop report to stay exact.
    /// [`Flow::skip_runs`](super::Flow::skip_runs) also passes over the
    /// disable and enable events of a TIP.PGD right followed by a
    /// TIP.PGE (tracing off at a branch and on again elsewhere: code
    /// outside the traced ranges ran), counting them
    /// ([`Skipped::events`](super::Skipped::events)) instead of making
    /// an item of each, and so it does with PSB+ status updates that say
    /// nothing new ([`FastDecoder::pass_status_events`]).
    pub fn counting(dec: FastDecoder<'a, M>, max_stall: u64) -> Self {
        let mut s = Self::with_mode(dec, false, max_stall);
        s.tally.set_passes_toggles(true);
        s
    }

    /// Hands `dec`'s runs out whole where the flow is plain code
    /// ([`Flow::visit_runs`](super::Flow::visit_runs)) and as fully
    /// decoded instructions where it is not (the runs an event, an error
    /// or an endless loop's end falls in): for callers that keep runs.
    /// `max_stall` as for [`counting`](Self::counting).
    pub fn runs(dec: FastDecoder<'a, M>, max_stall: u64) -> Self {
        let mut s = Self::with_mode(dec, true, max_stall);
        s.whole_runs = true;
        s
    }

    /// For a caller that does not read its items' times (events' TSC
    /// estimates): a parallel decode then splices a unit's decode on where
    /// all but its timing state is the decode's before it, and spends
    /// nothing on warming units' clocks ([`StepSource::warm_clock`]).
    /// Where the warmed clock of a unit still differs from the decode's
    /// before it (the calibration was measured further back, or that
    /// decode resynchronised in between), a timed decode does not splice
    /// there (see [`Probe::clock`](super::Probe::clock)); an untimed one
    /// does, and its items' times may then differ from a sequential
    /// decode's, nothing else.
    pub fn untimed(mut self) -> Self {
        self.untimed = true;
        self
    }

    fn with_mode(dec: FastDecoder<'a, M>, expand: bool, max_stall: u64) -> Self {
        let runs = burst_runs(max_stall);
        Self {
            dec,
            expand,
            whole_runs: !expand,
            run: None,
            left: 0,
            insns: Vec::new(),
            before: TraceOffset(0),
            stall_offset: TraceOffset(u64::MAX),
            stall: 0,
            max_stall,
            failed: None,
            untimed: false,
            burst: RunBuffer::with_capacity(runs),
            tally: RunTally::with_capacity(runs),
            queued: 0,
            queued_before: TraceOffset(0),
            step_last: true,
            at_branch: false,
        }
    }

    /// The fast decoder underneath.
    pub fn decoder(&self) -> &FastDecoder<'a, M> {
        &self.dec
    }

    /// The fast decoder underneath, for what it learned of the code
    /// ([`FastDecoder::into_code`]); what is left of a run is dropped.
    pub fn into_decoder(self) -> FastDecoder<'a, M> {
        self.dec
    }

    /// Replaces the memory code is read from (a sideband switch, between
    /// items): what is left of a run is dropped, decoded code forgotten
    /// ([`FastDecoder::set_memory`]).
    pub fn set_memory(&mut self, mem: M) {
        self.drop_run();
        self.dec.set_memory(mem);
    }

    /// Drops what is left of the run being handed out (a new
    /// synchronisation starts over).
    fn drop_run(&mut self) {
        self.run = None;
        self.left = 0;
        self.failed = None;
        self.burst.clear();
        self.queued = 0;
    }

    /// The trace offset the burst's last run was taken at (the one before
    /// its first is `before`) and how many instructions the burst's runs
    /// taken there hold.
    fn trailing(&self, before: TraceOffset) -> (TraceOffset, u64) {
        let k = self.burst.len();
        // The offset before run `i`.
        let at = |i: usize| match i.checked_sub(1) {
            Some(p) => self.burst.get(p).map_or(before, |r| r.offset),
            None => before,
        };
        let last = at(k.saturating_sub(1));
        let mut insns = 0;
        for i in (0..k).rev() {
            if at(i) != last {
                break;
            }
            insns += self.burst.get(i).map_or(0, |r| u64::from(r.insns));
        }
        (last, insns)
    }

    /// Whether runs of a burst wait to be handed out.
    fn queued_runs(&self) -> bool {
        self.queued < self.burst.len()
    }

    /// Makes the next queued run of the burst the run to hand out.
    fn dequeue(&mut self) -> Result<(), Error> {
        let before = self.queued_before;
        let Some(run) = self.burst.get(self.queued) else {
            return Err(Error {
                offset: before,
                ip: None,
                kind: ErrorKind::Internal,
            });
        };
        self.queued += 1;
        self.queued_before = run.offset;
        self.step_last = !self.queued_runs();
        self.start(before, run)
    }

    /// Adds `n` instructions taken at `before`, with `status` after them,
    /// to what [`StepSource::take_runs`] passed over.
    #[inline]
    fn add(&mut self, taken: &mut Option<Taken>, before: TraceOffset, n: u64, status: Status) {
        self.stall = self.stall_at(before).saturating_add(n);
        self.stall_offset = before;
        let t = taken.get_or_insert(Taken {
            insns: 0,
            status,
            last_offset: before,
            last_insns: 0,
            events: 0,
        });
        t.insns += n;
        t.status = status;
        if t.last_offset == before {
            t.last_insns += n;
        } else {
            t.last_offset = before;
            t.last_insns = n;
        }
    }

    /// Takes the next step of the fast decoder as the run to hand out;
    /// `Err` when there is none (the error, or the end of the trace).
    fn next_run(&mut self) -> Result<(), Error> {
        if self.queued_runs() {
            return self.dequeue();
        }
        let (before, run) = self.fetch()?;
        self.step_last = true;
        self.start(before, run)
    }

    /// The fast decoder's next step and the trace offset before it, when
    /// it is a run; `Err` when there is none (the error, or the end of the
    /// trace).
    #[inline]
    fn fetch(&mut self) -> Result<(TraceOffset, BlockRun), Error> {
        let before = self.dec.offset();
        let step = self.dec.next();
        Ok((before, Self::as_run(step, before, self.dec.ip())?))
    }

    /// The run of the decoder's `step` taken at `before` (the IP then at
    /// `ip`); `Err` when there is none (the error, or the end of the
    /// trace).
    fn as_run(
        step: Result<Option<FastStep>, Error>,
        before: TraceOffset,
        ip: u64,
    ) -> Result<BlockRun, Error> {
        match step? {
            Some(FastStep::Run(run)) => Ok(run),
            // The driver asks for an instruction only when the status said
            // no event is pending; a step that is an event anyway would be
            // a disagreement between the two decoders.
            Some(FastStep::Event(_)) => Err(Error {
                offset: before,
                ip: Some(ip),
                kind: ErrorKind::Internal,
            }),
            None => Err(Error {
                offset: before,
                ip: None,
                kind: ErrorKind::Eos,
            }),
        }
    }

    /// This source's stall count for a run taken at `before` (every
    /// instruction of a run is handed out there), before the run.
    #[inline]
    fn stall_at(&self, before: TraceOffset) -> u64 {
        if before == self.stall_offset {
            self.stall
        } else {
            0
        }
    }

    /// Makes `run`, taken at `before`, the run to hand out one by one.
    fn start(&mut self, before: TraceOffset, run: BlockRun) -> Result<(), Error> {
        self.before = before;
        let stall = self.stall_at(before);
        let may_stall = stall.saturating_add(u64::from(run.insns)) >= self.max_stall;
        self.insns.clear();
        if self.expand || may_stall {
            let insns = &mut self.insns;
            self.dec.expand(&run, |insn| insns.push(*insn))?;
        }
        self.run = Some(run);
        self.left = run.insns;
        Ok(())
    }

    /// Hands the first `k` runs of the burst, the first taken at
    /// `before`, to `visit`.
    fn visit_burst(&self, before: TraceOffset, k: usize, visit: &mut dyn FnMut(&PassedRun)) {
        let mut at = before;
        for i in 0..k {
            let Some(run) = self.burst.get(i) else { break };
            visit(&PassedRun { before: at, run });
            at = run.offset;
        }
    }

    /// After [`FastDecoder::tally_runs`] counted a burst taken at
    /// `before`: passes over its runs as the burst loop of
    /// [`StepSource::take_runs`] would have over the same runs copied
    /// out. Returns whether to return what was taken (as
    /// [`take_burst`](Self::take_burst)).
    fn take_tally(
        &mut self,
        taken: &mut Option<Taken>,
        before: TraceOffset,
        limit: u64,
        until: TraceOffset,
    ) -> bool {
        let status = self.dec.step_result();
        if !self.tally.reached_until() && status.is_ok() {
            // Nothing to hand out one by one: the last run too is counted.
            self.tally.count_kept();
        }
        let c = *self.tally.counted();
        // Runs kept whole are handed out as those of a copied burst are.
        std::mem::swap(&mut self.burst, self.tally.kept_mut());
        self.queued = 0;
        let after = match (self.burst.is_empty(), status) {
            (true, Ok(status)) => status,
            _ => Status::default(),
        };
        if c.runs > 0 {
            if c.insns > c.last_insns {
                self.add(taken, before, c.insns - c.last_insns, after);
            }
            self.add(taken, c.last_at, c.last_insns, after);
            if let Some(t) = taken {
                t.events += self.tally.events();
            }
        }
        if self.burst.is_empty() {
            return after.event_pending || after.eos;
        }
        self.take_burst(taken, c.end, limit, until, &mut None)
    }

    /// Passes over the runs of the burst taken at `before` one by one
    /// while none can end an endless loop, each is before `until` and
    /// no error follows it; the first other one and those after it are
    /// queued to be handed out one at a time. Returns whether to return
    /// what was taken (a run was queued, or the last one's status has news).
    fn take_burst(
        &mut self,
        taken: &mut Option<Taken>,
        before: TraceOffset,
        limit: u64,
        until: TraceOffset,
        visit: &mut RunVisitor<'_>,
    ) -> bool {
        let k = self.burst.len();
        let mut at = before;
        for i in 0..k {
            let Some(run) = self.burst.get(i) else { break };
            let n = u64::from(run.insns);
            let status = if i + 1 == k {
                self.dec.step_result()
            } else {
                Ok(Status::default())
            };
            if self.stall_at(at).saturating_add(n) < limit
                && run.offset < until
                && let Ok(status) = status
            {
                self.add(taken, at, n, status);
                if let Some(v) = visit.as_deref_mut() {
                    v(&PassedRun { before: at, run });
                }
                at = run.offset;
                continue;
            }
            // This run and those after it one by one.
            self.queued = i;
            self.queued_before = at;
            if let Err(e) = self.dequeue() {
                self.failed = Some(e);
            }
            return true;
        }
        self.queued = k;
        matches!(taken, Some(t) if t.status.event_pending || t.status.eos)
    }

    /// Instruction `i` of `run`, as far as count mode knows it.
    fn counted(run: &BlockRun, i: u32) -> Insn {
        if i + 1 == run.insns {
            let mut insn = Insn::empty(run.end_ip.0, run.mode, run.speculative);
            insn.class = run.end_class;
            insn
        } else {
            let mut insn = Insn::empty(run.ip.0, run.mode, run.speculative);
            insn.class = InsnClass::Other;
            insn
        }
    }
}

impl<M: ReadMemory> StepSource for FastSource<'_, M> {
    fn warm_from(&mut self, warm: &Self) {
        self.dec.warm_from(&warm.dec);
    }

    fn sync_forward(&mut self) -> Result<Status, Error> {
        self.drop_run();
        self.dec.sync_forward()
    }

    fn sync_set(&mut self, offset: TraceOffset) -> Result<Status, Error> {
        self.drop_run();
        self.dec.sync_set(offset)
    }

    fn warm_clock(&mut self, window: u64) {
        // Seams leave an untimed source's clock out: nothing to warm.
        if !self.untimed {
            self.dec.warm_clock(window);
        }
    }

    fn offset(&self) -> TraceOffset {
        if self.left > 0 {
            self.before
        } else if self.queued_runs() {
            self.queued_before
        } else {
            self.dec.offset()
        }
    }

    fn sync_offset(&self) -> Option<TraceOffset> {
        self.dec.sync_offset()
    }

    fn event(&mut self) -> Result<(Event, Status), Error> {
        self.drop_run();
        match self.dec.next()? {
            Some(FastStep::Event(event)) => Ok((event, self.dec.step_result()?)),
            // Asked for an event where the decoder has none: the two
            // decoders disagree.
            _ => Err(Error {
                offset: self.dec.offset(),
                ip: Some(self.dec.ip()),
                kind: ErrorKind::Internal,
            }),
        }
    }

    fn pass_status_events(&mut self) -> Option<(u64, Result<Status, Error>)> {
        // Only a counting source passes over events.
        if !self.tally.passes_toggles()
            || self.left > 0
            || self.failed.is_some()
            || self.queued_runs()
        {
            return None;
        }
        let (n, failed) = self.dec.pass_status_events()?;
        self.drop_run();
        Some((
            n,
            match failed {
                Some(e) => Err(e),
                None => self.dec.step_result(),
            },
        ))
    }

    fn next_insn(&mut self, insn: &mut Insn) -> Result<Status, Error> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        if self.left == 0 {
            self.next_run()?;
        }
        let Some(run) = self.run else {
            return Err(Error {
                offset: self.dec.offset(),
                ip: None,
                kind: ErrorKind::Internal,
            });
        };
        let i = run.insns - self.left;
        *insn = match self.insns.get(i as usize) {
            Some(expanded) => *expanded,
            None => Self::counted(&run, i),
        };
        if self.before != self.stall_offset {
            self.stall_offset = self.before;
            self.stall = 0;
        }
        self.stall = self.stall.saturating_add(1);
        self.left -= 1;
        if self.left > 0 {
            return Ok(Status::default());
        }
        self.run = None;
        self.at_branch = !matches!(
            run.end_class,
            InsnClass::Other | InsnClass::Ptwrite | InsnClass::Unknown
        );
        if self.step_last {
            self.dec.step_result()
        } else {
            Ok(Status::default())
        }
    }

    fn probe(&self) -> Probe {
        Probe {
            ip: Ip(self.dec.ip()),
            space: self.dec.address_space(),
            time: if self.untimed {
                (0, false)
            } else {
                self.dec.time()
            },
            clock: if self.untimed {
                ClockState::default()
            } else {
                self.dec.clock_state()
            },
            last_ip: self.dec.last_ip(),
            insn: self.dec.insn_state(),
            tnt: self.dec.tnt_state(),
        }
    }

    fn seam_ready(&self) -> bool {
        self.left == 0 && !self.queued_runs() && self.at_branch && self.dec.nothing_waiting()
    }

    /// Count mode only: the run's instructions before its last (which
    /// carries the status or error after the run).
    fn take_insns(&mut self, max: u64) -> u64 {
        if self.expand || self.left <= 1 {
            return 0;
        }
        let n = (self.left - 1).min(u32::try_from(max).unwrap_or(u32::MAX));
        self.left -= n;
        if self.before != self.stall_offset {
            self.stall_offset = self.before;
            self.stall = 0;
        }
        self.stall = self.stall.saturating_add(u64::from(n));
        u64::from(n)
    }

    /// Count mode only: runs are passed over whole while this source
    /// would not expand them (none can hold an endless loop's last
    /// instruction: its stall count is never below the flow's), no error
    /// follows and the decoder is still before `until`; the first other
    /// one becomes the run handed out one by one. One loop around the
    /// decoder's step, as a caller of [`FastDecoder`] itself would write.
    fn take_runs(
        &mut self,
        max_stall: u64,
        until: TraceOffset,
        mut visit: RunVisitor<'_>,
    ) -> Option<Taken> {
        if !self.whole_runs || self.left > 0 || self.failed.is_some() || self.queued_runs() {
            return None;
        }
        let limit = self.max_stall.min(max_stall);
        let mut taken: Option<Taken> = None;
        loop {
            let before = self.dec.offset();
            // Plain code a burst at a time: every run but the last of a
            // burst has no status of its own. The decoder ends up past the
            // whole burst, so a burst is only asked for where no
            // endless-loop report can fall inside it (resynchronising from
            // past the instruction it names would not be exact): a burst
            // holds at most its capacity of cached blocks. A burst stops
            // at the first run taken at or past `until`, where the caller
            // looks for seams: what follows it is handed out one by one.
            let most =
                (self.burst.capacity() as u64).saturating_mul(u64::from(MAX_CACHED_BLOCK_INSNS));
            let burst = self.stall_at(before).saturating_add(most) < limit && before < until;
            if burst && visit.is_none() {
                // Nobody looks at the runs: counted, not copied.
                let k = self.dec.tally_runs(&mut self.tally, until);
                if k > 0 {
                    if self.take_tally(&mut taken, before, limit, until) {
                        return taken;
                    }
                    continue;
                }
            }
            let k = if burst && visit.is_some() {
                self.dec.next_runs_until(&mut self.burst, until)
            } else {
                0
            };
            if k > 0 {
                // Usually the whole burst is taken: offsets only grow, so
                // only its last run decides (`until`, its status), and the
                // stall count goes on from the runs at the last offset.
                if let Some(last) = self.burst.get(k - 1)
                    && last.offset < until
                    && let Ok(status) = self.dec.step_result()
                {
                    if let Some(v) = visit.as_deref_mut() {
                        self.visit_burst(before, k, v);
                    }
                    let (at, trailing) = self.trailing(before);
                    let total = self.burst.insns();
                    if total > trailing {
                        self.add(&mut taken, before, total - trailing, status);
                    }
                    self.add(&mut taken, at, trailing, status);
                    self.queued = k;
                    if status.event_pending || status.eos {
                        return taken;
                    }
                    continue;
                }
                if self.take_burst(&mut taken, before, limit, until, &mut visit) {
                    return taken;
                }
                continue;
            }
            let step = self.dec.next();
            // Only the count is read on the way through: copying the whole
            // run out of the step costs more than the rest of the loop.
            let Ok(Some(FastStep::Run(BlockRun { insns, .. }))) = &step else {
                match Self::as_run(step, before, self.dec.ip()) {
                    Ok(run) => {
                        self.step_last = true;
                        if let Err(e) = self.start(before, run) {
                            self.failed = Some(e);
                        }
                    }
                    Err(e) => self.failed = Some(e),
                }
                return taken;
            };
            let n = u64::from(*insns);
            if self.stall_at(before).saturating_add(n) < limit
                && self.dec.offset() < until
                && let Ok(status) = self.dec.step_result()
            {
                self.add(&mut taken, before, n, status);
                if let (Some(v), Ok(Some(FastStep::Run(run)))) = (visit.as_deref_mut(), step) {
                    v(&PassedRun { before, run });
                }
                if status.event_pending || status.eos {
                    return taken;
                }
                continue;
            }
            if let Ok(Some(FastStep::Run(run))) = step {
                self.step_last = true;
                if let Err(e) = self.start(before, run) {
                    self.failed = Some(e);
                }
            }
            return taken;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;
    use crate::event::EventKind;
    use crate::insn::InsnDecoder;
    use crate::parallel::{Flow, FlowItem, MAX_STALL};
    use hwtrace_packet::{Packet, Tnt, TraceBuilder};
    use hwtrace_types::BytesAt;

    #[test]
    fn bursts_are_as_long_as_the_endless_loop_limit_lets_them() {
        // The default limit: the longest bursts, a quarter of it at most.
        assert_eq!(burst_runs(MAX_STALL), DEFAULT_TALLY_CAPACITY);
        assert_eq!(burst_runs(u64::MAX), DEFAULT_TALLY_CAPACITY);
        // A lower limit: shorter bursts, never below a run buffer's.
        assert_eq!(burst_runs(1 << 21), 512);
        assert_eq!(burst_runs(1000), DEFAULT_RUN_CAPACITY);
        for max_stall in [1 << 20, 1 << 22, 3 << 21, MAX_STALL] {
            let most = burst_runs(max_stall) as u64 * u64::from(MAX_CACHED_BLOCK_INSNS);
            assert!(most <= max_stall / 4, "{max_stall}: {most}");
        }
    }

    /// `code` at 0x1000.
    fn code_at(bytes: &'static [u8]) -> BytesAt<'static> {
        BytesAt::new(Ip(0x1000), bytes)
    }

    /// PSB+ with tracing on at 0x1000, then `tnt` (taken bits), twice.
    fn trace(tnt: u64, len: u8) -> Vec<u8> {
        let mut t = TraceBuilder::new();
        for _ in 0..2 {
            t.psb_plus_64(0x1000).unwrap();
            t.push(Packet::Tnt(Tnt {
                bits: tnt,
                len,
                long: false,
            }))
            .unwrap();
        }
        t.finish()
    }

    /// What a counting caller keeps of an item: instructions as their
    /// trace offset only.
    fn counted(item: &FlowItem) -> FlowItem {
        match *item {
            FlowItem::Insn { offset, .. } => FlowItem::Insn {
                offset,
                insn: Insn::empty(0, None, false),
            },
            other => other,
        }
    }

    /// 1000: nop x3; 1003: jnz 1000 (taken while the TNT says so); 1005:
    /// nop; 1006: jmp 1005, a loop no trace can describe.
    const LOOPS: &[u8] = &[0x90, 0x90, 0x90, 0x75, 0xfb, 0x90, 0xeb, 0xfd];

    #[test]
    fn runs_handed_out_are_the_instruction_decoders_items() {
        for max_stall in [7, 8, 9, 100, 1000] {
            let trace = trace(0b110, 3);
            let want: Vec<FlowItem> =
                Flow::new(InsnDecoder::new(&trace, Config::default(), code_at(LOOPS)))
                    .with_max_stall(max_stall)
                    .collect();
            // Given up inside the jnz loop (one TNT packet feeds it, so
            // the trace offset stays put) or in the jmp loop, often in a
            // block's middle.
            assert!(
                want.iter().any(|i| matches!(i, FlowItem::Stuck { .. })),
                "{want:?}"
            );
            let fast = FastDecoder::new(&trace, Config::default(), code_at(LOOPS));
            let got: Vec<FlowItem> = Flow::new(FastSource::new(fast))
                .with_max_stall(max_stall)
                .collect();
            assert_eq!(got, want, "max_stall {max_stall}");
            // Counting: the same items, instructions aside, and every
            // endless loop reported at its exact last instruction.
            let fast = FastDecoder::new(&trace, Config::default(), code_at(LOOPS));
            let got: Vec<FlowItem> = Flow::new(FastSource::counting(fast, max_stall))
                .with_max_stall(max_stall)
                .collect();
            let got: Vec<FlowItem> = got.iter().map(counted).collect();
            let want: Vec<FlowItem> = want.iter().map(counted).collect();
            assert_eq!(got, want, "counting, max_stall {max_stall}");
        }
    }

    #[test]
    fn skipped_runs_count_the_same_and_stop_at_the_same_loop() {
        for max_stall in [7, 8, 9, 100, 1000] {
            let trace = trace(0b110, 3);
            let want: Vec<FlowItem> =
                Flow::new(InsnDecoder::new(&trace, Config::default(), code_at(LOOPS)))
                    .with_max_stall(max_stall)
                    .collect();
            let want_insns = want
                .iter()
                .filter(|i| matches!(i, FlowItem::Insn { .. }))
                .count() as u64;
            let want: Vec<FlowItem> = want
                .iter()
                .filter(|i| !matches!(i, FlowItem::Insn { .. }))
                .copied()
                .collect();
            let fast = FastDecoder::new(&trace, Config::default(), code_at(LOOPS));
            let mut flow =
                Flow::new(FastSource::counting(fast, max_stall)).with_max_stall(max_stall);
            let (mut insns, mut skipped, mut got) = (0, 0, Vec::new());
            loop {
                let n = flow.skip_insns();
                skipped += n;
                insns += n;
                match flow.next() {
                    Some(FlowItem::Insn { .. }) => insns += 1,
                    Some(other) => got.push(other),
                    None => break,
                }
            }
            assert_eq!((insns, &got), (want_insns, &want), "max_stall {max_stall}");
            assert!(skipped > 0, "max_stall {max_stall}: nothing skipped");
        }
    }

    /// 1000: nop x3; 1003: jnz 1000; 1005: jmp rax (where the next TIP
    /// says).
    const INDIRECT: &[u8] = &[0x90, 0x90, 0x90, 0x75, 0xfb, 0xff, 0xe0];

    /// Per PSB: PSB+ at 0x1000, TNT `tnt`, a TIP back to 0x1000, the TNT
    /// again and a TIP to `to` (unmapped: an error, then a resync).
    fn indirect_trace(tnt: u64, len: u8, to: u64) -> Vec<u8> {
        let mut t = TraceBuilder::new();
        let bits = Packet::Tnt(Tnt {
            bits: tnt,
            len,
            long: false,
        });
        for _ in 0..3 {
            t.psb_plus_64(0x1000).unwrap();
            t.push(bits).unwrap();
            t.ip(Packet::Tip, 0x1000).unwrap();
            t.push(bits).unwrap();
            t.ip(Packet::Tip, to).unwrap();
        }
        t.finish()
    }

    /// The items other than instructions, each with how many instructions
    /// came before it, and how many came in all.
    fn placed(items: impl IntoIterator<Item = FlowItem>) -> (Vec<(u64, FlowItem)>, u64) {
        let mut insns = 0;
        let mut other = Vec::new();
        for item in items {
            match item {
                FlowItem::Insn { .. } => insns += 1,
                item => other.push((insns, item)),
            }
        }
        (other, insns)
    }

    /// A status update of a kind a counting decode may pass over.
    fn passable(item: &FlowItem) -> bool {
        matches!(item, FlowItem::Event { event, .. } if crate::event::passable_status(event))
    }

    /// `placed`'s items but the status updates a counting decode may pass
    /// over, and how many of those there were.
    fn without_status(placed: &[(u64, FlowItem)]) -> (Vec<(u64, FlowItem)>, u64) {
        let kept: Vec<_> = placed
            .iter()
            .filter(|(_, i)| !passable(i))
            .copied()
            .collect();
        let n = (placed.len() - kept.len()) as u64;
        (kept, n)
    }

    #[test]
    fn whole_runs_passed_over_place_every_item_as_the_instruction_decoder() {
        let cases: [(&[u8], Vec<u8>); 4] = [
            (LOOPS, trace(0b110, 3)),
            (LOOPS, trace(0b1, 1)),
            (INDIRECT, indirect_trace(0b110, 3, 0x9000)),
            (INDIRECT, indirect_trace(0b11110, 5, 0x1000)),
        ];
        let (mut stuck, mut failed) = (false, false);
        for (code, trace) in &cases {
            let len = trace.len() as u64;
            for max_stall in [7, 8, 9, 100, 1000] {
                let insn = InsnDecoder::new(trace, Config::default(), code_at(code));
                let want = placed(Flow::new(insn).with_max_stall(max_stall));
                let (want_items, want_status) = without_status(&want.0);
                // Every way to bound the runs passed over (none whole, up
                // to each byte of the trace, all) while loops are short.
                let untils: Vec<u64> = if max_stall < 1000 {
                    (0..=len).chain([u64::MAX]).collect()
                } else {
                    vec![0, len / 2, u64::MAX]
                };
                for until in untils {
                    let fast = FastDecoder::new(trace, Config::default(), code_at(code));
                    let mut flow =
                        Flow::new(FastSource::counting(fast, max_stall)).with_max_stall(max_stall);
                    let (mut insns, mut skipped, mut got) = (0, 0, Vec::new());
                    let mut status = 0;
                    loop {
                        let passed = flow.skip_runs(TraceOffset(until));
                        // No TIP.PGD/TIP.PGE pair in these traces.
                        assert_eq!(passed.events, 0);
                        status += passed.status_updates;
                        let n = passed.insns;
                        skipped += n;
                        insns += n;
                        match flow.next() {
                            Some(FlowItem::Insn { .. }) => insns += 1,
                            Some(other) if passable(&other) => status += 1,
                            Some(other) => got.push((insns, other)),
                            None => break,
                        }
                    }
                    let what = format!("max_stall {max_stall}, until {until}");
                    assert_eq!(
                        (&got, insns, status),
                        (&want_items, want.1, want_status),
                        "{what}"
                    );
                    assert!(skipped > 0, "{what}: nothing passed over");
                }
            }
            let insn = InsnDecoder::new(trace, Config::default(), code_at(code));
            for (_, item) in placed(Flow::new(insn).with_max_stall(100)).0 {
                stuck |= matches!(item, FlowItem::Stuck { .. });
                failed |= matches!(item, FlowItem::Error(_));
            }
        }
        // The cases hold both ways a decode gives up.
        assert!(stuck && failed);
    }

    /// Per PSB: PSB+ at 0x1000, then `rounds` times three TNTs of six
    /// taken bits, a not-taken one and a TIP back to 0x1000; at the end a
    /// TIP to `to`.
    fn long_trace(rounds: usize, to: u64) -> Vec<u8> {
        let mut t = TraceBuilder::new();
        let tnt = |bits, len| {
            Packet::Tnt(Tnt {
                bits,
                len,
                long: false,
            })
        };
        for _ in 0..2 {
            t.psb_plus_64(0x1000).unwrap();
            for _ in 0..rounds {
                for _ in 0..3 {
                    t.push(tnt(0b11_1111, 6)).unwrap();
                }
                t.push(tnt(0, 1)).unwrap();
                t.ip(Packet::Tip, 0x1000).unwrap();
            }
            t.push(tnt(0, 1)).unwrap();
            t.ip(Packet::Tip, to).unwrap();
        }
        t.finish()
    }

    #[test]
    fn bursts_of_runs_passed_over_place_every_item_as_the_instruction_decoder() {
        let mut bursts = false;
        for to in [0x9000, 0x1000] {
            let trace = long_trace(6, to);
            let insn = InsnDecoder::new(&trace, Config::default(), code_at(INDIRECT));
            let want = placed(Flow::new(insn));
            let (want_items, want_status) = without_status(&want.0);
            // The stall count the source keeps (what decides whether a run
            // may end an endless loop) at each item other than an
            // instruction or a status update, as when every instruction is
            // handed out.
            let fast = FastDecoder::new(&trace, Config::default(), code_at(INDIRECT));
            let mut flow = Flow::new(FastSource::counting(fast, MAX_STALL));
            let mut want_stalls = Vec::new();
            while let Some(item) = flow.next() {
                if !matches!(item, FlowItem::Insn { .. }) && !passable(&item) {
                    let src = flow.source();
                    want_stalls.push((src.stall_offset, src.stall));
                }
            }
            let untils = (0..=trace.len() as u64).chain([u64::MAX]);
            // Counted (`skip_runs`), and visited run by run (`visit_runs`,
            // the runs copied out).
            for (until, visiting) in untils.flat_map(|u| [(u, false), (u, true)]) {
                // Bursts right up to `until`: taken there in part.
                let fast = FastDecoder::new(&trace, Config::default(), code_at(INDIRECT));
                let src = if visiting {
                    FastSource::runs(fast, MAX_STALL)
                } else {
                    FastSource::counting(fast, MAX_STALL)
                };
                let mut flow = Flow::new(src);
                let (mut insns, mut got, mut stalls) = (0, Vec::new(), Vec::new());
                let mut status = 0;
                loop {
                    insns += if visiting {
                        let mut visited = 0;
                        let n = flow.visit_runs(TraceOffset(until), &mut |r| {
                            visited += u64::from(r.run.insns);
                        });
                        assert_eq!(
                            n, visited,
                            "until {until}: what was visited is what was taken"
                        );
                        n
                    } else {
                        let passed = flow.skip_runs(TraceOffset(until));
                        assert_eq!(passed.events, 0);
                        status += passed.status_updates;
                        passed.insns
                    };
                    bursts |= flow.source().burst.len() > 1;
                    match flow.next() {
                        Some(FlowItem::Insn { .. }) => insns += 1,
                        Some(other) if passable(&other) => status += 1,
                        Some(other) => {
                            got.push((insns, other));
                            stalls.push((flow.source().stall_offset, flow.source().stall));
                        }
                        None => break,
                    }
                }
                let what = format!("to {to:#x}, until {until}, visiting {visiting}");
                assert_eq!(
                    (&got, insns, status),
                    (&want_items, want.1, want_status),
                    "{what}"
                );
                assert_eq!(stalls, want_stalls, "{what}");
            }
        }
        // Bursts were passed over (one taken up to `until` stops after the
        // first block at or past it, handed out one by one at once).
        assert!(bursts);
    }

    /// 1000: nop; 1001: jz 1000; 1003: call 1010; 1008: nop; 1009: ret;
    /// 100a: nop x6; 1010: nop; 1011: jmp 1018; 1013: nop x5; 1018: jmp
    /// rax; 101a: ret.
    const TOGGLED: &[u8] = &[
        0x90, 0x74, 0xfd, 0xe8, 0x08, 0x00, 0x00, 0x00, 0x90, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90,
        0x90, 0x90, 0xeb, 0x05, 0x90, 0x90, 0x90, 0x90, 0x90, 0xff, 0xe0, 0xc3,
    ];

    /// Tracing off and on again (TIP.PGD, TIP.PGE) in the ways a
    /// counting burst passes over: a disable bound after a direct call
    /// and jump it does not bind to (the call's return used after the
    /// enable), one bound to a direct call to its IP, one to a return,
    /// and the trace ending after the last enable (`tail` after it).
    fn toggled_trace(tail: &[u8]) -> Vec<u8> {
        let tnt = |bits: u64, len: u8| {
            Packet::Tnt(Tnt {
                bits,
                len,
                long: false,
            })
        };
        let mut t = TraceBuilder::new();
        t.psb_plus_64(0x1000).unwrap();
        t.push(tnt(0b10, 2)).unwrap();
        t.ip(Packet::TipPgd, 0x7f00_2000).unwrap();
        t.ip(Packet::TipPge, 0x101a).unwrap();
        t.push(tnt(0b1, 1)).unwrap();
        t.ip(Packet::Tip, 0x1000).unwrap();
        t.push(tnt(0b10, 2)).unwrap();
        t.ip(Packet::TipPgd, 0x1010).unwrap();
        t.push(Packet::Pad).unwrap();
        t.push(Packet::Pad).unwrap();
        t.ip(Packet::TipPge, 0x1000).unwrap();
        t.push(tnt(0b0, 1)).unwrap();
        t.ip(Packet::Tip, 0x101a).unwrap();
        t.ip(Packet::TipPgd, 0x7f00_3000).unwrap();
        t.ip(Packet::TipPge, 0x1000).unwrap();
        t.raw(tail);
        t.finish()
    }

    #[test]
    fn disables_and_enables_passed_over_count_as_the_instruction_decoder() {
        // Nothing after the last enable, a PAD, a bad packet (`02 ff`).
        for tail in [&[][..], &[0x00], &[0x02, 0xff]] {
            let trace = toggled_trace(tail);
            let insn = InsnDecoder::new(&trace, Config::default(), code_at(TOGGLED));
            let toggle = |item: &FlowItem| {
                matches!(item, FlowItem::Event { event, .. }
                    if matches!(event.kind, EventKind::Disabled { .. } | EventKind::Enabled { .. }))
            };
            let (want, want_insns) = placed(Flow::new(insn));
            let want_toggles = want.iter().filter(|(_, i)| toggle(i)).count() as u64;
            let want: Vec<_> = want.into_iter().filter(|(_, i)| !toggle(i)).collect();
            assert!(
                want_toggles >= 5,
                "{tail:?}: {want_toggles} disables/enables"
            );
            let fast = FastDecoder::new(&trace, Config::default(), code_at(TOGGLED));
            let mut flow = Flow::new(FastSource::counting(fast, MAX_STALL));
            let (mut insns, mut passed, mut toggles, mut got) = (0, 0, 0, Vec::new());
            loop {
                let skipped = flow.skip_runs(TraceOffset(u64::MAX));
                insns += skipped.insns;
                passed += skipped.events;
                match flow.next() {
                    Some(FlowItem::Insn { .. }) => insns += 1,
                    Some(item) if toggle(&item) => toggles += 1,
                    Some(item) => got.push((insns, item)),
                    None => break,
                }
            }
            assert_eq!((&got, insns), (&want, want_insns), "{tail:?}");
            assert_eq!(toggles + passed, want_toggles, "{tail:?}");
            // Every pair but the first (which follows PSB+, where the
            // instruction decoder steps) is passed over.
            assert!(passed >= 4, "{tail:?}: {passed} passed over");
        }
    }

    #[test]
    fn seams_are_only_taken_between_runs() {
        let trace = trace(0b1, 1);
        let fast = FastDecoder::new(&trace, Config::default(), code_at(LOOPS));
        let mut flow = Flow::new(FastSource::new(fast)).with_max_stall(50);
        let mut seams = Vec::new();
        while let Some(item) = flow.next() {
            if let FlowItem::Insn { insn, .. } = item {
                seams.push((insn.ip, flow.seam(&item).is_some()));
            }
            if seams.len() == 6 {
                break;
            }
        }
        // The first instruction after PSB+ is stepped alone; the block
        // at 1000 then runs as one (a seam only after its jnz).
        assert_eq!(
            &seams[1..5],
            [
                (0x1001, false),
                (0x1002, false),
                (0x1003, true),
                (0x1000, false)
            ],
            "{seams:?}"
        );
    }
}
