//! IA32_DEBUGCTL (MSR 1D9H) in its two layouts: the modern one (P6-derived,
//! Core 2 and later; SDM Vol. 3B §18.4.1 “IA32_DEBUGCTL MSR”) and NetBurst's
//! MSR_DEBUGCTLA (Pentium 4; SDM Vol. 3B “Debug Control MSR (Pentium 4)”),
//! where TR, BTS and BTINT sit at bits 2, 3 and 4 — seed 001 enables BTS on a
//! Pentium 4 by writing 0x1C.

use crate::field::{FieldDef, RegisterDef};
use core::fmt;

/// Which bit layout the register has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DebugCtlLayout {
    /// Core 2 and later (and P6-derived Pentium M).
    Modern,
    /// Pentium 4 / NetBurst MSR_DEBUGCTLA.
    NetBurst,
}

/// A DEBUGCTL control bit, by SDM name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DebugCtlFlag {
    /// LBR: record branches in the LBR stack.
    Lbr,
    /// BTF: single-step on branches.
    Btf,
    /// BLD: bus-lock detection (modern only).
    Bld,
    /// TR: branch trace messages.
    Tr,
    /// BTS: store branch trace messages in the DS area.
    Bts,
    /// BTINT: interrupt when the BTS buffer reaches its threshold (else circular).
    Btint,
    /// BTS_OFF_OS: no BTS/BTM at CPL 0.
    BtsOffOs,
    /// BTS_OFF_USR: no BTS/BTM at CPL > 0.
    BtsOffUsr,
    /// FREEZE_LBRS_ON_PMI (modern only).
    FreezeLbrsOnPmi,
    /// FREEZE_PERFMON_ON_PMI (modern only).
    FreezePerfmonOnPmi,
    /// ENABLE_UNCORE_PMI (modern only).
    EnableUncorePmi,
    /// FREEZE_WHILE_SMM (modern only).
    FreezeWhileSmm,
    /// RTM_DEBUG (modern only).
    RtmDebug,
}

impl DebugCtlFlag {
    /// The SDM name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lbr => "LBR",
            Self::Btf => "BTF",
            Self::Bld => "BLD",
            Self::Tr => "TR",
            Self::Bts => "BTS",
            Self::Btint => "BTINT",
            Self::BtsOffOs => "BTS_OFF_OS",
            Self::BtsOffUsr => "BTS_OFF_USR",
            Self::FreezeLbrsOnPmi => "FREEZE_LBRS_ON_PMI",
            Self::FreezePerfmonOnPmi => "FREEZE_PERFMON_ON_PMI",
            Self::EnableUncorePmi => "ENABLE_UNCORE_PMI",
            Self::FreezeWhileSmm => "FREEZE_WHILE_SMM",
            Self::RtmDebug => "RTM_DEBUG",
        }
    }
}

impl DebugCtlLayout {
    /// The bit of `flag` in this layout, or `None` if the layout lacks it.
    pub const fn bit(self, flag: DebugCtlFlag) -> Option<u8> {
        use DebugCtlFlag as F;
        match self {
            Self::Modern => Some(match flag {
                F::Lbr => 0,
                F::Btf => 1,
                F::Bld => 2,
                F::Tr => 6,
                F::Bts => 7,
                F::Btint => 8,
                F::BtsOffOs => 9,
                F::BtsOffUsr => 10,
                F::FreezeLbrsOnPmi => 11,
                F::FreezePerfmonOnPmi => 12,
                F::EnableUncorePmi => 13,
                F::FreezeWhileSmm => 14,
                F::RtmDebug => 15,
            }),
            Self::NetBurst => match flag {
                F::Lbr => Some(0),
                F::Btf => Some(1),
                F::Tr => Some(2),
                F::Bts => Some(3),
                F::Btint => Some(4),
                F::BtsOffOs => Some(5),
                F::BtsOffUsr => Some(6),
                _ => None,
            },
        }
    }

    /// The register layout table.
    pub const fn def(self) -> &'static RegisterDef {
        match self {
            Self::Modern => &DEBUGCTL_MODERN,
            Self::NetBurst => &DEBUGCTL_NETBURST,
        }
    }
}

