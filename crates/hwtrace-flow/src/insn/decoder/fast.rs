//! The hooks [`FastDecoder`](crate::insn::FastDecoder) runs the instruction
//! decoder through: a whole cached block in one step when nothing can bind
//! to the instructions before its last one.
//!
//! With no event pending, [`InsnDecoder::next_insn`] on an instruction that
//! is not a branch only counts it and moves the IP past it: no event can
//! bind to it (events become pending only when the trace is queried, at a
//! branch) and nothing is asked of the trace. So the run of such
//! instructions at the start of a block can be skipped, and the block's
//! last instruction goes through exactly the code `next_insn` uses
//! ([`InsnDecoder::proceed`], then the events binding at the new IP). The
//! decoder state afterwards is the one `next_insn` would have left.

use super::chain::ChainAt;
use super::{InsnDecoder, MAX_UNTRACED_INSNS};
use crate::error::{Error, ErrorKind};
use crate::event::{EventKind, Status, TraceLane};
use crate::insn::blockcache::{
    BlockCache, BlockFlow, CachedBlock, MAX_PATH_LEN, NO_BLOCK, PathEnd, PathKey, PathRun, StackOp,
    TntPath,
};
use crate::insn::cache::Cached;
use crate::insn::classify::InsnClass;
use crate::insn::decoder::Insn;
use crate::insn::retstack::RetStack;
use crate::insn::tally::Counted;
use hwtrace_packet::ExecMode;
use hwtrace_types::{AddressSpace, Ip, ReadMemory, TraceOffset};

