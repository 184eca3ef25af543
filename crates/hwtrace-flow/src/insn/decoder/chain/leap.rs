//! A sprint by leaps: the steps from one station to the last one within
//! [`LEAP_BYTES`] bytes of trace, remembered in the cache's
//! [`LeapMemo`](crate::insn::leapmemo::LeapMemo) and taken again in one
//! lookup (see there for why that pays).
//!
//! A leap is recorded by a *dry run*: the sprint's own steps
//! ([`sprint_run`]) over a copy of the state and of the return stack,
//! with the trace cut after the key's bytes. What the cut trace lets the
//! steps do is what the whole trace lets them do, up to where they stop
//! for want of bytes, except at its very end: a TNT packet whose next
//! packet is cut off reads as the trace's last. So the leap ends at the
//! last station whose packet, and the first byte after it that is not a
//! PAD, are both before the cut ([`lands`]): every byte read on the way
//! there was the trace's own. The dry run's state there is this run's
//! state (taken as it is); what it counted and where it went, relative
//! to where it started, is the leap.
//!
//! What else the steps read is made the same for every run that takes
//! a leap, or not read: the return stack's entries from before the leap
//! are read only by compressed returns to calls made before it, and the
//! addresses those went to are kept with the leap, which is only taken
//! where the stack holds the same ([`LeapTo::guards_hold`]). (The dry
//! runs stopped before such a return until stop 39: half of `gzip`'s
//! stations then led nowhere, returning from the function they were in
//! within a few bits, and `sort` recorded once took 20% more
//! instructions.) The dry run has room for every step, and a leap is taken only
//! where the sink has the room it took (every room check asks for what
//! its step takes); the trace's end (`until`) is past the key's bytes;
//! the instructions since the trace was last asked are far below the
//! endless-loop limit (the first step reads a packet, which starts them
//! over). A leap is checked against its own dry run before it is kept:
//! taken from the state the dry run started from, it must land exactly
//! where the dry run did.

use super::sprint::{SprintHooks, sprint_run};
use super::{Counts, Spot};
use crate::event::{skip_pads, tnt8};
use crate::insn::blockcache::{BlockCache, StackOp};
use crate::insn::decoder::fast::{RunSink, replay_ops};
use crate::insn::decoder::{InsnDecoder, MAX_UNTRACED_INSNS};
use crate::insn::leapmemo::{LEAP_BYTES, Landing, LastAt, LeapKey, LeapTo};
use crate::insn::retstack::RetStack;
use hwtrace_types::{ReadMemory, TraceOffset};

/// The sink's room a dry run has: more than it can take, so no check on
/// the way fails for want of room (each check asks for the room its step
/// takes, so a leap's steps all pass with the room it took).
const DRY_ROOM: usize = usize::MAX / 4;

impl<M: ReadMemory> InsnDecoder<'_, M> {
    /// From a conditional jump with no TNT bits loaded (`s`): the sprint's
    /// steps, by leaps where they are remembered or can be recorded, else
    /// one by one (stopping at the next station a leap may start from).
    /// `s` moved past them; whether any was taken.
    #[allow(clippy::too_many_arguments, reason = "the chain's own state")]
    #[inline(never)]
    pub(super) fn sprint(
        &mut self,
        cache: &mut BlockCache,
        data: &[u8],
        until: u64,
        toggles: bool,
        counts: &mut Counts,
        out: &mut impl RunSink,
        s: &mut Spot,
    ) -> bool {
        let mut moved = false;
        loop {
            while self.leap(cache, data, until, toggles, counts, out, s) {
                moved = true;
            }
            let mut live = Live {
                stack: &mut self.retstack,
                start: s.pos,
                toggles,
                passed: 0,
            };
            let (ran, stopped) = sprint_run(cache, data, until, toggles, counts, out, s, &mut live);
            let passed = live.passed;
            cache.leaps_mut().passed(passed);
            moved |= ran;
            if !(ran && stopped) {
                return moved;
            }
        }
    }

    /// One leap from station `s`, remembered or recorded now; whether it
    /// was taken.
    #[allow(clippy::too_many_arguments, reason = "the chain's own state")]
    #[inline(always)]
    fn leap(
        &mut self,
        cache: &mut BlockCache,
        data: &[u8],
        until: u64,
        toggles: bool,
        counts: &mut Counts,
        out: &mut impl RunSink,
        s: &mut Spot,
    ) -> bool {
        let Some(key) = station_key(data, until, toggles, counts, s) else {
            return false;
        };
        let memo = cache.leap_memo();
        match memo.get(&key) {
            Some(Landing::To(to))
                if s.room >= to.room as usize && to.guards_hold(&self.retstack) =>
            {
                to.replay(&mut self.retstack);
                land(to, counts, s);
                cache.leaps_mut().took();
                true
            }
            None if memo.records() => {
                self.record_leap(cache, data, until, toggles, counts, out, s, key)
            }
            _ => false,
        }
    }

    /// A dry run from station `s` (see the module documentation): the
    /// leap it makes remembered under `key` (or that it makes none) and
    /// taken; whether one was.
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's own state, passed down to its cold path"
    )]
    #[cold]
    #[inline(never)]
    fn record_leap(
        &mut self,
        cache: &mut BlockCache,
        data: &[u8],
        until: u64,
        toggles: bool,
        counts: &mut Counts,
        out: &mut impl RunSink,
        s: &mut Spot,
        key: LeapKey,
    ) -> bool {
        let cut = s.pos as usize + LEAP_BYTES;
        let mut dry = Dry {
            stack: self.retstack.clone(),
            ops: cache.leaps_mut().take_scratch(),
            start: s.pos,
            reached: None,
        };
        // Room for every step: what the leap takes is what it needs.
        let start = Spot {
            room: DRY_ROOM,
            ..*s
        };
        let (mut k, mut at) = (*counts, start);
        sprint_run(
            cache,
            &data[..cut],
            until,
            toggles,
            &mut k,
            out,
            &mut at,
            &mut dry,
        );
        let Some((at, k, nops)) = dry.reached else {
            let memo = cache.leaps_mut();
            memo.insert(key, None);
            memo.wasted();
            memo.put_scratch(dry.ops);
            return false;
        };
        let ops = dry.ops.get(..nops).unwrap_or_default();
        // A leap that cannot be kept is taken this once, and the station
        // remembered as one to go on from step by step.
        let to = leap_between(counts, &start, &k, &at, ops, &self.retstack);
        let kept = to.filter(|to| landed(to, counts, &start) == (k, at));
        debug_assert_eq!(kept, to, "a leap lands where its dry run did");
        cache.leaps_mut().insert(key, kept);
        let taken = s.room.checked_sub(DRY_ROOM - at.room).map(|room| {
            replay_ops(&mut self.retstack, ops);
            (*counts, *s) = (k, Spot { room, ..at });
        });
        cache.leaps_mut().put_scratch(dry.ops);
        taken.is_some()
    }
}

