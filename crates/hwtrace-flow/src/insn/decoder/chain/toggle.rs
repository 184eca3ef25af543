//! A counting chain's passes over disable/enable pairs (a TIP.PGD right
//! followed by a TIP.PGE: the code left the traced range at a branch and
//! came back elsewhere), out of the steps' loop.
//!
//! A pair right after a TNT packet is passed over as the burst's
//! `pass_toggles` would: the TNT bits followed through the path tables to
//! the conditional jump that takes the last one, the walk from there to
//! the branch the disable binds to, then the block at the enable's IP.
//! What that does depends only on where the bits start, the bits and the
//! pair's IPs, so the first pass is planned ([`plan_pass`]) and kept in
//! the cache's [`PairMemo`](crate::insn::pairmemo::PairMemo), and the
//! same pair after the same bits again is counted from there.
//!
//! Pairs also come in a row, with nothing the trace answers between them
//! (the code calls out, comes back and calls out again): each after the
//! first is a walk from the enable's IP before it ([`plan_bare_pass`]),
//! and the run is passed over whole or not at all
//! ([`InsnDecoder::pass_pairs`]), as the burst passes it in one go.

use super::{Counts, Spot, after_path};
use crate::event::{
    TogglePair, TraceLane, low_bits, plain_offset, skip_pads, tip_ip, toggle_pair_at,
};
use crate::insn::blockcache::{BlockCache, BlockFlow, CachedBlock, NO_BLOCK, StackOp, TntPath};
use crate::insn::classify::InsnClass;
use crate::insn::decoder::fast::{DISABLE_WALK, RunSink, WalkStep, disable_walk_step, replay_ops};
use crate::insn::decoder::{InsnDecoder, MAX_UNTRACED_INSNS};
use crate::insn::pairmemo::{PairKey, PairPass};
use hwtrace_packet::LastIp;
use hwtrace_types::{ReadMemory, TraceOffset};