impl<M: ReadMemory> InsnDecoder<'_, M> {
    /// Whether the next instructions may run a block at a time: tracing is
    /// on, the mode is known, and no event, resync or postponed
    /// instruction is waiting.
    #[inline]
    pub(in crate::insn) fn fast_ready(&self) -> bool {
        self.enabled
            && self.mode.is_some()
            && !self.process_event
            && !self.status.event_pending
            && !self.resyncing
            && self.postponed.is_none()
            && self.stashed.is_none()
    }

    /// Whether the one event waiting is a disable (TIP.PGD) that binds to
    /// the next branch: then the non-branch instructions before it are
    /// executed as usual, and only the branch needs `next_insn`.
    #[inline]
    pub(in crate::insn) fn disable_pending(&self) -> bool {
        self.enabled
            && self.mode.is_some()
            && self.process_event
            && matches!(self.event.kind, EventKind::Disabled { .. })
            && !self.event.status_update
            && !self.resyncing
            && self.postponed.is_none()
            && self.stashed.is_none()
    }

    /// With a disable pending ([`disable_pending`](Self::disable_pending)):
    /// runs `block` (which starts at the current IP and whose instructions
    /// before the last are plain) up to its last instruction, which goes
    /// through `next_insn` into `insn`. `None`: not run.
    ///
    /// A disable binds to no instruction that is neither a branch nor
    /// special (`at_disabled_event`), and after one the disable is still
    /// not due (`check_ip_event`: a disable waits for its branch), so
    /// those instructions only move the IP and count.
    pub(in crate::insn) fn run_block_to_disable(
        &mut self,
        block: &CachedBlock,
        insn: &mut Insn,
    ) -> Option<Result<Status, Error>> {
        let n = u64::from(block.insns);
        if !block.plain || self.icount.saturating_add(n) > MAX_UNTRACED_INSNS {
            return None;
        }
        // `next_insn` decodes the last instruction again (a cache hit):
        // make sure it will, so the run's instructions all were executed.
        self.decode_at(block.last_ip.0, self.mode).ok()?;
        self.icount += n - 1;
        self.ip = block.last_ip.0;
        Some(self.next_insn(insn))
    }

    /// The configuration.
    #[inline]
    pub(in crate::insn) const fn query_config(&self) -> &crate::config::Config {
        self.query.config()
    }

    /// The execution mode the next instruction runs in.
    #[inline]
    pub(in crate::insn) const fn exec_mode(&self) -> Option<ExecMode> {
        self.mode
    }

    /// Whether the next instruction runs inside a transaction.
    #[inline]
    pub(in crate::insn) const fn speculative(&self) -> bool {
        self.speculative
    }

    /// The instruction at `ip` in `space` (through the instruction cache),
    /// for building blocks and expanding them.
    pub(in crate::insn) fn decode_insn(
        &mut self,
        space: AddressSpace,
        ip: Ip,
        mode: ExecMode,
    ) -> Result<Cached, ErrorKind> {
        let current = self.space;
        self.space = space;
        let r = self.decode_at(ip.0, Some(mode));
        self.space = current;
        r
    }

    /// Runs `block`, which starts at the current IP, as `next_insn` would
    /// instruction by instruction. Call only when
    /// [`fast_ready`](Self::fast_ready). `Ok(None)`: not run (the
    /// no-progress limit falls inside it; step instruction by instruction).
    /// `Err`: every instruction of the block ran, the last one failed
    /// (exactly `next_insn`'s error).
    pub(in crate::insn) fn run_block(
        &mut self,
        block: &CachedBlock,
        last: &Cached,
    ) -> Result<Option<Status>, Error> {
        let n = u64::from(block.insns);
        if self.icount.saturating_add(n) > MAX_UNTRACED_INSNS {
            return Ok(None);
        }
        let d = last.decoded;
        let next = block.last_ip.0.wrapping_add(u64::from(d.size));
        // What `proceed` does for the branches that need no packet decoded
        // (direct calls and jumps, and conditional branches and compressed
        // returns whose TNT bit is already cached), inline. When the cache
        // is empty and the next event is a TNT packet, it is loaded first,
        // as `cond_branch` would: runs of TNT packets stay on this path.
        if matches!(d.class, InsnClass::CondJump | InsnClass::Return)
            && !self.query.config().tick_events
        {
            self.query.refill_cached_tnt();
        }
        match (d.class, d.target) {
            (InsnClass::Other | InsnClass::Ptwrite, _) => {
                self.icount += n;
                self.ip = next;
                return Ok(Some(self.insn_status(false)));
            }
            (InsnClass::Jump, Some(target)) => {
                self.icount += n;
                self.ip = target;
                return Ok(Some(self.insn_status(false)));
            }
            (InsnClass::Call, Some(target)) => {
                self.icount += n;
                if target != next {
                    self.retstack.push(next);
                }
                self.ip = target;
                return Ok(Some(self.insn_status(false)));
            }
            (InsnClass::CondJump, Some(target)) if !self.query.config().tick_events => {
                if let Some(taken) = self.query.peek_cached_tnt() {
                    self.ip = if taken { target } else { next };
                    return self.took_cached_tnt(block, last).map(Some);
                }
            }
            (InsnClass::Return, _)
                if !self.query.config().tick_events
                    && self.query.peek_cached_tnt() == Some(true) =>
            {
                if let Some(to) = self.retstack.pop() {
                    self.ip = to;
                    return self.took_cached_tnt(block, last).map(Some);
                }
            }
            // An indirect branch whose TIP is next, as `proceed` and
            // `indirect_branch` take it (a compressed return's query finds
            // no TNT bit and falls back to the TIP).
            (InsnClass::Jump | InsnClass::Call | InsnClass::Return, None)
                if !self.query.config().tick_events =>
            {
                if let Some((target, status)) = self.query.take_tip() {
                    if d.class == InsnClass::Call {
                        self.retstack.push(next);
                    }
                    self.ip = target;
                    return self.answered(block, last, status).map(Some);
                }
            }
            _ => {}
        }
        self.icount += n - 1;
        let insn = self.last_insn(block, last);
        self.ip = insn.ip;
        self.proceed(&insn, &d).map_err(|k| self.err(k))?;
        self.check_ip_event(Some((&insn, &d)))
            .map(Some)
            .map_err(|k| self.err(k))
    }

    /// The block's last instruction as `next_insn` reports it.
    fn last_insn(&self, block: &CachedBlock, last: &Cached) -> Insn {
        let d = last.decoded;
        Insn {
            ip: block.last_ip.0,
            size: d.size,
            mode: self.mode,
            class: d.class,
            speculative: self.speculative,
            target: d.target,
            raw: last.raw,
        }
    }

    /// After the block's last instruction used the cached TNT bit (the IP
    /// is already where it went): as `cond_branch` and `check_ip_event`.
    #[inline]
    fn took_cached_tnt(&mut self, block: &CachedBlock, last: &Cached) -> Result<Status, Error> {
        let status = self.query.take_cached_tnt();
        self.answered(block, last, status)
    }

    /// After the block's last instruction got its answer from the trace
    /// (a TNT bit or a TIP; the IP is already where it went), with the
    /// status that came with it: as `cond_branch`/`indirect_branch` and
    /// `check_ip_event` leave the decoder.
    #[inline]
    fn answered(
        &mut self,
        block: &CachedBlock,
        last: &Cached,
        status: Status,
    ) -> Result<Status, Error> {
        self.icount = 0;
        self.status = status;
        if !status.event_pending {
            return Ok(self.insn_status(false));
        }
        let insn = self.last_insn(block, last);
        let d = last.decoded;
        self.check_ip_event(Some((&insn, &d)))
            .map_err(|k| self.err(k))
    }
}