/// What the TR/BTS/BTINT combination does (SDM Vol. 3B §18.4.9 table
/// “IA32_DEBUGCTL Flag Encodings”, as quoted by seed 002).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BtsMode {
    /// TR = 0: branch trace messages off (BTS and BTINT have no effect).
    Off,
    /// TR = 1, BTS = 0: BTMs go out on the system bus only.
    BusMessages,
    /// TR = 1, BTS = 1, BTINT = 0: BTMs stored in a circular BTS buffer.
    CircularBuffer,
    /// TR = 1, BTS = 1, BTINT = 1: BTMs stored; interrupt at the threshold.
    InterruptOnThreshold,
}

impl fmt::Display for BtsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Off => "branch trace messages off",
            Self::BusMessages => "branch trace messages sent on the system bus",
            Self::CircularBuffer => {
                "branch records stored in the BTS buffer, used as a circular buffer"
            }
            Self::InterruptOnThreshold => {
                "branch records stored in the BTS buffer, interrupt when it is nearly full"
            }
        })
    }
}

/// Why a DEBUGCTL value is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DebugCtlError {
    /// The layout has no such flag.
    #[error("{flag} does not exist in the {layout:?} IA32_DEBUGCTL layout")]
    NoSuchFlag {
        /// The flag.
        flag: &'static str,
        /// The layout.
        layout: DebugCtlLayout,
    },
    /// Reserved bits set.
    #[error("IA32_DEBUGCTL ({layout:?} layout) has reserved bits {bits:#x} set: WRMSR raises #GP")]
    ReservedBits {
        /// The layout.
        layout: DebugCtlLayout,
        /// The bits.
        bits: u64,
    },
    /// BTS or BTINT without TR: nothing is stored.
    #[error(
        "BTS/BTINT are set but TR is clear: with TR = 0 branch trace messages are off and nothing is stored"
    )]
    BtsWithoutTr,
    /// BTINT without BTS: no buffer, so no interrupt.
    #[error("BTINT is set but BTS is clear: messages go to the bus only and BTINT has no effect")]
    BtintWithoutBts,
    /// Both CPL filters set: BTS records nothing.
    #[error(
        "BTS_OFF_OS and BTS_OFF_USR are both set: branches are skipped at every CPL, nothing is recorded"
    )]
    AllCplsFiltered,
}

/// An IA32_DEBUGCTL value together with its layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DebugCtl {
    raw: u64,
    layout: DebugCtlLayout,
}

impl DebugCtl {
    /// All flags clear.
    pub const fn new(layout: DebugCtlLayout) -> Self {
        Self { raw: 0, layout }
    }

    /// A value read with RDMSR.
    pub const fn from_raw(raw: u64, layout: DebugCtlLayout) -> Self {
        Self { raw, layout }
    }

    /// The raw value.
    pub const fn raw(self) -> u64 {
        self.raw
    }

    /// The layout.
    pub const fn layout(self) -> DebugCtlLayout {
        self.layout
    }

    /// Whether `flag` is set (false if the layout lacks it).
    pub const fn get(self, flag: DebugCtlFlag) -> bool {
        match self.layout.bit(flag) {
            Some(b) => (self.raw >> b) & 1 != 0,
            None => false,
        }
    }

    /// Returns a copy with `flag` set to `on`.
    pub const fn with(self, flag: DebugCtlFlag, on: bool) -> Result<Self, DebugCtlError> {
        match self.layout.bit(flag) {
            Some(b) => {
                let raw = if on {
                    self.raw | (1 << b)
                } else {
                    self.raw & !(1 << b)
                };
                Ok(Self {
                    raw,
                    layout: self.layout,
                })
            }
            None => Err(DebugCtlError::NoSuchFlag {
                flag: flag.name(),
                layout: self.layout,
            }),
        }
    }

    /// What TR/BTS/BTINT select.
    pub const fn bts_mode(self) -> BtsMode {
        use DebugCtlFlag as F;
        match (self.get(F::Tr), self.get(F::Bts), self.get(F::Btint)) {
            (false, _, _) => BtsMode::Off,
            (true, false, _) => BtsMode::BusMessages,
            (true, true, false) => BtsMode::CircularBuffer,
            (true, true, true) => BtsMode::InterruptOnThreshold,
        }
    }

