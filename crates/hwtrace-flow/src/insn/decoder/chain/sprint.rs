//! A sprint: a counting chain's steps from TNT-8 packet to TNT-8 packet,
//! in a loop of their own.
//!
//! On a compression loop (gzip's, Unzip's) most of a trace is TNT-8
//! packets one after the other, each choosing a whole recorded path from
//! one conditional jump to the next; elsewhere the paths are a return or
//! an indirect branch apart. The chain's steps' loop takes each packet
//! through everything a step may be (the block's flow, the bits left, a
//! hashed path lookup with its key compared). A sprint starts at a
//! conditional jump whose packet's path is in the block's table
//! ([`BlockCache::tnt_path`], by the packet's byte), goes straight on
//! when the path says the next packet's starts where it ends
//! ([`TntPath::sprints_on`]), and else takes the steps between as the
//! steps' loop does (a compressed return, a return or an indirect branch
//! to a TIP's IP, a direct jump or call) until the next path. Each step
//! is the steps' loop's own, with the same outcome; anything else (a
//! path only in the hashed slots, a disable/enable pair, a miss) ends
//! the sprint before the step, for the steps' loop. Within a sprint, the
//! commonest run of steps, TNT-8 packets one right after another each
//! choosing a path that goes straight on, is a loop of its own
//! ([`straight`]) that adds their counts up and counts them once; eight
//! such packets it has taken before from the same block, with the same
//! bytes, are one lookup ([`OctetMemo`]).
//!
//! The steps between paths are written out here as in the steps' loop:
//! shared through helper functions, both loops' code moved (callgrind:
//! 3-7% more instructions on every benchmark trace).
//!
//! The steps ([`sprint_steps`]) go through [`SprintHooks`] for the return
//! stack and at each *station* (a conditional jump with no TNT bits
//! loaded, where the next packet is read): on the decoder's own stack,
//! stopping where a [leap](super::leap) may take over, or on a copy, for
//! the dry run that records one.

use super::toggle::{MAX_PAIRS_IN_A_ROW, PairsInARow, count_pass, pairs_in_a_row};
use super::{Counts, Spot, after_path, taken_bit};
use crate::event::{
    TIP_PGD, TogglePair, lane_reads, plain_offset, skip_pads, tip_ip, tnt8, toggle_pair_at,
};
use crate::insn::blockcache::{
    BlockCache, BlockFlow, NO_BLOCK, PathTables, StackOp, TntPath, tnt_key,
};
use crate::insn::decoder::MAX_UNTRACED_INSNS;
use crate::insn::decoder::fast::{RunSink, replay_ops};
use crate::insn::octets::{OCTET, Octet, OctetMemo, octet_at};
use crate::insn::pairmemo::{PairKey, PairPass};
use crate::insn::retstack::RetStack;
use hwtrace_types::TraceOffset;

/// A sprint's step from block `idx` at trace position `pos`: the path
/// the TNT-8 packet there takes from the block's table, the position
/// after the packet and the offset the lane then reports; `None` where
/// the steps' loop must take it.
#[inline(always)]
fn sprint_step<'c>(
    cache: &'c BlockCache,
    data: &[u8],
    until: u64,
    pos: u64,
    idx: u32,
    room: usize,
) -> Option<(&'c TntPath, u64, u64)> {
    let b = *data.get(pos as usize)?;
    tnt8(b)?;
    let after = skip_pads(data, pos + 1);
    let o = plain_offset(data, after)?;
    let p = cache.tnt_path(idx, usize::from(b >> 1))?;
    if room < p.runs as usize || o >= until {
        return None;
    }
    Some((p, after, o))
}

/// The trace from `pos` up to `until` (packets reporting an offset at or
/// past it are not taken: the trace cut there, one bound for both).
#[inline(always)]
fn ahead(data: &[u8], until: u64, pos: u64) -> &[u8] {
    let end = data.len().min(usize::try_from(until).unwrap_or(usize::MAX));
    data.get(..end)
        .and_then(|d| d.get(usize::try_from(pos).ok()?..))
        .unwrap_or(&[])
}