/// Where a burst ([`InsnDecoder::run_burst`]) puts its runs.
pub(in crate::insn) trait RunSink {
    /// Whether no further run fits.
    fn is_full(&self) -> bool;
    /// One run: `block`, then the trace offset after it.
    fn push(&mut self, block: &CachedBlock, offset: TraceOffset);
    /// How many more runs fit.
    fn room(&self) -> usize;
    /// The runs of TNT path `path` (the caller checked they fit), all with
    /// the trace offset after them.
    fn push_path(&mut self, path: &TntPath, runs: &[PathRun], offset: TraceOffset);
    /// Whether a TNT path whose runs are all taken at trace offset
    /// `offset` may be pushed whole. Not at or past where the caller looks
    /// for a seam: a seam can follow any block that ends in a branch, and
    /// the caller sees a block's end only when the block is a run of its
    /// own (a decode that synchronised there finds its anchor block by
    /// block).
    fn takes_path_at(&self, offset: TraceOffset) -> bool;
    /// Whether the burst may pass over a TIP.PGD followed by a TIP.PGE
    /// (tracing disabled at a branch and enabled again elsewhere) between
    /// two runs, telling the sink how many events it passed over
    /// ([`pass_events`](Self::pass_events)) instead of stopping there.
    fn passes_toggles(&self) -> bool {
        false
    }
    /// `n` events passed over after the runs so far (none a status
    /// update); the next run is taken at trace offset `offset`.
    fn pass_events(&mut self, n: u64, offset: TraceOffset) {
        let _ = (n, offset);
    }
    /// For a sink that only counts runs, so a burst may count them itself
    /// ([`InsnDecoder::run_chain`]): how many more fit, and the trace
    /// offset they must be taken before. `None` for a sink that keeps
    /// runs.
    fn count_room(&self) -> Option<(usize, TraceOffset)> {
        None
    }
    /// The runs counted so far, every one counted (called only when
    /// [`count_room`](Self::count_room) said `Some`).
    fn take_counted(&mut self) -> Counted {
        Counted::default()
    }
    /// The runs counted, back from the burst with its own added, and how
    /// many events it passed over after them ([`pass_events`](Self::pass_events)).
    fn put_counted(&mut self, counted: Counted, events: u64) {
        let _ = (counted, events);
    }
}

/// How many blocks a pending disable may run through before the branch
/// it binds to, in a burst ([`InsnDecoder::pass_toggles`]); past that the
/// instruction decoder steps.
pub(super) const DISABLE_WALK: usize = 8;

/// The blocks a pending disable runs through (their indices: the walk
/// only takes blocks found without the cache starting over), the last one
/// ending in the branch it binds to.
struct DisableWalk {
    blocks: [u32; DISABLE_WALK],
    len: usize,
}

/// Where a walk to the branch a pending disable binds to goes after
/// block `b` ([`InsnDecoder::walk_to_disable`]).
pub(super) enum WalkStep {
    /// On to this IP: `b` ends in no branch, or in a direct jump or call
    /// that does not go to the disable's IP.
    On(u64),
    /// `b` ends in the branch the disable binds to.
    Binds,
}

/// [`WalkStep`] after block `b`, with the disable's IP `off_at`; `None`
/// for a block the walk cannot take (it needs the instruction decoder).
#[inline]
pub(super) fn disable_walk_step(b: &CachedBlock, off_at: u64) -> Option<WalkStep> {
    Some(match b.flow {
        BlockFlow::Straight => WalkStep::On(b.end.0),
        BlockFlow::Jump | BlockFlow::Call if b.target != off_at => WalkStep::On(b.target),
        BlockFlow::Jump
        | BlockFlow::Call
        | BlockFlow::CondJump
        | BlockFlow::Return
        | BlockFlow::IndirectJump
        | BlockFlow::IndirectCall => WalkStep::Binds,
        BlockFlow::Slow => return None,
    })
}

