//! Leaps: what a counting sprint did over the next few bytes of trace,
//! remembered by where it started and those bytes.
//!
//! A real fuzzing trace is mostly a TIP answering an indirect branch and
//! one or two TNT-8 packets after it, each choosing a path to the next
//! branch that asks the trace (two thirds of the real traces' packets
//! are not in runs of TNT-8 packets, so the eight-packet
//! [`OctetMemo`](super::octets::OctetMemo) rarely applies). A sprint
//! takes each through the trace's bytes, the block cache and the counts
//! (~200 instructions a step on the real traces, callgrind). Where it
//! goes from a conditional jump with no TNT bits loaded depends only on
//! that block, the last IP (a TIP's compressed IP is completed from it)
//! and the bytes it reads, as long as the return stack holds the same
//! addresses where the steps return to calls made before them
//! ([`LeapTo::guards_hold`]) and the sink's room and the trace's end
//! are far: so the steps from such a *station* to the last station within
//! [`LEAP_BYTES`] bytes are kept here, summed up, and taken again in one
//! lookup when the same block, last IP and bytes come again. Within one
//! pass over the real fuzzing trace `foo`, 56% of the 16-byte windows at
//! its TIP and TNT packets were seen before; a trace of a loop or of a
//! fuzzer running the same input again repeats far more.
//!
//! The memo lives in the [`BlockCache`](super::blockcache::BlockCache)
//! whose block indices it holds and is forgotten with them and with its
//! paths.

use super::blockcache::StackOp;
use super::retstack::RetStack;
use hwtrace_packet::LastIp;

/// How many bytes of trace from a station a leap's key holds.
pub(crate) const LEAP_BYTES: usize = 32;

/// The key's bytes as words.
const WORDS: usize = LEAP_BYTES / 8;

/// Slots of the memo, in sets of two a key may take (direct-mapped, a
/// fifth of the real traces' stations were evicted by another one at
/// every pass).
const SLOTS: usize = 1 << 14;

/// The most return stack operations a leap kept here has (a leap with
/// more is taken, not kept; with six, one leap in seven of the real
/// traces' had more). Since leaps go on past returns to calls made
/// before them, call-heavy code has more: 16 rather than 12 took 22%
/// fewer instructions on `sort` decoded once and 12% on a pass of gzip's
/// piece, 32 rather than 16 another 5% and 24%, the same on the real
/// traces (callgrind), for 128 bytes more a leap kept.
pub(crate) const LEAP_OPS: usize = 32;
const _: () = assert!(
    LEAP_OPS <= u32::BITS as usize,
    "a bit of `LeapTo::pops` each"
);

/// Where a leap starts: the conditional jump's block, the last IP and
/// the trace's next [`LEAP_BYTES`] bytes; and whether the steps pass
/// disable/enable pairs over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeapKey {
    pub idx: u32,
    pub toggles: bool,
    pub last_ip: LastIp,
    pub bytes: [u64; WORDS],
}

impl LeapKey {
    /// The key of the station at trace position `pos` (the bytes from
    /// there must all be in `data`).
    #[inline(always)]
    pub(crate) fn at(
        data: &[u8],
        pos: usize,
        idx: u32,
        last_ip: LastIp,
        toggles: bool,
    ) -> Option<Self> {
        let window: &[u8; LEAP_BYTES] = data.get(pos..)?.first_chunk()?;
        let mut bytes = [0u64; WORDS];
        for (w, chunk) in bytes.iter_mut().zip(window.chunks_exact(8)) {
            *w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        }
        Some(Self {
            idx,
            toggles,
            last_ip,
            bytes,
        })
    }

    /// The key's hash: its slot and its fingerprint.
    #[inline(always)]
    fn hash(&self) -> u64 {
        let mut h = (u64::from(self.idx) | u64::from(self.toggles) << 32)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ self.last_ip.raw();
        for w in self.bytes {
            h = (h ^ w).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        }
        h
    }
}

