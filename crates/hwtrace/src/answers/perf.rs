//! perf.data Intel PT streams as [`Exec`] records: each AUX queue decoded
//! over the code of the processes that ran there, with `Exec::Thread` at
//! its start and at every thread switch the sideband times, and
//! `Exec::Gap` where perf lost data. intel_bts queues give their records
//! as `Exec::Branch`.
//!
//! The queues are decoded by [`crate::perfdecode::queue`], as `hwtrace
//! perf decode` decodes them: on a per-CPU queue the code image follows
//! the process switched in, and after an exec the new program's, so two
//! processes mapping different code at one address each decode over their
//! own. Kernel code comes from `--kcore` (its range from the kernel
//! mappings or `--kallsyms`). Here the items are handed on instead of
//! printed.

use super::pt::ItemMapper;
use super::source::{Sink, SourceArgs, SourceReport};
use crate::flow::Item;
use crate::input::MappedFile;
use crate::perfdecode::ImageOptions;
use crate::perfdecode::bts::{BtsDecoder, BtsStep, BufferTimes};
use crate::perfdecode::image::{BuildIdCache, Missing};
use crate::perfdecode::kernel::Kernel;
use crate::perfdecode::queue::{QueueFlow, runs};
use crate::perfdecode::sideband::Sideband;
use crate::perfdecode::stream::PtSettings;
use anyhow::{Context, Result, bail};
use hwtrace_flow::ErrorKind;
use hwtrace_perf::data::{
    AuxQueue, AuxStreams, AuxtraceKind, FileOffset, IntelBtsInfo, PerfData, PerfRecord, QueueKey,
};
use hwtrace_report::exec::{Detail, Exec, GapKind, Mapping};
use hwtrace_types::{Ip, TraceOffset};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// How a PT queue is decoded: the recording's settings and what the answer
/// needs of the flow.
#[derive(Clone, Copy, Debug)]
struct Decoding {
    settings: PtSettings,
    detail: Detail,
}

/// A perf.data file with Intel PT (or BTS) data, mapped.
#[derive(Debug)]
pub struct PerfInput {
    path: PathBuf,
    file: MappedFile,
    /// The PT decoder's settings; `None`: an intel_bts recording.
    settings: Option<PtSettings>,
    options: ImageOptions,
    sb: Sideband,
    kernel: Kernel,
    /// The intel_bts AUXTRACE_INFO (its TSC conversion times buffers).
    bts: Option<IntelBtsInfo>,
    /// Each AUXTRACE record's `reference` (the TSC perf read it at), by
    /// its file offset: when a BTS buffer's branches ran.
    references: BTreeMap<FileOffset, u64>,
}

impl PerfInput {
    /// The TSC frequency the recording's TSC conversion gives (perf time
    /// is nanoseconds: `ns = tsc · time_mult / 2^time_shift + time_zero`),
    /// `None` when it has none (an untimed recording).
    pub fn tsc_hz(&self) -> Option<f64> {
        let t = self.settings.as_ref()?.tsc;
        (t.time_mult != 0)
            .then(|| 1e9 * 2f64.powi(i32::from(t.time_shift)) / f64::from(t.time_mult))
    }

