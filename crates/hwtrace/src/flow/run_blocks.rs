//! `--blocks` without an item per instruction: runs of plain code a
//! runs-keeping decode hands out whole ([`PassedRun`]) become
//! [`Piece::Run`]s, which [`Blocks`](super::Blocks) folds as they are.
//!
//! A run's instructions are executed one after the other and only its
//! last may branch, so whether a block ends after it depends on that one
//! instruction alone. Its class comes with the run; a direct call or jump
//! (which a block goes on through) is told from an indirect one by its
//! target, and a printed block shows its last instruction's bytes: for
//! those the instruction is read again from the code, and only for those.
//!
//! One thread: [`RunPieces`] (a [`RunSteps`] over a flow); on several, the
//! workers fill [`PieceBatch`]es.

use super::Item;
use super::run_ends::{RunStep, RunSteps};
use super::shape::Piece;
use hwtrace_flow::insn::{InsnClass, read_insn};
use hwtrace_flow::parallel::{FlowItem, PassedRun, Sink};
use hwtrace_types::ReadMemory;
use std::collections::VecDeque;

impl From<Item> for Piece {
    fn from(item: Item) -> Self {
        Self::Item(item)
    }
}

/// Runs as [`Piece::Run`]s, their last instruction read from `mem` where
/// it is needed (see the module documentation).
pub struct RunPiece<'m, M> {
    mem: &'m M,
    /// The blocks are printed with their last instruction's bytes.
    bytes: bool,
}

impl<'m, M: ReadMemory> RunPiece<'m, M> {
    /// Pieces of runs whose code is in `mem`; `bytes`: the blocks'
    /// last instructions are printed (disassembled).
    pub fn new(mem: &'m M, bytes: bool) -> Self {
        Self { mem, bytes }
    }

    /// The piece of run `r`: its last instruction as the decoder read it
    /// moments before (address, class, size, and where needed bytes and
    /// target). Should it read differently now, the run's own class and
    /// size are kept, without bytes or target.
    fn of(&self, r: &PassedRun) -> Piece {
        let run = &r.run;
        let mut last = run.last_insn();
        let needed = self.bytes || matches!(run.end_class, InsnClass::Call | InsnClass::Jump);
        if needed
            && let Some(mode) = run.mode
            && let Ok(c) = read_insn(self.mem, run.space, run.end_ip, mode)
            && c.decoded.size == run.end_size
            && c.decoded.class == run.end_class
        {
            last.target = c.decoded.target;
            last.raw = c.raw;
        }
        Piece::Run {
            offset: r.before.0,
            ip: run.ip.0,
            insns: run.insns,
            last,
        }
    }
}

impl<M: ReadMemory> RunStep<Piece> for RunPiece<'_, M> {
    fn run(&mut self, r: &PassedRun, out: &mut VecDeque<Piece>) {
        out.push_back(self.of(r));
    }
}

/// The pieces of a [`RunFlow`](super::RunFlow) on one thread: runs it
/// passes over whole, items otherwise.
pub type RunPieces<'m, F, M> = RunSteps<F, Piece, RunPiece<'m, M>>;

/// A parallel decode's stretch of pieces: what the workers hand the
/// printing thread for `--blocks` (each run's last instruction read by
/// the worker).
pub struct PieceBatch<'m, M> {
    per_run: RunPiece<'m, M>,
    /// The pieces, in trace order.
    pub pieces: Vec<Piece>,
}

impl<'m, M: ReadMemory> PieceBatch<'m, M> {
    /// An empty batch with room for `n` pieces, runs made by `per_run`.
    pub fn with_capacity(per_run: RunPiece<'m, M>, n: usize) -> Self {
        Self {
            per_run,
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
        self.pieces.push(self.per_run.of(run));
    }
}
