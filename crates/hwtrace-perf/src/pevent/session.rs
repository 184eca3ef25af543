//! A sideband session: several perf_event channels merged by time.
//!
//! This follows libipt-sb's session (`pt_sb_session.c`, `pt_sb_pevent.c`):
//!
//! * Each channel (one `--pevent:primary`/`--pevent:secondary` file) has one
//!   *fetched* record waiting, stamped with its TSC (perf time converted with
//!   the channel's [`TimeConversion`], moved earlier by `tsc-offset`; records
//!   without a time sample get TSC 0, "due immediately").
//! * Channels wait in a list ordered by that TSC. A channel goes in front of
//!   channels with an equal TSC, so at start the channel given first wins ties,
//!   and a channel keeps its turn while its next record is not later than the
//!   others'.
//! * [`Session::dump_due`] prints every record due at or before a TSC (ptdump
//!   calls it each time its time estimate changes, and with `u64::MAX` at the
//!   end: [`Session::dump_rest`]).
//! * [`Session::apply_event`] is the ptxed path: due records are printed and
//!   *applied* (MMAP → mapping in the pid's context, COMM.EXEC → fresh context,
//!   FORK → child context, ITRACE_START/SWITCH → pending context switch, LOST
//!   and truncated AUX → warnings); then every channel looks at the trace event
//!   to track user/kernel location and performs a pending context switch once
//!   the trace is (likely) in the kernel.
//!
//! Diagnostics go to the same writer as records, inline, formatted like
//! libipt's tools: `[FILE:%016x sideband warning|error: MESSAGE]`. Errors are
//! always printed, warnings only with [`OutputOptions::warnings`].
//! A record that cannot be parsed ends its channel (there is no way to find
//! the next record); a truncated last record ends it silently, as in libipt,
//! and is kept in [`Session::channel_stop`].

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use hwtrace_types::{Ip, Tsc};
use thiserror::Error;

use super::context::{Abi, ContextId, Contexts, Mapping, elf_abi};
use super::print::{PrintFlags, print_record};
use super::record::{self, Body, Record, SidebandOffset, misc, parse_record};
use super::time::{TimeConversion, apply_tsc_offset};

/// Per-channel configuration: the `--pevent:*` options in effect when the
/// file option was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// `--pevent:sample-type`: which `sample_id` fields follow each record.
    pub sample_type: u64,
    /// `--pevent:time-zero/-shift/-mult`.
    pub time: TimeConversion,
    /// `--pevent:tsc-offset`: apply records this many ticks earlier.
    pub tsc_offset: u64,
    /// `--pevent:kernel-start`: addresses at or above are kernel.
    pub kernel_start: Ip,
    /// `--pevent:sysroot`: prefixed to mapped file names.
    pub sysroot: Option<String>,
    /// `--pevent:vdso-x64`: the file standing for `[vdso]` in 64-bit processes.
    pub vdso_x64: Option<String>,
    /// `--pevent:vdso-x32`.
    pub vdso_x32: Option<String>,
    /// `--pevent:vdso-ia32`.
    pub vdso_ia32: Option<String>,
    /// Primary channels (`--pevent:primary`) drive context switches and
    /// report trace loss; secondary ones only contribute mappings.
    pub primary: bool,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            sample_type: 0,
            time: TimeConversion::default(),
            tsc_offset: 0,
            kernel_start: Ip(0),
            sysroot: None,
            vdso_x64: None,
            vdso_x32: None,
            vdso_ia32: None,
            primary: true,
        }
    }
}

/// What the session prints besides records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutputOptions {
    /// How records are printed (`--sb:compact`, `--sb:offset`, …).
    pub records: PrintFlags,
    /// `--sb:warn`: print warnings (errors are always printed).
    pub warnings: bool,
    /// `--sb:switch`: print `[context: pid-N]` on context switches.
    pub switches: bool,
}

/// A byte range of a sideband file (`FILE:from-to`); `end` is exclusive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileRange {
    /// First byte to load.
    pub begin: u64,
    /// One past the last byte, or the end of the file.
    pub end: Option<u64>,
}