/// A stretch of straight paths ([`straight`]).
#[derive(Clone, Copy)]
struct Stretch {
    /// How many packets (bytes) it takes, and the block the path of the
    /// one after starts from.
    taken: u64,
    idx: u32,
    /// The room for runs left (the stretch's runs: the room it took).
    room: usize,
    /// The instructions of all its paths.
    insns: u64,
    /// Its last path's last block, and that path's instructions after its
    /// first run (executed after the last packet, which reports the trace
    /// offset after `pos`).
    last: u32,
    rest: u64,
}

/// The path a straight run takes from block `idx` with the TNT-8 packet
/// `b` (its next packet a TNT-8 one and the lane reading the one after,
/// as the caller knows), its stack operations replayed; `None` where the
/// run stops.
#[inline(always)]
fn straight_path<'c>(
    tables: PathTables<'c>,
    stack: &mut impl SprintHooks,
    idx: u32,
    b: u8,
    room: usize,
) -> Option<&'c TntPath> {
    let p = tables.path(idx, usize::from(b >> 1))?;
    if !p.sprints_on || p.insns <= u64::from(p.first_insns) || room < p.runs as usize {
        return None;
    }
    if p.ops != 0 {
        replay_path_ops(stack, tables, p);
    }
    Some(p)
}

/// From block `idx` (a conditional jump, no TNT bits loaded) and the
/// packet at the start of `from` (the trace from there up to where it is
/// cut): the paths of TNT-8 packets right after one another,
/// for as long as each is in its block's table, ends where the next one
/// starts ([`TntPath::sprints_on`]) and has instructions after its first
/// run, and the packet after the next is no PAD (the offset each reports
/// is then the byte after the next packet, as [`plain_offset`] has it);
/// `None` if not even one.
///
/// Five in six of gzip's TNT-8 packets are such a step. Taken with only
/// what they need in registers, the counts added up for
/// [`Counted::count_stretch`](crate::insn::tally::Counted::count_stretch)
/// instead of counted path by path, one is ~55 instructions where
/// [`sprint_step`] and the counting after it took ~90 (callgrind, gzip).
/// Eight packets at a time go by the [`OctetMemo`] where it has them,
/// and are put there when they are eight such paths with no stack
/// operations.
#[inline(always)]
fn straight(
    tables: PathTables<'_>,
    octets: &mut OctetMemo,
    stack: &mut impl SprintHooks,
    from: &[u8],
    idx: u32,
    room: usize,
) -> Option<Stretch> {
    tnt8(*from.first()?)?;
    let mut w = Walk {
        at: 0,
        idx,
        room,
        insns: 0,
        last: NO_BLOCK,
        rest: 0,
    };
    'walk: {
        // Eight packets at a time while eight more follow.
        while let Some(bytes) = octet_at(from, w.at) {
            if let Some(o) = octets.get(w.idx, bytes)
                && w.room >= o.runs as usize
            {
                w.take_octet(o);
            } else if !w.take_eight(tables, octets, stack, bytes) {
                break 'walk;
            }
        }
        // The rest packet by packet. Each window: a TNT-8 packet's byte,
        // the next packet's, the one after.
        for win in from.get(w.at..).unwrap_or(&[]).windows(3) {
            let (b, next, after) = (win[0], win[1], win[2]);
            if tnt8(next).is_none() || !lane_reads(after) {
                break;
            }
            let Some(p) = straight_path(tables, stack, w.idx, b, w.room) else {
                break;
            };
            w.take(p);
        }
    }
    (w.at > 0).then_some(Stretch {
        taken: w.at as u64,
        idx: w.idx,
        room: w.room,
        insns: w.insns,
        last: w.last,
        rest: w.rest,
    })
}

/// Where [`straight`] is: the packets taken and what they add up to.
struct Walk {
    /// How many packets.
    at: usize,
    /// The block the next one's path starts from, and the room left.
    idx: u32,
    room: usize,
    /// The instructions of their paths; the last one's last block and
    /// instructions after its first run.
    insns: u64,
    last: u32,
    rest: u64,
}

