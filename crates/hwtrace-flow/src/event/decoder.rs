//! [`EventDecoder`]: packets to events.

use super::queue::{Binding, EventQueue};
use super::quirks;
use super::{Event, EventKind};
use crate::config::Config;
use crate::error::ErrorKind;
use crate::time::{Time, TimeCal, TimeError};
use hwtrace_packet::{DecodedPacket, IpPayload, LastIp, LastIpError, Packet, PacketDecoder, Tnt};
use hwtrace_types::{TraceOffset, Tsc};

mod filtered_psb;
mod overflow;
mod warm;

pub(crate) use filtered_psb::passes_over;
pub use filtered_psb::{PassState, StatusPass, passable_status};

/// What a packet handler did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// An event is ready in `self.event`.
    Event,
    /// The packet is done and produced no event; fetch the next one.
    More,
}

pub(super) use Step as StepOut;
type Res = Result<Step, ErrorKind>;

/// Timing state that moves together (saved and restored around
/// look-ahead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Clock {
    time: Time,
    tcal: TimeCal,
    /// A CYC packet was applied since the last reset: `tcal` can decide
    /// times from now on ([`ClockState::cal`](crate::time::ClockState::cal)).
    cyc_seen: bool,
}

/// Ignores the configuration errors libipt ignores while tracking time.
fn timing(r: Result<(), TimeError>) -> Result<(), ErrorKind> {
    match r {
        Ok(()) | Err(TimeError::BadConfig) | Err(TimeError::NoCalibration) => Ok(()),
        Err(TimeError::BadContext) => Err(ErrorKind::BadContext),
        Err(TimeError::BadPacket) => Err(ErrorKind::BadPacket),
        Err(TimeError::NoTime) => Err(ErrorKind::NoTime),
        Err(TimeError::NoCbr) => Err(ErrorKind::NoCbr),
        Err(_) => Err(ErrorKind::Internal),
    }
}

impl Clock {
    fn tsc(&mut self, tsc: u64, header: bool, cfg: &Config) -> Result<(), ErrorKind> {
        if header {
            timing(self.tcal.header_tsc(tsc))?;
        } else {
            self.tcal.update_tsc(tsc);
        }
        let _ = cfg;
        self.time.update_tsc(Tsc(tsc));
        Ok(())
    }

    fn cbr(&mut self, ratio: u8, header: bool, cfg: &Config) -> Result<(), ErrorKind> {
        if header {
            timing(self.tcal.header_cbr(ratio, &cfg.time))?;
        } else {
            timing(self.tcal.update_cbr(ratio, &cfg.time))?;
        }
        timing(self.time.update_cbr(ratio))
    }

    fn tma(&mut self, ctc: u16, fc: u16, cfg: &Config) -> Result<(), ErrorKind> {
        timing(self.time.update_tma(ctc, fc, &cfg.time))
    }

    fn mtc(&mut self, ctc: u8, cfg: &Config) -> Result<(), ErrorKind> {
        timing(self.tcal.update_mtc(ctc, &cfg.time))?;
        timing(self.time.update_mtc(ctc, &cfg.time))
    }

    fn cyc(&mut self, cycles: u64, cfg: &Config) -> Result<(), ErrorKind> {
        self.cyc_seen = true;
        let fcr = self.tcal.fcr().ok();
        self.tcal.update_cyc(cycles);
        timing(self.time.update_cyc(cycles, &cfg.time, fcr))
    }

    /// Applies one timing packet; `false` if it is no timing packet.
    fn apply(&mut self, p: &Packet, cfg: &Config) -> Result<bool, ErrorKind> {
        match *p {
            Packet::Tsc(t) => self.tsc(t, false, cfg)?,
            Packet::Cbr(r) => self.cbr(r, false, cfg)?,
            Packet::Tma(t) => self.tma(t.ctc, t.fc, cfg)?,
            Packet::Mtc(m) => self.mtc(m, cfg)?,
            Packet::Cyc(c) => self.cyc(c, cfg)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn stamp(&self, ev: &mut Event) {
        let est = self.time.estimate();
        ev.tsc = est.tsc.0;
        ev.lost_mtc = est.lost_mtc;
        ev.lost_cyc = est.lost_cyc;
        ev.has_tsc = self.time.query_tsc().is_ok();
    }
}

/// Decodes packets into [`Event`]s.
///
/// Call [`sync_forward`](Self::sync_forward) first, then
/// [`next_event`](Self::next_event) until it reports [`ErrorKind::Eos`]. After an
/// error, `sync_forward` resumes at the next PSB.
#[derive(Clone, Debug)]
pub struct EventDecoder<'a> {
    pkt: PacketDecoder<'a>,
    /// The packet being processed; `None` when fetching failed.
    packet: Option<DecodedPacket>,
    /// The error fetching the current packet, or `NoSync` before sync.
    status: Result<(), ErrorKind>,
    event: Option<Event>,
    /// Tracing is enabled (PacketEn).
    enabled: bool,
    /// The current packet already produced its bound events.
    bound: bool,
    ip: LastIp,
    clock: Clock,
    evq: EventQueue,
    /// C-state entries to report after the FUP-bound MWAIT/EXSTOP.
    after_fup: std::collections::VecDeque<Event>,
    /// Events to report before the next packet.
    deferred: std::collections::VecDeque<Event>,
    /// Event data (EVD) waiting for its CFE.
    evd: super::trace::EventData,
    config: Config,
    /// How far back the next [`sync_set`](Self::sync_set) warms its clock
    /// from ([`warm_clock`](Self::warm_clock)).
    warm: Option<u64>,
    /// The last PSB+ passed over from the bytes, to pass its twins at once
    /// (a cache: it changes nothing the decoder does).
    plain_memo: filtered_psb::PlainMemo,
}

fn last_ip_error(e: LastIpError) -> ErrorKind {
    match e {
        LastIpError::NoIp => ErrorKind::NoIp,
        LastIpError::Suppressed => ErrorKind::IpSuppressed,
    }
}

impl<'a> EventDecoder<'a> {
    /// A decoder over `trace`, not yet synchronised.
    pub fn new(trace: &'a [u8], config: Config) -> Self {
        Self {
            pkt: PacketDecoder::new(trace),
            packet: None,
            status: Err(ErrorKind::NoSync),
            event: None,
            enabled: false,
            bound: false,
            ip: LastIp::new(),
            clock: Clock::default(),
            evq: EventQueue::new(),
            evd: super::trace::EventData::default(),
            deferred: std::collections::VecDeque::new(),
            after_fup: std::collections::VecDeque::new(),
            config,
            warm: None,
            plain_memo: filtered_psb::PlainMemo::default(),
        }
    }

