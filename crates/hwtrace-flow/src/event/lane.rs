//! [`TraceLane`]: the query layer's answers for plain code, read straight
//! from the trace bytes.
//!
//! Between events a trace is TNT-8, TIP and PAD packets, and the layered
//! path (packet decoder, event decoder, query decoder) spends most of its
//! time handing those through three state machines. A lane reads them
//! itself while nothing else can happen: tracing enabled, no event queued
//! or deferred, no PEBS block open. At the first packet it does not read
//! (any other kind, a suppressed or reserved TIP, a truncated packet, the
//! end) it hands the trace back: the event decoder is moved to that packet
//! with the lane's last IP and TNT bits, reads it and what follows as it
//! always does, and the lane goes on from what the layered path then says.
//! So answers, statuses and offsets are the layered path's by
//! construction.
//!
//! The layered path looks one event ahead (to say whether an event is
//! pending); the lane keeps the same look-ahead ([`Next`]), and what
//! [`QueryDecoder::offset`] would say follows from it: after a TNT packet
//! the event decoder is at the first packet after it that is not a PAD,
//! at a TIP on the TIP.

use super::query::{QueryDecoder, Status};
use hwtrace_packet::{IpCompression, IpPayload, LastIp, Tnt};
use hwtrace_types::TraceOffset;

/// The next answer, as the layered path's look-ahead holds it.
#[derive(Clone, Copy, Debug)]
enum Next {
    /// A TNT packet's bits; `at` is its offset (`None` when the layered
    /// path read it, which the lane never hands back to), `after` the
    /// offset of the first packet after it that is not a PAD.
    Tnt {
        bits: u64,
        len: u8,
        at: Option<u64>,
        after: u64,
    },
    /// A TIP with an IP at `at`, `size` bytes; `payload` is still to be
    /// applied to the last IP (`None`: the layered path already did).
    Tip {
        at: u64,
        size: u8,
        payload: Option<IpPayload>,
    },
    /// Anything else: the layered path holds it (and the TNT cache), and
    /// the lane asks it.
    Layered,
}

/// What a lane starts from: the layered path's look-ahead, when it is an
/// answer the lane reads on from.
#[derive(Clone, Copy, Debug)]
pub enum LaneStart {
    /// A TNT packet's bits, and the offset of the first packet after it
    /// that is not a PAD.
    Tnt(Tnt, TraceOffset),
    /// A TIP with an IP (already in the last IP): its offset and size.
    Tip(TraceOffset, u8),
}

/// Answers for conditional and indirect branches read straight from the
/// trace; see the module documentation. Opened on a [`QueryDecoder`]
/// ([`open`](Self::open)) and closed on the same one
/// ([`close`](Self::close)); in between the query decoder is only used
/// through the lane's methods, which are its own (same answers, statuses,
/// offsets).
#[derive(Clone, Copy, Debug)]
pub struct TraceLane<'a> {
    data: &'a [u8],
    /// TNT bits cached, bit `left - 1` next (as the query's TNT cache,
    /// which holds them instead while `next` is [`Next::Layered`]).
    bits: u64,
    left: u8,
    next: Next,
    /// The last IP, without `next`'s payload while that is to be applied.
    last_ip: LastIp,
    /// Answers were taken past the layered path's look-ahead: closing
    /// moves it to `next`.
    moved: bool,
}

/// The status of an answer with nothing pending after it.
const PLAIN: Status = Status {
    event_pending: false,
    ip_suppressed: false,
    eos: false,
};

impl<'a> TraceLane<'a> {
    /// A lane over `query`'s trace, starting where it is.
    #[inline]
    pub fn open(query: &QueryDecoder<'a>) -> Self {
        let (bits, left) = query.cached_tnt();
        let (data, last_ip, start) = query.lane_start();
        let next = match start {
            Some(LaneStart::Tnt(t, after)) => Next::Tnt {
                bits: t.bits,
                len: t.len.min(64),
                at: None,
                after: after.0,
            },
            Some(LaneStart::Tip(at, size)) => Next::Tip {
                at: at.0,
                size,
                payload: None,
            },
            None => Next::Layered,
        };
        Self {
            data,
            bits,
            left,
            next,
            last_ip,
            moved: false,
        }
    }

