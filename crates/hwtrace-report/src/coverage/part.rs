//! Coverage built in parts: a stream cut into stretches, each stretch's
//! coverage built on a thread of its own ([`CoveragePart`]), the parts
//! merged in stream order into one [`CoverageBuilder`] with a result
//! identical to one builder taking every record.
//!
//! A builder carries state from record to record: the block being built,
//! each chain's last block (the edge into the next one comes from it) and
//! the block whose conditional branch left the IP filter. A part does not
//! know that state at its start, so it keeps
//!
//! - its *head*: the records up to the first one that ends a block or
//!   breaks the flow (before it, a run may go on with the block the
//!   stretch before left open), replayed into the merged builder;
//! - after the head, what a builder would have read of the state before
//!   the part, in order ([`Past`]): the first block it closes on each
//!   chain (its edge comes from that chain's block before the part), the
//!   chains lost data dropped before it closed a block on them, and, while
//!   the left-filter mark is not its own, the first close on each chain
//!   (the one that may take the mark).
//!
//! Merging replays the head, maps the part's blocks and edges onto the
//! merged ones (by block key), resolves what the part read of the past
//! against the merged builder's state, and hands the part's state on.
//!
//! Parts are for streams without thread records (a raw trace's): a part's
//! blocks are keyed with the builder's process at the start of the stream.

use super::{Chain, CoverageBuilder, Exec, InsnClass, ends_block};
use crate::symbols::Space;
use hwtrace_types::hash::BuildIntHasher;
use std::collections::HashSet;

/// What the left-filter mark was, while the part has not set its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PastFilter {
    /// The mark before the part.
    Before,
    /// The block before the part, if it ends in a conditional branch
    /// (tracing was switched off right after it), else the mark before.
    LastIfConditional,
}

/// Where the edge into a part's first block on a chain comes from.
#[derive(Clone, Copy, Debug)]
enum Prev {
    /// A block of the part.
    Part(u32),
    /// The chain's block before the part.
    Before,
    /// None (no block, or dropped).
    None,
}

/// An edge a close counted: the part's own, or one from before the part
/// (an index into [`Past::entries`]).
#[derive(Clone, Copy, Debug)]
enum EdgeRef {
    Part(u32),
    Entry(usize),
    None,
}

/// A close that may have taken the left-filter mark from before the part.
#[derive(Clone, Copy, Debug)]
struct FilterUse {
    chain: Chain,
    prev: Prev,
    edge: EdgeRef,
}

/// What a part's builder read of the state before the part.
#[derive(Debug)]
pub(super) struct Past {
    /// The builder's last block is still the one before the part.
    last_is_past: bool,
    /// What the left-filter mark was before the part set its own (it
    /// changes only before the part's first close, and the closes that may
    /// take it come after).
    filter: PastFilter,
    /// The part set its own mark: the one before does not last past it.
    own_filter: bool,
    /// Chains the part closed a block on.
    touched: HashSet<Chain, BuildIntHasher>,
    /// Lost data dropped every chain's last block (of the stream's thread),
    /// or those of these spaces.
    dropped_all: bool,
    dropped: Vec<Space>,
    /// The first block closed on each chain the part had not dropped,
    /// whose edge comes from that chain's block before the part: the
    /// chain and the block.
    entries: Vec<(Chain, u32)>,
    /// The first close on each chain while the part has not set its own
    /// mark.
    filter_uses: Vec<FilterUse>,
}

impl Past {
    fn new() -> Self {
        Self {
            last_is_past: true,
            filter: PastFilter::Before,
            own_filter: false,
            touched: HashSet::default(),
            dropped_all: false,
            dropped: Vec::new(),
            entries: Vec::new(),
            filter_uses: Vec::new(),
        }
    }

    pub(super) fn last_is_past(&self) -> bool {
        self.last_is_past
    }

    /// The builder's last block was put among the others (or replaced).
    pub(super) fn last_parked(&mut self) {
        self.last_is_past = false;
    }

    /// The part set the left-filter mark itself.
    pub(super) fn left_filter_known(&mut self) {
        self.own_filter = true;
    }

    /// Tracing was switched off by a branch while the last block is the
    /// one before the part.
    pub(super) fn left_filter_after_past_last(&mut self) {
        self.filter = PastFilter::LastIfConditional;
    }

    /// Lost data dropped the last blocks of the chains in `space` (`None`:
    /// of every space).
    pub(super) fn drop_chains(&mut self, space: Option<Space>) {
        match space {
            None => self.dropped_all = true,
            Some(s) if !self.dropped.contains(&s) => self.dropped.push(s),
            Some(_) => {}
        }
    }

    /// A block is closed on `chain` and no block of the part comes before
    /// it there: whether the edge into it comes from the chain's block
    /// before the part (the first close on a chain not dropped).
    pub(super) fn first_touch(&self, chain: Chain) -> bool {
        !self.touched.contains(&chain) && !self.dropped_all && !self.dropped.contains(&chain.space)
    }

    /// Block `id` was closed on `chain`, entered from `prev` (or from the
    /// chain's block before the part: `from_past`) along the part's edge
    /// `edge`.
    pub(super) fn closed(
        &mut self,
        chain: Chain,
        id: u32,
        prev: Option<u32>,
        from_past: bool,
        edge: Option<u32>,
    ) {
        let first = self.touched.insert(chain);
        let entry = from_past.then(|| {
            self.entries.push((chain, id));
            self.entries.len() - 1
        });
        if first && !self.own_filter {
            self.filter_uses.push(FilterUse {
                chain,
                prev: match (prev, from_past) {
                    (Some(p), _) => Prev::Part(p),
                    (None, true) => Prev::Before,
                    (None, false) => Prev::None,
                },
                edge: match (edge, entry) {
                    (Some(e), _) => EdgeRef::Part(e),
                    (None, Some(k)) => EdgeRef::Entry(k),
                    (None, None) => EdgeRef::None,
                },
            });
        }
    }
}

