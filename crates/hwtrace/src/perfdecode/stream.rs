//! One AUX queue decoded and printed: the items of its runs
//! ([`super::queue`]) as instructions or branches of the thread running,
//! errors blamed on missing code, gaps reported.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Write;

use anyhow::Result;
use hwtrace_flow::insn::FastDecoder;
use hwtrace_flow::parallel::{FastSource, ParallelConfig};
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::{AuxQueue, FileOffset, IntelPtInfo, QueueKey, TscConversion};
use serde_json::json;

use super::image::{self, ImageOptions};
use super::kernel::Kernel;
use super::queue::{QueueFlow, runs};
use super::sideband::Sideband;
use super::symbols::Names;
use crate::flow::counted;
use crate::flow::{Branches, Item, RunEndItems};
use crate::ptdump::cpu::Cpu;

/// Contiguous AUXTRACE buffers are joined (a packet may straddle two) up to
/// this many bytes; a longer run is decoded in pieces of this size, each
/// from its first PSB.
pub const MAX_JOIN: usize = 64 << 20;

/// What to print.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One `tid cpu ip` line per instruction.
    Insns,
    /// One `tid cpu from -> to kind` line per taken branch.
    Branches,
    /// Counts per stream only.
    Stats,
}

/// `hwtrace perf decode`'s settings.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the mapped files are.
    pub image: ImageOptions,
    /// What to print.
    pub format: Format,
    /// JSON objects instead of text lines.
    pub json: bool,
    /// Each line with its perf time.
    pub time: bool,
    /// Threads for a counted decode ([`Format::Stats`]) of a stream whose
    /// code image never changes.
    pub jobs: usize,
    /// The least trace bytes of a parallel work unit (the default when
    /// `None`).
    pub unit_bytes: Option<u64>,
}

/// The decoder settings the recording used: AUXTRACE_INFO's words applied
/// to the intel_pt event's `config`.
#[derive(Clone, Copy, Debug)]
pub struct PtSettings {
    /// Decoder configuration (MTC frequency, TSC:CTC ratio, nominal ratio).
    pub config: Config,
    /// Whether returns were compressed (`noretcomp` clear).
    pub return_compression: bool,
    /// TSC → perf time.
    pub tsc: TscConversion,
}

/// Perf time of a TSC value (perf's `tsc_to_perf_time`).
pub fn perf_time(c: &TscConversion, tsc: u64) -> u64 {
    let shift = u32::from(c.time_shift.min(63));
    let quot = u128::from(tsc >> shift);
    let rem = u128::from(tsc & ((1u64 << shift) - 1));
    let mult = u128::from(c.time_mult);
    let t = u128::from(c.time_zero) + quot * mult + ((rem * mult) >> shift);
    u64::try_from(t).unwrap_or(u64::MAX)
}

impl PtSettings {
    /// A recording's settings: AUXTRACE_INFO `info`, the intel_pt event's
    /// `config` among `attrs`, the errata workarounds of the processor
    /// `cpu` names (asked for) or else of the one the `cpuid` header names
    /// (`GenuineIntel,6,85,4`), and tracing's status read as perf does
    /// when `lenient`. `who` names the command in a warning about a
    /// processor asked for that the errata table does not know.
    pub fn for_recording(
        info: &IntelPtInfo,
        attrs: &[EventAttr],
        cpuid: Option<&[u8]>,
        cpu: Option<Cpu>,
        lenient: bool,
        who: &str,
    ) -> Self {
        let event_config = attrs
            .iter()
            .find(|a| a.attr.kind == info.pmu_type)
            .map(|a| a.attr.config);
        let mut settings = Self::new(info, event_config);
        settings.config.lenient_status = lenient;
        let recorded = || Cpu::from_perf_cpuid(std::str::from_utf8(cpuid?).ok()?);
        if let Some(c) = cpu.or_else(recorded) {
            match crate::cmd::flow::with_errata(settings.config, c) {
                Some(config) => settings.config = config,
                // Only a processor asked for is worth a word: the
                // recording's own may be newer than the table.
                None if cpu.is_some() => eprintln!(
                    "{who}: warning: no Intel PT errata known for cpu {}/{}: decoding without workarounds",
                    c.family, c.model
                ),
                None => {}
            }
        }
        settings
    }

