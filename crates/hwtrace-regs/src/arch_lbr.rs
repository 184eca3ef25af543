//! Architectural LBR controls: IA32_LBR_CTL (14CEH), IA32_LBR_DEPTH (14CFH)
//! and IA32_LBR_x_INFO (SDM Vol. 3B §19.1 “Architectural Last Branch
//! Records”). Unlike MSR_LBR_SELECT, a set IA32_LBR_CTL filter bit *enables*
//! recording of its branch class.

use crate::field::{FieldDef, FieldKind, Meaning, RegisterDef};
use crate::macros::{flags, raw_register};

/// An IA32_LBR_CTL value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbrCtl(u64);
raw_register!(LbrCtl);

impl LbrCtl {
    /// Reserved bits 15:4 and 63:23.
    pub const RESERVED: u64 = 0xFFFF_FFFF_FF80_FFF0;

    flags! {
        /// LBREn (bit 0): record branches.
        lbr_en, with_lbr_en = 0;
        /// OS (bit 1): record branches ending in ring 0.
        os, with_os = 1;
        /// USR (bit 2): record branches ending in ring > 0.
        usr, with_usr = 2;
        /// CALL_STACK (bit 3): call-stack mode.
        call_stack, with_call_stack = 3;
        /// COND (bit 16): record conditional branches.
        cond, with_cond = 16;
        /// NEAR_REL_JMP (bit 17).
        near_rel_jmp, with_near_rel_jmp = 17;
        /// NEAR_IND_JMP (bit 18).
        near_ind_jmp, with_near_ind_jmp = 18;
        /// NEAR_REL_CALL (bit 19).
        near_rel_call, with_near_rel_call = 19;
        /// NEAR_IND_CALL (bit 20).
        near_ind_call, with_near_ind_call = 20;
        /// NEAR_RET (bit 21).
        near_ret, with_near_ret = 21;
        /// OTHER_BRANCH (bit 22): far branches, interrupts, exceptions, ...
        other_branch, with_other_branch = 22;
    }
}

/// Layout of IA32_LBR_CTL.
pub static LBR_CTL: RegisterDef = RegisterDef {
    name: "IA32_LBR_CTL",
    sdm: "SDM Vol. 3B §19.1.2 “Enabling and Configuring” (IA32_LBR_CTL)",
    reserved: LbrCtl::RESERVED,
    width: 64,
    fields: &[
        FieldDef::flag(
            "LBREn",
            0,
            "architectural LBRs record",
            "architectural LBRs off",
        ),
        FieldDef::flag(
            "OS",
            1,
            "record branches ending in ring 0",
            "skip ring-0 branches",
        ),
        FieldDef::flag(
            "USR",
            2,
            "record branches ending in ring > 0",
            "skip ring > 0 branches",
        ),
        FieldDef::flag("CALL_STACK", 3, "call-stack mode", "ordinary LBR stack"),
        FieldDef::flag(
            "COND",
            16,
            "record conditional branches",
            "skip conditional branches",
        ),
        FieldDef::flag(
            "NEAR_REL_JMP",
            17,
            "record near relative jumps",
            "skip near relative jumps",
        ),
        FieldDef::flag(
            "NEAR_IND_JMP",
            18,
            "record near indirect jumps",
            "skip near indirect jumps",
        ),
        FieldDef::flag(
            "NEAR_REL_CALL",
            19,
            "record near relative calls",
            "skip near relative calls",
        ),
        FieldDef::flag(
            "NEAR_IND_CALL",
            20,
            "record near indirect calls",
            "skip near indirect calls",
        ),
        FieldDef::flag("NEAR_RET", 21, "record near returns", "skip near returns"),
        FieldDef::flag(
            "OTHER_BRANCH",
            22,
            "record other branches (far, interrupts, exceptions)",
            "skip other branches",
        ),
    ],
};

/// Why an IA32_LBR_DEPTH value is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbrDepthError {
    /// Not a multiple of 8 from 8 to 64.
    #[error("LBR depth {0} is not a multiple of 8 from 8 to 64: WRMSR raises #GP")]
    NotArchitectural(u64),
    /// Not in the `CPUID.(EAX=1CH):EAX[7:0]` bitmap.
    #[error(
        "LBR depth {depth} is not in the supported-depth bitmap {bitmap:#010b} (CPUID.(EAX=1CH,ECX=0):EAX[7:0]): WRMSR raises #GP"
    )]
    NotSupported {
        /// The depth.
        depth: u64,
        /// The bitmap: bit n means depth 8 × (n + 1).
        bitmap: u8,
    },
}

