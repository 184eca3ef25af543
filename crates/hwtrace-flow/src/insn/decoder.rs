//! [`InsnDecoder`]: the instructions the trace says were executed.
//!
//! The decoder walks from the current IP through the code, one
//! instruction at a time, asking the [`QueryDecoder`] for a TNT bit at
//! each conditional branch and compressed return and for a TIP at each
//! indirect branch. Events are reported between instructions, at the
//! instruction or IP they bind to; the caller drains them with
//! [`event`](InsnDecoder::event) whenever a [`Status`] says one is
//! pending.

use super::cache::{Cached, InsnCache};
use super::classify::{ClassifyError, Decoded, InsnClass, MAX_INSN_SIZE, Special, classify};
use super::retstack::RetStack;
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::event::{Event, EventKind, QueryDecoder, Status, TntState};
use crate::time::ClockState;
use hwtrace_packet::{ExecMode, LastIp};
use hwtrace_types::{AddressSpace, Cr3, Ip, ReadMemory, TraceOffset};

mod chain;
mod fast;
mod passed_status;
mod resync;

pub(in crate::insn) use fast::{BurstEnd, RunSink};

/// One executed instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Its address.
    pub ip: u64,
    /// Its length in bytes (0 if it could not be decoded).
    pub size: u8,
    /// The execution mode it ran in (`None` if unknown).
    pub mode: Option<ExecMode>,
    /// Its control-flow class.
    pub class: InsnClass,
    /// Executed inside a transaction (may be rolled back).
    pub speculative: bool,
    /// The target of a direct branch.
    pub target: Option<u64>,
    /// Its bytes (the first `size`).
    pub raw: [u8; MAX_INSN_SIZE],
}

impl Insn {
    /// An instruction at `ip` not decoded (yet).
    pub const fn empty(ip: u64, mode: Option<ExecMode>, speculative: bool) -> Self {
        Self {
            ip,
            size: 0,
            mode,
            class: InsnClass::Unknown,
            speculative,
            target: None,
            raw: [0; MAX_INSN_SIZE],
        }
    }

    /// The instruction's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.raw[..usize::from(self.size).min(MAX_INSN_SIZE)]
    }
}

/// One step of the flow: an executed instruction or an event between
/// instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An instruction that was executed.
    Insn(Insn),
    /// Something the trace reported (enable, disable, overflow, mode...).
    Event(Event),
}

/// How many instructions may run without any trace before the decoder
/// gives up ([`ErrorKind::NoProgress`]).
pub const MAX_UNTRACED_INSNS: u64 = 1 << 22;

/// How many instructions BDM64's check may walk.
const BDM64_MAX_STEPS: usize = 0x100;

type Flow<T> = Result<T, ErrorKind>;

/// The instruction layer's own state beyond its IP, address space and
/// status, as far as it decides the items to come: the execution mode and
/// what was last reported of it and of RFLAGS.IF (a PSB+ report is news
/// or not by them), the transaction state, instructions since trace was
/// last consumed (TRIG.ICNT), and whether an error's resynchronisation is
/// under way. Compared where a parallel decode splices
/// ([`Probe`](crate::parallel::Probe)); what waits to be handed out is not
/// compared but keeps a decoder from splicing
/// ([`InsnDecoder::nothing_pending`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsnState {
    mode: Option<ExecMode>,
    reported_mode: Option<ExecMode>,
    iflag: Option<bool>,
    enabled: bool,
    speculative: bool,
    process_event: bool,
    resyncing: bool,
    bound: [bool; 3],
    icount: u64,
}

/// Reconstructs the executed instructions from a trace and the memory the
/// code ran from.
#[derive(Debug)]
pub struct InsnDecoder<'a, M> {
    query: QueryDecoder<'a>,
    mem: M,
    cache: InsnCache,
    mode: Option<ExecMode>,
    ip: u64,
    status: Status,
    enabled: bool,
    process_event: bool,
    event: Event,
    speculative: bool,
    /// The status of the last step, for [`Self::next`].
    last: Status,
    /// The trace offset of the pending event.
    event_offset: TraceOffset,
    /// Skipping to the next IP after an error ([`Self::resync`]).
    resyncing: bool,
    /// An event to look at after the one being reported (resync).
    stashed: Option<(Event, TraceOffset)>,
    /// Instructions since the last trace-consuming point (TRIG.ICNT).
    icount: u64,
    /// The execution mode last reported (forgotten at an overflow).
    reported_mode: Option<ExecMode>,
    /// RFLAGS.IF as event trace last reported it.
    iflag: Option<bool>,
    /// An instruction postponed while events bound to it are reported.
    postponed: Option<(Insn, Decoded)>,
    bound_paging: bool,
    bound_vmcs: bool,
    bound_ptwrite: bool,
    retstack: RetStack,
    space: AddressSpace,
}

