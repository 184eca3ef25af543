//! `--blocks` without an item per instruction: runs of plain code a
//! runs-keeping decode hands out whole ([`PassedRun`]) are folded into
//! [`Block`](super::shape::Block)s as they are.
//!
//! A run's instructions are executed one after the other and only its
//! last may branch, so whether a block ends after it depends on that one
//! instruction alone; it is decoded again from the code (its bytes are
//! printed with the block, and a direct call or jump, which a block goes
//! on through, is told from an indirect one by its target). Every other
//! step comes as the exact items [`Blocks`](super::Blocks) would fold.

use super::Item;
use super::run_ends::RunFlow;
use super::shape::BlockFold;
use hwtrace_flow::insn::{Insn, read_insn};
use hwtrace_flow::parallel::PassedRun;
use hwtrace_types::{ReadMemory, TraceOffset};
use std::cell::Cell;
use std::collections::VecDeque;

/// Trace bytes whose runs [`RunBlocks`] folds at a time: bounds the
/// blocks it holds whatever the trace (a KiB of compiled code's trace can
/// be two thousand blocks). Well above the 4 KiB before a stretch's end
/// that a decode passes over a run at a time (where a parallel decode
/// would look for a seam): at 4 KiB every run came one at a time, 40%
/// slower on gzip's trace.
const REACH: u64 = 16 << 10;

/// The last instruction of `r`'s run as the instruction decoder reports
/// it (address, bytes, class, size, target), read from `mem` as the
/// decoder read it moments before. Should it read differently now, the
/// run's own class and size are kept, without bytes or target.
fn last_insn<M: ReadMemory>(mem: &M, r: &PassedRun) -> Insn {
    let run = &r.run;
    let mut insn = Insn::empty(run.end_ip.0, run.mode, run.speculative);
    insn.class = run.end_class;
    insn.size = run.end_size;
    if let Some(mode) = run.mode
        && let Ok(c) = read_insn(mem, run.space, run.end_ip, mode)
        && c.decoded.size == run.end_size
        && c.decoded.class == run.end_class
    {
        insn.target = c.decoded.target;
        insn.raw = c.raw;
    }
    insn
}

/// The items of a [`RunFlow`] with instructions folded into blocks; the
/// instructions are added to `insns` (none reaches the caller as an item).
pub struct RunBlocks<'c, F, M> {
    flow: F,
    mem: &'c M,
    fold: BlockFold,
    queued: VecDeque<Item>,
    insns: &'c Cell<u64>,
}

impl<'c, F: RunFlow, M: ReadMemory> RunBlocks<'c, F, M> {
    /// The blocks of `flow`, whose code is in `mem`.
    pub fn new(flow: F, mem: &'c M, insns: &'c Cell<u64>) -> Self {
        Self {
            flow,
            mem,
            fold: BlockFold::default(),
            queued: VecDeque::new(),
            insns,
        }
    }
}

impl<F: RunFlow, M: ReadMemory> Iterator for RunBlocks<'_, F, M> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        loop {
            if let Some(item) = self.queued.pop_front() {
                return Some(item);
            }
            let until = TraceOffset(self.flow.offset().0.saturating_add(REACH));
            let (fold, queued, insns, mem) =
                (&mut self.fold, &mut self.queued, self.insns, self.mem);
            self.flow.visit_runs_until(until, &mut |r| {
                insns.set(insns.get() + u64::from(r.run.insns));
                let last = last_insn(mem, r);
                if let Some(block) = fold.push(r.before.0, r.run.ip.0, r.run.insns, last) {
                    queued.push_back(Item::Block(block));
                }
            });
            if !self.queued.is_empty() {
                continue;
            }
            match self.flow.next_item() {
                Some(Item::Insn { offset, insn }) => {
                    self.insns.set(self.insns.get() + 1);
                    if let Some(block) = self.fold.push(offset, insn.ip, 1, insn) {
                        return Some(Item::Block(block));
                    }
                }
                Some(other) => {
                    return match self.fold.close() {
                        Some(block) => {
                            self.queued.push_back(other);
                            Some(Item::Block(block))
                        }
                        None => Some(other),
                    };
                }
                None => return self.fold.close().map(Item::Block),
            }
        }
    }
}