    /// Makes the next [`sync_set`](Self::sync_set) start with the clock
    /// the packets before its PSB leave, from the first PSB at most
    /// `window` bytes back (see the `warm` module), instead of a fresh
    /// one: what a decode from further back would have learned of the CYC
    /// calibration there.
    pub fn warm_clock(&mut self, window: u64) {
        self.warm = Some(window);
    }

    /// The configuration.
    pub const fn config(&self) -> &Config {
        &self.config
    }

    /// Whether no event waits to be handed out later: none queued for the
    /// FUP, TIP, PSBEND or EXSTOP it binds to, no C-state entry waiting
    /// for its MWAIT's FUP, none deferred, no event data waiting for its
    /// CFE. A parallel decode only splices where this holds
    /// ([`StepSource::seam_ready`](crate::parallel::StepSource::seam_ready)):
    /// what waits here decides events to come, and seams do not compare it.
    pub fn nothing_pending(&self) -> bool {
        self.evq.all_empty()
            && self.after_fup.is_empty()
            && self.deferred.is_empty()
            && self.evd.is_empty()
    }

    /// The current time estimate.
    pub fn time(&self) -> &Time {
        &self.clock.time
    }

    /// The fast-counter calibration, once a CYC packet was seen (before,
    /// it decides no time: [`ClockState::cal`](crate::time::ClockState::cal)).
    pub fn calibration(&self) -> Option<TimeCal> {
        self.clock.cyc_seen.then_some(self.clock.tcal)
    }

    fn reset(&mut self) {
        self.packet = None;
        self.status = Err(ErrorKind::NoSync);
        self.event = None;
        self.enabled = false;
        self.bound = false;
        self.ip.reset();
        self.clock = Clock::default();
        self.evq.clear();
        self.evd = super::trace::EventData::default();
        self.deferred.clear();
        self.after_fup.clear();
    }

    /// The offset of the packet being processed.
    pub fn offset(&self) -> TraceOffset {
        match self.packet {
            Some(p) => p.offset,
            None => self.pkt.offset(),
        }
    }

    /// The position of the packet decoder (after the current packet).
    pub fn position(&self) -> TraceOffset {
        self.pkt.offset()
    }

    /// The offset of the last PSB synchronised to.
    pub fn sync_offset(&self) -> Option<TraceOffset> {
        self.pkt.sync_offset()
    }

    /// The trace bytes.
    pub(super) const fn data(&self) -> &'a [u8] {
        self.pkt.data()
    }

    /// The last IP (IP compression's state: the reference of the
    /// compressed IPs to come).
    pub const fn last_ip(&self) -> LastIp {
        self.ip
    }

    /// Whether a [`TraceLane`](super::TraceLane) may read on from here:
    /// TNT, TIP and PAD packets would do nothing but hand out their
    /// answers (tracing enabled, nothing queued, deferred or waiting for a
    /// FUP or CFE, no PEBS block open), and the packet after the
    /// look-ahead was read. After an error reading it (or the end of the
    /// trace) the offset is the packet decoder's, past the bytes it could
    /// not read: a lane reading on from there would pass over the error
    /// the layered path reports, and read packets the layered path never
    /// gets to (the fuzzer found both: testdata/fuzz/fast_decode/).
    pub(super) fn lane_ready(&self) -> bool {
        self.packet.is_some()
            && self.enabled
            && self.evq.is_empty(Binding::Tip)
            && self.evq.is_empty(Binding::Fup)
            && self.evq.is_empty(Binding::Psbend)
            && self.evq.is_empty(Binding::Exstop)
            && self.deferred.is_empty()
            && self.after_fup.is_empty()
            && self.evd.is_empty()
            && self.pkt.at_top_level()
    }

    /// The offset and size of the packet being processed when it is a
    /// TIP.
    pub(super) fn tip_at(&self) -> Option<(TraceOffset, u8)> {
        match self.packet {
            Some(DecodedPacket {
                offset,
                size,
                packet: Packet::Tip(_),
            }) => Some((offset, size)),
            _ => None,
        }
    }

    /// Goes on at `at` with `last_ip`, where a lane handed the trace back:
    /// the packet there is the one being processed, as after the answer
    /// before it.
    pub(super) fn lane_resume(&mut self, at: TraceOffset, last_ip: LastIp) {
        self.ip = last_ip;
        self.bound = false;
        self.packet = None;
        match self.pkt.move_to(at) {
            Ok(()) => {
                self.status = Ok(());
                self.fetch_packet();
            }
            Err(_) => self.status = Err(ErrorKind::Internal),
        }
    }

    /// Moves to the next PSB and reads its PSB+ header.
    pub fn sync_forward(&mut self) -> Result<(), ErrorKind> {
        // Search from the packet being processed, not from where look-ahead
        // left the packet decoder, but never return to the PSB we are
        // synchronised at.
        let from = usize::try_from(self.offset().0).unwrap_or(usize::MAX);
        let last = self.pkt.sync_offset();
        self.reset();
        let found = hwtrace_packet::find_psb_forward(self.pkt.data(), from)
            .map(|at| TraceOffset(at as u64))
            .filter(|at| last.is_none_or(|l| *at > l));
        match found {
            Some(at) => self.pkt.sync_at(at).map_err(|e| ErrorKind::from(e.kind))?,
            None => {
                self.pkt
                    .sync_forward()
                    .map_err(|e| ErrorKind::from(e.kind))?;
            }
        }
        self.start()
    }

