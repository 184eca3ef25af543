//! Basic blocks and edges with hit counts, from the [`Exec`] stream, and
//! the files coverage tools load: drcov ([`drcov`]), lcov ([`lcov`]), an
//! AFL-style edge bitmap ([`afl`]) and JSON ([`json`]); libxdc's bitmap
//! straight from raw Intel PT for fuzzers ([`libxdc`]).
//!
//! **Blocks.** A block is a run of instructions executed one after the
//! other that ends at the first control-transfer instruction (any branch,
//! call, return, far transfer or undecodable instruction; a direct jump
//! or call ends a block too), as DynamoRIO's basic blocks (what drcov
//! files hold) end. A block therefore starts after a control transfer,
//! after a break in the flow, or where the next instruction is not the
//! fall-through of the previous one (an interrupt). This is simpler to
//! check against a recorded execution than libipt's block decoder
//! (which follows direct branches), and all blocks starting at one
//! address have one end, except where a gap cut one short. Blocks are
//! keyed by address space, start and end.
//!
//! **Edges** join each block to the block executed next in the same
//! thread and address space: taken branches, fall-throughs, calls,
//! returns. Where tracing was only switched off (a system call with
//! user-mode tracing, the end of a perf.data AUX buffer) the edge spans
//! the gap, as the program's own flow does; where data was lost
//! (overflow, decode error, lost AUX data) no edge is guessed.
//!
//! **Branch-only input** (BTS, LBR): the block between two recorded
//! branches runs from the first one's target up to and including the
//! second one's source (its size counts one byte of the branch
//! instruction, whose length the records do not give).

pub mod afl;
pub mod drcov;
pub mod json;
pub mod lcov;
pub mod libxdc;
mod part;

pub use part::CoveragePart;

use crate::exec::{Exec, ExecRun, GapKind};
use crate::symbols::Space;
use hwtrace_flow::insn::InsnClass;
use hwtrace_types::hash::BuildIntHasher;
use hwtrace_types::{Cr3, Ip};
use std::collections::HashMap;

/// Branch-only input: two consecutive records further apart than this
/// are not one straight-line block (records were lost in between).
pub const MAX_BRANCH_BLOCK: u64 = 1 << 20;

/// One basic block with how often it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Its address space.
    pub space: Space,
    /// Its first byte.
    pub start: Ip,
    /// One past its last byte.
    pub end: Ip,
    /// Its last instruction (the control transfer that ends it).
    pub last: Ip,
    /// That instruction's class (a branch record's class for branch-only
    /// input): which edges out of the block an AFL map counts
    /// ([`afl::AflEdges`]).
    pub last_class: InsnClass,
    /// Its instructions (0 for branch-only input: unknown).
    pub insns: u32,
    /// How many times it ran.
    pub hits: u64,
}

/// Block-to-block transfers with counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    /// Index of the block it leaves.
    pub from: u32,
    /// Index of the block it enters.
    pub to: u32,
    /// How many times.
    pub hits: u64,
    /// Of `hits`, how many times the block's conditional branch switched
    /// tracing off (its target left the IP filter: no TNT bit, a TIP.PGD
    /// without an address) and the flow went on where tracing came back:
    /// libxdc's map does not count those ([`afl::bitmap`]).
    pub left_filter: u64,
}

/// The coverage of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Every block, sorted by space and start.
    pub blocks: Vec<Block>,
    /// Every edge, sorted by (from, to).
    pub edges: Vec<Edge>,
    /// Instructions seen.
    pub insns: u64,
}

/// The block being built.
#[derive(Clone, Copy, Debug)]
struct Open {
    space: Space,
    start: Ip,
    end: Ip,
    last: Ip,
    last_class: InsnClass,
    insns: u32,
}

/// Whose flow a block belongs to: edges only join blocks of one chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Chain {
    tid: Option<u32>,
    cpu: Option<u32>,
    space: Space,
}

/// A transfer seen before: from block `from` into the block of `len`
/// bytes at `start` (in `from`'s space: edges stay in one chain), which
/// is block `to`, counted in edge `edge`; `hits` more times than the
/// block and edge say (added to theirs when the slot is reused, and at
/// the end), so that a hit touches this slot alone.
#[derive(Clone, Copy, Debug)]
struct Seen {
    start: u64,
    hits: u64,
    from: u32,
    len: u32,
    to: u32,
    edge: u32,
}