impl<'a, M: ReadMemory> InsnDecoder<'a, M> {
    /// At block `s.idx`, a TNT packet's bits just loaded with the
    /// TIP.PGD/TIP.PGE pair `pair` as the look-ahead after them (`s.offset`
    /// the TIP.PGE's): what the burst does then, as a chain. Paths that stop
    /// before a block with bits left for it are taken as usual; then the
    /// blocks but the last that the bits lead to run as they would one by
    /// one (a prefix of a whole path, or none with a single bit left for
    /// a conditional jump), then that jump on the last bit, and the pair
    /// is passed over if the burst would pass it ([`plan_toggle`]). The
    /// spot and counts after, and whether the pair was passed (else the
    /// chain ends there, as the burst would have left it).
    ///
    /// A pass made before from the same block with the same bits over a
    /// pair with the same IPs is replayed from the cache's memo when the
    /// spot meets what it asked ([`plan_pass`]); on the real fuzzing
    /// traces that is nine pairs in ten, at ~230 instructions where
    /// planning and taking one took ~620 (callgrind).
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's own state, passed down to its cold path"
    )]
    #[cold]
    #[inline(never)]
    pub(super) fn pass_toggle(
        &mut self,
        cache: &mut BlockCache,
        out: &mut impl RunSink,
        mut counts: Counts,
        data: &[u8],
        until: u64,
        mut s: Spot,
        pair: TogglePair,
    ) -> (Spot, Counts, bool) {
        if s.offset >= until {
            return (s, counts, false);
        }
        let key = PairKey {
            idx: s.idx,
            left: s.left,
            bits: s.bits,
            off: pair.off,
            on: pair.on,
        };
        let pass = remembered(cache, key, |cache| plan_pass(cache, key, pair));
        if let Some(pass) = pass
            && self.replay_pass(cache, out, &mut counts, data, until, &mut s, pass, pair)
        {
            return (s, counts, true);
        }
        let flow = loop {
            let Some(b) = cache.get(s.idx) else {
                return (s, counts, false);
            };
            let flow = b.flow;
            match cache.path_record(s.idx, s.bits, s.left) {
                Some(p) if !p.is_whole() => {
                    let runs = p.runs as usize;
                    if s.room < runs || s.icount + p.insns > MAX_UNTRACED_INSNS {
                        return (s, counts, false);
                    }
                    self.replay_stack_ops(cache, p);
                    counts.before_run(out).count_path(p, TraceOffset(s.offset));
                    s.room -= runs;
                    (s.bits, s.left, s.icount) = after_path(p, s.bits, s.left, s.icount);
                    (s.last, s.idx) = (p.last, p.next);
                }
                _ => break flow,
            }
        };
        if s.icount + u64::from(cache.get(s.idx).map_or(0, |b| b.insns)) > MAX_UNTRACED_INSNS {
            return (s, counts, false);
        }
        let pre = path_prefix(cache, s.idx, s.bits, s.left, s.room)
            .filter(|pre| s.icount + pre.insns <= MAX_UNTRACED_INSNS);
        let (l, at_l, runs) = match &pre {
            Some(pre) => (
                pre.path.last,
                pre.tail_insns.unwrap_or(s.icount + pre.insns),
                pre.runs,
            ),
            None if s.left == 1 && flow == BlockFlow::CondJump => (s.idx, s.icount, 0),
            None => return (s, counts, false),
        };
        let step = cache
            .get(l)
            .copied()
            .filter(|lb| at_l + u64::from(lb.insns) <= MAX_UNTRACED_INSNS)
            .filter(|_| s.room - runs > 1 + DISABLE_WALK)
            .and_then(|lb| {
                let pos = skip_pads(data, pair.after);
                let offset = plain_offset(data, pos)?;
                let to = if s.bits & 1 != 0 { lb.target } else { lb.end.0 };
                plan_toggle(cache, l, to, pair).map(|step| (lb, step, (pos, offset)))
            });
        if let Some(pre) = &pre {
            self.replay_stack_ops(cache, &pre.path);
            counts.before_run(out).count_runs(
                pre.runs,
                u64::from(pre.path.first_insns),
                pre.insns,
                TraceOffset(s.offset),
            );
            s.room -= pre.runs;
        }
        let Some((lb, step, (pos, offset))) = step else {
            if pre.is_some() {
                (s.bits, s.left, s.icount) = (low_bits(s.bits, 1), 1, at_l);
                (s.last, s.idx) = (NO_BLOCK, l);
            }
            return (s, counts, false);
        };
        // The jump and the blocks to the branch the disable binds to, all
        // taken at the enable's offset; the calls before that branch push
        // their return address, the branch is not executed.
        counts.block(out, l, lb.insns, s.offset);
        s.room -= 1;
        let walk = &step.walk[..step.len];
        for (i, &w) in walk.iter().enumerate() {
            let Some(wb) = cache.get(w) else {
                continue;
            };
            if i + 1 < walk.len() && wb.flow == BlockFlow::Call && wb.target != wb.end.0 {
                self.retstack.push(wb.end.0);
            }
            counts.block(out, w, wb.insns, s.offset);
            s.room -= 1;
        }
        // The two events; the next run is taken after the pair.
        counts.before_run(out).end = TraceOffset(offset);
        counts.events += 2;
        (s.bits, s.left, s.pos, s.last_ip, s.offset) = (0, 0, pos, step.pair.last_ip, offset);
        s.icount = 0;
        (s.last, s.idx) = (from_last(&step), step.next);
        (s, counts, true)
    }

    /// At block `s.idx`, a return or an indirect branch with no TNT bits
    /// left, and a TIP at `s.pos` that is not followed by a plain packet:
    /// when a disable/enable pair follows it, what the burst does then
    /// (its `pass_toggles` after the TIP's answer), as a chain. The block
    /// goes to the TIP's IP, the blocks from there run to the branch the
    /// disable binds to ([`plan_toggle`]), all taken at the enable's
    /// offset, and the pair is passed over. The spot and counts after, and
    /// whether the pair was passed (else nothing was done: the chain ends
    /// before the block, for the burst).
    ///
    /// Remembered and replayed as passes after TNT bits are, keyed by the
    /// TIP's IP ([`plan_tip_pass`]). On the real fuzzing traces one pair
    /// in ten comes after a TIP.
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's own state, passed down to its cold path"
    )]
    #[cold]
    #[inline(never)]
    pub(super) fn pass_tip_toggle(
        &mut self,
        cache: &mut BlockCache,
        lane: &TraceLane<'a>,
        out: &mut impl RunSink,
        mut counts: Counts,
        until: u64,
        mut s: Spot,
    ) -> (Spot, Counts, bool) {
        let data = lane.data();
        let Some(b) = cache.get(s.idx).copied() else {
            return (s, counts, false);
        };
        let mut ip = s.last_ip;
        let Some((to, end)) = tip_ip(data, s.pos, &mut ip) else {
            return (s, counts, false);
        };
        let after = skip_pads(data, end);
        let Some(pair) = lane.toggle_pair(after, ip) else {
            return (s, counts, false);
        };
        // As the burst: the enable's offset before `until`, room for the
        // block and a walk.
        if pair.on_at >= until || s.room <= 1 + DISABLE_WALK {
            return (s, counts, false);
        }
        // Keyed by the TIP's IP in place of TNT bits.
        let key = PairKey {
            idx: s.idx,
            left: TIP_KEY,
            bits: to,
            off: pair.off,
            on: pair.on,
        };
        let pass = remembered(cache, key, |cache| plan_tip_pass(cache, key, &b, pair));
        let passed = pass.is_some_and(|pass| {
            self.replay_pass(cache, out, &mut counts, data, until, &mut s, pass, pair)
        });
        (s, counts, passed)
    }

    /// Replays `pass` (remembered for the pair `pair`) from spot `s`, if
    /// the spot meets what it asks and the packet after the pair is
    /// plain, or starts more pairs the chain passes over with it
    /// ([`pass_pairs`](Self::pass_pairs), which takes both): the runs counted at the enable's
    /// offset (`pair.on_at`), the return stack operations replayed, the
    /// two events counted, the spot moved past the pair. Whether it was.
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's own state, passed down to its cold path"
    )]
    #[inline(always)]
    fn replay_pass(
        &mut self,
        cache: &mut BlockCache,
        out: &mut impl RunSink,
        counts: &mut Counts,
        data: &[u8],
        until: u64,
        s: &mut Spot,
        pass: PairPass,
        pair: TogglePair,
    ) -> bool {
        if s.room < pass.room || s.icount > pass.icount_max {
            return false;
        }
        self.pass_pairs(cache, out, counts, data, until, s, (pass, pair))
    }

    /// `first`, a pass the spot meets what it asks of, and the pairs right
    /// after its pair, if any: passed over as the burst's `pass_toggles`
    /// passes them one after the other, when each after the first is
    /// remembered or planned ([`plan_bare_pass`]: the walk from the
    /// enable's IP before it to the branch its disable binds to) and a
    /// plain packet follows the last. All are planned before any is
    /// taken: the burst passes a run of pairs in one go, and a chain that
    /// stopped between two would not leave it as the burst does. Each
    /// pair's two events are counted at the next one's enable offset, the
    /// next pair's runs too (the burst's look-ahead is that pair then).
    /// Whether they were (else nothing was done).
    ///
    /// A real trace of code filtered to its own range has pairs in a row
    /// where the code calls out, comes back and calls out again with no
    /// branch the trace answers between: half of the real traces' pairs
    /// ended the chain before.
    #[allow(
        clippy::too_many_arguments,
        reason = "the chain's own state, passed down to its cold path"
    )]
    #[inline(always)]
    fn pass_pairs(
        &mut self,
        cache: &mut BlockCache,
        out: &mut impl RunSink,
        counts: &mut Counts,
        data: &[u8],
        until: u64,
        s: &mut Spot,
        first: (PairPass, TogglePair),
    ) -> bool {
        let mut passes: PairsInARow = [None; MAX_PAIRS_IN_A_ROW];
        // Planning may fill the memo, which then starts over: the passes
        // planned before would point at operations that are gone.
        let generation = cache.pairs().generation();
        let n = pairs_in_a_row(data, until, s.room, first, &mut passes, |key, next| {
            remembered(cache, key, |cache| plan_bare_pass(cache, key, next))
        });
        let Some(n) = n.filter(|_| cache.pairs().generation() == generation) else {
            return false;
        };
        for &(pass, pair, pos, offset) in passes[..n].iter().flatten() {
            replay_ops(&mut self.retstack, cache.pairs().ops(&pass));
            count_pass(counts, out, s, &pass, &pair, (pos, offset));
        }
        true
    }
}

