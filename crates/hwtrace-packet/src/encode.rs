//! The encoder: the exact inverse of the decoder.
//!
//! Every [`Packet`] the decoder can return encodes to bytes that decode back
//! to the same packet. Fields wider than their encoding are refused rather
//! than truncated, so a simulator cannot silently write something else.

use crate::error::EncodeError;
use crate::packet::{Packet, PacketKind};
use crate::sync::PSB;

/// The longest packet (PSB, or a CYC with 15 payload bytes) in bytes.
pub const MAX_PACKET_LEN: usize = 16;

fn check(ok: bool, packet: PacketKind, field: &'static str) -> Result<(), EncodeError> {
    if ok {
        Ok(())
    } else {
        Err(EncodeError::FieldOutOfRange { packet, field })
    }
}

const fn fits(value: u64, bits: u32) -> bool {
    bits >= 64 || value >> bits == 0
}

/// Writes `packet` at the start of `out` and returns its length.
pub fn encode(packet: &Packet, out: &mut [u8]) -> Result<usize, EncodeError> {
    let mut buf = [0u8; MAX_PACKET_LEN];
    let len = encode_into(packet, &mut buf)?;
    let dst = out
        .get_mut(..len)
        .ok_or(EncodeError::BufferTooSmall { needed: len })?;
    dst.copy_from_slice(&buf[..len]);
    Ok(len)
}

