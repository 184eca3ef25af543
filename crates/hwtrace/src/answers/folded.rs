//! Answers of a raw Intel PT trace on every core: the trace decoded by
//! PSB work units on the parallel engine's workers, each unit's records
//! made (and, for coverage, folded) by the worker that decoded it, and
//! handed back in trace order.
//!
//! - [`Source::run_folded`]: answers whose work on a stretch can be done
//!   without the stretches before it and merged afterwards (coverage:
//!   `CoveragePart`). Nothing per record crosses threads: handing each
//!   run to one answering thread costs about what coverage does with it.
//! - [`Source::run_parallel`]: the records themselves, for answers that
//!   follow the call structure (report, calls, timeline): the decode and
//!   the records' making, two thirds of their time, spread over the
//!   workers; the answer takes the records on the calling thread.
//!
//! A stretch's records are those [`Source::run_here`] hands out for it,
//! but for where runs are cut; what depends on the records before (the
//! address space) starts from the decoder's state where the stretch starts
//! ([`Sink::starts_at`]), and [`Seams`] joins what a seam cut in two.

use super::pt::ItemMapper;
use super::source::{RawPt, Sink as RecordSink};
use super::{Source, SourceReport};
use crate::flow::Item;
use anyhow::Result;
use hwtrace_flow::insn::FastDecoder;
use hwtrace_flow::parallel::{
    self, FastSource, FlowItem, MAX_STALL, ParallelConfig, PassedRun, Probe, Sink,
};
use hwtrace_report::coverage::CoveragePart;
use hwtrace_report::exec::{Detail, Exec, ExecRun, GapKind};
use std::sync::Mutex;

/// What an answer makes of one stretch's records, on the thread that
/// decoded them.
pub trait Fold: Send {
    /// Takes the stretch's next record.
    fn push(&mut self, exec: &Exec);
    /// Whether what it holds does not grow with the records (a coverage
    /// part: its blocks and edges); a fold that keeps them is held to the
    /// work unit's item budget ([`ParallelConfig::unit_items`]).
    fn summarises(&self) -> bool {
        true
    }
}

impl Fold for CoveragePart {
    #[inline]
    fn push(&mut self, exec: &Exec) {
        CoveragePart::push(self, exec);
    }
}

impl Fold for Vec<Exec> {
    #[inline]
    fn push(&mut self, exec: &Exec) {
        Vec::push(self, *exec);
    }

    fn summarises(&self) -> bool {
        false
    }
}

/// One stretch of the trace: its records folded, and what decoding it
/// found.
struct Stretch<F> {
    mapper: ItemMapper,
    fold: F,
    report: SourceReport,
    /// The trace offset decoded to.
    offset: Option<u64>,
    /// Runs that neither call nor return are joined ([`Detail::Calls`]):
    /// the stretch being joined.
    join: bool,
    open: Option<ExecRun>,
}

impl<F: Fold> Stretch<F> {
    /// Hands on the stretch being joined.
    fn close(&mut self) {
        if let Some(s) = self.open.take() {
            self.fold.push(&Exec::Stretch(s));
        }
    }
}

impl<F: Fold> Sink for Stretch<F> {
    fn keeps_runs(&self) -> bool {
        true
    }

    fn folds(&self) -> bool {
        self.fold.summarises()
    }

    fn starts_at(&mut self, probe: &Probe) {
        self.mapper.set_space(probe.space);
    }

    #[inline]
    fn push_run(&mut self, r: &PassedRun) {
        self.offset = Some(r.before.0);
        self.report.insns += u64::from(r.run.insns);
        let run = self.mapper.run_record(r);
        if !self.join {
            self.fold.push(&Exec::Run(run));
            return;
        }
        if let Some(s) = ExecRun::join_into(&mut self.open, run) {
            self.fold.push(&Exec::Stretch(s));
        }
    }

    fn push(&mut self, item: FlowItem) {
        self.close();
        let item = Item::from(item);
        if let Item::Insn { offset, .. } = item {
            self.offset = Some(offset);
        }
        let fold = &mut self.fold;
        // The sink cannot fail: every record is folded.
        let _ = self.mapper.item(
            item,
            &mut |e| {
                fold.push(&e);
                Ok(())
            },
            &mut self.report,
        );
    }
}

