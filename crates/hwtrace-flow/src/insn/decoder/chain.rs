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
//! ([`plain_at`]), so no status carries news. Anything else (a packet the
//! chain does not read, a path not recorded, a successor not
//! linked, a block that needs the instruction decoder, the sink's room or
//! offset limit) ends the chain before the step, for the burst to take.
//! So a burst's runs, counts, offsets and decoder state are the same with
//! or without chains.

use super::InsnDecoder;
use super::MAX_UNTRACED_INSNS;
use super::fast::RunSink;
use crate::event::{LaneAt, TraceLane, low_bits, plain_offset, skip_pads, tip_at, tnt8};
use crate::insn::blockcache::{BlockCache, BlockFlow, NO_BLOCK, TntPath};
use crate::insn::classify::InsnClass;
use crate::insn::tally::Counted;
use hwtrace_types::{ReadMemory, TraceOffset};

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
struct Counts {
    counted: Option<Counted>,
    pending: Option<(u32, u32, TraceOffset)>,
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
        let c = self.counted.get_or_insert_with(|| out.take_counted());
        if let Some((_, insns, offset)) = self.pending.take() {
            c.count_run(u64::from(insns), offset);
        }
        c
    }
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
        };
        // As a burst, nothing more once the sink is full (not even a TNT
        // packet loaded).
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
                BlockFlow::CondJump | BlockFlow::Jump | BlockFlow::Straight | BlockFlow::Call
                    if left > 0 || flow == BlockFlow::CondJump =>
                {
                    if left == 0 {
                        // The block runs on the next TNT packet's first
                        // bit: loaded (as the burst would load it), its
                        // bits pick the path.
                        let Some((tb, tl)) = data.get(pos as usize).and_then(|&b| tnt8(b)) else {
                            break;
                        };
                        let after = skip_pads(data, pos + 1);
                        let Some(o) = plain_offset(data, after) else {
                            // An event after the packet: if a
                            // disable/enable pair the burst passes over,
                            // the path's blocks before the last one run
                            // as they would one by one.
                            if let Some(o) = lane.toggle_offset(after)
                                && o < until
                                && let Some(pre) = path_prefix(cache, idx, tb, tl, room)
                                && icount + pre.insns <= MAX_UNTRACED_INSNS
                            {
                                self.replay_stack_ops(cache, &pre.path);
                                counts.before_run(out).count_runs(
                                    pre.runs,
                                    u64::from(pre.path.first_insns),
                                    pre.insns,
                                    TraceOffset(o),
                                );
                                (bits, left, pos, offset) = (low_bits(tb, 1), 1, after, o);
                                icount = pre.tail_insns.unwrap_or(icount + pre.insns);
                                (last, idx) = (NO_BLOCK, pre.path.last);
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
                    if p.is_whole() {
                        (bits, left, icount) = (0, 0, 0);
                    } else {
                        // It stops before a block it cannot hold, with
                        // bits left for it.
                        left -= p.used;
                        bits = low_bits(bits, left);
                        icount = if p.used > 0 {
                            u64::from(p.tail_insns)
                        } else {
                            icount + p.insns
                        };
                    }
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
                    let Some((np, nb, nl, no)) = taken_bit(data, pos, bits, left, offset) else {
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
                    let Some((payload, size)) = tip_at(data, pos) else {
                        break;
                    };
                    let after = skip_pads(data, pos + u64::from(size));
                    let Some(o) = plain_offset(data, after) else {
                        break;
                    };
                    let mut ip = last_ip;
                    ip.update(payload);
                    let Ok(to) = ip.ip() else {
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
        if let Some(c) = counts.counted {
            out.put_counted(c);
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

/// A whole TNT path but its last block ([`path_prefix`]).
struct Prefix {
    path: TntPath,
    /// Its runs but the last, and their instructions.
    runs: usize,
    insns: u64,
    /// The instructions after the last of them that used a TNT bit
    /// (`None`: none did).
    tail_insns: Option<u64>,
}

/// The path from block `idx` on `bits` (`left` of them, a TNT packet's),
/// when it uses them all and its last block is a conditional jump: the
/// runs before that block, if there are any and `room` holds them. What
/// the blocks do, run one by one, when the bits come with an event after
/// them: the last bit's answer brings it, the others are plain.
#[inline(never)]
fn path_prefix(cache: &BlockCache, idx: u32, bits: u64, left: u8, room: usize) -> Option<Prefix> {
    let (p, runs) = cache.path(idx, bits, left)?;
    let (last, before) = runs.split_last()?;
    if !p.is_whole()
        || before.is_empty()
        || room < before.len()
        || cache.get(p.last)?.flow != BlockFlow::CondJump
    {
        return None;
    }
    let mut tail = 0;
    let mut tail_insns = None;
    for r in before.iter().rev() {
        // Conditional jumps and (compressed) returns take a bit.
        if matches!(r.class, InsnClass::CondJump | InsnClass::Return) {
            tail_insns = Some(tail);
            break;
        }
        tail += u64::from(r.insns);
    }
    Some(Prefix {
        path: *p,
        runs: before.len(),
        insns: p.insns - u64::from(last.insns),
        tail_insns,
    })
}
