//! One AUX queue decoded: runs of contiguous AUXTRACE buffers through the
//! instruction decoder, instructions attributed to the queue's thread,
//! errors blamed on missing code, gaps reported.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::io::Write;

use anyhow::Result;
use hwtrace_flow::insn::InsnDecoder;
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_perf::data::{AuxQueue, IntelPtInfo, QueueKey, TscConversion};
use serde_json::json;

use super::image::{self, ImageOptions, ProcessImage};
use super::sideband::Sideband;
use crate::flow::{Branches, Item, Items};

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
}

/// A thread or CPU as printed: the number, `?` when unknown, `-` for
/// perf's -1 ("none"); no allocation per line.
#[derive(Clone, Copy)]
enum Shown {
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

fn show(v: u32) -> Shown {
    if v == u32::MAX {
        Shown::NoneSet
    } else {
        Shown::Num(v)
    }
}

/// Per missing mapping: decoding stops inside it and trace bytes skipped.
#[derive(Clone, Copy, Debug, Default)]
struct Blame {
    stops: u64,
    skipped: u64,
}

/// Decodes one queue.
pub struct QueueDecoder<'s> {
    key: QueueKey,
    tid: Option<u32>,
    /// Per-CPU queues with timed switch records: the CPU's switches, used
    /// to pick the thread at the time of each event.
    timeline: Option<&'s Sideband>,
    image: ProcessImage,
    settings: PtSettings,
    opts: &'s Options,
    blame: Vec<Blame>,
    /// The missing mapping the last error fell in.
    last_blamed: Option<usize>,
    report: QueueReport,
}

