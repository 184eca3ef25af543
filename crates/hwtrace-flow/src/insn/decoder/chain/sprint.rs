//! A sprint: a counting chain's commonest step alone, in a loop of its
//! own — a TNT-8 packet taking a whole recorded path from a conditional
//! jump to the next one.
//!
//! On a compression loop (gzip's, Unzip's) most of a trace is such
//! packets one after the other. The chain's steps' loop takes each
//! through everything a step may be (the block's flow, the bits left, a
//! hashed path lookup with its key compared); a sprint looks the path up
//! in the block's table by the packet's byte ([`BlockCache::tnt_path`])
//! and knows from the path whether the next packet starts at a
//! conditional jump again ([`TntPath::sprints_on`]). Each step is the
//! steps' loop's own, with the same outcome; anything else ends the
//! sprint before the step, and the steps' loop takes it.

use super::{Counts, after_path};
use crate::event::{plain_offset, skip_pads};
use crate::insn::blockcache::{BlockCache, TntPath};
use crate::insn::decoder::fast::RunSink;
use crate::insn::decoder::{InsnDecoder, MAX_UNTRACED_INSNS};
use hwtrace_types::{ReadMemory, TraceOffset};

/// The chain's locals a sprint moves.
#[derive(Clone, Copy)]
pub(super) struct SprintAt {
    pub(super) pos: u64,
    pub(super) bits: u64,
    pub(super) left: u8,
    pub(super) offset: u64,
    pub(super) icount: u64,
    pub(super) last: u32,
    pub(super) idx: u32,
    pub(super) room: usize,
}

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
    // A TNT-8 packet: bit 0 clear, a stop bit above bit 1.
    if b & 1 != 0 || b <= 0x02 {
        return None;
    }
    let after = skip_pads(data, pos + 1);
    let o = plain_offset(data, after)?;
    let p = cache.tnt_path(idx, usize::from(b >> 1))?;
    if room < p.runs as usize || o >= until {
        return None;
    }
    Some((p, after, o))
}

impl<M: ReadMemory> InsnDecoder<'_, M> {
    /// From a conditional jump with no TNT bits loaded (`s`): TNT-8
    /// packets taking the paths in the block's table, one after the
    /// other, for as long as each path ends at another conditional jump
    /// and the packet after each is plain. `s` moved past them; whether
    /// any was taken.
    ///
    /// Inlined: called as a function, its entry and exit cost more than
    /// the steps it saves on traces whose sprints are short (callgrind,
    /// 100 copies of foo's piece: 5% more instructions).
    #[inline(always)]
    pub(super) fn sprint(
        &mut self,
        cache: &BlockCache,
        data: &[u8],
        until: u64,
        counts: &mut Counts,
        out: &mut impl RunSink,
        s: &mut SprintAt,
    ) -> bool {
        let Some(mut step) = sprint_step(cache, data, until, s.pos, s.idx, s.room)
            .filter(|(p, ..)| s.icount + p.insns <= MAX_UNTRACED_INSNS)
        else {
            return false;
        };
        // Counted in a local, written back once.
        let mut c = *counts.before_run(out);
        let (mut icount, mut room) = (s.icount, s.room);
        let (mut pos, mut bits, mut left, mut offset, mut last, mut idx);
        loop {
            let (p, after, o) = step;
            if p.ops != 0 {
                self.replay_stack_ops(cache, p);
            }
            c.count_path(p, TraceOffset(o));
            room -= p.runs as usize;
            (pos, offset) = (after, o);
            (last, idx) = (p.last, p.next);
            if !p.sprints_on {
                (bits, left, icount) = after_path(p, p.bits, p.left, icount);
                break;
            }
            // A whole path, as `after_path` has it; the next one starts
            // with no instructions since the trace was asked, so it is
            // far below the endless-loop limit (a path holds at most
            // `MAX_PATH_LEN` blocks of `MAX_CACHED_BLOCK_INSNS`).
            (bits, left, icount) = (0, 0, 0);
            match sprint_step(cache, data, until, pos, idx, room) {
                Some(next) => step = next,
                None => break,
            }
        }
        if let Some(k) = counts.counted.as_mut() {
            *k = c;
        }
        *s = SprintAt {
            pos,
            bits,
            left,
            offset,
            icount,
            last,
            idx,
            room,
        };
        true
    }
}
