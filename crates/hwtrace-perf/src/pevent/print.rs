//! Printing records the way libipt-sb prints them (ptdump/ptxed `--sb:*`).
//!
//! One record is one line in compact form:
//!
//! ```text
//! [FILE[:OFFSET]  |OFFSET  ][TSC  ]PERF_RECORD_NAME  FIELDS  { SAMPLES }
//! ```
//!
//! `FILE` with `--sb:filename`, `OFFSET` (`%016x`, from the start of the loaded
//! range) with `--sb:offset`, `TSC` (`%016x`, after conversion and tsc-offset)
//! with `--sb:time` when the record has a time sample. The verbose form
//! (`--sb:verbose`) puts the record name on that line and each field, then each
//! sample, on its own line indented by two spaces. Numbers are lower-case hex
//! without prefix; strings are printed as their raw bytes.

use std::io::{self, Write};

use hwtrace_types::Tsc;

use super::record::{Body, Record, misc};

/// What to print for each record (libipt's `ptsbp_*` flags).
///
/// Both `compact` and `verbose` may be set (libipt then prints both forms);
/// the command-line options make them exclusive. With no flag set nothing is
/// printed, not even a newline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintFlags {
    /// `--sb:compact` (or `--sb`): one line per record.
    pub compact: bool,
    /// `--sb:verbose`: one line per field.
    pub verbose: bool,
    /// `--sb:filename`: prefix the sideband file name.
    pub filename: bool,
    /// `--sb:offset`: prefix the record's offset in the sideband file.
    pub offset: bool,
    /// `--sb:time`: prefix the record's TSC, if it has a time sample.
    pub time: bool,
}

impl PrintFlags {
    /// Whether anything gets printed at all.
    pub fn any(&self) -> bool {
        self.compact || self.verbose || self.filename || self.offset || self.time
    }
}