fn put_le(buf: &mut [u8], at: usize, value: u64, n: usize) {
    buf[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
}

fn encode_into(packet: &Packet, b: &mut [u8; MAX_PACKET_LEN]) -> Result<usize, EncodeError> {
    let kind = packet.kind();
    Ok(match *packet {
        Packet::Pad => 1,
        Packet::Psb => {
            b.copy_from_slice(&PSB);
            16
        }
        Packet::Psbend => ext(b, 0x23),
        Packet::Ovf => ext(b, 0xf3),
        Packet::Stop => ext(b, 0x83),
        Packet::Tnt(t) => {
            let max = if t.long {
                crate::Tnt::MAX_LONG
            } else {
                crate::Tnt::MAX_SHORT
            };
            check(t.len >= 1 && t.len <= max, kind, "len")?;
            check(fits(t.bits, u32::from(t.len)), kind, "bits")?;
            let payload = (1u64 << t.len) | t.bits;
            if t.long {
                ext(b, 0xa3);
                put_le(b, 2, payload, 6);
                8
            } else {
                b[0] = (payload as u8) << 1;
                1
            }
        }
        Packet::Tip(ip) => ip_packet(b, 0x0d, ip, kind)?,
        Packet::TipPge(ip) => ip_packet(b, 0x11, ip, kind)?,
        Packet::TipPgd(ip) => ip_packet(b, 0x01, ip, kind)?,
        Packet::Fup(ip) => ip_packet(b, 0x1d, ip, kind)?,
        Packet::ModeExec(m) => {
            b[0] = 0x99;
            b[1] = u8::from(m.csl) | u8::from(m.csd) << 1 | u8::from(m.iflag) << 2;
            2
        }
        Packet::ModeTsx(m) => {
            b[0] = 0x99;
            b[1] = 0x20 | u8::from(m.intx) | u8::from(m.abrt) << 1;
            2
        }
        Packet::Pip(p) => {
            check(p.cr3.0 & 0x1f == 0 && fits(p.cr3.0, 52), kind, "cr3")?;
            ext(b, 0x43);
            put_le(b, 2, (p.cr3.0 >> 5) << 1 | u64::from(p.nr), 6);
            8
        }
        Packet::Tsc(v) => {
            check(fits(v, 56), kind, "tsc")?;
            b[0] = 0x19;
            put_le(b, 1, v, 7);
            8
        }
        Packet::Cbr(v) => {
            ext(b, 0x03);
            b[2] = v;
            4
        }
        Packet::Tma(t) => {
            check(fits(u64::from(t.fc), 9), kind, "fc")?;
            ext(b, 0x73);
            put_le(b, 2, u64::from(t.ctc), 2);
            put_le(b, 5, u64::from(t.fc), 2);
            7
        }
        Packet::Mtc(v) => {
            b[0] = 0x59;
            b[1] = v;
            2
        }
        Packet::Cyc(v) => cyc(b, v),
        Packet::Vmcs(v) => {
            check(v & 0xfff == 0 && fits(v, 52), kind, "vmcs")?;
            ext(b, 0xc8);
            put_le(b, 2, v >> 12, 5);
            7
        }
        Packet::Mnt(v) => {
            ext(b, 0xc3);
            b[2] = 0x88;
            put_le(b, 3, v, 8);
            11
        }
        Packet::Ptw(p) => {
            let n = if p.eight_bytes { 8 } else { 4 };
            check(fits(p.payload, 8 * n as u32), kind, "payload")?;
            ext(b, 0x12 | u8::from(p.eight_bytes) << 5 | u8::from(p.ip) << 7);
            put_le(b, 2, p.payload, n);
            2 + n
        }
        Packet::Exstop { ip } => ext(b, if ip { 0xe2 } else { 0x62 }),
        Packet::Mwait(m) => {
            ext(b, 0xc2);
            put_le(b, 2, u64::from(m.hints), 4);
            put_le(b, 6, u64::from(m.ext), 4);
            10
        }
        Packet::Pwre(p) => {
            ext(b, 0x22);
            put_le(b, 2, u64::from(p.raw), 2);
            4
        }
        Packet::Pwrx(p) => {
            check(fits(p.raw, 40), kind, "raw")?;
            ext(b, 0xa2);
            put_le(b, 2, p.raw, 5);
            7
        }
        Packet::Bbp(p) => {
            check(p.ty < 0x20, kind, "type")?;
            ext(b, 0x63);
            b[2] = u8::from(p.four_bytes) << 7 | p.ty;
            3
        }
        Packet::Bip {
            id,
            value,
            four_bytes,
        } => {
            check(id < 0x20, kind, "id")?;
            let n = if four_bytes { 4 } else { 8 };
            check(fits(value, 8 * n as u32), kind, "value")?;
            b[0] = id << 3 | 0x04;
            put_le(b, 1, value, n);
            1 + n
        }
        Packet::Bep { ip } => ext(b, if ip { 0xb3 } else { 0x33 }),
        Packet::Cfe(c) => {
            check(c.ty < 0x20, kind, "type")?;
            ext(b, 0x13);
            b[2] = u8::from(c.ip) << 7 | c.ty;
            b[3] = c.vector;
            4
        }
        Packet::Evd(e) => {
            check(e.ty < 0x40, kind, "type")?;
            ext(b, 0x53);
            b[2] = e.ty;
            put_le(b, 3, e.payload, 8);
            11
        }
        Packet::Trig(t) => {
            b[0] = 0xd9;
            b[1] = u8::from(t.ip) << 7 | u8::from(t.icnt.is_some()) << 6 | u8::from(t.mult) << 5;
            b[2] = t.trbv;
            match t.icnt {
                Some(icnt) => {
                    put_le(b, 3, u64::from(icnt), 2);
                    5
                }
                None => 3,
            }
        }
    })
}

fn ext(b: &mut [u8; MAX_PACKET_LEN], code: u8) -> usize {
    b[0] = 0x02;
    b[1] = code;
    2
}

fn ip_packet(
    b: &mut [u8; MAX_PACKET_LEN],
    opcode: u8,
    ip: crate::IpPayload,
    kind: PacketKind,
) -> Result<usize, EncodeError> {
    let n = ip.compression.payload_len();
    check(fits(ip.raw, 8 * n as u32), kind, "ip payload")?;
    b[0] = ip.compression.bits() << 5 | opcode;
    put_le(b, 1, ip.raw, n);
    Ok(1 + n)
}

/// CYC: five value bits in the header, then seven per extension byte, as
/// few bytes as the value needs.
fn cyc(b: &mut [u8; MAX_PACKET_LEN], v: u64) -> usize {
    b[0] = 0x03 | ((v & 0x1f) as u8) << 3;
    let mut rest = v >> 5;
    if rest == 0 {
        return 1;
    }
    b[0] |= 0x04;
    let mut i = 1;
    loop {
        b[i] = ((rest & 0x7f) as u8) << 1;
        rest >>= 7;
        i += 1;
        if rest == 0 {
            return i;
        }
        b[i - 1] |= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::decode_packet;

    #[test]
    fn cyc_uses_as_few_bytes_as_the_value_needs() {
        for (v, len) in [
            (0u64, 1),
            (0x1f, 1),
            (0x20, 2),
            (0xfff, 2),
            (0x1000, 3),
            (u64::MAX, 10),
        ] {
            let mut out = [0u8; MAX_PACKET_LEN];
            let n = encode(&Packet::Cyc(v), &mut out).unwrap();
            assert_eq!(n, len, "{v:#x}");
            assert_eq!(decode_packet(&out[..n]), Ok((Packet::Cyc(v), n)));
        }
    }

    #[test]
    fn fields_that_do_not_fit_are_refused() {
        let mut out = [0u8; MAX_PACKET_LEN];
        assert!(encode(&Packet::Tsc(1 << 56), &mut out).is_err());
        assert!(encode(&Packet::Vmcs(0x1001), &mut out).is_err());
        let t = crate::Tnt {
            bits: 0,
            len: 7,
            long: false,
        };
        assert!(encode(&Packet::Tnt(t), &mut out).is_err());
        assert_eq!(
            encode(&Packet::Psb, &mut out[..4]),
            Err(EncodeError::BufferTooSmall { needed: 16 })
        );
    }
}