/// The block execution goes on in after another
/// ([`InsnDecoder::block_after`]).
enum NextBlock {
    /// Found (or built) and linked.
    Found(u32),
    /// Built, after the cache started over: older indices are gone.
    StartedOver(u32),
    /// No block there (the code cannot be decoded).
    Missing,
}

/// Where a burst is after passing over disable/enable pairs
/// ([`InsnDecoder::pass_toggles`]).
struct Toggled {
    /// The IP tracing was enabled at.
    ip: u64,
    /// The last block run (its last instruction the disable's branch).
    last: u32,
    /// `Some`: the burst ends, with this result (as
    /// [`BurstEnd::result`]); the lane is closed.
    result: Option<Result<Status, Error>>,
}

/// A TNT path being recorded ([`BlockCache::begin_path`]).
struct Recording {
    first: u32,
    key: PathKey,
    insns: u64,
    runs: u32,
    /// Return addresses its calls pushed that no return popped yet.
    calls: u32,
    /// TNT bits its blocks used.
    used: u8,
    /// Instructions since the last block that used one.
    tail_insns: u32,
    /// The last block recorded.
    last: u32,
}

impl Recording {
    /// Keeps the blocks recorded so far as a path that stops before
    /// block `next` (at `to`), which it cannot hold: a path that uses
    /// only some of its bits ([`TntPath::used`]). Nothing is kept when
    /// no block was recorded or the next block is not known.
    fn finish_before(self, cache: &mut BlockCache, to: u64, next: u32) {
        if self.runs == 0 || next == NO_BLOCK {
            cache.abandon_path(self.first);
            return;
        }
        self.finish(cache, to, next);
    }

    /// Keeps the blocks recorded as a path ending at `to` (block `next`).
    fn finish(self, cache: &mut BlockCache, to: u64, next: u32) {
        cache.finish_path(
            self.first,
            self.key,
            PathEnd {
                insns: self.insns,
                used: self.used,
                tail_insns: self.tail_insns,
                to: Ip(to),
                last: self.last,
                next,
            },
        );
    }
}

/// How a burst ended.
#[derive(Debug)]
pub(in crate::insn) struct BurstEnd {
    /// The last block run ([`NO_BLOCK`] if none, or if the cache started
    /// over since).
    pub last: u32,
    /// The block starting at the current IP, when known ([`NO_BLOCK`]
    /// otherwise).
    pub next: u32,
    /// `None`: every block ran plainly, the last one's status is
    /// `insn_status(false)` (nothing pending). `Some`: the last block's
    /// answer came with news (an event pending, the end of the trace) and
    /// this is what [`run_block`](InsnDecoder::run_block) would have
    /// returned for it.
    pub result: Option<Result<Status, Error>>,
}

