//! The packet decoder: borrowed bytes in, packets with offsets out.
//!
//! One function, [`decode_packet`], knows every opcode (SDM vol. 3C, 33.4.1,
//! table 33-3 "Compound Packet Event Summary" and the per-packet tables of
//! 33.4.2). [`PacketDecoder`] walks a buffer with it and keeps the only state
//! packet decoding needs: the position, the last sync point, and whether a
//! BBP made the next bytes BIP items.

use crate::error::{DecodeError, DecodeErrorKind};
use crate::ip::{IpCompression, IpPayload};
use crate::packet::{
    Bbp, Cfe, Evd, ModeExec, ModeTsx, Mwait, Packet, PacketKind, Pip, Ptw, Pwre, Pwrx, Tma, Tnt,
    Trig,
};
use crate::sync;
use hwtrace_types::{Cr3, TraceOffset};

/// A packet and where it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodedPacket {
    /// The offset of the packet's first byte.
    pub offset: TraceOffset,
    /// The packet's length in bytes.
    pub size: u8,
    /// The packet.
    pub packet: Packet,
}

/// The bytes a resync passed over: from the failing offset to the PSB it
/// found.
///
/// `to` can lie before `from` when the PSB was hidden inside the bytes of
/// the packet that failed (a truncated packet overlapping the next PSB);
/// decoding then resumes at `to` and nothing was skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Where decoding failed.
    pub from: TraceOffset,
    /// The PSB decoding resumes at.
    pub to: TraceOffset,
}

impl Skipped {
    /// How many bytes were not decoded.
    pub const fn len(&self) -> u64 {
        self.to.0.saturating_sub(self.from.0)
    }

    /// Whether no byte was lost.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the bytes after a BBP are BIP items, and of which size
/// (SDM 33.4.2.26-28). Outside a block, `xxxxx100b` is a TNT-8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
enum BlockContext {
    #[default]
    None,
    Four,
    Eight,
}

impl BlockContext {
    /// The context after `packet`: BBP opens a block; BIP, PAD, timing,
    /// FUP, MNT and power packets may sit inside one; anything else closes
    /// it (the rule Linux perf's decoder follows).
    #[inline]
    fn after(self, packet: &Packet) -> Self {
        match packet {
            Packet::Bbp(b) if b.four_bytes => Self::Four,
            Packet::Bbp(_) => Self::Eight,
            Packet::Bip { .. }
            | Packet::Pad
            | Packet::Tsc(_)
            | Packet::Tma(_)
            | Packet::Mtc(_)
            | Packet::Cyc(_)
            | Packet::Cbr(_)
            | Packet::Mnt(_)
            | Packet::Fup(_)
            | Packet::Exstop { .. }
            | Packet::Pwre(_)
            | Packet::Pwrx(_) => self,
            _ => Self::None,
        }
    }
}

/// A zero-copy Intel PT packet decoder over a byte slice.
///
/// Decoding starts at offset 0 as if that were a packet boundary; call
/// [`sync_forward`](Self::sync_forward) first for a trace that may start
/// mid-packet (a wrapped ring buffer, a snapshot). After an error the
/// position stays on the failing packet; [`resync`](Self::resync) moves on
/// to the next PSB.
#[derive(Clone, Debug)]
pub struct PacketDecoder<'a> {
    data: &'a [u8],
    pos: usize,
    sync: Option<usize>,
    fresh: bool,
    halted: bool,
    block: BlockContext,
}