impl Source {
    /// Decodes a raw Intel PT input on `jobs` threads (work units of at
    /// least `unit_bytes`, when given), the records of each stretch folded
    /// into a fold from `new_fold` on the thread that decoded them; hands
    /// the folds to `merge` in trace order with the trace offset each
    /// decoded to, the last one holding the end of the trace. `None` for
    /// other inputs (perf.data, branch lists), which decode on one thread
    /// ([`Source::run`]). An error from `merge` stops the decode and is
    /// returned.
    pub fn run_folded<F: Fold>(
        &self,
        jobs: usize,
        unit_bytes: Option<u64>,
        new_fold: impl Fn() -> F + Sync,
        merge: impl FnMut(F, Option<u64>) -> Result<()>,
    ) -> Result<Option<SourceReport>> {
        let Some(raw) = self.raw_pt_input() else {
            return Ok(None);
        };
        let mut config = ParallelConfig::counting(jobs, raw.trace.bytes().len() as u64);
        if let Some(unit) = unit_bytes {
            config.unit_bytes = unit;
        }
        // Coverage reads no times: units splice on wherever the flow meets.
        self.stretches(raw, Detail::Runs, false, config, new_fold, merge)
            .map(Some)
    }

    /// [`Source::run`]'s records of a raw Intel PT input decoded on `jobs`
    /// threads (work units of at least `unit_bytes`, when given), each
    /// stretch's records made by the thread that decoded it and handed to
    /// `sink` here, in trace order. `None` for other inputs.
    pub fn run_parallel(
        &self,
        detail: Detail,
        jobs: usize,
        unit_bytes: Option<u64>,
        sink: RecordSink<'_>,
    ) -> Result<Option<SourceReport>> {
        let Some(raw) = self.raw_pt_input() else {
            return Ok(None);
        };
        // Units small enough that the records they hold stay few (a run is
        // at least a TNT bit: at most a few records a trace byte), as many
        // in flight as keep the threads busy.
        let mut config = ParallelConfig::counting(jobs, 0);
        config.unit_bytes = unit_bytes.unwrap_or(RECORD_UNIT);
        config.unit_items = RECORD_ITEMS;
        // A unit's records wait in memory until the answer takes them: a
        // unit for each worker and two ahead keep them busy (peak RSS about
        // threads + 2 units' records, 20 to 90 MiB on two threads).
        config.window = config.threads + 2;
        let mut seams = Seams::default();
        // Record buffers handed back once taken, for the next units: a
        // fresh one would grow by copying and fault its pages in.
        let spare = Mutex::new(Vec::<Vec<Exec>>::new());
        let take = || {
            spare
                .lock()
                .ok()
                .and_then(|mut s| s.pop())
                .unwrap_or_default()
        };
        let report = self.stretches(raw, detail, true, config, take, |mut records, _| {
            let done = records.drain(..).try_for_each(|e| seams.push(e, sink));
            if let Ok(mut s) = spare.lock() {
                s.push(records);
            }
            done
        })?;
        seams.finish(sink)?;
        Ok(Some(report))
    }

    /// The decode both share: `detail`'s records of each stretch of `raw`
    /// into a fold, timed or not, split as `config` says.
    fn stretches<F: Fold>(
        &self,
        raw: &RawPt,
        detail: Detail,
        timed: bool,
        mut config: ParallelConfig,
        new_fold: impl Fn() -> F + Sync,
        mut merge: impl FnMut(F, Option<u64>) -> Result<()>,
    ) -> Result<SourceReport> {
        let bytes = raw.trace.bytes();
        let len = bytes.len() as u64;
        // The merging thread's own decode (a unit no seam joins, or the
        // whole trace when it is one unit) folds in stretches of this many
        // records: a fold's fixed cost (its maps) is small next to theirs.
        config.batch = config.batch.max(1 << 16);
        let (memory, decoder) = (&*raw.memory, raw.config);
        let make = || {
            let source = FastSource::runs(FastDecoder::new(bytes, decoder, memory), MAX_STALL);
            if timed { source } else { source.untimed() }
        };
        let join = detail == Detail::Calls;
        let name = raw.name();
        let new_sink = |_| Stretch {
            mapper: ItemMapper::new(0, len, name.clone()),
            fold: new_fold(),
            report: SourceReport::default(),
            offset: None,
            join,
            open: None,
        };
        let mut report = self.new_report();
        parallel::decode_into(bytes, &config, make, new_sink, |mut s: Stretch<F>| {
            s.close();
            report.add(s.report);
            if let Some(offset) = s.offset {
                raw.trace.decoded_to(offset);
            }
            merge(s.fold, s.offset)
        })?;
        // The end of the trace, as the decode on one thread ends it.
        let mut end = new_sink(0);
        let fold = &mut end.fold;
        end.mapper.gap(
            len,
            GapKind::Disabled,
            &mut |e| {
                fold.push(&e);
                Ok(())
            },
            &mut end.report,
        )?;
        report.add(end.report);
        merge(end.fold, Some(len))?;
        Ok(report)
    }
}

