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
//! A lane opened with [`TraceLane::open_with_toggles`] also reads a
//! TIP.PGD with an IP right followed (PADs aside) by a TIP.PGE with an IP:
//! tracing went off at a branch and came back on elsewhere, which on an
//! IP-filtered trace is every call out of the traced ranges. Until the
//! caller takes the pair ([`TraceLane::take_toggle`]) the lane answers as
//! the layered path does with the disable pending; left untaken, it is
//! handed back like any other packet.
//!
//! The layered path looks one event ahead (to say whether an event is
//! pending); the lane keeps the same look-ahead ([`Next`]), and what
//! [`QueryDecoder::offset`] would say follows from it: after a TNT packet
//! the event decoder is at the first packet after it that is not a PAD,
//! at a TIP on the TIP.

use super::query::{QueryDecoder, Status};
use super::tnt::low_bits;
use hwtrace_packet::{IpCompression, IpPayload, LastIp, Tnt};
use hwtrace_types::TraceOffset;

/// The next answer, as the layered path's look-ahead holds it.
#[derive(Clone, Copy, Debug)]
enum Next {
    /// A TNT packet's bits (none set at or above `len`); `at` is its offset (`None` when the layered
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
    /// A TIP.PGD with an IP at `at`, `size` bytes, and right after it
    /// (PADs aside) a TIP.PGE with an IP at `pge_at`, `pge_size` bytes:
    /// tracing went off at a branch and came back on elsewhere (code
    /// outside the filtered ranges ran in between). Their payloads are
    /// still to be applied to the last IP. Only read by a lane opened
    /// with [`TraceLane::open_with_toggles`].
    Toggle {
        at: u64,
        pgd: IpPayload,
        pge_at: u64,
        pge_size: u8,
        pge: IpPayload,
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
    /// which holds them instead while `next` is [`Next::Layered`]). None
    /// set at or above `left`: the bits used are cleared as they go, so
    /// handing them out (at every block a burst looks for a path from)
    /// needs no mask.
    bits: u64,
    left: u8,
    next: Next,
    /// The last IP, without `next`'s payload while that is to be applied.
    last_ip: LastIp,
    /// Answers were taken past the layered path's look-ahead: closing
    /// moves it to `next`.
    moved: bool,
    /// Whether TIP.PGD/TIP.PGE pairs are read ([`Next::Toggle`]).
    toggles: bool,
}

/// The status of an answer with nothing pending after it.
const PLAIN: Status = Status {
    event_pending: false,
    ip_suppressed: false,
    eos: false,
};

/// The status of an answer with an event next (the layered path's, with a
/// TIP.PGD read as its look-ahead).
const EVENT_NEXT: Status = Status {
    event_pending: true,
    ip_suppressed: false,
    eos: false,
};

/// The low five bits of the IP packets' first byte (SDM vol. 3C, "IP
/// packets"); the top three are the IP compression.
const TIP: u8 = 0x0d;
const TIP_PGE: u8 = 0x11;
pub(crate) const TIP_PGD: u8 = 0x01;

impl<'a> TraceLane<'a> {
    /// A lane over `query`'s trace, starting where it is.
    #[inline]
    pub fn open(query: &QueryDecoder<'a>) -> Self {
        Self::open_as(query, false)
    }

    /// A lane that also reads a TIP.PGD with an IP followed by a TIP.PGE
    /// with an IP, for a caller that passes over the disable and enable
    /// events they are ([`toggle_next`](Self::toggle_next),
    /// [`take_toggle`](Self::take_toggle)). Until the pair is taken, the
    /// lane answers as the layered path does with the disable pending.
    #[inline]
    pub fn open_with_toggles(query: &QueryDecoder<'a>) -> Self {
        Self::open_as(query, true)
    }