/// Splits libipt's `FILE[:from[-to]]` argument. The suffix after the last
/// `:` is a range only if it parses as one (numbers in C `strtoull` base-0
/// syntax: `0x` hex, leading-`0` octal, decimal); otherwise the colon is part
/// of the file name.
pub fn split_file_arg(arg: &str) -> Result<(&str, FileRange), LoadError> {
    let Some(colon) = arg.rfind(':') else {
        return Ok((arg, FileRange::default()));
    };
    let (name, suffix) = (&arg[..colon], &arg[colon + 1..]);
    let (from, to) = match suffix.split_once('-') {
        Some((a, b)) => (a, Some(b)),
        None => (suffix, None),
    };
    let Some(begin) = parse_c_u64(from) else {
        return Ok((arg, FileRange::default()));
    };
    let end = match to {
        None => None,
        Some(to) => match parse_c_u64(to) {
            Some(end) => Some(end),
            None => return Ok((arg, FileRange::default())),
        },
    };
    if let Some(end) = end
        && end <= begin
    {
        return Err(LoadError {
            path: PathBuf::from(name),
            kind: LoadErrorKind::BadRange { begin, end },
        });
    }
    Ok((name, FileRange { begin, end }))
}

/// A number as C's `strtoull(s, _, 0)` reads a whole argument: optional
/// sign (a `-` negates in two's complement), then `0x` hex, leading-`0`
/// octal or decimal digits, nothing after them.
pub fn parse_c_u64(s: &str) -> Option<u64> {
    let s = s.trim_start();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits_ok = |d: &str, radix: u32| !d.is_empty() && d.chars().all(|c| c.is_digit(radix));
    let value = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        digits_ok(hex, 16).then(|| u64::from_str_radix(hex, 16).ok())??
    } else if s.len() > 1 && s.starts_with('0') {
        digits_ok(&s[1..], 8).then(|| u64::from_str_radix(&s[1..], 8).ok())??
    } else {
        digits_ok(s, 10).then(|| s.parse().ok())??
    };
    Some(if negative {
        value.wrapping_neg()
    } else {
        value
    })
}

/// A sideband file could not be loaded.
#[derive(Debug, Error)]
#[error("{}: {kind}", path.display())]
pub struct LoadError {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub kind: LoadErrorKind,
}

/// What went wrong loading a sideband file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadErrorKind {
    /// The file could not be read.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// `from-to` with `to <= from`.
    #[error("bad range {begin:#x}-{end:#x}")]
    BadRange {
        /// Range start.
        begin: u64,
        /// Range end.
        end: u64,
    },
    /// The range starts beyond the end of the file.
    #[error("offset {begin:#x} is beyond the end of the file ({size:#x} bytes)")]
    BadOffset {
        /// Range start.
        begin: u64,
        /// File size.
        size: u64,
    },
}

/// A channel in a [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChannelId(usize);

/// A sideband warning or error, tied to a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    /// The channel's file name.
    pub filename: String,
    /// The record it is about.
    pub offset: SidebandOffset,
    /// What happened.
    pub kind: DiagnosticKind,
}

/// What a [`Diagnostic`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiagnosticKind {
    /// Warning: perf lost sideband records (`PERF_RECORD_LOST`).
    SidebandLost,
    /// Warning: trace was lost (`PERF_RECORD_AUX.TRUNCATED`).
    TraceLost,
    /// Warning: a mapping cannot be decoded (`//anon`, `(deleted)`, `[...]`).
    SectionLost,
    /// Error: the record could not be parsed; the channel ends.
    Record(record::ErrorKind),
    /// Error: the configuration does not allow handling the record (e.g. no
    /// vDSO file for the process's ABI, zero time-mult, SWITCH without a pid
    /// sample).
    BadConfig,
    /// Error: a record libipt rejects as inconsistent (FORK of a new process
    /// whose pid differs from its tid).
    Inconsistent,
}