    /// Synchronises at `offset`, which must hold a PSB.
    pub fn sync_set(&mut self, offset: TraceOffset) -> Result<(), ErrorKind> {
        self.reset();
        if let Some(window) = self.warm.take() {
            let back = usize::try_from(offset.0.saturating_sub(window)).unwrap_or(usize::MAX);
            if let Some(from) = hwtrace_packet::find_psb_forward(self.pkt.data(), back)
                .map(|at| TraceOffset(at as u64))
                .filter(|&from| from < offset)
            {
                self.clock = Clock::warmed(self.pkt.data(), from, offset, &self.config);
            }
        }
        self.pkt
            .sync_at(offset)
            .map_err(|e| ErrorKind::from(e.kind))?;
        self.start()
    }

    fn start(&mut self) -> Result<(), ErrorKind> {
        self.status = Ok(());
        self.fetch_packet();
        match self.packet.map(|p| p.packet) {
            Some(Packet::Psb) => self.decode_psb().map(|_| ()),
            None => Err(self.status.err().unwrap_or(ErrorKind::Internal)),
            Some(_) => Err(ErrorKind::NoSync),
        }
    }

    #[inline]
    fn fetch_packet(&mut self) {
        loop {
            // Runs of PADs (alignment padding) are passed over at once.
            self.pkt.skip_pads();
            // Most packets (PAD, TNT, the IP packets, PSB+'s) are read the
            // same with or without libipt's quirks, which only look again
            // at CYC (first byte `xxxxxx11b`) and at TMA and PWRE (`02 73`,
            // `02 22`): the rest skip the out-of-line call.
            let data = self.pkt.data();
            let at = self.pkt.offset().0 as usize;
            let plain = match data.get(at) {
                Some(0x02) => !matches!(data.get(at + 1), Some(0x73 | 0x22)),
                Some(&b) => b & 3 != 3,
                None => false,
            };
            let next = if plain {
                self.pkt.next_packet()
            } else {
                super::quirks::next_packet(&mut self.pkt, &self.config.errata)
            };
            match next {
                Ok(Some(p)) if matches!(p.packet, Packet::Pad) => continue,
                Ok(Some(p)) => {
                    self.packet = Some(p);
                }
                Ok(None) => {
                    self.packet = None;
                    self.status = Err(ErrorKind::Eos);
                }
                Err(e) => {
                    self.packet = None;
                    self.status = Err(e.kind.into());
                }
            }
            return;
        }
    }

    /// [`fetch_packet`](Self::fetch_packet) right after a TNT packet: no
    /// PEBS block is open then (a TNT closes one, PADs keep the state), so
    /// a PAD or a TNT-8 is known from its byte (SDM vol. 3C, 33.4.2.1:
    /// `xxxxxxx0b` but `00000010b`, the stop bit above the branch bits)
    /// and only needs the packet decoder moved past it. Everything else
    /// goes the usual way.
    #[inline]
    fn fetch_after_tnt(&mut self) {
        loop {
            let pos = self.pkt.offset().0;
            let b = match self.pkt.data().get(pos as usize) {
                Some(&b) if b & 1 == 0 && b != 0x02 => b,
                _ => return self.fetch_packet(),
            };
            // The packet decoder reads the same one-byte packet (the
            // result is known, so only the move matters).
            if !matches!(self.pkt.next_packet(), Ok(Some(_))) {
                return self.fetch_packet();
            }
            if b == 0 {
                continue;
            }
            let payload = b >> 1;
            let len = 7 - payload.leading_zeros() as u8;
            self.packet = Some(DecodedPacket {
                offset: TraceOffset(pos),
                size: 1,
                packet: Packet::Tnt(Tnt {
                    bits: u64::from(payload) & ((1u64 << len) - 1),
                    len,
                    long: false,
                }),
            });
            return;
        }
    }

    /// Sets `self.event` to a fresh event of `kind`, time-stamped.
    fn standalone(&mut self, kind: EventKind) -> &mut Event {
        let mut ev = Event::new(kind);
        self.clock.stamp(&mut ev);
        self.event.insert(ev)
    }

    fn enqueue(&mut self, b: Binding, ev: Event) -> Result<(), ErrorKind> {
        if self.evq.push(b, ev) {
            Ok(())
        } else {
            Err(ErrorKind::NoMemory)
        }
    }

    /// Fills in the event's IP from the last IP, or marks it suppressed.
    fn event_ip(ip: &LastIp, ev: &mut Event) {
        match ip.ip() {
            Ok(v) => ev.set_ip(v),
            Err(_) => ev.ip_suppressed = true,
        }
    }

    fn update_ip(&mut self, payload: IpPayload) {
        self.ip.update(payload);
    }

    /// The next event.
    pub fn next_event(&mut self) -> Result<Event, ErrorKind> {
        loop {
            match self.decode_packet()? {
                Step::Event => break,
                Step::More => {
                    if self.event.is_some() {
                        return Err(ErrorKind::Internal);
                    }
                    self.bound = false;
                    self.fetch_packet();
                }
            }
        }
        self.event.take().ok_or(ErrorKind::Internal)
    }