impl<'a> PacketDecoder<'a> {
    /// A decoder at the start of `data`.
    pub const fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            pos: 0,
            sync: None,
            fresh: true,
            halted: false,
            block: BlockContext::None,
        }
    }

    /// The trace bytes.
    pub const fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The offset of the next packet.
    pub const fn offset(&self) -> TraceOffset {
        TraceOffset(self.pos as u64)
    }

    /// The offset of the PSB the decoder last synchronised to.
    pub fn sync_offset(&self) -> Option<TraceOffset> {
        self.sync.map(|s| TraceOffset(s as u64))
    }

    /// The raw bytes of a packet this decoder returned.
    pub fn bytes(&self, packet: &DecodedPacket) -> &'a [u8] {
        let start = packet.offset.0 as usize;
        self.data
            .get(start..start + packet.size as usize)
            .unwrap_or(&[])
    }

    /// Decodes the next packet; `Ok(None)` at the end of the trace.
    #[inline]
    pub fn next_packet(&mut self) -> Result<Option<DecodedPacket>, DecodeError> {
        let pos = self.pos;
        let Some(&b0) = self.data.get(pos) else {
            return Ok(None);
        };
        self.fresh = false;
        let offset = TraceOffset(pos as u64);
        // The one-byte packets (PAD, TNT-8) are most of a typical trace:
        // decode them without the general dispatch.
        if b0 & 1 == 0 && b0 != 0x02 && self.block == BlockContext::None {
            self.pos = pos + 1;
            let packet = if b0 == 0 {
                Packet::Pad
            } else {
                Packet::Tnt(short_tnt(b0))
            };
            return Ok(Some(DecodedPacket {
                offset,
                size: 1,
                packet,
            }));
        }
        match decode_in_context(&self.data[pos..], self.block) {
            Ok((packet, size)) => {
                self.pos = pos + size;
                if self.block != BlockContext::None || matches!(packet, Packet::Bbp(_)) {
                    self.block = self.block.after(&packet);
                }
                Ok(Some(DecodedPacket {
                    offset,
                    size: size as u8,
                    packet,
                }))
            }
            Err(kind) => Err(DecodeError { offset, kind }),
        }
    }

    /// Moves to the next PSB and returns its offset.
    ///
    /// The search starts a little before the current position, so a PSB
    /// whose first bytes were taken for the payload of a broken packet is
    /// still found, but never returns the PSB the decoder is synchronised
    /// at. Repeated calls therefore always make progress. (libipt's
    /// `pt_pkt_sync_forward` finds the same PSBs.)
    pub fn sync_forward(&mut self) -> Result<TraceOffset, DecodeError> {
        let mut pos = self.pos;
        if Some(pos) == self.sync && !self.fresh {
            pos += sync::PSB.len();
        }
        let start = pos - pos.min(sync::PSB.len() - 1);
        let found = sync::find_psb_forward(self.data, start).ok_or(DecodeError {
            offset: TraceOffset(start as u64),
            kind: DecodeErrorKind::NoPsb,
        })?;
        Ok(self.synced_at(found))
    }

    /// Moves to the PSB before the current position (before the end of the
    /// trace on a fresh decoder) and returns its offset.
    pub fn sync_backward(&mut self) -> Result<TraceOffset, DecodeError> {
        let pos = if self.fresh {
            self.data.len()
        } else {
            self.pos
        };
        let found = sync::find_psb_backward(self.data, pos).ok_or(DecodeError {
            offset: TraceOffset(pos as u64),
            kind: DecodeErrorKind::NoPsb,
        })?;
        Ok(self.synced_at(found))
    }

    /// Synchronises at `offset`, which must hold a PSB.
    pub fn sync_at(&mut self, offset: TraceOffset) -> Result<(), DecodeError> {
        let at = offset.0 as usize;
        if offset.0 > self.data.len() as u64 {
            return Err(DecodeError {
                offset,
                kind: DecodeErrorKind::OutOfBounds,
            });
        }
        if !sync::is_psb_at(self.data, at) {
            return Err(DecodeError {
                offset,
                kind: DecodeErrorKind::NotPsb,
            });
        }
        self.synced_at(at);
        Ok(())
    }

    /// Passes over the PADs at the current position (none inside a PEBS
    /// block, where a zero byte is not a PAD): what calling
    /// [`next_packet`](Self::next_packet) until it returned something else
    /// would have read, eight bytes at a time. Returns how many.
    #[inline]
    pub fn skip_pads(&mut self) -> usize {
        if self.block != BlockContext::None {
            return 0;
        }
        let n = pad_run(self.data, self.pos);
        if n > 0 {
            self.pos += n;
            self.fresh = false;
        }
        n
    }

    /// Treats `offset` as a packet boundary and sync point without checking
    /// for a PSB (ptdump's `--no-sync`, or a position known from an index).
    pub fn set_offset(&mut self, offset: TraceOffset) -> Result<(), DecodeError> {
        if offset.0 > self.data.len() as u64 {
            return Err(DecodeError {
                offset,
                kind: DecodeErrorKind::OutOfBounds,
            });
        }
        self.synced_at(offset.0 as usize);
        Ok(())
    }

    /// Whether the next packet is read as a top-level packet: no PEBS
    /// block (BBP) is open, in which bytes mean block items instead.
    #[inline]
    pub fn at_top_level(&self) -> bool {
        self.block == BlockContext::None
    }

    /// Moves to `offset`, keeping the sync point: for a flow decoder that
    /// read one-byte and IP packets straight from [`data`](Self::data)
    /// and hands the rest back. `offset` must be a packet boundary at top
    /// level (as must the current position) and not past the end;
    /// otherwise nothing moves.
    pub fn move_to(&mut self, offset: TraceOffset) -> Result<(), DecodeError> {
        let at = usize::try_from(offset.0).unwrap_or(usize::MAX);
        if at > self.data.len() || self.block != BlockContext::None {
            return Err(DecodeError {
                offset,
                kind: DecodeErrorKind::OutOfBounds,
            });
        }
        self.pos = at;
        self.fresh = false;
        self.halted = false;
        Ok(())
    }

    /// After an error: moves to the next PSB and says which bytes were
    /// passed over.
    pub fn resync(&mut self) -> Result<Skipped, DecodeError> {
        let from = self.offset();
        let to = self.sync_forward()?;
        Ok(Skipped { from, to })
    }

    fn synced_at(&mut self, at: usize) -> TraceOffset {
        self.pos = at;
        self.sync = Some(at);
        self.fresh = false;
        self.halted = false;
        self.block = BlockContext::None;
        TraceOffset(at as u64)
    }
}

