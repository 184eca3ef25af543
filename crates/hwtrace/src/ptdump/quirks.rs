//! Where libipt's packet layer reads the bytes differently from
//! `hwtrace-packet`, and the errata workarounds that live in libipt's
//! packet decoder. ptdump's output depends on them, so the printer applies
//! them on top of our decoder.

use hwtrace_packet::{DecodedPacket, Packet};

use super::cpu::Errata;

/// What to do with a decoded packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// Print it as decoded.
    None,
    /// libipt rejects it ("unknown packet").
    Reserved,
    /// Erratum SKZ84: a corrupted TMA, shown as `<invalid>` and skipped.
    Invalid {
        /// Bytes it covers.
        size: u8,
        /// Where decoding continues.
        resume: u64,
    },
    /// Show another packet instead and continue at `resume`.
    Replace {
        packet: Packet,
        size: u8,
        resume: u64,
    },
}

use hwtrace_flow::event::quirks::{SKZ84_TMA_LEN as SKZ84_TMA_SIZE, tma_reserved};

/// Erratum SKD007 (the predicate is shared with the flow decoder).
fn skd007_ovf(bytes: &[u8], data: &[u8], offset: u64) -> bool {
    usize::try_from(offset).is_ok_and(|o| hwtrace_flow::event::quirks::skd007_ovf(bytes, data, o))
}

/// Checks one decoded packet (`bytes` are its bytes, `data` the trace).
pub fn check(decoded: &DecodedPacket, bytes: &[u8], data: &[u8], errata: &Errata) -> Quirk {
    let offset = decoded.offset.0;
    match decoded.packet {
        Packet::Tma(_) if tma_reserved(bytes) => {
            if errata.skz84 {
                Quirk::Invalid {
                    size: SKZ84_TMA_SIZE,
                    resume: offset + u64::from(SKZ84_TMA_SIZE),
                }
            } else {
                Quirk::Reserved
            }
        }
        Packet::Cyc(_) if errata.skd007 && skd007_ovf(bytes, data, offset) => Quirk::Replace {
            packet: Packet::Ovf,
            size: 2,
            // The OVF starts one byte into the CYC and is two bytes long.
            resume: offset + 3,
        },
        _ => Quirk::None,
    }
}

pub use hwtrace_flow::event::quirks::pwre_hw;

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_packet::Tma;
    use hwtrace_types::TraceOffset;

    fn decoded(packet: Packet, offset: u64, size: u8) -> DecodedPacket {
        DecodedPacket {
            offset: TraceOffset(offset),
            size,
            packet,
        }
    }

    #[test]
    fn tma_reserved_bits() {
        let tma = decoded(Packet::Tma(Tma { ctc: 0x101, fc: 1 }), 0, 7);
        let none = Errata::default();
        let skz84 = Errata {
            skz84: true,
            ..none
        };
        let good = [0x02, 0x73, 1, 1, 0, 1, 0];
        let bad_ctc = [0x02, 0x73, 1, 1, 1, 1, 0];
        let bad_fc = [0x02, 0x73, 1, 1, 0, 1, 0x40];
        assert_eq!(check(&tma, &good, &good, &none), Quirk::None);
        assert_eq!(check(&tma, &bad_ctc, &bad_ctc, &none), Quirk::Reserved);
        assert_eq!(check(&tma, &bad_fc, &bad_fc, &none), Quirk::Reserved);
        assert_eq!(
            check(&tma, &bad_ctc, &bad_ctc, &skz84),
            Quirk::Invalid { size: 8, resume: 8 }
        );
    }

    #[test]
    fn skd007_turns_cyc_into_ovf() {
        let data = [0xf7, 0x02, 0xf3, 0x00];
        let cyc = decoded(Packet::Cyc(0x3e), 0, 2);
        let skd007 = Errata {
            skd007: true,
            ..Errata::default()
        };
        assert_eq!(
            check(&cyc, &data[..2], &data, &skd007),
            Quirk::Replace {
                packet: Packet::Ovf,
                size: 2,
                resume: 3
            }
        );
        assert_eq!(
            check(&cyc, &data[..2], &data, &Errata::default()),
            Quirk::None
        );
        let not_ovf = [0xf7, 0x02, 0x00];
        assert_eq!(check(&cyc, &not_ovf[..2], &not_ovf, &skd007), Quirk::None);
    }

    #[test]
    fn pwre_hw_bit() {
        assert!(pwre_hw(&[0x02, 0x22, 0x08, 0xff]));
        assert!(!pwre_hw(&[0x02, 0x22, 0x80, 0xff]));
    }
}
