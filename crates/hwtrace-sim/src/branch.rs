//! Taken branches: the stream BTS and LBR record.
//!
//! A [`Branch`] is one taken branch, interrupt or exception as the SDM's
//! branch-recording facilities see it: the address of the instruction that
//! transferred control, where it went, its class, the privilege levels on
//! both sides, and whether it was mispredicted (SDM Vol. 3B §18.4.2
//! “Monitoring Branches, Exceptions, and Interrupts”). [`BranchKind`] names
//! the classes finely enough to map onto MSR_LBR_SELECT's filters
//! ([`BranchKind::lbr_class`], SDM Vol. 3B “Filtering of Last Branch
//! Records”).
//!
//! [`branches`] derives the stream from a real [`Execution`]: each executed
//! instruction is classified with iced-x86, and the next executed
//! instruction says where it went. Conditional branches that fell through
//! are not branches (nothing is recorded for them). A qemu-user execution
//! sees only ring 3: SYSCALL, SYSENTER and INT n return to the next
//! instruction without the kernel half being visible, so they produce no
//! branch here (on a real CPU the transfer into the kernel and the return
//! would be two far branches, CPL 3 → 0 and 0 → 3).

use std::collections::HashMap;

use hwtrace_regs::lbr_select::BranchClass;
use hwtrace_types::Ip;
use iced_x86::{FlowControl, Instruction, Mnemonic};

use crate::execution::{Execution, decode_at};

/// The class of a taken branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BranchKind {
    /// Conditional jump taken (Jcc, JrCXZ, LOOP/LOOPcc).
    Jcc,
    /// Near relative JMP (EB, E9).
    NearRelJmp,
    /// Near indirect JMP (register or memory operand).
    NearIndJmp,
    /// Near relative CALL (E8).
    NearRelCall,
    /// Near indirect CALL.
    NearIndCall,
    /// Near RET (C3, C2).
    NearRet,
    /// Far JMP (direct or indirect).
    FarJmp,
    /// Far CALL (direct or indirect).
    FarCall,
    /// Far RET (RETF).
    FarRet,
    /// Software interrupt (INT n, INT3, INTO, INT1), or a hardware
    /// interrupt or exception delivered.
    Interrupt,
    /// IRET/IRETD/IRETQ.
    Iret,
    /// SYSCALL or SYSENTER.
    SystemCall,
    /// SYSRET or SYSEXIT.
    SystemReturn,
}

impl BranchKind {
    /// The class MSR_LBR_SELECT filters it as: every transfer that is not a
    /// near JMP/CALL/RET or Jcc is a far branch there.
    pub const fn lbr_class(self) -> BranchClass {
        match self {
            Self::Jcc => BranchClass::Jcc,
            Self::NearRelJmp => BranchClass::NearRelJmp,
            Self::NearIndJmp => BranchClass::NearIndJmp,
            Self::NearRelCall => BranchClass::NearRelCall,
            Self::NearIndCall => BranchClass::NearIndCall,
            Self::NearRet => BranchClass::NearRet,
            Self::FarJmp
            | Self::FarCall
            | Self::FarRet
            | Self::Interrupt
            | Self::Iret
            | Self::SystemCall
            | Self::SystemReturn => BranchClass::Far,
        }
    }

    /// The class of `insn` if it can transfer control, `None` if it always
    /// goes on to the next instruction.
    pub fn of(insn: &Instruction) -> Option<Self> {
        match insn.mnemonic() {
            Mnemonic::Syscall | Mnemonic::Sysenter => return Some(Self::SystemCall),
            Mnemonic::Sysret | Mnemonic::Sysretq | Mnemonic::Sysexit | Mnemonic::Sysexitq => {
                return Some(Self::SystemReturn);
            }
            Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq => return Some(Self::Iret),
            Mnemonic::Retf => return Some(Self::FarRet),
            _ => {}
        }
        if insn.is_jmp_far() || insn.is_jmp_far_indirect() {
            return Some(Self::FarJmp);
        }
        if insn.is_call_far() || insn.is_call_far_indirect() {
            return Some(Self::FarCall);
        }
        Some(match insn.flow_control() {
            FlowControl::Next | FlowControl::XbeginXabortXend | FlowControl::Exception => {
                return None;
            }
            FlowControl::ConditionalBranch => Self::Jcc,
            FlowControl::UnconditionalBranch => Self::NearRelJmp,
            FlowControl::IndirectBranch => Self::NearIndJmp,
            FlowControl::Call => Self::NearRelCall,
            FlowControl::IndirectCall => Self::NearIndCall,
            FlowControl::Return => Self::NearRet,
            FlowControl::Interrupt => Self::Interrupt,
        })
    }
}

