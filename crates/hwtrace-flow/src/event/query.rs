//! [`QueryDecoder`]: what the instruction layer asks of the trace.

use super::decoder::{EventDecoder, PassState, StatusPass, passes_over};
use super::lane::LaneStart;
use super::tnt::TntCache;
use super::{Event, EventKind};
use crate::config::Config;
use crate::error::ErrorKind;
use crate::time::{ClockState, Time};
use hwtrace_packet::{LastIp, Tnt};
use hwtrace_types::TraceOffset;

/// Flags returned with each answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// An event is waiting; fetch it with [`QueryDecoder::event`].
    pub event_pending: bool,
    /// No IP: tracing is disabled, or the TIP suppressed it.
    pub ip_suppressed: bool,
    /// The trace has ended.
    pub eos: bool,
}

/// Answers "was this conditional branch taken?", "where did this
/// indirect branch go?" and "what happened next?".
///
/// TNT bits are handed out before any later event is reported, so the
/// instruction layer walks to the right place first.
#[derive(Clone, Debug)]
pub struct QueryDecoder<'a> {
    evdec: EventDecoder<'a>,
    /// The next event, or the error that ended the event stream; stale
    /// while `next_tnt` holds the next one.
    event: Result<Event, ErrorKind>,
    /// The next event when it is a TNT packet's, kept as its bits: runs of
    /// TNT packets reach the cache without an [`Event`] built for each
    /// ([`EventDecoder::next_tnt`]); [`Self::pending`] builds the event
    /// only when someone asks for it as an event.
    next_tnt: Option<Tnt>,
    tnt: TntCache,
    /// The time at the last event, TIP or TNT handed out.
    last_time: Time,
    /// Where the caller of the next [`event`](Self::event) stands, if it
    /// lets it pass over status updates ([`set_passing`](Self::set_passing)).
    passing: Option<PassState>,
    /// The PSB+ passed over between the last event handed out and
    /// `event`.
    ahead: StatusPass,
    /// Those between the event last handed out and the one before it
    /// ([`take_passed`](Self::take_passed)).
    handed: StatusPass,
}

/// The TNT bits a decode holds for the branches to come: those cached
/// (the next one highest, and how many) and a TNT packet read ahead but
/// not loaded yet. Two decodes that meet at one trace offset with the same
/// IP hold the same ones unless they used a packet's bits differently
/// (one of them started at a PSB after bits the other still held): a
/// parallel decode compares them at its seams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TntState {
    cached: (u64, u8),
    next: Option<Tnt>,
}

const fn is_user_event(ev: &Event) -> bool {
    !matches!(ev.kind, EventKind::Tnt { .. } | EventKind::Tip { .. })
}

impl<'a> QueryDecoder<'a> {
    /// A decoder over `trace`.
    pub fn new(trace: &'a [u8], config: Config) -> Self {
        Self {
            evdec: EventDecoder::new(trace, config),
            event: Err(ErrorKind::NoSync),
            next_tnt: None,
            tnt: TntCache::new(),
            last_time: Time::new(),
            passing: None,
            ahead: StatusPass::default(),
            handed: StatusPass::default(),
        }
    }

    /// The configuration.
    pub const fn config(&self) -> &Config {
        self.evdec.config()
    }

    /// The offset of the packet being processed.
    pub fn offset(&self) -> TraceOffset {
        self.evdec.offset()
    }

    /// The offset of the last PSB synchronised to.
    pub fn sync_offset(&self) -> Option<TraceOffset> {
        self.evdec.sync_offset()
    }

    /// The time at the last answer.
    pub const fn time(&self) -> &Time {
        &self.last_time
    }

    /// The last IP, the reference of the compressed IPs to come.
    pub fn last_ip(&self) -> LastIp {
        self.evdec.last_ip()
    }

    /// Whether the event decoder holds no event for later
    /// ([`EventDecoder::nothing_pending`]).
    pub fn nothing_pending(&self) -> bool {
        self.evdec.nothing_pending()
    }

