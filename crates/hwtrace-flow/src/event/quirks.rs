//! Where libipt's packet layer reads bytes differently from
//! `hwtrace-packet`, including the errata workarounds libipt applies while
//! reading packets. The flow decoder reads packets through
//! [`next_packet`] so it sees the trace as libipt does.

use crate::errata::Errata;
use hwtrace_packet::{DecodeError, DecodeErrorKind, DecodedPacket, Packet, PacketDecoder};
use hwtrace_types::TraceOffset;

/// libipt's size for a TMA corrupted by SKZ84 (one more than a TMA).
const SKZ84_TMA_SIZE: u64 = 8;
/// The second byte of an OVF packet.
const OVF_EXT: u8 = 0xf3;

/// libipt's size for a TMA corrupted by SKZ84 (one more than a TMA).
pub const SKZ84_TMA_LEN: u8 = SKZ84_TMA_SIZE as u8;

/// A TMA (given its bytes) with reserved bits set: byte 4, or byte 6
/// above the fast counter's bit 8 (SDM vol. 3C, "TMA Packet").
pub fn tma_reserved(bytes: &[u8]) -> bool {
    bytes.get(4).is_some_and(|&b| b != 0) || bytes.get(6).is_some_and(|&b| b & 0xfe != 0)
}

/// SKD007: an OVF may overwrite a multi-byte CYC's payload, leaving
/// `CYC 02 F3`: a two-byte CYC (`bytes`, at `offset` of `data`) whose
/// second byte is `02` followed by `F3` is an OVF one byte into it.
pub fn skd007_ovf(bytes: &[u8], data: &[u8], offset: usize) -> bool {
    bytes.len() == 2
        && bytes[1] == 0x02
        && offset.checked_add(2).and_then(|a| data.get(a)) == Some(&OVF_EXT)
}

/// PWRE's hardware-request flag as libipt reads it: bit 3 of payload byte
/// 2 (the SDM and Linux perf use bit 7).
pub fn pwre_hw(bytes: &[u8]) -> bool {
    bytes.get(2).is_some_and(|&b| b & 0x08 != 0)
}

/// The next packet as libipt's packet decoder reports it: SKZ84's corrupt
/// TMAs are skipped, SKD007's CYC-hidden OVF is an OVF, a TMA with
/// reserved bits is an error, and PWRE's hardware flag is read from bit 3
/// of its first payload byte.
///
/// Inlined: the event decoder calls it for every packet, PADs included.
#[inline]
pub fn next_packet(
    pkt: &mut PacketDecoder<'_>,
    errata: &Errata,
) -> Result<Option<DecodedPacket>, DecodeError> {
    loop {
        let Some(mut p) = pkt.next_packet()? else {
            return Ok(None);
        };
        let offset = p.offset.0;
        match p.packet {
            // Most packets need no second look: return them before
            // slicing their bytes.
            Packet::Pad | Packet::Tnt(_) | Packet::Tip(_) | Packet::Fup(_) => return Ok(Some(p)),
            Packet::Tma(_) if tma_reserved(pkt.bytes(&p)) => {
                if !errata.skz84 {
                    return Err(DecodeError {
                        offset: p.offset,
                        kind: DecodeErrorKind::Reserved {
                            packet: hwtrace_packet::PacketKind::Tma,
                            what: "reserved bits set",
                        },
                    });
                }
                let resume = TraceOffset(offset + SKZ84_TMA_SIZE);
                if pkt.set_offset(resume).is_err() {
                    return Ok(None);
                }
                continue;
            }
            Packet::Cyc(_)
                if errata.skd007
                    && usize::try_from(offset)
                        .is_ok_and(|o| skd007_ovf(pkt.bytes(&p), pkt.data(), o)) =>
            {
                let resume = TraceOffset(offset + 3);
                if pkt.set_offset(resume).is_err() {
                    return Ok(None);
                }
                p.packet = Packet::Ovf;
                p.size = 2;
                return Ok(Some(p));
            }
            Packet::Pwre(mut pwre) => {
                let hw = pwre_hw(pkt.bytes(&p));
                pwre.raw = (pwre.raw & !0x80) | if hw { 0x80 } else { 0 };
                p.packet = Packet::Pwre(pwre);
                return Ok(Some(p));
            }
            _ => return Ok(Some(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skz84_tma_is_skipped() {
        // TMA with byte 4 set, then PAD.
        let data = [0x02, 0x73, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00];
        let errata = Errata {
            skz84: true,
            ..Errata::default()
        };
        let mut pkt = PacketDecoder::new(&data);
        let p = next_packet(&mut pkt, &errata).unwrap().unwrap();
        assert_eq!((p.offset, p.packet), (TraceOffset(8), Packet::Pad));
        let mut pkt = PacketDecoder::new(&data);
        assert!(next_packet(&mut pkt, &Errata::default()).is_err());
    }
}
