//! The return stack for return compression (SDM vol. 3C, 33.4.2.1
//! "Indirect Transfer Compression for Returns"): a near return whose
//! target is the address after the matching call is reported as one taken
//! TNT bit; the decoder keeps the calls to know that address.

/// How many return addresses the hardware keeps (and so do we).
pub const RETSTACK_SIZE: usize = 64;

/// A bounded stack of return addresses; the oldest is dropped when full.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetStack {
    entries: [u64; RETSTACK_SIZE],
    top: usize,
    len: usize,
}

impl Default for RetStack {
    fn default() -> Self {
        Self::new()
    }
}

impl RetStack {
    /// An empty stack.
    pub const fn new() -> Self {
        Self {
            entries: [0; RETSTACK_SIZE],
            top: 0,
            len: 0,
        }
    }

    /// Whether no address is stored.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.top = 0;
        self.len = 0;
    }

    /// Remembers the return address of a call.
    #[inline]
    pub fn push(&mut self, ip: u64) {
        self.entries[self.top] = ip;
        self.top = (self.top + 1) % RETSTACK_SIZE;
        self.len = (self.len + 1).min(RETSTACK_SIZE);
    }

    /// The most recent return address, left in place.
    #[inline]
    pub fn peek(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        Some(self.entries[(self.top + RETSTACK_SIZE - 1) % RETSTACK_SIZE])
    }

    /// The return address `depth` entries below the most recent one (0:
    /// the most recent), left in place.
    #[inline]
    pub fn peek_at(&self, depth: usize) -> Option<u64> {
        if depth >= self.len {
            return None;
        }
        Some(self.entries[(self.top + 2 * RETSTACK_SIZE - 1 - depth) % RETSTACK_SIZE])
    }

    /// The most recent return address, removed.
    #[inline]
    pub fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        self.top = (self.top + RETSTACK_SIZE - 1) % RETSTACK_SIZE;
        self.len -= 1;
        Some(self.entries[self.top])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo() {
        let mut s = RetStack::new();
        assert_eq!(s.pop(), None);
        s.push(1);
        s.push(2);
        assert_eq!(s.pop(), Some(2));
        assert_eq!(s.pop(), Some(1));
        assert!(s.is_empty());
    }

    #[test]
    fn full_stack_drops_oldest() {
        let mut s = RetStack::new();
        for i in 0..(RETSTACK_SIZE as u64 + 2) {
            s.push(i);
        }
        for i in (2..(RETSTACK_SIZE as u64 + 2)).rev() {
            assert_eq!(s.pop(), Some(i));
        }
        assert_eq!(s.pop(), None);
    }

    #[test]
    fn peek_at_reads_below_the_top_across_the_wrap() {
        let mut s = RetStack::new();
        assert_eq!(s.peek_at(0), None);
        for i in 0..(RETSTACK_SIZE as u64 + 5) {
            s.push(i);
        }
        assert_eq!(s.peek_at(0), s.peek());
        assert_eq!(s.peek_at(0), Some(RETSTACK_SIZE as u64 + 4));
        assert_eq!(s.peek_at(7), Some(RETSTACK_SIZE as u64 - 3));
        // The oldest kept, and below it nothing (dropped when full).
        assert_eq!(s.peek_at(RETSTACK_SIZE - 1), Some(5));
        assert_eq!(s.peek_at(RETSTACK_SIZE), None);
        s.pop();
        assert_eq!(s.peek_at(RETSTACK_SIZE - 2), Some(5));
        assert_eq!(s.peek_at(RETSTACK_SIZE - 1), None);
    }
}