impl Diagnostic {
    /// Warnings are printed only with `--sb:warn`.
    pub fn is_warning(&self) -> bool {
        matches!(
            self.kind,
            DiagnosticKind::SidebandLost | DiagnosticKind::TraceLost | DiagnosticKind::SectionLost
        )
    }

    /// The message libipt prints.
    pub fn message(&self) -> &'static str {
        match self.kind {
            DiagnosticKind::SidebandLost => "sideband lost",
            DiagnosticKind::TraceLost => "trace lost",
            DiagnosticKind::SectionLost => "image section lost",
            DiagnosticKind::Record(kind) => kind.libipt_message(),
            DiagnosticKind::BadConfig => "bad configuration",
            DiagnosticKind::Inconsistent => "internal error",
        }
    }

    /// Writes `[FILE:OFFSET sideband warning|error: MESSAGE]` and a newline.
    pub fn write_to(&self, out: &mut dyn Write) -> io::Result<()> {
        let severity = if self.is_warning() {
            "warning"
        } else {
            "error"
        };
        writeln!(
            out,
            "[{}:{:016x} sideband {severity}: {}]",
            self.filename,
            self.offset.0,
            self.message()
        )
    }
}

/// Where the trace is, as far as context switching cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Location {
    /// Not known.
    #[default]
    Unknown,
    /// At a user-space IP.
    User,
    /// At a kernel IP.
    Kernel,
    /// Probably in user space (tracing stopped in the kernel, IP suppressed).
    LikelyUser,
    /// Probably in the kernel.
    LikelyKernel,
}

impl Location {
    fn kernelish(self) -> bool {
        matches!(self, Self::Unknown | Self::Kernel | Self::LikelyKernel)
    }
}

/// What a trace event tells about the location (libipt's `ploc_from_event`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocationHint {
    /// The event has an IP: enabled, disabled/overflow/exec-mode/tsx/… with
    /// IP, the target of an async branch, a TIP.
    Ip(Ip),
    /// Tracing was disabled with the IP suppressed: the trace left the
    /// current privilege level (flip the previous location).
    DisabledSuppressed,
    /// Async disable with suppressed IP; `from` is where it happened.
    AsyncDisabledSuppressed {
        /// The `at` address of the event.
        from: Ip,
    },
    /// A paging event (CR3 change): likely in the kernel.
    Paging,
    /// Any other event, or one without an IP.
    None,
}

/// A trace event as the sideband session sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// The event's time (0 if the trace has none; records are then applied
    /// by relative order only).
    pub tsc: Tsc,
    /// Its location hint.
    pub hint: LocationHint,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    offset: usize,
    tsc: Tsc,
}

#[derive(Clone, Debug)]
struct Source {
    filename: String,
    data: Vec<u8>,
    config: ChannelConfig,
}

#[derive(Clone, Debug, Default)]
struct State {
    /// The fetched record not yet printed/applied.
    pending: Option<Pending>,
    /// Where the next record starts.
    next: usize,
    /// The record diagnostics refer to (the last one fetched).
    current: usize,
    /// Why reading stopped before the end of the data, if it did.
    stop: Option<record::Error>,
    location: Location,
    context: Option<ContextId>,
    next_context: Option<ContextId>,
}

#[derive(Clone, Debug)]
struct Channel {
    source: Source,
    state: State,
}

enum Fetch {
    Ok,
    End,
    Failed,
}

/// Several sideband channels merged by time, plus the process contexts they
/// describe.
#[derive(Debug, Default)]
pub struct Session {
    channels: Vec<Channel>,
    /// Channels with a pending record, by ascending TSC.
    queue: Vec<usize>,
    /// Channels at their end that may still have a context switch pending.
    retired: Vec<usize>,
    started: bool,
    output: OutputOptions,
    contexts: Contexts,
}

impl Session {
    /// An empty session.
    pub fn new(output: OutputOptions) -> Self {
        Self {
            output,
            ..Self::default()
        }
    }

    /// The output options.
    pub fn output(&self) -> OutputOptions {
        self.output
    }

