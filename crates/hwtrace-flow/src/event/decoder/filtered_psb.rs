//! PSB+ status updates passed over for callers that only count events.
//!
//! With IP or CR3 filtering, the hardware still writes a PSB+ every few
//! KiB of trace while execution is outside the traced ranges: a status
//! snapshot (MODE.TSX, PIP, VMCS, CBR, TSC, TMA) without a FUP, so tracing
//! is off. Real traces have runs of them between a TIP.PGD and the next
//! TIP.PGE, and each one is five status events through every layer of
//! the decoder, for a caller that only counts them. Here a PSB+ of that
//! plain kind is read straight from the bytes, its effects on the event
//! decoder applied exactly as [`EventDecoder::next_event`] would have
//! (the last IP forgotten, the clock moved, the events it would have
//! queued counted into a [`StatusPass`]), and anything less plain (a FUP,
//! MODE.Exec, MNT, an OVF, a packet libipt's quirks look at again, a bad
//! packet, a timing error) is left to `next_event`, untouched.
//!
//! The PSB+ written while tracing is on are decoded as usual (they come
//! one at a time), but their status updates after the first are summed
//! up too, where the instruction decoder would take each without a
//! question: at the IP it is at, in the mode it is in ([`passes_over`]).

use super::{Binding, Clock, EventDecoder};
use crate::error::ErrorKind;
use crate::event::quirks::tma_reserved;
use crate::event::{Event, EventKind};
use hwtrace_packet::{DecodedPacket, ExecMode, PSB, Packet, decode_packet, is_psb_at, pad_run};
use hwtrace_types::TraceOffset;

/// How many events a binding may hold (the event queue's limit): a PSB+
/// with more status packets is left to the queue, which reports it.
const MAX_STATUS_EVENTS: u64 = 64;

/// The most bytes of a PSB+ (PSB to PSBEND, PADs included) the memo
/// keeps.
const MEMO_BYTES: usize = 64;

/// The last plain PSB+ read from the bytes and what reading it did, for
/// its twins: a PSB+ is read the same wherever its bytes are the same and
/// the clock is the same before it (what it reads is its own bytes, the
/// clock and the configuration), and a trace written while tracing is off
/// has runs of the same PSB+ (the same CR3, VMCS base, transaction state
/// and core ratio, no timing packets), each ~900 instructions to read:
/// ~200 of them every 185 KB of the benchmark's real traces.
///
/// A cache: its `Debug` says nothing of what it holds (two decoders in
/// the same state may have seen different PSB+).
#[derive(Clone, Default)]
pub(super) struct PlainMemo(Option<Box<PlainPsb>>);

impl core::fmt::Debug for PlainMemo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("PlainMemo")
    }
}

#[derive(Clone)]
struct PlainPsb {
    bytes: [u8; MEMO_BYTES],
    len: usize,
    clock_before: Clock,
    clock_after: Clock,
    pass: StatusPass,
}

/// The status events of PSB+ passed over while tracing was off, and what
/// applying them in order leaves in the instruction decoder: the newest
/// transaction state, CR3 and VMCS base they reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusPass {
    /// How many events (the PSB's disabled status included).
    pub events: u64,
    /// The last MODE.TSX: inside a transaction.
    pub speculative: Option<bool>,
    /// The last PIP's CR3.
    pub cr3: Option<u64>,
    /// The last VMCS base.
    pub vmcs: Option<u64>,
    /// The last MODE.Exec's mode (tracing on).
    pub mode: Option<ExecMode>,
    /// An event whose IP is not suppressed was among them (a CBR; any,
    /// tracing on): it restarts the instruction count.
    pub restarts_count: bool,
}

impl StatusPass {
    /// Whether nothing was passed over.
    pub const fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// What was passed over, leaving nothing; `None` if nothing was.
    pub fn take(&mut self) -> Option<Self> {
        (!self.is_empty()).then(|| core::mem::take(self))
    }

    /// `later`, passed over after this one, added.
    fn then(&mut self, later: &Self) {
        self.events += later.events;
        self.speculative = later.speculative.or(self.speculative);
        self.cr3 = later.cr3.or(self.cr3);
        self.vmcs = later.vmcs.or(self.vmcs);
        self.mode = later.mode.or(self.mode);
        self.restarts_count |= later.restarts_count;
    }
}

/// Where the instruction decoder taking the events stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassState {
    /// Tracing is on.
    pub enabled: bool,
    /// The IP it is at (tracing on).
    pub ip: u64,
    /// The mode it decodes in.
    pub mode: Option<ExecMode>,
}

