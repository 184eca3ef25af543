//! The Intel PT errata a processor has and which family/models have them.
//!
//! Names and the family/model table follow Intel's specification updates
//! as Intel's reference decoder (libipt) knows them, so that decoding with
//! a given `--cpu` applies the same workarounds. The packet dumper uses
//! SKZ84 and SKL168; the flow decoders use the rest.

use core::fmt;

/// The Intel PT errata a processor has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Errata {
    /// BDM70: PSB+ may contain FUP/MODE.Exec before a TIP.PGE.
    pub bdm70: bool,
    /// BDM64: a TSX abort may report a wrong branch.
    pub bdm64: bool,
    /// SKD007: a PSB+ may contain a spurious OVF.
    pub skd007: bool,
    /// SKD022: VM entry after a VMCS packet may lose a TIP.PGD.
    pub skd022: bool,
    /// SKD010: FUP/TIP may be missing after an overflow.
    pub skd010: bool,
    /// SKL014: a FUP may be missing before an IP filter disable.
    pub skl014: bool,
    /// APL12: a FUP may follow an OVF that resolved with tracing disabled.
    pub apl12: bool,
    /// APL11: an extra TIP.PGD may follow an OVF.
    pub apl11: bool,
    /// SKL168: CYC packets right before a PSB may be dropped.
    pub skl168: bool,
    /// SKZ84: TSC scaling/offsetting may corrupt TMA packets.
    pub skz84: bool,
}

/// The family/model has no errata entry ("unknown cpu").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownCpu;

impl fmt::Display for UnknownCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown cpu")
    }
}

impl core::error::Error for UnknownCpu {}

impl Errata {
    /// The errata of display family `family`, model `model` (Intel), or
    /// [`UnknownCpu`] for processors not in the table.
    pub fn for_model(family: u16, model: u8) -> Result<Self, UnknownCpu> {
        let none = Self::default();
        // Groups of models sharing one set of errata.
        let broadwell = Self {
            bdm70: true,
            bdm64: true,
            ..none
        };
        let skylake = Self {
            bdm70: true,
            skd007: true,
            skd022: true,
            skd010: true,
            skl014: true,
            skl168: true,
            ..none
        };
        let server = Self {
            bdm70: true,
            skl014: true,
            skd022: true,
            skz84: true,
            ..none
        };
        let client = Self {
            bdm70: true,
            skl014: true,
            skd022: true,
            ..none
        };
        let hybrid = Self {
            apl11: true,
            ..client
        };
        let goldmont = Self {
            apl12: true,
            apl11: true,
            ..none
        };
        let atom = Self {
            apl11: true,
            ..none
        };

        match (family, model) {
            (0x6, 0x3d | 0x47 | 0x4f | 0x56) => Ok(broadwell),
            (0x6, 0x4e | 0x5e | 0x8e | 0x9e | 0xa5 | 0xa6) => Ok(skylake),
            (0x6, 0x55 | 0x6a | 0x6c | 0x8f | 0xad | 0xae | 0xcf) => Ok(server),
            (0x6, 0x66 | 0x7d | 0x7e | 0x8c | 0x8d | 0xa7 | 0xa8) => Ok(client),
            (
                0x6,
                0x97 | 0x9a | 0xbf | 0xb7 | 0xb5 | 0xaa | 0xac | 0xba | 0xcc | 0xbd | 0xc5 | 0xc6
                | 0xd5,
            ) => Ok(hybrid),
            (0x6, 0x5c | 0x5f) => Ok(goldmont),
            (0x6, 0x7a | 0x86 | 0x96 | 0x9c | 0xb6 | 0xaf | 0xdd) => Ok(atom),
            (0x12, 0x01 | 0x03) => Ok(hybrid),
            (0x13, 0x01) => Ok(server),
            _ => Err(UnknownCpu),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skylake_has_skl168_and_server_skz84() {
        let skl = Errata::for_model(6, 142).unwrap();
        assert!(skl.skl168 && skl.skd010 && !skl.skz84);
        let icx = Errata::for_model(6, 106).unwrap();
        assert!(icx.skz84 && !icx.skl168);
        let glm = Errata::for_model(6, 0x5c).unwrap();
        assert!(glm.apl11 && glm.apl12);
    }

    #[test]
    fn unknown_models_are_reported() {
        assert_eq!(Errata::for_model(0, 0), Err(UnknownCpu));
        assert_eq!(Errata::for_model(6, 1), Err(UnknownCpu));
    }
}