    /// The bits of the TNT packet being processed, used up without
    /// building an [`Event`]: the query layer's fast path for runs of TNT
    /// packets. `None` when [`next_event`](Self::next_event) would do more
    /// than hand out a TNT event (an event deferred before it, tracing
    /// disabled, no TNT packet); the decoder is then unchanged.
    ///
    /// Afterwards the decoder is exactly where `next_event` would have
    /// left it, and [`tnt_event`](Self::tnt_event) builds the event it
    /// would have returned, as long as nothing else was decoded since.
    #[inline]
    pub fn next_tnt(&mut self) -> Option<Tnt> {
        if !self.enabled || !self.deferred.is_empty() {
            return None;
        }
        match self.packet {
            Some(DecodedPacket {
                packet: Packet::Tnt(t),
                ..
            }) => {
                self.fetch_after_tnt();
                Some(t)
            }
            _ => None,
        }
    }

    /// The event [`next_event`](Self::next_event) would have returned for
    /// the TNT packet [`next_tnt`](Self::next_tnt) just handed out: the
    /// clock has not moved since, so its time stamp is the same.
    pub fn tnt_event(&self, t: Tnt) -> Event {
        let mut ev = Event::new(EventKind::Tnt {
            bits: t.bits,
            size: t.len,
        });
        self.clock.stamp(&mut ev);
        ev
    }