/// Whether `ev` is a status update of a kind a counting decode may pass
/// over ([`Skipped::status_updates`]): one of the events [`EventDecoder`]
/// makes of a PSB+ (tracing's status, MODE.Exec, MODE.TSX, PIP, VMCS,
/// CBR). Whether it does depends on where the decoder stands: tracing
/// off, or at the IP and in the mode the PSB+ reports.
///
/// [`Skipped::status_updates`]: crate::parallel::Skipped::status_updates
pub fn passable_status(ev: &Event) -> bool {
    ev.status_update
        && matches!(
            ev.kind,
            EventKind::Disabled { .. }
                | EventKind::Enabled { .. }
                | EventKind::ExecMode { .. }
                | EventKind::Tsx { .. }
                | EventKind::AsyncPaging { .. }
                | EventKind::AsyncVmcs { .. }
                | EventKind::Cbr { .. }
        )
}

/// Whether the instruction decoder, standing at `at`, takes the status
/// update `ev` without a question and without anything changing but
/// what [`StatusPass`] sums up: with tracing off, one of a PSB+ without
/// FUP; with tracing on, one of a PSB+ whose FUP is the IP the decoder is
/// at, in the mode it decodes in (anything else is a question: a bad
/// status update, an event waiting for its IP).
pub(crate) fn passes_over(ev: &Event, at: &PassState) -> bool {
    if !ev.status_update {
        return false;
    }
    let here = |ip: u64| !ev.ip_suppressed && ip == at.ip;
    if at.enabled {
        match ev.kind {
            EventKind::Enabled { ip, .. }
            | EventKind::Tsx { ip, .. }
            | EventKind::AsyncPaging { ip, .. }
            | EventKind::AsyncVmcs { ip, .. } => here(ip),
            EventKind::ExecMode { mode, ip } => here(ip) && at.mode == Some(mode),
            EventKind::Cbr { .. } => true,
            _ => false,
        }
    } else {
        match ev.kind {
            EventKind::Disabled { .. }
            | EventKind::Tsx { .. }
            | EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. } => ev.ip_suppressed,
            EventKind::Cbr { .. } => true,
            _ => false,
        }
    }
}