/// A slot no transfer is kept in.
const NOT_SEEN: Seen = Seen {
    start: 0,
    hits: 0,
    from: u32::MAX,
    len: 0,
    to: 0,
    edge: 0,
};

/// Slots of [`CoverageBuilder`]'s memo of transfers: more than the
/// distinct edges of most programs' hot code, few enough to stay in the
/// processor's second-level cache (32 bytes each).
const SEEN_SLOTS: usize = 1 << 13;

/// Folds [`Exec`] records into [`Coverage`]; memory grows with the
/// number of distinct blocks and edges, not with the trace.
///
/// Most records are runs that make a block of their own, entered from
/// the block before on the same chain along an edge seen before: those
/// are counted in a direct-mapped memo of transfers (`seen`), one slot
/// compared and its counter added to, without building the block,
/// hashing its key or touching the block and edge (random accesses that
/// missed the cache: a third of the builder's time before). Everything
/// else (the first time a transfer is seen, runs that end inside a
/// block, thread switches, gaps) goes the general way, which fills the
/// memo.
#[derive(Debug)]
pub struct CoverageBuilder {
    blocks: Vec<Block>,
    ids: HashMap<(Space, u64, u64), u32, BuildIntHasher>,
    /// Each block's first two successors (most blocks have no more: one
    /// lookup in the block's own slot per edge) with their edge's index
    /// in `edge_list`, by block id; the rest in `edges`.
    succ: Vec<[(u32, u32); 2]>,
    edges: HashMap<(u32, u32), u32, BuildIntHasher>,
    /// Every edge seen: its blocks and hits.
    edge_list: Vec<Edge>,
    /// The memo of transfers, indexed by a hash of `from` and `start`
    /// (empty until the first edge).
    seen: Vec<Seen>,
    open: Option<Open>,
    /// The last block of each chain, but the current one's, which is
    /// `last` (consecutive blocks are mostly on one chain).
    prev: HashMap<Chain, u32, BuildIntHasher>,
    last: Option<(Chain, u32)>,
    /// How `last` ended as it ran: its last instruction's class (a block's
    /// stored class is its first run's).
    last_ended: InsnClass,
    /// `last`'s block and CR3 while `last` is on the current thread's
    /// chains (`u32::MAX`: it is not, or there is none): a block in that
    /// CR3 goes on `last`'s chain.
    here: (u32, Option<Cr3>),
    pid: Option<u32>,
    tid: Option<u32>,
    cpu: Option<u32>,
    /// Branch-only input: where the last branch went.
    branch_to: Option<(Space, Ip)>,
    insns: u64,
    /// Whether the general way fills the memo (tests turn it off to
    /// compare).
    memo: bool,
    /// A chain's last block whose conditional branch switched tracing off
    /// (a [`GapKind::Disabled`] right after it): the edge out of it is
    /// counted in [`Edge::left_filter`] too.
    left_filter: Option<(Chain, u32)>,
    /// A part's builder ([`CoveragePart`]): what it read of the state
    /// before the part, to be resolved when it is merged (`None`: the
    /// builder saw the stream from its start).
    past: Option<Box<part::Past>>,
}

/// The memo slot of the transfer from block `from` to a block starting
/// at `start`.
#[inline]
fn seen_slot(from: u32, start: u64) -> usize {
    let h = (start ^ u64::from(from).rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> (64 - SEEN_SLOTS.trailing_zeros())) as usize
}

impl Default for CoverageBuilder {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether an instruction of `class` ends a block.
fn ends_block(class: InsnClass) -> bool {
    !matches!(class, InsnClass::Other | InsnClass::Ptwrite)
}

impl CoverageBuilder {
    /// No coverage yet.
    pub fn new() -> Self {
        Self {
            blocks: Vec::new(),
            ids: HashMap::default(),
            succ: Vec::new(),
            edges: HashMap::default(),
            edge_list: Vec::new(),
            seen: Vec::new(),
            open: None,
            prev: HashMap::default(),
            last: None,
            last_ended: InsnClass::Unknown,
            here: (u32::MAX, None),
            pid: None,
            tid: None,
            cpu: None,
            branch_to: None,
            insns: 0,
            memo: true,
            left_filter: None,
            past: None,
        }
    }

