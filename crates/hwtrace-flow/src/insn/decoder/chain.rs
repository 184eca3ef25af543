//! A counting chain: a burst's commonest steps, for a sink that only
//! counts runs, with the trace position, the TNT bits, the last IP and the
//! counts in locals.
//!
//! Between events a counted trace is mostly a TNT-8 packet choosing a
//! recorded TNT path, and a TIP answering a return or an indirect branch.
//! [`InsnDecoder::run_burst`] takes each through the trace lane (which
//! mirrors the layered path's look-ahead in an enum), the block cache and
//! the sink's bookkeeping; a chain takes them straight from the trace
//! bytes for as long as they come, and hands everything back as the burst
//! would have left it.
//!
//! A step is only taken when it is certain to be the one the burst would
//! take, with the same outcome: the block runs plainly and every answer it
//! gets leaves a TNT-8 packet or a TIP with an IP as the look-ahead
//! ([`plain_offset`]), so no status carries news. Anything else (a packet the
//! chain does not read, a path not recorded, a successor not
//! linked, a block that needs the instruction decoder, the sink's room or
//! offset limit) ends the chain before the step, for the burst to take.
//! So a burst's runs, counts, offsets and decoder state are the same with
//! or without chains.
//!
//! A TNT packet followed by a TIP.PGD/TIP.PGE pair (tracing left the
//! filtered range at a branch and came back elsewhere: ~700 per 29 KB of a
//! real fuzzing trace) is passed over by a cold step out of the loop
//! ([`InsnDecoder::pass_toggle`], in [`toggle`]), as the burst's
//! `pass_toggles` would, when every block on the way is known and the
//! packet after the pair is plain (or more pairs, passed with it); what a
//! pass does is remembered by the bits and the pair's IPs, and replayed
//! when they come again.
//!
//! Most steps are taken by a *sprint* ([`sprint`]): from a conditional
//! jump, TNT-8 packet after TNT-8 packet through the blocks' path tables.
//! The steps' loop here takes what it leaves.

use super::InsnDecoder;
use super::MAX_UNTRACED_INSNS;
use super::fast::RunSink;
use crate::event::{LaneAt, TraceLane, low_bits, plain_offset, skip_pads, tip_ip, tnt8};
use crate::insn::blockcache::{BlockCache, BlockFlow, TntPath};
use crate::insn::tally::Counted;
use hwtrace_packet::LastIp;
use hwtrace_types::{ReadMemory, TraceOffset};

mod leap;
mod sprint;
mod toggle;

use toggle::pair_at;

/// Where a burst is: the locals [`InsnDecoder::run_burst`] keeps, handed
/// to a chain and back.
#[derive(Clone, Copy, Debug)]
pub(in crate::insn) struct ChainAt {
    /// The IP.
    pub ip: u64,
    /// Instructions since the trace was last asked.
    pub icount: u64,
    /// The trace offset the next run is taken at.
    pub offset: TraceOffset,
    /// The last block run.
    pub last: u32,
    /// The block starting at `ip`.
    pub next: u32,
}

/// The chain's counts: the sink's, taken at the first step, and the last
/// block run alone, not counted yet (a burst's last run, when a single
/// block, is kept whole by the sink).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    counted: Option<Counted>,
    pending: Option<(u32, u32, TraceOffset)>,
    /// Events passed over (disable/enable pairs), after the counted runs.
    events: u64,
}

impl Counts {
    /// Block `idx` (`insns` instructions) run alone, to the trace offset
    /// `offset`: pending, the one before counted.
    #[inline(always)]
    fn block(&mut self, out: &mut impl RunSink, idx: u32, insns: u32, offset: u64) {
        self.before_run(out);
        self.pending = Some((idx, insns, TraceOffset(offset)));
    }

    /// The counts, the pending block counted, before another run.
    #[inline(always)]
    fn before_run(&mut self, out: &mut impl RunSink) -> &mut Counted {
        let c = self.counted.get_or_insert_with(|| first_counted(out));
        if let Some((_, insns, offset)) = self.pending.take() {
            c.count_run(u64::from(insns), offset);
        }
        c
    }
}

/// The sink's counts, taken at a chain's first step: once per chain, so
/// out of the steps' loop.
#[cold]
#[inline(never)]
fn first_counted(out: &mut impl RunSink) -> Counted {
    out.take_counted()
}