/// The key of a leap from station `s`, if one may start there: the sink's
/// counts are the chain's already, the endless-loop count is far from its
/// limit, the key's bytes are in the trace and before `until`, and the
/// next packet is a TNT-8 one. Whether the chain reads disable/enable
/// pairs (`toggles`) is part of the key: the sprint passes them over then.
#[inline(always)]
fn station_key(
    data: &[u8],
    until: u64,
    toggles: bool,
    counts: &Counts,
    s: &Spot,
) -> Option<LeapKey> {
    let pos = usize::try_from(s.pos).ok()?;
    if counts.counted.is_none()
        || s.icount > MAX_UNTRACED_INSNS / 2
        || s.pos + LEAP_BYTES as u64 >= until
    {
        return None;
    }
    tnt8(*data.get(pos)?)?;
    LeapKey::at(data, pos, s.idx, s.last_ip, toggles)
}

/// Whether a leap may end at a station at trace position `pos` of the
/// cut trace `data`: its TNT-8 packet and the next byte that is not a PAD
/// are both there.
fn lands(data: &[u8], pos: u64) -> bool {
    data.get(pos as usize).and_then(|&b| tnt8(b)).is_some()
        && (skip_pads(data, pos + 1) as usize) < data.len()
}

/// The counts with the block pending before a leap counted, as its
/// first step counts it.
fn flushed(counts: &Counts) -> Counts {
    let mut k = *counts;
    flush(&mut k);
    k
}

/// Counts the block pending before a leap, as its first step does.
#[inline(always)]
fn flush(k: &mut Counts) {
    if let (Some(c), Some((_, insns, offset))) = (k.counted.as_mut(), k.pending.take()) {
        c.count_run(u64::from(insns), offset);
    }
}

/// The leap from station `s` with counts `counts` and return stack
/// `stack` to station `at` with counts `k` and return stack operations
/// `ops`, if it can be told relative to its start and kept.
fn leap_between(
    counts: &Counts,
    s: &Spot,
    k: &Counts,
    at: &Spot,
    ops: &[StackOp],
    stack: &RetStack,
) -> Option<LeapTo> {
    let before = flushed(counts).counted?;
    let after = k.counted?;
    let rel = |offset: u64| u32::try_from(offset.checked_sub(s.pos)?).ok();
    let last_at = if after.last_at.0 > s.pos {
        LastAt::Within {
            at: rel(after.last_at.0)?,
            insns: after.last_insns,
        }
    } else if after.last_at == before.end {
        let had = if before.last_at == before.end {
            before.last_insns
        } else {
            0
        };
        LastAt::Before {
            insns: after.last_insns.checked_sub(had)?,
        }
    } else {
        return None;
    };
    let pending = match k.pending {
        Some((idx, insns, offset)) => Some((idx, insns, rel(offset.0)?)),
        None => None,
    };
    LeapTo::new(
        (rel(at.pos)?, rel(at.offset)?),
        (at.bits, at.left, u32::try_from(at.icount).ok()?, at.last_ip),
        (
            at.last,
            at.idx,
            u32::try_from(s.room.checked_sub(at.room)?).ok()?,
        ),
        (
            u32::try_from(after.runs.checked_sub(before.runs)?).ok()?,
            after.insns.checked_sub(before.insns)?,
            last_at,
            rel(after.end.0)?,
        ),
        pending,
        u32::try_from(k.events.checked_sub(counts.events)?).ok()?,
        (ops, stack),
    )
}

