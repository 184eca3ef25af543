//! Eight TNT-8 packets' paths, remembered together.
//!
//! Loops write long runs of TNT-8 packets one right after another: on the
//! benchmark's real traces a TNT-8 packet is followed by another in four
//! cases of five, and runs of 16 or more hold well over half of them. A
//! counting sprint ([`straight`](super::decoder)) takes such a run packet
//! by packet: each packet's path is found through two tables and its
//! record, and the next packet's lookup waits on the block the path ends
//! at, a chain of dependent loads at every packet. What eight packets in
//! a row do from a block depends only on that block and their eight bytes
//! (the same code with the same bits always goes the same way), so it is
//! kept here by them, summed up, and the next eight packets after the
//! same block and bytes are one lookup: iptr-edge-analyzer caches 32 TNT
//! bits across packets the same way.
//!
//! Only eight whole paths one after the other, each ending at the
//! conditional jump the next one starts from and none touching the
//! return stack, are remembered; anything else is taken packet by packet
//! as before. The memo lives in the
//! [`BlockCache`](super::blockcache::BlockCache) whose block indices it
//! holds and is forgotten with its paths.

/// How many TNT-8 packets an entry stands for (at most eight: their
/// bytes are one `u64`). With four, gzip's trace ran 1.7% fewer
/// instructions (its runs are cut short by compressed returns), the real
/// traces 1.3% more and Unzip's 5% more (callgrind).
pub(crate) const OCTET: usize = 8;

/// Slots of the memo (direct-mapped by key; 256 KiB).
const SLOTS: usize = 1 << 13;

/// Eight paths summed up: see the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Octet {
    /// The eight packets' bytes, the first one lowest.
    pub bytes: u64,
    /// The block the first path starts from ([`NO_BLOCK`](super::NO_BLOCK):
    /// an empty slot).
    pub start: u32,
    /// The block the last path ends at (a conditional jump).
    pub next: u32,
    /// The last path's last block.
    pub last: u32,
    /// The runs of all eight paths.
    pub runs: u32,
    /// The instructions of all eight paths.
    pub insns: u32,
    /// The last path's instructions after its first run (what is executed
    /// after its packet).
    pub rest: u32,
}

const EMPTY: Octet = Octet {
    bytes: 0,
    start: super::NO_BLOCK,
    next: super::NO_BLOCK,
    last: super::NO_BLOCK,
    runs: 0,
    insns: 0,
    rest: 0,
};

/// The memo: see the module documentation.
#[derive(Clone, Debug, Default)]
pub(crate) struct OctetMemo {
    /// Allocated on first use.
    slots: Vec<Octet>,
}

impl OctetMemo {
    fn slot(start: u32, bytes: u64) -> usize {
        let h = (bytes ^ u64::from(start).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
        (h >> 40) as usize & (SLOTS - 1)
    }

    /// The entry for the eight packets `bytes` from block `start`.
    #[inline(always)]
    pub(crate) fn get(&self, start: u32, bytes: u64) -> Option<&Octet> {
        let e = self.slots.get(Self::slot(start, bytes))?;
        (e.start == start && e.bytes == bytes).then_some(e)
    }

    /// Keeps `octet`, replacing whatever shared its slot.
    pub(crate) fn put(&mut self, octet: Octet) {
        if self.slots.is_empty() {
            self.slots = vec![EMPTY; SLOTS];
        }
        if let Some(s) = self.slots.get_mut(Self::slot(octet.start, octet.bytes)) {
            *s = octet;
        }
    }

    /// How many entries are kept.
    pub(crate) fn len(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.start != super::NO_BLOCK)
            .count()
    }

    /// Forgets every entry (their block indices or paths are gone).
    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = EMPTY);
    }
}

/// The eight bytes at `at` (never 0, the key of an empty slot) if they
/// and the one after are TNT-8 packets' and the lane reads the one after
/// those ([`lane_reads`]): eight packets a straight run takes, each
/// followed by a TNT-8 packet and that by a packet with no PAD before it.
///
/// [`lane_reads`]: crate::event::lane_reads
#[inline(always)]
pub(crate) fn octet_at(data: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; OCTET + 2] = *data.get(at..at + OCTET + 2)?.first_chunk()?;
    // The byte after the eight first: where the packets before it are
    // not all TNT-8 ones, it rarely is one either, and a short run is
    // told in one comparison.
    crate::event::tnt8(bytes[OCTET])?;
    if !crate::event::lane_reads(bytes[OCTET + 1]) {
        return None;
    }
    // The packets' bytes, the first lowest (up to eight of them).
    let mut word = [0u8; 8];
    word[..OCTET].copy_from_slice(&bytes[..OCTET]);
    let w = u64::from_le_bytes(word);
    // A TNT-8 byte is even and above 2 (a stop bit at bit 2 or higher).
    const MASK: u64 = u64::MAX >> (64 - 8 * OCTET);
    const LOW: u64 = 0x0101_0101_0101_0101 & MASK;
    const HIGH: u64 = 0x8080_8080_8080_8080 & MASK;
    let stop = w & 0xfcfc_fcfc_fcfc_fcfc & MASK;
    let some_zero = stop.wrapping_sub(LOW) & !stop & HIGH;
    (w & LOW == 0 && some_zero == 0).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{lane_reads, tnt8};

    /// `octet_at` by its definition, byte by byte.
    fn octet_by_bytes(data: &[u8], at: usize) -> Option<u64> {
        let b = data.get(at..at + OCTET + 2)?;
        let all = b[..=OCTET].iter().all(|&x| tnt8(x).is_some()) && lane_reads(b[OCTET + 1]);
        let mut word = [0u8; 8];
        word[..OCTET].copy_from_slice(&b[..OCTET]);
        all.then(|| u64::from_le_bytes(word))
    }

    #[test]
    fn octets_are_found_as_byte_by_byte() {
        // Every byte value in every position, the others a plain TNT-8.
        for pos in 0..OCTET + 2 {
            for v in 0..=255u8 {
                let mut data = [0x0cu8; OCTET + 3];
                data[pos] = v;
                assert_eq!(octet_at(&data, 0), octet_by_bytes(&data, 0), "{pos} {v:#x}");
            }
        }
        // Too short, and at an offset.
        let data = [0x06u8; OCTET + 1];
        assert_eq!(octet_at(&data, 0), None);
        let mut data = [0x06u8; OCTET + 4];
        data[0] = 0x00;
        assert_eq!(octet_at(&data, 0), None);
        assert_eq!(octet_at(&data, 1), Some(0x0606_0606_0606_0606));
        assert_eq!(octet_at(&data, 3), None);
    }

    #[test]
    fn entries_are_found_by_block_and_bytes_until_cleared() {
        let mut memo = OctetMemo::default();
        assert_eq!(memo.get(3, 0x0606), None);
        let o = Octet {
            bytes: 0x0606,
            start: 3,
            next: 9,
            last: 8,
            runs: 12,
            insns: 100,
            rest: 7,
        };
        memo.put(o);
        assert_eq!(memo.len(), 1);
        assert_eq!(memo.get(3, 0x0606), Some(&o));
        assert_eq!(memo.get(4, 0x0606), None);
        assert_eq!(memo.get(3, 0x0608), None);
        memo.clear();
        assert_eq!(memo.get(3, 0x0606), None);
        assert_eq!(memo.len(), 0);
    }
}
