//! [`Flow`]: a step source driven to the end of the trace as libipt's
//! ptxed drives its decoder, one [`FlowItem`] at a time. This is the
//! sequential decode the parallel one must reproduce exactly.

use super::{PassedRun, RunVisitor, StepSource};
use crate::event::{Event, Status};
use crate::insn::{Insn, InsnClass};
use crate::{Error, ErrorKind};
use hwtrace_types::{Ip, TraceOffset};

/// What [`Flow::skip_runs`] passed over instead of making items of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Instructions.
    pub insns: u64,
    /// Events between them, none a status update: disables and enables
    /// of tracing (only a source made with
    /// [`FastSource::counting`](super::FastSource::counting) passes over
    /// events).
    pub events: u64,
    /// Status updates (events with `status_update` set) of PSB+ that
    /// said nothing new: written while tracing was off, or reporting
    /// where the decoder was (only a counting source passes over them,
    /// [`StepSource::pass_status_events`]).
    pub status_updates: u64,
}

/// One thing the trace says happened, in trace order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowItem {
    /// An executed instruction; `offset` is that of the packet being
    /// processed when it was decoded.
    Insn { offset: TraceOffset, insn: Insn },
    /// An event between instructions, at the offset of the packet that
    /// reported it; PSB+ status reports have `event.status_update` set.
    Event { offset: TraceOffset, event: Event },
    /// Decoding failed; it goes on at the next PSB (a
    /// [`FlowItem::Resync`] follows).
    Error(Error),
    /// Decoding resumed after an error: the bytes from `from` to `to`
    /// (the PSB synchronised to; `None`: none was left) were skipped.
    Resync {
        from: TraceOffset,
        to: Option<TraceOffset>,
    },
    /// `insns` instructions in a row decoded without reading any trace (at
    /// `offset`, the last at `ip`): an endless loop the trace cannot be
    /// describing. Decoding goes on at the next PSB.
    Stuck {
        offset: TraceOffset,
        ip: Ip,
        insns: u64,
    },
}

/// How many instructions may follow each other without the trace offset
/// moving. Only a cycle of direct jumps and calls decodes on without
/// trace; any real run without a conditional or indirect branch is
/// bounded by the size of straight-line code, far below this.
pub const MAX_STALL: u64 = 1 << 24;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Synchronise at the next PSB (`after_error`: the offset of the error
    /// that made it necessary).
    Sync { after_error: Option<TraceOffset> },
    /// Synchronise at the PSB at this offset (a worker's first sync).
    SyncAt(TraceOffset),
    /// Synchronised: decode on.
    Run(Status),
    /// The end of the trace.
    Done,
}

/// What a [`Flow`] looks like between two items, as far as anything that
/// decides later items can be seen from outside: two flows over the same
/// trace whose seams are equal produce the same items from there on (the
/// return stack aside, see [`super`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seam {
    /// The item just produced.
    pub item: FlowItem,
    /// The source's position and state after it.
    pub offset: TraceOffset,
    pub probe: super::Probe,
    status: Status,
    stall_offset: TraceOffset,
    stall: u64,
}

/// [`Flow::seam_at`]'s answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeamAt {
    /// Not yet at the seam's trace position.
    Before,
    /// At it, in this state (boxed: a seam holds the decoder's timing
    /// state, and is made once per unit where the other answers are made
    /// per item).
    Here(Box<Seam>),
    /// Past it.
    Past,
}

/// The step source `S` driven as an iterator of [`FlowItem`]s:
/// synchronise, drain pending events before each instruction, report an
/// error and resynchronise at the next PSB.
#[derive(Debug)]
pub struct Flow<S> {
    src: S,
    state: State,
    /// An item to hand out before decoding on (the error after a
    /// partially decoded instruction).
    queued: Option<FlowItem>,
    /// The last PSB synchronised to, or the last failed attempt:
    /// synchronisation must move forward.
    last_sync: Option<TraceOffset>,
    /// The trace offset at the last instruction, and how many instructions
    /// in a row were decoded there.
    stall_offset: TraceOffset,
    stall: u64,
    max_stall: u64,
}

