//! Straight-line runs of code decoded once per (address space, mode, IP),
//! linked to the blocks that follow them, so following a TNT bit or a
//! direct branch is an index lookup instead of decoding instructions.
//!
//! A block starts at some IP and ends at the first branch of any kind (its
//! last instruction), or before an instruction that cannot be decoded, or
//! after [`MAX_CACHED_BLOCK_INSNS`] instructions. Everything before the last
//! instruction is `Other` or `Ptwrite`: executing it needs no trace, so a
//! decoder with no event pending may skip straight to the last one. A jump
//! into the middle of a block starts a block of its own at that IP
//! (blocks may overlap; each is keyed by its first IP), so a block never
//! has to be split or re-decoded.
//!
//! Each block keeps three successor slots, filled lazily by the decoder:
//! the direct target (taken branch, call, jump), the fall-through (not-taken
//! branch, the instruction after a call or a non-branch end) and the last
//! other target seen (indirect branches and returns usually repeat). A
//! successor is only an index; the decoder checks the successor's IP,
//! address space and mode before using it, so a stale link can never give
//! a wrong block.
//!
//! Blocks live in one `Vec`, found through a hash map keyed by
//! (address space id, mode, IP); address spaces (CR3, VMCS) are interned to
//! small ids. Nothing is allocated per instruction or per block visit; the
//! cache is bounded ([`MAX_CACHED_BLOCKS`]) and starts over when full.

use super::cache::Cached;
use super::classify::{Decoded, InsnClass, Special};
use super::leapmemo::LeapMemo;
use super::octets::OctetMemo;
use super::pairmemo::PairMemo;
use crate::error::ErrorKind;
use hwtrace_packet::ExecMode;
use hwtrace_types::hash::BuildIntHasher;
use hwtrace_types::{AddressSpace, Ip};
use std::collections::HashMap;

/// The most instructions one cached block holds.
pub const MAX_CACHED_BLOCK_INSNS: u32 = 1024;

/// The most blocks kept; past it the cache is cleared and refilled.
pub const MAX_CACHED_BLOCKS: usize = 1 << 17;

/// Slots of the TNT path table (a power of two; 256 KiB of indices). Four
/// times [`MAX_PATHS`]: with as many slots as paths, a quarter of gzip's
/// paths shared a slot with another and were recorded again at every
/// other visit (misses 28,000 -> 7,000 on 30 copies of its trace).
const PATH_SLOTS: usize = 1 << 16;

/// The most runs kept for all TNT paths; past it they start over. 1.5 MiB
/// of runs: a parallel decode holds a cache per decoder in flight (five
/// or six on two threads); 16 times as many made no difference to speed
/// on the benchmark corpus (small programs: gzip and the real traces)
/// but more than doubled `hwtrace flow --jobs 2`'s peak RSS. Programs
/// with much more hot code than that may start over more often.
const MAX_PATH_RUNS: usize = 1 << 16;

/// The most TNT paths kept; past it they start over.
const MAX_PATHS: usize = 1 << 14;

/// An empty slot of the path table.
const NO_PATH: u32 = u32::MAX;

/// The most blocks with a table of their own for the paths of a TNT-8
/// packet's bits ([`BlockCache::tnt_path`]): 512 bytes each, 2 MiB at
/// most. The benchmark corpus' trace (four programs one after the other)
/// uses a few thousand: with 1,024 the blocks past them went by the
/// hashed slots, 36% more instructions on its first 8 MB (callgrind).
/// (Slots of 16 bits would halve the tables but cost 1-2% on every trace.)
const MAX_PATH_TABLES: usize = 1 << 12;

/// The slots of a block's path table: one per key ([`tnt_key`]).
const PATH_TABLE_SLOTS: usize = 128;

/// The most TNT bits a path table's key holds: a TNT-8 packet's.
const MAX_TABLE_BITS: u8 = 6;

/// The key of TNT bits `bits` (`left` of them, at most
/// [`MAX_TABLE_BITS`]) in a block's path table: a stop bit above them, as
/// a TNT-8 packet writes them, so a packet's byte shifted right by one is
/// the key of its bits.
#[inline(always)]
pub(crate) const fn tnt_key(bits: u64, left: u8) -> usize {
    (1 << left) | (bits as usize & ((1 << left) - 1))
}

/// The most runs one TNT path holds.
pub const MAX_PATH_LEN: u32 = 128;

/// "No block": an empty successor slot.
pub const NO_BLOCK: u32 = u32::MAX;

/// Which successor slot a block's next IP uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Edge {
    /// The direct target of the last instruction.
    Target,
    /// The instruction after the last one.
    FallThrough,
    /// Any other IP (an indirect branch or return target).
    Other,
}

/// How a block ends, sorted by what its last instruction asks of the
/// trace: decided once when the block is built, so running it is one
/// `match` instead of looking at the instruction's class and target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFlow {
    /// No branch (the block hit its size limit, or undecodable code
    /// follows): execution goes on at [`CachedBlock::end`].
    Straight,
    /// A direct near jump to [`CachedBlock::target`].
    Jump,
    /// A direct near call to [`CachedBlock::target`] (pushes `end` unless
    /// it calls the next instruction).
    Call,
    /// A conditional jump with a target: one TNT bit.
    CondJump,
    /// A near return: a TNT bit (return compression) or a TIP.
    Return,
    /// An indirect near jump: a TIP.
    IndirectJump,
    /// An indirect near call: a TIP; pushes `end`.
    IndirectCall,
    /// Anything else (far transfers): left to the instruction decoder.
    Slow,
}

impl BlockFlow {
    /// The flow of a block whose last instruction is `d`.
    pub const fn of(d: &Decoded) -> Self {
        match (d.class, d.target) {
            (InsnClass::Other | InsnClass::Ptwrite, _) => Self::Straight,
            (InsnClass::Jump, Some(_)) => Self::Jump,
            (InsnClass::Call, Some(_)) => Self::Call,
            (InsnClass::CondJump, Some(_)) => Self::CondJump,
            (InsnClass::Return, _) => Self::Return,
            (InsnClass::Jump, None) => Self::IndirectJump,
            (InsnClass::Call, None) => Self::IndirectCall,
            _ => Self::Slow,
        }
    }
}

