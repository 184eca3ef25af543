//! perf.data Intel PT streams as [`Exec`] records: each AUX queue decoded
//! over the code of the processes that ran there, with `Exec::Thread` at
//! its start and at every thread switch the sideband times, and
//! `Exec::Gap` where perf lost data. intel_bts queues give their records
//! as `Exec::Branch`.
//!
//! Each queue is decoded over one image holding the code of every
//! process that ran there (`perfdecode`'s image-switching driver is
//! private to it): where two processes map different code at one address,
//! the later mapping's is read.
//!
//! This wraps [`crate::perfdecode`]'s public API (sideband, images,
//! decoder settings) the way `hwtrace perf decode` uses it, but hands the
//! items on instead of printing them.

use super::branches::class_at;
use super::pt::ItemMapper;
use super::source::{Sink, SourceArgs, SourceReport};
use crate::flow::Items;
use crate::input::MappedFile;
use crate::perfdecode::ImageOptions;
use crate::perfdecode::image::{self, BuildIdCache};
use crate::perfdecode::sideband::Sideband;
use crate::perfdecode::stream::{MAX_JOIN, PtSettings, perf_time};
use anyhow::{Context, Result, bail};
use hwtrace_flow::ErrorKind;
use hwtrace_flow::insn::InsnDecoder;
use hwtrace_perf::data::{
    AuxQueue, AuxStreams, AuxtraceKind, FileOffset, PerfData, PerfRecord, QueueKey,
};
use hwtrace_regs::bts::BtsRecord;
use hwtrace_regs::ds::DsFormat;
use hwtrace_report::exec::{Exec, GapKind, Mapping};
use hwtrace_types::{Ip, TraceOffset};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A perf.data file with Intel PT (or BTS) data, mapped.
#[derive(Debug)]
pub struct PerfInput {
    path: PathBuf,
    file: MappedFile,
    /// The PT decoder's settings; `None`: an intel_bts recording.
    settings: Option<PtSettings>,
    options: ImageOptions,
}

impl PerfInput {
    /// Checks that `file` is an Intel PT (or intel_bts) recording and
    /// reads its settings.
    pub fn open(path: &Path, file: MappedFile, args: &SourceArgs) -> Result<Self> {
        let data = PerfData::parse(file.bytes()).with_context(|| format!("{}", path.display()))?;
        let mut pt = None;
        let mut bts = false;
        let mut records = data.records();
        for r in &mut records {
            if let Ok(r) = r
                && let PerfRecord::AuxtraceInfo(i) = r.record
            {
                match i.kind {
                    AuxtraceKind::IntelPt(p) if pt.is_none() => pt = Some(p),
                    AuxtraceKind::IntelBts(_) => bts = true,
                    _ => {}
                }
            }
        }
        let settings = match pt {
            Some(info) => {
                let event_config = records
                    .attrs()
                    .iter()
                    .find(|a| a.attr.kind == info.pmu_type)
                    .map(|a| a.attr.config);
                Some(PtSettings::new(&info, event_config))
            }
            None if bts => None,
            None => bail!(
                "{}: no intel_pt or intel_bts AUXTRACE_INFO record: not a hardware trace recording",
                path.display()
            ),
        };
        drop(records);
        Ok(Self {
            path: path.to_path_buf(),
            file,
            settings,
            options: ImageOptions {
                sysroot: args.sysroot.clone(),
                vdso: args.vdso.clone(),
            },
        })
    }