impl<S> Flow<S> {
    /// The step source.
    pub fn source(&self) -> &S {
        &self.src
    }

    /// The step source, to change what it reads between two items (a
    /// perf.data queue switches the decoder's code image when another
    /// process is switched in).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.src
    }

    /// The step source back, for reuse (its code cache stays warm).
    pub fn into_source(self) -> S {
        self.src
    }
}

impl<S: StepSource> Flow<S> {
    /// Decodes `src`'s trace from its first PSB.
    pub fn new(src: S) -> Self {
        Self::with_state(src, State::Sync { after_error: None })
    }

    /// Decodes `src`'s trace from the PSB at `psb` (what a worker decoding
    /// a later stretch does; the items before the stretch's first
    /// instruction may differ from a decode from the start, see
    /// [`super`]).
    pub fn at(src: S, psb: TraceOffset) -> Self {
        Self::with_state(src, State::SyncAt(psb))
    }

    fn with_state(src: S, state: State) -> Self {
        Self {
            src,
            state,
            queued: None,
            last_sync: None,
            stall_offset: TraceOffset(u64::MAX),
            stall: 0,
            max_stall: MAX_STALL,
        }
    }

    /// Gives up after `max` instructions without trace instead of
    /// [`MAX_STALL`].
    pub fn with_max_stall(mut self, max: u64) -> Self {
        self.max_stall = max;
        self
    }

    /// The state after `item` (just produced by this flow), or `None`
    /// when the flow is not between instructions in the plain decoding
    /// state, where no seam is taken.
    pub fn seam(&self, item: &FlowItem) -> Option<Seam> {
        let State::Run(status) = self.state else {
            return None;
        };
        if self.queued.is_some() || !matches!(item, FlowItem::Insn { .. }) || !self.src.seam_ready()
        {
            return None;
        }
        Some(Seam {
            item: *item,
            offset: self.src.offset(),
            probe: self.src.probe(),
            status,
            stall_offset: self.stall_offset,
            stall: self.stall,
        })
    }

    /// Where the flow stands after `item` relative to a seam at `at`
    /// (cheap: the full state is only looked at where the trace position
    /// matches).
    pub fn seam_at(&self, item: &FlowItem, at: TraceOffset) -> SeamAt {
        let FlowItem::Insn { .. } = item else {
            return SeamAt::Before;
        };
        let offset = self.src.offset();
        if offset < at {
            SeamAt::Before
        } else if offset > at {
            // An instruction's offset is the query layer's position, which
            // only moves forward: the seam cannot come any more.
            SeamAt::Past
        } else {
            self.seam(item)
                .map_or(SeamAt::Before, |s| SeamAt::Here(Box::new(s)))
        }
    }

    /// Passes over the instructions the source can hand out without trace
    /// or status of their own ([`StepSource::take_insns`]), counting them
    /// as executed at the source's [`offset`](StepSource::offset) instead
    /// of making an item of each: for callers that only count
    /// instructions. Returns how many; the items that follow are those
    /// [`Iterator::next`] would have made after them. Never passes the
    /// instruction an endless-loop report ([`FlowItem::Stuck`]) names.
    pub fn skip_insns(&mut self) -> u64 {
        let State::Run(status) = self.state else {
            return 0;
        };
        if self.queued.is_some() || status.event_pending || status.eos {
            return 0;
        }
        let offset = self.src.offset();
        let stall = if offset == self.stall_offset {
            self.stall
        } else {
            0
        };
        let room = self.max_stall.saturating_sub(stall).saturating_sub(1);
        if room == 0 {
            return 0;
        }
        let n = self.src.take_insns(room).min(room);
        if n > 0 {
            self.stall_offset = offset;
            self.stall = stall + n;
        }
        n
    }