    /// Loads `FILE[:from[-to]]` (see [`split_file_arg`]) as a new channel.
    /// Offsets printed and diagnosed are relative to `from`.
    pub fn add_file(&mut self, arg: &str, config: ChannelConfig) -> Result<ChannelId, LoadError> {
        let (name, range) = split_file_arg(arg)?;
        let data = load_range(Path::new(name), range)?;
        Ok(self.add_buffer(name, data, config))
    }

    /// Adds a channel over bytes already in memory; `name` is what records
    /// and diagnostics print as the file name.
    pub fn add_buffer(&mut self, name: &str, data: Vec<u8>, config: ChannelConfig) -> ChannelId {
        self.channels.push(Channel {
            source: Source {
                filename: name.to_owned(),
                data,
                config,
            },
            state: State::default(),
        });
        ChannelId(self.channels.len() - 1)
    }

    /// Adds a kernel mapping every process context starts with.
    pub fn add_kernel_mapping(&mut self, mapping: Mapping) {
        self.contexts.add_kernel_mapping(mapping);
    }

    /// Fetches each channel's first record (diagnosing unreadable ones).
    /// Call it once after adding channels and before printing the trace, so
    /// diagnostics come first as in libipt; the other entry points call it
    /// if needed.
    pub fn start(&mut self, out: &mut dyn Write) -> io::Result<()> {
        if self.started {
            return Ok(());
        }
        self.started = true;
        // libipt stacks decoders as they are added and initialises them from
        // the top, each going in front of equal TSCs: the first added ends
        // up first among equals.
        for ch in (0..self.channels.len()).rev() {
            if let Fetch::Ok = self.fetch(ch, out)? {
                self.enqueue(ch);
            }
        }
        Ok(())
    }

    /// Prints every record due at or before `tsc`, in merged order.
    pub fn dump_due(&mut self, tsc: Tsc, out: &mut dyn Write) -> io::Result<()> {
        self.start(out)?;
        while let Some(ch) = self.pop_due(tsc) {
            self.print_pending(ch, out)?;
            if let Fetch::Ok = self.fetch(ch, out)? {
                self.enqueue(ch);
            }
        }
        Ok(())
    }

    /// Prints all remaining records (ptdump, at the end of the trace).
    pub fn dump_rest(&mut self, out: &mut dyn Write) -> io::Result<()> {
        self.dump_due(Tsc(u64::MAX), out)
    }

    /// The TSC of the next record to come, if any.
    pub fn next_tsc(&self) -> Option<Tsc> {
        let ch = *self.queue.first()?;
        self.channels[ch].state.pending.map(|p| p.tsc)
    }

    /// Presents a trace event (ptxed's path): prints and applies every record
    /// due at or before `event.tsc`, then lets each channel track the
    /// location and perform a postponed context switch. Returns the context
    /// switched to, if any (the last one if several channels switched).
    pub fn apply_event(
        &mut self,
        event: TraceEvent,
        out: &mut dyn Write,
    ) -> io::Result<Option<ContextId>> {
        self.start(out)?;
        let mut switched = None;
        while let Some(ch) = self.pop_due(event.tsc) {
            self.print_pending(ch, out)?;
            if let Some(id) = self.apply_pending(ch, out)? {
                switched = Some(id);
            }
            self.channels[ch].state.pending = None;
            match self.fetch(ch, out)? {
                Fetch::Ok => self.enqueue(ch),
                Fetch::End => self.retired.insert(0, ch),
                Fetch::Failed => {}
            }
        }
        for list in [false, true] {
            let ids = if list {
                std::mem::take(&mut self.retired)
            } else {
                self.queue.clone()
            };
            let mut keep = Vec::with_capacity(ids.len());
            for ch in ids {
                match self.track_location(ch, event, out)? {
                    Present::Switched(id) => {
                        switched = Some(id);
                        keep.push(ch);
                    }
                    Present::Keep => keep.push(ch),
                    Present::Done => {}
                }
            }
            if list {
                self.retired = keep;
            } else {
                self.queue = keep;
            }
        }
        Ok(switched)
    }