/// One cached block: what running it needs, in one cache line (the last
/// instruction's bytes and decoding live beside it, in
/// [`BlockCache::last_insn`], read only where events bind or a run is
/// expanded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct CachedBlock {
    /// The first instruction's address.
    pub ip: Ip,
    /// The last instruction's address.
    pub last_ip: Ip,
    /// The IP after the last instruction (the fall-through).
    pub end: Ip,
    /// The direct target of the last instruction; [`end`](Self::end)
    /// when it has none, so a fall-through and a direct branch to the next
    /// instruction share one successor slot.
    pub target: u64,
    /// The IP `next_other` starts at.
    pub other_ip: Ip,
    /// How many instructions, the last included (at least one).
    pub insns: u32,
    /// Successor at the direct target.
    pub next_target: u32,
    /// Successor after the last instruction.
    pub next_fall: u32,
    /// The last other successor (at `other_ip`).
    pub next_other: u32,
    /// The interned address space ([`BlockCache::space_id`]).
    pub space: u32,
    /// The execution mode it was decoded in.
    pub mode: ExecMode,
    /// How the block ends.
    pub flow: BlockFlow,
    /// The class of the last instruction.
    pub class: InsnClass,
    /// No instruction before the last is special (MOV CR3, VMPTRLD, ...):
    /// none of them can bind an event that waits for a branch.
    pub plain: bool,
}

impl CachedBlock {
    /// The IP after the last instruction.
    pub fn end_ip(&self) -> Ip {
        self.end
    }

    /// The block as a run of its instructions.
    #[inline]
    pub fn as_run(&self) -> PathRun {
        PathRun {
            ip: self.ip,
            end_ip: self.last_ip,
            insns: self.insns,
            class: self.class,
            // At most `MAX_INSN_SIZE` (15) bytes.
            end_size: self.end.0.wrapping_sub(self.last_ip.0) as u8,
        }
    }

    /// The bytes from the first instruction to the end of the last.
    pub fn byte_len(&self) -> u64 {
        self.end.0.wrapping_sub(self.ip.0)
    }

    /// The class of the last instruction (how the block ends).
    pub fn end_class(&self) -> InsnClass {
        self.class
    }

    /// Which slot leads to `next`, the IP execution went on at.
    #[inline]
    pub fn edge_to(&self, next: Ip) -> Edge {
        if self.target == next.0 {
            Edge::Target
        } else if next == self.end {
            Edge::FallThrough
        } else {
            Edge::Other
        }
    }

    /// The block linked for `next` (may be [`NO_BLOCK`]).
    #[inline]
    pub fn successor(&self, next: Ip) -> u32 {
        match self.edge_to(next) {
            Edge::Target => self.next_target,
            Edge::FallThrough => self.next_fall,
            Edge::Other if self.other_ip == next => self.next_other,
            Edge::Other => NO_BLOCK,
        }
    }
}

/// One run of a [`TntPath`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathRun {
    /// The first instruction's address.
    pub ip: Ip,
    /// The last instruction's address.
    pub end_ip: Ip,
    /// How many instructions.
    pub insns: u32,
    /// The class of the last instruction.
    pub class: InsnClass,
    /// The size of the last instruction (the run ends at `end_ip` plus
    /// this).
    pub end_size: u8,
}

/// What a block of a [`TntPath`] does to the return stack: the same
/// operations, replayed in order, leave the stack as the blocks did
/// (overflowing entries included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackOp {
    /// A direct call pushed its return address.
    Push(u64),
    /// A compressed return popped the address a call of the same path
    /// pushed.
    Pop,
}

/// Where the TNT bits left in the cache lead from a block, when they are
/// used by conditional jumps with only direct jumps, direct calls,
/// compressed returns to those calls and straight code between (no TIP, no
/// return to a call made before): the blocks run, in order, what they do to
/// the return stack, and the block after the last. The same code with the
/// same bits always goes the same way, so a decoder that meets the key
/// again runs the whole path in one step (the idea of libxdc's and iptr's
/// TNT caches) instead of following the blocks one branch at a time.
///
/// A path need not use every bit of its key: one that stops at a block
/// the path cannot hold (a return to a call made before it, a block whose
/// answer comes with an event, the length limit) keeps the blocks before
/// it and says how many bits they used ([`used`](Self::used)); the decoder
/// runs that block by itself and looks for a path again with the bits
/// left. So code that returns out of a TNT packet's blocks, or that an
/// event follows, is not recorded again at every visit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TntPath {
    /// The first block.
    pub start: u32,
    /// The TNT bits left when it starts (the next one highest).
    pub bits: u64,
    /// How many.
    pub left: u8,
    /// How many of them its blocks use: [`left`](Self::left) for a whole
    /// path, fewer for one that stops early.
    pub used: u8,
    /// Where its runs start in the path run store.
    first: u32,
    /// How many runs.
    pub runs: u32,
    /// Where its return stack operations start in the path operation
    /// store, and how many.
    first_op: u32,
    pub(crate) ops: u32,
    /// How many instructions, all runs together.
    pub insns: u64,
    /// How many in the first run (a caller that counts takes it where
    /// the run before the path ended, the others after the path's TNT
    /// packet).
    pub first_insns: u32,
    /// How many in the runs after the last one that used a bit (none for
    /// a whole path, which ends with its last bit): the instructions
    /// executed since the trace was last asked.
    pub tail_insns: u32,
    /// The IP after the last run.
    pub to: Ip,
    /// The last block run.
    pub last: u32,
    /// The block starting at `to`.
    pub next: u32,
    /// Whether it is whole and that block ends with a conditional jump:
    /// the next TNT packet's path starts there.
    pub sprints_on: bool,
}

impl TntPath {
    /// Whether its blocks use every bit of its key.
    #[inline]
    pub const fn is_whole(&self) -> bool {
        self.used == self.left
    }
}