/// The records of consecutive stretches, decoded apart, handed on as one
/// decode hands them out: a [`Detail::Calls`] stretch a seam cut in two is
/// joined again (no record came between its halves), and a time the
/// stretch before already said is not said twice (a unit's decode starts
/// without the last time, as the one decode does not).
#[derive(Default)]
struct Seams {
    /// The last stretch, held while the next record may join it.
    pending: Option<ExecRun>,
    last_time: Option<u64>,
}

impl Seams {
    fn push(&mut self, e: Exec, sink: RecordSink<'_>) -> Result<()> {
        match e {
            Exec::Stretch(s) => {
                return match ExecRun::join_into(&mut self.pending, s) {
                    Some(p) => sink(Exec::Stretch(p)),
                    None => Ok(()),
                };
            }
            Exec::Time(t) if self.last_time == Some(t) => return Ok(()),
            Exec::Time(t) => self.last_time = Some(t),
            _ => {}
        }
        self.finish(sink)?;
        sink(e)
    }

    /// Hands on the stretch held.
    fn finish(&mut self, sink: RecordSink<'_>) -> Result<()> {
        match self.pending.take() {
            Some(p) => sink(Exec::Stretch(p)),
            None => Ok(()),
        }
    }
}

/// The least trace bytes of a work unit whose records are handed over
/// ([`Source::run_parallel`]): large enough that a unit's fixed costs (the
/// next unit's anchor found twice, the clock warmed over the bytes before
/// its PSB) stay small (on the benchmark's real traces, 128 KiB units
/// took a fifth more CPU than 512 KiB ones).
const RECORD_UNIT: u64 = 512 << 10;

/// The most items and runs a worker keeps for one unit of records (a
/// record is 64 bytes: at most 64 MiB a unit, whatever the code; a loop
/// calling a small function makes several records a trace byte). Past it
/// the merging thread decodes the rest of the unit. The benchmark's
/// traces make 1 to 3 runs a byte: a quarter of this stopped most units
/// early (no faster than one thread).
const RECORD_ITEMS: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::insn::InsnClass;
    use hwtrace_types::{AddressSpace, Ip, TraceOffset};

    fn stretch(ip: u64, insns: u32, last: InsnClass) -> Exec {
        Exec::Stretch(ExecRun {
            space: AddressSpace::UNKNOWN,
            ip: Ip(ip),
            insns,
            last_ip: Ip(ip + u64::from(insns) - 1),
            last_size: 1,
            last_class: last,
        })
    }

    /// Records of stretches decoded apart, through [`Seams`].
    fn through(stretches: &[&[Exec]]) -> Vec<Exec> {
        let mut seams = Seams::default();
        let mut out = Vec::new();
        let mut sink = |e| {
            out.push(e);
            Ok(())
        };
        for records in stretches {
            for &e in *records {
                seams.push(e, &mut sink).unwrap();
            }
        }
        seams.finish(&mut sink).unwrap();
        out
    }

    #[test]
    fn a_stretch_cut_by_a_seam_is_joined_and_a_time_said_once() {
        let gap = Exec::Gap {
            offset: TraceOffset(9),
            why: GapKind::Disabled,
        };
        // 0x10..0x13 (a jump) and 0x20..0x21 (a call) are one stretch:
        // joined across the seam; the call ends it.
        let got = through(&[
            &[Exec::Time(5), stretch(0x10, 4, InsnClass::Jump)],
            &[
                stretch(0x20, 2, InsnClass::Call),
                stretch(0x30, 1, InsnClass::Return),
                Exec::Time(5),
                Exec::Time(7),
            ],
            &[Exec::Time(7), gap, stretch(0x40, 3, InsnClass::Other)],
        ]);
        let joined = Exec::Stretch(ExecRun {
            space: AddressSpace::UNKNOWN,
            ip: Ip(0x10),
            insns: 6,
            last_ip: Ip(0x21),
            last_size: 1,
            last_class: InsnClass::Call,
        });
        assert_eq!(
            got,
            [
                Exec::Time(5),
                joined,
                stretch(0x30, 1, InsnClass::Return),
                Exec::Time(7),
                gap,
                stretch(0x40, 3, InsnClass::Other),
            ]
        );
    }
}