    /// From AUXTRACE_INFO and the event's `config` (`None`: not found).
    pub fn new(info: &IntelPtInfo, event_config: Option<u64>) -> Self {
        let cfg = event_config.unwrap_or(0);
        let field = |mask: Option<u64>| {
            mask.filter(|&m| m != 0)
                .map_or(0, |m| (cfg & m) >> m.trailing_zeros())
        };
        let mut config = Config::default();
        config.time.mtc_freq = u8::try_from(field(info.mtc_freq_bits)).unwrap_or(0);
        config.time.nom_freq = u8::try_from(info.max_non_turbo_ratio.unwrap_or(0)).unwrap_or(0);
        config.time.cpuid_0x15_eax = u32::try_from(info.tsc_ctc_ratio_d.unwrap_or(0)).unwrap_or(0);
        config.time.cpuid_0x15_ebx = u32::try_from(info.tsc_ctc_ratio_n.unwrap_or(0)).unwrap_or(0);
        Self {
            config,
            return_compression: cfg & info.noretcomp_bit == 0,
            tsc: info.tsc,
        }
    }
}

/// What decoding one queue found.
#[derive(Clone, Debug, Default)]
pub struct QueueReport {
    /// Instructions decoded.
    pub insns: u64,
    /// Branches printed (with `--branches`).
    pub branches: u64,
    /// Decode errors (each followed by a resynchronisation).
    pub errors: u64,
    /// Trace bytes not decoded after errors.
    pub skipped_bytes: u64,
    /// Bytes lost between AUXTRACE buffers.
    pub lost_bytes: u64,
    /// Anything the user should know went wrong.
    pub problems: u64,
    /// BTS: all-zero records skipped (the kernel's padding).
    pub padding_records: u64,
}

/// A thread or CPU as printed: the number, `?` when unknown, `-` for
/// perf's -1 ("none"); no allocation per line.
#[derive(Clone, Copy)]
pub(super) enum Shown {
    Num(u32),
    Unknown,
    NoneSet,
}

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Num(n) => write!(f, "{n}"),
            Self::Unknown => f.write_str("?"),
            Self::NoneSet => f.write_str("-"),
        }
    }
}

pub(super) fn show(v: u32) -> Shown {
    if v == u32::MAX {
        Shown::NoneSet
    } else {
        Shown::Num(v)
    }
}

/// `--time`'s column of a text line, written in place (no string per
/// line): perf time in seconds with nine decimals, as `perf script` prints
/// it, `-` before the trace told a time, nothing without `--time`.
#[derive(Clone, Copy)]
enum TimeColumn {
    Off,
    Unknown,
    Ns(u64),
}

impl TimeColumn {
    /// The time for JSON's `time` field, in nanoseconds.
    fn ns(self) -> Option<u64> {
        match self {
            Self::Ns(ns) => Some(ns),
            Self::Off | Self::Unknown => None,
        }
    }
}

impl std::fmt::Display for TimeColumn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => Ok(()),
            Self::Unknown => f.write_str("- "),
            Self::Ns(ns) => write!(f, "{}.{:09} ", ns / 1_000_000_000, ns % 1_000_000_000),
        }
    }
}

/// Per missing mapping: decoding stops inside it and trace bytes skipped.
#[derive(Clone, Debug)]
struct Blame {
    missing: image::Missing,
    stops: u64,
    skipped: u64,
}

/// Decodes one queue ([`QueueFlow`]) and prints its items.
pub struct QueueDecoder<'s> {
    flow: QueueFlow<'s>,
    printer: Printer<'s>,
}

