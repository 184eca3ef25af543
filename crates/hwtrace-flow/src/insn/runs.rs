//! [`RunBuffer`]: many [`BlockRun`]s from one call of
//! [`FastDecoder::next_runs`](super::FastDecoder::next_runs).
//!
//! A burst of runs comes from code where nothing but TNT bits, TIPs and
//! direct branches happened, so the address space, the execution mode and
//! the transaction state cannot change inside it: they are kept once for
//! the buffer, and each run stores only what differs (32 bytes instead of
//! a whole [`BlockRun`]). The buffer is allocated once, at its capacity,
//! and reused: filling it never allocates.

use super::blockcache::PathRun;
use super::classify::InsnClass;
use super::fast::BlockRun;
use hwtrace_packet::ExecMode;
use hwtrace_types::{AddressSpace, Ip, TraceOffset};

/// How many runs [`RunBuffer::new`] holds: enough that the call per burst
/// costs nothing next to the blocks, few enough to stay in the L1 cache.
pub const DEFAULT_RUN_CAPACITY: usize = 256;

/// What one run of a burst stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    ip: Ip,
    end_ip: Ip,
    offset: TraceOffset,
    insns: u32,
    end_class: InsnClass,
    end_size: u8,
}

impl Entry {
    #[inline]
    fn new(r: &PathRun, offset: TraceOffset) -> Self {
        Self {
            ip: r.ip,
            end_ip: r.end_ip,
            offset,
            insns: r.insns,
            end_class: r.class,
            end_size: r.end_size,
        }
    }
}

/// A fixed-capacity buffer of runs executed one after the other, in the
/// same address space, mode and transaction state.
#[derive(Clone, Debug)]
pub struct RunBuffer {
    entries: Vec<Entry>,
    cap: usize,
    space: AddressSpace,
    mode: Option<ExecMode>,
    speculative: bool,
}

impl Default for RunBuffer {
    fn default() -> Self {
        Self::new()
    }
}

impl RunBuffer {
    /// A buffer of [`DEFAULT_RUN_CAPACITY`] runs.
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_RUN_CAPACITY)
    }

    /// A buffer of `cap` runs (at least one).
    pub fn with_capacity(cap: usize) -> Self {
        let cap = cap.max(1);
        Self {
            entries: Vec::with_capacity(cap),
            cap,
            space: AddressSpace::UNKNOWN,
            mode: None,
            speculative: false,
        }
    }

    /// How many runs it holds at most.
    pub const fn capacity(&self) -> usize {
        self.cap
    }

    /// How many runs it holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no run.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether another run fits.
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.entries.len() >= self.cap
    }

    /// The instructions of all its runs.
    pub fn insns(&self) -> u64 {
        self.entries.iter().map(|e| u64::from(e.insns)).sum()
    }

    /// Run `i`, oldest first.
    pub fn get(&self, i: usize) -> Option<BlockRun> {
        self.entries.get(i).map(|e| self.run(e))
    }

    /// Each run's instruction count and the trace offset after it (what
    /// counting them needs, without building whole runs).
    #[inline]
    pub(crate) fn counts(&self) -> impl Iterator<Item = (u32, TraceOffset)> + '_ {
        self.entries.iter().map(|e| (e.insns, e.offset))
    }

    /// The runs, oldest first.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = BlockRun> + '_ {
        self.entries.iter().map(|e| self.run(e))
    }

    fn run(&self, e: &Entry) -> BlockRun {
        BlockRun {
            ip: e.ip,
            insns: e.insns,
            end_ip: e.end_ip,
            end_class: e.end_class,
            end_size: e.end_size,
            offset: e.offset,
            space: self.space,
            mode: self.mode,
            speculative: self.speculative,
        }
    }

    /// Empties it.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Empties it for a burst in `space`, `mode` and transaction state
    /// `speculative`.
    pub(crate) fn start(&mut self, space: AddressSpace, mode: ExecMode, speculative: bool) {
        self.entries.clear();
        self.space = space;
        self.mode = Some(mode);
        self.speculative = speculative;
    }

    /// Adds a run (the caller checked [`is_full`](Self::is_full)).
    #[inline]
    pub(crate) fn push(&mut self, run: &PathRun, offset: TraceOffset) {
        if self.entries.len() < self.cap {
            self.entries.push(Entry::new(run, offset));
        }
    }
}

impl RunBuffer {
    /// Adds the runs of a TNT path, all at `offset`, as far as they fit.
    #[inline]
    pub(crate) fn push_path(&mut self, runs: &[PathRun], offset: TraceOffset) {
        let room = self.cap.saturating_sub(self.entries.len());
        self.entries
            .extend(runs.iter().take(room).map(|r| Entry::new(r, offset)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_share_space_mode_and_state() {
        let mut b = RunBuffer::with_capacity(2);
        assert_eq!(b.capacity(), 2);
        let space = AddressSpace::with_cr3(hwtrace_types::Cr3(0x5000));
        b.start(space, ExecMode::Bits32, true);
        assert!(b.is_empty());
        let run = |ip: u64, insns: u32, end_ip: u64, class: InsnClass, end_size: u8| PathRun {
            ip: Ip(ip),
            end_ip: Ip(end_ip),
            insns,
            class,
            end_size,
        };
        b.push(&run(0x10, 3, 0x14, InsnClass::Jump, 2), TraceOffset(7));
        b.push(&run(0x40, 1, 0x40, InsnClass::Return, 1), TraceOffset(9));
        assert!(b.is_full());
        // A full buffer takes no more.
        b.push(&run(0x90, 1, 0x90, InsnClass::Return, 1), TraceOffset(9));
        assert_eq!(b.len(), 2);
        assert_eq!(b.insns(), 4);
        let runs: Vec<_> = b.iter().collect();
        assert_eq!(
            runs[0],
            BlockRun {
                ip: Ip(0x10),
                insns: 3,
                end_ip: Ip(0x14),
                end_class: InsnClass::Jump,
                end_size: 2,
                offset: TraceOffset(7),
                space,
                mode: Some(ExecMode::Bits32),
                speculative: true,
            }
        );
        assert_eq!(b.get(1), Some(runs[1]));
        assert_eq!(runs[1].end_class, InsnClass::Return);
        assert_eq!(b.get(2), None);
        b.start(AddressSpace::UNKNOWN, ExecMode::Bits64, false);
        assert!(b.is_empty());
        assert_eq!(b.insns(), 0);
        // A TNT path's runs share the offset; what does not fit is left.
        let r = PathRun {
            ip: Ip(0x20),
            end_ip: Ip(0x22),
            insns: 2,
            class: InsnClass::CondJump,
            end_size: 2,
        };
        b.push_path(&[r, r, r], TraceOffset(5));
        assert_eq!(b.len(), 2);
        assert!(
            b.iter()
                .all(|run| run.offset == TraceOffset(5) && run.ip == Ip(0x20))
        );
    }
}