    /// Hands the trace back to `query` (the one it was opened on), in the
    /// state the layered path would be in after the same answers.
    #[inline]
    pub fn close(self, query: &mut QueryDecoder<'a>) {
        match self.next {
            Next::Layered => {}
            Next::Tnt { at: Some(at), .. } | Next::Tip { at, .. } if self.moved => {
                query.lane_resume(TraceOffset(at), self.last_ip, self.bits, self.left);
            }
            Next::Tnt { .. } | Next::Tip { .. } => query.set_cached_tnt(self.bits, self.left),
        }
    }

    /// Hands the trace back at `at`, a packet the lane does not read, and
    /// goes on from what the layered path says there.
    #[cold]
    #[inline(never)]
    fn hand_back(&mut self, query: &mut QueryDecoder<'a>, at: u64) {
        query.lane_resume(TraceOffset(at), self.last_ip, self.bits, self.left);
        *self = Self::open(query);
    }

    /// After the layered path gave an answer: reads on from there if it
    /// can.
    #[cold]
    #[inline(never)]
    fn reopen<T>(&mut self, query: &QueryDecoder<'a>, answer: Option<T>) -> Option<T> {
        if answer.is_some() {
            *self = Self::open(query);
        }
        answer
    }

    /// Reads the packet at `pos` (PADs skipped) as the next answer, or
    /// hands the trace back there.
    #[inline]
    fn read_next(&mut self, query: &mut QueryDecoder<'a>, pos: u64) {
        let data = self.data;
        let at = skip_pads(data, pos);
        let Some(&b) = data.get(at as usize) else {
            return self.hand_back(query, at);
        };
        if b & 1 == 0 && b != 0x02 {
            // TNT-8 (PADs were skipped): the stop bit above the bits.
            let payload = b >> 1;
            let len = 7 - payload.leading_zeros() as u8;
            self.next = Next::Tnt {
                bits: u64::from(payload) & ((1u64 << len) - 1),
                len,
                at: Some(at),
                after: skip_pads(data, at + 1),
            };
            return;
        }
        if b & 0x1f == 0x0d
            && let Some(compression) = IpCompression::from_bits(b >> 5)
            && compression != IpCompression::Suppressed
        {
            let n = compression.payload_len();
            let from = at as usize + 1;
            if let Some(bytes) = data.get(from..from + n) {
                let mut raw = [0u8; 8];
                raw[..n].copy_from_slice(bytes);
                self.next = Next::Tip {
                    at,
                    size: n as u8 + 1,
                    payload: Some(IpPayload {
                        compression,
                        raw: u64::from_le_bytes(raw),
                    }),
                };
                return;
            }
        }
        self.hand_back(query, at);
    }

    /// The status of the answer just taken (as the query's `status`).
    #[inline]
    fn status(&self, query: &QueryDecoder<'a>) -> Status {
        if self.left > 0 {
            PLAIN
        } else {
            self.status_after_cached_tnt(query)
        }
    }

    /// As [`QueryDecoder::cached_tnt`].
    #[inline]
    pub fn cached_tnt(&self, query: &QueryDecoder<'a>) -> (u64, u8) {
        if let Next::Layered = self.next {
            return query.cached_tnt();
        }
        let mask = if self.left >= 64 {
            u64::MAX
        } else {
            (1u64 << self.left) - 1
        };
        (self.bits & mask, self.left)
    }

    /// As [`QueryDecoder::offset`].
    #[inline]
    pub fn offset(&self, query: &QueryDecoder<'a>) -> TraceOffset {
        match self.next {
            Next::Tnt { after, .. } => TraceOffset(after),
            Next::Tip { at, .. } => TraceOffset(at),
            Next::Layered => query.offset(),
        }
    }

    /// As [`QueryDecoder::status_after_cached_tnt`].
    #[inline]
    pub fn status_after_cached_tnt(&self, query: &QueryDecoder<'a>) -> Status {
        match self.next {
            Next::Tnt { .. } | Next::Tip { .. } => PLAIN_BEYOND,
            Next::Layered => query.status_after_cached_tnt(),
        }
    }

    /// As [`QueryDecoder::drop_cached_tnt`].
    #[inline]
    pub fn drop_cached_tnt(&mut self, query: &mut QueryDecoder<'a>) -> Status {
        if let Next::Layered = self.next {
            return query.drop_cached_tnt();
        }
        self.left = 0;
        PLAIN_BEYOND
    }