/// What printing the items of one queue keeps.
struct Printer<'s> {
    key: QueueKey,
    opts: &'s Options,
    /// Per missing mapping (by MMAP record offset).
    blame: BTreeMap<FileOffset, Blame>,
    /// The missing mapping the last error fell in.
    last_blamed: Option<FileOffset>,
    report: QueueReport,
    /// Errors that are PSB+ status updates contradicting the decoded
    /// state, and whether the decode reads status as perf does (then
    /// there are none).
    status_errors: u64,
    lenient: bool,
    /// TSC → perf time, and the TSC of the last event that carried one
    /// (what instructions are stamped with, as ptxed does).
    tsc: TscConversion,
    now: Option<u64>,
}

impl<'s> QueueDecoder<'s> {
    /// Works out the thread and builds the images (file build ids read
    /// through `build_ids`); `diag` hears how instructions are attributed.
    pub fn new(
        key: QueueKey,
        sb: &'s Sideband,
        settings: PtSettings,
        opts: &'s Options,
        kernel: &Kernel,
        build_ids: &mut image::BuildIdCache,
        diag: &mut dyn Write,
    ) -> Result<Self> {
        let flow = QueueFlow::new(key, sb, settings, &opts.image, kernel, build_ids)?;
        if let Some(n) = flow.unattributed_threads() {
            writeln!(
                diag,
                "hwtrace perf decode: {key}: {n} threads ran on this CPU and no timed switch records say when: its instructions are shown with tid ?"
            )?;
        }
        Ok(Self {
            flow,
            printer: Printer {
                key,
                opts,
                blame: BTreeMap::new(),
                last_blamed: None,
                report: QueueReport::default(),
                status_errors: 0,
                lenient: settings.config.lenient_status,
                tsc: settings.tsc,
                now: None,
            },
        })
    }

    /// Decodes the queue's buffers, writing instructions or branches to
    /// `out` and diagnostics to `diag`; `names` names addresses (`--sym`).
    pub fn run(
        mut self,
        queue: &AuxQueue<'_>,
        names: Option<&mut Names<'_>>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<QueueReport> {
        let key = self.flow.key();
        let mut names = names;
        for g in &queue.gaps {
            self.printer.report.lost_bytes += g.lost_bytes();
            self.printer.report.problems += 1;
            writeln!(
                diag,
                "hwtrace perf decode: {key}: lost {} bytes of trace at stream offset {:#x} (before the AUXTRACE record at file offset {}): aux offset {:#x} expected, {:#x} found",
                g.lost_bytes(),
                g.stream_offset,
                g.record_offset,
                g.expected_aux_offset,
                g.found_aux_offset
            )?;
        }
        for run in runs(queue) {
            self.decode_run(&run.trace, run.start, names.as_deref_mut(), out, diag)?;
        }
        self.printer.report_missing(diag)?;
        Ok(self.printer.report)
    }

    fn decode_run(
        &mut self,
        trace: &[u8],
        start: u64,
        mut names: Option<&mut Names<'_>>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        let format = self.printer.opts.format;
        let flow = &self.flow;
        let printer = &mut self.printer;
        let len = trace.len() as u64;
        let mut each =
            |item: Item| printer.item(item, flow, start, len, names.as_deref_mut(), out, diag);
        match format {
            Format::Branches => {
                // Runs by their ends: no instruction count is printed.
                let passed = Cell::new(0);
                Branches::new(RunEndItems::new(flow.runs(trace), &passed)).try_for_each(&mut each)
            }
            Format::Insns => flow.items(trace).try_for_each(&mut each),
            Format::Stats => match flow.fixed_image() {
                // One image throughout: counted on every core, the
                // failures reported in order.
                Some(image) => {
                    let opts = printer.opts;
                    let mut parallel = ParallelConfig::counting(opts.jobs, len);
                    if let Some(unit) = opts.unit_bytes {
                        parallel.unit_bytes = unit;
                    }
                    let config = flow.config();
                    let make = || {
                        let dec = FastDecoder::new(trace, config, image);
                        FastSource::counting(dec, parallel.max_stall).untimed()
                    };
                    let mut reported = Ok(());
                    counted::count(trace, opts.jobs, &parallel, make, |t| {
                        printer.report.insns += t.stats.insns;
                        for f in t.failures {
                            if reported.is_ok() {
                                reported = printer.item(
                                    f,
                                    flow,
                                    start,
                                    len,
                                    names.as_deref_mut(),
                                    out,
                                    diag,
                                );
                            }
                        }
                    });
                    reported
                }
                // The image follows timed events, which counting passes
                // over: plain code passed over a run at a time, every event
                // an item.
                None => {
                    let mut items = flow.runs(trace);
                    let mut skipped = 0;
                    loop {
                        skipped += items.skip_runs();
                        let Some(item) = items.next() else { break };
                        each(item)?;
                    }
                    printer.report.insns += skipped;
                    Ok(())
                }
            },
        }
    }