    /// The timing state that decides the times of the answers to come.
    pub fn clock_state(&self) -> ClockState {
        ClockState {
            time: *self.evdec.time(),
            cal: self.evdec.calibration().map(|c| c.settled()),
            answered: self.last_time,
        }
    }

    fn reset(&mut self) {
        self.event = Err(ErrorKind::NoSync);
        self.next_tnt = None;
        self.tnt.clear();
        self.last_time = Time::new();
        self.ahead = StatusPass::default();
        self.handed = StatusPass::default();
    }

    #[inline]
    fn status(&self) -> Status {
        if !self.tnt.is_empty() {
            return Status::default();
        }
        self.status_beyond_tnt()
    }

    /// The status once the cached TNT bits are used up.
    #[inline]
    fn status_beyond_tnt(&self) -> Status {
        let mut s = Status::default();
        // A TNT event is neither a user event nor the end.
        if self.next_tnt.is_none() {
            match &self.event {
                Err(ErrorKind::Eos) => s.eos = true,
                // A trace error is reported as soon as the caller asks for
                // the next event, before any further instruction.
                Err(_) => s.event_pending = true,
                Ok(ev) => s.event_pending = is_user_event(ev),
            }
        }
        s
    }

    fn fetch_event(&mut self) {
        self.next_tnt = self.evdec.next_tnt();
        if self.next_tnt.is_none() {
            self.event = self.evdec.next_event();
        }
    }

    /// The next event, built now if it is a TNT packet's.
    fn pending(&mut self) -> Result<Event, ErrorKind> {
        if let Some(t) = self.next_tnt.take() {
            self.event = Ok(self.evdec.tnt_event(t));
        }
        self.event
    }

    /// Synchronises at the next PSB; returns the IP tracing starts at (if
    /// enabled) and the status.
    pub fn sync_forward(&mut self) -> Result<(Option<u64>, Status), ErrorKind> {
        self.reset();
        self.evdec.sync_forward()?;
        self.start()
    }

    /// Makes the next [`sync_set`](Self::sync_set) warm its clock over the
    /// packets up to `window` bytes before its PSB
    /// ([`EventDecoder::warm_clock`]).
    pub fn warm_clock(&mut self, window: u64) {
        self.evdec.warm_clock(window);
    }

    /// Synchronises at the PSB at `offset`.
    pub fn sync_set(&mut self, offset: TraceOffset) -> Result<(Option<u64>, Status), ErrorKind> {
        self.reset();
        self.evdec.sync_set(offset)?;
        self.start()
    }

    fn start(&mut self) -> Result<(Option<u64>, Status), ErrorKind> {
        let ip = match self.evdec.psb_enables_at() {
            Some(ip) => ip,
            None => self.peek_start_ip()?,
        };
        self.fetch_event();
        let mut status = self.status();
        status.ip_suppressed = ip.is_none();
        Ok((ip, status))
    }

    /// The IP tracing starts at after the PSB+ just read, peeked at on a
    /// copy of the event decoder (the real one hands the PSB+ status
    /// events out again as events): the first enable among them, or
    /// right after them (a PSB+ may follow at once).
    #[cold]
    fn peek_start_ip(&self) -> Result<Option<u64>, ErrorKind> {
        let mut peek = self.evdec.clone();
        let mut ip = None;
        loop {
            if peek.position() != self.evdec.position() {
                break;
            }
            let ev = match peek.next_event() {
                Ok(ev) => ev,
                Err(ErrorKind::Eos) => break,
                Err(e) => return Err(e),
            };
            if !ev.status_update {
                break;
            }
            if let EventKind::Enabled { ip: at, .. } = ev.kind {
                if !ev.ip_suppressed {
                    ip = Some(at);
                }
                break;
            }
        }
        Ok(ip)
    }

    /// The next TNT bit: whether the branch was taken.
    pub fn cond_branch(&mut self) -> Result<(bool, Status), ErrorKind> {
        if let Some(taken) = self.tnt.take() {
            return Ok((taken, self.status()));
        }
        self.last_time = *self.evdec.time();
        self.cache_tnt()?;
        match self.tnt.take() {
            Some(taken) => Ok((taken, self.status())),
            None => match self.pending() {
                Err(e) => Err(e),
                Ok(_) => Err(ErrorKind::BadQuery),
            },
        }
    }