/// The passes over a run of pairs in a row, the spot's room `room` before
/// the first (`first`, a pass it meets what it asks of): into `passes`,
/// each with its pair, the look-ahead after that pair (PADs skipped) and
/// the offset the lane reports there; how many, if each pair after the
/// first comes before `until` with room for a walk left, has a pass
/// (`pass_for`, given its key and the pair) and a plain packet follows
/// the last.
pub(super) fn pairs_in_a_row(
    data: &[u8],
    until: u64,
    room: usize,
    first: (PairPass, TogglePair),
    passes: &mut PairsInARow,
    mut pass_for: impl FnMut(PairKey, TogglePair) -> Option<PairPass>,
) -> Option<usize> {
    let mut room = room.checked_sub(first.0.runs)?;
    let (mut pass, mut pair) = first;
    for (n, slot) in passes.iter_mut().enumerate() {
        let pos = skip_pads(data, pair.after);
        if let Some(offset) = plain_offset(data, pos) {
            *slot = Some((pass, pair, pos, offset));
            return Some(n + 1);
        }
        let next = toggle_pair_at(data, pos, pair.last_ip)?;
        // As the burst: the next enable's offset before `until`, room for
        // a walk.
        if next.on_at >= until || room <= DISABLE_WALK {
            return None;
        }
        *slot = Some((pass, pair, pos, next.on_at));
        let key = PairKey {
            idx: pass.last,
            left: BARE_KEY,
            bits: pair.on,
            off: next.off,
            on: next.on,
        };
        let p = pass_for(key, next)?;
        room = room.checked_sub(p.runs)?;
        (pass, pair) = (p, next);
    }
    None
}