impl<'a, M: ReadMemory> InsnDecoder<'a, M> {
    /// Takes chain steps (see the module documentation) from `at`, for as
    /// long as they come; `at` and the lane are moved past them.
    #[inline(never)]
    pub(super) fn run_chain(
        &mut self,
        cache: &mut BlockCache,
        lane: &mut TraceLane<'a>,
        out: &mut impl RunSink,
        at: &mut ChainAt,
    ) {
        let Some((mut room, until)) = out.count_room() else {
            return;
        };
        let Some(start) = lane.chain_start() else {
            return;
        };
        let until = until.0;
        let data = lane.data();
        let toggles = lane.reads_toggles();
        let LaneAt {
            mut pos,
            mut bits,
            mut left,
            mut last_ip,
        } = start;
        let mut offset = at.offset.0;
        let (mut icount, mut last, mut idx) = (at.icount, at.last, at.next);
        let mut counts = Counts {
            counted: None,
            pending: None,
            events: 0,
        };
        // TNT bits were loaded with a disable/enable pair after them, this
        // one. The flag mirrors `pair.is_some()`: testing the Option
        // instead moves the steps' loop's register allocation (callgrind:
        // 3-9% more instructions on every trace).
        let mut pair_next = false;
        // A TIP was next with something else than a plain packet after it.
        let mut tip_pair = false;
        // The locals as a `Spot`, for the sprint and the cold steps, and
        // back.
        macro_rules! spot {
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
        macro_rules! set_spot {
            ($s:expr) => {
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
                } = $s
            };
        }
        // Where the last sprint stopped: the packet there is the steps'.
        let mut no_sprint = u64::MAX;
        let mut pair = None;
        // As a burst, nothing more once the sink is full (not even a TNT
        // packet loaded).
        loop {
            while room > 0 {
                let Some(b) = cache.get(idx) else {
                    break;
                };
                let (flow, n) = (b.flow, b.insns);
                if icount + u64::from(n) > MAX_UNTRACED_INSNS {
                    break;
                }
                // A TNT path, a block answered by the trace (a compressed
                // return's TNT bit, a TIP), or else a block that asks nothing
                // of it: where it goes.
                let to = match flow {
                    BlockFlow::CondJump
                    | BlockFlow::Jump
                    | BlockFlow::Straight
                    | BlockFlow::Call
                        if left > 0 || flow == BlockFlow::CondJump =>
                    {
                        if left == 0 {
                            if flow == BlockFlow::CondJump && pos != no_sprint {
                                let mut s = spot!();
                                let moved = self.sprint(
                                    cache,
                                    data,
                                    until,
                                    toggles,
                                    &mut counts,
                                    out,
                                    &mut s,
                                );
                                set_spot!(s);
                                no_sprint = pos;
                                if moved {
                                    continue;
                                }
                            }
                            // The block runs on the next TNT packet's first
                            // bit: loaded (as the burst would load it), its
                            // bits pick the path.
                            let Some((tb, tl)) = data.get(pos as usize).and_then(|&b| tnt8(b))
                            else {
                                break;
                            };
                            let after = skip_pads(data, pos + 1);
                            let Some(o) = plain_offset(data, after) else {
                                // A disable/enable pair after the packet, which
                                // the burst passes over (its last bit brings
                                // it): loaded, for the cold step below.
                                if let Some(o) = pair_at(lane, after, last_ip, &mut pair) {
                                    (bits, left, pos, offset) = (tb, tl, after, o);
                                    pair_next = true;
                                }
                                break;
                            };
                            (bits, left, pos, offset) = (tb, tl, after, o);
                        }
                        let Some(p) = cache.path_record(idx, bits, left) else {
                            break;
                        };
                        let runs = p.runs as usize;
                        if room < runs || offset >= until || icount + p.insns > MAX_UNTRACED_INSNS {
                            break;
                        }
                        self.replay_stack_ops(cache, p);
                        counts.before_run(out).count_path(p, TraceOffset(offset));
                        room -= runs;
                        (bits, left, icount) = after_path(p, bits, left, icount);
                        (last, idx) = (p.last, p.next);
                        continue;
                    }
                    BlockFlow::Jump | BlockFlow::Call => b.target,
                    BlockFlow::Straight => b.end.0,
                    BlockFlow::Return
                        if left > 0 || data.get(pos as usize).and_then(|&b| tnt8(b)).is_some() =>
                    {
                        // A compressed return: a taken bit, to the last call.
                        let Some(to) = self.retstack.peek() else {
                            break;
                        };
                        let Some((np, nb, nl, no)) = taken_bit(data, pos, bits, left, offset)
                        else {
                            break;
                        };
                        if no >= until {
                            break;
                        }
                        let Some(next) = cache.linked_or_recent(idx, to) else {
                            break;
                        };
                        self.retstack.pop();
                        (pos, bits, left, offset) = (np, nb, nl, no);
                        counts.block(out, idx, n, offset);
                        room -= 1;
                        icount = 0;
                        (last, idx) = (idx, next);
                        continue;
                    }
                    BlockFlow::Return | BlockFlow::IndirectJump | BlockFlow::IndirectCall => {
                        if left > 0 {
                            break;
                        }
                        let mut ip = last_ip;
                        let Some((to, end)) = tip_ip(data, pos, &mut ip) else {
                            break;
                        };
                        let after = skip_pads(data, end);
                        let Some(o) = plain_offset(data, after) else {
                            // Perhaps a disable/enable pair after the
                            // TIP: tried out of the loop.
                            tip_pair = true;
                            break;
                        };
                        if o >= until {
                            break;
                        }
                        let ret = b.end.0;
                        let Some(next) = cache.linked_or_recent(idx, to) else {
                            break;
                        };
                        if flow == BlockFlow::IndirectCall {
                            self.retstack.push(ret);
                        }
                        (pos, last_ip, offset) = (after, ip, o);
                        counts.block(out, idx, n, offset);
                        room -= 1;
                        icount = 0;
                        (last, idx) = (idx, next);
                        continue;
                    }
                    BlockFlow::CondJump | BlockFlow::Slow => break,
                };
                // A direct jump, a call or straight code: nothing read.
                if offset >= until {
                    break;
                }
                // A call to the next instruction (PIC) pushes nothing.
                let ret = (flow == BlockFlow::Call && b.target != b.end.0).then_some(b.end.0);
                let Some(next) = cache.linked_or_recent(idx, to) else {
                    break;
                };
                if let Some(ret) = ret {
                    self.retstack.push(ret);
                }
                counts.block(out, idx, n, offset);
                room -= 1;
                icount += u64::from(n);
                (last, idx) = (idx, next);
            }
            // Out of the steps' loop, whose locals stay in registers better
            // without them.
            let (s, c, passed) = if let (true, Some(pair)) = (pair_next, pair.take()) {
                pair_next = false;
                self.pass_toggle(cache, out, counts, data, until, spot!(), pair)
            } else if tip_pair {
                tip_pair = false;
                self.pass_tip_toggle(cache, lane, out, counts, until, spot!())
            } else {
                break;
            };
            counts = c;
            set_spot!(s);
            if !passed {
                break;
            }
        }
        if let Some(c) = counts.counted {
            out.put_counted(c, counts.events);
        }
        if let Some((i, _, offset)) = counts.pending
            && let Some(b) = cache.get(i)
        {
            out.push(b, offset);
        }
        let l = LaneAt {
            pos,
            bits,
            left,
            last_ip,
        };
        if l != start {
            lane.chain_resume(&mut self.query, l);
        }
        if idx != at.next
            && let Some(b) = cache.get(idx)
        {
            // Every step ends at the start of the next block.
            at.ip = b.ip.0;
        }
        *at = ChainAt {
            offset: TraceOffset(offset),
            icount,
            last,
            next: idx,
            ..*at
        };
    }
}

