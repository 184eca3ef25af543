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
use crate::event::{EventKind, Status};
use crate::insn::blockcache::CachedBlock;
use crate::insn::cache::Cached;
use crate::insn::classify::InsnClass;
use crate::insn::decoder::Insn;
use hwtrace_packet::ExecMode;
use hwtrace_types::{AddressSpace, Ip, ReadMemory};

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
    ) -> Result<Option<Status>, Error> {
        let n = u64::from(block.insns);
        if self.icount.saturating_add(n) > MAX_UNTRACED_INSNS {
            return Ok(None);
        }
        let d = block.last.decoded;
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
                    return self.took_cached_tnt(block).map(Some);
                }
            }
            (InsnClass::Return, _)
                if !self.query.config().tick_events
                    && self.query.peek_cached_tnt() == Some(true) =>
            {
                if let Some(to) = self.retstack.pop() {
                    self.ip = to;
                    return self.took_cached_tnt(block).map(Some);
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
                    self.icount = 0;
                    self.ip = target;
                    self.status = status;
                    if !status.event_pending {
                        return Ok(Some(self.insn_status(false)));
                    }
                    let insn = self.last_insn(block);
                    return self
                        .check_ip_event(Some((&insn, &d)))
                        .map(Some)
                        .map_err(|k| self.err(k));
                }
            }
            _ => {}
        }
        self.icount += n - 1;
        let insn = self.last_insn(block);
        self.ip = insn.ip;
        self.proceed(&insn, &d).map_err(|k| self.err(k))?;
        self.check_ip_event(Some((&insn, &d)))
            .map(Some)
            .map_err(|k| self.err(k))
    }

    /// The block's last instruction as `next_insn` reports it.
    fn last_insn(&self, block: &CachedBlock) -> Insn {
        let d = block.last.decoded;
        Insn {
            ip: block.last_ip.0,
            size: d.size,
            mode: self.mode,
            class: d.class,
            speculative: self.speculative,
            target: d.target,
            raw: block.last.raw,
        }
    }

    /// After the block's last instruction used the cached TNT bit (the IP
    /// is already where it went): as `cond_branch` and `check_ip_event`.
    #[inline]
    fn took_cached_tnt(&mut self, block: &CachedBlock) -> Result<Status, Error> {
        self.icount = 0;
        self.status = self.query.take_cached_tnt();
        if !self.status.event_pending {
            return Ok(self.insn_status(false));
        }
        let insn = self.last_insn(block);
        let d = block.last.decoded;
        self.check_ip_event(Some((&insn, &d)))
            .map_err(|k| self.err(k))
    }
}