    /// Checks that `file` is an Intel PT (or intel_bts) recording and
    /// reads its settings.
    pub fn open(path: &Path, file: MappedFile, args: &SourceArgs) -> Result<Self> {
        let data = PerfData::parse(file.bytes()).with_context(|| format!("{}", path.display()))?;
        let mut pt = None;
        let mut bts = None;
        let mut references = BTreeMap::new();
        let mut records = data.records();
        for r in &mut records {
            let Ok(r) = r else { continue };
            match r.record {
                PerfRecord::AuxtraceInfo(i) => match i.kind {
                    AuxtraceKind::IntelPt(p) if pt.is_none() => pt = Some(p),
                    AuxtraceKind::IntelBts(b) => bts = Some(b),
                    _ => {}
                },
                PerfRecord::Auxtrace(a) => {
                    references.insert(r.offset, a.reference);
                }
                _ => {}
            }
        }
        let settings = match pt {
            Some(info) => Some(PtSettings::for_recording(
                &info,
                records.attrs(),
                data.features_after(&records).cpuid,
                args.cpu,
                args.lenient,
                "hwtrace",
            )),
            None if bts.is_some() => None,
            None => bail!(
                "{}: no intel_pt or intel_bts AUXTRACE_INFO record: not a hardware trace recording",
                path.display()
            ),
        };
        drop(records);
        let sb = Sideband::collect(&data);
        let kernel = Kernel::for_sideband(&sb, args.kcore.as_deref(), args.kallsyms.as_deref())?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            settings,
            options: ImageOptions {
                sysroot: args.sysroot.clone(),
                vdso: args.vdso.clone(),
            },
            sb,
            kernel,
            bts,
            references,
        })
    }

    /// The kernel symbols (`--kallsyms`, or the kcore_dir's `kallsyms`).
    pub fn kallsyms(&self) -> Option<&hwtrace_report::symbols::Kallsyms> {
        self.kernel.kallsyms.as_ref()
    }

    fn data(&self) -> Result<PerfData<'_>> {
        PerfData::parse(self.file.bytes()).with_context(|| format!("{}", self.path.display()))
    }

    /// Every executable mapping of the sideband, at the path its code is
    /// read from (`--sysroot`, `--vdso` applied).
    pub fn mappings(&self) -> Vec<Mapping> {
        self.sb
            .mappings
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
                // perf's `[kernel.kallsyms]_text` record gives the start
                // address as its "offset": without a file (no kallsyms)
                // its addresses are named from the mapping's start.
                let file_offset = if m.filename.starts_with("[kernel") {
                    0
                } else {
                    m.pgoff
                };
                Mapping {
                    path,
                    cr3: None,
                    pid: (!kernel).then_some(m.pid),
                    start: Ip(m.addr),
                    len: m.len,
                    file_offset,
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

    /// Decodes every queue, one after the other, handing out what
    /// `detail` asks for.
    pub fn run(&self, detail: Detail, sink: Sink<'_>, report: &mut SourceReport) -> Result<()> {
        let data = self.data()?;
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
                    let how = Decoding { settings, detail };
                    self.queue(*key, queue, how, &mut cache, sink, report)?;
                }
                None => self.bts_queue(*key, queue, &mut cache, sink, report)?,
            }
        }
        Ok(())
    }

    /// One Intel PT queue, over the image of the program running at each
    /// point (see [`QueueFlow`]).
    fn queue(
        &self,
        key: QueueKey,
        queue: &AuxQueue<'_>,
        how: Decoding,
        cache: &mut BuildIdCache,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        let sb = &self.sb;
        let flow = QueueFlow::new(key, sb, how.settings, &self.options, &self.kernel, cache)?;
        let cpu = (key.cpu != u32::MAX).then_some(key.cpu);
        let thread = |tid: Option<u32>| Exec::Thread {
            pid: tid.and_then(|t| sb.pid_of.get(&t).copied()),
            tid,
            cpu,
        };
        let mut tid = flow.tid();
        sink(thread(tid))?;
        // Decoding stops inside missing mappings: said once per mapping
        // (by MMAP record offset), at the end, as `hwtrace perf decode`
        // says it.
        let mut stops: BTreeMap<FileOffset, (Missing, u64)> = BTreeMap::new();
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
            let (start, len) = (run.start, run.trace.len() as u64);
            let mut map = ItemMapper::new(start, len, what.clone()).with_detail(how.detail);
            if gap_at.contains(&start) {
                map.gap(start, GapKind::Lost, sink, report)?;
            }
            let mut items = flow.runs(&run.trace);
            loop {
                // Plain code as whole runs; no thread switch falls among
                // them (switches come at timed events, which are items).
                map.runs(|v| items.visit_runs(v), sink, report)?;
                let Some(item) = items.next() else { break };
                // The time line switched thread at this item's timed event.
                if flow.tid() != tid {
                    tid = flow.tid();
                    sink(thread(tid))?;
                }
                if let Item::Error(e) = &item
                    && matches!(e.kind, ErrorKind::NoMap | ErrorKind::BadInsn)
                    && let Some(i) = e.ip.and_then(|ip| flow.image().missing_at(ip))
                {
                    let m = &flow.image().missing[i];
                    let at = m.mapping.record_offset;
                    stops.entry(at).or_insert_with(|| (m.clone(), 0)).1 += 1;
                    map.explained_error(e.offset.0, sink, report)?;
                    continue;
                }
                map.item(item, sink, report)?;
            }
            map.gap(start + len, GapKind::Disabled, sink, report)?;
        }
        for (m, n) in stops.values() {
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
    /// An intel_bts queue as `Exec::Branch` records, walked by `hwtrace
    /// perf decode`'s [`BtsDecoder`]: each branch classified from its
    /// process's image, a per-CPU queue's buffers given to the thread
    /// switched in when perf read them (timed switch records), lost data a
    /// gap, records cut short and unclassified branches reported.
    fn bts_queue(
        &self,
        key: QueueKey,
        queue: &AuxQueue<'_>,
        cache: &mut BuildIdCache,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        let times = self.bts.as_ref().map(|b| BufferTimes {
            tsc: b.tsc,
            reference: &self.references,
        });
        let mut dec = BtsDecoder::new(key, &self.sb, &self.options, times, &self.kernel, cache)?;
        if let Some(n) = dec.unattributed_threads() {
            report.problem(format!(
                "{key}: {n} threads ran on this CPU, BTS records carry no time and no timed switch records say which ran when: its branches are given to no thread"
            ));
        }
        let cpu = (key.cpu != u32::MAX).then_some(key.cpu);
        let sb = &self.sb;
        let mut thread: Option<Option<u32>> = None;
        dec.walk(queue, |d, step| {
            if thread != Some(d.tid()) {
                thread = Some(d.tid());
                sink(Exec::Thread {
                    pid: d.tid().and_then(|t| sb.pid_of.get(&t).copied()),
                    tid: d.tid(),
                    cpu,
                })?;
            }
            match step {
                BtsStep::Lost { bytes, at, .. } => {
                    report.lost_bytes += bytes;
                    report.problem(format!(
                        "{key}: lost {bytes} bytes of BTS records at stream offset {at:#x}"
                    ));
                    report.gaps += 1;
                    sink(Exec::Gap {
                        offset: TraceOffset(at),
                        why: GapKind::Lost,
                    })
                }
                BtsStep::Cut { bytes, at } => {
                    report.skipped_bytes += bytes as u64;
                    report.problem(format!(
                        "{key}: a BTS record cut short: {bytes} of its {} bytes at stream offset {at:#x}",
                        crate::perfdecode::bts::RECORD
                    ));
                    Ok(())
                }
                BtsStep::Branch {
                    from, to, class, ..
                } => {
                    report.branches += 1;
                    sink(Exec::Branch {
                        from: Ip(from),
                        to: Ip(to),
                        class,
                    })
                }
            }
        })?;
        if thread.is_none() {
            sink(Exec::Thread {
                pid: dec.pid(),
                tid: dec.tid(),
                cpu,
            })?;
        }
        for line in dec.unclassified() {
            report.problem(line);
        }
        Ok(())
    }
}