impl Iterator for PacketDecoder<'_> {
    type Item = Result<DecodedPacket, DecodeError>;

    /// Packets until the end of the trace or the first error; the iterator
    /// stops after an error (call [`PacketDecoder::resync`] to go on).
    fn next(&mut self) -> Option<Self::Item> {
        if self.halted {
            return None;
        }
        match self.next_packet() {
            Ok(Some(p)) => Some(Ok(p)),
            Ok(None) => None,
            Err(e) => {
                // The position stays on the error so resync can go on from
                // it; the iterator ends here instead of repeating it.
                self.halted = true;
                Some(Err(e))
            }
        }
    }
}

/// How many PADs (zero bytes) `data` holds from `pos` on: traces written
/// with alignment padding have runs of them between most packets, so they
/// are counted eight at a time.
#[inline]
pub fn pad_run(data: &[u8], pos: usize) -> usize {
    let mut at = pos;
    // Most packets have no PAD before them: one byte decides.
    if data.get(at) != Some(&0) {
        return 0;
    }
    while let Some(word) = data.get(at..at + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        let w = u64::from_le_bytes(w);
        if w != 0 {
            // The first non-zero byte (little-endian: the lowest set bit).
            return at - pos + (w.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while data.get(at) == Some(&0) {
        at += 1;
    }
    at - pos
}

/// Decodes the packet at the start of `bytes` outside any PEBS block;
/// returns it with its length.
#[inline]
pub fn decode_packet(bytes: &[u8]) -> Result<(Packet, usize), DecodeErrorKind> {
    decode_in_context(bytes, BlockContext::None)
}

#[inline]
fn truncated(packet: Option<PacketKind>, needed: usize, available: usize) -> DecodeErrorKind {
    DecodeErrorKind::Truncated {
        packet,
        needed: needed as u8,
        available: available.min(255) as u8,
    }
}

/// Reads `n` (≤ 8) little-endian bytes at `at`; the caller checked bounds.
#[inline(always)]
fn le(bytes: &[u8], at: usize, n: usize) -> u64 {
    if let Some(word) = bytes.get(at..at + 8) {
        let mut a = [0u8; 8];
        a.copy_from_slice(word);
        let v = u64::from_le_bytes(a);
        if n == 8 {
            v
        } else {
            v & ((1u64 << (n * 8)) - 1)
        }
    } else {
        let mut a = [0u8; 8];
        if let Some(src) = bytes.get(at..at + n) {
            a[..n].copy_from_slice(src);
        }
        u64::from_le_bytes(a)
    }
}

#[inline]
fn need(bytes: &[u8], kind: PacketKind, len: usize) -> Result<(), DecodeErrorKind> {
    if bytes.len() < len {
        Err(truncated(Some(kind), len, bytes.len()))
    } else {
        Ok(())
    }
}

#[inline]
fn decode_in_context(
    bytes: &[u8],
    block: BlockContext,
) -> Result<(Packet, usize), DecodeErrorKind> {
    let Some(&b0) = bytes.first() else {
        return Err(truncated(None, 1, 0));
    };
    if block != BlockContext::None && b0 & 0x07 == 0x04 {
        return decode_bip(bytes, b0, block == BlockContext::Four);
    }
    match b0 {
        0x00 => return Ok((Packet::Pad, 1)),
        0x02 => return decode_ext(bytes),
        _ => {}
    }
    if b0 & 0x01 == 0 {
        return Ok((Packet::Tnt(short_tnt(b0)), 1));
    }
    if b0 & 0x03 == 0x03 {
        return decode_cyc(bytes, b0);
    }
    match b0 & 0x1f {
        0x0d => return decode_ip(bytes, b0, PacketKind::Tip).map(|(ip, n)| (Packet::Tip(ip), n)),
        0x11 => {
            return decode_ip(bytes, b0, PacketKind::TipPge).map(|(ip, n)| (Packet::TipPge(ip), n));
        }
        0x01 => {
            return decode_ip(bytes, b0, PacketKind::TipPgd).map(|(ip, n)| (Packet::TipPgd(ip), n));
        }
        0x1d => return decode_ip(bytes, b0, PacketKind::Fup).map(|(ip, n)| (Packet::Fup(ip), n)),
        _ => {}
    }
    match b0 {
        0x99 => decode_mode(bytes),
        0x19 => {
            need(bytes, PacketKind::Tsc, 8)?;
            Ok((Packet::Tsc(le(bytes, 1, 7)), 8))
        }
        0x59 => {
            need(bytes, PacketKind::Mtc, 2)?;
            Ok((Packet::Mtc(bytes[1]), 2))
        }
        0xd9 => decode_trig(bytes),
        opcode => Err(DecodeErrorKind::UnknownOpcode { opcode }),
    }
}

/// TNT-8: the payload is bits 7:1 with a stop bit above the branch bits.
#[inline]
fn short_tnt(b0: u8) -> Tnt {
    let payload = b0 >> 1;
    let len = 7 - payload.leading_zeros() as u8;
    Tnt {
        bits: u64::from(payload) & ((1u64 << len) - 1),
        len,
        long: false,
    }
}

#[inline]
fn decode_ip(
    bytes: &[u8],
    b0: u8,
    kind: PacketKind,
) -> Result<(IpPayload, usize), DecodeErrorKind> {
    let compression = IpCompression::from_bits(b0 >> 5).ok_or(DecodeErrorKind::Reserved {
        packet: kind,
        what: "IPBytes value (101b or 111b)",
    })?;
    let n = compression.payload_len();
    need(bytes, kind, 1 + n)?;
    let raw = if n == 0 { 0 } else { le(bytes, 1, n) };
    Ok((IpPayload { compression, raw }, 1 + n))
}

fn decode_cyc(bytes: &[u8], b0: u8) -> Result<(Packet, usize), DecodeErrorKind> {
    /// The most payload bytes after the header a CYC may have.
    const MAX_EXT: usize = 15;
    let mut value = u64::from(b0 >> 3);
    if b0 & 0x04 == 0 {
        return Ok((Packet::Cyc(value), 1));
    }
    let mut shift = 5u32;
    let mut i = 1;
    loop {
        if i > MAX_EXT {
            return Err(DecodeErrorKind::CycTooLong);
        }
        let Some(&b) = bytes.get(i) else {
            return Err(truncated(Some(PacketKind::Cyc), i + 1, bytes.len()));
        };
        if shift < 64 {
            value |= u64::from(b >> 1) << shift;
        }
        shift += 7;
        i += 1;
        if b & 1 == 0 {
            return Ok((Packet::Cyc(value), i));
        }
    }
}

fn decode_mode(bytes: &[u8]) -> Result<(Packet, usize), DecodeErrorKind> {
    need(bytes, PacketKind::ModeExec, 2)?;
    let b = bytes[1];
    match b >> 5 {
        0 => Ok((
            Packet::ModeExec(ModeExec {
                csl: b & 1 != 0,
                csd: b & 2 != 0,
                iflag: b & 4 != 0,
            }),
            2,
        )),
        1 => Ok((
            Packet::ModeTsx(ModeTsx {
                intx: b & 1 != 0,
                abrt: b & 2 != 0,
            }),
            2,
        )),
        _ => Err(DecodeErrorKind::Reserved {
            packet: PacketKind::ModeExec,
            what: "mode leaf",
        }),
    }
}

fn decode_trig(bytes: &[u8]) -> Result<(Packet, usize), DecodeErrorKind> {
    need(bytes, PacketKind::Trig, 3)?;
    let flags = bytes[1];
    let icnt_valid = flags & 0x40 != 0;
    let len = if icnt_valid { 5 } else { 3 };
    need(bytes, PacketKind::Trig, len)?;
    let icnt = icnt_valid.then(|| le(bytes, 3, 2) as u16);
    let trig = Trig {
        trbv: bytes[2],
        ip: flags & 0x80 != 0,
        mult: flags & 0x20 != 0,
        icnt,
    };
    Ok((Packet::Trig(trig), len))
}

fn decode_bip(bytes: &[u8], b0: u8, four: bool) -> Result<(Packet, usize), DecodeErrorKind> {
    let n = if four { 4 } else { 8 };
    need(bytes, PacketKind::Bip, 1 + n)?;
    Ok((
        Packet::Bip {
            id: b0 >> 3,
            value: le(bytes, 1, n),
            four_bytes: four,
        },
        1 + n,
    ))
}

fn decode_ext(bytes: &[u8]) -> Result<(Packet, usize), DecodeErrorKind> {
    let Some(&ext) = bytes.get(1) else {
        return Err(truncated(None, 2, bytes.len()));
    };
    let fixed = |kind: PacketKind, len: usize, packet: fn(&[u8]) -> Packet| {
        need(bytes, kind, len).map(|()| (packet(bytes), len))
    };
    match ext {
        0x82 => {
            need(bytes, PacketKind::Psb, sync::PSB.len())?;
            if bytes[..sync::PSB.len()] == sync::PSB {
                Ok((Packet::Psb, sync::PSB.len()))
            } else {
                Err(DecodeErrorKind::BadPsb)
            }
        }
        0x23 => Ok((Packet::Psbend, 2)),
        0xf3 => Ok((Packet::Ovf, 2)),
        0x83 => Ok((Packet::Stop, 2)),
        0xa3 => {
            need(bytes, PacketKind::Tnt64, 8)?;
            let payload = le(bytes, 2, 6);
            // A TNT holds at least one branch (SDM 33.4.2.1): a payload of
            // zero has no stop bit, and one of 1 has nothing below it.
            if payload <= 1 {
                return Err(DecodeErrorKind::Reserved {
                    packet: PacketKind::Tnt64,
                    what: "payload without branches",
                });
            }
            let len = 63 - payload.leading_zeros() as u8;
            let bits = payload & ((1u64 << len) - 1);
            Ok((
                Packet::Tnt(Tnt {
                    bits,
                    len,
                    long: true,
                }),
                8,
            ))
        }
        0x43 => fixed(PacketKind::Pip, 8, |b| {
            let payload = le(b, 2, 6);
            Packet::Pip(Pip {
                cr3: Cr3((payload >> 1) << 5),
                nr: payload & 1 != 0,
            })
        }),
        0x03 => fixed(PacketKind::Cbr, 4, |b| Packet::Cbr(b[2])),
        0x73 => fixed(PacketKind::Tma, 7, |b| {
            Packet::Tma(Tma {
                ctc: le(b, 2, 2) as u16,
                fc: (le(b, 5, 2) & 0x1ff) as u16,
            })
        }),
        0xc8 => fixed(PacketKind::Vmcs, 7, |b| Packet::Vmcs(le(b, 2, 5) << 12)),
        0xc3 => {
            let Some(&ext2) = bytes.get(2) else {
                return Err(truncated(None, 3, bytes.len()));
            };
            if ext2 != 0x88 {
                return Err(DecodeErrorKind::UnknownExt2Opcode { ext2 });
            }
            fixed(PacketKind::Mnt, 11, |b| Packet::Mnt(le(b, 3, 8)))
        }
        0x62 => Ok((Packet::Exstop { ip: false }, 2)),
        0xe2 => Ok((Packet::Exstop { ip: true }, 2)),
        0xc2 => fixed(PacketKind::Mwait, 10, |b| {
            Packet::Mwait(Mwait {
                hints: le(b, 2, 4) as u32,
                ext: le(b, 6, 4) as u32,
            })
        }),
        0x22 => fixed(PacketKind::Pwre, 4, |b| {
            Packet::Pwre(Pwre {
                raw: le(b, 2, 2) as u16,
            })
        }),
        0xa2 => fixed(PacketKind::Pwrx, 7, |b| {
            Packet::Pwrx(Pwrx { raw: le(b, 2, 5) })
        }),
        0x13 => fixed(PacketKind::Cfe, 4, |b| {
            Packet::Cfe(Cfe {
                ty: b[2] & 0x1f,
                ip: b[2] & 0x80 != 0,
                vector: b[3],
            })
        }),
        0x53 => fixed(PacketKind::Evd, 11, |b| {
            Packet::Evd(Evd {
                ty: b[2] & 0x3f,
                payload: le(b, 3, 8),
            })
        }),
        0x63 => fixed(PacketKind::Bbp, 3, |b| {
            Packet::Bbp(Bbp {
                four_bytes: b[2] & 0x80 != 0,
                ty: b[2] & 0x1f,
            })
        }),
        0x33 => Ok((Packet::Bep { ip: false }, 2)),
        0xb3 => Ok((Packet::Bep { ip: true }, 2)),
        e if e & 0x1f == 0x12 => {
            let eight_bytes = match (e >> 5) & 0x3 {
                0 => false,
                1 => true,
                _ => {
                    return Err(DecodeErrorKind::Reserved {
                        packet: PacketKind::Ptw,
                        what: "PayloadBytes value (1xb)",
                    });
                }
            };
            let n = if eight_bytes { 8 } else { 4 };
            need(bytes, PacketKind::Ptw, 2 + n)?;
            let ptw = Ptw {
                payload: le(bytes, 2, n),
                eight_bytes,
                ip: e & 0x80 != 0,
            };
            Ok((Packet::Ptw(ptw), 2 + n))
        }
        ext => Err(DecodeErrorKind::UnknownExtOpcode { ext }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn pad_runs_are_counted_to_the_first_other_byte() {
        // Every run length from 0 to 19 before a TNT-8, at every alignment,
        // and runs that reach the end of the data.
        for lead in 0..9 {
            for run in 0..20 {
                let mut bytes = vec![0x06; lead];
                bytes.extend(core::iter::repeat_n(0u8, run));
                bytes.push(0x06);
                assert_eq!(pad_run(&bytes, lead), run, "lead {lead}, run {run}");
                bytes.pop();
                assert_eq!(
                    pad_run(&bytes, lead),
                    run,
                    "lead {lead}, run {run} at the end"
                );
            }
        }
        assert_eq!(pad_run(&[0, 0], 5), 0, "past the end");
    }

    #[test]
    fn skip_pads_reads_what_next_packet_would_and_not_inside_a_block() {
        // PSB, three PADs, TNT-8, BBP (opens a PEBS block), a zero byte.
        let mut bytes = crate::sync::PSB.to_vec();
        bytes.extend_from_slice(&[0x00, 0x00, 0x00, 0x06, 0x02, 0x63, 0x00, 0x00]);
        let mut d = PacketDecoder::new(&bytes);
        d.sync_forward().unwrap();
        assert!(matches!(d.next_packet(), Ok(Some(p)) if p.packet == Packet::Psb));
        let mut stepped = d.clone();
        while matches!(stepped.next_packet(), Ok(Some(p)) if p.packet == Packet::Pad) {}
        assert_eq!(d.skip_pads(), 3);
        assert_eq!(
            d.next_packet(),
            Ok(Some(DecodedPacket {
                offset: TraceOffset(19),
                size: 1,
                packet: Packet::Tnt(short_tnt(0x06)),
            }))
        );
        assert_eq!(
            stepped.offset(),
            TraceOffset(20),
            "next_packet read the PADs and the TNT"
        );
        assert!(matches!(d.next_packet(), Ok(Some(p)) if matches!(p.packet, Packet::Bbp(_))));
        assert_eq!(d.skip_pads(), 0, "a zero byte in a PEBS block is no PAD");
    }

    #[test]
    fn move_to_keeps_the_sync_point_and_refuses_block_context() {
        // PSB, PAD, TNT-8, BBP (opens a PEBS block).
        let mut bytes = crate::sync::PSB.to_vec();
        bytes.extend_from_slice(&[0x00, 0x06, 0x02, 0x63, 0x00]);
        let mut d = PacketDecoder::new(&bytes);
        d.sync_forward().unwrap();
        let tnt_at = TraceOffset(17);
        d.move_to(tnt_at).unwrap();
        assert_eq!(d.offset(), tnt_at);
        assert_eq!(d.sync_offset(), Some(TraceOffset(0)));
        assert!(matches!(d.next_packet(), Ok(Some(p)) if matches!(p.packet, Packet::Tnt(_))));
        // Back to the PAD: packets read again the same.
        d.move_to(TraceOffset(16)).unwrap();
        assert!(matches!(d.next_packet(), Ok(Some(p)) if p.packet == Packet::Pad));
        assert!(d.move_to(TraceOffset(bytes.len() as u64 + 1)).is_err());
        d.move_to(TraceOffset(18)).unwrap();
        assert!(d.at_top_level());
        assert!(matches!(d.next_packet(), Ok(Some(p)) if matches!(p.packet, Packet::Bbp(_))));
        assert!(!d.at_top_level());
        assert!(d.move_to(TraceOffset(16)).is_err());
        assert_eq!(d.offset(), TraceOffset(21));
    }

    fn one(bytes: &[u8]) -> (Packet, usize) {
        decode_packet(bytes).unwrap_or_else(|e| panic!("{bytes:02x?}: {e}"))
    }

    #[test]
    fn short_tnt_keeps_oldest_branch_highest() {
        // 0b1_10001_0: stop bit, then T N N N T (oldest first).
        let (p, n) = one(&[0b1100_0110]);
        assert_eq!(n, 1);
        let Packet::Tnt(t) = p else { panic!("{p:?}") };
        assert_eq!((t.len, t.long), (6, false));
        assert_eq!(
            t.iter().collect::<std::vec::Vec<_>>(),
            [true, false, false, false, true, true]
        );
    }

    #[test]
    fn tnt64_without_branches_is_reserved() {
        // Found by fuzzing; libipt rejects it too.
        for payload in [0u8, 1] {
            let bytes = [0x02, 0xa3, payload, 0, 0, 0, 0, 0];
            assert!(matches!(
                decode_packet(&bytes),
                Err(DecodeErrorKind::Reserved { .. })
            ));
        }
    }

    #[test]
    fn truncated_packets_name_what_is_missing() {
        assert_eq!(
            decode_packet(&[0x19, 1, 2]),
            Err(DecodeErrorKind::Truncated {
                packet: Some(PacketKind::Tsc),
                needed: 8,
                available: 3
            })
        );
        assert_eq!(
            decode_packet(&[0x02]),
            Err(DecodeErrorKind::Truncated {
                packet: None,
                needed: 2,
                available: 1
            })
        );
    }

    #[test]
    fn reserved_encodings_are_errors() {
        assert!(matches!(
            decode_packet(&[0xad, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeErrorKind::Reserved { .. })
        ));
        assert!(matches!(
            decode_packet(&[0xed, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(DecodeErrorKind::Reserved { .. })
        ));
        assert!(matches!(
            decode_packet(&[0x99, 0x40]),
            Err(DecodeErrorKind::Reserved { .. })
        ));
        assert!(matches!(
            decode_packet(&[0x02, 0x52, 0, 0, 0, 0]),
            Err(DecodeErrorKind::Reserved { .. })
        ));
        assert_eq!(
            decode_packet(&[0xc9]),
            Err(DecodeErrorKind::UnknownOpcode { opcode: 0xc9 })
        );
        assert_eq!(
            decode_packet(&[0x02, 0x04]),
            Err(DecodeErrorKind::UnknownExtOpcode { ext: 0x04 })
        );
        assert_eq!(
            decode_packet(&[0x02, 0xc3, 0x00]),
            Err(DecodeErrorKind::UnknownExt2Opcode { ext2: 0 })
        );
    }

    #[test]
    fn bip_only_inside_a_block() {
        let bytes = [0x02, 0x63, 0x80, 0x04, 1, 2, 3, 4, 0x02, 0x33, 0x04];
        let mut d = PacketDecoder::new(&bytes);
        let kinds: std::vec::Vec<_> = d.by_ref().map(|p| p.unwrap().packet.kind()).collect();
        assert_eq!(
            kinds,
            [
                PacketKind::Bbp,
                PacketKind::Bip,
                PacketKind::Bep,
                PacketKind::Tnt8
            ]
        );
    }

    #[test]
    fn resync_finds_a_psb_hidden_in_a_broken_packet() {
        // libipt's ptdump-trunc-resync: an MNT whose payload is the first
        // half of a PSB, followed by the second half and a FUP.
        let mut t = std::vec::Vec::new();
        t.extend_from_slice(&[0; 6]);
        t.extend_from_slice(&sync::PSB);
        t.extend_from_slice(&[0x02, 0xc3, 0x88]);
        for _ in 0..8 {
            t.extend_from_slice(&[0x02, 0x82]);
        }
        t.extend_from_slice(&[0x7d, 0, 0x10, 0, 0xa0, 0, 0, 0x02, 0x23]);
        let mut d = PacketDecoder::new(&t);
        assert_eq!(d.sync_forward().unwrap(), TraceOffset(6));
        assert_eq!(d.next_packet().unwrap().unwrap().packet, Packet::Psb);
        assert_eq!(
            d.next_packet().unwrap().unwrap().packet,
            Packet::Mnt(0x8202_8202_8202_8202)
        );
        let err = d.next_packet().unwrap_err();
        assert_eq!(
            (err.offset, err.kind),
            (TraceOffset(0x21), DecodeErrorKind::BadPsb)
        );
        let skipped = d.resync().unwrap();
        assert_eq!(
            skipped,
            Skipped {
                from: TraceOffset(0x21),
                to: TraceOffset(0x19)
            }
        );
        assert!(skipped.is_empty());
        let rest: std::vec::Vec<_> = d.map(|p| p.unwrap().packet.kind()).collect();
        assert_eq!(rest, [PacketKind::Psb, PacketKind::Fup, PacketKind::Psbend]);
    }

    extern crate std;
}