impl<'a, M: ReadMemory> InsnDecoder<'a, M> {
    /// Runs cached blocks one after the other from block `idx` (which
    /// starts at the current IP, in the current address space and mode),
    /// following successor links, until `out` is full or a block would
    /// need more than a TNT bit, a TIP or nothing from the trace. Call
    /// only when [`fast_ready`](Self::fast_ready) and without tick events.
    ///
    /// Each block runs exactly as [`run_block`](Self::run_block) runs it,
    /// but whether it can run is decided before anything moves (the TNT
    /// bit is peeked, the return stack and the TIP checked), so a block
    /// that is not run leaves the decoder untouched for the caller's
    /// slower path. The only block whose answer may bring news (an event
    /// pending, the end of the trace) is the last one: the burst stops
    /// after it, with its result in [`BurstEnd::result`].
    #[inline]
    pub(in crate::insn) fn run_burst(
        &mut self,
        cache: &mut BlockCache,
        idx: u32,
        out: &mut impl RunSink,
        paths: bool,
    ) -> BurstEnd {
        // The IP, the instruction count and the trace offset live in
        // locals while blocks run and are written back whenever anything
        // else may look at them.
        let mut ip = self.ip;
        let mut icount = self.icount;
        let mut offset = self.offset();
        let mut end = BurstEnd {
            last: NO_BLOCK,
            next: idx,
            result: None,
        };
        let plain = Status::default();
        let mut rec: Option<Recording> = None;
        // TNT bits and TIPs come straight from the trace bytes while they
        // are plain; the lane hands the trace back before anything else
        // looks at the query layer.
        let toggles = out.passes_toggles();
        let mut lane = if toggles {
            TraceLane::open_with_toggles(&self.query)
        } else {
            TraceLane::open(&self.query)
        };
        // A sink that only counts lets chains take the commonest steps.
        let chains = paths && out.count_room().is_some();
        loop {
            if chains && rec.is_none() {
                let mut at = ChainAt {
                    ip,
                    icount,
                    offset,
                    last: end.last,
                    next: end.next,
                };
                self.run_chain(cache, &mut lane, out, &mut at);
                (ip, icount, offset, end.last, end.next) =
                    (at.ip, at.icount, at.offset, at.last, at.next);
            }
            if out.is_full() {
                break;
            }
            let start = match cache.get(end.next) {
                Some(b) if paths && rec.is_none() => Some((b.flow, u64::from(b.insns))),
                _ => None,
            };
            if let Some((flow, n)) = start
                && matches!(
                    flow,
                    BlockFlow::CondJump | BlockFlow::Jump | BlockFlow::Straight | BlockFlow::Call
                )
            {
                let (mut bits, mut left) = lane.cached_tnt(&self.query);
                if left == 0
                    && flow == BlockFlow::CondJump
                    && icount.saturating_add(n) <= MAX_UNTRACED_INSNS
                    && lane.load_next_tnt_packet(&mut self.query)
                {
                    // The block will run on the first bit of the next TNT
                    // packet: loaded now (as taking the bit would first),
                    // the whole packet's bits can pick a path.
                    offset = lane.offset(&self.query);
                    (bits, left) = lane.cached_tnt(&self.query);
                }
                if left > 0 {
                    // The bits left lead where they led before: the whole
                    // path at once, if it fits and nothing waits after it
                    // (as the blocks' checks would find, the instruction
                    // limit checked for the path as a whole).
                    match cache.path(end.next, bits, left) {
                        Some((p, runs)) => {
                            // A path that leaves bits cached has nothing
                            // pending after it.
                            let whole = p.is_whole();
                            if out.room() >= runs.len()
                                && out.takes_path_at(offset)
                                && icount.saturating_add(p.insns) <= MAX_UNTRACED_INSNS
                                && (!whole || lane.status_after_cached_tnt(&self.query) == plain)
                            {
                                out.push_path(p, runs, offset);
                                self.replay_stack_ops(cache, p);
                                if whole {
                                    lane.drop_cached_tnt(&mut self.query);
                                    icount = 0;
                                } else {
                                    lane.drop_tnt_bits(&mut self.query, p.used);
                                    icount = if p.used > 0 {
                                        u64::from(p.tail_insns)
                                    } else {
                                        icount + p.insns
                                    };
                                }
                                ip = p.to.0;
                                end.last = p.last;
                                end.next = p.next;
                                continue;
                            }
                        }
                        None => {
                            rec = Some(Recording {
                                first: cache.begin_path(),
                                key: PathKey {
                                    start: end.next,
                                    bits,
                                    left,
                                },
                                insns: 0,
                                runs: 0,
                                calls: 0,
                                used: 0,
                                tail_insns: 0,
                                last: NO_BLOCK,
                            });
                        }
                    }
                }
            }
            let Some(&b) = cache.get(end.next) else {
                break;
            };
            let n = u64::from(b.insns);
            if icount.saturating_add(n) > MAX_UNTRACED_INSNS {
                break;
            }
            let (to, answer) = match b.flow {
                BlockFlow::Straight => (b.end.0, None),
                BlockFlow::Jump => (b.target, None),
                BlockFlow::Call => {
                    // A call to the next instruction (PIC) pushes nothing.
                    if b.target != b.end.0 {
                        self.retstack.push(b.end.0);
                    }
                    (b.target, None)
                }
                BlockFlow::CondJump => {
                    let Some((taken, status)) = lane.next_tnt_bit(&mut self.query, false) else {
                        break;
                    };
                    let to = if taken { b.target } else { b.end.0 };
                    (to, Some(status))
                }
                BlockFlow::Return => {
                    if self.retstack.is_empty() {
                        // A compressed return would fail; an uncompressed
                        // one only needs its TIP.
                        if lane.peek_tnt(&self.query).is_some() {
                            break;
                        }
                        let Some((to, status)) = lane.take_tip(&mut self.query) else {
                            break;
                        };
                        (to, Some(status))
                    } else if let Some((_, status)) = lane.next_tnt_bit(&mut self.query, true) {
                        let Some(to) = self.retstack.pop() else {
                            break;
                        };
                        (to, Some(status))
                    } else if lane.peek_tnt(&self.query).is_some() {
                        // Not taken: a bad compressed return.
                        break;
                    } else {
                        let Some((to, status)) = lane.take_tip(&mut self.query) else {
                            break;
                        };
                        (to, Some(status))
                    }
                }
                BlockFlow::IndirectJump | BlockFlow::IndirectCall => {
                    let Some((to, status)) = lane.take_tip(&mut self.query) else {
                        break;
                    };
                    if b.flow == BlockFlow::IndirectCall {
                        self.retstack.push(b.end.0);
                    }
                    (to, Some(status))
                }
                BlockFlow::Slow => break,
            };
            ip = to;
            end.last = end.next;
            match answer {
                None => icount += n,
                Some(status) if status == plain => {
                    icount = 0;
                    offset = lane.offset(&self.query);
                }
                Some(status) => {
                    if let Some(r) = rec.take() {
                        // The path stops before this block, whose answer
                        // came with news.
                        r.finish_before(cache, b.ip.0, end.last);
                    }
                    // Read before a disable/enable pair is tried: building
                    // blocks for it may start the cache over.
                    let last = cache.last_insn(end.last).copied();
                    if toggles
                        && lane.toggle_next().is_some()
                        && let Some(t) = self.pass_toggles(cache, &mut lane, out, &b, end.last, to)
                    {
                        ip = t.ip;
                        icount = 0;
                        end.last = t.last;
                        if let Some(result) = t.result {
                            end.next = NO_BLOCK;
                            end.result = Some(result);
                            return end;
                        }
                        offset = lane.offset(&self.query);
                        let after = match cache.get(t.last).copied() {
                            Some(tb) => self.block_after(cache, t.last, &tb, ip),
                            None => NextBlock::Missing,
                        };
                        end.next = match after {
                            NextBlock::Found(next) => next,
                            NextBlock::StartedOver(next) => {
                                end.last = NO_BLOCK;
                                next
                            }
                            NextBlock::Missing => {
                                end.last = NO_BLOCK;
                                NO_BLOCK
                            }
                        };
                        continue;
                    }
                    lane.close(&mut self.query);
                    self.ip = ip;
                    let result = match last {
                        Some(last) => self.answered(&b, &last, status),
                        None => Err(self.err(ErrorKind::Internal)),
                    };
                    out.push(&b, self.offset());
                    end.next = b.successor(Ip(to));
                    end.result = Some(result);
                    return end;
                }
            }
            out.push(&b, offset);
            if let Some(r) = &mut rec {
                // A compressed return to a call of the path itself goes
                // where the path went before; one to an earlier call
                // depends on the stack, and ends the recording.
                let own_return = b.flow == BlockFlow::Return && r.calls > 0;
                if (own_return
                    || matches!(
                        b.flow,
                        BlockFlow::Straight
                            | BlockFlow::Jump
                            | BlockFlow::CondJump
                            | BlockFlow::Call
                    ))
                    && r.runs < MAX_PATH_LEN
                {
                    if b.flow == BlockFlow::Call && b.target != b.end.0 {
                        cache.push_path_op(StackOp::Push(b.end.0));
                        r.calls += 1;
                    } else if own_return {
                        cache.push_path_op(StackOp::Pop);
                        r.calls -= 1;
                    }
                    cache.push_path_run(b.as_run());
                    r.insns += n;
                    r.runs += 1;
                    r.last = end.last;
                    if own_return || b.flow == BlockFlow::CondJump {
                        r.used += 1;
                        r.tail_insns = 0;
                    } else {
                        r.tail_insns += b.insns;
                    }
                } else if let Some(r) = rec.take() {
                    // The path stops before this block: a return to a call
                    // made before it, or one block too many.
                    r.finish_before(cache, b.ip.0, end.last);
                }
            }
            // The next block: the successor link if it still starts here,
            // else the cache (decoding the block if new), then linked.
            end.next = match self.block_after(cache, end.last, &b, to) {
                NextBlock::Found(next) => next,
                NextBlock::StartedOver(next) => {
                    // Older indices (and the path being recorded) are gone.
                    end.last = NO_BLOCK;
                    rec = None;
                    next
                }
                NextBlock::Missing => {
                    end.next = NO_BLOCK;
                    break;
                }
            };
            if rec.is_some() && lane.cached_tnt(&self.query).1 == 0 {
                // The bits it started with are used up: the path ends here.
                if let Some(r) = rec.take() {
                    r.finish(cache, ip, end.next);
                }
            }
        }
        if let Some(r) = rec {
            // Stopped before block `end.next` (the burst is full, or that
            // block cannot run here).
            r.finish_before(cache, ip, end.next);
        }
        lane.close(&mut self.query);
        self.ip = ip;
        self.icount = icount;
        end
    }