    /// The next TNT bit if one is already cached, without using it: the
    /// block decoder's fast path, which needs no packet decoded.
    #[inline]
    pub const fn peek_cached_tnt(&self) -> Option<bool> {
        self.tnt.peek()
    }

    /// The TNT bit the next conditional branch would get, without using
    /// it: the cached one, or with none cached the first of the TNT packet
    /// that comes next. `None` when there is neither (the branch needs
    /// [`cond_branch`](Self::cond_branch), which reports why).
    ///
    /// Looking is free of side effects, so the block decoder's burst can
    /// decide whether to run a block before anything moves.
    #[inline]
    pub fn peek_tnt(&self) -> Option<bool> {
        if let Some(taken) = self.tnt.peek() {
            return Some(taken);
        }
        let (bits, len) = match (&self.next_tnt, &self.event) {
            (Some(t), _) => (t.bits, t.len),
            (
                None,
                Ok(Event {
                    kind: EventKind::Tnt { bits, size },
                    ..
                }),
            ) => (*bits, *size),
            _ => return None,
        };
        let len = len.min(64);
        if len == 0 {
            return None;
        }
        Some((bits >> (len - 1)) & 1 != 0)
    }

    /// Uses the bit [`peek_tnt`](Self::peek_tnt) showed (call it only
    /// after that said `Some`): with no bit cached the next TNT packet is
    /// loaded first, as [`refill_cached_tnt`](Self::refill_cached_tnt)
    /// does; the status is what [`cond_branch`](Self::cond_branch) would
    /// have returned with the bit.
    #[inline]
    pub fn take_tnt(&mut self) -> Status {
        if self.tnt.is_empty() {
            self.last_time = *self.evdec.time();
            self.load_next_tnt();
        }
        self.take_cached_tnt()
    }

    /// The next TNT bit, used, with the status
    /// [`cond_branch`](Self::cond_branch) would return with it: the cached
    /// bit, or with none cached the first of the TNT packet that comes
    /// next (loaded as [`refill_cached_tnt`](Self::refill_cached_tnt)
    /// does). `None`, with nothing changed, when there is no such bit, or
    /// when it is a not-taken bit and `taken_only` (a compressed return
    /// must find a taken one).
    #[inline(always)]
    pub fn next_tnt_bit(&mut self, taken_only: bool) -> Option<(bool, Status)> {
        let Some(taken) = self.tnt.peek() else {
            return self.next_packet_bit(taken_only);
        };
        if taken_only && !taken {
            return None;
        }
        self.tnt.take();
        let status = if self.tnt.is_empty() {
            self.status()
        } else {
            Status::default()
        };
        Some((taken, status))
    }

    /// [`next_tnt_bit`](Self::next_tnt_bit) with no bit cached: the first
    /// of the next TNT packet's (once per packet, so out of line).
    #[inline(never)]
    fn next_packet_bit(&mut self, taken_only: bool) -> Option<(bool, Status)> {
        let taken = self.peek_tnt()?;
        if taken_only && !taken {
            return None;
        }
        Some((taken, self.take_tnt()))
    }

    /// The TNT bits this decode holds for the branches to come
    /// ([`TntState`]).
    pub fn tnt_state(&self) -> TntState {
        TntState {
            cached: self.tnt.pending(),
            next: self.next_tnt,
        }
    }

    /// The TNT bits cached and how many ([`TntCache::pending`]).
    #[inline]
    pub const fn cached_tnt(&self) -> (u64, u8) {
        self.tnt.pending()
    }

    /// The status [`cond_branch`](Self::cond_branch) would return with the
    /// last cached TNT bit: what follows the cached bits, looked at
    /// without using any.
    #[inline]
    pub fn status_after_cached_tnt(&self) -> Status {
        self.status_beyond_tnt()
    }