    #[inline]
    fn open_as(query: &QueryDecoder<'a>, toggles: bool) -> Self {
        // Masked already (`TntCache::pending`).
        let (bits, left) = query.cached_tnt();
        let (data, last_ip, start) = query.lane_start();
        let next = match start {
            Some(LaneStart::Tnt(t, after)) => Next::Tnt {
                bits: low_bits(t.bits, t.len),
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
            toggles,
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
            // The layered path reads the TIP.PGD again.
            Next::Toggle { at, .. } => {
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
        *self = Self::open_as(query, self.toggles);
    }

    /// After the layered path gave an answer: reads on from there if it
    /// can.
    #[cold]
    #[inline(never)]
    fn reopen<T>(&mut self, query: &QueryDecoder<'a>, answer: Option<T>) -> Option<T> {
        if answer.is_some() {
            *self = Self::open_as(query, self.toggles);
        }
        answer
    }

    /// Reads the packet at `pos` (PADs skipped) as the next answer, or
    /// hands the trace back there. A TNT-8 packet (most of a trace) is
    /// read here, anything else out of line.
    #[inline(always)]
    fn read_next(&mut self, query: &mut QueryDecoder<'a>, pos: u64) {
        let data = self.data;
        let at = skip_pads(data, pos);
        if let Some((bits, len)) = data.get(at as usize).and_then(|&b| tnt8(b)) {
            let after = skip_pads(data, at + 1);
            if after_tnt(data, after) {
                self.next = Next::Tnt {
                    bits,
                    len,
                    at: Some(at),
                    after,
                };
                return;
            }
            // The layered path's offset after it is past what follows.
            return self.hand_back(query, at);
        }
        self.read_other(query, at);
    }

    /// [`read_next`](Self::read_next) at `at`, a packet that is not a
    /// TNT-8 (or the end).
    #[inline(never)]
    fn read_other(&mut self, query: &mut QueryDecoder<'a>, at: u64) {
        let data = self.data;
        let Some(&b) = data.get(at as usize) else {
            return self.hand_back(query, at);
        };
        if b & 0x1f == TIP
            && let Some((payload, size)) = ip_packet(data, at)
        {
            self.next = Next::Tip {
                at,
                size,
                payload: Some(payload),
            };
            return;
        }
        if self.toggles
            && let Some(toggle) = toggle_at(data, at)
        {
            self.next = toggle;
            return;
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
    #[inline(always)]
    pub fn cached_tnt(&self, query: &QueryDecoder<'a>) -> (u64, u8) {
        if let Next::Layered = self.next {
            return query.cached_tnt();
        }
        (self.bits, self.left)
    }

    /// As [`QueryDecoder::offset`].
    #[inline]
    pub fn offset(&self, query: &QueryDecoder<'a>) -> TraceOffset {
        match self.next {
            Next::Tnt { after, .. } => TraceOffset(after),
            Next::Tip { at, .. } => TraceOffset(at),
            // The event decoder reads on past a TIP.PGD.
            Next::Toggle { pge_at, .. } => TraceOffset(pge_at),
            Next::Layered => query.offset(),
        }
    }

    /// As [`QueryDecoder::status_after_cached_tnt`].
    #[inline(always)]
    pub fn status_after_cached_tnt(&self, query: &QueryDecoder<'a>) -> Status {
        match self.next {
            Next::Tnt { .. } | Next::Tip { .. } => PLAIN_BEYOND,
            Next::Toggle { .. } => EVENT_NEXT,
            Next::Layered => query.status_after_cached_tnt(),
        }
    }

    /// As [`QueryDecoder::drop_cached_tnt`].
    #[inline]
    pub fn drop_cached_tnt(&mut self, query: &mut QueryDecoder<'a>) -> Status {
        if let Next::Layered = self.next {
            return query.drop_cached_tnt();
        }
        self.bits = 0;
        self.left = 0;
        self.status_after_cached_tnt(query)
    }

    /// As [`QueryDecoder::drop_tnt_bits`]: the next `n` cached bits, fewer
    /// than are cached.
    #[inline]
    pub fn drop_tnt_bits(&mut self, query: &mut QueryDecoder<'a>, n: u8) {
        if let Next::Layered = self.next {
            return query.drop_tnt_bits(n);
        }
        debug_assert!(n < self.left, "dropping every cached bit");
        self.left = self.left.saturating_sub(n);
        self.bits = low_bits(self.bits, self.left);
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
            Next::Tnt { .. } | Next::Tip { .. } | Next::Toggle { .. } => None,
        }
    }

    /// Loads the next TNT packet's bits into the cache (which must be
    /// empty) and reads the packet after it. `bits` has none set at or
    /// above `len` ([`Next::Tnt`] never has).
    #[inline(always)]
    fn load(&mut self, query: &mut QueryDecoder<'a>, bits: u64, len: u8, after: u64) {
        debug_assert_eq!(bits, low_bits(bits, len));
        self.bits = bits;
        self.left = len;
        self.moved = true;
        self.read_next(query, after);
    }

    /// As [`QueryDecoder::load_next_tnt_packet`].
    #[inline(always)]
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
            Next::Tnt { .. } | Next::Tip { .. } | Next::Toggle { .. } => false,
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
        self.bits &= !(1u64 << self.left);
        Some((taken, self.status(query)))
    }

    /// With no TNT bit cached and a TIP.PGD/TIP.PGE pair next (lanes
    /// opened with [`open_with_toggles`](Self::open_with_toggles)): the
    /// TIP.PGD's IP and the TIP.PGE's. The layered path has the disable
    /// pending then, and every answer the lane gives is the one it would
    /// give.
    #[inline]
    pub fn toggle_next(&self) -> Option<(u64, u64)> {
        let Next::Toggle { pgd, pge, .. } = self.next else {
            return None;
        };
        if self.left > 0 {
            return None;
        }
        let mut last_ip = self.last_ip;
        last_ip.update(pgd);
        let off = last_ip.ip().ok()?;
        last_ip.update(pge);
        Some((off, last_ip.ip().ok()?))
    }

    /// Takes the TIP.PGD/TIP.PGE pair [`toggle_next`](Self::toggle_next)
    /// saw (the disable and enable events the layered path would report)
    /// and reads on after it: the TIP.PGE's IP, where tracing is back on.
    /// The status then is [`status_after_cached_tnt`](Self::status_after_cached_tnt)'s,
    /// the one the layered path reports with the enable.
    #[inline]
    pub fn take_toggle(&mut self, query: &mut QueryDecoder<'a>) -> Option<u64> {
        let (_, on) = self.toggle_next()?;
        let Next::Toggle {
            pgd,
            pge_at,
            pge_size,
            pge,
            ..
        } = self.next
        else {
            return None;
        };
        self.last_ip.update(pgd);
        self.last_ip.update(pge);
        self.moved = true;
        self.read_next(query, pge_at + u64::from(pge_size));
        Some(on)
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
            Next::Tnt { .. } | Next::Tip { .. } | Next::Toggle { .. } => return None,
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

/// Where a lane is, for a caller that reads the trace bytes itself for a
/// while ([`TraceLane::chain_start`], [`TraceLane::chain_resume`]): the
/// look-ahead packet's offset (PADs skipped; a TNT-8 packet or a TIP with
/// an IP, not yet applied to `last_ip`), the TNT bits cached before it
/// (bit `left - 1` next, none set at or above `left`) and the last IP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaneAt {
    pub pos: u64,
    pub bits: u64,
    pub left: u8,
    pub last_ip: LastIp,
}

impl<'a> TraceLane<'a> {
    /// The trace the lane reads.
    #[inline(always)]
    pub(crate) fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Where the lane is, when its look-ahead is a packet it read itself
    /// (a TNT-8 packet, or a TIP whose IP is still to be applied): from
    /// there the trace may be read byte by byte with [`tnt8`], [`tip_at`]
    /// and [`plain_offset`], and the lane moved on with
    /// [`chain_resume`](Self::chain_resume).
    #[inline(always)]
    pub(crate) fn chain_start(&self) -> Option<LaneAt> {
        let pos = match self.next {
            Next::Tnt { at: Some(at), .. }
            | Next::Tip {
                at,
                payload: Some(_),
                ..
            } => at,
            _ => return None,
        };
        Some(LaneAt {
            pos,
            bits: self.bits,
            left: self.left,
            last_ip: self.last_ip,
        })
    }

    /// With the packet at `pos` (PADs skipped) as the look-ahead and
    /// `last_ip` the last IP: the TIP.PGD/TIP.PGE pair there, when the lane
    /// reads it (it was opened with
    /// [`open_with_toggles`](Self::open_with_toggles)), as a chain passes
    /// it over ([`take_toggle`](Self::take_toggle) for the lane).
    #[inline]
    pub(crate) fn toggle_pair(&self, pos: u64, last_ip: LastIp) -> Option<TogglePair> {
        if !self.toggles {
            return None;
        }
        toggle_pair_at(self.data, pos, last_ip)
    }

    /// Whether the lane reads disable/enable pairs
    /// ([`toggle_pair`](Self::toggle_pair)).
    #[inline]
    pub(crate) const fn reads_toggles(&self) -> bool {
        self.toggles
    }

    /// Moves the lane to `at`, from where [`chain_start`](Self::chain_start)
    /// said it was: the packets between were read (TNT packets loaded,
    /// TIPs applied to the last IP). Answers go on as if the lane had
    /// read them.
    #[inline]
    pub(crate) fn chain_resume(&mut self, query: &mut QueryDecoder<'a>, at: LaneAt) {
        self.bits = at.bits;
        self.left = at.left;
        self.last_ip = at.last_ip;
        self.moved = true;
        self.read_next(query, at.pos);
    }
}

/// The TIP.PGD/TIP.PGE pair at trace position `pos` of `data`, with
/// `last_ip` the last IP, as [`TraceLane::toggle_pair`] reads it (for a
/// lane that reads pairs). As `toggle_at` reads the pair, the IPs read
/// straight from the bytes: one pair every ~55 bytes of a filtered trace.
#[inline]
pub(crate) fn toggle_pair_at(data: &[u8], pos: u64, mut last_ip: LastIp) -> Option<TogglePair> {
    if data.get(usize::try_from(pos).ok()?)? & 0x1f != TIP_PGD {
        return None;
    }
    let (off, end) = ip_of(data, pos, &mut last_ip)?;
    let pge_at = skip_pads(data, end);
    if data.get(usize::try_from(pge_at).ok()?)? & 0x1f != TIP_PGE {
        return None;
    }
    let (on, after) = ip_of(data, pge_at, &mut last_ip)?;
    Some(TogglePair {
        off,
        on,
        last_ip,
        on_at: pge_at,
        after,
    })
}

/// A TIP.PGD/TIP.PGE pair ([`TraceLane::toggle_pair`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TogglePair {
    /// The TIP.PGD's IP (where the branch tracing stopped at went).
    pub off: u64,
    /// The TIP.PGE's (where tracing is back on).
    pub on: u64,
    /// The last IP after both.
    pub last_ip: LastIp,
    /// The TIP.PGE's trace offset (the one the lane reports with the pair
    /// as its look-ahead, [`offset`](TraceLane::offset)).
    pub on_at: u64,
    /// The trace position after the TIP.PGE (PADs not skipped).
    pub after: u64,
}

/// The TNT-8 packet whose byte is `b` (PADs skipped before it): its bits
/// (the next one highest) and how many.
#[inline(always)]
pub(crate) const fn tnt8(b: u8) -> Option<(u64, u8)> {
    if b & 1 != 0 || b <= 0x02 {
        return None;
    }
    // The stop bit above the bits.
    let payload = b >> 1;
    let len = 7 - payload.leading_zeros() as u8;
    Some((payload as u64 & ((1u64 << len) - 1), len))
}

/// The TIP with an IP at `pos`, its bytes all there, applied to
/// `last_ip` (updated): the IP it gives and the trace position after it.
/// A counted trace has a TIP every ~20 bytes.
#[inline(always)]
pub(crate) fn tip_ip(data: &[u8], pos: u64, last_ip: &mut LastIp) -> Option<(u64, u64)> {
    if *data.get(usize::try_from(pos).ok()?)? & 0x1f != TIP {
        return None;
    }
    ip_of(data, pos, last_ip)
}

/// The IP packet (TIP, TIP.PGE, TIP.PGD, FUP) at `pos`, its IP not
/// suppressed and its bytes all there, applied to `last_ip` (updated):
/// the IP it gives and the trace position after it. What
/// [`LastIp::update`] gives with the packet's payload, read with one load
/// of eight bytes and [`LastIp::update_raw`]'s tables.
#[inline(always)]
fn ip_of(data: &[u8], pos: u64, last_ip: &mut LastIp) -> Option<(u64, u64)> {
    let at = usize::try_from(pos).ok()?;
    let &b = data.get(at)?;
    let raw = match data.get(at + 1..at + 9) {
        Some(eight) => u64::from_le_bytes(eight.try_into().ok()?),
        None => tail_bytes(data, at + 1),
    };
    let mut ip = *last_ip;
    let (to, size) = ip.update_raw(b, raw)?;
    if data.len() - at < usize::from(size) {
        return None;
    }
    *last_ip = ip;
    Some((to, pos + u64::from(size)))
}

/// The bytes from `at` to the end of `data` (fewer than eight), as the
/// low bytes of a little-endian word: out of the hot loops, for the last
/// packet of a trace.
#[cold]
#[inline(never)]
fn tail_bytes(data: &[u8], at: usize) -> u64 {
    let rest = data.get(at..).unwrap_or(&[]);
    let mut raw = [0u8; 8];
    let n = rest.len().min(8);
    raw[..n].copy_from_slice(&rest[..n]);
    u64::from_le_bytes(raw)
}

/// With the packet at `pos` (PADs skipped) as a lane's look-ahead: the
/// trace offset the lane then reports ([`TraceLane::offset`]: after a
/// TNT packet and the PADs after it, on a TIP), if it is a packet the
/// lane reads with nothing pending (a TNT-8 packet, a TIP with an IP).
///
/// A TNT packet only when what follows it is a packet the lane reads too
/// ([`after_tnt`]): the layered path reads on past the packets it takes
/// in passing (timing packets, MODE, PIP, ...), so its offset is beyond
/// them.
#[inline(always)]
pub(crate) fn plain_offset(data: &[u8], pos: u64) -> Option<u64> {
    let at = usize::try_from(pos).ok()?;
    let &b = data.get(at)?;
    if tnt8(b).is_some() {
        let after = skip_pads(data, pos + 1);
        return after_tnt(data, after).then_some(after);
    }
    if b & 0x1f != TIP {
        return None;
    }
    let compression = IpCompression::from_bits(b >> 5)?;
    if compression == IpCompression::Suppressed || data.len() - at <= compression.payload_len() {
        return None;
    }
    Some(pos)
}

/// Whether the byte `b` starts a packet that may follow a TNT packet the
/// lane reads: a TNT-8, a TIP or a TIP.PGD, each where the layered path
/// stops to answer (with a TNT packet as its look-ahead it has looked
/// past it, and past whatever it takes in passing after it: a timing
/// packet, MODE, PIP, ...; a lane offset there would be short of the
/// layered path's). By table: the straight TNT-8 loop asks it of every
/// packet.
#[inline(always)]
pub(crate) fn lane_reads(b: u8) -> bool {
    AFTER_TNT[usize::from(b)]
}

/// [`lane_reads`] by byte.
static AFTER_TNT: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let v = b as u8;
        t[b] = tnt8(v).is_some() || v & 0x1f == TIP || v & 0x1f == TIP_PGD;
        b += 1;
    }
    t
};

/// Whether a lane may read a TNT packet that `pos` (PADs skipped) is
/// right after: the end of the trace, or a packet [`lane_reads`].
#[inline(always)]
pub(crate) fn after_tnt(data: &[u8], pos: u64) -> bool {
    match data.get(pos as usize) {
        Some(&b) => lane_reads(b),
        None => true,
    }
}

/// The TIP.PGD with an IP at `at` right followed (PADs aside) by a
/// TIP.PGE with an IP, as a lane's look-ahead ([`Next::Toggle`]).
#[inline]
fn toggle_at(data: &[u8], at: u64) -> Option<Next> {
    if data.get(at as usize)? & 0x1f != TIP_PGD {
        return None;
    }
    let (pgd, size) = ip_packet(data, at)?;
    let pge_at = skip_pads(data, at + u64::from(size));
    if data.get(pge_at as usize)? & 0x1f != TIP_PGE {
        return None;
    }
    let (pge, pge_size) = ip_packet(data, pge_at)?;
    Some(Next::Toggle {
        at,
        pgd,
        pge_at,
        pge_size,
        pge,
    })
}

/// The status once no TNT bit is cached, with a TNT packet or a TIP next.
const PLAIN_BEYOND: Status = PLAIN;

/// The IP packet (TIP, TIP.PGE, TIP.PGD) at `at` when its IP is not
/// suppressed and its bytes are all there: its payload and size.
#[inline]
fn ip_packet(data: &[u8], at: u64) -> Option<(IpPayload, u8)> {
    let &b = data.get(at as usize)?;
    let compression = IpCompression::from_bits(b >> 5)?;
    if compression == IpCompression::Suppressed {
        return None;
    }
    let n = compression.payload_len();
    let from = at as usize + 1;
    if data.len() < from + n {
        return None;
    }
    // Eight bytes at once where the trace has them (a copy of a variable
    // length is a call to memmove), masked to the payload's.
    let eight = match data
        .get(from..from + 8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
    {
        Some(eight) => u64::from_le_bytes(eight),
        None => tail_bytes(data, from),
    };
    let raw = if n < 8 {
        eight & ((1u64 << (8 * n)) - 1)
    } else {
        eight
    };
    let payload = IpPayload { compression, raw };
    Some((payload, n as u8 + 1))
}

/// The first offset from `pos` that does not hold a PAD.
///
/// Whether a PAD follows a packet is data, not a pattern a branch
/// predictor learns (about one packet in four of the real traces, before
/// TIPs and TNT packets alike): the next eight bytes are read at once and
/// the PADs among them counted without a branch; only eight PADs or more,
/// or the trace's last bytes, take the loop.
#[inline(always)]
pub(crate) fn skip_pads(data: &[u8], pos: u64) -> u64 {
    let Ok(at) = usize::try_from(pos) else {
        return pos;
    };
    if let Some(eight) = data.get(at..at.wrapping_add(8)) {
        let word = u64::from_le_bytes(eight.try_into().unwrap_or_default());
        if word != 0 {
            return pos + u64::from(word.trailing_zeros() / 8);
        }
    }
    match data.get(at) {
        Some(&b) if b != 0 => pos,
        Some(_) => pos + hwtrace_packet::pad_run(data, at) as u64,
        None => pos,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::error::ErrorKind;
    use crate::event::EventKind;
    use hwtrace_packet::{ModeExec, Packet, TraceBuilder};

    #[test]
    fn skip_pads_stops_at_the_first_other_byte_or_the_end() {
        // PAD runs of every length to 19, at offsets before and past the
        // last eight bytes, followed by a packet byte or by the end.
        for run in 0..20usize {
            for lead in 0..10usize {
                for tail in [&[][..], &[0x02][..], &[0x4d, 0x00][..]] {
                    let mut data = vec![0x55; lead];
                    data.extend(std::iter::repeat_n(0u8, run));
                    data.extend_from_slice(tail);
                    let want = data[lead..].iter().take_while(|&&b| b == 0).count();
                    let got = skip_pads(&data, lead as u64);
                    assert_eq!(
                        got,
                        (lead + want) as u64,
                        "run {run} lead {lead} tail {tail:?}"
                    );
                }
            }
        }
        assert_eq!(skip_pads(&[0, 0], 5), 5);
        assert_eq!(skip_pads(&[0, 0], u64::MAX), u64::MAX);
    }

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

    /// What a lane does with TIP.PGD/TIP.PGE pairs in [`same_as_layered`].
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Pairs {
        /// Not read (a lane opened with [`TraceLane::open`]).
        Unread,
        /// Read, never taken: the lane is closed before them.
        Closed,
        /// Read and taken ([`TraceLane::take_toggle`]).
        Taken,
    }

    /// Two query decoders over `trace`, one asked through lanes and one
    /// directly, the questions a decoder would ask (a TNT bit while there
    /// is one, else a TIP, else the pending event or an indirect branch's
    /// target): every answer, status, offset and TNT cache the same.
    /// Returns how many answers, and how many disable/enable pairs the
    /// lanes took.
    fn same_as_layered(trace: &[u8], pairs: Pairs) -> (usize, usize) {
        let mut layered = QueryDecoder::new(trace, Config::default());
        let mut laned = QueryDecoder::new(trace, Config::default());
        assert_eq!(layered.sync_forward(), laned.sync_forward());
        let mut answers = 0;
        let mut toggles = 0;
        loop {
            let mut lane = if pairs == Pairs::Unread {
                TraceLane::open(&laned)
            } else {
                TraceLane::open_with_toggles(&laned)
            };
            loop {
                if let Some((off_at, on_at)) = lane.toggle_next() {
                    assert_eq!(layered.peek_tnt(), None);
                    if pairs == Pairs::Taken {
                        // The two events the layered path reports, passed over.
                        let (off, s) = layered.event().unwrap();
                        assert_eq!(off.kind, EventKind::Disabled { ip: off_at });
                        assert!(s.event_pending && !off.status_update);
                        let (on, s) = layered.event().unwrap();
                        let EventKind::Enabled { ip, .. } = on.kind else {
                            panic!("{on:?} after a disable");
                        };
                        assert!(!on.status_update);
                        assert_eq!(on_at, ip);
                        assert_eq!(lane.take_toggle(&mut laned), Some(ip));
                        assert_eq!(s, lane.status_after_cached_tnt(&laned));
                        assert_eq!(layered.offset(), lane.offset(&laned));
                        assert_eq!(layered.cached_tnt(), lane.cached_tnt(&laned));
                        toggles += 1;
                        continue;
                    }
                }
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
                return (answers, toggles);
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
        for pairs in [Pairs::Unread, Pairs::Closed, Pairs::Taken] {
            assert!(same_as_layered(&trace, pairs).0 > 20);
        }
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
            same_as_layered(&trace[..len], Pairs::Unread);
        }
    }

    /// Tracing off at a branch and on again elsewhere, in every way a lane
    /// may meet it: after TNT bits and TIPs, twice in a row, followed by
    /// a disable, with PADs between, and cut short.
    fn toggling() -> Vec<u8> {
        after_psb(&[
            tnt(0b101, 3),
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Update32,
                raw: 0x7fff_1000,
            }),
            Packet::Pad,
            Packet::TipPge(IpPayload {
                compression: IpCompression::Update32,
                raw: 0x0040_2000,
            }),
            tnt(0b1, 1),
            tip(IpCompression::Update16, 0x3000),
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Sext48,
                raw: 0x7fff_2000_0000,
            }),
            Packet::TipPge(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x4000,
            }),
            // Enabled and disabled again before any TNT bit.
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x1234,
            }),
            Packet::Pad,
            Packet::Pad,
            Packet::TipPge(IpPayload {
                compression: IpCompression::Full,
                raw: 0x40_5000,
            }),
            tnt(0b10, 2),
            // A disable with no enable after it: the layered path's.
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x6000,
            }),
            Packet::Mtc(1),
            Packet::TipPge(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x7000,
            }),
            tnt(0b1, 1),
            // A suppressed enable: not a pair.
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x8000,
            }),
            Packet::TipPge(IpPayload::SUPPRESSED),
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x8000,
            }),
            Packet::TipPge(IpPayload {
                compression: IpCompression::Update16,
                raw: 0x9000,
            }),
            tnt(0b11, 2),
            Packet::TipPgd(IpPayload {
                compression: IpCompression::Update16,
                raw: 0xa000,
            }),
            Packet::TipPge(IpPayload {
                compression: IpCompression::Update16,
                raw: 0xb000,
            }),
        ])
        .finish()
    }

    #[test]
    fn disable_enable_pairs_are_the_layered_paths_events() {
        let trace = toggling();
        let (answers, toggles) = same_as_layered(&trace, Pairs::Taken);
        assert!(answers >= 8, "{answers} answers");
        assert_eq!(toggles, 4);
        for pairs in [Pairs::Unread, Pairs::Closed] {
            assert_eq!(same_as_layered(&trace, pairs).1, 0);
        }
        for len in 0..=trace.len() {
            for pairs in [Pairs::Closed, Pairs::Taken] {
                same_as_layered(&trace[..len], pairs);
            }
        }
    }
}
