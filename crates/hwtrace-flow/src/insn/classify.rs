//! What an instruction does to control flow, decoded with iced-x86.

use hwtrace_packet::ExecMode;
use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, Register};

/// The longest x86 instruction.
pub const MAX_INSN_SIZE: usize = 15;

/// The control-flow class of an instruction (libipt's `pt_insn_class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InsnClass {
    /// Not a branch.
    Other,
    /// A near call.
    Call,
    /// A near return.
    Return,
    /// A near unconditional jump.
    Jump,
    /// A conditional jump (Jcc, JCXZ, LOOP).
    CondJump,
    /// A far call, software interrupt, SYSCALL, SYSENTER, VMCALL.
    FarCall,
    /// A far return, IRET, SYSRET, SYSEXIT, VMLAUNCH/VMRESUME, ERETS/ERETU,
    /// UIRET.
    FarReturn,
    /// A far jump.
    FarJump,
    /// PTWRITE.
    Ptwrite,
    /// Not decoded (the instruction of a failed step).
    Unknown,
}

/// Instructions the decoder needs to recognise beyond their class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    /// Nothing special.
    None,
    /// MOV to CR3 (a PIP binds to it).
    MovCr3,
    /// VMLAUNCH or VMRESUME (PIP and VMCS bind to it).
    VmEntry,
    /// VMPTRLD (VMCS binds to it).
    Vmptrld,
    /// Changes the privilege level (INT, SYSCALL, IRET, SYSRET, ...).
    ChangesCpl,
}

/// One decoded instruction, independent of how it was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decoded {
    /// Length in bytes.
    pub size: u8,
    /// Control-flow class.
    pub class: InsnClass,
    /// Recognised special instruction.
    pub special: Special,
    /// The target of a direct branch (near call/jump/jcc, JMPABS).
    pub target: Option<u64>,
}

impl Decoded {
    /// Whether this is a direct branch with a known target.
    pub const fn is_direct(&self) -> bool {
        self.target.is_some()
    }

    /// Whether this is any branch.
    pub const fn is_branch(&self) -> bool {
        !matches!(self.class, InsnClass::Other | InsnClass::Ptwrite)
    }

    /// Whether this is a far transfer.
    pub const fn is_far(&self) -> bool {
        matches!(
            self.class,
            InsnClass::FarCall | InsnClass::FarReturn | InsnClass::FarJump
        )
    }
}

/// Why bytes could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassifyError {
    /// The bytes end inside the instruction.
    Truncated,
    /// No valid instruction (or the execution mode is unknown).
    Invalid,
}

const fn bitness(mode: ExecMode) -> Option<u32> {
    match mode {
        ExecMode::Bits16 => Some(16),
        ExecMode::Bits32 => Some(32),
        ExecMode::Bits64 => Some(64),
        ExecMode::Reserved => None,
    }
}

/// JMPABS (APX, `D5 00 A1 imm64`) in 64-bit mode. Intel PT reports its
/// target with a TIP like an indirect jump's, and libipt follows the TIP,
/// so it is classified as an indirect jump.
fn jmpabs(bytes: &[u8]) -> Option<Decoded> {
    match bytes {
        [0xd5, 0x00, 0xa1, rest @ ..] if rest.len() >= 8 => Some(Decoded {
            size: 11,
            class: InsnClass::Jump,
            special: Special::None,
            target: None,
        }),
        _ => None,
    }
}

/// FRED's ERETS (`F2 0F 01 CA`) and ERETU (`F3 0F 01 CA`).
fn fred_return(bytes: &[u8]) -> Option<Decoded> {
    match bytes {
        [0xf2 | 0xf3, 0x0f, 0x01, 0xca, ..] => Some(Decoded {
            size: 4,
            class: InsnClass::FarReturn,
            special: Special::ChangesCpl,
            target: None,
        }),
        _ => None,
    }
}

