//! One AUX queue decoded: runs of contiguous AUXTRACE buffers through the
//! instruction decoder, instructions attributed to the queue's thread,
//! errors blamed on missing code, gaps reported.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::rc::Rc;

use anyhow::Result;
use hwtrace_flow::insn::InsnDecoder;
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_perf::data::{AuxQueue, FileOffset, IntelPtInfo, QueueKey, TscConversion};
use serde_json::json;

use super::drive::{Driver, Switcher};
use super::image::{self, ImageOptions, ProcessImage};
use super::kernel::Kernel;
use super::sideband::Sideband;
use super::symbols::Names;
use crate::flow::{Branches, Item};

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

/// Per missing mapping: decoding stops inside it and trace bytes skipped.
#[derive(Clone, Debug)]
struct Blame {
    missing: image::Missing,
    stops: u64,
    skipped: u64,
}

/// The thread and image at each timed event: on a per-CPU queue the
/// thread switched in last at the event's perf time runs (per-thread
/// queues have theirs), with the image of its process's program at that
/// time (an exec starts a new one).
struct Timeline<'s> {
    sb: &'s Sideband,
    cpu: u32,
    /// The queue's thread, on per-thread queues.
    fixed_tid: Option<u32>,
    tsc: TscConversion,
    /// Image index per process and program (see
    /// [`Sideband::generation_at`]).
    image_of: BTreeMap<(u32, usize), usize>,
    tid: Rc<Cell<Option<u32>>>,
    current: Rc<Cell<usize>>,
}

impl Switcher for Timeline<'_> {
    fn at_tsc(&mut self, tsc: u64) -> Option<usize> {
        let time = perf_time(&self.tsc, tsc);
        let tid = match self.fixed_tid {
            Some(t) => t,
            None => self.sb.thread_at(self.cpu, time)?,
        };
        self.tid.set(Some(tid));
        let &pid = self.sb.pid_of.get(&tid)?;
        let generation = self.sb.generation_at(pid, time);
        let i = *self.image_of.get(&(pid, generation))?;
        (i != self.current.get()).then(|| {
            self.current.set(i);
            i
        })
    }
}

/// No timeline (a queue with one thread, or none known): nothing
/// switches.
impl Switcher for Option<Timeline<'_>> {
    fn at_tsc(&mut self, tsc: u64) -> Option<usize> {
        self.as_mut()?.at_tsc(tsc)
    }
}