    /// Uses up every cached TNT bit at once (a caller that knows where
    /// they lead); the status is
    /// [`status_after_cached_tnt`](Self::status_after_cached_tnt).
    #[inline]
    pub fn drop_cached_tnt(&mut self) -> Status {
        self.tnt.clear();
        self.status()
    }

    /// Uses up the next `n` cached TNT bits at once, fewer than are
    /// cached (a caller that knows where they lead; with bits still
    /// cached, nothing can be pending).
    #[inline]
    pub fn drop_tnt_bits(&mut self, n: u8) {
        debug_assert!(n < self.tnt.pending().1, "dropping every cached bit");
        self.tnt.skip(n);
    }

    /// With no TNT bit cached and a TNT packet (with bits) next: loads
    /// it, exactly as [`take_tnt`](Self::take_tnt) does before using its
    /// first bit, and says `true`. Otherwise nothing changes. For a caller
    /// that will use the first bit right after (the decoder's bursts, to
    /// see the whole packet's bits first).
    #[inline]
    pub fn load_next_tnt_packet(&mut self) -> bool {
        if !self.tnt.is_empty() || self.peek_tnt().is_none() {
            return false;
        }
        self.last_time = *self.evdec.time();
        self.load_next_tnt();
        true
    }

    /// Uses up the cached TNT bit [`peek_cached_tnt`](Self::peek_cached_tnt)
    /// showed; the status is what [`cond_branch`](Self::cond_branch) would
    /// have returned with it.
    #[inline]
    pub fn take_cached_tnt(&mut self) -> Status {
        self.tnt.take();
        if self.tnt.is_empty() {
            self.status()
        } else {
            Status::default()
        }
    }

    /// With no TNT bit cached and the next event a TNT packet's, caches
    /// its bits as [`cond_branch`](Self::cond_branch) would before using
    /// the first: the block decoder's fast path then goes on without a
    /// query. Does nothing otherwise (an empty TNT, too, is left to
    /// `cond_branch`, which reports it).
    #[inline]
    pub fn refill_cached_tnt(&mut self) {
        if !self.tnt.is_empty() {
            return;
        }
        let len = match (&self.next_tnt, &self.event) {
            (Some(t), _) => t.len,
            (
                None,
                Ok(Event {
                    kind: EventKind::Tnt { size, .. },
                    ..
                }),
            ) => *size,
            _ => return,
        };
        if len > 0 {
            self.last_time = *self.evdec.time();
            self.load_next_tnt();
        }
    }

    /// The target of an indirect branch when no TNT bit is cached and the
    /// next event is a TIP with an IP: what
    /// [`indirect_branch`](Self::indirect_branch) returns then, for the
    /// block decoder's fast path. `None` (nothing done) otherwise.
    #[inline]
    pub fn take_tip(&mut self) -> Option<(u64, Status)> {
        if !self.tnt.is_empty() || self.next_tnt.is_some() {
            return None;
        }
        let Ok(Event {
            kind: EventKind::Tip { ip },
            ip_suppressed: false,
            ..
        }) = self.event
        else {
            return None;
        };
        self.last_time = *self.evdec.time();
        self.fetch_event();
        Some((ip, self.status()))
    }

    /// If the next event is a TNT packet's: its bits into the cache, and
    /// the event after it fetched.
    fn load_next_tnt(&mut self) {
        if let Some(t) = self.next_tnt.take() {
            self.tnt.load(&t);
            self.fetch_event();
        } else if let Ok(Event {
            kind: EventKind::Tnt { bits, size },
            ..
        }) = self.event
        {
            self.tnt.load(&Tnt {
                bits,
                len: size,
                long: size > Tnt::MAX_SHORT,
            });
            self.fetch_event();
        }
    }

    fn cache_tnt(&mut self) -> Result<(), ErrorKind> {
        if self.next_tnt.is_none() {
            self.event?;
        }
        self.load_next_tnt();
        Ok(())
    }

