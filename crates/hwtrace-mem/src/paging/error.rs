//! Why a translation or an iteration over mappings failed.

use super::{Entry, Level, PagingMode};
use core::fmt;
use hwtrace_types::{Ip, PhysAddr};

/// One step of a walk: the entry used at one level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// The level of the table the entry is in.
    pub level: Level,
    /// The entry's index in its table (0..512).
    pub index: u16,
    /// The physical address of the entry.
    pub entry_addr: PhysAddr,
    /// The entry, with its flags.
    pub entry: Entry,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}[{:#05x}] at {} = {:#018x}",
            self.level.entry_name(),
            self.index,
            self.entry_addr,
            self.entry.raw()
        )
    }
}

/// A failed walk: the linear address and what went wrong where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("translating {va}: {kind}")]
pub struct WalkError {
    /// The linear address being translated (for iteration: the first
    /// address the failing entry covers).
    pub va: Ip,
    /// What failed.
    pub kind: WalkErrorKind,
}

/// What failed in a walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WalkErrorKind {
    /// The address is not canonical in this paging mode (SDM vol. 1,
    /// §3.3.7.1): it would raise #GP, not a page fault.
    NonCanonical {
        /// The paging mode that decided.
        mode: PagingMode,
    },
    /// The entry at this step has P = 0.
    NotPresent(Step),
    /// The entry at this step has reserved bits set (SDM vol. 3A, §4.7:
    /// a page fault with RSVD = 1).
    ReservedBits {
        /// The entry.
        step: Step,
        /// The reserved bits found set.
        bits: u64,
    },
    /// The entry (or, in iteration, the table it is in) lies outside the
    /// physical memory the dump holds.
    OutsideDump {
        /// The level of the table that could not be read.
        level: Level,
        /// The index of the entry, or 0 when a whole table was read.
        index: u16,
        /// The physical address that could not be read.
        addr: PhysAddr,
    },
    /// Iteration visited more tables than its limit: a cyclic or
    /// adversarial page-table structure.
    TooManyTables {
        /// The limit reached.
        limit: usize,
    },
}

impl fmt::Display for WalkErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NonCanonical { mode } => {
                write!(f, "address is not canonical under {mode} paging")
            }
            Self::NotPresent(step) => write!(f, "{step} is not present"),
            Self::ReservedBits { step, bits } => {
                write!(f, "{step} has reserved bits {bits:#x} set")
            }
            Self::OutsideDump { level, index, addr } => write!(
                f,
                "{}[{index:#05x}] at {addr} is outside the dump",
                level.entry_name()
            ),
            Self::TooManyTables { limit } => {
                write!(f, "more than {limit} page tables visited (cyclic tables?)")
            }
        }
    }
}