/// A chain's locals, handed to and back from its cold steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Spot {
    pos: u64,
    bits: u64,
    left: u8,
    last_ip: LastIp,
    offset: u64,
    icount: u64,
    last: u32,
    idx: u32,
    room: usize,
}

/// After path `p`, taken with TNT bits `bits` (`left` of them) and
/// `icount` instructions since the trace was last asked: the bits left,
/// how many, and the instructions since.
#[inline(always)]
fn after_path(p: &TntPath, bits: u64, left: u8, icount: u64) -> (u64, u8, u64) {
    if p.is_whole() {
        return (0, 0, 0);
    }
    // It stops before a block it cannot hold, with bits left for it.
    let left = left - p.used;
    let icount = if p.used > 0 {
        u64::from(p.tail_insns)
    } else {
        icount + p.insns
    };
    (low_bits(bits, left), left, icount)
}

/// A taken TNT bit, from the lane at `pos` with `bits` (`left` of them)
/// cached and trace offset `offset`: the next cached one, else the first
/// of the TNT-8 packet at `pos` (loaded; the packet after it must have a
/// [`plain_offset`]). The lane after it (`pos`, `bits`, `left`, offset);
/// `None` if the bit is not taken or cannot be had here.
#[inline(always)]
fn taken_bit(
    data: &[u8],
    mut pos: u64,
    mut bits: u64,
    mut left: u8,
    mut offset: u64,
) -> Option<(u64, u64, u8, u64)> {
    if left == 0 {
        (bits, left) = tnt8(*data.get(pos as usize)?)?;
        pos = skip_pads(data, pos + 1);
        offset = plain_offset(data, pos)?;
    }
    left -= 1;
    if (bits >> left) & 1 == 0 {
        return None;
    }
    bits &= !(1u64 << left);
    Some((pos, bits, left, offset))
}