    /// Refuses reserved bits and flag combinations the hardware ignores,
    /// returning the BTS mode otherwise.
    pub fn validate(self) -> Result<BtsMode, DebugCtlError> {
        use DebugCtlFlag as F;
        let bits = self.raw & self.layout.def().reserved;
        if bits != 0 {
            return Err(DebugCtlError::ReservedBits {
                layout: self.layout,
                bits,
            });
        }
        if !self.get(F::Tr) && (self.get(F::Bts) || self.get(F::Btint)) {
            return Err(DebugCtlError::BtsWithoutTr);
        }
        if self.get(F::Tr) && !self.get(F::Bts) && self.get(F::Btint) {
            return Err(DebugCtlError::BtintWithoutBts);
        }
        if self.get(F::Tr) && self.get(F::BtsOffOs) && self.get(F::BtsOffUsr) {
            return Err(DebugCtlError::AllCplsFiltered);
        }
        Ok(self.bts_mode())
    }
}

const LBR: FieldDef = FieldDef::flag(
    "LBR",
    0,
    "record branches in the LBR stack",
    "LBR recording off",
);
const BTF: FieldDef = FieldDef::flag(
    "BTF",
    1,
    "TF single-steps on branches",
    "TF single-steps on instructions",
);

/// Modern layout (Core 2 and later).
pub static DEBUGCTL_MODERN: RegisterDef = RegisterDef {
    name: "IA32_DEBUGCTL",
    sdm: "SDM Vol. 3B §18.4.1 “IA32_DEBUGCTL MSR”",
    reserved: 0xFFFF_FFFF_FFFF_0038,
    width: 64,
    fields: &[
        LBR,
        BTF,
        FieldDef::flag(
            "BLD",
            2,
            "bus-lock detection at CPL > 0 (#DB after a bus lock)",
            "no bus-lock detection",
        ),
        FieldDef::flag(
            "TR",
            6,
            "branch trace messages enabled",
            "branch trace messages off",
        ),
        FieldDef::flag(
            "BTS",
            7,
            "store branch trace messages in the DS area's BTS buffer",
            "BTMs go to the bus only",
        ),
        FieldDef::flag(
            "BTINT",
            8,
            "interrupt when the BTS buffer reaches its threshold",
            "BTS buffer is circular",
        ),
        FieldDef::flag("BTS_OFF_OS", 9, "no BTS/BTM at CPL 0", "BTS/BTM at CPL 0"),
        FieldDef::flag(
            "BTS_OFF_USR",
            10,
            "no BTS/BTM at CPL > 0",
            "BTS/BTM at CPL > 0",
        ),
        FieldDef::flag(
            "FREEZE_LBRS_ON_PMI",
            11,
            "LBR stack frozen on a PMI",
            "LBRs keep recording on a PMI",
        ),
        FieldDef::flag(
            "FREEZE_PERFMON_ON_PMI",
            12,
            "counters frozen on a PMI",
            "counters keep counting on a PMI",
        ),
        FieldDef::flag(
            "ENABLE_UNCORE_PMI",
            13,
            "uncore PMIs delivered to this core",
            "no uncore PMI",
        ),
        FieldDef::flag(
            "FREEZE_WHILE_SMM",
            14,
            "LBR/BTS/counters frozen while in SMM",
            "not frozen in SMM",
        ),
        FieldDef::flag(
            "RTM_DEBUG",
            15,
            "advanced RTM debugging (with DR7.RTM)",
            "no RTM debugging",
        ),
    ],
};