    /// Instructions in a row (their last may end the block).
    #[inline]
    fn run(&mut self, r: &ExecRun) {
        let end = r.last_ip.0.wrapping_add(u64::from(r.last_size));
        if self.open.is_none()
            && (ends_block(r.last_class) || r.last_size == 0)
            && self.count_seen(r.space.cr3, r.ip.0, end)
        {
            self.insns += u64::from(r.insns);
            self.last_ended = r.last_class;
        } else {
            self.run_general(r);
        }
    }

    /// [`CoverageBuilder::run`] when the memo does not know the run: kept
    /// out of line, so that the memo's path stays short.
    #[inline(never)]
    fn run_general(&mut self, r: &ExecRun) {
        self.insns += u64::from(r.insns);
        let end = Ip(r.last_ip.0.wrapping_add(u64::from(r.last_size)));
        let whole = ends_block(r.last_class) || r.last_size == 0;
        let space = Space {
            pid: self.pid,
            cr3: r.space.cr3,
        };
        match &mut self.open {
            Some(open) if open.space == space && open.end == r.ip => {
                open.end = end;
                open.last = r.last_ip;
                open.last_class = r.last_class;
                open.insns = open.insns.saturating_add(r.insns);
            }
            _ => {
                self.close();
                self.open = Some(Open {
                    space,
                    start: r.ip,
                    end,
                    last: r.last_ip,
                    last_class: r.last_class,
                    insns: r.insns,
                });
            }
        }
        if whole {
            self.close();
        }
    }

    /// A block of its own from `start` to `end` in CR3 `cr3`: counted if
    /// the current chain's last block went there before (the memo knows
    /// the transfer), otherwise left to the general way.
    #[inline(always)]
    fn count_seen(&mut self, cr3: Option<Cr3>, start: u64, end: u64) -> bool {
        let from = self.here.0;
        if from == u32::MAX || self.here.1 != cr3 {
            return false;
        }
        let Some(seen) = self.seen.get_mut(seen_slot(from, start)) else {
            return false;
        };
        if seen.from != from
            || seen.start != start
            || u64::from(seen.len) != end.wrapping_sub(start)
        {
            return false;
        }
        seen.hits += 1;
        self.here.0 = seen.to;
        if let Some((_, last)) = &mut self.last {
            *last = seen.to;
        }
        true
    }

    /// Adds the hits a memo slot holds to its block and edge.
    fn flush_seen(blocks: &mut [Block], edges: &mut [Edge], seen: &mut Seen) {
        if seen.from == u32::MAX || seen.hits == 0 {
            return;
        }
        if let Some(block) = blocks.get_mut(seen.to as usize) {
            block.hits += seen.hits;
        }
        if let Some(edge) = edges.get_mut(seen.edge as usize) {
            edge.hits += seen.hits;
        }
        seen.hits = 0;
    }

    /// Adds the hits every memo slot holds to their blocks and edges.
    fn flush_memo(&mut self) {
        for seen in &mut self.seen {
            Self::flush_seen(&mut self.blocks, &mut self.edge_list, seen);
        }
    }

    /// Takes one record.
    #[inline]
    pub fn push(&mut self, exec: &Exec) {
        // A run is read in place, field by field: copied whole, its last
        // word's load would straddle the narrower stores that wrote it
        // just before and wait for them.
        if let Exec::Run(r) = exec {
            return self.run(r);
        }
        match *exec {
            Exec::Insn(i) => self.run(&ExecRun::from(i)),
            Exec::Run(r) => self.run(&r),
            Exec::Branch { from, to, class } => {
                let space = Space {
                    pid: self.pid,
                    cr3: None,
                };
                match self.branch_to {
                    Some((s, start))
                        if s == space && from.0.wrapping_sub(start.0) < MAX_BRANCH_BLOCK =>
                    {
                        self.open = Some(Open {
                            space,
                            start,
                            end: Ip(from.0 + 1),
                            last: from,
                            last_class: class,
                            insns: 0,
                        });
                        self.close();
                    }
                    Some(_) => {
                        let chain = self.chain(space);
                        self.park_last();
                        self.prev.remove(&chain);
                    }
                    None => {}
                }
                self.branch_to = Some((space, to));
            }
            Exec::Gap { why, .. } => {
                self.break_flow(!why.flow_goes_on());
                if why == GapKind::Disabled {
                    self.note_left_filter();
                }
            }
            // Blocks joined without their edges: a source hands these out
            // only for the call structure ([`Detail::Calls`]), never to
            // coverage; were one given, its blocks are unknown, as if lost.
            Exec::Stretch(_) => self.break_flow(true),
            Exec::Thread { pid, tid, cpu } => {
                self.close();
                self.here.0 = u32::MAX;
                self.branch_to = None;
                self.pid = pid;
                self.tid = tid;
                self.cpu = cpu;
            }
            Exec::Time(_) => {}
        }
    }