/// Prints one record.
///
/// `tsc` is the record's converted time stamp (present when the record has a
/// time sample); `filename` is the sideband file name as given on the command
/// line, without its range suffix.
pub fn print_record(
    out: &mut dyn Write,
    record: &Record<'_>,
    tsc: Option<Tsc>,
    filename: &str,
    flags: PrintFlags,
) -> io::Result<()> {
    match (flags.filename, flags.offset) {
        (true, true) => write!(out, "{filename}:{:016x}  ", record.offset.0)?,
        (true, false) => write!(out, "{filename}  ")?,
        (false, true) => write!(out, "{:016x}  ", record.offset.0)?,
        (false, false) => {}
    }
    if flags.time
        && let Some(tsc) = tsc
    {
        write!(out, "{:016x}  ", tsc.0)?;
    }
    if flags.compact {
        print_compact(out, record)?;
        print_samples_compact(out, record)?;
    }
    if flags.verbose {
        print_verbose(out, record)?;
        print_samples_verbose(out, record)?;
    }
    if flags.any() {
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// The record's name as libipt prints it, including the `.EXEC`,
/// `.TRUNCATED`, `.IN`/`.OUT` suffixes (`UNKNOWN` for other types).
pub fn record_name(record: &Record<'_>) -> &'static str {
    let out = record.header.misc & misc::SWITCH_OUT != 0;
    match &record.body {
        Body::Mmap(_) => "PERF_RECORD_MMAP",
        Body::Mmap2(_) => "PERF_RECORD_MMAP2",
        Body::Lost(_) => "PERF_RECORD_LOST",
        Body::Comm(_) if record.header.misc & misc::COMM_EXEC != 0 => "PERF_RECORD_COMM.EXEC",
        Body::Comm(_) => "PERF_RECORD_COMM",
        Body::Exit(_) => "PERF_RECORD_EXIT",
        Body::Fork(_) => "PERF_RECORD_FORK",
        Body::Throttle(_) => "PERF_RECORD_THROTTLE",
        Body::Unthrottle(_) => "PERF_RECORD_UNTHROTTLE",
        Body::Aux(aux) if aux.truncated() => "PERF_RECORD_AUX.TRUNCATED",
        Body::Aux(_) => "PERF_RECORD_AUX",
        Body::ItraceStart(_) => "PERF_RECORD_ITRACE_START",
        Body::LostSamples(_) => "PERF_RECORD_LOST_SAMPLES",
        Body::Switch if out => "PERF_RECORD_SWITCH.OUT",
        Body::Switch => "PERF_RECORD_SWITCH.IN",
        Body::SwitchCpuWide(_) if out => "PERF_RECORD_SWITCH_CPU_WIDE.OUT",
        Body::SwitchCpuWide(_) => "PERF_RECORD_SWITCH_CPU_WIDE.IN",
        Body::Unknown(_) => "UNKNOWN",
    }
}

fn print_compact(out: &mut dyn Write, record: &Record<'_>) -> io::Result<()> {
    let name = record_name(record);
    match &record.body {
        Body::Mmap(m) => {
            write!(
                out,
                "{name}  {:x}/{:x}, {:x}, {:x}, {:x}, ",
                m.pid, m.tid, m.addr, m.len, m.pgoff
            )?;
            out.write_all(m.filename)
        }
        Body::Mmap2(m) => {
            write!(
                out,
                "{name}  {:x}/{:x}, {:x}, {:x}, {:x}, {:x}, {:x}, {:x}, {:x}, {:x}, {:x}, ",
                m.pid,
                m.tid,
                m.addr,
                m.len,
                m.pgoff,
                m.maj,
                m.min,
                m.ino,
                m.ino_generation,
                m.prot,
                m.flags
            )?;
            out.write_all(m.filename)
        }
        Body::Lost(l) => write!(out, "{name}  {:x}, {:x}", l.id, l.lost),
        Body::Comm(c) => {
            write!(out, "{name}  {:x}/{:x}, ", c.pid, c.tid)?;
            out.write_all(c.comm)
        }
        Body::Exit(t) | Body::Fork(t) => write!(
            out,
            "{name}  {:x}/{:x}, {:x}/{:x}, {:x}",
            t.pid, t.tid, t.ppid, t.ptid, t.time
        ),
        Body::Throttle(t) | Body::Unthrottle(t) => {
            write!(out, "{name}  {:x}, {:x}, {:x}", t.time, t.id, t.stream_id)
        }
        Body::Aux(a) => write!(
            out,
            "{name}  {:x}, {:x}, {:x}",
            a.aux_offset, a.aux_size, a.flags
        ),
        Body::ItraceStart(i) => write!(out, "{name}  {:x}/{:x}", i.pid, i.tid),
        Body::LostSamples(lost) => write!(out, "{name}  {lost:x}"),
        Body::Switch => write!(out, "{name}"),
        Body::SwitchCpuWide(s) => {
            write!(out, "{name}  {:x}/{:x}", s.next_prev_pid, s.next_prev_tid)
        }
        Body::Unknown(_) => write!(
            out,
            "{name} ({:x}, {:x})",
            record.header.kind, record.header.misc
        ),
    }
}

fn field(out: &mut dyn Write, label: &str, value: impl core::fmt::LowerHex) -> io::Result<()> {
    write!(out, "\n  {label}: {value:x}")
}

fn print_verbose(out: &mut dyn Write, record: &Record<'_>) -> io::Result<()> {
    out.write_all(record_name(record).as_bytes())?;
    match &record.body {
        Body::Mmap(m) => {
            field(out, "pid", m.pid)?;
            field(out, "tid", m.tid)?;
            field(out, "addr", m.addr)?;
            field(out, "len", m.len)?;
            field(out, "pgoff", m.pgoff)?;
            out.write_all(b"\n  filename: ")?;
            out.write_all(m.filename)
        }
        Body::Mmap2(m) => {
            field(out, "pid", m.pid)?;
            field(out, "tid", m.tid)?;
            field(out, "addr", m.addr)?;
            field(out, "len", m.len)?;
            field(out, "pgoff", m.pgoff)?;
            field(out, "maj", m.maj)?;
            field(out, "min", m.min)?;
            field(out, "ino", m.ino)?;
            field(out, "ino_generation", m.ino_generation)?;
            field(out, "prot", m.prot)?;
            field(out, "flags", m.flags)?;
            out.write_all(b"\n  filename: ")?;
            out.write_all(m.filename)
        }
        Body::Lost(l) => {
            field(out, "id", l.id)?;
            field(out, "lost", l.lost)
        }
        Body::Comm(c) => {
            field(out, "pid", c.pid)?;
            field(out, "tid", c.tid)?;
            out.write_all(b"\n  comm: ")?;
            out.write_all(c.comm)
        }
        Body::Exit(t) | Body::Fork(t) => {
            field(out, "pid", t.pid)?;
            field(out, "ppid", t.ppid)?;
            field(out, "tid", t.tid)?;
            field(out, "ptid", t.ptid)?;
            field(out, "time", t.time)
        }
        Body::Throttle(t) | Body::Unthrottle(t) => {
            field(out, "time", t.time)?;
            field(out, "id", t.id)?;
            field(out, "stream_id", t.stream_id)
        }
        Body::Aux(a) => {
            field(out, "aux offset", a.aux_offset)?;
            field(out, "aux size", a.aux_size)?;
            field(out, "flags", a.flags)
        }
        Body::ItraceStart(i) => {
            field(out, "pid", i.pid)?;
            field(out, "tid", i.tid)
        }
        Body::LostSamples(lost) => field(out, "lost", *lost),
        Body::Switch => Ok(()),
        Body::SwitchCpuWide(s) => {
            let dir = if record.is_switch_out() {
                "next"
            } else {
                "prev"
            };
            field(out, &format!("{dir} pid"), s.next_prev_pid)?;
            field(out, &format!("{dir} tid"), s.next_prev_tid)
        }
        Body::Unknown(_) => {
            field(out, "type", record.header.kind)?;
            field(out, "misc", record.header.misc)
        }
    }
}

fn print_samples_compact(out: &mut dyn Write, record: &Record<'_>) -> io::Result<()> {
    let s = &record.sample;
    out.write_all(b"  {")?;
    if let Some((pid, tid)) = s.pid_tid {
        write!(out, " {pid:x}/{tid:x}")?;
    }
    if let Some(time) = s.time {
        write!(out, " {time:x}")?;
    }
    if let Some(id) = s.id {
        write!(out, " {id:x}")?;
    }
    if let Some(cpu) = s.cpu {
        write!(out, " cpu-{cpu:x}")?;
    }
    if let Some(stream_id) = s.stream_id {
        write!(out, " {stream_id:x}")?;
    }
    if let Some(identifier) = s.identifier {
        write!(out, " {identifier:x}")?;
    }
    out.write_all(b" }")
}

fn print_samples_verbose(out: &mut dyn Write, record: &Record<'_>) -> io::Result<()> {
    let s = &record.sample;
    if let Some((pid, tid)) = s.pid_tid {
        field(out, "pid", pid)?;
        field(out, "tid", tid)?;
    }
    if let Some(time) = s.time {
        field(out, "time", time)?;
    }
    if let Some(id) = s.id {
        field(out, "id", id)?;
    }
    if let Some(cpu) = s.cpu {
        field(out, "cpu", cpu)?;
    }
    if let Some(stream_id) = s.stream_id {
        field(out, "stream id", stream_id)?;
    }
    if let Some(identifier) = s.identifier {
        field(out, "identifier", identifier)?;
    }
    Ok(())
}