/// The first of the two slots of a key whose hash is `h`.
#[inline(always)]
fn slot_of(h: u64) -> usize {
    (h >> 40) as usize & (SLOTS - 2)
}

/// Where the last counted instructions were taken after a leap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LastAt {
    /// At `at` bytes past the leap's start, `insns` of them.
    Within { at: u32, insns: u64 },
    /// Still at the trace offset the counts ended at before it, with
    /// `insns` more.
    Before { insns: u64 },
}

/// Where a leap lands and what it counts on the way: the sprint's state
/// at the station it ends at, positions relative to where it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeapTo {
    /// The trace position and the offset the lane reports there.
    pub pos: u32,
    pub offset: u32,
    /// The TNT bits and their count (none: it is a station), the
    /// instructions since the trace was last asked, the last IP.
    pub bits: u64,
    pub left: u8,
    pub icount: u32,
    pub last_ip: LastIp,
    /// The last block run, and the block the next step starts from.
    pub last: u32,
    pub idx: u32,
    /// The sink's room it takes: the steps' checks all pass with this
    /// much.
    pub room: u32,
    /// The runs and instructions counted (after the block pending before
    /// it), where the last ones were taken and where the counts end.
    pub runs: u32,
    pub insns: u64,
    pub last_at: LastAt,
    pub end: u32,
    /// The block run alone at its end, not counted yet: its index, its
    /// instructions and the offset it was taken to.
    pub pending: Option<(u32, u32, u32)>,
    /// The events passed over (disable/enable pairs, two each).
    pub events: u32,
    /// Its return stack operations ([`LeapTo::replay`]): the addresses
    /// pushed, in order, with a bit set in `pops` for each that is a pop
    /// instead. A pop of an address pushed before the leap (a compressed
    /// return to a call made before it) also has a bit in `older`, and in
    /// `pushed` the address it went to: the leap is only taken where the
    /// stack holds those ([`LeapTo::guards_hold`]).
    pushed: [u64; LEAP_OPS],
    pops: u32,
    older: u32,
    ops_len: u8,
}

impl LeapTo {
    /// A landing with its return stack operations `ops`, taken from return
    /// stack `stack`: its pops of older entries (pops with none of its own
    /// pushes left to pop) went to `stack`'s entries from the top down.
    /// `None` if there are more than [`LEAP_OPS`] operations, or fewer
    /// entries than such pops.
    pub(crate) fn new(
        (pos, offset): (u32, u32),
        (bits, left, icount, last_ip): (u64, u8, u32, LastIp),
        (last, idx, room): (u32, u32, u32),
        (runs, insns, last_at, end): (u32, u64, LastAt, u32),
        pending: Option<(u32, u32, u32)>,
        events: u32,
        (ops, stack): (&[StackOp], &RetStack),
    ) -> Option<Self> {
        if ops.len() > LEAP_OPS {
            return None;
        }
        let (mut pushed, mut pops, mut older) = ([0; LEAP_OPS], 0u32, 0u32);
        let (mut own, mut depth) = (0usize, 0usize);
        for (i, op) in ops.iter().enumerate() {
            match *op {
                StackOp::Push(ret) => {
                    pushed[i] = ret;
                    own += 1;
                }
                StackOp::Pop => {
                    pops |= 1 << i;
                    if own > 0 {
                        own -= 1;
                    } else {
                        older |= 1 << i;
                        pushed[i] = stack.peek_at(depth)?;
                        depth += 1;
                    }
                }
            }
        }
        Some(Self {
            pos,
            offset,
            bits,
            left,
            icount,
            last_ip,
            last,
            idx,
            room,
            runs,
            insns,
            last_at,
            end,
            pending,
            events,
            pushed,
            pops,
            older,
            ops_len: ops.len() as u8,
        })
    }

    /// Whether `stack` holds the addresses the leap's pops of older
    /// entries went to: the `n`th such pop takes the entry `n` below the
    /// top of the stack the leap starts from (its own pushes are all
    /// popped by then). A leap with none holds anywhere.
    #[inline(always)]
    pub(crate) fn guards_hold(&self, stack: &RetStack) -> bool {
        if self.older == 0 {
            return true;
        }
        self.guards_hold_slow(stack)
    }