    /// The mappings that could not be loaded, over all images (reported by
    /// the caller before decoding; the same mapping may be listed twice).
    pub fn missing(&self) -> impl Iterator<Item = &image::Missing> {
        self.flow.missing()
    }
}

impl Printer<'_> {
    #[allow(clippy::too_many_arguments)]
    fn item(
        &mut self,
        item: Item,
        flow: &QueueFlow<'_>,
        start: u64,
        len: u64,
        names: Option<&mut Names<'_>>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        let key = self.key;
        let tid = flow.tid();
        let tid_text = tid.map_or(Shown::Unknown, Shown::Num);
        match item {
            Item::Insn { insn, .. } => {
                self.report.insns += 1;
                if self.opts.format != Format::Insns {
                    return Ok(());
                }
                let sym = names.map(|n| {
                    let pid = n.pid_of(tid);
                    n.name(pid, insn.ip)
                });
                let time = self.time_column(self.now);
                if self.opts.json {
                    let mut v = json!({"tid": tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu), "ip": format!("{:#x}", insn.ip)});
                    if let Some(sym) = sym {
                        v["sym"] = json!(sym);
                    }
                    if let Some(t) = time.ns() {
                        v["time"] = json!(t);
                    }
                    writeln!(out, "{v}")?;
                } else {
                    let sym = sym.map(|s| format!(" ({})", s.as_deref().unwrap_or("?")));
                    writeln!(
                        out,
                        "{} {} {}{:x}{}",
                        tid_text,
                        show(key.cpu),
                        time,
                        insn.ip,
                        sym.as_deref().unwrap_or("")
                    )?;
                }
            }
            Item::Branch(b) => {
                self.report.branches += 1;
                let hex = |v: Option<u64>| v.map_or("0".into(), |v| format!("{v:x}"));
                let syms = names.map(|n| {
                    let pid = n.pid_of(tid);
                    let mut name = |a: Option<u64>| a.and_then(|a| n.name(pid, a));
                    (name(b.from), name(b.to))
                });
                let time = self.time_column(b.has_tsc.then_some(b.time));
                if self.opts.json {
                    let mut v = json!({"tid": tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu),
                        "from": b.from.map(|v| format!("{v:#x}")), "to": b.to.map(|v| format!("{v:#x}")), "kind": b.kind.name()});
                    if let Some((f, t)) = syms {
                        v["from_sym"] = json!(f);
                        v["to_sym"] = json!(t);
                    }
                    if let Some(t) = time.ns() {
                        v["time"] = json!(t);
                    }
                    writeln!(out, "{v}")?;
                } else {
                    let (fs, ts) = match &syms {
                        Some((f, t)) => (
                            format!(" ({})", f.as_deref().unwrap_or("?")),
                            format!(" ({})", t.as_deref().unwrap_or("?")),
                        ),
                        None => (String::new(), String::new()),
                    };
                    writeln!(
                        out,
                        "{} {} {}{}{fs} -> {}{ts} {}",
                        tid_text,
                        show(key.cpu),
                        time,
                        hex(b.from),
                        hex(b.to),
                        b.kind.name()
                    )?;
                }
            }
            Item::Error(e) => {
                self.report.errors += 1;
                self.status_errors += u64::from(e.kind == ErrorKind::BadStatusUpdate);
                self.last_blamed = None;
                let image = flow.image();
                let missing = match (e.kind, e.ip) {
                    (ErrorKind::NoMap | ErrorKind::BadInsn, Some(ip)) => image.missing_at(ip),
                    _ => None,
                };
                if let Some(i) = missing {
                    // Said once per mapping, with totals, at the end.
                    let m = &image.missing[i];
                    let at = m.mapping.record_offset;
                    self.blame
                        .entry(at)
                        .or_insert_with(|| Blame {
                            missing: m.clone(),
                            stops: 0,
                            skipped: 0,
                        })
                        .stops += 1;
                    self.last_blamed = Some(at);
                } else {
                    self.report.problems += 1;
                    writeln!(
                        diag,
                        "hwtrace perf decode: {key}: error at stream offset {:#x}{}: {}",
                        start + e.offset.0,
                        e.ip.map_or(String::new(), |ip| format!(", ip {ip:#x}")),
                        e.kind
                    )?;
                }
            }
            Item::Resync { from, to } => {
                let skipped = to.unwrap_or(len).saturating_sub(from);
                self.report.skipped_bytes += skipped;
                if let Some(b) = self
                    .last_blamed
                    .take()
                    .and_then(|at| self.blame.get_mut(&at))
                {
                    b.skipped += skipped;
                } else {
                    writeln!(
                        diag,
                        "hwtrace perf decode: {key}: {skipped} trace bytes from stream offset {:#x} not decoded",
                        start + from
                    )?;
                }
            }
            Item::Stuck { offset, ip, insns } => {
                self.report.problems += 1;
                writeln!(
                    diag,
                    "hwtrace perf decode: {key}: {insns} instructions up to ip {ip:#x} without trace at stream offset {:#x}: an endless loop, left at the next PSB",
                    start + offset
                )?;
            }
            Item::Event { event, .. } => {
                if event.has_tsc {
                    self.now = Some(event.tsc);
                }
            }
            Item::Block(_) => {}
        }
        Ok(())
    }

    /// The time column of a line stamped with `tsc` (`None`: no TSC seen).
    fn time_column(&self, tsc: Option<u64>) -> TimeColumn {
        match (self.opts.time, tsc) {
            (false, _) => TimeColumn::Off,
            (true, Some(t)) => TimeColumn::Ns(perf_time(&self.tsc, t)),
            (true, None) => TimeColumn::Unknown,
        }
    }

    fn report_missing(&mut self, diag: &mut dyn Write) -> Result<()> {
        let key = self.key;
        if self.status_errors > 0 && !self.lenient {
            writeln!(
                diag,
                "hwtrace perf decode: {key}: {}",
                crate::flow::status_error_hint(self.status_errors, "perf script decodes")
            )?;
        }
        for b in self.blame.values() {
            let m = &b.missing;
            self.report.problems += 1;
            writeln!(
                diag,
                "hwtrace perf decode: {key}, pid {}: cannot decode code of {} mapped at {:#x}-{:#x} (MMAP record at file offset {}): {}; its instructions could not be decoded: decoding stopped {} times inside it and {} trace bytes were skipped (to the next PSB or the end)",
                m.mapping.pid,
                m.path,
                m.mapping.addr,
                m.mapping.addr.wrapping_add(m.mapping.len),
                m.mapping.record_offset,
                m.reason,
                b.stops,
                b.skipped
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_time_is_perfs_tsc_conversion() {
        let c = TscConversion {
            time_shift: 10,
            time_mult: 3 << 9, // 1.5 ns per tick
            time_zero: 1000,
            cap_user_time_zero: true,
        };
        assert_eq!(perf_time(&c, 0), 1000);
        assert_eq!(perf_time(&c, 2), 1003);
        assert_eq!(perf_time(&c, 1 << 40), 1000 + (1 << 40) / 2 * 3);
        // No overflow at the top of the range.
        let big = TscConversion {
            time_shift: 0,
            time_mult: u32::MAX,
            time_zero: u64::MAX,
            cap_user_time_zero: true,
        };
        assert_eq!(perf_time(&big, u64::MAX), u64::MAX);
    }
}