/// One taken branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Branch {
    /// Address of the branch instruction (for an interrupt or exception,
    /// of the instruction it interrupted).
    pub from: Ip,
    /// Where control went.
    pub to: Ip,
    /// The branch class.
    pub kind: BranchKind,
    /// CPL while the branch executed (what BTS_OFF_OS/BTS_OFF_USR test).
    pub from_cpl: u8,
    /// CPL at the target (what MSR_LBR_SELECT's CPL_EQ_0/CPL_NEQ_0 test:
    /// “branches ending in ring 0”).
    pub to_cpl: u8,
    /// Whether the branch was mispredicted; `None` when unknown (the
    /// simulators then write “predicted”).
    pub mispredicted: Option<bool>,
}

impl Branch {
    /// A user-mode (CPL 3) branch with unknown prediction.
    pub const fn user(from: Ip, to: Ip, kind: BranchKind) -> Self {
        Self {
            from,
            to,
            kind,
            from_cpl: 3,
            to_cpl: 3,
            mispredicted: None,
        }
    }
}

/// Why an execution's branches cannot be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("executed instruction {index} at {ip}: {kind}")]
pub struct BranchError {
    /// The index into [`Execution::insns`].
    pub index: usize,
    /// The instruction's address.
    pub ip: Ip,
    /// What was wrong.
    pub kind: BranchErrorKind,
}

/// What was wrong with an executed instruction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BranchErrorKind {
    /// The execution's code image has no bytes there, or they do not decode.
    #[error("no decodable instruction")]
    Undecodable,
    /// The next executed instruction is not one this instruction can go to
    /// (an asynchronous event such as a signal).
    #[error("`{mnemonic:?}` cannot continue at {next}")]
    UnexplainedTransfer {
        /// The instruction.
        mnemonic: Mnemonic,
        /// Where execution went next.
        next: Ip,
    },
    /// The last instruction is a branch and nothing says where it went.
    #[error("`{mnemonic:?}` is the last instruction and its target is unknown")]
    NoSuccessor {
        /// The instruction.
        mnemonic: Mnemonic,
    },
}

