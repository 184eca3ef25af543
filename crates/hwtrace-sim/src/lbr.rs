//! Last Branch Records simulated: the LBR stack and TOS as the MSRs would
//! read at any point of a branch stream.
//!
//! The model follows SDM Vol. 3B §18.4.8 “LBR Stack”, §18.4.8.1 “LBR Stack
//! and Intel 64 Processors” (record formats), the per-micro-architecture
//! sections on filtering (“Filtering of Last Branch Records”) and §18.4.7
//! “Freezing LBR and Performance Counters on PMI”:
//!
//! * Branches are recorded while DEBUGCTL.LBR = 1 and the stack is not
//!   frozen.
//! * MSR_LBR_SELECT drops branches by class and by the CPL they end in, with
//!   the meaning of the chosen micro-architecture: on Nehalem and Westmere
//!   the JMP filters also drop CALLs (and returns), seed 003's surprise
//!   ([`hwtrace_regs::lbr_select::LbrSelect::records`]).
//! * Recording increments TOS (modulo the depth) and then writes
//!   MSR_LASTBRANCH_TOS's entry (seed 003: after ten JMPs from reset TOS
//!   reads 10 and entry 0 is empty). FROM/TO (and MSR_LBR_INFO_n) are
//!   encoded per the LBR format: mispredicted bit, TSX bits (always clear
//!   here: executions carry no transactions), cycle counts (0: executions
//!   carry no timing), sign-extended IP fields.
//! * With FREEZE_LBRS_ON_PMI set, a PMI freezes the stack until software
//!   re-enables it ([`LbrSim::pmi`], [`LbrSim::resume`]).
//!
//! [`LbrSim::snapshot`] is what RDMSR returns at that point; its
//! [`LbrSnapshot::stack`] decodes it with `hwtrace_regs::dump`.
//!
//! **Call-stack mode** (Haswell and later, MSR_LBR_SELECT.EN_CALLSTACK; SDM
//! Vol. 3B §18.9 “Last Branch, Call Stack, Interrupt, and Exception
//! Recording for Processors based on Haswell Microarchitecture”): the SDM
//! requires JCC, NEAR_IND_JMP, NEAR_REL_JMP and FAR_BRANCH set and the
//! CALL/RET filters clear, and says returns flush “the last captured
//! branch record … in a last-in first-out manner”. The simulator models a
//! return as clearing the entry TOS points at and decrementing TOS, so the
//! stack holds the calls still open (Linux's perf reads such a stack down
//! from TOS until an entry whose FROM is 0). A return with nothing recorded
//! at TOS changes nothing; the SDM does not say what the hardware does then.

use std::fmt::Write as _;

use hwtrace_regs::Uarch;
use hwtrace_regs::debugctl::{DebugCtl, DebugCtlFlag};
use hwtrace_regs::dump::{LbrDumpError, LbrStack};
use hwtrace_regs::lbr::{LbrError, LbrFormat, LbrFrom, LbrInfo, LbrTo};
use hwtrace_regs::lbr_select::{BranchClass, LbrSelect, LbrSelectError};
use hwtrace_regs::msr;

use crate::branch::{Branch, BranchKind};

/// What the simulated processor was programmed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbrConfig {
    /// The micro-architecture (MSR_LBR_SELECT semantics).
    pub uarch: Uarch,
    /// The record format (`IA32_PERF_CAPABILITIES[5:0]`).
    pub format: LbrFormat,
    /// Entries in the stack.
    pub depth: u8,
    /// MSR_LBR_SELECT (0: record every branch).
    pub select: LbrSelect,
    /// IA32_DEBUGCTL: LBR enables recording, FREEZE_LBRS_ON_PMI freezes on a PMI.
    pub debugctl: DebugCtl,
}

impl LbrConfig {
    /// `uarch`'s format and depth, no filter, DEBUGCTL.LBR = 1 (modern layout).
    pub fn for_uarch(uarch: Uarch) -> Result<Self, LbrSimError> {
        let format = uarch.lbr_format().ok_or(LbrSimError::NoFormat(uarch))?;
        let debugctl = DebugCtl::new(hwtrace_regs::debugctl::DebugCtlLayout::Modern)
            .with(DebugCtlFlag::Lbr, true)
            .map_err(|_| LbrSimError::NoFormat(uarch))?;
        Ok(Self {
            uarch,
            format,
            depth: uarch.lbr_depth(),
            select: LbrSelect::default(),
            debugctl,
        })
    }