    fn decode_packet(&mut self) -> Res {
        if let Some(mut ev) = self.deferred.pop_front() {
            self.clock.stamp(&mut ev);
            self.event = Some(ev);
            return Ok(Step::Event);
        }
        let Some(p) = self.packet else {
            return match self.status {
                Err(e) => Err(e),
                Ok(()) => Ok(Step::More),
            };
        };
        match p.packet {
            Packet::Pad | Packet::Bbp(_) | Packet::Bip { .. } | Packet::Bep { .. } => {
                Ok(Step::More)
            }
            Packet::Tnt(t) => {
                if !self.enabled {
                    return Err(ErrorKind::BadContext);
                }
                self.standalone(EventKind::Tnt {
                    bits: t.bits,
                    size: t.len,
                });
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Tsc(t) => self.clock.tsc(t, false, &self.config).map(|_| Step::More),
            Packet::Tma(t) => self
                .clock
                .tma(t.ctc, t.fc, &self.config)
                .map(|_| Step::More),
            Packet::Mtc(m) => self.clock.mtc(m, &self.config).map(|_| Step::More),
            Packet::Cyc(c) => self.clock.cyc(c, &self.config).map(|_| Step::More),
            Packet::Cbr(r) => {
                self.clock.cbr(r, false, &self.config)?;
                self.standalone(EventKind::Cbr { ratio: r });
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Fup(ip) => self.decode_fup(ip),
            Packet::Tip(ip) => self.decode_tip(ip),
            Packet::TipPge(ip) => self.decode_tip_pge(ip),
            Packet::TipPgd(ip) => self.decode_tip_pgd(ip),
            Packet::ModeExec(m) => {
                // MODE.Exec binds to the TIP of a far branch, or, reporting
                // an IF change with event trace, to the FUP that follows.
                let binding = self.mode_exec_binding();
                let ev = Event::new(EventKind::ExecMode {
                    mode: m.mode(),
                    ip: 0,
                });
                self.enqueue(binding, ev)?;
                if self.config.iflags_events {
                    let ev = Event::new(EventKind::Iflags {
                        iflag: m.iflag,
                        ip: 0,
                    });
                    self.enqueue(binding, ev)?;
                }
                Ok(Step::More)
            }
            Packet::ModeTsx(t) => {
                let kind = EventKind::Tsx {
                    speculative: t.intx,
                    aborted: t.abrt,
                    ip: 0,
                };
                if self.enabled {
                    self.enqueue(Binding::Fup, Event::new(kind))?;
                    return Ok(Step::More);
                }
                self.standalone(kind).ip_suppressed = true;
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Pip(pip) => {
                let async_branch = self
                    .evq
                    .find(Binding::Tip, |e| {
                        matches!(e.kind, EventKind::AsyncBranch { .. })
                    })
                    .is_some();
                if async_branch {
                    let ev = Event::new(EventKind::AsyncPaging {
                        cr3: pip.cr3.0,
                        non_root: pip.nr,
                        ip: 0,
                    });
                    self.enqueue(Binding::Tip, ev)?;
                    return Ok(Step::More);
                }
                self.standalone(EventKind::Paging {
                    cr3: pip.cr3.0,
                    non_root: pip.nr,
                });
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Vmcs(base) => self.decode_vmcs(base),
            Packet::Stop => {
                self.standalone(EventKind::Stop);
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Mnt(payload) => {
                self.standalone(EventKind::Mnt { payload });
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Ptw(ptw) => {
                let kind = EventKind::Ptwrite {
                    ip: 0,
                    size: if ptw.eight_bytes { 8 } else { 4 },
                    payload: ptw.payload,
                };
                if ptw.ip {
                    self.enqueue(Binding::Fup, Event::new(kind))?;
                    return Ok(Step::More);
                }
                self.standalone(kind).ip_suppressed = true;
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Exstop { ip } => self.decode_exstop(ip),
            Packet::Mwait(m) => {
                let ev = Event::new(EventKind::Mwait {
                    hints: m.hints,
                    ext: m.ext,
                    ip: 0,
                });
                self.enqueue(Binding::Exstop, ev)?;
                Ok(Step::More)
            }
            Packet::Pwre(p) => {
                let kind = EventKind::Pwre {
                    state: p.state(),
                    sub_state: p.sub_state(),
                    hw: p.hw(),
                };
                // A C-state entry right before an EXSTOP, or after an MWAIT
                // still waiting for its EXSTOP, is reported with them.
                let mwait_waiting = self
                    .evq
                    .find(Binding::Exstop, |e| {
                        matches!(e.kind, EventKind::Mwait { .. })
                    })
                    .is_some();
                if mwait_waiting || self.exstop_follows() {
                    self.enqueue(Binding::Exstop, Event::new(kind))?;
                    return Ok(Step::More);
                }
                self.standalone(kind);
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Pwrx(p) => {
                self.standalone(EventKind::Pwrx {
                    last: p.last(),
                    deepest: p.deepest(),
                    interrupt: p.interrupt(),
                    store: p.store(),
                    autonomous: p.autonomous(),
                });
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Trig(t) => {
                let kind = EventKind::Trig {
                    trbv: t.trbv,
                    mult: t.mult,
                    icnt: t.icnt.unwrap_or(0),
                    ip: 0,
                };
                if t.ip {
                    self.enqueue(Binding::Fup, Event::new(kind))?;
                    return Ok(Step::More);
                }
                self.standalone(kind).ip_suppressed = true;
                self.fetch_packet();
                Ok(Step::Event)
            }
            Packet::Cfe(_) | Packet::Evd(_) => super::trace::decode(self, p.packet),
            Packet::Psb => match self.decode_psb()? {
                Step::Event => Ok(Step::Event),
                Step::More => self.decode_packet(),
            },
            Packet::Psbend => self.decode_psbend(),
            Packet::Ovf => self.decode_ovf(),
        }
    }

    /// Whether an EXSTOP comes next (timing and padding aside).
    fn exstop_follows(&self) -> bool {
        let mut pkt = self.pkt.clone();
        loop {
            match super::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(Some(p)) => match p.packet {
                    Packet::Exstop { .. } => return true,
                    Packet::Pad
                    | Packet::Tsc(_)
                    | Packet::Tma(_)
                    | Packet::Mtc(_)
                    | Packet::Cyc(_)
                    | Packet::Cbr(_) => {}
                    _ => return false,
                },
                Ok(None) | Err(_) => return false,
            }
        }
    }

    /// Whether the MODE.Exec just read binds to a FUP (the next IP packet
    /// is one) or to a TIP.
    fn mode_exec_binding(&self) -> Binding {
        let mut pkt = self.pkt.clone();
        loop {
            match super::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(Some(p)) => match p.packet {
                    Packet::Fup(_) => return Binding::Fup,
                    Packet::Tip(_)
                    | Packet::TipPge(_)
                    | Packet::TipPgd(_)
                    | Packet::Psb
                    | Packet::Psbend
                    | Packet::Ovf => return Binding::Tip,
                    _ => {}
                },
                Ok(None) | Err(_) => return Binding::Tip,
            }
        }
    }

    /// Reads the PSB+ header; status events wait for PSBEND.
    fn decode_psb(&mut self) -> Res {
        // SKL168: the first MTC after a PSB may follow dropped CYCs.
        self.clock.tcal.update_psb(&self.config.time);
        if !self.evq.is_empty(Binding::Psbend)
            || !self.evq.is_empty(Binding::Tip)
            || !self.evq.is_empty(Binding::Fup)
        {
            return Err(ErrorKind::BadContext);
        }
        self.ip.reset();
        self.enabled = false;
        // The enabled/disabled status comes first; its kind is settled at
        // PSBEND.
        let mut status = Event::new(EventKind::Disabled { ip: 0 });
        status.status_update = true;
        self.enqueue(Binding::Psbend, status)?;
        let cfg = self.config;
        loop {
            self.fetch_packet();
            let Some(p) = self.packet else {
                return Err(self.status.err().unwrap_or(ErrorKind::Internal));
            };
            let before = self.evq.len(Binding::Psbend);
            match p.packet {
                Packet::Fup(ip) => self.header_fup(ip)?,
                Packet::ModeExec(m) => {
                    let mut ev = Event::new(EventKind::ExecMode {
                        mode: m.mode(),
                        ip: 0,
                    });
                    ev.status_update = true;
                    self.enqueue(Binding::Psbend, ev)?;
                    if cfg.iflags_events {
                        let mut ev = Event::new(EventKind::Iflags {
                            iflag: m.iflag,
                            ip: 0,
                        });
                        ev.status_update = true;
                        self.enqueue(Binding::Psbend, ev)?;
                    }
                }
                Packet::ModeTsx(t) => {
                    let mut ev = Event::new(EventKind::Tsx {
                        speculative: t.intx,
                        aborted: t.abrt,
                        ip: 0,
                    });
                    ev.status_update = true;
                    self.enqueue(Binding::Psbend, ev)?;
                }
                Packet::Pip(pip) => {
                    let mut ev = Event::new(EventKind::AsyncPaging {
                        cr3: pip.cr3.0,
                        non_root: pip.nr,
                        ip: 0,
                    });
                    ev.status_update = true;
                    self.enqueue(Binding::Psbend, ev)?;
                }
                Packet::Vmcs(base) => {
                    let mut ev = Event::new(EventKind::AsyncVmcs { base, ip: 0 });
                    ev.status_update = true;
                    self.enqueue(Binding::Psbend, ev)?;
                }
                Packet::Mnt(payload) => {
                    self.enqueue(Binding::Psbend, Event::new(EventKind::Mnt { payload }))?;
                }
                Packet::Tsc(t) => self.clock.tsc(t, true, &cfg)?,
                Packet::Cbr(r) => {
                    self.clock.cbr(r, true, &cfg)?;
                    let mut ev = Event::new(EventKind::Cbr { ratio: r });
                    ev.status_update = true;
                    self.enqueue(Binding::Psbend, ev)?;
                }
                Packet::Tma(t) => self.clock.tma(t.ctc, t.fc, &cfg)?,
                Packet::Mtc(m) => self.clock.mtc(m, &cfg)?,
                Packet::Cyc(c) => self.clock.cyc(c, &cfg)?,
                Packet::Pad => {}
                Packet::Psbend => {
                    self.settle_psb_status();
                    return Ok(Step::More);
                }
                Packet::Ovf => {
                    if self.enabled {
                        self.settle_psb_status();
                    } else {
                        // Without a FUP, the status event goes.
                        let _ = self.evq.pop(Binding::Psbend);
                    }
                    return Ok(Step::More);
                }
                _ => return Err(ErrorKind::BadContext),
            }
            for n in before..self.evq.len(Binding::Psbend) {
                if let Some(ev) = self.evq.get_mut(Binding::Psbend, n) {
                    ev.status_offset.get_or_insert(p.offset);
                }
            }
        }
    }

    fn settle_psb_status(&mut self) {
        let enabled = self.enabled;
        if let Some(ev) = self.evq.get_mut(Binding::Psbend, 0) {
            if enabled {
                ev.kind = EventKind::Enabled {
                    ip: 0,
                    resumed: false,
                };
            } else {
                ev.ip_suppressed = true;
            }
        }
    }

    fn header_fup(&mut self, ip: IpPayload) -> Result<(), ErrorKind> {
        let mut enabled = ip.compression != hwtrace_packet::IpCompression::Suppressed;
        if self.config.errata.bdm70 && self.check_bdm70()? {
            enabled = false;
        }
        self.enabled = enabled;
        if enabled {
            self.update_ip(ip);
        }
        Ok(())
    }

    /// BDM70: a TIP.PGE right after PSB+ means the FUP in it is bogus.
    fn check_bdm70(&self) -> Result<bool, ErrorKind> {
        let mut pkt = self.pkt.clone();
        loop {
            match super::quirks::next_packet(&mut pkt, &self.config.errata) {
                Ok(None) => return Ok(false),
                Err(e) => {
                    let k = ErrorKind::from(e.kind);
                    return if k == ErrorKind::Eos {
                        Ok(false)
                    } else {
                        Err(k)
                    };
                }
                Ok(Some(p)) => match p.packet {
                    Packet::TipPge(_) => return Ok(true),
                    Packet::Pad
                    | Packet::Tsc(_)
                    | Packet::Cbr(_)
                    | Packet::Psbend
                    | Packet::Pip(_)
                    | Packet::ModeExec(_)
                    | Packet::ModeTsx(_)
                    | Packet::Vmcs(_)
                    | Packet::Tma(_)
                    | Packet::Mtc(_)
                    | Packet::Cyc(_)
                    | Packet::Mnt(_) => {}
                    _ => return Ok(false),
                },
            }
        }
    }

    fn decode_psbend(&mut self) -> Res {
        let Some(ev) = self.evq.pop(Binding::Psbend) else {
            return Ok(Step::More);
        };
        let mut ev = Self::at_psbend(&self.ip, ev)?;
        self.clock.stamp(&mut ev);
        self.event = Some(ev);
        Ok(Step::Event)
    }

    /// Where tracing starts after the PSB+ just read, when the next event
    /// is known to say so without decoding on: at its PSBEND, with nothing
    /// deferred, the first status event is an enable. `Some` of the IP it
    /// reports (`None` if suppressed), as [`next_event`](Self::next_event)
    /// would hand it out; `None` when only decoding on can tell (tracing
    /// off: the next event may be that of a PSB+ right after).
    pub(super) fn psb_enables_at(&self) -> Option<Option<u64>> {
        if !self.deferred.is_empty()
            || !matches!(
                self.packet,
                Some(DecodedPacket {
                    packet: Packet::Psbend,
                    ..
                })
            )
        {
            return None;
        }
        let ev = self
            .evq
            .front(Binding::Psbend)
            .filter(|ev| ev.status_update)?;
        match Self::at_psbend(&self.ip, *ev).ok()? {
            Event {
                kind: EventKind::Enabled { ip, .. },
                ip_suppressed,
                ..
            } => Some((!ip_suppressed).then_some(ip)),
            _ => None,
        }
    }

    /// A PSB+ status event as PSBEND hands it out: with the last IP, if
    /// it reports one; an error for an event that cannot wait for PSBEND.
    #[inline]
    fn at_psbend(ip: &LastIp, mut ev: Event) -> Result<Event, ErrorKind> {
        match ev.kind {
            EventKind::Enabled { .. }
            | EventKind::ExecMode { .. }
            | EventKind::Tsx { .. }
            | EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. }
            | EventKind::Iflags { .. } => Self::event_ip(ip, &mut ev),
            EventKind::Disabled { .. } | EventKind::Cbr { .. } | EventKind::Mnt { .. } => {}
            _ => return Err(ErrorKind::BadContext),
        }
        Ok(ev)
    }

    fn decode_fup(&mut self, payload: IpPayload) -> Res {
        self.update_ip(payload);
        let Some(mut ev) = self.evq.pop(Binding::Fup) else {
            if let Some(mut ev) = self.after_fup.pop_front() {
                // C-state entries reported after the MWAIT/EXSTOP the FUP
                // placed.
                ev.ip_suppressed = true;
                self.clock.stamp(&mut ev);
                self.event = Some(ev);
                self.bound = true;
                return Ok(Step::Event);
            }
            if self.bound {
                return Ok(Step::More);
            }
            let from = self.ip.ip().map_err(last_ip_error)?;
            self.enqueue(
                Binding::Tip,
                Event::new(EventKind::AsyncBranch { from, to: 0 }),
            )?;
            return Ok(Step::More);
        };
        match ev.kind {
            EventKind::Overflow { .. } => {
                Self::event_ip(&self.ip, &mut ev);
                self.enabled = true;
                self.bound = true;
            }
            EventKind::Tsx { aborted, .. } => {
                self.clock.stamp(&mut ev);
                Self::event_ip(&self.ip, &mut ev);
                if !aborted {
                    self.bound = true;
                }
            }
            EventKind::Pwre { .. } => self.clock.stamp(&mut ev),
            EventKind::ExecMode { .. } | EventKind::Iflags { .. } => {
                self.clock.stamp(&mut ev);
                Self::event_ip(&self.ip, &mut ev);
                self.bound = true;
            }
            EventKind::Exstop { .. }
            | EventKind::Mwait { .. }
            | EventKind::Ptwrite { .. }
            | EventKind::Trig { .. } => {
                self.clock.stamp(&mut ev);
                Self::event_ip(&self.ip, &mut ev);
                self.bound = true;
            }
            _ if super::trace::binds_to_fup(&ev) || super::trace::binds_to_insn(&ev) => {
                self.clock.stamp(&mut ev);
                Self::event_ip(&self.ip, &mut ev);
                // Exceptions and interrupts leave the FUP to form the
                // asynchronous branch with the TIP after it.
                if !super::trace::leaves_fup(&ev) {
                    self.bound = true;
                }
            }
            _ => return Err(ErrorKind::BadContext),
        }
        self.event = Some(ev);
        Ok(Step::Event)
    }

    fn decode_tip(&mut self, payload: IpPayload) -> Res {
        if !self.enabled {
            return Err(ErrorKind::BadContext);
        }
        self.update_ip(payload);
        if !self.bound {
            return self.decode_tip_event();
        }
        let Some(mut ev) = self.evq.pop(Binding::Tip) else {
            return Ok(Step::More);
        };
        match ev.kind {
            EventKind::AsyncBranch { .. } => return Err(ErrorKind::Internal),
            EventKind::ExecMode { .. }
            | EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. }
            | EventKind::Iflags { .. } => Self::event_ip(&self.ip, &mut ev),
            _ if super::trace::binds_to_tip(&ev) => Self::event_ip(&self.ip, &mut ev),
            _ => return Err(ErrorKind::BadContext),
        }
        self.clock.stamp(&mut ev);
        self.event = Some(ev);
        Ok(Step::Event)
    }

    /// The first event of a TIP: the asynchronous branch it completes, or
    /// the TIP itself.
    fn decode_tip_event(&mut self) -> Res {
        self.bound = true;
        let found = self.evq.find(Binding::Tip, |e| {
            matches!(e.kind, EventKind::AsyncBranch { .. })
        });
        if let Some(i) = found {
            self.evq.swap_front(Binding::Tip, i);
            let mut ev = self.evq.pop(Binding::Tip).ok_or(ErrorKind::Internal)?;
            Self::event_ip(&self.ip, &mut ev);
            self.clock.stamp(&mut ev);
            self.event = Some(ev);
            return Ok(Step::Event);
        }
        let mut ev = Event::new(EventKind::Tip { ip: 0 });
        Self::event_ip(&self.ip, &mut ev);
        self.clock.stamp(&mut ev);
        self.event = Some(ev);
        Ok(Step::Event)
    }

    fn decode_tip_pge(&mut self, payload: IpPayload) -> Res {
        self.update_ip(payload);
        // Event trace reports what re-enabled tracing (an interrupt whose
        // FUP was not traced, a return or VM entry) before the enable.
        let fup_cfe = self.evq.find(Binding::Fup, |e| {
            super::trace::binds_to_fup(e) && e.ip_hidden
        }) == Some(0);
        let tip_cfe = self.evq.find(Binding::Tip, super::trace::binds_to_tip) == Some(0);
        if !self.bound && (fup_cfe || tip_cfe) {
            let from = if fup_cfe { Binding::Fup } else { Binding::Tip };
            let mut ev = self.evq.pop(from).ok_or(ErrorKind::Internal)?;
            Self::event_ip(&self.ip, &mut ev);
            self.clock.stamp(&mut ev);
            self.event = Some(ev);
            return Ok(Step::Event);
        }
        if !self.bound {
            let mut ev = Event::new(EventKind::Enabled {
                ip: 0,
                resumed: false,
            });
            Self::event_ip(&self.ip, &mut ev);
            self.clock.stamp(&mut ev);
            self.event = Some(ev);
            self.enabled = true;
            self.bound = true;
            return Ok(Step::Event);
        }
        let Some(mut ev) = self.evq.pop(Binding::Tip) else {
            return Ok(Step::More);
        };
        match ev.kind {
            EventKind::ExecMode { .. } | EventKind::Iflags { .. } => {
                Self::event_ip(&self.ip, &mut ev)
            }
            _ if super::trace::binds_to_tip(&ev) => Self::event_ip(&self.ip, &mut ev),
            _ => return Err(ErrorKind::BadContext),
        }
        self.clock.stamp(&mut ev);
        self.event = Some(ev);
        Ok(Step::Event)
    }

    fn decode_tip_pgd(&mut self, payload: IpPayload) -> Res {
        self.update_ip(payload);
        let Some(mut ev) = self.evq.pop(Binding::Tip) else {
            if self.bound {
                return Ok(Step::More);
            }
            let mut ev = Event::new(EventKind::Disabled { ip: 0 });
            Self::event_ip(&self.ip, &mut ev);
            self.clock.stamp(&mut ev);
            self.event = Some(ev);
            self.enabled = false;
            self.fetch_packet();
            return Ok(Step::Event);
        };
        match ev.kind {
            EventKind::AsyncBranch { from, .. } => {
                ev.kind = EventKind::AsyncDisabled { at: from, ip: 0 };
                Self::event_ip(&self.ip, &mut ev);
                self.enabled = false;
                self.bound = true;
            }
            EventKind::AsyncPaging { .. } | EventKind::AsyncVmcs { .. } => {
                if !self.bound {
                    return Err(ErrorKind::Internal);
                }
                ev.ip_suppressed = true;
            }
            EventKind::ExecMode { .. } | EventKind::Iflags { .. } => ev.ip_suppressed = true,
            _ if super::trace::binds_to_tip(&ev) => ev.ip_suppressed = true,
            _ => return Err(ErrorKind::BadContext),
        }
        self.clock.stamp(&mut ev);
        self.event = Some(ev);
        Ok(Step::Event)
    }

    fn decode_vmcs(&mut self, base: u64) -> Res {
        let paging = self.evq.find(Binding::Tip, |e| {
            matches!(e.kind, EventKind::AsyncPaging { .. })
        });
        if let Some(i) = paging {
            // VMCS goes before the PIP it arrived after.
            let slot = self
                .evq
                .get_mut(Binding::Tip, i)
                .ok_or(ErrorKind::Internal)?;
            let pip = *slot;
            slot.kind = EventKind::AsyncVmcs { base, ip: 0 };
            self.enqueue(Binding::Tip, pip)?;
            return Ok(Step::More);
        }
        let async_branch = self
            .evq
            .find(Binding::Tip, |e| {
                matches!(e.kind, EventKind::AsyncBranch { .. })
            })
            .is_some();
        if async_branch {
            self.enqueue(
                Binding::Tip,
                Event::new(EventKind::AsyncVmcs { base, ip: 0 }),
            )?;
            return Ok(Step::More);
        }
        self.standalone(EventKind::Vmcs { base });
        self.fetch_packet();
        Ok(Step::Event)
    }

    fn decode_exstop(&mut self, ip: bool) -> Res {
        let front_is_mwait = self.evq.find(Binding::Exstop, |e| {
            matches!(e.kind, EventKind::Mwait { .. })
        }) == Some(0);
        if ip {
            // MWAIT, EXSTOP and any C-state entry all bind to the FUP, in
            // that order.
            let mut later = Vec::new();
            while let Some(ev) = self.evq.pop(Binding::Exstop) {
                if matches!(ev.kind, EventKind::Mwait { .. }) {
                    self.enqueue(Binding::Fup, ev)?;
                } else {
                    later.push(ev);
                }
            }
            self.enqueue(Binding::Fup, Event::new(EventKind::Exstop { ip: 0 }))?;
            self.after_fup.extend(later);
            return Ok(Step::More);
        }
        if front_is_mwait {
            // Without an IP, MWAIT is reported first, on its own; this
            // packet is looked at again for the rest.
            let mut ev = self.evq.pop(Binding::Exstop).ok_or(ErrorKind::Internal)?;
            ev.set_ip(0);
            ev.ip_suppressed = true;
            self.clock.stamp(&mut ev);
            self.event = Some(ev);
            return Ok(Step::Event);
        }
        while let Some(mut ev) = self.evq.pop(Binding::Exstop) {
            ev.ip_suppressed = true;
            self.deferred.push_back(ev);
        }
        self.standalone(EventKind::Exstop { ip: 0 }).ip_suppressed = true;
        self.fetch_packet();
        Ok(Step::Event)
    }

    /// Test and front-end helper: whether tracing is enabled.
    pub const fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub(super) fn push_event(&mut self, b: Binding, ev: Event) -> Result<(), ErrorKind> {
        self.enqueue(b, ev)
    }

    pub(super) fn emit(&mut self, kind: EventKind, suppressed: bool) {
        self.standalone(kind).ip_suppressed = suppressed;
        self.fetch_packet();
    }

    pub(super) fn evd_mut(&mut self) -> &mut super::trace::EventData {
        &mut self.evd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_packet::TraceBuilder;

    /// The events after PSB, PSBEND and `bytes`, up to the end or an
    /// error.
    fn events_after_psb(bytes: &[u8], config: Config) -> Vec<Result<EventKind, ErrorKind>> {
        let mut t = TraceBuilder::new();
        t.push(Packet::Psb).unwrap();
        t.push(Packet::Psbend).unwrap();
        t.raw(bytes);
        let data = t.finish();
        let mut dec = EventDecoder::new(&data, config);
        dec.sync_forward().unwrap();
        let mut out = Vec::new();
        loop {
            match dec.next_event() {
                Ok(ev) => out.push(Ok(ev.kind)),
                Err(ErrorKind::Eos) => return out,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }

    #[test]
    fn packets_behind_the_escape_are_read_with_libipts_quirks() {
        // PWRE's hardware flag is bit 3 of its first payload byte as
        // libipt reads it (bit 7 for the SDM).
        for (byte, hw) in [(0x08, true), (0x80, false)] {
            let events = events_after_psb(&[0x02, 0x22, byte, 0x00], Config::default());
            assert!(
                matches!(events.last(), Some(Ok(EventKind::Pwre { hw: h, .. })) if *h == hw),
                "{byte:#x}: {events:?}"
            );
        }
        // A TMA with reserved bits is an error, or with SKZ84 a corrupt
        // TMA one byte longer, passed over; the CBR after it is read.
        let tma = [
            0x02, 0x73, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x03, 0x20, 0x00,
        ];
        let events = events_after_psb(&tma, Config::default());
        assert!(matches!(events.last(), Some(Err(_))), "{events:?}");
        let mut config = Config::default();
        config.errata.skz84 = true;
        let events = events_after_psb(&tma, config);
        assert!(
            matches!(events.last(), Some(Ok(EventKind::Cbr { ratio: 0x20 }))),
            "{events:?}"
        );
        // Other packets behind the escape, read without the quirks' look.
        let events = events_after_psb(&[0x02, 0x03, 0x21, 0x00], Config::default());
        assert!(
            matches!(events.last(), Some(Ok(EventKind::Cbr { ratio: 0x21 }))),
            "{events:?}"
        );
    }

    #[test]
    fn every_psb_arms_the_skl168_check_as_libipt_does() {
        let mut t = TraceBuilder::new();
        t.push(Packet::Psb).unwrap();
        t.push(Packet::Psbend).unwrap();
        let data = t.finish();
        for skl168 in [false, true] {
            let mut config = Config::default();
            config.time.skl168 = skl168;
            let mut dec = EventDecoder::new(&data, config);
            dec.sync_forward().unwrap();
            assert!(
                format!("{:?}", dec.clock.tcal).contains(&format!("check_skl168: {skl168}")),
                "skl168 {skl168}: {:?}",
                dec.clock.tcal
            );
        }
    }
}