/// Decodes the instruction at the start of `bytes`, located at `ip`.
pub fn classify(bytes: &[u8], ip: u64, mode: ExecMode) -> Result<Decoded, ClassifyError> {
    let bits = bitness(mode).ok_or(ClassifyError::Invalid)?;
    if bits == 64
        && let Some(d) = jmpabs(bytes)
    {
        return Ok(d);
    }
    if let Some(d) = fred_return(bytes) {
        return Ok(d);
    }
    let mut decoder = Decoder::with_ip(bits, bytes, ip, DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() {
        return Err(match decoder.last_error() {
            iced_x86::DecoderError::NoMoreBytes => ClassifyError::Truncated,
            _ => ClassifyError::Invalid,
        });
    }
    let size = insn.len() as u8;
    let mut special = Special::None;
    let mut target = None;
    let class = match insn.mnemonic() {
        Mnemonic::Call if insn.is_call_far() || insn.is_call_far_indirect() => InsnClass::FarCall,
        Mnemonic::Call => {
            if insn.is_call_near() {
                target = Some(insn.near_branch_target());
            }
            InsnClass::Call
        }
        Mnemonic::Jmp if insn.is_jmp_far() || insn.is_jmp_far_indirect() => InsnClass::FarJump,
        Mnemonic::Jmp => {
            if insn.is_jmp_short_or_near() {
                target = Some(insn.near_branch_target());
            }
            InsnClass::Jump
        }
        Mnemonic::Ret => InsnClass::Return,
        Mnemonic::Retf => InsnClass::FarReturn,
        Mnemonic::Int | Mnemonic::Int1 | Mnemonic::Int3 | Mnemonic::Into => {
            special = Special::ChangesCpl;
            InsnClass::FarCall
        }
        Mnemonic::Syscall | Mnemonic::Sysenter => {
            special = Special::ChangesCpl;
            InsnClass::FarCall
        }
        Mnemonic::Vmcall => InsnClass::FarCall,
        Mnemonic::Iret
        | Mnemonic::Iretd
        | Mnemonic::Iretq
        | Mnemonic::Sysret
        | Mnemonic::Sysretq
        | Mnemonic::Sysexit
        | Mnemonic::Sysexitq => {
            special = Special::ChangesCpl;
            InsnClass::FarReturn
        }
        Mnemonic::Uiret => InsnClass::FarReturn,
        Mnemonic::Vmlaunch | Mnemonic::Vmresume => {
            special = Special::VmEntry;
            InsnClass::FarReturn
        }
        Mnemonic::Vmptrld => {
            special = Special::Vmptrld;
            InsnClass::Other
        }
        Mnemonic::Ptwrite => InsnClass::Ptwrite,
        Mnemonic::Mov
            if matches!(insn.code(), Code::Mov_cr_r32 | Code::Mov_cr_r64)
                && insn.op0_register() == Register::CR3 =>
        {
            special = Special::MovCr3;
            InsnClass::Other
        }
        _ if insn.is_jcc_short_or_near()
            || insn.is_jcx_short()
            || insn.is_loop()
            || insn.is_loopcc() =>
        {
            target = Some(insn.near_branch_target());
            InsnClass::CondJump
        }
        _ => InsnClass::Other,
    };
    Ok(Decoded {
        size,
        class,
        special,
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(bytes: &[u8]) -> Decoded {
        classify(bytes, 0x1000, ExecMode::Bits64).unwrap()
    }

    #[test]
    fn branches() {
        assert_eq!(c(&[0x90]).class, InsnClass::Other);
        let call = c(&[0xe8, 0, 0, 0, 0]);
        assert_eq!((call.class, call.target), (InsnClass::Call, Some(0x1005)));
        assert_eq!(c(&[0xff, 0xd0]).class, InsnClass::Call);
        assert!(!c(&[0xff, 0xd0]).is_direct());
        assert_eq!(c(&[0xc3]).class, InsnClass::Return);
        let jcc = c(&[0x74, 0x02]);
        assert_eq!((jcc.class, jcc.target), (InsnClass::CondJump, Some(0x1004)));
        assert_eq!(c(&[0xe2, 0xfe]).class, InsnClass::CondJump);
        assert_eq!(c(&[0xeb, 0x01]).target, Some(0x1003));
        assert_eq!(c(&[0xcd, 0x80]).class, InsnClass::FarCall);
        assert_eq!(c(&[0x0f, 0x05]).class, InsnClass::FarCall);
        assert_eq!(c(&[0x48, 0xcf]).class, InsnClass::FarReturn);
        assert_eq!(c(&[0x0f, 0x01, 0xc2]).special, Special::VmEntry);
        assert_eq!(c(&[0x0f, 0x22, 0xd8]).special, Special::MovCr3);
        assert_eq!(c(&[0xf3, 0x0f, 0xae, 0xe0]).class, InsnClass::Ptwrite);
        assert_eq!(c(&[0xf3, 0x0f, 0x01, 0xca]).class, InsnClass::FarReturn);
        let abs = c(&[0xd5, 0, 0xa1, 8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(
            (abs.size, abs.class, abs.target),
            (11, InsnClass::Jump, None)
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            classify(&[0xe8, 0], 0, ExecMode::Bits64),
            Err(ClassifyError::Truncated)
        );
        assert_eq!(
            classify(&[0x90], 0, ExecMode::Reserved),
            Err(ClassifyError::Invalid)
        );
    }
}