    /// The same with MSR_LBR_SELECT = `raw`.
    #[must_use]
    pub fn with_select(self, raw: u64) -> Self {
        Self {
            select: LbrSelect::from_raw(raw),
            ..self
        }
    }
}

/// Why a configuration or a branch cannot be simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbrSimError {
    /// The micro-architecture has no single LBR format; give one.
    #[error("{0} has no fixed LBR format: set LbrConfig::format")]
    NoFormat(Uarch),
    /// A depth outside 1..=32.
    #[error("an LBR stack of {0} entries: non-architectural LBR stacks have 1 to 32")]
    Depth(u8),
    /// MSR_LBR_SELECT is missing or has reserved bits set.
    #[error(transparent)]
    Select(#[from] LbrSelectError),
    /// EN_CALLSTACK is set without the filter bits call-stack mode needs.
    #[error(
        "MSR_LBR_SELECT = {0:#x}: call-stack mode (EN_CALLSTACK) needs JCC, NEAR_IND_JMP, \
         NEAR_REL_JMP and FAR_BRANCH set and NEAR_REL_CALL, NEAR_IND_CALL and NEAR_RET clear"
    )]
    CallStackMode(u64),
    /// A branch's address does not fit the format.
    #[error("branch {branch}: {error}")]
    Record {
        /// Index of the branch in the stream.
        branch: usize,
        /// The encoding error.
        error: LbrError,
    },
}

/// What happened to one branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbrStep {
    /// DEBUGCTL.LBR is clear, or the stack is frozen.
    Off,
    /// MSR_LBR_SELECT dropped it.
    Filtered,
    /// Written at entry `slot`, which TOS now points at.
    Recorded {
        /// The entry.
        slot: u8,
    },
    /// Call-stack mode: a return cleared entry `slot` and TOS moved below
    /// it (`None`: nothing was recorded at TOS, nothing changed).
    Popped {
        /// The entry cleared.
        slot: Option<u8>,
    },
}

/// A processor keeping an LBR stack.
#[derive(Debug, Clone)]
pub struct LbrSim {
    config: LbrConfig,
    from: Vec<u64>,
    to: Vec<u64>,
    info: Vec<u64>,
    tos: u8,
    frozen: bool,
}

