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
//!
//! One thread: [`RunPieces`] turns a flow into [`Piece`]s; on several, the
//! workers fill [`PieceBatch`]es. Either way [`PieceBlocks`] folds the
//! pieces, in trace order, into blocks.

use super::Item;
use super::run_ends::RunFlow;
use super::shape::BlockFold;
use hwtrace_flow::insn::{Insn, read_insn};
use hwtrace_flow::parallel::{FlowItem, PassedRun, Sink};
use hwtrace_types::{ReadMemory, TraceOffset};
use std::cell::Cell;
use std::collections::VecDeque;

/// Trace bytes whose runs [`RunPieces`] takes at a time: bounds the pieces
/// it holds whatever the trace (a KiB of compiled code's trace can be two
/// thousand runs). Well above the 4 KiB before a stretch's end that a
/// decode passes over a run at a time (where a parallel decode would look
/// for a seam): at 4 KiB every run came one at a time, 40% slower on
/// gzip's trace.
const REACH: u64 = 16 << 10;

/// A step of the flow as blocks need it.
#[derive(Clone, Copy, Debug)]
pub enum Piece {
    /// An item of the flow (instructions among them are folded one each).
    Item(Item),
    /// A run of `insns` instructions from `ip`, decoded at trace `offset`,
    /// ending with `last`, fully decoded.
    Run {
        offset: u64,
        ip: u64,
        insns: u32,
        last: Insn,
    },
}

impl Piece {
    /// The piece of run `r`, its last instruction read from `mem` as the
    /// decoder read it moments before (address, bytes, class, size,
    /// target). Should it read differently now, the run's own class and
    /// size are kept, without bytes or target.
    fn of_run<M: ReadMemory>(mem: &M, r: &PassedRun) -> Self {
        let run = &r.run;
        let mut last = Insn::empty(run.end_ip.0, run.mode, run.speculative);
        last.class = run.end_class;
        last.size = run.end_size;
        if let Some(mode) = run.mode
            && let Ok(c) = read_insn(mem, run.space, run.end_ip, mode)
            && c.decoded.size == run.end_size
            && c.decoded.class == run.end_class
        {
            last.target = c.decoded.target;
            last.raw = c.raw;
        }
        Self::Run {
            offset: r.before.0,
            ip: run.ip.0,
            insns: run.insns,
            last,
        }
    }
}

/// The pieces of a [`RunFlow`] on one thread: runs it passes over whole,
/// items otherwise.
pub struct RunPieces<'m, F, M> {
    flow: F,
    mem: &'m M,
    queued: VecDeque<Piece>,
}

impl<'m, F: RunFlow, M: ReadMemory> RunPieces<'m, F, M> {
    /// The pieces of `flow`, whose code is in `mem`.
    pub fn new(flow: F, mem: &'m M) -> Self {
        Self {
            flow,
            mem,
            queued: VecDeque::new(),
        }
    }
}

impl<F: RunFlow, M: ReadMemory> Iterator for RunPieces<'_, F, M> {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if let Some(piece) = self.queued.pop_front() {
            return Some(piece);
        }
        let until = TraceOffset(self.flow.offset().0.saturating_add(REACH));
        let (queued, mem) = (&mut self.queued, self.mem);
        self.flow.visit_runs_until(until, &mut |r| {
            queued.push_back(Piece::of_run(mem, r));
        });
        match self.queued.pop_front() {
            Some(piece) => Some(piece),
            None => self.flow.next_item().map(Piece::Item),
        }
    }
}

/// A parallel decode's stretch of pieces: what the workers hand the
/// printing thread for `--blocks` (the last instruction of each run read
/// by the worker).
pub struct PieceBatch<'m, M> {
    mem: &'m M,
    /// The pieces, in trace order.
    pub pieces: Vec<Piece>,
}

impl<'m, M> PieceBatch<'m, M> {
    /// An empty batch with room for `n` pieces, reading code from `mem`.
    pub fn with_capacity(mem: &'m M, n: usize) -> Self {
        Self {
            mem,
            pieces: Vec::with_capacity(n),
        }
    }
}

impl<M: ReadMemory + Sync> Sink for PieceBatch<'_, M> {
    fn push(&mut self, item: FlowItem) {
        self.pieces.push(Piece::Item(Item::from(item)));
    }

    fn keeps_runs(&self) -> bool {
        true
    }

    fn push_run(&mut self, run: &PassedRun) {
        self.pieces.push(Piece::of_run(self.mem, run));
    }
}

/// Pieces folded into blocks; other items pass through, each ending the
/// block before it. The instructions are added to `insns` (none reaches
/// the caller as an item).
pub struct PieceBlocks<'c, I> {
    inner: I,
    fold: BlockFold,
    queued: Option<Item>,
    insns: &'c Cell<u64>,
}

impl<'c, I: Iterator<Item = Piece>> PieceBlocks<'c, I> {
    /// The blocks of `inner`'s pieces.
    pub fn new(inner: I, insns: &'c Cell<u64>) -> Self {
        Self {
            inner,
            fold: BlockFold::default(),
            queued: None,
            insns,
        }
    }
}

impl<I: Iterator<Item = Piece>> Iterator for PieceBlocks<'_, I> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        if let Some(item) = self.queued.take() {
            return Some(item);
        }
        loop {
            let (offset, ip, insns, last) = match self.inner.next() {
                Some(Piece::Run {
                    offset,
                    ip,
                    insns,
                    last,
                }) => (offset, ip, insns, last),
                Some(Piece::Item(Item::Insn { offset, insn })) => (offset, insn.ip, 1, insn),
                Some(Piece::Item(other)) => {
                    let (now, after) = self.fold.end_with(other);
                    self.queued = after;
                    return Some(now);
                }
                None => return self.fold.close().map(Item::Block),
            };
            self.insns.set(self.insns.get() + u64::from(insns));
            if let Some(block) = self.fold.push(offset, ip, insns, last) {
                return Some(Item::Block(block));
            }
        }
    }
}