    /// Tracing was switched off by a branch, after the current chain's
    /// last block: when that block ended in a conditional branch as it ran
    /// (its class as stored is its first run's, which a part built apart
    /// may not have seen), the
    /// branch left the IP filter (a conditional branch writes a TNT bit
    /// when it stays in, and nothing stops tracing between it and the next
    /// instruction but an asynchronous event, [`GapKind::Interrupted`]).
    /// The edge out of it goes the general way, where it is marked.
    fn note_left_filter(&mut self) {
        if let Some((chain, id)) = self.last
            && self.last_ended == InsnClass::CondJump
        {
            self.left_filter = Some((chain, id));
            self.here.0 = u32::MAX;
            if let Some(past) = &mut self.past {
                past.left_filter_known();
            }
        } else if let Some(past) = &mut self.past
            && past.last_is_past()
        {
            // The last block is the one before the part: whether it ends
            // in a conditional branch is known when merging.
            past.left_filter_after_past_last();
            self.here.0 = u32::MAX;
        }
    }

    /// The flow does not go on from the open block; `lost`: nor from
    /// anything before (data was lost, what runs next is not known to
    /// follow).
    fn break_flow(&mut self, lost: bool) {
        let space = self.open.map(|o| o.space);
        self.close();
        self.branch_to = None;
        if lost {
            let cpu = self.cpu;
            let tid = self.tid;
            self.park_last();
            self.prev.retain(|c, _| {
                !(c.tid == tid && c.cpu == cpu && space.is_none_or(|s| s == c.space))
            });
            if let Some(past) = &mut self.past {
                past.drop_chains(space);
            }
        }
    }

    fn chain(&self, space: Space) -> Chain {
        Chain {
            tid: self.tid,
            cpu: self.cpu,
            space,
        }
    }

    /// Ends the open block: counts it and the edge into it.
    fn close(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let chain = self.chain(open.space);
        let prev = match self.last {
            Some((c, prev)) if c == chain => Some(prev),
            _ => {
                self.park_last();
                self.prev.remove(&chain)
            }
        };
        // A part's first block on a chain it has not dropped: the edge
        // into it comes from the chain's block before the part.
        let from_past = prev.is_none() && self.past.as_ref().is_some_and(|p| p.first_touch(chain));
        // Mostly a block the previous one went to before: found among its
        // successors without hashing.
        let is_open =
            |b: &Block| b.start == open.start && b.end == open.end && b.space == open.space;
        let known = prev.and_then(|p| self.succ.get(p as usize)).and_then(|s| {
            s.iter()
                .map(|&(to, _)| to)
                .find(|&to| self.blocks.get(to as usize).is_some_and(is_open))
        });
        let id = match known {
            Some(id) => id,
            None => self.block_id(Block {
                space: open.space,
                start: open.start,
                end: open.end,
                last: open.last,
                last_class: open.last_class,
                insns: open.insns,
                hits: 0,
            }),
        };
        let Some(block) = self.blocks.get_mut(id as usize) else {
            return;
        };
        block.hits += 1;
        self.last = Some((chain, id));
        self.last_ended = open.last_class;
        self.here = (id, open.space.cr3);
        let left_filter = match self.left_filter {
            Some((c, from)) if c == chain => {
                self.left_filter = None;
                Some(from)
            }
            _ => None,
        };
        let edge = prev.map(|prev| self.count_edge(prev, id));
        if let Some(past) = &mut self.past {
            past.closed(chain, id, prev, from_past, edge);
        }
        if let (Some(prev), Some(edge)) = (prev, edge) {
            if left_filter == Some(prev)
                && let Some(e) = self.edge_list.get_mut(edge as usize)
            {
                e.left_filter += 1;
            }
            if !self.memo {
                return;
            }
            let Ok(len) = u32::try_from(open.end.0.wrapping_sub(open.start.0)) else {
                return;
            };
            if self.seen.is_empty() {
                self.seen = vec![NOT_SEEN; SEEN_SLOTS];
            }
            if let Some(slot) = self.seen.get_mut(seen_slot(prev, open.start.0)) {
                Self::flush_seen(&mut self.blocks, &mut self.edge_list, slot);
                *slot = Seen {
                    start: open.start.0,
                    hits: 0,
                    from: prev,
                    len,
                    to: id,
                    edge,
                };
            }
        }
    }