impl Walk {
    /// Takes path `p` (one packet).
    #[inline(always)]
    fn take(&mut self, p: &TntPath) {
        self.insns += p.insns;
        self.room -= p.runs as usize;
        self.idx = p.next;
        (self.last, self.rest) = (p.last, p.insns - u64::from(p.first_insns));
        self.at += 1;
    }

    /// Takes eight packets remembered together.
    #[inline(always)]
    fn take_octet(&mut self, o: &Octet) {
        self.insns += u64::from(o.insns);
        self.room -= o.runs as usize;
        self.idx = o.next;
        (self.last, self.rest) = (o.last, u64::from(o.rest));
        self.at += OCTET;
    }

    /// Takes the eight packets `bytes` path by path, as many as go
    /// straight on, and remembers them together when all eight do with
    /// no stack operations; whether all did. Out of line: the lookups
    /// that find the eight remembered are the common case.
    #[inline(never)]
    fn take_eight(
        &mut self,
        tables: PathTables<'_>,
        octets: &mut OctetMemo,
        stack: &mut impl SprintHooks,
        bytes: u64,
    ) -> bool {
        let (start, room, insns) = (self.idx, self.room, self.insns);
        let mut plain = true;
        for &b in &bytes.to_le_bytes()[..OCTET] {
            let Some(p) = straight_path(tables, stack, self.idx, b, self.room) else {
                return false;
            };
            plain &= p.ops == 0;
            self.take(p);
        }
        if let (true, Ok(runs), Ok(insns), Ok(rest)) = (
            plain,
            u32::try_from(room - self.room),
            u32::try_from(self.insns - insns),
            u32::try_from(self.rest),
        ) {
            octets.put(Octet {
                bytes,
                start,
                next: self.idx,
                last: self.last,
                runs,
                insns,
                rest,
            });
        }
        true
    }
}

/// A path's return stack operations for [`straight`], out of its loop:
/// about one of gzip's paths in twenty has operations, and the loop keeps
/// more of its locals in registers without them.
#[cold]
#[inline(never)]
fn replay_path_ops(stack: &mut impl SprintHooks, tables: PathTables<'_>, p: &TntPath) {
    stack.replay(tables.ops(p));
}

/// What a sprint's steps do to the return stack, and whether they stop at
/// a station (a conditional jump with no TNT bits loaded, the next packet
/// to be read there): the decoder's own stack as it runs, or a copy for a
/// dry run that records a [leap](super::leap).
pub(super) trait SprintHooks {
    /// The return address a compressed return goes to (`None`: the step
    /// is not taken).
    fn peek(&self) -> Option<u64>;
    /// That address, popped.
    fn pop(&mut self);
    /// A call's return address.
    fn push(&mut self, ip: u64);
    /// A path's operations.
    fn replay(&mut self, ops: &[StackOp]);
    /// At a station after the first step, with the chain's locals `s` and
    /// counts `counted` and `pending`: whether the sprint stops there.
    fn station(
        &mut self,
        cache: &BlockCache,
        data: &[u8],
        until: u64,
        s: &Spot,
        counts: &Counts,
    ) -> bool;
}

/// Why a sprint's steps ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    /// A step they do not take (for the chain's steps' loop).
    Done,
    /// The hooks stopped them at a station.
    Station,
    /// At a station, a TNT-8 packet with a disable/enable pair after it,
    /// which [`pass_pair`] may pass over.
    Pair,
}

/// The steps of a sprint from `s` (see the module documentation): runs of
/// [`sprint_steps`] with the disable/enable pairs between them passed over
/// as the chain would replay them from its memo ([`pass_pair`]), if it
/// reads pairs (`toggles`). `s` moved past them; whether any was taken,
/// and whether the hooks stopped them at a station.
#[allow(clippy::too_many_arguments, reason = "the chain's own state")]
#[inline(always)]
pub(super) fn sprint_run(
    cache: &mut BlockCache,
    data: &[u8],
    until: u64,
    toggles: bool,
    counts: &mut Counts,
    out: &mut impl RunSink,
    s: &mut Spot,
    hooks: &mut impl SprintHooks,
) -> (bool, bool) {
    let (mut moved, mut from_blocks) = (false, false);
    loop {
        let (ran, end) = sprint_steps(
            cache,
            data,
            until,
            toggles,
            from_blocks,
            counts,
            out,
            s,
            hooks,
        );
        moved |= ran;
        match end {
            End::Pair if pass_pair(cache, data, until, counts, out, s, hooks) => {
                (moved, from_blocks) = (true, true);
            }
            End::Station => return (moved, true),
            End::Pair | End::Done => return (moved, false),
        }
    }
}