    /// What TNT path `p`'s blocks do to the return stack, done.
    #[inline(always)]
    pub(super) fn replay_stack_ops(&mut self, cache: &BlockCache, p: &TntPath) {
        replay_ops(&mut self.retstack, cache.path_ops(p));
    }

    /// The block starting at `to`, where execution went after block
    /// `prev` (index `from`): `prev`'s successor link if it still starts
    /// there, else the cache (decoding the block if new), then linked.
    #[inline(always)]
    fn block_after(
        &mut self,
        cache: &mut BlockCache,
        from: u32,
        prev: &CachedBlock,
        to: u64,
    ) -> NextBlock {
        if let Some(found) = cache.linked_or_recent(from, to) {
            return NextBlock::Found(found);
        }
        self.block_unlinked(cache, from, prev, to)
    }

    /// [`block_after`](Self::block_after) when neither `prev`'s link nor
    /// the recent-block table has `to`: the cache (decoding the block if
    /// new), then linked.
    #[inline(never)]
    fn block_unlinked(
        &mut self,
        cache: &mut BlockCache,
        from: u32,
        prev: &CachedBlock,
        to: u64,
    ) -> NextBlock {
        let before = cache.len();
        let space = self.space;
        let mode = prev.mode;
        let found = cache.get_or_build(prev.space, mode, Ip(to), |at| {
            self.decode_insn(space, at, mode)
        });
        match found {
            Ok(found) if cache.len() < before => NextBlock::StartedOver(found),
            Ok(found) => {
                cache.link(from, found);
                NextBlock::Found(found)
            }
            Err(_) => NextBlock::Missing,
        }
    }