impl<'s> QueueDecoder<'s> {
    /// Works out the thread and builds the image (file build ids read
    /// through `build_ids`); `diag` hears how instructions are attributed.
    pub fn new(
        key: QueueKey,
        sb: &'s Sideband,
        settings: PtSettings,
        opts: &'s Options,
        build_ids: &mut image::BuildIdCache,
        diag: &mut dyn Write,
    ) -> Result<Self> {
        let timed = key.tid == u32::MAX
            && key.cpu != u32::MAX
            && sb.switches.contains_key(&key.cpu)
            && (settings.tsc.cap_user_time_zero || settings.tsc.time_mult != 0);
        let tid = if key.tid != u32::MAX {
            Some(key.tid)
        } else if key.cpu != u32::MAX {
            let t = sb.only_thread_on(key.cpu);
            if t.is_none() && !timed {
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
        // The code of every process that ran here (one image: where two
        // processes map different code at one address, the later wins).
        let pids: Option<BTreeSet<u32>> = if timed {
            let tids = sb
                .switches
                .get(&key.cpu)
                .into_iter()
                .flatten()
                .map(|&(_, t)| t);
            tids.filter(|&t| t != 0)
                .map(|t| sb.pid_of.get(&t).copied())
                .collect()
        } else {
            tid.and_then(|t| sb.pid_of.get(&t))
                .map(|&p| BTreeSet::from([p]))
        };
        let image = image::build(sb, pids.as_ref(), &opts.image, build_ids);
        let blame = vec![Blame::default(); image.missing.len()];
        Ok(Self {
            key,
            tid,
            timeline: timed.then_some(sb),
            image,
            settings,
            opts,
            blame,
            last_blamed: None,
            report: QueueReport::default(),
        })
    }

    fn tid_text(&self) -> Shown {
        self.tid.map_or(Shown::Unknown, Shown::Num)
    }

    /// Decodes the queue's buffers, writing instructions or branches to
    /// `out` and diagnostics to `diag`.
    pub fn run(
        mut self,
        queue: &AuxQueue<'_>,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<QueueReport> {
        let key = self.key;
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
            self.decode_run(&trace, start, out, diag)?;
        }
        self.report_missing(diag)?;
        Ok(self.report)
    }

    fn decode_run(
        &mut self,
        trace: &[u8],
        start: u64,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        // The image leaves `self` while the decoder borrows it.
        let image = std::mem::take(&mut self.image.image);
        let result = self.decode_over(&image, trace, start, out, diag);
        self.image.image = image;
        result
    }

    fn decode_over(
        &mut self,
        image: &hwtrace_mem::image::Image,
        trace: &[u8],
        start: u64,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        // The TSC of the last timed event (PSB+, enable, ...): with
        // `--branches` events are consumed on the way, so it is taken here.
        let last_tsc = Cell::new(None);
        let dec = InsnDecoder::new(trace, self.settings.config, image);
        let items = Items::new(dec).inspect(|item| {
            if let Item::Event { event, .. } = item
                && event.has_tsc
            {
                last_tsc.set(Some(event.tsc));
            }
        });
        let branches = self.opts.format == Format::Branches;
        let mut each = |item: Item| {
            if let Some(tsc) = last_tsc.take() {
                self.at_tsc(tsc);
            }
            self.item(item, start, trace.len() as u64, out, diag)
        };
        if branches {
            Branches::new(items).try_for_each(&mut each)
        } else {
            items.into_iter().try_for_each(&mut each)
        }
    }

    /// Time passed: on a per-CPU queue, the thread switched in by then runs.
    fn at_tsc(&mut self, tsc: u64) {
        if let Some(sb) = self.timeline {
            let time = perf_time(&self.settings.tsc, tsc);
            if let Some(tid) = sb.thread_at(self.key.cpu, time) {
                self.tid = Some(tid);
            }
        }
    }

    fn item(
        &mut self,
        item: Item,
        start: u64,
        len: u64,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<()> {
        let key = self.key;
        match item {
            Item::Insn { insn, .. } => {
                self.report.insns += 1;
                if self.opts.format != Format::Insns {
                    return Ok(());
                }
                if self.opts.json {
                    let v = json!({"tid": self.tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu), "ip": format!("{:#x}", insn.ip)});
                    writeln!(out, "{v}")?;
                } else {
                    writeln!(out, "{} {} {:x}", self.tid_text(), show(key.cpu), insn.ip)?;
                }
            }
            Item::Branch(b) => {
                self.report.branches += 1;
                let hex = |v: Option<u64>| v.map_or("0".into(), |v| format!("{v:x}"));
                if self.opts.json {
                    let v = json!({"tid": self.tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu),
                        "from": b.from.map(|v| format!("{v:#x}")), "to": b.to.map(|v| format!("{v:#x}")), "kind": b.kind.name()});
                    writeln!(out, "{v}")?;
                } else {
                    writeln!(
                        out,
                        "{} {} {} -> {} {}",
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
                let missing = match (e.kind, e.ip) {
                    (ErrorKind::NoMap | ErrorKind::BadInsn, Some(ip)) => self.image.missing_at(ip),
                    _ => None,
                };
                if let Some(i) = missing {
                    // Said once per mapping, with totals, at the end.
                    self.blame[i].stops += 1;
                    self.last_blamed = Some(i);
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
                if let Some(i) = self.last_blamed.take() {
                    self.blame[i].skipped += skipped;
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
        for (m, b) in self.image.missing.iter().zip(&self.blame) {
            if b.stops == 0 {
                continue;
            }
            self.report.problems += 1;
            writeln!(
                diag,
                "hwtrace perf decode: {key}, thread {}: cannot decode code of {} mapped at {:#x}-{:#x} (MMAP record at file offset {}): {}; its instructions could not be decoded: decoding stopped {} times inside it and {} trace bytes were skipped (to the next PSB or the end)",
                self.tid_text(),
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

    /// The mappings that could not be loaded (reported by the caller before
    /// decoding).
    pub fn missing(&self) -> &[image::Missing] {
        &self.image.missing
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
    use hwtrace_perf::data::{AuxChunk, AuxGap, FileOffset};

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