/// Whether a station at trace position `pos` has a TNT-8 packet with a
/// TIP.PGD right after it (PADs aside), for a chain that reads pairs.
#[inline(always)]
fn pair_next(data: &[u8], pos: u64, toggles: bool) -> End {
    let pair = toggles
        && data.get(pos as usize).and_then(|&b| tnt8(b)).is_some()
        && data
            .get(skip_pads(data, pos + 1) as usize)
            .is_some_and(|&b| b & 0x1f == TIP_PGD);
    if pair { End::Pair } else { End::Done }
}

/// At station `s` whose TNT-8 packet a disable/enable pair follows: the
/// pass over the pair the chain would replay from its memo, taken as the
/// chain's `replay_pass` takes it (it loads the packet's bits with the
/// pair as the look-ahead, and
/// [`pass_toggle`](crate::insn::decoder::InsnDecoder::pass_toggle) finds
/// the pass remembered for the block, the bits and the pair's IPs, for
/// this room and these instructions since the trace was asked, with a
/// plain packet after the pair): the runs to the branch the disable binds
/// to, all taken at the enable's offset, and the two events. Whether it
/// was; `s` is then at the block at the enable's IP. Out of the steps'
/// loop: one packet in twelve of the real fuzzing traces.
#[allow(clippy::too_many_arguments, reason = "the chain's own state")]
#[inline(never)]
fn pass_pair(
    cache: &BlockCache,
    data: &[u8],
    until: u64,
    counts: &mut Counts,
    out: &mut impl RunSink,
    s: &mut Spot,
    hooks: &mut impl SprintHooks,
) -> bool {
    let Some((bits, left)) = data.get(s.pos as usize).and_then(|&b| tnt8(b)) else {
        return false;
    };
    let Some(pair) = toggle_pair_at(data, skip_pads(data, s.pos + 1), s.last_ip) else {
        return false;
    };
    if pair.on_at >= until {
        return false;
    }
    let key = PairKey {
        idx: s.idx,
        left,
        bits,
        off: pair.off,
        on: pair.on,
    };
    let Some(pass) = cache.pairs().get(&key) else {
        return false;
    };
    if s.room < pass.room || s.icount > pass.icount_max {
        return false;
    }
    pass_pairs(cache, data, until, counts, out, s, hooks, (pass, pair))
}

/// `first`, a pass [`pass_pair`] found, and the pairs right after its
/// pair, if any: passed over as the chain's `pass_pairs` passes them,
/// when every pass after the first is remembered (the chain planned them
/// the first time) and a plain packet follows the last.
#[allow(clippy::too_many_arguments, reason = "the chain's own state")]
#[inline(always)]
fn pass_pairs(
    cache: &BlockCache,
    data: &[u8],
    until: u64,
    counts: &mut Counts,
    out: &mut impl RunSink,
    s: &mut Spot,
    hooks: &mut impl SprintHooks,
    first: (PairPass, TogglePair),
) -> bool {
    let mut passes: PairsInARow = [None; MAX_PAIRS_IN_A_ROW];
    let Some(n) = pairs_in_a_row(data, until, s.room, first, &mut passes, |key, _| {
        cache.pairs().get(&key)
    }) else {
        return false;
    };
    for &(pass, pair, pos, offset) in passes[..n].iter().flatten() {
        hooks.replay(cache.pairs().ops(&pass));
        count_pass(counts, out, s, &pass, &pair, (pos, offset));
    }
    true
}