impl EventDecoder<'_> {
    /// Where [`next_event`](Self::next_event) would go on at a PSBEND
    /// with nothing queued but its status updates: takes those into
    /// `pass` if the instruction decoder, standing at `at`, would pass
    /// over each ([`passes_over`]); then, with tracing off, passes over
    /// the plain PSB+ that follow (PADs between). Afterwards the decoder
    /// is where `next_event` would be after handing out their events, and
    /// goes on from there.
    pub(in crate::event) fn pass_status(&mut self, pass: &mut StatusPass, at: &PassState) {
        if self.event.is_some()
            || !self.deferred.is_empty()
            || !self.after_fup.is_empty()
            || !self.evq.is_empty(Binding::Tip)
            || !self.evq.is_empty(Binding::Fup)
            || !self.evq.is_empty(Binding::Exstop)
        {
            return;
        }
        loop {
            match self.packet {
                Some(DecodedPacket {
                    packet: Packet::Psbend,
                    ..
                }) => {
                    // The rest of this PSB+'s status, then `next_event`
                    // finds nothing left for it and reads on (with tracing
                    // on, it does so itself: what follows is trace).
                    if !self.pass_queued_status(pass, at) || self.enabled {
                        return;
                    }
                    self.bound = false;
                    self.fetch_packet();
                }
                Some(DecodedPacket {
                    packet: Packet::Psb,
                    offset,
                    ..
                }) if !self.enabled => {
                    // Back-to-back PSB+ are read one after the other from
                    // the bytes; the packet decoder moves once, past the
                    // last.
                    let data = self.pkt.data();
                    let Some(mut end) = self.pass_plain_psb(offset, pass) else {
                        return;
                    };
                    loop {
                        let next = end + pad_run(data, end);
                        if !is_psb_at(data, next) {
                            break;
                        }
                        match self.pass_plain_psb(TraceOffset(next as u64), pass) {
                            Some(e) => end = e,
                            None => break,
                        }
                    }
                    // As after the last PSBEND's events.
                    if self.pkt.move_to(TraceOffset(end as u64)).is_err() {
                        self.packet = None;
                        self.status = Err(ErrorKind::Internal);
                        return;
                    }
                    self.bound = false;
                    self.fetch_packet();
                }
                _ => return,
            }
        }
    }

    /// At PSBEND: takes the status events still queued for it into
    /// `pass`, as [`decode_psbend`](Self::decode_psbend) would hand them
    /// out one by one, if the instruction decoder standing at `at` passes
    /// over each of them; otherwise changes nothing and returns `false`.
    fn pass_queued_status(&mut self, pass: &mut StatusPass, at: &PassState) -> bool {
        if self.evq.is_empty(Binding::Psbend) {
            return true;
        }
        // Each as `decode_psbend` hands it out.
        let ip = &self.ip;
        let passed = |ev: &Event| Self::at_psbend(ip, *ev).is_ok_and(|ev| passes_over(&ev, at));
        if self.evq.find(Binding::Psbend, |e| !passed(e)).is_some() {
            return false;
        }
        let mut this = StatusPass::default();
        while let Some(ev) = self.evq.pop(Binding::Psbend) {
            // Each one passes (just asked).
            let Ok(ev) = Self::at_psbend(&self.ip, ev) else {
                continue;
            };
            this.events += 1;
            this.restarts_count |= !ev.ip_suppressed;
            match ev.kind {
                EventKind::Tsx { speculative, .. } => this.speculative = Some(speculative),
                EventKind::AsyncPaging { cr3, .. } => this.cr3 = Some(cr3),
                EventKind::AsyncVmcs { base, .. } => this.vmcs = Some(base),
                EventKind::ExecMode { mode, .. } => this.mode = Some(mode),
                _ => {}
            }
        }
        pass.then(&this);
        true
    }

    /// Reads the PSB+ at `psb` from the bytes; if it is plain (see the
    /// module doc), applies it as [`decode_psb`](Self::decode_psb) and
    /// the PSBEND would and returns the position after the PSBEND (the
    /// packet decoder is left where it was); otherwise changes nothing.
    fn pass_plain_psb(&mut self, psb: TraceOffset, pass: &mut StatusPass) -> Option<usize> {
        if !self.pkt.at_top_level() {
            return None;
        }
        let data = self.pkt.data();
        let start = usize::try_from(psb.0).ok()?;
        if let Some(m) = &self.plain_memo.0
            && self.clock == m.clock_before
            && data.get(start..start + m.len) == Some(&m.bytes[..m.len])
        {
            self.clock = m.clock_after;
            self.ip.reset();
            pass.then(&m.pass);
            return Some(start + m.len);
        }
        let before = self.clock;
        let mut pos = start.checked_add(PSB.len())?;
        let cfg = self.config;
        // As `decode_psb` starts (setting a flag: it may be set again).
        self.clock.tcal.update_psb(&cfg.time);
        // Timing packets change the clock; a copy takes them so that a
        // PSB+ left to `decode_psb` finds the clock as it was.
        let mut clock = self.clock;
        // The status of tracing comes first.
        let mut this = StatusPass {
            events: 1,
            ..StatusPass::default()
        };
        loop {
            pos += pad_run(data, pos);
            let bytes = data.get(pos..)?;
            // The quirks' packets (CYC, PWRE) and errors are `decode_psb`'s.
            if bytes.first().is_some_and(|&b| b & 3 == 3) {
                return None;
            }
            let Ok((packet, size)) = decode_packet(bytes) else {
                return None;
            };
            // Whether the packet is an event of its own, and the clock's
            // answer to a timing packet.
            let (event, timed) = match packet {
                Packet::Psbend => {
                    pos += size;
                    break;
                }
                Packet::ModeTsx(t) => {
                    this.speculative = Some(t.intx);
                    (true, Ok(()))
                }
                Packet::Pip(pip) => {
                    this.cr3 = Some(pip.cr3.0);
                    (true, Ok(()))
                }
                Packet::Vmcs(base) => {
                    this.vmcs = Some(base);
                    (true, Ok(()))
                }
                Packet::Cbr(r) => {
                    this.restarts_count = true;
                    (true, clock.cbr(r, true, &cfg))
                }
                Packet::Tsc(t) => (false, clock.tsc(t, true, &cfg)),
                Packet::Tma(t) if !tma_reserved(&bytes[..size]) => {
                    (false, clock.tma(t.ctc, t.fc, &cfg))
                }
                Packet::Mtc(m) => (false, clock.mtc(m, &cfg)),
                // A FUP (tracing on), MODE.Exec, MNT, OVF, PWRE, a TMA with
                // reserved bits and anything unexpected in PSB+.
                _ => return None,
            };
            if timed.is_err() {
                return None;
            }
            if event {
                this.events += 1;
                if this.events >= MAX_STATUS_EVENTS {
                    return None;
                }
            }
            pos += size;
        }
        self.clock = clock;
        self.ip.reset();
        pass.then(&this);
        if let Some(read) = data.get(start..pos)
            && read.len() <= MEMO_BYTES
        {
            let mut bytes = [0; MEMO_BYTES];
            bytes[..read.len()].copy_from_slice(read);
            let read = PlainPsb {
                bytes,
                len: read.len(),
                clock_before: before,
                clock_after: self.clock,
                pass: this,
            };
            // The box is made once and written over after.
            match &mut self.plain_memo.0 {
                Some(m) => **m = read,
                None => self.plain_memo.0 = Some(Box::new(read)),
            }
        }
        Some(pos)
    }
}
