//! What passing over a TIP.PGD/TIP.PGE pair did, remembered.
//!
//! A trace filtered to an address range has a disable/enable pair wherever
//! the code calls out of the range and comes back: the real fuzzing traces
//! have one every ~55 bytes, at the same few call sites again and again.
//! A counting chain passes one over by following the TNT bits to the
//! branch the disable binds to, through the path tables, the walk to that
//! branch and the block at the enable's IP (~600 instructions on the real
//! traces, callgrind). What that does depends only on the block the bits
//! start from, the bits and the pair's two IPs, so it is kept here, keyed
//! by them, and replayed: the runs and instructions to count, the return
//! stack operations, the block after, and the least room and the most
//! instructions since the trace was asked with which every check made
//! along the way passes.
//!
//! The memo lives in the [`BlockCache`](super::blockcache::BlockCache)
//! whose block indices it holds and is forgotten with them.

use super::blockcache::StackOp;

/// Slots of the memo (direct-mapped by key).
const SLOTS: usize = 4096;
/// The stack operations kept for all entries; past this the memo starts
/// over (entries are overwritten in their slots, their operations are not).
const MAX_OPS: usize = 1 << 14;

/// What a pass over a pair does: see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PairPass {
    /// The runs counted, all taken at the enable's trace offset: how many,
    /// the first one's instructions, and all of theirs.
    pub runs: usize,
    pub first: u64,
    pub insns: u64,
    /// The last block run (the one the disable binds to) and the block at
    /// the enable's IP.
    pub last: u32,
    pub next: u32,
    /// The least room for runs and the most instructions since the trace
    /// was last asked with which the pass is the same.
    pub room: usize,
    pub icount_max: u64,
    /// Where its return stack operations are ([`PairMemo::ops`]).
    ops_at: u32,
    ops_len: u32,
}

/// What a pass is keyed by: the block the TNT bits start from, the bits
/// (`left` of them) and the pair's IPs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PairKey {
    pub idx: u32,
    pub left: u8,
    pub bits: u64,
    pub off: u64,
    pub on: u64,
}

impl PairKey {
    fn slot(&self) -> usize {
        let h = (u64::from(self.idx) ^ (self.bits << 20) ^ (u64::from(self.left) << 28))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ self.off.wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
            ^ self.on.rotate_left(29);
        (h.wrapping_mul(0x1656_67b1_9e37_79f9) >> 52) as usize % SLOTS
    }
}

/// The passes remembered (allocated on first use).
#[derive(Clone, Debug, Default)]
pub(crate) struct PairMemo {
    slots: Vec<Option<(PairKey, PairPass)>>,
    ops: Vec<StackOp>,
    /// How many times the memo started over: the operations of passes
    /// handed out before are gone then.
    generation: u64,
}

impl PairMemo {
    /// Forgets every pass.
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.ops.clear();
        self.generation += 1;
    }

    /// Changes whenever the memo starts over ([`ops`](Self::ops) of a
    /// pass handed out before is then not its own).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The pass remembered for `key`.
    #[inline]
    pub fn get(&self, key: &PairKey) -> Option<PairPass> {
        match self.slots.get(key.slot())? {
            Some((k, pass)) if k == key => Some(*pass),
            _ => None,
        }
    }

    /// A pass's return stack operations.
    #[inline]
    pub fn ops(&self, pass: &PairPass) -> &[StackOp] {
        let at = pass.ops_at as usize;
        self.ops.get(at..at + pass.ops_len as usize).unwrap_or(&[])
    }

    /// Remembers `pass` (its operations `ops`) for `key`, in place of
    /// whatever had the slot.
    pub fn insert(&mut self, key: PairKey, mut pass: PairPass, ops: &[StackOp]) -> PairPass {
        if self.slots.is_empty() {
            self.slots = vec![None; SLOTS];
        }
        if self.ops.len() + ops.len() > MAX_OPS {
            self.clear();
        }
        pass.ops_at = self.ops.len() as u32;
        pass.ops_len = ops.len() as u32;
        self.ops.extend_from_slice(ops);
        let slot = key.slot();
        self.slots[slot] = Some((key, pass));
        pass
    }
}

impl PairPass {
    /// A pass with no operations yet ([`PairMemo::insert`] places them).
    #[allow(clippy::too_many_arguments, reason = "a plain record")]
    pub fn new(
        runs: usize,
        first: u64,
        insns: u64,
        last: u32,
        next: u32,
        room: usize,
        icount_max: u64,
    ) -> Self {
        Self {
            runs,
            first,
            insns,
            last,
            next,
            room,
            icount_max,
            ops_at: 0,
            ops_len: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(idx: u32, off: u64) -> PairKey {
        PairKey {
            idx,
            left: 3,
            bits: 0b101,
            off,
            on: 0x40_1000,
        }
    }

    #[test]
    fn a_pass_is_found_by_its_whole_key_with_its_operations() {
        let mut memo = PairMemo::default();
        let k = key(7, 0x7fff_0000);
        assert_eq!(memo.get(&k), None);
        let pass = PairPass::new(4, 2, 11, 9, 12, 14, 100);
        let ops = [StackOp::Push(0x40_1005), StackOp::Pop];
        let kept = memo.insert(k, pass, &ops);
        assert_eq!(memo.get(&k), Some(kept));
        assert_eq!(memo.ops(&kept), &ops);
        // Another pair's IP or other bits are other keys.
        assert_eq!(memo.get(&key(7, 0x7fff_0010)), None);
        assert_eq!(memo.get(&PairKey { left: 2, ..k }), None);
        memo.clear();
        assert_eq!(memo.get(&k), None);
    }

    #[test]
    fn the_memo_starts_over_when_its_operations_fill_up() {
        let mut memo = PairMemo::default();
        let ops = vec![StackOp::Pop; MAX_OPS / 2 + 1];
        let first = key(1, 0x1000);
        memo.insert(first, PairPass::new(1, 1, 1, 0, 0, 0, 0), &ops);
        let second = key(2, 0x2000);
        let kept = memo.insert(second, PairPass::new(1, 1, 1, 0, 0, 0, 0), &ops);
        // The first entry's operations went with the start over.
        assert_eq!(memo.get(&first), None);
        assert_eq!(memo.ops(&kept).len(), ops.len());
    }
}