    #[inline(never)]
    fn guards_hold_slow(&self, stack: &RetStack) -> bool {
        let mut depth = 0;
        for (i, &ret) in self.pushed.iter().enumerate() {
            if self.older & (1 << i) != 0 {
                if stack.peek_at(depth) != Some(ret) {
                    return false;
                }
                depth += 1;
            }
        }
        true
    }

    /// Its return stack operations, in order, done to `stack`.
    #[inline(always)]
    pub(crate) fn replay(&self, stack: &mut RetStack) {
        for (i, &ret) in self
            .pushed
            .iter()
            .enumerate()
            .take(usize::from(self.ops_len))
        {
            if self.pops & (1 << i) != 0 {
                stack.pop();
            } else {
                stack.push(ret);
            }
        }
    }
}

/// What recording a leap adds to the memo's debt; a leap taken from the
/// memo pays back half of it, a station passed with no entry one
/// [`RECORD_COST`]th. A dry run costs a little more than the steps it
/// records, a leap taken saves a little less than those: it pays where a
/// leap recorded is taken twice (on gzip's trace, repeated, where one in
/// two is, recording cost 4% more than it saved). Where none are taken
/// (a trace decoded once, of code that does not repeat itself byte for
/// byte), one station in 256 is tried. A dry run that reaches no
/// station costs three times as much: all its steps are taken again.
const RECORD_COST: u32 = 256;
/// The debt past which no leap is recorded: 64 records in a row that are
/// never taken.
const MAX_DEBT: u32 = 64 * RECORD_COST;

/// Bits of the memo's filter of where leaps start ([`LeapMemo::may_start`]).
const START_BITS: usize = 1 << 19;

/// What the memo knows of a station ([`LeapMemo::get`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Landing<'a> {
    /// The leap from there.
    To(&'a LeapTo),
    /// The steps from there reach no other station within the key's bytes.
    Nowhere,
}

/// A slot's entry ([`Entry`]).
type Slot = Option<Entry>;

/// A slot's entry: the key's hash, which tells most other keys of the
/// set apart in the slot itself, and the key with its landing (`None`:
/// nowhere), boxed. In the slot, the key and landing made the memo 6.9
/// MB (~1,700 page faults, ~4 ms here, for every decode, half a short
/// trace's time, and a set's keys 850 bytes apart); the key alone, 1 MB;
/// as a hash, 256 KB, which stays in a core's second-level cache.
#[derive(Clone, Debug)]
struct Entry {
    hash: u64,
    kept: Box<Kept>,
}

/// A key and what the steps from its station do (`None`: nowhere).
#[derive(Clone, Debug)]
struct Kept {
    key: LeapKey,
    to: Option<LeapTo>,
}

/// The memo: see the module documentation. An entry with no landing says
/// the steps from its station reach no other station within its bytes.
///
/// Where the trace seldom comes back to the same bytes (gzip's loop over
/// its data: a TNT bit per byte compressed), leaps would be recorded and
/// never taken, each dry run costing about what the steps cost. So
/// recording runs up a debt, which leaps taken pay back; past
/// [`MAX_DEBT`] nothing is recorded, and stations passed step by step
/// pay back a little each, so recording is tried again now and then.
#[derive(Clone, Debug, Default)]
pub(crate) struct LeapMemo {
    /// Allocated on first use.
    slots: Vec<Slot>,
    /// A bit set for each (block, first eight bytes) a leap kept starts
    /// from, by hash: a station that is not set has no leap, told in one
    /// load where looking it up reads its bytes and two slots. Allocated
    /// with the slots.
    starts: Vec<u64>,
    debt: u32,
    /// A dry run's return stack operations, kept from one to the next.
    scratch: Vec<StackOp>,
}