    /// As [`QueryDecoder::peek_tnt`].
    #[inline]
    pub fn peek_tnt(&self, query: &QueryDecoder<'a>) -> Option<bool> {
        if self.left > 0 {
            return Some((self.bits >> (self.left - 1)) & 1 != 0);
        }
        match self.next {
            Next::Tnt { bits, len, .. } if len > 0 => Some((bits >> (len - 1)) & 1 != 0),
            Next::Layered => query.peek_tnt(),
            Next::Tnt { .. } | Next::Tip { .. } => None,
        }
    }

    /// Loads the next TNT packet's bits into the cache (which must be
    /// empty) and reads the packet after it.
    #[inline]
    fn load(&mut self, query: &mut QueryDecoder<'a>, bits: u64, len: u8, after: u64) {
        self.bits = bits;
        self.left = len;
        self.moved = true;
        self.read_next(query, after);
    }

    /// As [`QueryDecoder::load_next_tnt_packet`].
    #[inline]
    pub fn load_next_tnt_packet(&mut self, query: &mut QueryDecoder<'a>) -> bool {
        match self.next {
            Next::Tnt {
                bits, len, after, ..
            } if self.left == 0 && len > 0 => {
                self.load(query, bits, len, after);
                true
            }
            Next::Layered => {
                let loaded = query.load_next_tnt_packet();
                self.reopen(query, loaded.then_some(())).is_some()
            }
            Next::Tnt { .. } | Next::Tip { .. } => false,
        }
    }

    /// As [`QueryDecoder::next_tnt_bit`].
    #[inline]
    pub fn next_tnt_bit(
        &mut self,
        query: &mut QueryDecoder<'a>,
        taken_only: bool,
    ) -> Option<(bool, Status)> {
        if let Next::Layered = self.next {
            let answer = query.next_tnt_bit(taken_only);
            return self.reopen(query, answer);
        }
        let taken = self.peek_tnt(query)?;
        if taken_only && !taken {
            return None;
        }
        if self.left == 0 {
            let Next::Tnt {
                bits, len, after, ..
            } = self.next
            else {
                return None;
            };
            self.load(query, bits, len, after);
            if let Next::Layered = self.next {
                // Handed back right after loading: the query holds the
                // bits now.
                let answer = query.next_tnt_bit(taken_only);
                return self.reopen(query, answer);
            }
        }
        self.left -= 1;
        Some((taken, self.status(query)))
    }

    /// As [`QueryDecoder::take_tip`].
    #[inline]
    pub fn take_tip(&mut self, query: &mut QueryDecoder<'a>) -> Option<(u64, Status)> {
        let (at, size, payload) = match self.next {
            Next::Tip { at, size, payload } if self.left == 0 => (at, size, payload),
            Next::Layered => {
                let answer = query.take_tip();
                return self.reopen(query, answer);
            }
            Next::Tnt { .. } | Next::Tip { .. } => return None,
        };
        let mut last_ip = self.last_ip;
        if let Some(p) = payload {
            last_ip.update(p);
        }
        let to = last_ip.ip().ok()?;
        self.last_ip = last_ip;
        self.moved = true;
        self.read_next(query, at + u64::from(size));
        Some((to, self.status_after_cached_tnt(query)))
    }
}

/// The status once no TNT bit is cached, with a TNT packet or a TIP next.
const PLAIN_BEYOND: Status = PLAIN;