impl<'a, M: ReadMemory> InsnDecoder<'a, M> {
    /// A decoder over `trace`, reading code from `mem`.
    pub fn new(trace: &'a [u8], config: Config, mem: M) -> Self {
        Self {
            query: QueryDecoder::new(trace, config),
            mem,
            cache: InsnCache::new(),
            mode: None,
            ip: 0,
            status: Status::default(),
            enabled: false,
            process_event: false,
            event: Event::new(EventKind::Stop),
            speculative: false,
            last: Status::default(),
            event_offset: TraceOffset(0),
            resyncing: false,
            stashed: None,
            icount: 0,
            reported_mode: None,
            iflag: None,
            postponed: None,
            bound_paging: false,
            bound_vmcs: false,
            bound_ptwrite: false,
            retstack: RetStack::new(),
            space: AddressSpace::UNKNOWN,
        }
    }

    /// The memory code is read from.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// Replaces the memory (a sideband switch); forgets decoded code.
    pub fn set_memory(&mut self, mem: M) {
        self.mem = mem;
        self.cache.clear();
    }

    /// Forgets decoded code (the memory behind it changed).
    pub fn invalidate(&mut self) {
        self.cache.clear();
    }

    /// Takes `warm`'s decoded instructions (see
    /// [`FastDecoder::warm_from`](crate::insn::FastDecoder::warm_from)).
    pub(crate) fn warm_from(&mut self, warm: &Self) {
        self.cache = warm.cache.clone();
    }

    /// Starts from instructions an earlier decoder over the same code
    /// decoded.
    pub(crate) fn set_insn_cache(&mut self, cache: InsnCache) {
        self.cache = cache;
    }

    /// The instructions decoded, for a decoder over the same code.
    pub(crate) fn into_insn_cache(self) -> InsnCache {
        self.cache
    }

    /// The offset of the packet being processed: that of the pending
    /// event, if one is waiting, else the query layer's position.
    pub fn offset(&self) -> TraceOffset {
        if self.process_event {
            self.event_offset
        } else {
            self.query.offset()
        }
    }

    /// The offset of the last PSB synchronised to.
    pub fn sync_offset(&self) -> Option<TraceOffset> {
        self.query.sync_offset()
    }

    /// The current IP (where the next instruction is).
    pub const fn ip(&self) -> u64 {
        self.ip
    }

    /// The time at the last query: estimated TSC and whether it is
    /// wall-clock time.
    pub fn time(&self) -> (u64, bool) {
        let t = self.query.time();
        (t.estimate().tsc.0, t.query_tsc().is_ok())
    }

    /// The timing state that decides the times of the instructions and
    /// events to come.
    pub fn clock_state(&self) -> ClockState {
        self.query.clock_state()
    }

    /// The last IP, the reference of the compressed IPs to come.
    pub fn last_ip(&self) -> LastIp {
        self.query.last_ip()
    }

    /// The TNT bits held for the branches to come ([`TntState`]).
    pub fn tnt_state(&self) -> TntState {
        self.query.tnt_state()
    }

    /// The layer's own state that decides the items to come
    /// ([`InsnState`]).
    pub fn insn_state(&self) -> InsnState {
        InsnState {
            mode: self.mode,
            reported_mode: self.reported_mode,
            iflag: self.iflag,
            enabled: self.enabled,
            speculative: self.speculative,
            process_event: self.process_event,
            resyncing: self.resyncing,
            bound: [self.bound_paging, self.bound_vmcs, self.bound_ptwrite],
            icount: self.icount,
        }
    }

    /// Whether nothing waits to be handed out later: no event stashed
    /// while resynchronising, no instruction postponed behind the events
    /// bound to it, nothing in the event decoder
    /// ([`EventDecoder::nothing_pending`](crate::event::EventDecoder::nothing_pending)).
    pub fn nothing_pending(&self) -> bool {
        self.stashed.is_none() && self.postponed.is_none() && self.query.nothing_pending()
    }