impl LbrSim {
    /// A processor after reset: every entry 0, TOS 0.
    pub fn new(config: LbrConfig) -> Result<Self, LbrSimError> {
        if config.depth == 0 || config.depth > msr::LBR_MAX_ENTRIES {
            return Err(LbrSimError::Depth(config.depth));
        }
        if config.select.raw() != 0 {
            // Refuses a missing MSR and reserved bits.
            config.select.records(BranchClass::Jcc, 3, config.uarch)?;
            let sel = config.select;
            let required =
                sel.jcc() && sel.near_ind_jmp() && sel.near_rel_jmp() && sel.far_branch();
            let forbidden = sel.near_rel_call() || sel.near_ind_call() || sel.near_ret();
            if sel.en_callstack() && (!required || forbidden) {
                return Err(LbrSimError::CallStackMode(sel.raw()));
            }
        }
        let d = usize::from(config.depth);
        Ok(Self {
            config,
            from: vec![0; d],
            to: vec![0; d],
            info: vec![0; d],
            tos: 0,
            frozen: false,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LbrConfig {
        &self.config
    }

    /// MSR_LASTBRANCH_TOS now.
    pub fn tos(&self) -> u8 {
        self.tos
    }

    /// Whether a PMI froze the stack.
    pub fn frozen(&self) -> bool {
        self.frozen
    }

    /// Executes branch number `n` of a stream.
    pub fn step(&mut self, n: usize, branch: &Branch) -> Result<LbrStep, LbrSimError> {
        if self.frozen || !self.config.debugctl.get(DebugCtlFlag::Lbr) {
            return Ok(LbrStep::Off);
        }
        if self.config.select.raw() != 0
            && !self.config.select.records(
                branch.kind.lbr_class(),
                branch.to_cpl,
                self.config.uarch,
            )?
        {
            return Ok(LbrStep::Filtered);
        }
        if self.config.select.en_callstack() && branch.kind == BranchKind::NearRet {
            return Ok(self.pop());
        }
        let format = self.config.format;
        let err = |error| LbrSimError::Record { branch: n, error };
        let mispredicted = branch.mispredicted.unwrap_or(false);
        // The fields a format has are the ones its decoder fills in.
        let shape = LbrFrom::decode(0, format);
        let from = LbrFrom {
            ip: branch.from,
            mispredicted: shape.mispredicted.map(|_| mispredicted),
            in_tsx: shape.in_tsx,
            tsx_abort: shape.tsx_abort,
        }
        .encode(format)
        .map_err(err)?;
        let to = LbrTo {
            ip: branch.to,
            cycles: LbrTo::decode(0, format).cycles,
        }
        .encode(format)
        .map_err(err)?;
        let info = if format.has_info_msr() {
            LbrInfo {
                mispredicted,
                ..LbrInfo::default()
            }
            .encode()
        } else {
            0
        };
        let slot = (self.tos + 1) % self.config.depth;
        let i = usize::from(slot);
        self.from[i] = from;
        self.to[i] = to;
        self.info[i] = info;
        self.tos = slot;
        Ok(LbrStep::Recorded { slot })
    }

    /// Call-stack mode's return: clear the entry at TOS, TOS − 1.
    fn pop(&mut self) -> LbrStep {
        let slot = self.tos;
        let i = usize::from(slot);
        if self.from[i] == 0 && self.to[i] == 0 {
            return LbrStep::Popped { slot: None };
        }
        self.from[i] = 0;
        self.to[i] = 0;
        self.info[i] = 0;
        self.tos = slot.checked_sub(1).unwrap_or(self.config.depth - 1);
        LbrStep::Popped { slot: Some(slot) }
    }

    /// Runs a stream; returns how many branches were recorded.
    pub fn run(&mut self, branches: &[Branch]) -> Result<u64, LbrSimError> {
        let mut n = 0;
        for (i, b) in branches.iter().enumerate() {
            n += u64::from(matches!(self.step(i, b)?, LbrStep::Recorded { .. }));
        }
        Ok(n)
    }

    /// A PMI: the stack freezes if DEBUGCTL.FREEZE_LBRS_ON_PMI is set.
    /// Returns whether it froze.
    pub fn pmi(&mut self) -> bool {
        if self.config.debugctl.get(DebugCtlFlag::FreezeLbrsOnPmi) {
            self.frozen = true;
        }
        self.frozen
    }

    /// Software re-enables recording after a freeze.
    pub fn resume(&mut self) {
        self.frozen = false;
    }

    /// What RDMSR of the stack and TOS returns now.
    pub fn snapshot(&self) -> LbrSnapshot {
        LbrSnapshot {
            format: self.config.format,
            tos: self.tos,
            from: self.from.clone(),
            to: self.to.clone(),
            info: self.config.format.has_info_msr().then(|| self.info.clone()),
        }
    }
}

/// The LBR MSRs at one point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbrSnapshot {
    /// The record format.
    pub format: LbrFormat,
    /// MSR_LASTBRANCH_TOS.
    pub tos: u8,
    /// MSR_LASTBRANCH_n_FROM_IP, by n.
    pub from: Vec<u64>,
    /// MSR_LASTBRANCH_n_TO_IP, by n.
    pub to: Vec<u64>,
    /// MSR_LBR_INFO_n, on formats that have it.
    pub info: Option<Vec<u64>>,
}

impl LbrSnapshot {
    /// The snapshot as a stack to decode.
    pub fn stack(&self) -> Result<LbrStack<'_>, LbrDumpError> {
        LbrStack::new(
            &self.from,
            &self.to,
            self.info.as_deref(),
            u64::from(self.tos),
            self.format,
        )
    }

    /// A text MSR dump (`REGISTER VALUE` per line) that
    /// `hwtrace lbr decode` reads, with IA32_PERF_CAPABILITIES carrying the
    /// format.
    pub fn to_msr_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(s, "IA32_PERF_CAPABILITIES {:#x}", self.format.encoding());
        let _ = writeln!(s, "MSR_LASTBRANCH_TOS {}", self.tos);
        for (n, (from, to)) in self.from.iter().zip(&self.to).enumerate() {
            let _ = writeln!(s, "MSR_LASTBRANCH_{n}_FROM_IP {from:#018x}");
            let _ = writeln!(s, "MSR_LASTBRANCH_{n}_TO_IP {to:#018x}");
            if let Some(info) = self.info.as_ref().and_then(|i| i.get(n)) {
                let _ = writeln!(s, "MSR_LBR_INFO_{n} {info:#018x}");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_types::Ip;

    #[test]
    fn tos_increments_then_writes() {
        let mut sim =
            LbrSim::new(LbrConfig::for_uarch(Uarch::Westmere).expect("known")).expect("valid");
        for k in 0..10u64 {
            let b = Branch::user(Ip(0x9000 + k), Ip(0x9001 + k), BranchKind::NearRelJmp);
            assert_eq!(
                sim.step(k as usize, &b),
                Ok(LbrStep::Recorded { slot: k as u8 + 1 })
            );
        }
        let snap = sim.snapshot();
        assert_eq!(snap.tos, 10);
        assert_eq!((snap.from[0], snap.to[0]), (0, 0));
        assert_eq!(snap.from[10], 0x9009);
    }

    #[test]
    fn formats_put_flags_where_they_belong() {
        let b = Branch {
            mispredicted: Some(true),
            ..Branch::user(
                Ip(0xFFFF_FFFF_8100_0000),
                Ip(0x40_1000),
                BranchKind::NearRet,
            )
        };
        let mut c = LbrConfig::for_uarch(Uarch::SandyBridge).expect("known");
        let mut sim = LbrSim::new(c).expect("valid");
        sim.step(0, &b).expect("fits");
        let from = sim.snapshot().from[1];
        assert_eq!(from >> 63, 1, "mispredicted in FROM bit 63");
        assert_eq!(LbrFrom::decode(from, c.format).ip, b.from, "sign-extended");
        c = LbrConfig::for_uarch(Uarch::Skylake).expect("known");
        let mut sim = LbrSim::new(c).expect("valid");
        sim.step(0, &b).expect("fits");
        let snap = sim.snapshot();
        assert_eq!(snap.from[1], b.from.0, "full address in FROM");
        assert_eq!(snap.info.as_ref().map(|i| i[1] >> 63), Some(1));
        c.format = LbrFormat::Bits32;
        let mut sim = LbrSim::new(c).expect("valid");
        assert!(matches!(
            sim.step(4, &b),
            Err(LbrSimError::Record { branch: 4, .. })
        ));
    }

    #[test]
    fn freeze_on_pmi_and_configuration_errors() {
        let mut c = LbrConfig::for_uarch(Uarch::Haswell).expect("known");
        c.debugctl = c
            .debugctl
            .with(DebugCtlFlag::FreezeLbrsOnPmi, true)
            .expect("modern flag");
        let mut sim = LbrSim::new(c).expect("valid");
        let b = Branch::user(Ip(1), Ip(2), BranchKind::Jcc);
        sim.step(0, &b).expect("ok");
        assert!(sim.pmi());
        assert_eq!(sim.step(1, &b), Ok(LbrStep::Off));
        sim.resume();
        assert_eq!(sim.step(2, &b), Ok(LbrStep::Recorded { slot: 2 }));
        assert_eq!(
            LbrConfig::for_uarch(Uarch::Core2).err(),
            Some(LbrSimError::NoFormat(Uarch::Core2))
        );
        let mut core2 = LbrConfig::for_uarch(Uarch::Haswell).expect("known");
        core2.uarch = Uarch::Core2;
        core2.select = LbrSelect::from_raw(4);
        assert!(matches!(LbrSim::new(core2), Err(LbrSimError::Select(_))));
        assert_eq!(
            LbrSim::new(c.with_select(1 << 9)).err(),
            Some(LbrSimError::CallStackMode(1 << 9))
        );
        assert_eq!(
            LbrSim::new(c.with_select(0x3C4 | 0x20)).err(),
            Some(LbrSimError::CallStackMode(0x3E4))
        );
        c.depth = 33;
        assert_eq!(LbrSim::new(c).err(), Some(LbrSimError::Depth(33)));
    }
}
