//! Instruction-flow items as [`Exec`] records.

use super::source::{Sink, SourceReport};
use crate::flow::Item;
use anyhow::Result;
use hwtrace_flow::event::{Event, EventKind};
use hwtrace_flow::parallel::PassedRun;
use hwtrace_report::exec::{Detail, Exec, ExecInsn, ExecRun, GapKind};
use hwtrace_types::{AddressSpace, Cr3, Ip, TraceOffset};

/// Turns [`Item`]s of one trace into [`Exec`] records: the address space
/// follows PIP/VMCS events as the decoder's does (unknown again after a
/// resynchronisation), times come from events that carry a TSC, and
/// every break in the flow (disable, overflow, error, endless loop)
/// becomes a [`Exec::Gap`].
#[derive(Debug)]
pub struct ItemMapper {
    /// Added to every trace offset (a perf.data AUX run's place in its
    /// stream).
    base: u64,
    /// The trace's length (for the bytes skipped when no PSB is left).
    len: u64,
    space: AddressSpace,
    last_tsc: Option<u64>,
    /// Text put in front of problems ("FILE" or "cpu N tid M").
    what: String,
    /// Whether runs are joined into stretches ([`Detail::Calls`]).
    stretches: bool,
}

/// Problems kept in a [`SourceReport`] at most; the counts go on.
pub const MAX_PROBLEMS: usize = 1000;

impl ItemMapper {
    /// Items of a trace of `len` bytes whose offset 0 is at `base` in
    /// what the user calls the trace; `what` names it in problem reports.
    pub fn new(base: u64, len: u64, what: String) -> Self {
        Self {
            base,
            len,
            space: AddressSpace::UNKNOWN,
            last_tsc: None,
            what,
            stretches: false,
        }
    }

    /// Hands out what `detail` asks for (the default: every run).
    pub fn with_detail(mut self, detail: Detail) -> Self {
        self.stretches = detail == Detail::Calls;
        self
    }

    /// Sets the address space the records are in (where a stretch of a
    /// trace decoded apart starts: the decoder's).
    pub fn set_space(&mut self, space: AddressSpace) {
        self.space = space;
    }

    /// Run `r` as a record in the current address space.
    pub fn run_record(&self, r: &PassedRun) -> ExecRun {
        exec_run(self.space, r)
    }

    /// The TSC of `event` if it is new (for perf's thread switches).
    pub fn new_time(&self, event: &Event) -> Option<u64> {
        (event.has_tsc && self.last_tsc != Some(event.tsc)).then_some(event.tsc)
    }

    /// Maps one item, handing the records to `sink`.
    pub fn item(&mut self, item: Item, sink: Sink<'_>, report: &mut SourceReport) -> Result<()> {
        match item {
            Item::Insn { insn, .. } => {
                report.insns += 1;
                sink(Exec::Insn(ExecInsn {
                    space: self.space,
                    ip: Ip(insn.ip),
                    size: insn.size,
                    class: insn.class,
                }))?;
            }
            Item::Event { offset, event } => self.event(offset, &event, sink, report)?,
            Item::Error(e) => {
                report.errors += 1;
                if e.kind == hwtrace_flow::ErrorKind::BadStatusUpdate {
                    report.status_errors += 1;
                }
                let offset = self.base + e.offset.0;
                let ip = e.ip.map_or(String::new(), |ip| format!(", ip {ip:#x}"));
                report.problem(format!(
                    "{}: error at offset {offset:#x}{ip}: {}",
                    self.what, e.kind
                ));
                self.gap(offset, GapKind::DecodeError, sink, report)?;
            }
            Item::Resync { from, to } => {
                let end = to.unwrap_or(self.len);
                report.skipped_bytes += end.saturating_sub(from);
                // The decoder starts over at the PSB: the address space is
                // unknown until a PIP (or VMCS) packet says it, for the
                // code it reads and so for the records.
                self.space = AddressSpace::UNKNOWN;
            }
            Item::Stuck { offset, ip, insns } => {
                report.errors += 1;
                let offset = self.base + offset;
                report.problem(format!(
                    "{}: {insns} instructions up to ip {ip:#x} without trace at offset {offset:#x}: an endless loop, left at the next PSB",
                    self.what
                ));
                self.gap(offset, GapKind::Stuck, sink, report)?;
            }
            // Only produced by the reshaping iterators, which are not used.
            Item::Block(_) | Item::Branch(_) => {}
        }
        Ok(())
    }