    /// The process contexts built so far.
    pub fn contexts(&self) -> &Contexts {
        &self.contexts
    }

    /// The context a channel currently decodes with.
    pub fn current_context(&self, channel: ChannelId) -> Option<ContextId> {
        self.channels.get(channel.0)?.state.context
    }

    /// Why a channel stopped before the end of its data, if it did.
    pub fn channel_stop(&self, channel: ChannelId) -> Option<record::Error> {
        self.channels.get(channel.0)?.state.stop
    }

    fn pop_due(&mut self, tsc: Tsc) -> Option<usize> {
        let ch = *self.queue.first()?;
        let pending = self.channels[ch].state.pending?;
        if tsc < pending.tsc {
            return None;
        }
        self.queue.remove(0);
        Some(ch)
    }

    fn enqueue(&mut self, ch: usize) {
        let Some(tsc) = self.channels[ch].state.pending.map(|p| p.tsc) else {
            return;
        };
        let at = self
            .queue
            .iter()
            .position(|&other| {
                self.channels[other]
                    .state
                    .pending
                    .is_none_or(|p| tsc <= p.tsc)
            })
            .unwrap_or(self.queue.len());
        self.queue.insert(at, ch);
    }

    fn diagnose(&self, ch: usize, kind: DiagnosticKind, out: &mut dyn Write) -> io::Result<()> {
        let channel = &self.channels[ch];
        let d = Diagnostic {
            filename: channel.source.filename.clone(),
            offset: SidebandOffset(channel.state.current as u64),
            kind,
        };
        if !d.is_warning() || self.output.warnings {
            d.write_to(out)?;
        }
        Ok(())
    }

    fn fetch(&mut self, ch: usize, out: &mut dyn Write) -> io::Result<Fetch> {
        let Channel { source, state } = &mut self.channels[ch];
        let pos = state.next;
        state.current = pos;
        state.pending = None;
        let Some(bytes) = source.data.get(pos..).filter(|b| !b.is_empty()) else {
            return Ok(Fetch::End);
        };
        let record =
            match parse_record(bytes, SidebandOffset(pos as u64), source.config.sample_type) {
                Ok(r) => r,
                Err(e) if e.kind.is_end_of_stream() => {
                    state.stop = Some(e);
                    return Ok(Fetch::End);
                }
                Err(e) => {
                    state.stop = Some(e);
                    self.diagnose(ch, DiagnosticKind::Record(e.kind), out)?;
                    return Ok(Fetch::Failed);
                }
            };
        let size = record.raw.len();
        let tsc = match record.sample.time {
            None => Tsc(0),
            Some(time) => match source.config.time.time_to_tsc(time) {
                Ok(tsc) => apply_tsc_offset(tsc, source.config.tsc_offset),
                Err(_) => {
                    self.diagnose(ch, DiagnosticKind::BadConfig, out)?;
                    return Ok(Fetch::Failed);
                }
            },
        };
        state.next = pos + size;
        state.pending = Some(Pending { offset: pos, tsc });
        Ok(Fetch::Ok)
    }

    fn print_pending(&self, ch: usize, out: &mut dyn Write) -> io::Result<()> {
        let Channel { source, state } = &self.channels[ch];
        let Some(pending) = state.pending else {
            return Ok(());
        };
        if let Some(record) = reparse(source, pending) {
            let tsc = record.sample.time.map(|_| pending.tsc);
            print_record(out, &record, tsc, &source.filename, self.output.records)?;
        }
        Ok(())
    }