    /// Passes over pending PSB+ status updates that say nothing new
    /// ([`StepSource::pass_status_events`]), then over whole runs
    /// of instructions ([`StepSource::take_runs`]) while nothing but
    /// instructions come and the source is before trace offset `until`,
    /// then over the middle of the next run
    /// ([`skip_insns`](Self::skip_insns)): counting them as executed
    /// without making an item of each, for callers that only count.
    /// Returns how many of each. The items that follow are those
    /// [`Iterator::next`] would have made after them: an event, an error
    /// (after the instruction it follows, which stays an item), or the
    /// last instruction of a run that ends at or after `until` (so a
    /// caller looking for a [`Seam`] there still sees every run end).
    /// Stall accounting is the per-instruction one: a run that would
    /// reach the endless-loop limit is left to be handed out one by one,
    /// so [`FlowItem::Stuck`] names the exact instruction.
    pub fn skip_runs(&mut self, until: TraceOffset) -> Skipped {
        let status_updates = self.pass_status_events();
        let mut skipped = self.pass_runs(until, None);
        skipped.status_updates = status_updates;
        skipped.insns += self.skip_insns();
        skipped
    }

    /// Passes over pending PSB+ status updates that say nothing new
    /// ([`StepSource::pass_status_events`]), counting them; an error
    /// met after them is queued as the item [`Iterator::next`] would
    /// have made of it.
    fn pass_status_events(&mut self) -> u64 {
        let State::Run(status) = self.state else {
            return 0;
        };
        if self.queued.is_some() || !status.event_pending {
            return 0;
        }
        match self.src.pass_status_events() {
            None => 0,
            Some((n, Ok(status))) => {
                self.state = State::Run(status);
                n
            }
            Some((n, Err(e))) => {
                self.queued = Some(self.fail(e));
                n
            }
        }
    }

    /// Passes over whole runs of instructions as
    /// [`skip_runs`](Self::skip_runs) does (not the middle of the next
    /// one), handing each to `visit` instead of an item per instruction:
    /// for callers that keep runs (the source must keep runs whole, like
    /// [`FastSource::runs`](super::FastSource::runs)). The items that
    /// follow are those [`Iterator::next`] would have made after them.
    /// Returns how many instructions they held.
    pub fn visit_runs(&mut self, until: TraceOffset, visit: &mut dyn FnMut(&PassedRun)) -> u64 {
        let passed = self.pass_runs(until, Some(visit));
        // A source that passes over events only counts: events are items
        // for a caller that keeps runs.
        debug_assert_eq!((passed.events, passed.status_updates), (0, 0));
        passed.insns
    }

    fn pass_runs(&mut self, until: TraceOffset, visit: RunVisitor<'_>) -> Skipped {
        let mut taken = Skipped::default();
        if self.queued.is_none()
            && let State::Run(status) = self.state
            && !status.event_pending
            && !status.eos
            && let Some(t) = self.src.take_runs(self.max_stall, until, visit)
        {
            self.state = State::Run(t.status);
            // As `stalled` counts them one by one (none reaching the
            // limit, which `take_runs` guarantees).
            if t.last_offset == self.stall_offset && t.last_insns == t.insns {
                self.stall += t.insns;
            } else {
                self.stall_offset = t.last_offset;
                self.stall = t.last_insns;
            }
            taken = Skipped {
                insns: t.insns,
                events: t.events,
                status_updates: 0,
            };
        }
        taken
    }

    /// Whether the flow is done.
    pub fn is_done(&self) -> bool {
        self.state == State::Done && self.queued.is_none()
    }

