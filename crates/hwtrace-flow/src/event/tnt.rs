//! The TNT cache: taken/not-taken bits waiting for conditional branches and
//! compressed returns to consume them, oldest first.

use hwtrace_packet::Tnt;

/// The low `n` bits of `bits` (all of them from 64 on).
#[inline(always)]
pub(crate) const fn low_bits(bits: u64, n: u8) -> u64 {
    if n >= 64 {
        bits
    } else {
        bits & ((1u64 << n) - 1)
    }
}

/// Bits from one TNT packet, consumed one branch at a time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TntCache {
    bits: u64,
    /// How many bits remain; bit `left - 1` of `bits` is the next one.
    left: u8,
}

impl TntCache {
    /// An empty cache.
    pub const fn new() -> Self {
        Self { bits: 0, left: 0 }
    }

    /// Whether every bit has been used.
    pub const fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// Drops any bits left.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// Loads the bits of `tnt`, replacing what was left.
    pub fn load(&mut self, tnt: &Tnt) {
        self.bits = tnt.bits;
        self.left = tnt.len.min(64);
    }

    /// The next branch without using it up: `Some(true)` if taken;
    /// `None` when empty.
    #[inline]
    pub const fn peek(&self) -> Option<bool> {
        if self.left == 0 {
            return None;
        }
        Some((self.bits >> (self.left - 1)) & 1 != 0)
    }

    /// The bits left, the next one highest, and how many: what decides
    /// the branches until the cache is empty.
    #[inline]
    pub const fn pending(&self) -> (u64, u8) {
        (low_bits(self.bits, self.left), self.left)
    }

    /// The next branch: `Some(true)` if taken; `None` when empty.
    pub fn take(&mut self) -> Option<bool> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some((self.bits >> self.left) & 1 != 0)
    }

    /// Drops the next `n` bits (all of them if fewer are left).
    pub fn skip(&mut self, n: u8) {
        self.left = self.left.saturating_sub(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_come_out_oldest_first() {
        let mut c = TntCache::new();
        assert!(c.is_empty());
        c.load(&Tnt {
            bits: 0b110,
            len: 3,
            long: false,
        });
        assert_eq!(c.peek(), Some(true));
        assert_eq!(c.take(), Some(true));
        assert_eq!(c.take(), Some(true));
        assert_eq!(c.peek(), Some(false));
        assert_eq!(c.take(), Some(false));
        assert_eq!(c.peek(), None);
        assert_eq!(c.take(), None);
        assert!(c.is_empty());
    }

    #[test]
    fn pending_bits_are_the_ones_left() {
        let mut c = TntCache::new();
        assert_eq!(c.pending(), (0, 0));
        c.load(&Tnt {
            bits: 0b1_0110,
            len: 5,
            long: false,
        });
        assert_eq!(c.pending(), (0b1_0110, 5));
        c.take();
        c.take();
        assert_eq!(c.pending(), (0b110, 3));
        c.load(&Tnt {
            bits: u64::MAX >> 17,
            len: 47,
            long: true,
        });
        assert_eq!(c.pending(), (u64::MAX >> 17, 47));
    }

    #[test]
    fn clear_empties() {
        let mut c = TntCache::new();
        c.load(&Tnt {
            bits: 1,
            len: 1,
            long: false,
        });
        c.clear();
        assert_eq!(c.take(), None);
    }
}