    /// The blocks from `at` (where execution went after block `prev`,
    /// index `from`) to the branch a disable to `off_at` binds to, as
    /// `next_insn` would step them with the disable pending: an
    /// instruction that is not a branch, and a direct jump or call that
    /// does not go to `off_at`, are executed as usual; any other branch
    /// is the one tracing stopped at (`at_disabled_event`). `None` when
    /// a block is not plain, ends in a far transfer, cannot be decoded,
    /// or the branch is more than [`DISABLE_WALK`] blocks away: the
    /// instruction decoder steps there.
    fn walk_to_disable(
        &mut self,
        cache: &mut BlockCache,
        mut from: u32,
        mut prev: CachedBlock,
        mut at: u64,
        off_at: u64,
    ) -> Option<DisableWalk> {
        let mut walk = DisableWalk {
            blocks: [NO_BLOCK; DISABLE_WALK],
            len: 0,
        };
        let mut insns = 0u64;
        while walk.len < DISABLE_WALK {
            let NextBlock::Found(idx) = self.block_after(cache, from, &prev, at) else {
                return None;
            };
            let b = *cache.get(idx)?;
            insns += u64::from(b.insns);
            if !b.plain || insns > MAX_UNTRACED_INSNS {
                return None;
            }
            walk.blocks[walk.len] = idx;
            walk.len += 1;
            at = match disable_walk_step(&b, off_at)? {
                WalkStep::On(to) => to,
                WalkStep::Binds => return Some(walk),
            };
            from = idx;
            prev = b;
        }
        None
    }