/// The coverage of one stretch of a stream, built apart and merged in
/// stream order ([`CoverageBuilder::merge`]): how coverage is built on
/// several threads. See the module documentation of `part.rs` for what
/// a part keeps; memory grows with the distinct blocks and edges of its
/// stretch, like a builder's.
#[derive(Debug, Default)]
pub struct CoveragePart {
    /// The records up to the first that ends a block or breaks the flow.
    head: Vec<Exec>,
    /// The records after the head (`None` while in the head).
    builder: Option<CoverageBuilder>,
}

impl CoveragePart {
    /// A part with no records yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the stretch's next record (never a thread record: parts are
    /// for streams of one thread).
    #[inline]
    pub fn push(&mut self, exec: &Exec) {
        match &mut self.builder {
            Some(b) => b.push(exec),
            None => {
                self.head.push(*exec);
                if leaves_no_open_block(exec) {
                    let mut b = CoverageBuilder::new();
                    b.past = Some(Box::new(Past::new()));
                    self.builder = Some(b);
                }
            }
        }
    }
}

/// Whether a builder has no block open after `exec`, whatever came before.
fn leaves_no_open_block(exec: &Exec) -> bool {
    match exec {
        Exec::Insn(i) => ends_block(i.class) || i.size == 0,
        Exec::Run(r) => ends_block(r.last_class) || r.last_size == 0,
        Exec::Gap { .. } | Exec::Stretch(_) | Exec::Thread { .. } => true,
        Exec::Branch { .. } | Exec::Time(_) => false,
    }
}

impl CoverageBuilder {
    /// Takes the records of `part`, the stretch of the stream right after
    /// those this builder has taken: afterwards the builder is as if it
    /// had taken them one by one.
    pub fn merge(&mut self, part: CoveragePart) {
        for e in &part.head {
            self.push(e);
        }
        let Some(mut b) = part.builder else {
            return;
        };
        let Some(past) = b.past.take() else {
            return;
        };
        b.flush_memo();
        // The part's blocks among this builder's.
        let ids: Vec<u32> = b
            .blocks
            .iter()
            .map(|blk| {
                let id = self.block_id(*blk);
                if let Some(mine) = self.blocks.get_mut(id as usize) {
                    mine.hits += blk.hits;
                }
                id
            })
            .collect();
        let map = |i: u32| ids.get(i as usize).copied().unwrap_or(u32::MAX);
        // What the part read of the past, against this builder's state
        // (before the part changes its chains).
        let mut filter = match past.filter {
            PastFilter::Before => self.left_filter,
            PastFilter::LastIfConditional => match self.last {
                Some((c, id)) if self.last_ended == InsnClass::CondJump => Some((c, id)),
                _ => self.left_filter,
            },
        };
        let mut entry_edges = Vec::with_capacity(past.entries.len());
        for &(chain, to) in &past.entries {
            let edge = self.block_before(chain).map(|from| {
                let e = self.edge_index(from, map(to));
                if let Some(edge) = self.edge_list.get_mut(e as usize) {
                    edge.hits += 1;
                }
                e
            });
            entry_edges.push(edge);
        }
        let mut edge_ids = Vec::with_capacity(b.edge_list.len());
        for e in &b.edge_list {
            let i = self.edge_index(map(e.from), map(e.to));
            if let Some(edge) = self.edge_list.get_mut(i as usize) {
                edge.hits += e.hits;
                edge.left_filter += e.left_filter;
            }
            edge_ids.push(i);
        }
        for u in &past.filter_uses {
            let Some((c, from)) = filter else { break };
            if c != u.chain {
                continue;
            }
            filter = None;
            let prev = match u.prev {
                Prev::Part(p) => Some(map(p)),
                Prev::Before => self.block_before(u.chain),
                Prev::None => None,
            };
            let edge = match u.edge {
                EdgeRef::Part(e) => edge_ids.get(e as usize).copied(),
                EdgeRef::Entry(k) => entry_edges.get(k).copied().flatten(),
                EdgeRef::None => None,
            };
            if prev == Some(from)
                && let Some(edge) = edge.and_then(|e| self.edge_list.get_mut(e as usize))
            {
                edge.left_filter += 1;
            }
        }
        // The chains' last blocks after the part: the part's where it
        // closed or dropped some, the ones before elsewhere.
        if !past.last_is_past {
            self.park_last();
            if past.dropped_all || !past.dropped.is_empty() {
                let (tid, cpu) = (self.tid, self.cpu);
                self.prev.retain(|c, _| {
                    !(c.tid == tid
                        && c.cpu == cpu
                        && (past.dropped_all || past.dropped.contains(&c.space)))
                });
            }
            for c in &past.touched {
                self.prev.remove(c);
            }
            for (&c, &id) in &b.prev {
                self.prev.insert(c, map(id));
            }
            if let Some((c, id)) = b.last {
                self.prev.remove(&c);
                self.last = Some((c, map(id)));
                self.last_ended = b.last_ended;
            }
        }
        self.left_filter = if past.own_filter {
            b.left_filter.map(|(c, id)| (c, map(id)))
        } else {
            filter
        };
        self.here = (u32::MAX, None);
        self.open = b.open;
        self.branch_to = b.branch_to;
        self.insns += b.insns;
    }

    /// The last block of `chain` so far.
    fn block_before(&self, chain: Chain) -> Option<u32> {
        match self.last {
            Some((c, id)) if c == chain => Some(id),
            _ => self.prev.get(&chain).copied(),
        }
    }
}
