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

use super::{InsnDecoder, MAX_UNTRACED_INSNS};
use crate::error::{Error, ErrorKind};
use crate::event::{EventKind, Status, TraceLane};
use crate::insn::blockcache::{
    BlockCache, BlockFlow, CachedBlock, MAX_PATH_LEN, NO_BLOCK, PathRun, StackOp, TntPath,
};
use crate::insn::cache::Cached;
use crate::insn::classify::InsnClass;
use crate::insn::decoder::Insn;
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
}

/// A TNT path being recorded ([`BlockCache::begin_path`]).
struct Recording {
    first: u32,
    start: u32,
    bits: u64,
    left: u8,
    insns: u64,
    runs: u32,
    /// Return addresses its calls pushed that no return popped yet.
    calls: u32,
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

impl<M: ReadMemory> InsnDecoder<'_, M> {
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
        let mut lane = TraceLane::open(&self.query);
        loop {
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
                            if out.room() >= runs.len()
                                && out.takes_path_at(offset)
                                && icount.saturating_add(p.insns) <= MAX_UNTRACED_INSNS
                                && lane.status_after_cached_tnt(&self.query) == plain
                            {
                                out.push_path(p, runs, offset);
                                for op in cache.path_ops(p) {
                                    match *op {
                                        StackOp::Push(ret) => self.retstack.push(ret),
                                        StackOp::Pop => {
                                            self.retstack.pop();
                                        }
                                    }
                                }
                                lane.drop_cached_tnt(&mut self.query);
                                icount = 0;
                                ip = p.to.0;
                                end.last = p.last;
                                end.next = p.next;
                                continue;
                            }
                        }
                        None => {
                            rec = Some(Recording {
                                first: cache.begin_path(),
                                start: end.next,
                                bits,
                                left,
                                insns: 0,
                                runs: 0,
                                calls: 0,
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
                        cache.abandon_path(r.first);
                    }
                    lane.close(&mut self.query);
                    self.ip = ip;
                    let result = match cache.last_insn(end.last).copied() {
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
                } else {
                    cache.abandon_path(r.first);
                    rec = None;
                }
            }
            // The next block: the successor link if it still starts here,
            // else the cache (decoding the block if new), then linked.
            let linked = b.successor(Ip(to));
            end.next = match cache.get(linked) {
                Some(c) if c.ip.0 == to && c.space == b.space && c.mode == b.mode => linked,
                _ => {
                    let before = cache.len();
                    let space = self.space;
                    let found = cache.get_or_build(b.space, b.mode, Ip(to), |at| {
                        self.decode_insn(space, at, b.mode)
                    });
                    let Ok(found) = found else {
                        end.next = NO_BLOCK;
                        break;
                    };
                    if cache.len() < before {
                        // The cache started over: older indices (and the
                        // path being recorded) are gone.
                        end.last = NO_BLOCK;
                        rec = None;
                    } else {
                        cache.link(end.last, found);
                    }
                    found
                }
            };
            if let Some(r) = &rec
                && lane.cached_tnt(&self.query).1 == 0
            {
                // The bits it started with are used up: the path ends here.
                cache.finish_path(
                    r.first,
                    r.start,
                    r.bits,
                    r.left,
                    r.insns,
                    Ip(ip),
                    end.last,
                    end.next,
                );
                rec = None;
            }
        }
        if let Some(r) = rec {
            cache.abandon_path(r.first);
        }
        lane.close(&mut self.query);
        self.ip = ip;
        self.icount = icount;
        end
    }

    /// The status of a step whose instruction needed nothing from the
    /// trace (what `next_insn` returns with no event pending).
    #[inline]
    pub(in crate::insn) fn plain_status(&self) -> Status {
        self.insn_status(false)
    }
}