impl LeapMemo {
    /// Forgets every leap.
    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.starts.iter_mut().for_each(|w| *w = 0);
        self.debt = 0;
    }

    /// The filter's bit for a leap from block `idx` whose trace starts
    /// with the eight bytes `word`: its word and mask.
    #[inline(always)]
    fn start_bit(idx: u32, word: u64) -> (usize, u64) {
        let h = (word ^ u64::from(idx).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        let bit = (h >> 40) as usize & (START_BITS - 1);
        (bit / 64, 1 << (bit % 64))
    }

    /// Whether a leap may be kept from block `idx` where the trace's next
    /// eight bytes are `word` (`false`: none is).
    #[inline(always)]
    pub(crate) fn may_start(&self, idx: u32, word: u64) -> bool {
        let (at, mask) = Self::start_bit(idx, word);
        self.starts.get(at).is_some_and(|w| w & mask != 0)
    }

    /// Whether leaps are recorded (see [`LeapMemo`]).
    #[inline(always)]
    pub(crate) fn records(&self) -> bool {
        self.debt < MAX_DEBT
    }

    /// A leap was taken from the memo.
    #[inline(always)]
    pub(crate) fn took(&mut self) {
        self.debt = self.debt.saturating_sub(RECORD_COST / 2);
    }

    /// The buffer for a dry run's return stack operations, empty: handed
    /// back with [`put_scratch`](Self::put_scratch).
    pub(crate) fn take_scratch(&mut self) -> Vec<StackOp> {
        let mut ops = std::mem::take(&mut self.scratch);
        ops.clear();
        ops
    }

    /// Hands the buffer back.
    pub(crate) fn put_scratch(&mut self, ops: Vec<StackOp>) {
        self.scratch = ops;
    }

    /// A dry run reached no station: its steps are all taken again.
    pub(crate) fn wasted(&mut self) {
        self.debt = self.debt.saturating_add(2 * RECORD_COST);
    }

    /// `n` stations with no entry were passed step by step.
    pub(crate) fn passed(&mut self, n: u32) {
        self.debt = self.debt.saturating_sub(n);
    }

    /// How many leaps are kept (stations that lead nowhere aside).
    pub(crate) fn len(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.as_ref().is_some_and(|e| e.kept.to.is_some()))
            .count()
    }

    /// What is known of the station `key`.
    #[inline(always)]
    pub(crate) fn get(&self, key: &LeapKey) -> Option<Landing<'_>> {
        let h = key.hash();
        let at = slot_of(h);
        let set = self.slots.get(at..at + 2)?;
        set.iter()
            .flatten()
            .find(|e| e.hash == h && e.kept.key == *key)
            .map(|e| e.kept.to.as_ref().map_or(Landing::Nowhere, Landing::To))
    }

    /// Remembers what the steps from `key` do (`to`) in the first slot of
    /// its set, the entry there moved to the second (whose entry goes).
    pub(crate) fn insert(&mut self, key: LeapKey, to: Option<LeapTo>) {
        if self.slots.is_empty() {
            self.slots = vec![None; SLOTS];
            self.starts = vec![0; START_BITS / 64];
        }
        self.debt = self.debt.saturating_add(RECORD_COST);
        if to.is_some() {
            let (at, mask) = Self::start_bit(key.idx, key.bytes[0]);
            self.starts[at] |= mask;
        }
        let hash = key.hash();
        let at = slot_of(hash);
        if let Some([first, second]) = self
            .slots
            .get_mut(at..at + 2)
            .and_then(|s| s.first_chunk_mut())
        {
            if first
                .as_ref()
                .is_none_or(|e| e.hash != hash || e.kept.key != key)
            {
                *second = first.take();
            }
            *first = Some(Entry {
                hash,
                kept: Box::new(Kept { key, to }),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn landing(ops: &[StackOp]) -> Option<LeapTo> {
        landing_expecting(ops, &[])
    }

    /// A landing whose pops of older entries went to `expected`: taken
    /// from a stack holding those, the first on top.
    fn landing_expecting(ops: &[StackOp], expected: &[u64]) -> Option<LeapTo> {
        let mut stack = RetStack::new();
        expected.iter().rev().for_each(|&e| stack.push(e));
        LeapTo::new(
            (9, 10),
            (0, 0, 3, LastIp::new()),
            (4, 5, 6),
            (6, 40, LastAt::Within { at: 10, insns: 7 }, 10),
            Some((5, 3, 10)),
            2,
            (ops, &stack),
        )
    }

    #[test]
    fn a_leap_is_found_by_its_whole_key_with_its_operations() {
        let data: Vec<u8> = (1..=80).collect();
        let mut memo = LeapMemo::default();
        let key = LeapKey::at(&data, 3, 7, LastIp::new(), true).unwrap();
        assert_eq!(memo.get(&key), None);
        let ops = [StackOp::Push(0x40_1005), StackOp::Pop];
        memo.insert(key, landing(&ops));
        let Some(Landing::To(&to)) = memo.get(&key) else {
            panic!("no landing")
        };
        assert_eq!(Some(to), landing(&ops));
        // Other bytes, another block or another last IP are other keys.
        assert_eq!(
            memo.get(&LeapKey::at(&data, 4, 7, LastIp::new(), true).unwrap()),
            None
        );
        assert_eq!(memo.get(&LeapKey { idx: 8, ..key }), None);
        assert_eq!(
            memo.get(&LeapKey {
                toggles: false,
                ..key
            }),
            None
        );
        let mut other_ip = LastIp::new();
        other_ip.update_raw(0x4d, 0x1234);
        assert_eq!(
            memo.get(&LeapKey {
                last_ip: other_ip,
                ..key
            }),
            None
        );
        assert!(memo.may_start(key.idx, key.bytes[0]));
        // A station that leads nowhere is remembered as such.
        let nowhere = LeapKey::at(&data, 20, 7, LastIp::new(), true).unwrap();
        memo.insert(nowhere, None);
        assert_eq!(memo.get(&nowhere), Some(Landing::Nowhere));
        assert!(!memo.may_start(nowhere.idx, nowhere.bytes[0]));
        memo.clear();
        assert_eq!(memo.get(&key), None);
        assert!(!memo.may_start(key.idx, key.bytes[0]));
    }

    #[test]
    fn two_keys_of_a_set_are_both_kept_and_a_third_evicts_the_older() {
        let data: Vec<u8> = (1..=64).collect();
        let keys: Vec<LeapKey> = (0..SLOTS as u32 * 4)
            .map(|idx| LeapKey::at(&data, 0, idx, LastIp::new(), true).unwrap())
            .collect();
        let set = |k: &LeapKey| slot_of(k.hash());
        let first = keys[0];
        let mates: Vec<LeapKey> = keys[1..]
            .iter()
            .filter(|k| set(k) == set(&first))
            .copied()
            .collect();
        let (second, third) = (mates[0], mates[1]);
        let mut memo = LeapMemo::default();
        memo.insert(first, None);
        memo.insert(second, landing(&[]));
        assert_eq!(memo.get(&first), Some(Landing::Nowhere));
        assert_eq!(memo.get(&second), landing(&[]).as_ref().map(Landing::To));
        // Put again, an entry stays where it is and replaces itself.
        memo.insert(second, None);
        assert_eq!(memo.get(&second), Some(Landing::Nowhere));
        assert_eq!(memo.get(&first), Some(Landing::Nowhere));
        memo.insert(third, None);
        assert_eq!(memo.get(&third), Some(Landing::Nowhere));
        assert_eq!(memo.get(&second), Some(Landing::Nowhere));
        assert_eq!(memo.get(&first), None);
    }

    #[test]
    fn recording_stops_when_leaps_are_not_taken_and_is_tried_again() {
        let data = [0x0au8; 64];
        let key = LeapKey::at(&data, 0, 1, LastIp::new(), true).unwrap();
        let mut memo = LeapMemo::default();
        for _ in 0..MAX_DEBT / RECORD_COST {
            assert!(memo.records());
            memo.insert(key, None);
        }
        assert!(!memo.records());
        // Leaps taken pay the debt back, two a record.
        memo.took();
        assert!(memo.records());
        memo.insert(key, None);
        memo.took();
        assert!(!memo.records());
        memo.took();
        assert!(memo.records());
        memo.insert(key, None);
        assert!(!memo.records());
        memo.took();
        memo.took();
        // A dry run that reached nothing costs three records.
        memo.insert(key, None);
        memo.wasted();
        for _ in 0..5 {
            memo.took();
            assert!(!memo.records());
        }
        memo.took();
        assert!(memo.records());
        memo.insert(key, None);
        // So do stations passed, a little each.
        memo.passed(RECORD_COST / 2);
        assert!(!memo.records());
        memo.passed(RECORD_COST / 2);
        assert!(memo.records());
        memo.insert(key, None);
        memo.clear();
        assert!(memo.records());
    }

    #[test]
    fn a_key_needs_all_its_bytes() {
        let data = [0u8; LEAP_BYTES + 2];
        assert!(LeapKey::at(&data, 2, 0, LastIp::new(), true).is_some());
        assert!(LeapKey::at(&data, 3, 0, LastIp::new(), true).is_none());
    }

    /// What replaying `ops` does to a stack holding 1 and 2.
    fn replayed(to: &LeapTo) -> Vec<u64> {
        let mut stack = RetStack::new();
        stack.push(1);
        stack.push(2);
        to.replay(&mut stack);
        std::iter::from_fn(|| stack.pop()).collect()
    }

    #[test]
    fn a_landing_replays_its_operations_in_order() {
        use StackOp::{Pop, Push};
        // The first pop takes an entry from before the leap (2).
        let ops = [Pop, Push(7), Push(8), Pop, Push(9), Pop, Pop, Push(3)];
        assert_eq!(landing(&ops), None, "an older pop needs its address");
        assert_eq!(replayed(&landing_expecting(&ops, &[2]).unwrap()), [3, 1]);
        assert_eq!(replayed(&landing(&[]).unwrap()), [2, 1]);
        // Up to LEAP_OPS of them.
        let many = [Push(5); LEAP_OPS + 1];
        assert_eq!(
            replayed(&landing(&many[..LEAP_OPS]).unwrap()).len(),
            2 + LEAP_OPS
        );
        assert_eq!(landing(&many), None);
    }

    /// A leap that returns to calls made before it is taken only where
    /// the stack holds the addresses it returned to, the `n`th such
    /// return taking the entry `n` below the top; its own pushes and pops
    /// in between do not count.
    #[test]
    fn older_pops_guard_the_leap_by_the_addresses_they_went_to() {
        use StackOp::{Pop, Push};
        let stack = |entries: &[u64]| {
            let mut s = RetStack::new();
            entries.iter().for_each(|&e| s.push(e));
            s
        };
        let ops = [Pop, Push(7), Pop, Pop, Push(8)];
        let to = landing_expecting(&ops, &[0x20, 0x10]).unwrap();
        assert!(to.guards_hold(&stack(&[0x10, 0x20])));
        assert!(to.guards_hold(&stack(&[0x99, 0x10, 0x20])));
        assert!(!to.guards_hold(&stack(&[0x20, 0x10])));
        assert!(!to.guards_hold(&stack(&[0x20])), "too few entries");
        assert!(!to.guards_hold(&stack(&[0x11, 0x20])));
        let mut s = stack(&[0x99, 0x10, 0x20]);
        to.replay(&mut s);
        assert_eq!(
            std::iter::from_fn(|| s.pop()).collect::<Vec<_>>(),
            [8, 0x99]
        );
        // Pops of its own pushes only: no guard.
        let own = landing(&[Push(7), Pop, Push(8)]).unwrap();
        assert!(own.guards_hold(&RetStack::new()));
        // More addresses than older pops are ignored; fewer are refused.
        assert!(landing_expecting(&ops, &[0x20, 0x10, 0x5]).is_some());
        assert_eq!(landing_expecting(&ops, &[0x20]), None);
    }
}