/// Checks an IA32_LBR_DEPTH value against the architecture and, if given,
/// the `CPUID.(EAX=1CH,ECX=0):EAX[7:0]` bitmap.
pub fn check_depth(depth: u64, cpuid_bitmap: Option<u8>) -> Result<u8, LbrDepthError> {
    if depth == 0 || depth > 64 || !depth.is_multiple_of(8) {
        return Err(LbrDepthError::NotArchitectural(depth));
    }
    if let Some(bitmap) = cpuid_bitmap
        && (bitmap >> (depth / 8 - 1)) & 1 == 0
    {
        return Err(LbrDepthError::NotSupported { depth, bitmap });
    }
    Ok(depth as u8)
}

fn depth_meaning(v: u64) -> Meaning {
    match check_depth(v, None) {
        Ok(_) => Meaning::Number(v),
        Err(_) => Meaning::Text("not a multiple of 8 from 8 to 64: WRMSR would #GP"),
    }
}

/// Layout of IA32_LBR_DEPTH.
pub static LBR_DEPTH: RegisterDef = RegisterDef {
    name: "IA32_LBR_DEPTH",
    sdm: "SDM Vol. 3B §19.1.2 (IA32_LBR_DEPTH)",
    reserved: !0x1FF,
    width: 64,
    fields: &[FieldDef::field(
        "DEPTH",
        8,
        0,
        FieldKind::Computed(depth_meaning),
    )],
};

fn br_type_meaning(v: u64) -> Meaning {
    Meaning::Text(match v {
        0 => "COND: conditional branch",
        1 => "NEAR_IND_JMP",
        2 => "NEAR_REL_JMP",
        3 => "NEAR_IND_CALL",
        4 => "NEAR_REL_CALL",
        5 => "NEAR_RET",
        6 | 7 => "reserved",
        _ => "OTHER_BRANCH",
    })
}

/// Layout of IA32_LBR_x_INFO.
pub static ARCH_LBR_INFO: RegisterDef = RegisterDef {
    name: "IA32_LBR_x_INFO",
    sdm: "SDM Vol. 3B §19.1.3 “Branch Records” (IA32_LBR_x_INFO)",
    reserved: 0x00FF_FFFF_FFFF_0000,
    width: 64,
    fields: &[
        FieldDef::field("CYC_CNT", 15, 0, FieldKind::Number),
        FieldDef::field("BR_TYPE", 59, 56, FieldKind::Computed(br_type_meaning)),
        FieldDef::flag("CYC_CNT_VALID", 60, "CYC_CNT is valid", "no cycle count"),
        FieldDef::flag("TSX_ABORT", 61, "TSX abort", "not an abort"),
        FieldDef::flag(
            "IN_TSX",
            62,
            "inside a TSX transaction",
            "not in a transaction",
        ),
        FieldDef::flag(
            "MISPRED",
            63,
            "branch was mispredicted",
            "branch was predicted",
        ),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctl_flags_match_the_table() {
        let all = LbrCtl::new()
            .with_lbr_en(true)
            .with_os(true)
            .with_usr(true)
            .with_call_stack(true)
            .with_cond(true)
            .with_near_rel_jmp(true)
            .with_near_ind_jmp(true)
            .with_near_rel_call(true)
            .with_near_ind_call(true)
            .with_near_ret(true)
            .with_other_branch(true);
        let table = LBR_CTL.fields.iter().fold(0, |a, f| a | f.bits.mask());
        assert_eq!(all.raw(), table);
        assert_eq!(all.raw() & LbrCtl::RESERVED, 0);
        assert_eq!(table | LbrCtl::RESERVED, u64::MAX);
    }

    #[test]
    fn depth_must_be_architectural_and_enumerated() {
        assert_eq!(check_depth(32, None), Ok(32));
        assert_eq!(
            check_depth(12, None),
            Err(LbrDepthError::NotArchitectural(12))
        );
        assert_eq!(
            check_depth(72, None),
            Err(LbrDepthError::NotArchitectural(72))
        );
        assert_eq!(check_depth(32, Some(0b1000_1000)), Ok(32));
        assert_eq!(
            check_depth(16, Some(0b1000_1000)),
            Err(LbrDepthError::NotSupported {
                depth: 16,
                bitmap: 0x88
            })
        );
    }
}