    /// The id of the block `b` is (by space, start and end), added with
    /// no hits if new.
    fn block_id(&mut self, b: Block) -> u32 {
        let key = (b.space, b.start.0, b.end.0);
        let next = u32::try_from(self.blocks.len()).unwrap_or(u32::MAX);
        let id = *self.ids.entry(key).or_insert(next);
        if id == next {
            self.blocks.push(Block { hits: 0, ..b });
        }
        id
    }

    /// Puts the current chain's last block back among the others'.
    fn park_last(&mut self) {
        self.here.0 = u32::MAX;
        if let Some((chain, id)) = self.last.take() {
            self.prev.insert(chain, id);
        }
        if let Some(past) = &mut self.past {
            past.last_parked();
        }
    }

    /// One more time from block `from` to block `to`: the edge's index in
    /// `edge_list`.
    fn count_edge(&mut self, from: u32, to: u32) -> u32 {
        let index = self.edge_index(from, to);
        if let Some(edge) = self.edge_list.get_mut(index as usize) {
            edge.hits += 1;
        }
        index
    }

    /// The index in `edge_list` of the edge from block `from` to block
    /// `to` (added, with no hits, if new).
    fn edge_index(&mut self, from: u32, to: u32) -> u32 {
        let i = from as usize;
        if self.succ.len() <= i {
            self.succ.resize(i + 1, [(u32::MAX, 0); 2]);
        }
        let next = u32::try_from(self.edge_list.len()).unwrap_or(u32::MAX);
        let mut index = None;
        for slot in &mut self.succ[i] {
            if slot.0 == to {
                index = Some(slot.1);
                break;
            }
            if slot.0 == u32::MAX {
                *slot = (to, next);
                break;
            }
        }
        let index = index.unwrap_or_else(|| *self.edges.entry((from, to)).or_insert(next));
        if index == next {
            self.edge_list.push(Edge {
                from,
                to,
                hits: 0,
                left_filter: 0,
            });
        }
        index
    }

    /// The coverage so far (the open block counted).
    pub fn finish(mut self) -> Coverage {
        self.close();
        self.flush_memo();
        // Sort blocks by (space, start, end) and renumber the edges.
        let mut order: Vec<u32> = (0..self.blocks.len() as u32).collect();
        order.sort_by_key(|&i| {
            let b = &self.blocks[i as usize];
            (b.space, b.start, b.end)
        });
        let mut new_id = vec![0u32; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old as usize] = new as u32;
        }
        let blocks = order.iter().map(|&i| self.blocks[i as usize]).collect();
        let mut edges: Vec<Edge> = self
            .edge_list
            .iter()
            .map(|e| Edge {
                from: new_id[e.from as usize],
                to: new_id[e.to as usize],
                ..*e
            })
            .collect();
        edges.sort_by_key(|e| (e.from, e.to));
        Coverage {
            blocks,
            edges,
            insns: self.insns,
        }
    }
}

impl Coverage {
    /// Builds the coverage of a whole stream.
    pub fn from_execs<'a>(execs: impl IntoIterator<Item = &'a Exec>) -> Self {
        let mut b = CoverageBuilder::new();
        for e in execs {
            b.push(e);
        }
        b.finish()
    }
}

#[cfg(test)]
mod tests;