/// Decodes one queue.
pub struct QueueDecoder<'s> {
    key: QueueKey,
    /// The thread running (changed by the timeline at timed events).
    tid: Rc<Cell<Option<u32>>>,
    /// Queues with a time line (per-CPU queues with timed switch records,
    /// processes that exec'd): the sideband, and the queue's own thread on
    /// per-thread queues.
    timeline: Option<(&'s Sideband, Option<u32>)>,
    /// Image 0 holds the code of every process that may run here (the
    /// fallback before the first timed event and for threads of unknown
    /// process); with a timeline, image `i > 0` holds one program's.
    images: Vec<ProcessImage>,
    image_of: BTreeMap<(u32, usize), usize>,
    /// The image decoding uses now.
    current: Rc<Cell<usize>>,
    settings: PtSettings,
    opts: &'s Options,
    /// Per missing mapping (by MMAP record offset).
    blame: BTreeMap<FileOffset, Blame>,
    /// The missing mapping the last error fell in.
    last_blamed: Option<FileOffset>,
    report: QueueReport,
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
        let has_time = settings.tsc.cap_user_time_zero || settings.tsc.time_mult != 0;
        let switched = key.tid == u32::MAX
            && key.cpu != u32::MAX
            && sb.switches.contains_key(&key.cpu)
            && has_time;
        let tid = if key.tid != u32::MAX {
            Some(key.tid)
        } else if key.cpu != u32::MAX {
            let t = sb.only_thread_on(key.cpu);
            if t.is_none() && !switched {
                writeln!(
                    diag,
                    "hwtrace perf decode: {key}: {} threads ran on this CPU and no timed switch records say when: its instructions are shown with tid ?",
                    sb.thread_count_on(key.cpu)
                )?;
            }
            t
        } else {
            None
        };
        // The processes that may run here: those switched in on this CPU,
        // or the queue's thread's.
        let pids: Option<BTreeSet<u32>> = if switched {
            let on_cpu = sb.switches.get(&key.cpu).into_iter().flatten();
            Some(
                on_cpu
                    .filter(|&&(_, t)| t != 0)
                    .filter_map(|&(_, t)| sb.pid_of.get(&t).copied())
                    .collect(),
            )
        } else {
            tid.and_then(|t| sb.pid_of.get(&t))
                .map(|&p| BTreeSet::from([p]))
        };
        let execs = has_time && pids.iter().flatten().any(|&p| sb.generations(p) > 1);
        let timed = switched || execs;
        let mut images = vec![image::build_with_kernel(
            sb,
            pids.as_ref(),
            &opts.image,
            kernel,
            build_ids,
        )?];
        let mut image_of = BTreeMap::new();
        if timed {
            for &pid in pids.iter().flatten() {
                for generation in 0..sb.generations(pid) {
                    image_of.insert((pid, generation), images.len());
                    images.push(image::build_program(
                        sb,
                        pid,
                        generation,
                        &opts.image,
                        kernel,
                        build_ids,
                    )?);
                }
            }
        }
        Ok(Self {
            key,
            tid: Rc::new(Cell::new(tid)),
            timeline: timed.then_some((sb, tid.filter(|_| !switched))),
            images,
            image_of,
            current: Rc::new(Cell::new(0)),
            settings,
            opts,
            blame: BTreeMap::new(),
            last_blamed: None,
            report: QueueReport::default(),
        })
    }

    fn tid_text(&self) -> Shown {
        self.tid.get().map_or(Shown::Unknown, Shown::Num)
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
        let key = self.key;
        let mut names = names;
        for g in &queue.gaps {
            self.report.lost_bytes += g.lost_bytes();
            self.report.problems += 1;
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
            let start = queue.chunks[run.start].stream_offset;
            let trace: Cow<'_, [u8]> = if run.len() == 1 {
                Cow::Borrowed(queue.chunks[run.start].data)
            } else {
                let mut v = Vec::new();
                for c in &queue.chunks[run] {
                    v.extend_from_slice(c.data);
                }
                Cow::Owned(v)
            };
            self.decode_run(&trace, start, names.as_deref_mut(), out, diag)?;
        }
        self.report_missing(diag)?;
        Ok(self.report)
    }

    fn decode_run(
        &mut self,
        trace: &[u8],
        start: u64,
        names: Option<&mut Names<'_>>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        // The images leave `self` while the decoder borrows them.
        let images: Vec<ProcessImage> = std::mem::take(&mut self.images);
        let result = self.decode_over(&images, trace, start, names, out, diag);
        self.images = images;
        result
    }

    fn decode_over(
        &mut self,
        images: &[ProcessImage],
        trace: &[u8],
        start: u64,
        mut names: Option<&mut Names<'_>>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        let refs: Vec<&hwtrace_mem::image::Image> = images.iter().map(|p| &p.image).collect();
        // Each run starts over with the image of every process that ran
        // here, until a timed event says which one runs.
        self.current.set(0);
        let dec = InsnDecoder::new(trace, self.settings.config, refs[0]);
        let branches = self.opts.format == Format::Branches;
        let timeline = self.timeline.map(|(sb, fixed_tid)| Timeline {
            sb,
            cpu: self.key.cpu,
            fixed_tid,
            tsc: self.settings.tsc,
            image_of: self.image_of.clone(),
            tid: Rc::clone(&self.tid),
            current: Rc::clone(&self.current),
        });
        let items = Driver::new(dec, &refs, timeline);
        let mut each = |item: Item| {
            self.item(
                item,
                images,
                start,
                trace.len() as u64,
                names.as_deref_mut(),
                out,
                diag,
            )
        };
        if branches {
            Branches::new(items).try_for_each(&mut each)
        } else {
            items.into_iter().try_for_each(&mut each)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn item(
        &mut self,
        item: Item,
        images: &[ProcessImage],
        start: u64,
        len: u64,
        names: Option<&mut Names<'_>>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        let key = self.key;
        let tid = self.tid.get();
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
                if self.opts.json {
                    let mut v = json!({"tid": tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu), "ip": format!("{:#x}", insn.ip)});
                    if let Some(sym) = sym {
                        v["sym"] = json!(sym);
                    }
                    writeln!(out, "{v}")?;
                } else {
                    let sym = sym.map(|s| format!(" ({})", s.as_deref().unwrap_or("?")));
                    writeln!(
                        out,
                        "{} {} {:x}{}",
                        self.tid_text(),
                        show(key.cpu),
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
                if self.opts.json {
                    let mut v = json!({"tid": tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu),
                        "from": b.from.map(|v| format!("{v:#x}")), "to": b.to.map(|v| format!("{v:#x}")), "kind": b.kind.name()});
                    if let Some((f, t)) = syms {
                        v["from_sym"] = json!(f);
                        v["to_sym"] = json!(t);
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
                        "{} {} {}{fs} -> {}{ts} {}",
                        self.tid_text(),
                        show(key.cpu),
                        hex(b.from),
                        hex(b.to),
                        b.kind.name()
                    )?;
                }
            }
            Item::Error(e) => {
                self.report.errors += 1;
                self.last_blamed = None;
                let image = &images[self.current.get().min(images.len() - 1)];
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
            Item::Event { .. } | Item::Block(_) => {}
        }
        Ok(())
    }

    fn report_missing(&mut self, diag: &mut dyn Write) -> Result<()> {
        let key = self.key;
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

    /// The mappings that could not be loaded, over all images (reported by
    /// the caller before decoding; the same mapping may be listed twice).
    pub fn missing(&self) -> impl Iterator<Item = &image::Missing> {
        self.images.iter().flat_map(|i| &i.missing)
    }
}

/// Index ranges of `queue.chunks` to decode as one trace: split at gaps
/// and at [`MAX_JOIN`] bytes.
fn runs(queue: &AuxQueue<'_>) -> Vec<std::ops::Range<usize>> {
    let gap_at: BTreeSet<_> = queue.gaps.iter().map(|g| g.record_offset).collect();
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, c) in queue.chunks.iter().enumerate() {
        if i > start && (gap_at.contains(&c.record_offset) || bytes + c.data.len() > MAX_JOIN) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += c.data.len();
    }
    if start < queue.chunks.len() {
        out.push(start..queue.chunks.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_perf::data::{AuxChunk, AuxGap};

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

    fn chunk(n: u64, data: &'static [u8], stream_offset: u64) -> AuxChunk<'static> {
        AuxChunk {
            record_offset: FileOffset(n * 0x100),
            aux_offset: stream_offset,
            stream_offset,
            data,
        }
    }

    #[test]
    fn runs_split_at_gaps_only() {
        static B: [u8; 8] = [0; 8];
        let queue = AuxQueue {
            chunks: vec![
                chunk(1, &B, 0),
                chunk(2, &B, 8),
                chunk(3, &B, 16),
                chunk(4, &B, 24),
            ],
            gaps: vec![AuxGap {
                stream_offset: 16,
                record_offset: FileOffset(0x300),
                expected_aux_offset: 16,
                found_aux_offset: 48,
            }],
        };
        assert_eq!(runs(&queue), [0..2, 2..4]);
        assert_eq!(
            runs(&AuxQueue::default()),
            Vec::<std::ops::Range<usize>>::new()
        );
    }
}