/// The taken branches of `execution`, in order, all at CPL 3 with unknown
/// prediction (see the module documentation for what is left out).
pub fn branches(execution: &Execution) -> Result<Vec<Branch>, BranchError> {
    let insns = execution.insns();
    let mut out = Vec::new();
    let mut cache: HashMap<u64, (Option<BranchKind>, u64, u64, Mnemonic)> = HashMap::new();
    for (index, &ip) in insns.iter().enumerate() {
        let err = |kind| BranchError { index, ip, kind };
        let (kind, len, target, mnemonic) = match cache.get(&ip.0) {
            Some(d) => *d,
            None => {
                let insn = decode_at(execution.memory(), ip, execution.mode_at(index))
                    .ok_or_else(|| err(BranchErrorKind::Undecodable))?;
                let d = (
                    BranchKind::of(&insn),
                    insn.len() as u64,
                    insn.near_branch_target(),
                    insn.mnemonic(),
                );
                cache.insert(ip.0, d);
                d
            }
        };
        let fall = Ip(ip.0.wrapping_add(len));
        let next = insns.get(index + 1).copied().or(execution.successor());
        let unexplained = |next| err(BranchErrorKind::UnexplainedTransfer { mnemonic, next });
        let Some(kind) = kind else {
            match next {
                Some(n) if n != fall => return Err(unexplained(n)),
                _ => continue,
            }
        };
        let Some(next) = next else {
            // The program's last instruction: exit_group's SYSCALL is fine,
            // a branch whose outcome was not seen is not.
            if matches!(kind, BranchKind::SystemCall | BranchKind::Interrupt) {
                continue;
            }
            return Err(err(BranchErrorKind::NoSuccessor { mnemonic }));
        };
        match kind {
            // Not taken. (A Jcc whose target is its own fall-through cannot
            // be told apart; it is counted as taken, like a JMP there.)
            BranchKind::Jcc if next == fall && target != fall.0 => {}
            BranchKind::Jcc | BranchKind::NearRelJmp | BranchKind::NearRelCall
                if next.0 != target =>
            {
                return Err(unexplained(next));
            }
            // The kernel half is invisible under qemu-user (module docs).
            BranchKind::SystemCall | BranchKind::Interrupt if next == fall => {}
            _ => out.push(Branch::user(ip, next, kind)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CodeImageBuilder;
    use hwtrace_packet::ExecMode;

    /// An execution over `code` at 0x1000 following `path` (offsets).
    fn exec(code: &[u8], path: &[u64], successor: Option<u64>) -> Execution {
        let mut b = CodeImageBuilder::new();
        b.add(Ip(0x1000), code).expect("no conflict");
        Execution::from_parts(
            path.iter().map(|o| Ip(0x1000 + o)).collect(),
            ExecMode::Bits64,
            b.build().expect("image"),
            successor.map(|o| Ip(0x1000 + o)),
        )
    }

    #[test]
    fn taken_and_not_taken_conditionals_calls_and_returns() {
        // 0: jz +2 (to 4) ; 2: jmp +0 (to 4)... laid out as:
        // 0x0: 74 02        jz 0x4
        // 0x2: eb 00        jmp 0x4
        // 0x4: e8 03 00 00 00  call 0xc
        // 0x9: 90           nop
        // 0xa: eb fe        jmp 0xa (never reached)
        // 0xc: c3           ret
        let code = [
            0x74, 0x02, 0xEB, 0x00, 0xE8, 0x03, 0, 0, 0, 0x90, 0xEB, 0xFE, 0xC3,
        ];
        // jz not taken, jmp, call, ret, nop.
        let e = exec(&code, &[0x0, 0x2, 0x4, 0xC, 0x9], Some(0xA));
        let got = branches(&e).expect("explained");
        let at = |o: u64| Ip(0x1000 + o);
        assert_eq!(
            got,
            vec![
                Branch::user(at(0x2), at(0x4), BranchKind::NearRelJmp),
                Branch::user(at(0x4), at(0xC), BranchKind::NearRelCall),
                Branch::user(at(0xC), at(0x9), BranchKind::NearRet),
            ]
        );
        // jz taken.
        let e = exec(&code, &[0x0, 0x4], Some(0xC));
        let got = branches(&e).expect("explained");
        assert_eq!(got[0], Branch::user(at(0), at(4), BranchKind::Jcc));
    }

    #[test]
    fn unexplained_transfers_and_missing_outcomes_are_errors() {
        let code = [0x90, 0x90, 0x74, 0x02];
        let e = exec(&code, &[0x0, 0x2], None);
        let err = branches(&e).expect_err("nop cannot go to 2");
        assert_eq!(err.index, 0);
        assert!(matches!(
            err.kind,
            BranchErrorKind::UnexplainedTransfer { .. }
        ));
        let e = exec(&code, &[0x1, 0x2], None);
        assert!(matches!(
            branches(&e).expect_err("no successor").kind,
            BranchErrorKind::NoSuccessor { .. }
        ));
        let e = exec(&code, &[0x1, 0x2], Some(0x10));
        assert!(matches!(
            branches(&e).expect_err("jz cannot go to 0x10").kind,
            BranchErrorKind::UnexplainedTransfer { .. }
        ));
    }

    #[test]
    fn lbr_classes() {
        assert_eq!(BranchKind::Iret.lbr_class(), BranchClass::Far);
        assert_eq!(
            BranchKind::NearIndCall.lbr_class(),
            BranchClass::NearIndCall
        );
        let mut d = iced_x86::Decoder::with_ip(64, &[0xFF, 0xD0], 0, 0);
        assert_eq!(BranchKind::of(&d.decode()), Some(BranchKind::NearIndCall));
        let mut d = iced_x86::Decoder::with_ip(64, &[0x0F, 0x05], 0, 0);
        assert_eq!(BranchKind::of(&d.decode()), Some(BranchKind::SystemCall));
        let mut d = iced_x86::Decoder::with_ip(64, &[0xCD, 0x80], 0, 0);
        assert_eq!(BranchKind::of(&d.decode()), Some(BranchKind::Interrupt));
        let mut d = iced_x86::Decoder::with_ip(32, &[0x9A, 0, 0, 0x40, 0, 0x18, 0], 0, 0);
        assert_eq!(BranchKind::of(&d.decode()), Some(BranchKind::FarCall));
        let mut d = iced_x86::Decoder::with_ip(64, &[0x90], 0, 0);
        assert_eq!(BranchKind::of(&d.decode()), None);
    }
}