/// The passes of [`pairs_in_a_row`], each with its pair, the look-ahead
/// after it and the offset the lane reports there (`None` past them:
/// only the tags are written up front).
pub(super) type PairsInARow = [Option<(PairPass, TogglePair, u64, u64)>; MAX_PAIRS_IN_A_ROW];

/// The most disable/enable pairs in a row a chain passes over in one go
/// ([`InsnDecoder::pass_pairs`]); the burst takes longer runs.
pub(super) const MAX_PAIRS_IN_A_ROW: usize = 8;

/// What a pass over `pair` (`pass`, its return stack operations done
/// apart) does to the counts and the spot: the runs counted at the
/// enable's offset, the two events, the spot moved to `(pos, offset)`
/// after the pair, at the block at the enable's IP.
#[inline(always)]
pub(super) fn count_pass(
    counts: &mut Counts,
    out: &mut impl RunSink,
    s: &mut Spot,
    pass: &PairPass,
    pair: &TogglePair,
    (pos, offset): (u64, u64),
) {
    let c = counts.before_run(out);
    c.count_runs(pass.runs, pass.first, pass.insns, TraceOffset(pair.on_at));
    c.end = TraceOffset(offset);
    counts.events += 2;
    s.room -= pass.runs;
    (s.bits, s.left, s.pos, s.last_ip, s.offset) = (0, 0, pos, pair.last_ip, offset);
    s.icount = 0;
    (s.last, s.idx) = (pass.last, pass.next);
}