    /// The address space (CR3, VMCS) last reported.
    pub const fn address_space(&self) -> AddressSpace {
        self.space
    }

    fn err(&self, kind: ErrorKind) -> Error {
        Error {
            offset: self.offset(),
            ip: Some(self.ip),
            kind,
        }
    }

    fn reset(&mut self) {
        self.mode = None;
        self.ip = 0;
        self.status = Status::default();
        self.enabled = false;
        self.process_event = false;
        self.speculative = false;
        self.iflag = None;
        self.reported_mode = None;
        self.icount = 0;
        self.resyncing = false;
        self.stashed = None;
        self.postponed = None;
        self.bound_paging = false;
        self.bound_vmcs = false;
        self.bound_ptwrite = false;
        self.retstack.clear();
        self.space = AddressSpace::UNKNOWN;
    }

    /// Synchronises at the next PSB. The status says whether events are
    /// pending (drain them first) and whether tracing is enabled.
    pub fn sync_forward(&mut self) -> Result<Status, Error> {
        self.reset();
        let r = self.query.sync_forward();
        let status = self.start(r)?;
        self.last = status;
        Ok(status)
    }

    /// The next instruction or event, in execution order; `Ok(None)` at
    /// the end of the trace. Call [`sync_forward`](Self::sync_forward)
    /// first, and again after an error to go on at the next PSB.
    ///
    /// This is the convenient form of [`next_insn`](Self::next_insn) and
    /// [`event`](Self::event), which give the [`Status`] flags themselves.
    #[allow(
        clippy::should_implement_trait,
        reason = "the decoder verb of every layer; an Iterator could not report errors with a resync point"
    )]
    pub fn next(&mut self) -> Result<Option<Step>, Error> {
        if self.last.event_pending {
            let (ev, status) = self.event()?;
            self.last = status;
            return Ok(Some(Step::Event(ev)));
        }
        if self.last.eos {
            return Ok(None);
        }
        let mut insn = Insn::empty(self.ip, self.mode, self.speculative);
        match self.next_insn(&mut insn) {
            Ok(status) => {
                self.last = status;
                Ok(Some(Step::Insn(insn)))
            }
            Err(e) if e.kind == ErrorKind::Eos => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes the next [`sync_set`](Self::sync_set) warm its clock over the
    /// packets up to `window` bytes before its PSB
    /// ([`EventDecoder::warm_clock`](crate::event::EventDecoder::warm_clock)).
    pub fn warm_clock(&mut self, window: u64) {
        self.query.warm_clock(window);
    }

    /// Synchronises at the PSB at `offset`.
    pub fn sync_set(&mut self, offset: TraceOffset) -> Result<Status, Error> {
        self.reset();
        let r = self.query.sync_set(offset);
        self.start(r)
    }

    fn start(&mut self, r: Result<(Option<u64>, Status), ErrorKind>) -> Result<Status, Error> {
        let (ip, status) = r.map_err(|k| self.err(k))?;
        self.status = status;
        if let Some(ip) = ip {
            self.ip = ip;
            self.enabled = true;
        }
        self.check_ip_event(None).map_err(|k| self.err(k))
    }

    fn insn_status(&self, event_pending: bool) -> Status {
        Status {
            event_pending,
            ip_suppressed: !self.enabled,
            eos: self.status.eos && !self.process_event,
        }
    }

    /// Fetches the next event from the query layer if one is pending.
    fn event_pending(&mut self) -> Flow<bool> {
        if self.process_event {
            return Ok(true);
        }
        if !self.status.event_pending {
            return Ok(false);
        }
        let offset = self.query.offset();
        let (ev, status) = self.query.event()?;
        self.event_offset = ev.status_offset.unwrap_or(offset);
        self.event = ev;
        self.process_event = true;
        self.status = status;
        Ok(true)
    }

    // ----- reading code -----

    fn decode_at(&mut self, ip: u64, mode: Option<ExecMode>) -> Flow<Cached> {
        let mode = mode.ok_or(ErrorKind::BadInsn)?;
        if let Some(c) = self.cache.get(self.space, ip, mode) {
            return Ok(*c);
        }
        let entry = read_insn(&self.mem, self.space, Ip(ip), mode)?;
        self.cache.insert(self.space, ip, mode, entry);
        Ok(entry)
    }

    // ----- queries -----

    fn tick(&mut self, ip: u64) -> Flow<()> {
        if !self.enabled {
            return Err(ErrorKind::Internal);
        }
        if self.process_event {
            return Ok(());
        }
        let t = self.query.time();
        let est = t.estimate();
        if est.tsc.0 == self.event.tsc {
            return Ok(());
        }
        let mut ev = Event::new(EventKind::Tick { ip });
        ev.has_tsc = t.query_tsc().is_ok();
        ev.tsc = est.tsc.0;
        ev.lost_mtc = est.lost_mtc;
        ev.lost_cyc = est.lost_cyc;
        self.event = ev;
        self.process_event = true;
        Ok(())
    }

    fn cond_branch(&mut self) -> Flow<(bool, Status)> {
        let r = self.query.cond_branch()?;
        self.icount = 0;
        if self.query.config().tick_events {
            self.tick(self.ip)?;
        }
        Ok(r)
    }

    fn indirect_branch(&mut self) -> Flow<(Option<u64>, Status)> {
        let evip = self.ip;
        let r = self.query.indirect_branch()?;
        self.icount = 0;
        if self.query.config().tick_events {
            self.tick(evip)?;
        }
        Ok(r)
    }

    /// Moves past `insn`: to the next instruction or the branch target.
    fn proceed(&mut self, insn: &Insn, d: &Decoded) -> Flow<()> {
        self.icount = self.icount.saturating_add(1);
        if self.icount > MAX_UNTRACED_INSNS {
            // Code that never needs trace (a `jmp .`) would run forever.
            return Err(ErrorKind::NoProgress);
        }
        self.ip = insn.ip.wrapping_add(u64::from(d.size));
        match d.class {
            InsnClass::Ptwrite | InsnClass::Other => return Ok(()),
            InsnClass::CondJump => {
                let (taken, status) = self.cond_branch()?;
                self.status = status;
                if !taken {
                    return Ok(());
                }
            }
            InsnClass::Call => {
                // A call to the next instruction (PIC) pushes nothing.
                if d.target != Some(self.ip) {
                    self.retstack.push(self.ip);
                }
            }
            InsnClass::Return => {
                if let Ok((taken, status)) = self.cond_branch() {
                    self.status = status;
                    if !taken {
                        return Err(ErrorKind::BadRetComp);
                    }
                    self.ip = self.retstack.pop().ok_or(ErrorKind::RetStackEmpty)?;
                    return Ok(());
                }
            }
            InsnClass::Jump | InsnClass::FarCall | InsnClass::FarReturn | InsnClass::FarJump => {}
            InsnClass::Unknown => return Err(ErrorKind::BadInsn),
        }
        if let Some(target) = d.target {
            self.ip = target;
        } else {
            let (target, status) = self.indirect_branch()?;
            self.status = status;
            self.ip = target.ok_or(ErrorKind::NoIp)?;
        }
        Ok(())
    }

    // ----- binding events -----

    fn at_skl014(&self, insn: &Insn, d: &Decoded) -> bool {
        if !self.event.ip_suppressed {
            return false;
        }
        match d.class {
            InsnClass::Call | InsnClass::Jump => match d.target {
                Some(t) if d.is_direct() => !self.query.config().filter.contains(t),
                _ => false,
            },
            _ => {
                let _ = insn;
                false
            }
        }
    }

    fn at_disabled_event(&self, insn: &Insn, d: &Decoded) -> Flow<bool> {
        if self.event.ip_suppressed {
            if d.is_far() || d.special == Special::ChangesCpl || d.special == Special::MovCr3 {
                return Ok(true);
            }
            // The disable is the next thing in the trace: an instruction
            // that needs a TNT bit or a TIP cannot get one, so tracing
            // stopped there.
            let needs_trace = match d.class {
                InsnClass::CondJump | InsnClass::Return => true,
                InsnClass::Jump | InsnClass::Call => d.target.is_none(),
                _ => false,
            };
            if needs_trace {
                return Ok(true);
            }
            let cfg = self.query.config();
            return Ok(cfg.filter.is_configured() && cfg.errata.skl014 && self.at_skl014(insn, d));
        }
        let EventKind::Disabled { ip } = self.event.kind else {
            return Err(ErrorKind::Internal);
        };
        Ok(match d.class {
            InsnClass::Ptwrite | InsnClass::Other => false,
            InsnClass::Call | InsnClass::Jump => match d.target {
                Some(t) => t == ip,
                None => true,
            },
            InsnClass::Return
            | InsnClass::FarCall
            | InsnClass::FarReturn
            | InsnClass::FarJump
            | InsnClass::CondJump => true,
            InsnClass::Unknown => return Err(ErrorKind::BadInsn),
        })
    }

    fn postpone(&mut self, insn: &Insn, d: &Decoded) -> Status {
        if self.postponed.is_none() {
            self.postponed = Some((*insn, *d));
        }
        self.insn_status(true)
    }

    fn clear_postponed(&mut self) {
        self.postponed = None;
        self.bound_paging = false;
        self.bound_vmcs = false;
        self.bound_ptwrite = false;
    }

    fn proceed_postponed(&mut self) -> Flow<()> {
        let Some((insn, d)) = self.postponed else {
            return Err(ErrorKind::Internal);
        };
        if self.enabled {
            self.proceed(&insn, &d)?;
        }
        self.clear_postponed();
        Ok(())
    }

    /// Events that bind to the instruction `insn` itself.
    fn check_insn_event(&mut self, insn: &Insn, d: &Decoded) -> Flow<Option<Status>> {
        if !self.event_pending()? {
            return Ok(None);
        }
        match self.event.kind {
            EventKind::Tip { .. } | EventKind::Tnt { .. } => Err(ErrorKind::Internal),
            EventKind::Disabled { .. } => {
                if self.event.status_update || !self.at_disabled_event(insn, d)? {
                    return Ok(None);
                }
                // Where tracing would resume.
                self.ip = match next_ip(insn, d) {
                    Ok(ip) => ip,
                    Err(ErrorKind::BadQuery) => match d.class {
                        InsnClass::Call | InsnClass::FarCall => {
                            insn.ip.wrapping_add(u64::from(d.size))
                        }
                        _ => 0,
                    },
                    Err(e) => return Err(e),
                };
                Ok(Some(self.insn_status(true)))
            }
            EventKind::Paging { .. } => {
                // PIP binds to MOV CR3, VM entries and far transfers.
                if self.bound_paging
                    || !(d.is_far() || matches!(d.special, Special::MovCr3 | Special::VmEntry))
                {
                    return Ok(None);
                }
                self.bound_paging = true;
                Ok(Some(self.postpone(insn, d)))
            }
            EventKind::Vmcs { .. } => {
                // VMCS binds to VMPTRLD, VM entries and far transfers.
                if self.bound_vmcs
                    || !(d.is_far() || matches!(d.special, Special::Vmptrld | Special::VmEntry))
                {
                    return Ok(None);
                }
                self.bound_vmcs = true;
                Ok(Some(self.postpone(insn, d)))
            }
            EventKind::Ptwrite { ip, .. }
            | EventKind::Vmentry { ip }
            | EventKind::Iret { ip }
            | EventKind::Rsm { ip }
            | EventKind::Uiret { ip } => {
                let is_ptw = matches!(self.event.kind, EventKind::Ptwrite { .. });
                let is_entry = matches!(self.event.kind, EventKind::Vmentry { .. });
                if is_entry && self.event.ip_suppressed {
                    // A VM entry whose TIP.PGD hid the IP binds to the
                    // VMLAUNCH/VMRESUME.
                    if self.bound_ptwrite || d.special != Special::VmEntry {
                        return Ok(None);
                    }
                    self.bound_ptwrite = true;
                    return Ok(Some(self.postpone(insn, d)));
                }
                if !is_ptw && !crate::event::trace::binds_to_insn(&self.event) {
                    return Ok(None);
                }
                if self.bound_ptwrite {
                    return Ok(None);
                }
                if self.event.ip_suppressed {
                    // libipt 2.3 binds it to the PTWRITE but leaves the
                    // IP unreported.
                    if !is_ptw || d.class != InsnClass::Ptwrite {
                        return Ok(None);
                    }
                } else if insn.ip != ip {
                    return Ok(None);
                }
                self.bound_ptwrite = true;
                Ok(Some(self.postpone(insn, d)))
            }
            _ => Ok(None),
        }
    }

    /// BDM64: an abort right after a branch may come with bad trace for
    /// that branch; if the abort IP cannot be reached, assume the branch
    /// went there.
    fn handle_bdm64(&mut self, d: &Decoded, abort_ip: u64) -> Flow<()> {
        if !d.is_branch() {
            return Ok(());
        }
        if self.range_is_contiguous(self.ip, abort_ip) {
            return Ok(());
        }
        self.ip = abort_ip;
        Ok(())
    }

    fn range_is_contiguous(&mut self, mut begin: u64, end: u64) -> bool {
        for _ in 0..BDM64_MAX_STEPS {
            if begin == end {
                return true;
            }
            let Ok(c) = self.decode_at(begin, self.mode) else {
                return false;
            };
            let insn = Insn::empty(begin, self.mode, false);
            match next_ip(&insn, &c.decoded) {
                Ok(ip) => begin = ip,
                Err(_) => return false,
            }
        }
        false
    }

    /// Events that bind to the current IP (after an instruction, or at the
    /// start).
    fn check_ip_event(&mut self, insn: Option<(&Insn, &Decoded)>) -> Flow<Status> {
        if !self.event_pending()? {
            return Ok(self.insn_status(false));
        }
        let ev = self.event;
        // While tracing is off nothing can be executed to reach an IP.
        let here = |ip: u64| ev.ip_suppressed || !self.enabled || ip == self.ip;
        let pending = match ev.kind {
            EventKind::Disabled { .. } => ev.status_update,
            // A PSB+ status binds where its FUP says execution is.
            EventKind::Enabled { ip, .. } if ev.status_update => here(ip),
            EventKind::Enabled { .. } | EventKind::Overflow { .. } | EventKind::Stop => true,
            EventKind::AsyncDisabled { at, .. } => {
                if at != self.ip {
                    false
                } else if self.query.config().errata.skd022 && self.check_skd022() {
                    // A VM entry lost its TIP.PGD: the disable is
                    // synchronous, after the instruction.
                    let ip = match ev.kind {
                        EventKind::AsyncDisabled { ip, .. } => ip,
                        _ => 0,
                    };
                    self.event.kind = EventKind::Disabled { ip };
                    false
                } else {
                    true
                }
            }
            EventKind::Tsx { aborted, ip, .. } => {
                if ev.ip_suppressed {
                    true
                } else {
                    if let Some((_, d)) = insn
                        && aborted
                        && self.query.config().errata.bdm64
                    {
                        let d = *d;
                        self.handle_bdm64(&d, ip)?;
                    }
                    self.ip == ip
                }
            }
            EventKind::AsyncBranch { from, .. } => from == self.ip,
            EventKind::ExecMode { ip, .. }
            | EventKind::AsyncPaging { ip, .. }
            | EventKind::AsyncVmcs { ip, .. }
            | EventKind::Iflags { ip, .. } => here(ip),
            EventKind::Iret { ip } | EventKind::Rsm { ip } | EventKind::Uiret { ip } => {
                if crate::event::trace::binds_to_insn(&ev) {
                    !self.enabled
                } else {
                    !self.enabled || here(ip)
                }
            }
            EventKind::Paging { .. } | EventKind::Vmcs { .. } => !self.enabled,
            EventKind::Exstop { ip }
            | EventKind::Mwait { ip, .. }
            | EventKind::Interrupt { ip, .. }
            | EventKind::Swintr { ip, .. }
            | EventKind::Syscall { ip }
            | EventKind::Smi { ip }
            | EventKind::Init { ip }
            | EventKind::Vmexit { ip, .. }
            | EventKind::Shutdown { ip }
            | EventKind::Uintr { ip, .. } => ev.ip_suppressed || !self.enabled || ip == self.ip,
            // A TRIG without IP comes ICNT instructions after the last
            // trace-consuming point or TRIG.
            EventKind::Trig { ip, icnt, .. } => {
                if ev.ip_suppressed {
                    !self.enabled || self.icount >= u64::from(icnt)
                } else {
                    !self.enabled || ip == self.ip
                }
            }
            EventKind::Pwre { .. }
            | EventKind::Pwrx { .. }
            | EventKind::Tick { .. }
            | EventKind::Cbr { .. }
            | EventKind::Mnt { .. }
            | EventKind::Sipi { .. } => true,
            EventKind::Ptwrite { .. } => !self.enabled,
            EventKind::Vmentry { .. } => {
                !self.enabled || (!ev.ip_suppressed && !crate::event::trace::binds_to_insn(&ev))
            }
            EventKind::Tip { .. } | EventKind::Tnt { .. } => return Err(ErrorKind::Internal),
        };
        Ok(self.insn_status(pending))
    }

    fn check_skd022(&mut self) -> bool {
        matches!(
            self.decode_at(self.ip, self.mode),
            Ok(c) if c.decoded.special == Special::VmEntry
        )
    }

    /// Decodes the next instruction. `insn` is filled in even when an
    /// error follows its decoding (its class is then not `Unknown`).
    pub fn next_insn(&mut self, insn: &mut Insn) -> Result<Status, Error> {
        *insn = Insn::empty(self.ip, self.mode, self.speculative);
        if !self.enabled {
            let kind = if self.status.eos {
                ErrorKind::Eos
            } else {
                ErrorKind::NoEnable
            };
            return Err(self.err(kind));
        }
        let c = self
            .decode_at(self.ip, self.mode)
            .map_err(|k| self.err(k))?;
        insn.size = c.decoded.size;
        insn.class = c.decoded.class;
        insn.target = c.decoded.target;
        insn.raw = c.raw;
        let d = c.decoded;
        let at = *insn;
        if let Some(status) = self.check_insn_event(&at, &d).map_err(|k| self.err(k))?
            && status.event_pending
        {
            return Ok(status);
        }
        self.proceed(&at, &d).map_err(|k| self.err(k))?;
        self.check_ip_event(Some((&at, &d)))
            .map_err(|k| self.err(k))
    }

    fn process_event(&mut self) -> Flow<()> {
        let lenient = self.query.config().lenient_status;
        let ev = &mut self.event;
        match ev.kind {
            EventKind::Enabled { ip, .. } => {
                if self.ip == ip {
                    ev.kind = EventKind::Enabled { ip, resumed: true };
                }
                if ev.status_update {
                    if self.enabled {
                        return Ok(());
                    }
                    if !lenient {
                        return Err(ErrorKind::BadStatusUpdate);
                    }
                    // PSB+ is believed: tracing is on at its FUP.
                    self.ip = ip;
                    self.enabled = true;
                    return Ok(());
                }
                if ev.ip_suppressed {
                    return Err(ErrorKind::NoIp);
                }
                if self.enabled && !lenient {
                    return Err(ErrorKind::BadContext);
                }
                self.ip = ip;
                self.enabled = true;
            }
            EventKind::AsyncDisabled { at, .. } | EventKind::Disabled { ip: at } => {
                if let EventKind::AsyncDisabled { .. } = ev.kind
                    && !ev.ip_suppressed
                    && self.ip != at
                {
                    return Err(ErrorKind::BadQuery);
                }
                if ev.status_update {
                    if self.enabled {
                        return Err(ErrorKind::BadStatusUpdate);
                    }
                    return Ok(());
                }
                if !self.enabled {
                    return Err(ErrorKind::BadContext);
                }
                self.enabled = false;
            }
            EventKind::AsyncBranch { from, to } => {
                if self.ip != from {
                    return Err(ErrorKind::BadQuery);
                }
                if ev.status_update || !self.enabled {
                    return Err(ErrorKind::BadContext);
                }
                self.ip = to;
            }
            EventKind::AsyncPaging { cr3, ip, .. } => {
                if !ev.ip_suppressed && self.ip != ip {
                    return Err(ErrorKind::BadQuery);
                }
                self.set_cr3(cr3);
            }
            EventKind::Paging { cr3, .. } => self.set_cr3(cr3),
            EventKind::AsyncVmcs { base, ip } => {
                if !ev.ip_suppressed && self.ip != ip {
                    return Err(ErrorKind::BadQuery);
                }
                self.set_vmcs(base);
            }
            EventKind::Vmcs { base } => self.set_vmcs(base),
            EventKind::Overflow { ip } => {
                if ev.status_update {
                    return Err(ErrorKind::BadContext);
                }
                if ev.ip_suppressed {
                    self.enabled = false;
                    self.ip = 0;
                } else {
                    self.ip = ip;
                    self.enabled = true;
                }
                self.speculative = false;
                // After lost packets, the next mode report is news again.
                self.reported_mode = None;
                self.iflag = None;
            }
            EventKind::ExecMode { mode, .. } => {
                if ev.status_update && self.enabled && self.mode.is_some_and(|m| m != mode) {
                    return Err(ErrorKind::BadStatusUpdate);
                }
                // Only a change is news; a repeat is a status report.
                if self.reported_mode == Some(mode) {
                    ev.status_update = true;
                }
                self.reported_mode = Some(mode);
                self.mode = Some(mode);
            }
            EventKind::Iflags { iflag, .. } => {
                if self.iflag == Some(iflag) {
                    ev.status_update = true;
                }
                self.iflag = Some(iflag);
            }
            EventKind::Tsx { speculative, .. } => self.speculative = speculative,
            EventKind::Stop if ev.status_update || self.enabled => {
                return Err(ErrorKind::BadContext);
            }
            EventKind::Exstop { ip } | EventKind::Mwait { ip, .. }
                if !ev.ip_suppressed && self.enabled && self.ip != ip =>
            {
                return Err(ErrorKind::BadQuery);
            }
            EventKind::Tip { .. } | EventKind::Tnt { .. } => return Err(ErrorKind::Internal),
            _ => {}
        }
        Ok(())
    }

    fn set_cr3(&mut self, cr3: u64) {
        if self.space.cr3 != Some(Cr3(cr3)) {
            self.space.cr3 = Some(Cr3(cr3));
        }
    }

    fn set_vmcs(&mut self, base: u64) {
        if self.space.vmcs != Some(base) {
            self.space.vmcs = Some(base);
        }
    }

    /// The pending event, applied to the decoder's state.
    pub fn event(&mut self) -> Result<(Event, Status), Error> {
        if !self.process_event {
            return Err(self.err(ErrorKind::BadQuery));
        }
        self.process_event().map_err(|k| self.err(k))?;
        if let EventKind::Trig { ip, icnt, .. } = &mut self.event.kind {
            if self.event.ip_suppressed && self.enabled {
                *ip = self.ip;
                self.event.ip_suppressed = false;
            }
            *icnt = 0;
            self.icount = 0;
        } else if !self.event.ip_suppressed && !matches!(self.event.kind, EventKind::Tick { .. }) {
            // An event placed by trace starts a new instruction count.
            self.icount = 0;
        }
        let ev = self.event;
        self.process_event = false;
        if self.resyncing {
            let status = match self.stashed.take() {
                Some((next, offset)) => match self.resync_at(next, offset) {
                    Ok(Some(status)) => Ok(status),
                    Ok(None) => self.resync_step(),
                    Err(e) => Err(e),
                },
                None => self.resync_step(),
            };
            return Ok((ev, status.map_err(|k| self.err(k))?));
        }
        if let Some((insn, d)) = self.postponed {
            if let Some(status) = self.check_insn_event(&insn, &d).map_err(|k| self.err(k))?
                && status.event_pending
            {
                return Ok((ev, status));
            }
            self.proceed_postponed().map_err(|k| self.err(k))?;
        }
        let status = self.check_ip_event(None).map_err(|k| self.err(k))?;
        Ok((ev, status))
    }
}

/// The instruction at `ip` in `space`, read from `mem` (up to
/// [`MAX_INSN_SIZE`] bytes, across mappings that end early) and
/// classified: what every decoder of this crate executes there.
/// [`ErrorKind::NoMap`] when the bytes are not mapped (or end inside the
/// instruction), [`ErrorKind::BadInsn`] when they are no instruction.
pub fn read_insn<M: ReadMemory>(
    mem: &M,
    space: AddressSpace,
    ip: Ip,
    mode: ExecMode,
) -> Result<Cached, ErrorKind> {
    let mut raw = [0u8; MAX_INSN_SIZE];
    let mut n = 0;
    while n < MAX_INSN_SIZE {
        match mem.read_memory(space, Ip(ip.0.wrapping_add(n as u64)), &mut raw[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k.min(MAX_INSN_SIZE - n),
        }
    }
    if n == 0 {
        return Err(ErrorKind::NoMap);
    }
    let decoded = match classify(&raw[..n], ip.0, mode) {
        Ok(d) => d,
        Err(ClassifyError::Truncated) if n < MAX_INSN_SIZE => return Err(ErrorKind::NoMap),
        Err(_) => return Err(ErrorKind::BadInsn),
    };
    Ok(Cached { decoded, raw })
}

/// The IP after `insn` when no trace is needed to know it.
fn next_ip(insn: &Insn, d: &Decoded) -> Flow<u64> {
    let next = insn.ip.wrapping_add(u64::from(d.size));
    match d.class {
        InsnClass::Ptwrite | InsnClass::Other => Ok(next),
        InsnClass::Call | InsnClass::Jump => d.target.ok_or(ErrorKind::BadQuery),
        InsnClass::Unknown => Err(ErrorKind::BadInsn),
        _ => Err(ErrorKind::BadQuery),
    }
}
