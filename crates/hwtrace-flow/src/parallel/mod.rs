//! Parallel decoding by PSB segment, with output identical to a
//! sequential decode, instruction for instruction and event for event.
//!
//! A PSB+ restates most of the decoder's state (IP, execution mode, CR3,
//! TSX state, time), so a decode can start at any PSB. It does not
//! restate everything a decode from the start knows there, though:
//!
//! - the return stack: the SDM lets the processor compress only returns
//!   whose call it saw since the last PSB, so a conforming trace never
//!   needs an entry from before; a decode that does need one fails with an
//!   empty return stack, where the decode from the start would go on;
//! - the instructions between the last branch before a PSB and the IP the
//!   PSB+ reports, TNT bits and events still pending there, an overflow or
//!   an error just before it, tracing disabled across it (no IP in PSB+),
//!   a CR3 no PIP restates: all of these only exist in the decode from the
//!   start;
//! - whether a PSB+ mode report is news, and the first items after a
//!   resynchronisation;
//! - what the clock learned before: a CYC packet's cycles become time
//!   through a calibration measured over earlier MTC periods, which a
//!   decode from the PSB has not seen (a unit's clock is therefore warmed
//!   over the timing packets before its PSB, [`StepSource::warm_clock`],
//!   which usually teaches it the same calibration).
//!
//! So nothing is assumed. The trace is split at PSBs into [`Unit`]s. Each
//! worker decodes its unit from the unit's PSB ([`Flow::at`]); the state
//! after the first instruction it decodes is the unit's *anchor*
//! ([`Seam`]). Then it decodes on past the end of its unit, as the decode
//! from the start would, until its state after an instruction equals the
//! next unit's anchor (same item, trace position, IP, address space, time
//! and timing state, last IP, the instruction layer's mode, reports and
//! counts ([`InsnState`]), the TNT bits held ([`TntState`]), status and
//! stall count, with no event, error or instruction waiting in either
//! decoder; a source whose
//! caller reads no times, [`FastSource::untimed`], leaves the time out,
//! and its items' times may differ): from there the two decoders read the same
//! trace in the same state and produce the same items, so the next unit's
//! items after its anchor are spliced on. The return stack cannot be
//! compared, but (as above) a unit decode that differs because of it
//! first fails with an empty return stack, so a unit whose own decode
//! reports that error (before resynchronising, which clears the stack in
//! both decodes) is not trusted; other errors are the full decode's too.
//! An anchor may follow errors and resynchronisations: a seam is sound
//! wherever the states coincide. Where a seam is not found (the state
//! never coincides, a unit without any instruction, an untrusted unit) the
//! decode that came
//! from the start simply goes on through the next unit, on the thread
//! that merges the results, until a later seam is found: correctness
//! first, speed where the trace allows.
//!
//! Results are merged in trace order while workers run ahead; at most a
//! window of units is decoded but not yet handed out, so memory is
//! bounded whatever the trace's size.
//!
//! The engine is generic over its step source ([`StepSource`]): the
//! instruction decoder, or the block-cached fast decoder handing out its
//! runs ([`FastSource`]).

mod driver;
mod engine;
mod fast;
mod pool;
mod segment;

pub use driver::{Flow, FlowItem, MAX_STALL, Seam, SeamAt, Skipped};
pub use engine::{MAX_ITEM_WINDOW, ParallelConfig, ParallelStats, Sink, decode, decode_into};
pub use fast::FastSource;
pub use segment::{Splitter, Unit, psb_offsets, units};

use crate::Error;
use crate::event::{Event, Status, TntState};
use crate::insn::{BlockRun, Insn, InsnDecoder, InsnState};
use crate::time::ClockState;
use hwtrace_packet::LastIp;
use hwtrace_types::{AddressSpace, Ip, ReadMemory, TraceOffset};