    /// The target of an indirect branch (`None` if suppressed).
    pub fn indirect_branch(&mut self) -> Result<(Option<u64>, Status), ErrorKind> {
        let mut ev = self.pending()?;
        if !matches!(ev.kind, EventKind::Tip { .. }) {
            self.cache_tnt()?;
            ev = self.pending()?;
            if !matches!(ev.kind, EventKind::Tip { .. }) {
                return Err(ErrorKind::BadQuery);
            }
        }
        let target = match ev.kind {
            EventKind::Tip { ip } if !ev.ip_suppressed => Some(ip),
            _ => None,
        };
        self.last_time = *self.evdec.time();
        self.fetch_event();
        let mut status = self.status();
        status.ip_suppressed = target.is_none();
        Ok((target, status))
    }

    /// The next event of any kind (TNT and TIP included), dropping any
    /// TNT bits left: for resynchronising after an error.
    pub fn next_any(&mut self) -> Result<(Event, Status), ErrorKind> {
        self.tnt.clear();
        let ev = self.pending()?;
        self.last_time = *self.evdec.time();
        self.fetch_event();
        Ok((ev, self.status()))
    }

    /// Where a [`TraceLane`](super::TraceLane) opened here starts: the
    /// trace, the last IP, and the look-ahead when it is a TNT packet or a
    /// TIP with an IP and nothing else can happen (tracing enabled, no
    /// event queued or deferred, no PEBS block open).
    pub(super) fn lane_start(&self) -> (&'a [u8], LastIp, Option<LaneStart>) {
        let (data, last_ip) = (self.evdec.data(), self.evdec.last_ip());
        if !self.evdec.lane_ready() {
            return (data, last_ip, None);
        }
        let start = match (&self.next_tnt, &self.event) {
            (Some(t), _) => Some(LaneStart::Tnt(*t, self.evdec.offset())),
            (
                None,
                Ok(Event {
                    kind: EventKind::Tnt { bits, size },
                    ..
                }),
            ) => Some(LaneStart::Tnt(
                Tnt {
                    bits: *bits,
                    len: *size,
                    long: *size > Tnt::MAX_SHORT,
                },
                self.evdec.offset(),
            )),
            (
                None,
                Ok(Event {
                    kind: EventKind::Tip { .. },
                    ip_suppressed: false,
                    ..
                }),
            ) => self
                .evdec
                .tip_at()
                .map(|(at, size)| LaneStart::Tip(at, size)),
            _ => None,
        };
        (data, last_ip, start)
    }

    /// Where a lane hands the trace back: the event decoder goes on at
    /// `at` with `last_ip`, the TNT cache holds `bits` (`left` of them),
    /// and the look-ahead is fetched as after any answer.
    pub(super) fn lane_resume(&mut self, at: TraceOffset, last_ip: LastIp, bits: u64, left: u8) {
        self.set_cached_tnt(bits, left);
        self.last_time = *self.evdec.time();
        self.next_tnt = None;
        self.event = Err(ErrorKind::NoSync);
        self.evdec.lane_resume(at, last_ip);
        self.fetch_event();
    }

    /// Sets the TNT cache (a lane's bits left).
    pub(super) fn set_cached_tnt(&mut self, bits: u64, left: u8) {
        self.tnt.load(&Tnt {
            bits,
            len: left,
            long: left > Tnt::MAX_SHORT,
        });
    }

    /// The pending event.
    pub fn event(&mut self) -> Result<(Event, Status), ErrorKind> {
        if !self.tnt.is_empty() {
            return Err(ErrorKind::BadQuery);
        }
        if let Some(ahead) = self.ahead.take() {
            self.handed = ahead;
        }
        let ev = self.pending()?;
        if !is_user_event(&ev) {
            return Err(ErrorKind::BadQuery);
        }
        self.last_time = *self.evdec.time();
        if let Some(at) = self.passing
            && passes_over(&ev, &at)
        {
            self.evdec.pass_status(&mut self.ahead, &at);
        }
        self.fetch_event();
        Ok((ev, self.status()))
    }

