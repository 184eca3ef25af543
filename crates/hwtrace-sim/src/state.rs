//! The encoder's small state machines: the TNT buffer and the call stack
//! used for return compression, each as the hardware keeps it.

use hwtrace_packet::Tnt;
use hwtrace_types::Ip;

/// Taken/not-taken bits waiting to be written (SDM vol. 3C, 33.4.2.1 "Taken/
/// Not-taken (TNT) Packet"): the processor collects conditional-branch and
/// compressed-RET outcomes and writes them as one TNT packet when the packet
/// is full or when another packet must follow them in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TntBuffer {
    bits: u64,
    len: u8,
    long: bool,
}

impl TntBuffer {
    /// A buffer that fills short (TNT-8, 6 bits) or long (TNT-64, 47 bits)
    /// packets.
    pub(crate) fn new(long: bool) -> Self {
        TntBuffer {
            bits: 0,
            len: 0,
            long,
        }
    }

    fn capacity(&self) -> u8 {
        if self.long {
            Tnt::MAX_LONG
        } else {
            Tnt::MAX_SHORT
        }
    }

    /// Records one outcome; returns the packet when this bit filled it.
    pub(crate) fn push(&mut self, taken: bool) -> Option<Tnt> {
        self.bits = (self.bits << 1) | u64::from(taken);
        self.len += 1;
        if self.len >= self.capacity() {
            self.flush()
        } else {
            None
        }
    }

    /// The pending bits as a packet, if any; the buffer is then empty.
    pub(crate) fn flush(&mut self) -> Option<Tnt> {
        if self.len == 0 {
            return None;
        }
        let tnt = Tnt {
            bits: self.bits,
            len: self.len,
            long: self.long,
        };
        self.bits = 0;
        self.len = 0;
        Some(tnt)
    }
}

/// The call stack for RET compression (SDM vol. 3C, 33.4.2.2, "Indirect
/// Transfer Compression for Returns (RET)"): the next IPs of the youngest
/// 64 near CALLs; once full, a new CALL pushes the oldest entry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetStack {
    /// A ring of `DEPTH` entries; `top` is the next free slot.
    entries: [u64; Self::DEPTH],
    top: usize,
    len: usize,
}

impl RetStack {
    /// The number of entries the hardware keeps.
    pub(crate) const DEPTH: usize = 64;

    pub(crate) fn new() -> Self {
        RetStack {
            entries: [0; Self::DEPTH],
            top: 0,
            len: 0,
        }
    }

    pub(crate) fn push(&mut self, ip: Ip) {
        self.entries[self.top] = ip.0;
        self.top = (self.top + 1) % Self::DEPTH;
        self.len = (self.len + 1).min(Self::DEPTH);
    }

    /// The youngest entry.
    pub(crate) fn top(&self) -> Option<Ip> {
        (self.len > 0).then(|| Ip(self.entries[(self.top + Self::DEPTH - 1) % Self::DEPTH]))
    }

    pub(crate) fn pop(&mut self) -> Option<Ip> {
        let ip = self.top()?;
        self.top = (self.top + Self::DEPTH - 1) % Self::DEPTH;
        self.len -= 1;
        Some(ip)
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_tnt_fills_at_six_oldest_bit_first() {
        let mut b = TntBuffer::new(false);
        for taken in [true, false, true, true, false] {
            assert_eq!(b.push(taken), None);
        }
        let t = b.push(true).unwrap();
        assert_eq!((t.len, t.long), (6, false));
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            [true, false, true, true, false, true]
        );
        assert_eq!(b.flush(), None);
    }

    #[test]
    fn long_tnt_fills_at_47_and_flush_gives_partial_packets() {
        let mut b = TntBuffer::new(true);
        for i in 0..46 {
            assert_eq!(b.push(i % 3 == 0), None);
        }
        let t = b.push(false).unwrap();
        assert_eq!((t.len, t.long), (47, true));
        assert!(t.taken(0) && !t.taken(1) && !t.taken(46));
        b.push(true);
        let t = b.flush().unwrap();
        assert_eq!((t.bits, t.len), (1, 1));
    }

    #[test]
    fn ret_stack_keeps_the_youngest_64() {
        let mut s = RetStack::new();
        assert_eq!(s.pop(), None);
        for i in 0..70u64 {
            s.push(Ip(i));
        }
        for i in (6..70u64).rev() {
            assert_eq!(s.pop(), Some(Ip(i)));
        }
        assert_eq!(s.pop(), None);
        s.push(Ip(1));
        s.clear();
        assert_eq!(s.top(), None);
    }
}