    /// Applies the pending record of `ch` (libipt's
    /// `pt_sb_pevent_apply_event_record`).
    fn apply_pending(&mut self, ch: usize, out: &mut dyn Write) -> io::Result<Option<ContextId>> {
        let Channel { source, state } = &mut self.channels[ch];
        let Some(pending) = state.pending else {
            return Ok(None);
        };
        let Some(record) = reparse(source, pending) else {
            return Ok(None);
        };
        let primary = source.config.primary;
        let mut effects = Effects::default();
        match record.body {
            Body::ItraceStart(i) if primary => {
                let id = self.contexts.get_or_create(i.pid);
                prepare_switch(state, id);
                if state.next_context.is_some() {
                    effects.switch_now = true;
                }
            }
            // A new thread of a known process changes nothing; a new
            // process starts with its parent's image.
            Body::Fork(task) if task.ppid != task.pid => {
                if task.pid != task.tid {
                    effects.diagnostic = Some(DiagnosticKind::Inconsistent);
                } else {
                    self.contexts.remove_pid(task.pid);
                    let child = self.contexts.get_or_create(task.pid);
                    if let Some(parent) = self.contexts.find(task.ppid) {
                        self.contexts.copy_image(child, parent);
                    }
                }
            }
            Body::Comm(c) if record.header.misc & misc::COMM_EXEC != 0 => {
                self.contexts.remove_pid(c.pid);
                let id = self.contexts.get_or_create(c.pid);
                if primary {
                    prepare_switch(state, id);
                }
            }
            Body::Switch if primary && !record.is_switch_out() => match record.sample.pid() {
                Some(pid) => {
                    let id = self.contexts.get_or_create(pid);
                    prepare_switch(state, id);
                }
                None => effects.diagnostic = Some(DiagnosticKind::BadConfig),
            },
            Body::SwitchCpuWide(s) if primary => {
                let pid = if record.is_switch_out() {
                    Some(s.next_prev_pid)
                } else {
                    record.sample.pid()
                };
                if let Some(pid) = pid {
                    let id = self.contexts.get_or_create(pid);
                    prepare_switch(state, id);
                }
            }
            Body::Mmap(m) if !is_kernel_mmap(record.header.misc) => {
                effects.diagnostic = map_file(
                    &mut self.contexts,
                    &source.config,
                    m.pid,
                    m.filename,
                    m.pgoff,
                    m.len,
                    m.addr,
                );
            }
            Body::Mmap2(m) if !is_kernel_mmap(record.header.misc) => {
                effects.diagnostic = map_file(
                    &mut self.contexts,
                    &source.config,
                    m.pid,
                    m.filename,
                    m.pgoff,
                    m.len,
                    m.addr,
                );
            }
            Body::Lost(_) => effects.diagnostic = Some(DiagnosticKind::SidebandLost),
            Body::Aux(aux) if primary && aux.truncated() => {
                effects.diagnostic = Some(DiagnosticKind::TraceLost);
            }
            _ => {}
        }
        if let Some(kind) = effects.diagnostic {
            self.diagnose(ch, kind, out)?;
        }
        if effects.switch_now {
            return self.switch_contexts(ch, out);
        }
        Ok(None)
    }

    /// libipt's `pt_sb_pevent_apply` for a record that is not due: location
    /// tracking and postponed context switches.
    fn track_location(
        &mut self,
        ch: usize,
        event: TraceEvent,
        out: &mut dyn Write,
    ) -> io::Result<Present> {
        let Channel { source, state } = &mut self.channels[ch];
        let kernel_start = source.config.kernel_start;
        let old = state.location;
        state.location = location_from(event.hint, old, kernel_start);
        if state.next_context.is_none() {
            return Ok(if state.pending.is_none() {
                Present::Done
            } else {
                Present::Keep
            });
        }
        if (old.kernelish() || state.location.kernelish())
            && let Some(id) = self.switch_contexts(ch, out)?
        {
            return Ok(Present::Switched(id));
        }
        Ok(Present::Keep)
    }

    fn switch_contexts(&mut self, ch: usize, out: &mut dyn Write) -> io::Result<Option<ContextId>> {
        let state = &mut self.channels[ch].state;
        let Some(next) = state.next_context.take() else {
            return Ok(None);
        };
        state.context = Some(next);
        if self.output.switches
            && let Some(ctx) = self.contexts.get(next)
        {
            writeln!(out, "[context: {}]", ctx.name())?;
        }
        Ok(Some(next))
    }
}