/// Where leap `to` from station `s` with counts `counts` lands, and the
/// counts there.
fn landed(to: &LeapTo, counts: &Counts, s: &Spot) -> (Counts, Spot) {
    let (mut k, mut at) = (*counts, *s);
    land(to, &mut k, &mut at);
    (k, at)
}

/// Takes leap `to` from station `s` with counts `counts`: both moved to
/// where it lands, in place (a leap is taken ~4,500 times every 185 KB of
/// the real traces, and building the two and copying them over took 27
/// instructions of each).
#[inline(always)]
fn land(to: &LeapTo, counts: &mut Counts, s: &mut Spot) {
    let base = s.pos;
    flush(counts);
    if let Some(c) = counts.counted.as_mut() {
        c.runs += to.runs as usize;
        c.insns += to.insns;
        match to.last_at {
            LastAt::Within { at, insns } => {
                (c.last_at, c.last_insns) = (TraceOffset(base + u64::from(at)), insns);
            }
            LastAt::Before { insns } => {
                if c.last_at != c.end {
                    (c.last_at, c.last_insns) = (c.end, 0);
                }
                c.last_insns += insns;
            }
        }
        c.end = TraceOffset(base + u64::from(to.end));
    }
    counts.events += u64::from(to.events);
    counts.pending = to
        .pending
        .map(|(idx, insns, at)| (idx, insns, TraceOffset(base + u64::from(at))));
    *s = Spot {
        pos: base + u64::from(to.pos),
        bits: to.bits,
        left: to.left,
        last_ip: to.last_ip,
        offset: base + u64::from(to.offset),
        icount: u64::from(to.icount),
        last: to.last,
        idx: to.idx,
        room: s.room - to.room as usize,
    };
}

/// The hooks of a sprint on the decoder's own state: it stops at a
/// station past its start where a leap is remembered (with room for it)
/// or not tried yet (while leaps are recorded).
struct Live<'s> {
    stack: &'s mut RetStack,
    start: u64,
    toggles: bool,
    /// Stations with no leap kept passed.
    passed: u32,
}

impl SprintHooks for Live<'_> {
    #[inline(always)]
    fn peek(&self) -> Option<u64> {
        self.stack.peek()
    }

    #[inline(always)]
    fn pop(&mut self) {
        self.stack.pop();
    }

    #[inline(always)]
    fn push(&mut self, ip: u64) {
        self.stack.push(ip);
    }

    #[inline(always)]
    fn replay(&mut self, ops: &[StackOp]) {
        replay_ops(self.stack, ops);
    }

    #[inline(always)]
    fn station(
        &mut self,
        cache: &BlockCache,
        data: &[u8],
        until: u64,
        s: &Spot,
        counts: &Counts,
    ) -> bool {
        if s.pos == self.start {
            return false;
        }
        let memo = cache.leap_memo();
        // Not recording, only a kept leap stops the steps: most stations
        // have none, told by the filter.
        if !memo.records()
            && !data
                .get(s.pos as usize..)
                .and_then(|d| d.first_chunk::<8>())
                .is_some_and(|w| memo.may_start(s.idx, u64::from_le_bytes(*w)))
        {
            self.passed = self.passed.saturating_add(1);
            return false;
        }
        let Some(key) = station_key(data, until, self.toggles, counts, s) else {
            return false;
        };
        match memo.get(&key) {
            None if memo.records() => true,
            None => {
                self.passed = self.passed.saturating_add(1);
                false
            }
            Some(Landing::To(to)) => s.room >= to.room as usize && to.guards_hold(self.stack),
            Some(Landing::Nowhere) => false,
        }
    }
}

/// The hooks of a dry run: a copy of the return stack, the operations on
/// it in order (what its pops of entries from before the run went to is
/// read off the stack it started from, [`LeapTo::new`]), and the last
/// station a leap may end at.
struct Dry {
    stack: RetStack,
    ops: Vec<StackOp>,
    start: u64,
    /// The last station reached, its counts and how many operations came
    /// before it.
    reached: Option<(Spot, Counts, usize)>,
}

impl SprintHooks for Dry {
    fn peek(&self) -> Option<u64> {
        self.stack.peek()
    }

    fn pop(&mut self) {
        self.stack.pop();
        self.ops.push(StackOp::Pop);
    }

    fn push(&mut self, ip: u64) {
        self.stack.push(ip);
        self.ops.push(StackOp::Push(ip));
    }

    fn replay(&mut self, ops: &[StackOp]) {
        replay_ops(&mut self.stack, ops);
        self.ops.extend_from_slice(ops);
    }

    fn station(&mut self, _: &BlockCache, data: &[u8], _: u64, s: &Spot, counts: &Counts) -> bool {
        if s.pos != self.start && lands(data, s.pos) {
            self.reached = Some((*s, *counts, self.ops.len()));
        }
        false
    }
}