    /// Lets [`event`](Self::event), when the event it hands out is a
    /// status update a caller standing at `at` passes over
    /// ([`passes_over`]), also pass over the status updates that come
    /// right after it: the rest of its PSB+'s, and with tracing off the
    /// plain PSB+ that follow ([`EventDecoder::pass_status`]). Their
    /// events are then never handed out, and
    /// [`take_passed`](Self::take_passed) says what they were as the
    /// event after them is handed out. Only for a caller that will take
    /// the event handed out, still standing at `at` (its mode may be set
    /// where it had none), and then ask for the next one.
    pub(crate) fn set_passing(&mut self, at: Option<PassState>) {
        self.passing = at;
    }

    /// The PSB+ passed over right before the event
    /// [`event`](Self::event) last handed out (or before the error it
    /// returned), to be applied before that event.
    pub(crate) fn take_passed(&mut self) -> Option<StatusPass> {
        self.handed.take()
    }

    /// The PSB+ passed over after the event [`event`](Self::event) last
    /// handed out, when no event is to be handed out after them (the
    /// trace ends there): the caller applies them after that event.
    pub(crate) fn take_ahead(&mut self) -> Option<StatusPass> {
        self.ahead.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_packet::{IpCompression, IpPayload, ModeExec, Packet, TraceBuilder};

    const IP: u64 = 0x7fff_f785_08e0;

    /// PSB+ headers a decode may start at, and what follows them.
    fn starts() -> Vec<(&'static str, Vec<Packet>)> {
        let exec = Packet::ModeExec(ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        });
        let fup = |p: IpPayload| Packet::Fup(p);
        let psb = |inner: &[Packet]| {
            let mut v = vec![Packet::Psb];
            v.extend_from_slice(inner);
            v.push(Packet::Psbend);
            v
        };
        let on = psb(&[exec, fup(IpPayload::full(IP)), Packet::Cbr(0x28)]);
        let off = psb(&[Packet::Cbr(0x28)]);
        let update16 = IpPayload {
            compression: IpCompression::Update16,
            raw: IP & 0xffff,
        };
        vec![
            ("tracing on", on.clone()),
            (
                "tracing on, a TNT after",
                [
                    &on[..],
                    &[Packet::Tnt(hwtrace_packet::Tnt {
                        bits: 1,
                        len: 1,
                        long: false,
                    })],
                ]
                .concat(),
            ),
            ("tracing on, no IP to update", psb(&[exec, fup(update16)])),
            ("tracing off", off.clone()),
            (
                "tracing off, an enable after",
                [&off[..], &[exec, Packet::TipPge(IpPayload::full(IP))]].concat(),
            ),
            (
                "tracing off, tracing on after",
                [&off[..], &on[..]].concat(),
            ),
            (
                "tracing off, then a bad packet",
                [&off[..], &[Packet::Tip(update16)]].concat(),
            ),
            ("an overflow in it", psb(&[Packet::Ovf])),
            (
                "tracing on, an overflow in it",
                psb(&[fup(IpPayload::full(IP)), Packet::Ovf]),
            ),
        ]
    }

    #[test]
    fn the_start_ip_read_off_the_queue_is_the_one_peeked_at() {
        let mut fast = 0;
        for (name, packets) in starts() {
            let mut t = TraceBuilder::new();
            for p in packets {
                t.push(p).unwrap();
            }
            let data = t.finish();
            let mut q = QueryDecoder::new(&data, Config::default());
            q.reset();
            if q.evdec.sync_forward().is_err() {
                continue;
            }
            let peeked = q.peek_start_ip();
            if let Some(ip) = q.evdec.psb_enables_at() {
                fast += 1;
                assert_eq!(Ok(ip), peeked, "{name}");
            }
            // The decode starts where the peek says, whichever way it
            // learns it.
            let mut d = QueryDecoder::new(&data, Config::default());
            assert_eq!(d.sync_forward().map(|(ip, _)| ip), peeked, "{name}");
        }
        // The three that enable at PSBEND take the queue's word.
        assert_eq!(fast, 3);
    }
}