#[derive(Default)]
struct Effects {
    diagnostic: Option<DiagnosticKind>,
    switch_now: bool,
}

enum Present {
    Keep,
    Switched(ContextId),
    Done,
}

fn reparse(source: &Source, pending: Pending) -> Option<Record<'_>> {
    let bytes = source.data.get(pending.offset..)?;
    parse_record(
        bytes,
        SidebandOffset(pending.offset as u64),
        source.config.sample_type,
    )
    .ok()
}

fn prepare_switch(state: &mut State, id: ContextId) {
    if state.next_context == Some(id) {
        return;
    }
    state.next_context = None;
    if state.context == Some(id) {
        return;
    }
    state.next_context = Some(id);
}

/// Kernel MMAPs are ignored: the kernel is decoded from kcore, not from the
/// (boot-time patched) files on disk.
fn is_kernel_mmap(misc_bits: u16) -> bool {
    misc_bits & misc::CPUMODE_MASK == misc::KERNEL
}

fn location_from(hint: LocationHint, previous: Location, kernel_start: Ip) -> Location {
    let at = |ip: Ip| {
        if ip.0 < kernel_start.0 {
            Location::User
        } else {
            Location::Kernel
        }
    };
    let flip = |from: Location| match from {
        Location::Kernel | Location::LikelyKernel => Location::LikelyUser,
        Location::User | Location::LikelyUser => Location::LikelyKernel,
        Location::Unknown => Location::Unknown,
    };
    match hint {
        LocationHint::Ip(ip) => at(ip),
        LocationHint::DisabledSuppressed => flip(previous),
        LocationHint::AsyncDisabledSuppressed { from } => flip(at(from)),
        LocationHint::Paging => Location::LikelyKernel,
        LocationHint::None => Location::Unknown,
    }
}

/// libipt's `pt_sb_pevent_map`: special file names, sysroot, vDSO, ABI.
fn map_file(
    contexts: &mut Contexts,
    config: &ChannelConfig,
    pid: u32,
    filename: &[u8],
    offset: u64,
    size: u64,
    vaddr: u64,
) -> Option<DiagnosticKind> {
    let id = contexts.get_or_create(pid);
    let name = String::from_utf8_lossy(filename);
    let path = if name.starts_with('[') {
        if name != "[vdso]" {
            return Some(DiagnosticKind::SectionLost);
        }
        let abi = contexts.get(id).map(|c| c.abi()).unwrap_or_default();
        let vdso = match abi {
            Abi::Unknown => None,
            Abi::X64 => config.vdso_x64.as_deref(),
            Abi::X32 => config.vdso_x32.as_deref(),
            Abi::Ia32 => config.vdso_ia32.as_deref(),
        };
        match vdso {
            Some(vdso) => vdso.to_owned(),
            None => return Some(DiagnosticKind::BadConfig),
        }
    } else if name == "//anon" || name.contains(" (deleted)") {
        return Some(DiagnosticKind::SectionLost);
    } else if let Some(sysroot) = &config.sysroot {
        format!("{sysroot}{name}")
    } else {
        name.into_owned()
    };
    contexts.track_abi(id, || elf_abi(Path::new(&path)));
    contexts.map(
        id,
        Mapping {
            filename: path,
            offset,
            size,
            vaddr: Ip(vaddr),
        },
    );
    None
}

fn load_range(path: &Path, range: FileRange) -> Result<Vec<u8>, LoadError> {
    let err = |kind| LoadError {
        path: path.to_owned(),
        kind,
    };
    let data = std::fs::read(path).map_err(|e| err(LoadErrorKind::Io(e)))?;
    let size = data.len() as u64;
    if range.begin > size {
        return Err(err(LoadErrorKind::BadOffset {
            begin: range.begin,
            size,
        }));
    }
    let end = range.end.map_or(size, |e| e.min(size));
    // begin <= size and end <= size, both fit in usize since `data` exists.
    Ok(data
        .get(range.begin as usize..end as usize)
        .map(<[u8]>::to_vec)
        .unwrap_or_default())
}
