//! Decoded records as branches, to compare with what was simulated.
//!
//! The record decoders themselves are pure parsing and live in
//! `hwtrace_regs::dump` (a DS area + BTS buffer, or an LBR stack + TOS, read
//! oldest first; SDM Vol. 3B §18.4.9 “BTS and DS Save Area”, §18.4.8 “LBR
//! Stack”). A record keeps less than a [`Branch`]: no class and no CPL,
//! only the addresses and, where the format has it, the prediction. This
//! module gives both the same shape, [`RecordedBranch`].

use hwtrace_regs::dump::{BtsDump, LbrStack};
use hwtrace_types::Ip;

use crate::branch::Branch;

/// What a branch record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordedBranch {
    /// Address of the branch instruction.
    pub from: Ip,
    /// Its target.
    pub to: Ip,
    /// Whether it was mispredicted, where the record says.
    pub mispredicted: Option<bool>,
}

impl RecordedBranch {
    /// What a BTS record of `b` holds (BTS always has the predicted flag;
    /// an unknown prediction is written as predicted).
    pub fn bts(b: &Branch) -> Self {
        Self {
            from: b.from,
            to: b.to,
            mispredicted: Some(b.mispredicted.unwrap_or(false)),
        }
    }

    /// What an LBR entry of `b` holds when the format has (`true`) or
    /// lacks (`false`) a mispredicted flag.
    pub fn lbr(b: &Branch, has_mispredict: bool) -> Self {
        Self {
            from: b.from,
            to: b.to,
            mispredicted: has_mispredict.then(|| b.mispredicted.unwrap_or(false)),
        }
    }
}

/// The branches of a BTS dump, oldest first.
pub fn bts_branches(dump: &BtsDump<'_>) -> Vec<RecordedBranch> {
    dump.records()
        .map(|e| RecordedBranch {
            from: e.record.from,
            to: e.record.to,
            mispredicted: Some(!e.record.predicted),
        })
        .collect()
}

/// The branches of an LBR stack, oldest first.
pub fn lbr_branches(stack: &LbrStack<'_>) -> Vec<RecordedBranch> {
    stack
        .entries()
        .map(|e| RecordedBranch {
            from: e.from.ip,
            to: e.to.ip,
            mispredicted: e.mispredicted(),
        })
        .collect()
}