/// NetBurst MSR_DEBUGCTLA layout (Pentium 4 / Xeon).
pub static DEBUGCTL_NETBURST: RegisterDef = RegisterDef {
    name: "IA32_DEBUGCTL",
    sdm: "SDM Vol. 3B “Debug Control (Pentium 4)” MSR_DEBUGCTLA",
    reserved: !0x7F,
    width: 64,
    fields: &[
        LBR,
        BTF,
        FieldDef::flag(
            "TR",
            2,
            "branch trace messages enabled",
            "branch trace messages off",
        ),
        FieldDef::flag(
            "BTS",
            3,
            "store branch trace messages in the DS area's BTS buffer",
            "BTMs go to the bus only",
        ),
        FieldDef::flag(
            "BTINT",
            4,
            "interrupt when the BTS buffer reaches its threshold",
            "BTS buffer is circular",
        ),
        FieldDef::flag("BTS_OFF_OS", 5, "no BTS/BTM at CPL 0", "BTS/BTM at CPL 0"),
        FieldDef::flag(
            "BTS_OFF_USR",
            6,
            "no BTS/BTM at CPL > 0",
            "BTS/BTM at CPL > 0",
        ),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;
    use DebugCtlFlag as F;

    /// Seed 001 writes 0x1C to MSR_DEBUGCTL on a Pentium 4: TR, BTS and
    /// BTINT, storing with an interrupt at the threshold.
    #[test]
    fn seed_001_netburst_0x1c_is_tr_bts_btint() {
        let v = DebugCtl::from_raw(0x1C, DebugCtlLayout::NetBurst);
        assert!(v.get(F::Tr) && v.get(F::Bts) && v.get(F::Btint));
        assert_eq!(v.validate(), Ok(BtsMode::InterruptOnThreshold));
        // Built from flags, the same value.
        let built = DebugCtl::new(DebugCtlLayout::NetBurst)
            .with(F::Tr, true)
            .and_then(|v| v.with(F::Bts, true))
            .and_then(|v| v.with(F::Btint, true))
            .expect("NetBurst has these flags");
        assert_eq!(built.raw(), 0x1C);
        // On a modern processor the same write sets reserved bits 3 and 4.
        assert_eq!(
            DebugCtl::from_raw(0x1C, DebugCtlLayout::Modern).validate(),
            Err(DebugCtlError::ReservedBits {
                layout: DebugCtlLayout::Modern,
                bits: 0x18
            })
        );
    }

    /// Seed 002's table of TR/BTS/BTINT combinations, on the modern layout.
    #[test]
    fn seed_002_tr_bts_btint_combinations() {
        let m = |raw| DebugCtl::from_raw(raw, DebugCtlLayout::Modern);
        assert_eq!(m(0).validate(), Ok(BtsMode::Off));
        assert_eq!(m(1 << 6).validate(), Ok(BtsMode::BusMessages));
        assert_eq!(
            m((1 << 6) | (1 << 7)).validate(),
            Ok(BtsMode::CircularBuffer)
        );
        assert_eq!(
            m((1 << 6) | (1 << 7) | (1 << 8)).validate(),
            Ok(BtsMode::InterruptOnThreshold)
        );
        // TR = 0 turns everything off: BTS/BTINT alone are ignored by hardware.
        assert_eq!(m(1 << 7).bts_mode(), BtsMode::Off);
        assert_eq!(m(1 << 7).validate(), Err(DebugCtlError::BtsWithoutTr));
        assert_eq!(m(1 << 8).validate(), Err(DebugCtlError::BtsWithoutTr));
        assert_eq!(m((1 << 6) | (1 << 8)).bts_mode(), BtsMode::BusMessages);
        assert_eq!(
            m((1 << 6) | (1 << 8)).validate(),
            Err(DebugCtlError::BtintWithoutBts)
        );
        assert_eq!(
            m((1 << 6) | (1 << 7) | (1 << 9) | (1 << 10)).validate(),
            Err(DebugCtlError::AllCplsFiltered)
        );
    }

    #[test]
    fn modern_only_flags_are_refused_on_netburst() {
        let err = DebugCtl::new(DebugCtlLayout::NetBurst)
            .with(F::FreezeLbrsOnPmi, true)
            .unwrap_err();
        assert!(format!("{err}").contains("FREEZE_LBRS_ON_PMI"));
        assert!(!DebugCtl::from_raw(u64::MAX, DebugCtlLayout::NetBurst).get(F::RtmDebug));
    }

    #[test]
    fn typed_bits_match_the_tables() {
        for layout in [DebugCtlLayout::Modern, DebugCtlLayout::NetBurst] {
            for field in layout.def().fields {
                let flag = ALL
                    .iter()
                    .find(|f| f.name() == field.name)
                    .expect("every table field is a flag");
                assert_eq!(
                    layout.bit(*flag),
                    Some(field.bits.lo),
                    "{} in {layout:?}",
                    field.name
                );
            }
        }
    }

    const ALL: [DebugCtlFlag; 13] = [
        F::Lbr,
        F::Btf,
        F::Bld,
        F::Tr,
        F::Bts,
        F::Btint,
        F::BtsOffOs,
        F::BtsOffUsr,
        F::FreezeLbrsOnPmi,
        F::FreezePerfmonOnPmi,
        F::EnableUncorePmi,
        F::FreezeWhileSmm,
        F::RtmDebug,
    ];
}