/// The pass remembered for `key` in the cache's memo, else the one `plan`
/// makes (and remembers).
#[inline(always)]
fn remembered(
    cache: &mut BlockCache,
    key: PairKey,
    plan: impl FnOnce(&mut BlockCache) -> Option<PairPass>,
) -> Option<PairPass> {
    match cache.pairs().get(&key) {
        Some(pass) => Some(pass),
        None => plan(cache),
    }
}

/// What the blocks of `step`'s walk do, as a pass counts them: their runs
/// and instructions, and the return addresses the calls before the last
/// push (into `ops`; the branch the disable binds to is not executed).
fn walk_effects(cache: &BlockCache, step: &ToggleStep, ops: &mut Vec<StackOp>) -> (usize, u64) {
    let (mut runs, mut insns) = (0, 0);
    let walk = &step.walk[..step.len];
    for (i, &w) in walk.iter().enumerate() {
        let Some(wb) = cache.get(w) else {
            continue;
        };
        if i + 1 < walk.len() && wb.flow == BlockFlow::Call && wb.target != wb.end.0 {
            ops.push(StackOp::Push(wb.end.0));
        }
        (runs, insns) = (runs + 1, insns + u64::from(wb.insns));
    }
    (runs, insns)
}

/// [`PairKey::left`] for a pair after a TIP ([`plan_tip_pass`]), whose
/// key holds the TIP's IP where a TNT packet's bits would be: more bits
/// than a TNT packet has.
const TIP_KEY: u8 = u8::MAX;

/// What [`InsnDecoder::pass_tip_toggle`] does when block `key.idx` (`b`)
/// goes to the TIP's IP `key.bits` with the pair `pair` after the TIP:
/// the block and the walk to the branch the disable binds to, all taken
/// at the enable's offset; a return address pushed if `b` is an indirect
/// call. Remembered in the cache's memo. `None` if the walk is not known
/// ([`plan_toggle`]).
#[cold]
#[inline(never)]
fn plan_tip_pass(
    cache: &mut BlockCache,
    key: PairKey,
    b: &CachedBlock,
    pair: TogglePair,
) -> Option<PairPass> {
    let step = plan_toggle(cache, key.idx, key.bits, pair)?;
    let mut ops = Vec::new();
    if b.flow == BlockFlow::IndirectCall {
        ops.push(StackOp::Push(b.end.0));
    }
    let (mut runs, mut insns) = (1usize, u64::from(b.insns));
    let (walk_runs, walk_insns) = walk_effects(cache, &step, &mut ops);
    (runs, insns) = (runs + walk_runs, insns + walk_insns);
    // The room the caller made sure of; the walk counts its instructions
    // from none, as the burst's does.
    let pass = PairPass::new(
        runs,
        u64::from(b.insns),
        insns,
        from_last(&step),
        step.next,
        2 + DISABLE_WALK,
        MAX_UNTRACED_INSNS,
    );
    Some(cache.pairs_mut().insert(key, pass, &ops))
}

/// [`PairKey::left`] for a pair right after another one
/// ([`plan_bare_pass`]), whose key holds the block the disable before
/// binds to and the enable's IP before in place of a block and TNT bits.
const BARE_KEY: u8 = u8::MAX - 1;

/// What [`InsnDecoder::pass_pairs`] does for the pair `pair` right after
/// another whose disable bound to block `key.idx` and whose enable went
/// to `key.bits`: the walk from there to the branch `pair`'s disable
/// binds to, all taken at `pair`'s enable offset (no TNT bit or TIP
/// between). Remembered in the cache's memo. `None` if the walk is not
/// known ([`plan_toggle`]).
#[cold]
#[inline(never)]
fn plan_bare_pass(cache: &mut BlockCache, key: PairKey, pair: TogglePair) -> Option<PairPass> {
    let step = plan_toggle(cache, key.idx, key.bits, pair)?;
    let first = u64::from(cache.get(step.walk[0])?.insns);
    let mut ops = Vec::new();
    let (runs, insns) = walk_effects(cache, &step, &mut ops);
    // The room the burst asks before a walk after a pair it passed over.
    let pass = PairPass::new(
        runs,
        first,
        insns,
        from_last(&step),
        step.next,
        1 + DISABLE_WALK,
        MAX_UNTRACED_INSNS,
    );
    Some(cache.pairs_mut().insert(key, pass, &ops))
}