/// A [`BlockCache`]'s path tables as slices ([`BlockCache::tables`]): what
/// [`BlockCache::tnt_path`] reads, without going through the cache's
/// vectors at every packet.
#[derive(Clone, Copy)]
pub(crate) struct PathTables<'c> {
    block_tables: &'c [u32],
    path_tables: &'c [u32],
    paths: &'c [TntPath],
    path_ops: &'c [StackOp],
}

impl<'c> PathTables<'c> {
    /// As [`BlockCache::tnt_path`].
    #[inline(always)]
    pub(crate) fn path(&self, start: u32, key: usize) -> Option<&'c TntPath> {
        let t = *self.block_tables.get(start as usize)?;
        let slot = (t as usize)
            .wrapping_mul(PATH_TABLE_SLOTS)
            .wrapping_add(key);
        self.paths.get(*self.path_tables.get(slot)? as usize)
    }

    /// As [`BlockCache::path_ops`].
    #[inline(always)]
    pub(crate) fn ops(&self, p: &TntPath) -> &'c [StackOp] {
        let first = p.first_op as usize;
        self.path_ops
            .get(first..first + p.ops as usize)
            .unwrap_or(&[])
    }
}

/// What a path is found by: its first block and the TNT bits left there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathKey {
    /// The first block.
    pub start: u32,
    /// The TNT bits left (the next one highest).
    pub bits: u64,
    /// How many.
    pub left: u8,
}

/// Where a recorded path ended ([`BlockCache::finish_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathEnd {
    /// How many instructions, all runs together.
    pub insns: u64,
    /// How many TNT bits the runs used.
    pub used: u8,
    /// How many instructions after the last run that used a bit.
    pub tail_insns: u32,
    /// The IP after the last run.
    pub to: Ip,
    /// The last block run.
    pub last: u32,
    /// The block starting at `to`.
    pub next: u32,
}

#[cfg(test)]
impl TntPath {
    /// A path of `runs` (nothing else of it set), for tests of its users.
    pub(crate) fn for_test(runs: &[PathRun]) -> Self {
        Self {
            start: 0,
            bits: 0,
            left: 0,
            used: 0,
            first: 0,
            runs: runs.len() as u32,
            first_op: 0,
            ops: 0,
            insns: runs.iter().map(|r| u64::from(r.insns)).sum(),
            first_insns: runs.first().map_or(0, |r| r.insns),
            tail_insns: 0,
            to: Ip(0),
            last: NO_BLOCK,
            next: NO_BLOCK,
            sprints_on: false,
        }
    }
}