    fn data(&self) -> Result<PerfData<'_>> {
        PerfData::parse(self.file.bytes()).with_context(|| format!("{}", self.path.display()))
    }

    /// Every executable mapping of the sideband, at the path its code is
    /// read from (`--sysroot`, `--vdso` applied).
    pub fn mappings(&self) -> Vec<Mapping> {
        let Ok(data) = self.data() else {
            return Vec::new();
        };
        let sb = Sideband::collect(&data);
        sb.mappings
            .iter()
            .map(|m| {
                let kernel = m.addr >= 0xffff_8000_0000_0000 || m.filename.starts_with("[kernel");
                let path = match (&self.options, m.filename.as_str()) {
                    (ImageOptions { vdso: Some(v), .. }, "[vdso]") => v.clone(),
                    (
                        ImageOptions {
                            sysroot: Some(root),
                            ..
                        },
                        name,
                    ) if name.starts_with('/') => {
                        let rel = Path::new(OsStr::from_bytes(name.as_bytes()));
                        root.join(rel.strip_prefix("/").unwrap_or(rel))
                    }
                    (_, name) => PathBuf::from(name),
                };
                Mapping {
                    path,
                    cr3: None,
                    pid: (!kernel).then_some(m.pid),
                    start: Ip(m.addr),
                    len: m.len,
                    file_offset: m.pgoff,
                }
            })
            .collect()
    }

    /// Bytes of AUX data in the file.
    pub fn aux_bytes(&self) -> u64 {
        self.data()
            .map(|d| {
                AuxStreams::collect(&d)
                    .queues
                    .values()
                    .map(AuxQueue::len)
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Decodes every queue, one after the other.
    pub fn run(&self, sink: Sink<'_>, report: &mut SourceReport) -> Result<()> {
        let data = self.data()?;
        let sb = Sideband::collect(&data);
        let streams = AuxStreams::collect(&data);
        for l in &streams.aux_losses {
            report.problem(format!(
                "{}: the AUX record at file offset {} says the hardware lost trace (flags {:#x}) in aux offset {:#x}..{:#x}",
                self.path.display(),
                l.record_offset,
                l.flags,
                l.aux_offset,
                l.aux_offset.wrapping_add(l.aux_size)
            ));
        }
        for (off, n) in &streams.lost_records {
            report.problem(format!(
                "{}: the LOST record at file offset {off}: {n} sideband events lost",
                self.path.display()
            ));
        }
        for e in &streams.errors {
            report.problem(format!("{}: {e}", self.path.display()));
        }
        let mut cache = BuildIdCache::default();
        for (key, queue) in &streams.queues {
            match self.settings {
                Some(settings) => {
                    self.queue(*key, queue, &sb, settings, &mut cache, sink, report)?;
                }
                None => self.bts_queue(*key, queue, &sb, &mut cache, sink, report)?,
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn queue(
        &self,
        key: QueueKey,
        queue: &AuxQueue<'_>,
        sb: &Sideband,
        settings: PtSettings,
        cache: &mut BuildIdCache,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        let cpu = (key.cpu != u32::MAX).then_some(key.cpu);
        let timed = key.tid == u32::MAX
            && cpu.is_some()
            && sb.switches.contains_key(&key.cpu)
            && (settings.tsc.cap_user_time_zero || settings.tsc.time_mult != 0);
        let mut tid = if key.tid != u32::MAX {
            Some(key.tid)
        } else {
            cpu.and_then(|c| sb.only_thread_on(c))
        };
        // The code of every process that ran here, as `perf decode` builds it.
        let pids: Option<BTreeSet<u32>> = if timed {
            let tids = sb.switches.get(&key.cpu).into_iter().flatten();
            tids.filter(|&&(_, t)| t != 0)
                .map(|&(_, t)| sb.pid_of.get(&t).copied())
                .collect()
        } else {
            tid.and_then(|t| sb.pid_of.get(&t))
                .map(|&p| BTreeSet::from([p]))
        };
        let built = image::build(sb, pids.as_ref(), &self.options, cache);
        // Decoding stops inside missing mappings: said once per mapping,
        // at the end, as `hwtrace perf decode` says it.
        let mut stops = vec![0u64; built.missing.len()];
        let thread = |tid: Option<u32>| Exec::Thread {
            pid: tid.and_then(|t| sb.pid_of.get(&t).copied()),
            tid,
            cpu,
        };
        sink(thread(tid))?;
        let what = key.to_string();
        let gap_at: BTreeSet<u64> = queue.gaps.iter().map(|g| g.stream_offset).collect();
        for g in &queue.gaps {
            report.lost_bytes += g.lost_bytes();
            report.problem(format!(
                "{key}: lost {} bytes of trace at stream offset {:#x} (before the AUXTRACE record at file offset {})",
                g.lost_bytes(),
                g.stream_offset,
                g.record_offset
            ));
        }
        for run in runs(queue) {
            let start = queue.chunks[run.start].stream_offset;
            let trace: Cow<'_, [u8]> = if run.len() == 1 {
                Cow::Borrowed(queue.chunks[run.start].data)
            } else {
                Cow::Owned(
                    queue.chunks[run]
                        .iter()
                        .flat_map(|c| c.data.iter().copied())
                        .collect(),
                )
            };
            let len = trace.len() as u64;
            let mut map = ItemMapper::new(start, len, what.clone());
            if gap_at.contains(&start) {
                map.gap(start, GapKind::Lost, sink, report)?;
            }
            let dec = InsnDecoder::new(&trace, settings.config, &built.image);
            for item in Items::new(dec) {
                if timed
                    && let crate::flow::Item::Event { event, .. } = &item
                    && let Some(tsc) = map.new_time(event)
                {
                    let time = perf_time(&settings.tsc, tsc);
                    let now = sb.thread_at(key.cpu, time);
                    if now.is_some() && now != tid {
                        tid = now;
                        sink(thread(tid))?;
                    }
                }
                if let crate::flow::Item::Error(e) = &item
                    && matches!(e.kind, ErrorKind::NoMap | ErrorKind::BadInsn)
                    && let Some(i) = e.ip.and_then(|ip| built.missing_at(ip))
                {
                    stops[i] += 1;
                    map.explained_error(e.offset.0, sink, report)?;
                    continue;
                }
                map.item(item, sink, report)?;
            }
            map.gap(start + len, GapKind::Disabled, sink, report)?;
        }
        for (m, n) in built.missing.iter().zip(stops).filter(|(_, n)| *n > 0) {
            report.problem(format!(
                "{key}: cannot decode code of {} mapped at {:#x}-{:#x} (pid {}): {}; decoding stopped {n} times inside it",
                m.path,
                m.mapping.addr,
                m.mapping.addr.wrapping_add(m.mapping.len),
                m.mapping.pid,
                m.reason
            ));
        }
        Ok(())
    }
}

impl PerfInput {
    /// An intel_bts queue: its 24-byte records (a record may straddle two
    /// AUXTRACE buffers) as `Exec::Branch`, classified from the thread's
    /// process image; all-zero padding records skipped; lost data a gap.
    fn bts_queue(
        &self,
        key: QueueKey,
        queue: &AuxQueue<'_>,
        sb: &Sideband,
        cache: &mut BuildIdCache,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        let cpu = (key.cpu != u32::MAX).then_some(key.cpu);
        let tid = if key.tid != u32::MAX {
            Some(key.tid)
        } else {
            cpu.and_then(|c| sb.only_thread_on(c))
        };
        let pid = tid.and_then(|t| sb.pid_of.get(&t).copied());
        let pids = pid.map(|p| BTreeSet::from([p]));
        let built = image::build(sb, pids.as_ref(), &self.options, cache);
        sink(Exec::Thread { pid, tid, cpu })?;
        let lost_at: BTreeMap<FileOffset, u64> = queue
            .gaps
            .iter()
            .map(|g| (g.record_offset, g.lost_bytes()))
            .collect();
        let mut carry: Vec<u8> = Vec::with_capacity(BTS_RECORD);
        let mut carry_at = 0u64;
        let cut = |carry: &mut Vec<u8>, at: u64, report: &mut SourceReport| {
            if !carry.is_empty() {
                report.skipped_bytes += carry.len() as u64;
                report.problem(format!(
                    "{key}: a BTS record cut short: {} of its {BTS_RECORD} bytes at stream offset {at:#x}",
                    carry.len()
                ));
                carry.clear();
            }
        };
        for c in &queue.chunks {
            if let Some(&lost) = lost_at.get(&c.record_offset) {
                report.lost_bytes += lost;
                report.problem(format!(
                    "{key}: lost {lost} bytes of BTS records at stream offset {:#x}",
                    c.stream_offset
                ));
                cut(&mut carry, carry_at, report);
                report.gaps += 1;
                sink(Exec::Gap {
                    offset: TraceOffset(c.stream_offset),
                    why: GapKind::Lost,
                })?;
            }
            let mut data = c.data;
            let mut at = c.stream_offset;
            if !carry.is_empty() {
                let need = (BTS_RECORD - carry.len()).min(data.len());
                carry.extend_from_slice(&data[..need]);
                data = &data[need..];
                at += need as u64;
                if carry.len() == BTS_RECORD {
                    bts_record(&carry, &built.image, sink, report)?;
                    carry.clear();
                }
            }
            let mut records = data.chunks_exact(BTS_RECORD);
            for rec in &mut records {
                bts_record(rec, &built.image, sink, report)?;
                at += BTS_RECORD as u64;
            }
            if !records.remainder().is_empty() {
                carry_at = at;
                carry.extend_from_slice(records.remainder());
            }
        }
        cut(&mut carry, carry_at, report);
        Ok(())
    }
}

/// Bytes of one 64-bit BTS record.
const BTS_RECORD: usize = 24;

/// One intel_bts record as `Exec::Branch` (padding skipped).
fn bts_record(
    rec: &[u8],
    image: &hwtrace_mem::image::Image,
    sink: Sink<'_>,
    report: &mut SourceReport,
) -> Result<()> {
    let Ok(r) = BtsRecord::parse(rec, DsFormat::Bits64) else {
        return Ok(());
    };
    if r.from.0 == 0 && r.to.0 == 0 {
        return Ok(());
    }
    report.branches += 1;
    sink(Exec::Branch {
        from: r.from,
        to: r.to,
        class: class_at(Some(image), r.from),
    })
}

/// Index ranges of `queue.chunks` to decode as one trace: split at gaps
/// and at [`MAX_JOIN`] bytes (as `hwtrace perf decode` does).
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
