//! Answers built on every core: a raw Intel PT trace decoded by PSB units
//! on the parallel engine's workers, each stretch's records folded by the
//! worker that decoded them ([`Fold`]) and the folds handed back in trace
//! order, for the answer to merge.
//!
//! For answers whose work on a stretch can be done without the stretches
//! before it and merged afterwards (coverage: `CoveragePart`). Nothing per
//! record crosses threads: handing each run to one answering thread costs
//! about what coverage's own work on it does. The records a fold takes are
//! those [`Source::run_here`] hands out for the same stretch; a stretch's
//! records that depend on the ones before (the address space) start from
//! the decoder's state where it starts ([`Sink::starts_at`]).

use super::pt::ItemMapper;
use super::{Source, SourceReport};
use crate::flow::Item;
use anyhow::Result;
use hwtrace_flow::insn::FastDecoder;
use hwtrace_flow::parallel::{
    self, FastSource, FlowItem, MAX_STALL, ParallelConfig, PassedRun, Probe, Sink,
};
use hwtrace_report::coverage::CoveragePart;
use hwtrace_report::exec::{Exec, GapKind};

/// What an answer makes of one stretch's records, on the thread that
/// decoded them.
pub trait Fold: Send {
    /// Takes the stretch's next record.
    fn push(&mut self, exec: &Exec);
}

impl Fold for CoveragePart {
    #[inline]
    fn push(&mut self, exec: &Exec) {
        CoveragePart::push(self, exec);
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
}

impl<F: Fold> Sink for Stretch<F> {
    fn keeps_runs(&self) -> bool {
        true
    }

    fn folds(&self) -> bool {
        true
    }

    fn starts_at(&mut self, probe: &Probe) {
        self.mapper.set_space(probe.space);
    }

    #[inline]
    fn push_run(&mut self, r: &PassedRun) {
        self.offset = Some(r.before.0);
        self.report.insns += u64::from(r.run.insns);
        self.fold.push(&Exec::Run(self.mapper.run_record(r)));
    }

    fn push(&mut self, item: FlowItem) {
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
    /// decoded to, the last one holding the end of the trace. `None` for other inputs (perf.data, branch lists),
    /// which decode on one thread ([`Source::run`]). An error from `merge`
    /// stops the decode and is returned.
    pub fn run_folded<F: Fold>(
        &self,
        jobs: usize,
        unit_bytes: Option<u64>,
        new_fold: impl Fn() -> F + Sync,
        mut merge: impl FnMut(F, Option<u64>) -> Result<()>,
    ) -> Result<Option<SourceReport>> {
        let Some(pt) = self.raw_pt_input() else {
            return Ok(None);
        };
        let bytes = pt.trace.bytes();
        let len = bytes.len() as u64;
        let mut config = ParallelConfig::counting(jobs, len);
        if let Some(unit) = unit_bytes {
            config.unit_bytes = unit;
        }
        // The merging thread's own decode (a unit no seam joins, or the
        // whole trace when it is one unit) folds in stretches of this many
        // records: a fold's fixed cost (its maps) is small next to theirs.
        config.batch = 1 << 20;
        let (memory, decoder) = (pt.memory, pt.config);
        // Coverage reads no times: units splice on wherever the flow meets.
        let make =
            || FastSource::runs(FastDecoder::new(bytes, decoder, memory), MAX_STALL).untimed();
        let new_sink = |_| Stretch {
            mapper: ItemMapper::new(0, len, pt.name.clone()),
            fold: new_fold(),
            report: SourceReport::default(),
            offset: None,
        };
        let mut report = self.new_report();
        parallel::decode_into(bytes, &config, make, new_sink, |s: Stretch<F>| {
            report.add(s.report);
            if let Some(offset) = s.offset {
                pt.trace.decoded_to(offset);
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
        Ok(Some(report))
    }
}