/// What of a decoder's state can be seen from outside, compared at seams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Where the next instruction is.
    pub ip: Ip,
    /// The address space (CR3, VMCS) code is read in.
    pub space: AddressSpace,
    /// The estimated TSC at the last query, and whether it is wall-clock
    /// time.
    pub time: (u64, bool),
    /// The timing state behind the times to come: a unit's decode that
    /// learned less of the clock than the decode before it (a CYC
    /// calibration, say) is not spliced on, even where its time so far
    /// is the same.
    pub clock: ClockState,
    /// The last IP, the reference of the compressed IPs to come: two
    /// decodes that meet at one trace offset read them alike only with the
    /// same one (a PSB that one of them read as the inside of another
    /// packet reset only the other's).
    pub last_ip: LastIp,
    /// The instruction layer's own state (execution mode and what was
    /// reported of it, transaction state, what waits).
    pub insn: InsnState,
    /// The TNT bits held for the branches to come: a decode from the start
    /// may still hold bits where a unit's decode, started at a PSB after
    /// their packet, holds none.
    pub tnt: TntState,
}

/// What [`StepSource::take_runs`] passed over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Instructions passed over (at least one).
    pub insns: u64,
    /// The status after the last, as [`StepSource::next_insn`] would have
    /// returned it.
    pub status: Status,
    /// The trace offset the last of them were taken at, and how many in a
    /// row were (offsets only grow): the flow's stall count goes on from
    /// there.
    pub last_offset: TraceOffset,
    pub last_insns: u64,
    /// Events passed over among them (a counting source passes over a
    /// disable and the enable right after it), none a status update.
    pub events: u64,
}

/// A run of instructions [`Flow::visit_runs`] passed over, as a caller
/// that keeps runs (coverage, call trees) needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassedRun {
    /// The trace offset before it: every instruction of the run was
    /// decoded there (as [`FlowItem::Insn`]'s `offset` says).
    pub before: TraceOffset,
    /// The run: its first and last instruction, count, class and size of
    /// the last, address space and mode.
    pub run: BlockRun,
}

/// Where [`StepSource::take_runs`] hands each run it passes over, when
/// the caller wants them (`None`: only counted).
pub type RunVisitor<'v> = Option<&'v mut dyn FnMut(&PassedRun)>;

/// A decoder [`Flow`] can drive: the verbs of
/// [`InsnDecoder`], which implements it.
pub trait StepSource {
    /// Synchronises at the next PSB.
    fn sync_forward(&mut self) -> Result<Status, Error>;
    /// Synchronises at the PSB at `offset`.
    fn sync_set(&mut self, offset: TraceOffset) -> Result<Status, Error>;
    /// The offset of the packet being processed.
    fn offset(&self) -> TraceOffset;
    /// The offset of the last PSB synchronised to.
    fn sync_offset(&self) -> Option<TraceOffset>;
    /// The pending event, applied.
    fn event(&mut self) -> Result<(Event, Status), Error>;
    /// The next instruction (filled in even when an error follows it).
    fn next_insn(&mut self, insn: &mut Insn) -> Result<Status, Error>;
    /// The state seams compare.
    fn probe(&self) -> Probe;
    /// Whether [`probe`](Self::probe) and [`offset`](Self::offset) say all
    /// that decides the items to come, so a seam may be taken here (a
    /// source that hands out a batch of instructions one by one is not,
    /// inside a batch).
    fn seam_ready(&self) -> bool {
        true
    }
    /// Takes up to `max` of the instructions it can hand out next without
    /// reading trace or changing status (the middle of a run of straight
    /// code), without making them: for callers that only count
    /// ([`Flow::skip_insns`]). Returns how many; none by default.
    fn take_insns(&mut self, max: u64) -> u64 {
        let _ = max;
        0
    }