fn path_slot(start: u32, bits: u64, left: u8) -> usize {
    let h = ((u64::from(start) << 8) | u64::from(left)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ bits.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    (h >> 40) as usize & (PATH_SLOTS - 1)
}

/// Slots of the direct-mapped table in front of the block index (16 KiB).
const RECENT_SLOTS: usize = 1 << 12;

/// The slot of the recent-block table an IP maps to.
#[inline]
fn recent_slot(ip: Ip) -> usize {
    (ip.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52) as usize & (RECENT_SLOTS - 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    ip: u64,
    space: u32,
    mode: u8,
}

const fn mode_key(mode: ExecMode) -> u8 {
    match mode {
        ExecMode::Bits16 => 0,
        ExecMode::Bits32 => 1,
        ExecMode::Bits64 => 2,
        ExecMode::Reserved => 3,
    }
}

/// The blocks decoded so far, per (address space, mode, IP).
#[derive(Clone, Debug, Default)]
pub struct BlockCache {
    blocks: Vec<CachedBlock>,
    /// The last instruction of each block, by the same index.
    lasts: Vec<Cached>,
    index: HashMap<Key, u32, BuildIntHasher>,
    /// Block indices direct-mapped by IP, looked at before `index`: after
    /// every enable (TIP.PGE) or event the block at the new IP is looked
    /// up, and the hash map's probes miss the processor's caches where
    /// this small table does not. An entry is only believed when the block
    /// it names starts at the same (space, mode, IP), so entries left from
    /// before a [`clear`](Self::clear) are harmless. Allocated on first use.
    recent: Vec<u32>,
    spaces: Vec<AddressSpace>,
    /// Indices into `paths`, direct-mapped by (start, bits): small, so
    /// the lookup made at every TNT packet stays in the cache; allocated
    /// on first use.
    path_slots: Vec<u32>,
    /// The paths of up to [`MAX_TABLE_BITS`] bits again, by block
    /// ([`tnt_path`](Self::tnt_path)): [`PATH_TABLE_SLOTS`] indices into
    /// `paths` per table, and each block's table by block index
    /// (`NO_PATH`: none). Both made on first use; blocks past
    /// [`MAX_PATH_TABLES`] have none, their paths are found in
    /// `path_slots` only.
    path_tables: Vec<u32>,
    block_tables: Vec<u32>,
    /// The TNT paths recorded.
    paths: Vec<TntPath>,
    /// The runs of every path, each path's one after the other.
    path_runs: Vec<PathRun>,
    /// The return stack operations of every path, each path's one after
    /// the other, and where the path being recorded starts there.
    path_ops: Vec<StackOp>,
    ops_mark: u32,
    /// Eight TNT-8 packets' paths summed up, by the block they start
    /// from; forgotten with the paths.
    octets: OctetMemo,
    /// Passes over disable/enable pairs, remembered by counting chains.
    pairs: PairMemo,
    /// Sprints' steps over a few bytes of trace, remembered by where they
    /// start; forgotten with the paths.
    leaps: LeapMemo,
}

impl BlockCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets every block (the memory behind them changed, or the cache
    /// is full). Indices handed out before are invalid afterwards.
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.lasts.clear();
        self.index.clear();
        self.forget_paths();
        self.pairs.clear();
        self.spaces.clear();
    }

    /// How many blocks are cached.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is cached.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The small id of an address space (interned on first use).
    pub fn space_id(&mut self, space: AddressSpace) -> u32 {
        if let Some(i) = self.spaces.iter().position(|s| *s == space) {
            return i as u32;
        }
        self.spaces.push(space);
        (self.spaces.len() - 1) as u32
    }

    /// The block at `idx` (`None` for [`NO_BLOCK`] or an index from
    /// before the last [`clear`](Self::clear) that is out of range).
    #[inline]
    pub fn get(&self, idx: u32) -> Option<&CachedBlock> {
        self.blocks.get(idx as usize)
    }

    /// The last instruction of block `idx`, decoded, with its bytes.
    #[inline]
    pub fn last_insn(&self, idx: u32) -> Option<&Cached> {
        self.lasts.get(idx as usize)
    }

    fn forget_paths(&mut self) {
        self.path_slots.iter_mut().for_each(|p| *p = NO_PATH);
        self.path_tables.clear();
        self.block_tables.clear();
        self.paths.clear();
        self.path_runs.clear();
        self.path_ops.clear();
        self.ops_mark = 0;
        self.octets.clear();
        self.leaps.clear();
    }

    /// The path from block `start` with TNT bits `bits` (`left` of them)
    /// left, and its runs, if one was recorded.
    #[inline]
    pub fn path(&self, start: u32, bits: u64, left: u8) -> Option<(&TntPath, &[PathRun])> {
        let p = self.path_record(start, bits, left)?;
        let first = p.first as usize;
        let runs = self.path_runs.get(first..first + p.runs as usize)?;
        Some((p, runs))
    }

    /// The path from block `start` with TNT bits `bits` (`left` of them)
    /// left, if one was recorded: its record alone.
    #[inline(always)]
    pub fn path_record(&self, start: u32, bits: u64, left: u8) -> Option<&TntPath> {
        let i = *self.path_slots.get(path_slot(start, bits, left))?;
        let p = self.paths.get(i as usize)?;
        (p.start == start && p.bits == bits && p.left == left).then_some(p)
    }

    /// The path from block `start` with the bits of a TNT-8 packet whose
    /// key is `key` (its byte shifted right by one) when the block has a path table: a
    /// lookup without hashing or comparing keys, for a caller that goes
    /// from packet to packet.
    #[inline(always)]
    pub fn tnt_path(&self, start: u32, key: usize) -> Option<&TntPath> {
        self.tables().path(start, key)
    }

    /// The path tables, borrowed as plain slices for a loop that looks
    /// paths up packet after packet ([`PathTables::path`]).
    #[inline(always)]
    pub(crate) fn tables(&self) -> PathTables<'_> {
        PathTables {
            block_tables: &self.block_tables,
            path_tables: &self.path_tables,
            paths: &self.paths,
            path_ops: &self.path_ops,
        }
    }

    /// [`tables`](Self::tables), and the memo of eight packets' paths to
    /// look up and fill beside them (the fields borrowed one by one:
    /// calling `tables` would hold the whole cache).
    #[inline(always)]
    pub(crate) fn tables_and_octets(&mut self) -> (PathTables<'_>, &mut OctetMemo) {
        let tables = PathTables {
            block_tables: &self.block_tables,
            path_tables: &self.path_tables,
            paths: &self.paths,
            path_ops: &self.path_ops,
        };
        (tables, &mut self.octets)
    }

    /// The leaps sprints took ([`LeapMemo`]).
    #[inline(always)]
    pub(crate) fn leap_memo(&self) -> &LeapMemo {
        &self.leaps
    }

    /// The leaps, to remember one.
    pub(crate) fn leaps_mut(&mut self) -> &mut LeapMemo {
        &mut self.leaps
    }

    /// The slot of block `start`'s path table for `key`, the table made if
    /// there is room for another.
    fn table_slot(&mut self, start: u32, key: usize) -> Option<&mut u32> {
        let at = start as usize;
        if self.block_tables.len() <= at {
            self.block_tables
                .resize(self.blocks.len().max(at + 1), NO_PATH);
        }
        let t = &mut self.block_tables[at];
        if *t == NO_PATH {
            let made = self.path_tables.len() / PATH_TABLE_SLOTS;
            if made >= MAX_PATH_TABLES {
                return None;
            }
            *t = made as u32;
            self.path_tables
                .resize(self.path_tables.len() + PATH_TABLE_SLOTS, NO_PATH);
        }
        self.path_tables
            .get_mut(*t as usize * PATH_TABLE_SLOTS + key)
    }

    /// What path `p` does to the return stack, in order: its direct
    /// calls' pushes (a call to the next instruction pushes nothing) and
    /// the compressed returns to them.
    #[inline]
    pub fn path_ops(&self, p: &TntPath) -> &[StackOp] {
        self.tables().ops(p)
    }

    /// The passes over disable/enable pairs remembered
    /// ([`PairMemo`]); forgotten with the blocks.
    #[inline(always)]
    pub(crate) fn pairs(&self) -> &PairMemo {
        &self.pairs
    }

    /// [`pairs`](Self::pairs), to remember one.
    pub(crate) fn pairs_mut(&mut self) -> &mut PairMemo {
        &mut self.pairs
    }

    /// How many TNT paths are kept (some may be unreachable, replaced in
    /// their slot by a later one).
    pub fn paths(&self) -> usize {
        self.paths.len()
    }

    /// How many of the paths kept stop before using all their bits.
    pub fn partial_paths(&self) -> usize {
        self.paths.iter().filter(|p| !p.is_whole()).count()
    }

    /// How many runs of eight TNT-8 packets' paths are remembered
    /// together.
    pub fn octets(&self) -> usize {
        self.octets.len()
    }

    /// How many sprints' leaps over a few bytes of trace are remembered.
    pub fn leaps(&self) -> usize {
        self.leaps.len()
    }

    /// Starts recording a path: its runs go after the ones stored (which
    /// start over first when there are too many).
    pub fn begin_path(&mut self) -> u32 {
        if self.path_runs.len() >= MAX_PATH_RUNS || self.paths.len() >= MAX_PATHS {
            self.forget_paths();
        }
        self.ops_mark = self.path_ops.len() as u32;
        self.path_runs.len() as u32
    }

    /// Adds what a block of the path being recorded did to the return
    /// stack.
    pub fn push_path_op(&mut self, op: StackOp) {
        self.path_ops.push(op);
    }

    /// Adds a run to the path being recorded.
    pub fn push_path_run(&mut self, run: PathRun) {
        self.path_runs.push(run);
    }

    /// Drops the path being recorded (begun at `first`).
    pub fn abandon_path(&mut self, first: u32) {
        self.path_runs.truncate(first as usize);
        self.path_ops.truncate(self.ops_mark as usize);
    }

    /// Keeps the path being recorded (begun at `first`, its runs pushed)
    /// under its key, replacing whatever shared its slot.
    pub fn finish_path(&mut self, first: u32, key: PathKey, end: PathEnd) {
        let runs = (self.path_runs.len() as u32).saturating_sub(first);
        if runs == 0 {
            return;
        }
        if self.path_slots.is_empty() {
            self.path_slots = vec![NO_PATH; PATH_SLOTS];
        }
        let i = self.paths.len() as u32;
        let first_insns = self.path_runs.get(first as usize).map_or(0, |r| r.insns);
        let sprints_on = end.used == key.left
            && self
                .get(end.next)
                .is_some_and(|b| b.flow == BlockFlow::CondJump);
        if (1..=MAX_TABLE_BITS).contains(&key.left)
            && let Some(slot) = self.table_slot(key.start, tnt_key(key.bits, key.left))
        {
            *slot = i;
        }
        if let Some(slot) = self
            .path_slots
            .get_mut(path_slot(key.start, key.bits, key.left))
        {
            *slot = i;
            self.paths.push(TntPath {
                start: key.start,
                bits: key.bits,
                left: key.left,
                used: end.used,
                first,
                runs,
                first_op: self.ops_mark,
                ops: (self.path_ops.len() as u32).saturating_sub(self.ops_mark),
                insns: end.insns,
                first_insns,
                tail_insns: end.tail_insns,
                to: end.to,
                last: end.last,
                next: end.next,
                sprints_on,
            });
        }
    }

    /// The cached block starting at `ip`, if any.
    pub fn lookup(&self, space: u32, mode: ExecMode, ip: Ip) -> Option<u32> {
        self.index
            .get(&Key {
                ip: ip.0,
                space,
                mode: mode_key(mode),
            })
            .copied()
    }

    /// The block at `ip` if the recent-block table has it (no hash map
    /// lookup): for a caller that tries it inline before
    /// [`get_or_build`](Self::get_or_build).
    #[inline(always)]
    pub fn recent(&self, space: u32, mode: ExecMode, ip: Ip) -> Option<u32> {
        let idx = *self.recent.get(recent_slot(ip))?;
        let b = self.blocks.get(idx as usize)?;
        (b.ip == ip && b.space == space && b.mode == mode).then_some(idx)
    }

    /// The block execution goes on in after block `from` went to `to`,
    /// if it is cached: `from`'s successor link if it still starts there,
    /// else (returns and indirect branches go to many places, only the
    /// last one seen is linked) the recent-block table, else the index;
    /// then linked.
    #[inline(always)]
    pub fn linked_or_recent(&mut self, from: u32, to: u64) -> Option<u32> {
        let prev = self.blocks.get(from as usize)?;
        let linked = prev.successor(Ip(to));
        if let Some(c) = self.get(linked)
            && c.ip.0 == to
            && c.space == prev.space
            && c.mode == prev.mode
        {
            return Some(linked);
        }
        let (space, mode) = (prev.space, prev.mode);
        let found = match self.recent(space, mode, Ip(to)) {
            Some(found) => found,
            None => self.lookup_unrecent(space, mode, Ip(to))?,
        };
        self.link(from, found);
        Some(found)
    }

    /// [`lookup`](Self::lookup) through the recent-block table, which
    /// remembers what it finds.
    #[inline]
    fn lookup_recent(&mut self, space: u32, mode: ExecMode, ip: Ip) -> Option<u32> {
        match self.recent(space, mode, ip) {
            Some(idx) => Some(idx),
            None => self.lookup_unrecent(space, mode, ip),
        }
    }

    /// [`lookup_recent`](Self::lookup_recent) once the recent-block table
    /// missed (two blocks in one slot, a return going to one and then the
    /// other), out of line. (Before chains asked the index this way, one
    /// return in six of the real traces, 47 a unit, ended a chain: the
    /// instruction decoder looked it up and the chain started again.)
    #[cold]
    #[inline(never)]
    fn lookup_unrecent(&mut self, space: u32, mode: ExecMode, ip: Ip) -> Option<u32> {
        let idx = self.lookup(space, mode, ip)?;
        self.remember(recent_slot(ip), idx);
        Some(idx)
    }

    /// Puts block `idx` into slot `slot` of the recent-block table.
    fn remember(&mut self, slot: usize, idx: u32) {
        if self.recent.is_empty() {
            self.recent = vec![NO_BLOCK; RECENT_SLOTS];
        }
        if let Some(r) = self.recent.get_mut(slot) {
            *r = idx;
        }
    }

    /// The block starting at `ip`, decoded with `decode` (which returns
    /// the instruction at an address) if not cached yet. Fails with the
    /// first instruction's error if even that cannot be decoded; a later
    /// instruction that cannot be decoded ends the block before it.
    ///
    /// When the cache is full it is cleared first, so every index held
    /// by the caller must be dropped if `len()` went down.
    pub fn get_or_build(
        &mut self,
        space: u32,
        mode: ExecMode,
        ip: Ip,
        mut decode: impl FnMut(Ip) -> Result<Cached, ErrorKind>,
    ) -> Result<u32, ErrorKind> {
        if let Some(idx) = self.lookup_recent(space, mode, ip) {
            return Ok(idx);
        }
        let mut at = ip;
        let mut last = decode(at)?;
        let mut insns = 1u32;
        let mut plain = true;
        while matches!(last.decoded.class, InsnClass::Other | InsnClass::Ptwrite)
            && insns < MAX_CACHED_BLOCK_INSNS
        {
            let next = Ip(at.0.wrapping_add(u64::from(last.decoded.size)));
            let Ok(c) = decode(next) else { break };
            plain &= last.decoded.special == Special::None;
            at = next;
            last = c;
            insns += 1;
        }
        if self.blocks.len() >= MAX_CACHED_BLOCKS {
            let spaces = std::mem::take(&mut self.spaces);
            self.clear();
            // Space ids stay valid for the caller.
            self.spaces = spaces;
        }
        let idx = self.blocks.len() as u32;
        let d = last.decoded;
        let end = Ip(at.0.wrapping_add(u64::from(d.size)));
        self.blocks.push(CachedBlock {
            ip,
            last_ip: at,
            end,
            target: d.target.unwrap_or(end.0),
            other_ip: Ip(0),
            insns,
            next_target: NO_BLOCK,
            next_fall: NO_BLOCK,
            next_other: NO_BLOCK,
            space,
            mode,
            flow: BlockFlow::of(&d),
            class: d.class,
            plain,
        });
        self.lasts.push(last);
        self.index.insert(
            Key {
                ip: ip.0,
                space,
                mode: mode_key(mode),
            },
            idx,
        );
        self.remember(recent_slot(ip), idx);
        Ok(idx)
    }

    /// Records that execution went from block `from` to block `to`.
    pub fn link(&mut self, from: u32, to: u32) {
        let Some(to_ip) = self.blocks.get(to as usize).map(|b| b.ip) else {
            return;
        };
        let Some(b) = self.blocks.get_mut(from as usize) else {
            return;
        };
        match b.edge_to(to_ip) {
            Edge::Target => b.next_target = to,
            Edge::FallThrough => b.next_fall = to,
            Edge::Other => {
                b.next_other = to;
                b.other_ip = to_ip;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify::{MAX_INSN_SIZE, classify};
    use super::*;
    use hwtrace_types::Cr3;

    /// 1000: nop; 1001: nop; 1002: jz 1000; 1004: nop; 1005: ret
    const CODE: [u8; 6] = [0x90, 0x90, 0x74, 0xfc, 0x90, 0xc3];

    fn blk(c: &BlockCache, idx: u32) -> CachedBlock {
        *c.get(idx).expect("a block handed out")
    }

    fn decode(ip: Ip) -> Result<Cached, ErrorKind> {
        let off = usize::try_from(ip.0.wrapping_sub(0x1000)).map_err(|_| ErrorKind::NoMap)?;
        let rest = CODE
            .get(off..)
            .filter(|r| !r.is_empty())
            .ok_or(ErrorKind::NoMap)?;
        let decoded = classify(rest, ip.0, ExecMode::Bits64).map_err(|_| ErrorKind::BadInsn)?;
        let mut raw = [0u8; MAX_INSN_SIZE];
        raw[..rest.len()].copy_from_slice(rest);
        Ok(Cached { decoded, raw })
    }

    /// A cache holding the blocks of [`CODE`] that start at `ips`, its
    /// address space id, and their indices.
    fn built<const N: usize>(ips: [u64; N]) -> (BlockCache, u32, [u32; N]) {
        let mut c = BlockCache::new();
        let s = c.space_id(AddressSpace::UNKNOWN);
        let idx = ips.map(|ip| c.get_or_build(s, ExecMode::Bits64, Ip(ip), decode).unwrap());
        (c, s, idx)
    }

    #[test]
    fn block_runs_to_the_first_branch() {
        let mut c = BlockCache::new();
        let s = c.space_id(AddressSpace::UNKNOWN);
        let b = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        let blk = blk(&c, b);
        assert_eq!(blk.insns, 3);
        assert_eq!(blk.last_ip, Ip(0x1002));
        assert_eq!(blk.end_class(), InsnClass::CondJump);
        assert_eq!(blk.byte_len(), 4);
        assert_eq!(blk.end_ip(), Ip(0x1004));
        // Cached: the same index again, without decoding.
        let again = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1000), |_| {
                Err(ErrorKind::Internal)
            })
            .unwrap();
        assert_eq!(again, b);
    }

    #[test]
    fn successors_link_taken_and_not_taken() {
        let (mut c, _, [head, tail]) = built([0x1000, 0x1004]);
        assert_eq!(blk(&c, head).successor(Ip(0x1000)), NO_BLOCK);
        c.link(head, head);
        c.link(head, tail);
        assert_eq!(blk(&c, head).successor(Ip(0x1000)), head);
        assert_eq!(blk(&c, head).successor(Ip(0x1004)), tail);
        assert_eq!(blk(&c, tail).end_class(), InsnClass::Return);
        // A return goes anywhere: the last target seen is remembered.
        c.link(tail, head);
        assert_eq!(blk(&c, tail).successor(Ip(0x1000)), head);
        assert_eq!(blk(&c, tail).successor(Ip(0x1004)), NO_BLOCK);
        assert_eq!(blk(&c, tail).edge_to(Ip(0x1000)), Edge::Other);
    }

    #[test]
    fn a_cached_block_is_found_past_a_missed_recent_slot() {
        let (mut c, s, [head, tail]) = built([0x1000, 0x1004]);
        // Another block took the slot of `head` in the recent table, and
        // the return is linked elsewhere: the index still has `head`.
        c.recent[recent_slot(Ip(0x1000))] = tail;
        assert_eq!(c.linked_or_recent(tail, 0x1000), Some(head));
        // Linked and remembered again, as the instruction decoder would.
        assert_eq!(blk(&c, tail).successor(Ip(0x1000)), head);
        assert_eq!(c.recent(s, ExecMode::Bits64, Ip(0x1000)), Some(head));
        // What is not cached is not built here.
        let before = c.len();
        assert_eq!(c.linked_or_recent(tail, 0x1001), None);
        assert_eq!(c.len(), before);
    }

    #[test]
    fn jump_into_the_middle_starts_its_own_block() {
        let mut c = BlockCache::new();
        let s = c.space_id(AddressSpace::UNKNOWN);
        let whole = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        let mid = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1001), decode)
            .unwrap();
        assert_ne!(whole, mid);
        assert_eq!(blk(&c, mid).insns, 2);
        assert_eq!(blk(&c, mid).last_ip, Ip(0x1002));
        // The block it landed in is unchanged.
        assert_eq!(blk(&c, whole).insns, 3);
        assert_eq!(blk(&c, whole).ip, Ip(0x1000));
    }

    #[test]
    fn keyed_by_address_space_and_mode() {
        let mut c = BlockCache::new();
        let a = c.space_id(AddressSpace::with_cr3(Cr3(0x1000)));
        let b = c.space_id(AddressSpace::with_cr3(Cr3(0x2000)));
        assert_ne!(a, b);
        assert_eq!(c.space_id(AddressSpace::with_cr3(Cr3(0x1000))), a);
        let in_a = c
            .get_or_build(a, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        assert_eq!(c.lookup(a, ExecMode::Bits64, Ip(0x1000)), Some(in_a));
        assert_eq!(c.lookup(b, ExecMode::Bits64, Ip(0x1000)), None);
        assert_eq!(c.lookup(a, ExecMode::Bits32, Ip(0x1000)), None);
        let in_b = c
            .get_or_build(b, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        assert_ne!(in_a, in_b);
        assert_eq!(blk(&c, in_b).space, b);
        c.clear();
        assert!(c.is_empty());
        assert_eq!(c.lookup(a, ExecMode::Bits64, Ip(0x1000)), None);
    }

    #[test]
    fn the_recent_table_never_names_a_block_of_another_key() {
        let mut c = BlockCache::new();
        let a = c.space_id(AddressSpace::with_cr3(Cr3(0x1000)));
        let b = c.space_id(AddressSpace::with_cr3(Cr3(0x2000)));
        let in_a = c
            .get_or_build(a, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        // Same IP (same slot), other space and other mode: built anew.
        let in_b = c
            .get_or_build(b, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        let in_32 = c
            .get_or_build(a, ExecMode::Bits32, Ip(0x1000), decode)
            .unwrap();
        assert_eq!(c.len(), 3);
        assert_ne!(in_b, in_a);
        assert_ne!(in_32, in_a);
        // Back to the first key: found again, whatever the slot holds.
        let again = c
            .get_or_build(a, ExecMode::Bits64, Ip(0x1000), |_| {
                Err(ErrorKind::Internal)
            })
            .unwrap();
        assert_eq!(again, in_a);
        // After a clear, index 0 is another block: the slot of 0x1000
        // still says 0, and must not be believed.
        c.clear();
        let a = c.space_id(AddressSpace::with_cr3(Cr3(0x1000)));
        let tail = c
            .get_or_build(a, ExecMode::Bits64, Ip(0x1004), decode)
            .unwrap();
        assert_eq!(tail, in_a, "the index the old slot names");
        let head = c
            .get_or_build(a, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        assert_ne!(head, tail);
        assert_eq!(blk(&c, head).ip, Ip(0x1000));
    }

    #[test]
    fn special_instructions_make_a_block_not_plain() {
        // 3000: mov cr3, rax; 3003: ret
        const SPECIAL: [u8; 4] = [0x0f, 0x22, 0xd8, 0xc3];
        let special = |ip: Ip| {
            let off = usize::try_from(ip.0.wrapping_sub(0x3000)).map_err(|_| ErrorKind::NoMap)?;
            let rest = SPECIAL
                .get(off..)
                .filter(|r| !r.is_empty())
                .ok_or(ErrorKind::NoMap)?;
            let decoded = classify(rest, ip.0, ExecMode::Bits64).map_err(|_| ErrorKind::BadInsn)?;
            let mut raw = [0u8; MAX_INSN_SIZE];
            raw[..rest.len()].copy_from_slice(rest);
            Ok(Cached { decoded, raw })
        };
        let mut c = BlockCache::new();
        let s = c.space_id(AddressSpace::UNKNOWN);
        let b = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x3000), special)
            .unwrap();
        assert_eq!(blk(&c, b).insns, 2);
        assert!(!blk(&c, b).plain);
        // From the return alone, and in ordinary code, nothing is special.
        let r = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x3003), special)
            .unwrap();
        assert!(blk(&c, r).plain);
        let n = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        assert!(blk(&c, n).plain);
    }

    #[test]
    fn blocks_fit_a_cache_line_and_know_their_flow() {
        assert_eq!(std::mem::size_of::<CachedBlock>(), 64);
        let mut c = BlockCache::new();
        let s = c.space_id(AddressSpace::UNKNOWN);
        let head = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1000), decode)
            .unwrap();
        assert_eq!(blk(&c, head).flow, BlockFlow::CondJump);
        assert_eq!(blk(&c, head).target, 0x1000);
        assert_eq!(c.last_insn(head).map(|l| l.decoded.size), Some(2));
        let tail = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1004), decode)
            .unwrap();
        assert_eq!(blk(&c, tail).flow, BlockFlow::Return);
        // No direct target: the fall-through stands in for it.
        assert_eq!(blk(&c, tail).target, blk(&c, tail).end.0);
    }

    fn key(start: u32, bits: u64, left: u8) -> PathKey {
        PathKey { start, bits, left }
    }

    fn end(insns: u64, used: u8, to: Ip, last: u32, next: u32) -> PathEnd {
        PathEnd {
            insns,
            used,
            tail_insns: 0,
            to,
            last,
            next,
        }
    }

    /// The run of the loop at 0x1000 ([`decode`]'s code: three
    /// instructions to a conditional jump).
    fn loop_run() -> PathRun {
        PathRun {
            ip: Ip(0x1000),
            end_ip: Ip(0x1002),
            insns: 3,
            class: InsnClass::CondJump,
            end_size: 2,
        }
    }

    #[test]
    fn tnt_paths_are_kept_by_start_and_bits() {
        let (mut c, _, [head, tail]) = built([0x1000, 0x1004]);
        // Taken, then not taken: the loop once, then out to the tail.
        let run = loop_run();
        let first = c.begin_path();
        c.push_path_run(run);
        c.push_path_op(StackOp::Push(0x2000));
        c.push_path_run(run);
        c.push_path_op(StackOp::Push(0x3000));
        c.push_path_op(StackOp::Pop);
        c.finish_path(first, key(head, 0b10, 2), end(6, 2, Ip(0x1004), head, tail));
        let (p, runs) = c.path(head, 0b10, 2).expect("a path");
        assert_eq!(runs, [run, run]);
        assert_eq!((p.insns, p.to, p.last, p.next), (6, Ip(0x1004), head, tail));
        // The return addresses its calls pushed, in order.
        assert_eq!(
            c.path_ops(p),
            [StackOp::Push(0x2000), StackOp::Push(0x3000), StackOp::Pop]
        );
        assert_eq!(c.paths(), 1);
        // Other bits, another start: no path.
        assert!(c.path(head, 0b11, 2).is_none());
        assert!(c.path(head, 0b10, 3).is_none());
        assert!(c.path(tail, 0b10, 2).is_none());
        // An abandoned recording leaves nothing behind.
        let first = c.begin_path();
        c.push_path_run(run);
        c.push_path_op(StackOp::Push(0x4000));
        c.abandon_path(first);
        assert!(c.path(head, 0b1, 1).is_none());
        assert_eq!(c.path(head, 0b10, 2).map(|(_, r)| r.len()), Some(2));
        // A path recorded after it has only its own pushes.
        let first = c.begin_path();
        c.push_path_run(run);
        c.push_path_op(StackOp::Push(0x5000));
        c.finish_path(first, key(tail, 0b1, 1), end(3, 1, Ip(0x1004), head, tail));
        let (p, _) = c.path(tail, 0b1, 1).expect("a second path");
        assert_eq!(c.path_ops(p), [StackOp::Push(0x5000)]);
        assert!(p.is_whole());
        assert_eq!(c.partial_paths(), 0);
        // One that stops before its last bit (a return to a call made
        // before it would use it) is kept too, and says so.
        let first = c.begin_path();
        c.push_path_run(run);
        c.finish_path(
            first,
            key(head, 0b101, 3),
            end(3, 2, Ip(0x1004), head, tail),
        );
        let (p, _) = c.path(head, 0b101, 3).expect("a partial path");
        assert!(!p.is_whole());
        assert_eq!((p.used, p.left), (2, 3));
        assert_eq!(c.partial_paths(), 1);
        c.clear();
        assert!(c.path(head, 0b10, 2).is_none());
        assert_eq!(c.paths(), 0);
        assert!(c.path_ops.is_empty());
    }

    #[test]
    fn tnt_8_packets_find_their_paths_in_the_block_table() {
        let (mut c, _, [head, tail]) = built([0x1000, 0x1004]);
        let run = loop_run();
        let record = |c: &mut BlockCache, start, bits, left, used, next| {
            let first = c.begin_path();
            c.push_path_run(run);
            c.finish_path(
                first,
                key(start, bits, left),
                end(3, used, Ip(0x1004), head, next),
            );
        };
        // Taken, not taken: the TNT-8 packet 0b1_10_0 (a stop bit above
        // the bits, bit 0 clear); its byte shifted right is the key. Back
        // to the loop's head, a conditional jump.
        record(&mut c, head, 0b10, 2, 2, head);
        assert_eq!(tnt_key(0b10, 2), 0b0000_1100 >> 1);
        let p = c.tnt_path(head, tnt_key(0b10, 2)).expect("in the table");
        assert_eq!(Some(p), c.path_record(head, 0b10, 2));
        // Whole, to a block ending with a conditional jump: a sprint goes
        // on from it.
        assert!(p.sprints_on);
        // Other bits have their own slot.
        assert!(c.tnt_path(head, tnt_key(0b11, 2)).is_none());
        assert!(c.tnt_path(head, tnt_key(0b10, 3)).is_none());
        // Stopping before its last bit: in the table, but not on.
        record(&mut c, head, 0b101, 3, 2, tail);
        let p = c.tnt_path(head, tnt_key(0b101, 3)).expect("partial");
        assert!(!p.is_whole() && !p.sprints_on);
        // Whole, to a return (`tail`: nop; ret) or to no block: not on
        // either.
        assert_eq!(c.get(tail).map(|b| b.flow), Some(BlockFlow::Return));
        record(&mut c, head, 0b1, 1, 1, tail);
        assert!(!c.tnt_path(head, tnt_key(0b1, 1)).expect("whole").sprints_on);
        record(&mut c, tail, 0b1, 1, 1, NO_BLOCK);
        assert!(!c.tnt_path(tail, tnt_key(0b1, 1)).expect("whole").sprints_on);
        // More bits than a TNT-8 packet holds (a TNT-64 packet's): only
        // in the hashed slots.
        record(&mut c, head, 0b101_0101, 7, 7, tail);
        assert!(c.path_record(head, 0b101_0101, 7).is_some());
        assert!((0..PATH_TABLE_SLOTS).all(|k| c.tnt_path(head, k).is_none_or(|p| p.left < 7)));
        // Past the most tables (`head` and `tail` have two), blocks have
        // none: their paths are still found by key.
        let late = MAX_PATH_TABLES as u32;
        for start in 2..=late {
            record(&mut c, start, 0b1, 1, 1, tail);
        }
        assert!(c.tnt_path(late - 1, tnt_key(0b1, 1)).is_some());
        assert!(c.tnt_path(late, tnt_key(0b1, 1)).is_none());
        assert!(c.path_record(late, 0b1, 1).is_some());
        // Forgotten with the rest.
        c.clear();
        assert!(c.tnt_path(head, tnt_key(0b10, 2)).is_none());
    }

    #[test]
    fn undecodable_code_ends_a_block_or_fails_it() {
        let mut c = BlockCache::new();
        let s = c.space_id(AddressSpace::UNKNOWN);
        // From 1004: nop; ret — ends at the return.
        let b = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x1004), decode)
            .unwrap();
        assert_eq!(blk(&c, b).insns, 2);
        // Past the end: nothing to decode, so no block.
        assert_eq!(
            c.get_or_build(s, ExecMode::Bits64, Ip(0x1006), decode),
            Err(ErrorKind::NoMap)
        );
        // Code that runs off the mapped bytes: the block ends before.
        let nops = |ip: Ip| {
            if ip.0 < 0x2003 {
                decode(Ip(0x1000))
            } else {
                Err(ErrorKind::NoMap)
            }
        };
        let b = c
            .get_or_build(s, ExecMode::Bits64, Ip(0x2000), nops)
            .unwrap();
        assert_eq!(blk(&c, b).insns, 3);
        assert_eq!(blk(&c, b).end_class(), InsnClass::Other);
        assert_eq!(blk(&c, b).end_ip(), Ip(0x2003));
    }
}