/// The instructions since the trace was last asked, as a pass over a pair
/// ([`plan_pass`]) follows them: the spot's and `acc`, or `acc` alone once
/// a TNT bit was used.
#[derive(Clone, Copy)]
struct Since {
    acc: u64,
    from_spot: bool,
}

/// What a pass over a pair asks of the spot it is taken from, gathered
/// check by check ([`plan_pass`]).
struct Needs {
    /// The least room for runs.
    room: usize,
    /// The most instructions since the trace was last asked.
    icount_max: u64,
}

impl Needs {
    /// The check that `since` and `insns` more stay within
    /// [`MAX_UNTRACED_INSNS`]: `None` if they do not whatever the spot,
    /// else what it asks of the spot.
    fn fits(&mut self, since: Since, insns: u64) -> Option<()> {
        let total = since.acc.checked_add(insns)?;
        let slack = MAX_UNTRACED_INSNS.checked_sub(total)?;
        if since.from_spot {
            self.icount_max = self.icount_max.min(slack);
        }
        Some(())
    }

    /// The check that `runs` runs fit.
    fn room(&mut self, runs: usize) {
        self.room = self.room.max(runs);
    }
}

/// What [`InsnDecoder::pass_toggle`] does when it passes the pair `pair`
/// over from block `key.idx` with the TNT bits `key.bits` (`key.left` of
/// them) loaded, wherever in the trace that is: the same steps, taken
/// with every check that depends on the spot (its room for runs, its
/// instructions since the trace was asked) noted rather than made, and
/// remembered in the cache's [`PairMemo`](crate::insn::pairmemo::PairMemo).
/// `None` where a check fails whatever the spot, or the pass would stop
/// part way: `pass_toggle` takes those steps itself.
#[cold]
#[inline(never)]
fn plan_pass(cache: &mut BlockCache, key: PairKey, pair: TogglePair) -> Option<PairPass> {
    let mut needs = Needs {
        room: 0,
        icount_max: MAX_UNTRACED_INSNS,
    };
    let mut since = Since {
        acc: 0,
        from_spot: true,
    };
    let mut ops: Vec<StackOp> = Vec::new();
    let (mut idx, mut bits, mut left) = (key.idx, key.bits, key.left);
    let (mut runs, mut first, mut insns) = (0usize, None, 0u64);
    // Paths that stop before a block with bits left for it.
    let flow = loop {
        let flow = cache.get(idx)?.flow;
        match cache.path_record(idx, bits, left) {
            Some(p) if !p.is_whole() => {
                let p = *p;
                needs.room(runs + p.runs as usize);
                needs.fits(since, p.insns)?;
                ops.extend_from_slice(cache.path_ops(&p));
                first.get_or_insert(u64::from(p.first_insns));
                (runs, insns) = (runs + p.runs as usize, insns + p.insns);
                // As `after_path`.
                left -= p.used;
                bits = low_bits(bits, left);
                since = if p.used > 0 {
                    Since {
                        acc: u64::from(p.tail_insns),
                        from_spot: false,
                    }
                } else {
                    Since {
                        acc: since.acc + p.insns,
                        ..since
                    }
                };
                idx = p.next;
            }
            _ => break flow,
        }
    };
    needs.fits(since, u64::from(cache.get(idx).map_or(0, |b| b.insns)))?;
    let pre = path_prefix(cache, idx, bits, left, usize::MAX);
    let (l, at_l, pre_runs) = match &pre {
        Some(pre) => {
            needs.room(runs + pre.runs);
            needs.fits(since, pre.insns)?;
            let at_l = match pre.tail_insns {
                Some(tail) => Since {
                    acc: tail,
                    from_spot: false,
                },
                None => Since {
                    acc: since.acc + pre.insns,
                    ..since
                },
            };
            (pre.path.last, at_l, pre.runs)
        }
        None if left == 1 && flow == BlockFlow::CondJump => (idx, since, 0),
        None => return None,
    };
    let lb = *cache.get(l)?;
    needs.fits(at_l, u64::from(lb.insns))?;
    needs.room(runs + pre_runs + 2 + DISABLE_WALK);
    let to = if bits & 1 != 0 { lb.target } else { lb.end.0 };
    let step = plan_toggle(cache, l, to, pair)?;
    if let Some(pre) = &pre {
        ops.extend_from_slice(cache.path_ops(&pre.path));
        first.get_or_insert(u64::from(pre.path.first_insns));
        (runs, insns) = (runs + pre.runs, insns + pre.insns);
    }
    let first = *first.get_or_insert(u64::from(lb.insns));
    (runs, insns) = (runs + 1, insns + u64::from(lb.insns));
    let (walk_runs, walk_insns) = walk_effects(cache, &step, &mut ops);
    (runs, insns) = (runs + walk_runs, insns + walk_insns);
    let pass = PairPass::new(
        runs,
        first,
        insns,
        from_last(&step),
        step.next,
        needs.room,
        needs.icount_max,
    );
    Some(cache.pairs_mut().insert(key, pass, &ops))
}