    /// Decodes batches of instructions (runs of straight code and the
    /// branch ending each) and passes over them whole, without making
    /// their instructions, while no error follows them, the source is
    /// before trace offset `until` after them and no endless-loop report
    /// could fall inside them (`max_stall` as in [`Flow::with_max_stall`]);
    /// stops after one leaving an event pending or the trace at its end.
    /// The first batch that does not qualify is handed out as usual (its
    /// middle may be taken with [`take_insns`](Self::take_insns)), so that
    /// the instruction an error follows, and run ends from `until` on,
    /// are items a caller can look at. `None` when nothing was passed
    /// over. Only called with no batch partly handed out, no event
    /// pending and the trace not at its end. For callers that only count
    /// ([`Flow::skip_runs`]): a decoder step and a few comparisons per
    /// block instead of an item per instruction. Passes over nothing by
    /// default.
    ///
    /// With `visit`, each run passed over is also handed to it, in order
    /// (the source must be one that keeps runs whole, like
    /// [`FastSource::runs`]).
    fn take_runs(
        &mut self,
        max_stall: u64,
        until: TraceOffset,
        visit: RunVisitor<'_>,
    ) -> Option<Taken> {
        let _ = (max_stall, until, visit);
        None
    }

    /// Takes the pending events while they are PSB+ status updates that
    /// say nothing new (written while tracing is off, or reporting where
    /// the decoder is), as [`event`](Self::event) would one after the
    /// other, without making them: for callers that only count
    /// ([`Flow::skip_runs`]). Returns how many `event` would have handed
    /// out and the status after the last, or the error `event` would then
    /// have returned; `None` when nothing was taken (the default).
    fn pass_status_events(&mut self) -> Option<(u64, Result<Status, Error>)> {
        None
    }

    /// Makes the next [`sync_set`](Self::sync_set) start with the clock the
    /// timing packets up to `window` bytes before its PSB leave, where
    /// the source stamps times (a unit decoded from its PSB then knows the
    /// CYC calibration the decode from the start has there, and can be
    /// spliced on). Nothing by default.
    fn warm_clock(&mut self, window: u64) {
        let _ = window;
    }

    /// Takes the caches of `warm` (a source of the same code that has
    /// decoded before), if this one has decoded nothing yet: a parallel
    /// decode's sources each start cold, and warming up (decoding the hot
    /// code's blocks and recording their TNT paths again) cost 7% more
    /// work with two threads than with one on the benchmark trace. Takes
    /// nothing by default.
    fn warm_from(&mut self, warm: &Self)
    where
        Self: Sized,
    {
        let _ = warm;
    }
}

impl<M: ReadMemory> StepSource for InsnDecoder<'_, M> {
    fn sync_forward(&mut self) -> Result<Status, Error> {
        InsnDecoder::sync_forward(self)
    }

    fn sync_set(&mut self, offset: TraceOffset) -> Result<Status, Error> {
        InsnDecoder::sync_set(self, offset)
    }

    fn warm_clock(&mut self, window: u64) {
        InsnDecoder::warm_clock(self, window);
    }

    fn seam_ready(&self) -> bool {
        // What waits to be handed out (events bound to a later packet, a
        // postponed instruction) is not compared at seams: a decode
        // holding any is not spliced on there.
        self.nothing_pending()
    }

    fn offset(&self) -> TraceOffset {
        InsnDecoder::offset(self)
    }

    fn sync_offset(&self) -> Option<TraceOffset> {
        InsnDecoder::sync_offset(self)
    }

    fn event(&mut self) -> Result<(Event, Status), Error> {
        InsnDecoder::event(self)
    }

    fn next_insn(&mut self, insn: &mut Insn) -> Result<Status, Error> {
        InsnDecoder::next_insn(self, insn)
    }

    fn probe(&self) -> Probe {
        Probe {
            ip: Ip(self.ip()),
            space: self.address_space(),
            time: self.time(),
            clock: self.clock_state(),
            last_ip: self.last_ip(),
            insn: self.insn_state(),
            tnt: self.tnt_state(),
        }
    }
}