/// The steps of a sprint (see the module documentation) from `s`, a
/// conditional jump with no TNT bits loaded (or, `from_blocks`, the block
/// after a pair [`pass_pair`] passed over), for as long as they come or
/// until `hooks` stops them at a station; `s` moved past them. Whether any
/// was taken, and why they ended.
///
/// Out of line: it takes most of the steps of a counted trace, and the
/// two loops keep their locals in registers better apart (inlined,
/// 1% more instructions on the benchmark traces).
#[allow(clippy::too_many_arguments, reason = "the chain's own state")]
#[inline(never)]
fn sprint_steps(
    cache: &mut BlockCache,
    data: &[u8],
    until: u64,
    toggles: bool,
    from_blocks: bool,
    counts: &mut Counts,
    out: &mut impl RunSink,
    s: &mut Spot,
    hooks: &mut impl SprintHooks,
) -> (bool, End) {
    let first = if from_blocks {
        None
    } else {
        match sprint_step(cache, data, until, s.pos, s.idx, s.room)
            .filter(|(p, ..)| s.icount + p.insns <= MAX_UNTRACED_INSNS)
        {
            Some(step) => Some(step),
            None => return (false, pair_next(data, s.pos, toggles)),
        }
    };
    // The counts in a local, written back once.
    let mut k = *counts;
    // Nothing in the steps passes events over ([`pass_pair`] does).
    let events = k.events;
    let (mut last_ip, mut icount, mut room) = (s.last_ip, s.icount, s.room);
    let (mut pos, mut bits, mut left, mut offset, mut last, mut idx) =
        (s.pos, s.bits, s.left, s.offset, s.last, s.idx);
    let mut end = End::Done;
    let mut step = first;
    // The locals as a `Spot`: at a station for the hooks, and at the end.
    macro_rules! here {
        () => {
            Spot {
                pos,
                bits,
                left,
                last_ip,
                offset,
                icount,
                last,
                idx,
                room,
            }
        };
    }
    macro_rules! at_station {
        ($counts:expr) => {
            hooks.station(cache, data, until, &here!(), $counts)
        };
    }
    'paths: loop {
        'blocks: {
            // Paths one after the other: counted with the counts taken
            // once (the pending block counted), nothing else between.
            let c = k.before_run(out);
            // After a pair [`pass_pair`] passed over: straight to the blocks.
            let Some(mut next) = step.take() else {
                break 'blocks;
            };
            let p = loop {
                let (p, after, o) = next;
                if p.ops != 0 {
                    hooks.replay(cache.path_ops(p));
                }
                c.count_path(p, TraceOffset(o));
                room -= p.runs as usize;
                (pos, offset) = (after, o);
                (last, idx) = (p.last, p.next);
                if !p.sprints_on {
                    break p;
                }
                // A whole path, as `after_path` has it; the next one
                // starts with no instructions since the trace was asked,
                // so it is far below the endless-loop limit (a path holds
                // at most `MAX_PATH_LEN` blocks of `MAX_CACHED_BLOCK_INSNS`).
                (bits, left, icount) = (0, 0, 0);
                let (tables, octets) = cache.tables_and_octets();
                if let Some(st) =
                    straight(tables, octets, hooks, ahead(data, until, pos), idx, room)
                {
                    pos += st.taken;
                    offset = pos + 1;
                    c.count_stretch(room - st.room, st.insns, st.rest, TraceOffset(offset));
                    (last, idx, room) = (st.last, st.idx, st.room);
                }
                let here = Counts {
                    counted: Some(*c),
                    pending: None,
                    events,
                };
                if at_station!(&here) {
                    end = End::Station;
                    break 'paths;
                }
                match sprint_step(cache, data, until, pos, idx, room) {
                    Some(n) => next = n,
                    None => {
                        end = pair_next(data, pos, toggles);
                        break 'paths;
                    }
                }
            };
            (bits, left, icount) = after_path(p, p.bits, p.left, icount);
        }
        // The blocks to the next path, each as the steps' loop runs it.
        loop {
            let Some(b) = cache.get(idx) else {
                break 'paths;
            };
            let (flow, n) = (b.flow, b.insns);
            if room == 0 || icount + u64::from(n) > MAX_UNTRACED_INSNS {
                break 'paths;
            }
            let to = match flow {
                BlockFlow::CondJump if left == 0 => {
                    if at_station!(&k) {
                        end = End::Station;
                        break 'paths;
                    }
                    match sprint_step(cache, data, until, pos, idx, room) {
                        Some(n) => {
                            step = Some(n);
                            continue 'paths;
                        }
                        None => {
                            end = pair_next(data, pos, toggles);
                            break 'paths;
                        }
                    }
                }
                BlockFlow::CondJump | BlockFlow::Jump | BlockFlow::Straight | BlockFlow::Call
                    if left > 0 =>
                {
                    match cache
                        .tnt_path(idx, tnt_key(bits, left))
                        .filter(|p| room >= p.runs as usize && offset < until)
                    {
                        Some(p) => {
                            step = Some((p, pos, offset));
                            continue 'paths;
                        }
                        None => break 'paths,
                    }
                }
                BlockFlow::Return
                    if left > 0 || data.get(pos as usize).and_then(|&b| tnt8(b)).is_some() =>
                {
                    // A compressed return: a taken bit, to the last call.
                    let Some(to) = hooks.peek() else {
                        break 'paths;
                    };
                    let Some((np, nb, nl, no)) = taken_bit(data, pos, bits, left, offset) else {
                        break 'paths;
                    };
                    if no >= until {
                        break 'paths;
                    }
                    let Some(next) = cache.linked_or_recent(idx, to) else {
                        break 'paths;
                    };
                    hooks.pop();
                    (pos, bits, left, offset) = (np, nb, nl, no);
                    k.block(out, idx, n, offset);
                    room -= 1;
                    icount = 0;
                    (last, idx) = (idx, next);
                    continue;
                }
                BlockFlow::Return | BlockFlow::IndirectJump | BlockFlow::IndirectCall => {
                    if left > 0 {
                        break 'paths;
                    }
                    // To a TIP's IP.
                    let mut ip = last_ip;
                    let Some((to, end)) = tip_ip(data, pos, &mut ip) else {
                        break 'paths;
                    };
                    let after = skip_pads(data, end);
                    let Some(o) = plain_offset(data, after) else {
                        break 'paths;
                    };
                    if o >= until {
                        break 'paths;
                    }
                    let ret = b.end.0;
                    let Some(next) = cache.linked_or_recent(idx, to) else {
                        break 'paths;
                    };
                    if flow == BlockFlow::IndirectCall {
                        hooks.push(ret);
                    }
                    (pos, last_ip, offset) = (after, ip, o);
                    k.block(out, idx, n, offset);
                    room -= 1;
                    icount = 0;
                    (last, idx) = (idx, next);
                    continue;
                }
                BlockFlow::Jump | BlockFlow::Call => b.target,
                BlockFlow::Straight => b.end.0,
                BlockFlow::CondJump | BlockFlow::Slow => break 'paths,
            };
            // A direct jump, a call or straight code: nothing read.
            if offset >= until {
                break 'paths;
            }
            // A call to the next instruction (PIC) pushes nothing.
            let ret = (flow == BlockFlow::Call && b.target != b.end.0).then_some(b.end.0);
            let Some(next) = cache.linked_or_recent(idx, to) else {
                break 'paths;
            };
            if let Some(ret) = ret {
                hooks.push(ret);
            }
            k.block(out, idx, n, offset);
            room -= 1;
            icount += u64::from(n);
            (last, idx) = (idx, next);
        }
    }
    // Every step takes room.
    let ran = room != s.room;
    *counts = k;
    *s = here!();
    (ran, end)
}

impl SprintHooks for RetStack {
    #[inline(always)]
    fn peek(&self) -> Option<u64> {
        RetStack::peek(self)
    }

    #[inline(always)]
    fn pop(&mut self) {
        RetStack::pop(self);
    }

    #[inline(always)]
    fn push(&mut self, ip: u64) {
        RetStack::push(self, ip);
    }

    #[inline(always)]
    fn replay(&mut self, ops: &[StackOp]) {
        replay_ops(self, ops);
    }

    #[inline(always)]
    fn station(&mut self, _: &BlockCache, _: &[u8], _: u64, _: &Spot, _: &Counts) -> bool {
        false
    }
}