/// The TIP.PGD/TIP.PGE pair at `pos` (as [`TraceLane::toggle_pair`]) into
/// `slot`, and the trace offset the lane reports there. Out of the
/// steps' loop, whose locals stay in registers better without it.
#[cold]
#[inline(never)]
pub(super) fn pair_at(
    lane: &TraceLane<'_>,
    pos: u64,
    last_ip: LastIp,
    slot: &mut Option<TogglePair>,
) -> Option<u64> {
    *slot = lane.toggle_pair(pos, last_ip);
    slot.map(|p| p.on_at)
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

/// A disable/enable pair a chain passes over ([`plan_toggle`]).
struct ToggleStep {
    /// The blocks from where the conditional jump went to the branch the
    /// disable binds to (that one last).
    walk: [u32; DISABLE_WALK],
    len: usize,
    pair: TogglePair,
    /// The block at the TIP.PGE's IP.
    next: u32,
}

/// Block `l`, a conditional jump, took its last cached TNT bit to `to`,
/// with the TIP.PGD/TIP.PGE pair `pair` the look-ahead: what the burst's
/// pass over the pair does, as a chain takes it.
/// The blocks to the branch the disable binds to as the burst walks them
/// (an instruction that is not a branch, and a direct jump or call that
/// does not go to the disable's IP, run as usual; any other branch is
/// the one tracing stopped at), each plain and known without looking
/// further ([`BlockCache::linked_or_recent`], which links what it finds);
/// the block at the enable's IP known so too. (What follows the pair is
/// for the pass's caller to look at.)
/// `None`: the burst takes it (it may build blocks, or stop there).
#[inline(never)]
fn plan_toggle(
    cache: &mut BlockCache,
    l: u32,
    mut to: u64,
    pair: TogglePair,
) -> Option<ToggleStep> {
    let mut step = ToggleStep {
        walk: [NO_BLOCK; DISABLE_WALK],
        len: 0,
        pair,
        next: NO_BLOCK,
    };
    let (mut from, mut insns) = (l, 0u64);
    loop {
        if step.len == DISABLE_WALK {
            return None;
        }
        let w = cache.linked_or_recent(from, to)?;
        let b = cache.get(w)?;
        insns += u64::from(b.insns);
        if !b.plain || insns > MAX_UNTRACED_INSNS {
            return None;
        }
        step.walk[step.len] = w;
        step.len += 1;
        to = match disable_walk_step(b, pair.off)? {
            WalkStep::On(to) => to,
            WalkStep::Binds => break,
        };
        from = w;
    }
    step.next = cache.linked_or_recent(from_last(&step), pair.on)?;
    Some(step)
}

/// The last block of a walk ([`ToggleStep::walk`], never empty).
fn from_last(step: &ToggleStep) -> u32 {
    step.walk[step.len - 1]
}