    /// Counts an instruction decoded at trace `offset`; `Some` when too
    /// many came without trace.
    fn stalled(&mut self, offset: TraceOffset, ip: u64) -> Option<FlowItem> {
        if offset != self.stall_offset {
            self.stall_offset = offset;
            self.stall = 0;
        }
        self.stall += 1;
        if self.stall < self.max_stall {
            return None;
        }
        let insns = std::mem::take(&mut self.stall);
        self.stall_offset = TraceOffset(u64::MAX);
        self.state = State::Sync {
            after_error: Some(offset),
        };
        Some(FlowItem::Stuck {
            offset,
            ip: Ip(ip),
            insns,
        })
    }

    /// Reports `e` and arranges to resynchronise at the next PSB.
    fn fail(&mut self, e: Error) -> FlowItem {
        self.state = State::Sync {
            after_error: Some(e.offset),
        };
        FlowItem::Error(e)
    }

    /// One synchronisation attempt; `None` when there is nothing to report
    /// and decoding goes on.
    fn sync(
        &mut self,
        after_error: Option<TraceOffset>,
        at: Option<TraceOffset>,
    ) -> Option<FlowItem> {
        let r = match at {
            Some(psb) => self.src.sync_set(psb),
            None => self.src.sync_forward(),
        };
        match r {
            Ok(status) => {
                let to = match at {
                    Some(psb) => Some(psb),
                    None => self.src.sync_offset(),
                };
                if to.is_some() && to <= self.last_sync {
                    // The same PSB again: a decoder that cannot move on.
                    self.state = State::Done;
                    return after_error.map(|from| FlowItem::Resync { from, to: None });
                }
                self.last_sync = to;
                self.state = State::Run(status);
                after_error.map(|from| FlowItem::Resync { from, to })
            }
            Err(e) if e.kind == ErrorKind::Eos => {
                self.state = State::Done;
                after_error.map(|from| FlowItem::Resync { from, to: None })
            }
            Err(e) => {
                // PSB+ itself is bad: report it and try the PSB after it.
                let failed = Some(e.offset);
                if failed <= self.last_sync {
                    self.state = State::Done;
                } else {
                    self.last_sync = failed;
                    self.state = State::Sync {
                        after_error: after_error.or(failed),
                    };
                }
                Some(FlowItem::Error(e))
            }
        }
    }
}

impl<S: StepSource> Iterator for Flow<S> {
    type Item = FlowItem;

    fn next(&mut self) -> Option<FlowItem> {
        if let Some(item) = self.queued.take() {
            return Some(item);
        }
        loop {
            let status = match self.state {
                State::Done => return None,
                State::Sync { after_error } => {
                    if let Some(item) = self.sync(after_error, None) {
                        return Some(item);
                    }
                    continue;
                }
                State::SyncAt(psb) => {
                    if let Some(item) = self.sync(None, Some(psb)) {
                        return Some(item);
                    }
                    continue;
                }
                State::Run(status) => status,
            };
            if status.event_pending {
                let offset = self.src.offset();
                match self.src.event() {
                    Ok((event, status)) => {
                        self.state = State::Run(status);
                        return Some(FlowItem::Event { offset, event });
                    }
                    Err(e) => return Some(self.fail(e)),
                }
            }
            if status.eos {
                self.state = State::Done;
                return None;
            }
            let offset = self.src.offset();
            let mut insn = Insn::empty(0, None, false);
            match self.src.next_insn(&mut insn) {
                Ok(status) => {
                    self.state = State::Run(status);
                    self.queued = self.stalled(offset, insn.ip);
                    return Some(FlowItem::Insn { offset, insn });
                }
                Err(e) => {
                    let error = if e.kind == ErrorKind::Eos {
                        // The trace ended where more was needed: as in
                        // ptxed, the end, not an error.
                        self.state = State::Done;
                        None
                    } else {
                        Some(self.fail(e))
                    };
                    // An instruction decoded before the error was executed.
                    if insn.class != InsnClass::Unknown {
                        self.queued = error;
                        return Some(FlowItem::Insn { offset, insn });
                    }
                    if error.is_some() {
                        return error;
                    }
                }
            }
        }
    }
}