/// The first offset from `pos` that does not hold a PAD.
#[inline]
fn skip_pads(data: &[u8], pos: u64) -> u64 {
    match usize::try_from(pos) {
        Ok(at) => pos + hwtrace_packet::pad_run(data, at) as u64,
        Err(_) => pos,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::error::ErrorKind;
    use hwtrace_packet::{ModeExec, Packet, TraceBuilder};

    fn tnt(bits: u64, len: u8) -> Packet {
        Packet::Tnt(Tnt {
            bits,
            len,
            long: len > Tnt::MAX_SHORT,
        })
    }

    fn tip(compression: IpCompression, raw: u64) -> Packet {
        Packet::Tip(IpPayload { compression, raw })
    }

    /// A PSB+ of 64-bit code traced from 0x401000, then `packets`.
    fn after_psb(packets: &[Packet]) -> TraceBuilder {
        let mut t = TraceBuilder::new();
        t.psb_plus_64(0x40_1000).unwrap();
        for p in packets {
            t.push(*p).unwrap();
        }
        t
    }

    /// Two query decoders over `trace`, one asked through lanes and one
    /// directly, the questions a decoder would ask (a TNT bit while there
    /// is one, else a TIP, else the pending event or an indirect branch's
    /// target): every answer, status, offset and TNT cache the same.
    fn same_as_layered(trace: &[u8]) -> usize {
        let mut layered = QueryDecoder::new(trace, Config::default());
        let mut laned = QueryDecoder::new(trace, Config::default());
        assert_eq!(layered.sync_forward(), laned.sync_forward());
        let mut answers = 0;
        loop {
            let mut lane = TraceLane::open(&laned);
            loop {
                let (a, b) = if layered.peek_tnt().is_some() {
                    let a = layered.next_tnt_bit(false).map(|(t, s)| (u64::from(t), s));
                    let b = lane
                        .next_tnt_bit(&mut laned, false)
                        .map(|(t, s)| (u64::from(t), s));
                    (a, b)
                } else {
                    (layered.take_tip(), lane.take_tip(&mut laned))
                };
                assert_eq!(a, b, "answer {answers}");
                if a.is_none() {
                    break;
                }
                answers += 1;
                assert_eq!(
                    layered.offset(),
                    lane.offset(&laned),
                    "offset after answer {answers}"
                );
                assert_eq!(layered.cached_tnt(), lane.cached_tnt(&laned));
                assert_eq!(
                    layered.status_after_cached_tnt(),
                    lane.status_after_cached_tnt(&laned)
                );
            }
            lane.close(&mut laned);
            assert_eq!(layered.offset(), laned.offset());
            assert_eq!(layered.cached_tnt(), laned.cached_tnt());
            assert_eq!(layered.time(), laned.time());
            let (a, b) = match layered.event() {
                Err(ErrorKind::BadQuery) => {
                    let a = layered.indirect_branch();
                    (
                        a.map(|(ip, s)| (ip, s, None)),
                        laned.indirect_branch().map(|(ip, s)| (ip, s, None)),
                    )
                }
                a => (
                    a.map(|(ev, s)| (None, s, Some(ev))),
                    laned.event().map(|(ev, s)| (None, s, Some(ev))),
                ),
            };
            assert_eq!(a, b, "after answer {answers}");
            if a.is_err() {
                return answers;
            }
        }
    }

    #[test]
    fn answers_statuses_and_offsets_are_the_layered_paths() {
        let mut t = after_psb(&[
            tnt(0b101101, 6),
            Packet::Pad,
            Packet::Pad,
            tip(IpCompression::Update16, 0x2000),
            tnt(0b1, 1),
            Packet::Pad,
            tnt(0b0110, 4),
            tip(IpCompression::Sext48, 0x7fff_1234_5678),
            tip(IpCompression::Update32, 0x0040_3000),
            tip(IpCompression::Update48, 0x0000_0040_4000),
            tip(IpCompression::Full, 0x40_5000),
            // Read by the layered path (timing), the lane goes on after.
            Packet::Mtc(3),
            tnt(0b11, 2),
            Packet::Pad,
            Packet::Mtc(4),
            tip(IpCompression::Update16, 0x6000),
            // A TNT-64: the lane hands back, the layered path loads it.
            tnt(0x1234_5678_9abc, 47),
            tnt(0b10, 2),
            // Suppressed: the layered path answers.
            tip(IpCompression::Suppressed, 0),
            tnt(0b1, 1),
            // MODE.Exec waits for the TIP: nothing for a lane.
            Packet::ModeExec(ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            }),
            tip(IpCompression::Update16, 0x7000),
            tnt(0b01, 2),
            Packet::TipPgd(IpPayload::SUPPRESSED),
        ]);
        t.psb_plus_64(0x40_8000).unwrap();
        t.push(tnt(0b111, 3)).unwrap();
        t.push(Packet::Pad).unwrap();
        // Cut short: a TIP missing its last byte.
        t.raw(&[0x4d, 0x12]);
        let trace = t.finish();
        assert!(same_as_layered(&trace) > 20);
    }

    #[test]
    fn every_prefix_ends_where_the_layered_path_ends() {
        let trace = after_psb(&[
            tnt(0b110, 3),
            Packet::Pad,
            tip(IpCompression::Update16, 0x2000),
            tip(IpCompression::Sext48, 0x40_3000),
            tnt(0b1, 1),
            Packet::Pad,
        ])
        .finish();
        for len in 0..=trace.len() {
            same_as_layered(&trace[..len]);
        }
    }
}