    /// The runs `visit` passes over (a flow's `visit_runs`), each handed on
    /// as one `Exec::Run` (for [`Detail::Calls`], those after a run that
    /// neither calls nor returns joined to it into one `Exec::Stretch`); the
    /// first error of `sink` stops handing them on and is returned. `Some`:
    /// the trace offset the last run was decoded at.
    pub fn runs(
        &mut self,
        visit: impl FnOnce(&mut dyn FnMut(&PassedRun)) -> u64,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<Option<u64>> {
        let mut done = Ok(());
        let mut at = None;
        if self.stretches {
            // The stretch being joined: handed on when a run that calls or
            // returns ends it, or at the end of what `visit` passes over
            // (the records after it may change the space or break the
            // flow). Updated in place: most runs only add to it.
            let space = self.space;
            let mut open = None::<ExecRun>;
            visit(&mut |r| {
                at = Some(r.before.0);
                report.insns += u64::from(r.run.insns);
                if let Some(s) = ExecRun::join_into(&mut open, exec_run(space, r))
                    && done.is_ok()
                {
                    done = sink(Exec::Stretch(s));
                }
            });
            if let (Some(s), Ok(())) = (open, &done) {
                done = sink(Exec::Stretch(s));
            }
        } else {
            visit(&mut |r| {
                at = Some(r.before.0);
                if done.is_ok() {
                    done = self.run(r, sink, report);
                }
            });
        }
        done.map(|()| at)
    }

    /// A run of instructions passed over whole.
    fn run(&mut self, r: &PassedRun, sink: Sink<'_>, report: &mut SourceReport) -> Result<()> {
        report.insns += u64::from(r.run.insns);
        sink(Exec::Run(exec_run(self.space, r)))
    }

    /// A decode error already explained elsewhere (perf.data: inside a
    /// mapping whose code is missing, reported once per mapping): counted
    /// and a gap, without a problem line of its own.
    pub fn explained_error(
        &mut self,
        offset: u64,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        report.errors += 1;
        self.gap(self.base + offset, GapKind::DecodeError, sink, report)
    }

    fn event(
        &mut self,
        offset: u64,
        event: &Event,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        if let Some(tsc) = self.new_time(event) {
            self.last_tsc = Some(tsc);
            sink(Exec::Time(tsc))?;
        }
        let offset = self.base + offset;
        match event.kind {
            EventKind::Paging { cr3, .. } | EventKind::AsyncPaging { cr3, .. } => {
                self.space.cr3 = Some(Cr3(cr3));
            }
            EventKind::Vmcs { base } | EventKind::AsyncVmcs { base, .. } => {
                self.space.vmcs = Some(base);
            }
            EventKind::Disabled { .. } | EventKind::Stop if !event.status_update => {
                self.gap(offset, GapKind::Disabled, sink, report)?;
            }
            EventKind::AsyncDisabled { .. } if !event.status_update => {
                self.gap(offset, GapKind::Interrupted, sink, report)?;
            }
            EventKind::Overflow { .. } => {
                report.overflows += 1;
                report.problem(format!(
                    "{}: overflow at offset {offset:#x}: the processor lost trace",
                    self.what
                ));
                self.gap(offset, GapKind::Overflow, sink, report)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// The flow breaks at `offset`.
    pub fn gap(
        &mut self,
        offset: u64,
        why: GapKind,
        sink: Sink<'_>,
        report: &mut SourceReport,
    ) -> Result<()> {
        report.gaps += 1;
        sink(Exec::Gap {
            offset: TraceOffset(offset),
            why,
        })
    }
}

/// Run `r` in `space` as a record.
fn exec_run(space: AddressSpace, r: &PassedRun) -> ExecRun {
    ExecRun {
        space,
        ip: r.run.ip,
        insns: r.run.insns,
        last_ip: r.run.end_ip,
        last_size: r.run.end_size,
        last_class: r.run.end_class,
    }
}