    /// In a burst, block `b` (index `idx`) just got its answer, and the
    /// lane says a TIP.PGD/TIP.PGE pair comes next
    /// ([`TraceLane::toggle_next`]): execution went to `to`, runs on to
    /// the branch the disable binds to, and goes on where the enable
    /// says. Passes over the pair (and any that follow right after) as
    /// the instruction decoder would step it: `b` and the blocks up to
    /// that branch go into `out`, taken at the offset the decoder reports
    /// while the disable is pending; the two events are counted
    /// ([`RunSink::pass_events`]). `None`: nothing was done (the branch is
    /// not a few plain blocks away, or `out` is full); the caller goes on
    /// as for any other event.
    ///
    /// After the enable, the decoder's state is the one
    /// [`InsnDecoder::event`] leaves after reporting it: the IP there, no
    /// instruction counted, and when the lane has news the status it
    /// says, events looked at by `check_ip_event` (then the burst ends
    /// with the lane closed: [`Toggled::result`]).
    #[allow(
        clippy::too_many_arguments,
        reason = "the burst's own state, passed down to its cold path"
    )]
    fn pass_toggles(
        &mut self,
        cache: &mut BlockCache,
        lane: &mut TraceLane<'a>,
        out: &mut impl RunSink,
        b: &CachedBlock,
        idx: u32,
        to: u64,
    ) -> Option<Toggled> {
        let plain = Status::default();
        let (mut from, mut prev, mut at) = (idx, *b, to);
        let mut passed = false;
        loop {
            let offset = lane.offset(&self.query);
            let walk = match lane.toggle_next() {
                Some((off_at, on_at))
                    if out.takes_path_at(offset)
                        && out.room() > usize::from(!passed) + DISABLE_WALK =>
                {
                    self.walk_to_disable(cache, from, prev, at, off_at)
                        .map(|w| (w, on_at))
                }
                _ => None,
            };
            let Some((walk, on_at)) = walk else {
                if !passed {
                    return None;
                }
                // A pair was passed over and the lane has news: the
                // decoder takes it from here, as after the enable.
                let status = lane.status_after_cached_tnt(&self.query);
                lane.close(&mut self.query);
                self.ip = at;
                self.icount = 0;
                self.status = status;
                let result = self.check_ip_event(None).map_err(|k| self.err(k));
                // An error looking past the enable is the enable's: it is
                // not reported then, only the disable.
                let events = if result.is_ok() { 2 } else { 1 };
                out.pass_events(events, self.offset());
                return Some(Toggled {
                    ip: at,
                    last: from,
                    result: Some(result),
                });
            };
            if passed {
                out.pass_events(2, offset);
            } else {
                out.push(b, offset);
            }
            let blocks = &walk.blocks[..walk.len];
            for (i, &w) in blocks.iter().enumerate() {
                // Found by the walk, and the cache has not changed since.
                let wb = *cache.get(w)?;
                // The branch the disable binds to is not executed; the
                // calls before it push their return address.
                if i + 1 < blocks.len() && wb.flow == BlockFlow::Call && wb.target != wb.end.0 {
                    self.retstack.push(wb.end.0);
                }
                out.push(&wb, offset);
                from = w;
                prev = wb;
            }
            let taken = lane.take_toggle(&mut self.query);
            debug_assert_eq!(taken, Some(on_at));
            at = on_at;
            passed = true;
            let status = lane.status_after_cached_tnt(&self.query);
            if status == plain {
                out.pass_events(2, lane.offset(&self.query));
                self.icount = 0;
                return Some(Toggled {
                    ip: at,
                    last: from,
                    result: None,
                });
            }
        }
    }

    /// The status of a step whose instruction needed nothing from the
    /// trace (what `next_insn` returns with no event pending).
    #[inline]
    pub(in crate::insn) fn plain_status(&self) -> Status {
        self.insn_status(false)
    }
}

/// A TNT path's return stack operations ([`BlockCache::path_ops`]), done
/// to `stack`.
#[inline(always)]
pub(super) fn replay_ops(stack: &mut RetStack, ops: &[StackOp]) {
    for op in ops {
        match *op {
            StackOp::Push(ret) => stack.push(ret),
            StackOp::Pop => {
                stack.pop();
            }
        }
    }
}
