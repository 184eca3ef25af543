//! The input every answer is computed from.
//!
//! A front end (the `hwtrace` command line) decodes whatever the user gave
//! it and hands the answers a stream of [`Exec`] records in trace order.
//! Keeping this vocabulary small and independent of how the trace was
//! decoded is what lets coverage, call trees and timelines work the same
//! on PT, perf.data, BTS and LBR input.

use hwtrace_flow::insn::InsnClass;
use hwtrace_types::{AddressSpace, Cr3, Ip, TraceOffset};
use std::path::PathBuf;

/// One record of the executed flow.
///
/// The tag is a whole word (`repr(u64)`): with a one-byte tag, a record
/// built on the stack was copied into place from byte 1 on, its padding
/// included, and the copy's loads straddled the stores that had just
/// written the fields, which the processor cannot forward (a stall per
/// record: 16% of `hwtrace coverage`'s time on the real traces).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Exec {
    /// An instruction was executed.
    Insn(ExecInsn),
    /// Instructions were executed one after the other in consecutive
    /// memory: what `insns` [`Exec::Insn`] records in a row would say, in
    /// one record (decoders that keep runs hand these out where the flow
    /// is plain code). Only the last may transfer control.
    Run(ExecRun),
    /// Runs executed one after the other whose control transfers in
    /// between neither call nor return (jumps, conditional jumps, plain
    /// code): `ip` is the first run's address, `insns` all of theirs, the
    /// `last_*` fields the last run's. What the call/return structure needs
    /// of them in one record; a source hands these out only to answers
    /// that asked for the call structure alone ([`Detail::Calls`]), never
    /// to one that looks at each block.
    Stretch(ExecRun),
    /// A branch whose source and target are known but whose straight-line
    /// code in between was not traced instruction by instruction (BTS
    /// records, LBR entries).
    Branch {
        /// The branch instruction's address.
        from: Ip,
        /// Where it went.
        to: Ip,
        /// Its class when known (`InsnClass::Unknown` otherwise).
        class: InsnClass,
    },
    /// The flow is not continuous here: tracing was disabled, data was
    /// lost (overflow, decode error, lost AUX data), or the decoder
    /// resynchronised. The next instruction does not follow the previous.
    Gap {
        /// Where in the trace (or the perf.data file) it happened.
        offset: TraceOffset,
        /// Why, in words (for reports).
        why: GapKind,
    },
    /// Time moved: the estimated TSC at this point (timing packets, or
    /// perf sample times converted to TSC).
    Time(u64),
    /// The following records belong to this thread (perf sideband switch
    /// records, or a per-thread stream starting).
    Thread {
        /// Process id, if known.
        pid: Option<u32>,
        /// Thread id (`None`: the stream's thread is not known, e.g. a
        /// per-CPU stream without switch records).
        tid: Option<u32>,
        /// The CPU it ran on, if known (per-CPU recordings).
        cpu: Option<u32>,
    },
}

/// How much of the flow an answer needs from a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Every run of consecutive instructions ([`Exec::Run`], [`Exec::Insn`]):
    /// answers that look at blocks and edges (coverage).
    Runs,
    /// The call/return structure: runs whose last instruction neither
    /// calls nor returns may be joined with the ones after them into an
    /// [`Exec::Stretch`] (call trees, reports, timelines). Most runs of a
    /// trace end in a jump or a conditional jump: far fewer records.
    Calls,
}

impl ExecRun {
    /// Whether the run's last instruction leaves the call stack alone, so
    /// that for [`Detail::Calls`] the next run may be joined to it: not a
    /// call (near or far, of any length) and not a return.
    pub fn joins_next(&self) -> bool {
        !matches!(
            self.last_class,
            InsnClass::Call | InsnClass::FarCall | InsnClass::Return | InsnClass::FarReturn
        )
    }

    /// Joins the run `next` (which came right after) to this one when
    /// [`joins_next`](Self::joins_next) allows it and the instruction count
    /// fits: the first address stays, the count adds up, the last
    /// instruction is `next`'s. Whether it did.
    pub fn join(&mut self, next: &ExecRun) -> bool {
        let Some(insns) = self.insns.checked_add(next.insns) else {
            return false;
        };
        if !self.joins_next() {
            return false;
        }
        self.insns = insns;
        self.last_ip = next.last_ip;
        self.last_size = next.last_size;
        self.last_class = next.last_class;
        true
    }

    /// Adds `next` (the run right after) to the stretch `open` is joining:
    /// joined to it where [`join`](Self::join) allows, else `open` starts
    /// over with `next` and the stretch it held is returned, to be handed
    /// on.
    pub fn join_into(open: &mut Option<ExecRun>, next: ExecRun) -> Option<ExecRun> {
        if let Some(s) = open.as_mut()
            && s.join(&next)
        {
            return None;
        }
        open.replace(next)
    }
}

/// An executed instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecInsn {
    /// The address space it ran in.
    pub space: AddressSpace,
    /// Its address.
    pub ip: Ip,
    /// Its length in bytes (0 if it could not be decoded).
    pub size: u8,
    /// Its control-flow class.
    pub class: InsnClass,
}

/// Instructions executed in a row ([`Exec::Run`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecRun {
    /// The address space they ran in.
    pub space: AddressSpace,
    /// The first one's address.
    pub ip: Ip,
    /// How many (at least one).
    pub insns: u32,
    /// The last one's address.
    pub last_ip: Ip,
    /// The last one's length in bytes (0 if it could not be decoded).
    pub last_size: u8,
    /// The last one's control-flow class (the others are plain).
    pub last_class: InsnClass,
}

impl From<ExecInsn> for ExecRun {
    /// One instruction as a run of one.
    fn from(i: ExecInsn) -> Self {
        Self {
            space: i.space,
            ip: i.ip,
            insns: 1,
            last_ip: i.ip,
            last_size: i.size,
            last_class: i.class,
        }
    }
}

impl ExecRun {
    /// The last instruction as an [`ExecInsn`].
    pub fn last(&self) -> ExecInsn {
        ExecInsn {
            space: self.space,
            ip: self.last_ip,
            size: self.last_size,
            class: self.last_class,
        }
    }
}

/// `execs` with instructions in a row gathered into [`Exec::Run`]s of at
/// most `max` instructions, as a decoder that keeps runs hands them out
/// (every instruction but a run's last plain, contiguous, in one space):
/// for tests that answers give the same for both.
#[cfg(test)]
pub(crate) fn as_runs(execs: &[Exec], max: u32) -> Vec<Exec> {
    let mut out: Vec<Exec> = Vec::new();
    let mut open: Option<ExecRun> = None;
    for e in execs {
        let Exec::Insn(i) = *e else {
            out.extend(open.take().map(Exec::Run));
            out.push(*e);
            continue;
        };
        let next = ExecRun::from(i);
        open = match open {
            Some(r)
                if r.insns < max
                    && r.space == i.space
                    && r.last_size > 0
                    && matches!(r.last_class, InsnClass::Other | InsnClass::Ptwrite)
                    && r.last_ip.0.wrapping_add(u64::from(r.last_size)) == i.ip.0 =>
            {
                Some(ExecRun {
                    insns: r.insns + 1,
                    last_ip: i.ip,
                    last_size: i.size,
                    last_class: i.class,
                    ..r
                })
            }
            r => {
                out.extend(r.map(Exec::Run));
                Some(next)
            }
        };
    }
    out.extend(open.map(Exec::Run));
    out
}

/// `execs` as a source hands them out for [`Detail::Calls`]: instructions
/// in a row gathered into runs ([`as_runs`]), then each run that neither
/// calls nor returns joined with the runs after it (in the same space)
/// into an [`Exec::Stretch`]: for tests that call answers give the same
/// for both.
#[cfg(test)]
pub(crate) fn as_stretches(execs: &[Exec], max: u32) -> Vec<Exec> {
    let mut out: Vec<Exec> = Vec::new();
    let mut open: Option<ExecRun> = None;
    for e in as_runs(execs, max) {
        let Exec::Run(r) = e else {
            out.extend(open.take().map(Exec::Stretch));
            out.push(e);
            continue;
        };
        if let Some(s) = open.as_mut()
            && s.space == r.space
            && s.join(&r)
        {
            continue;
        }
        out.extend(open.replace(r).map(Exec::Stretch));
    }
    out.extend(open.map(Exec::Stretch));
    out
}

/// Why the flow breaks at an [`Exec::Gap`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GapKind {
    /// Tracing was disabled by a branch (TIP.PGD: out of the IP filter,
    /// into the kernel) or at the end of a stream; the flow goes on where
    /// it is enabled again.
    Disabled,
    /// Tracing was disabled between two instructions (FUP + TIP.PGD: an
    /// interrupt, an exception, a VM exit); the flow goes on where it is
    /// enabled again.
    Interrupted,
    /// The processor's internal buffer overflowed (OVF).
    Overflow,
    /// A decode error; decoding resumed at the next PSB.
    DecodeError,
    /// Trace data was lost before it reached us (perf LOST/truncated AUX).
    Lost,
    /// Instructions decoded on without reading trace for too long (a loop
    /// of direct branches): the decoder gave up there and resynchronised.
    Stuck,
}

impl GapKind {
    /// Whether the flow goes on after the gap (tracing was off, nothing
    /// was lost): calls stay open, edges join the blocks on either side.
    pub fn flow_goes_on(self) -> bool {
        matches!(self, Self::Disabled | Self::Interrupted)
    }
}

/// A file's bytes mapped at an address: what the front end loaded to
/// decode (image options, perf MMAP records) or knows was mapped, so that
/// the symboliser and coverage's module table name the same files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The file (it may not exist on this machine: then addresses in it
    /// are named `file+0xoff`).
    pub path: PathBuf,
    /// The address space it is mapped in (`None`: every space).
    pub cr3: Option<Cr3>,
    /// The process it is mapped in (`None`: every process), for perf.data.
    pub pid: Option<u32>,
    /// Its first address.
    pub start: Ip,
    /// Its length in bytes.
    pub len: u64,
    /// The file offset of the byte at `start`.
    pub file_offset: u64,
}

impl Mapping {
    /// Whether `ip` falls inside.
    pub fn contains(&self, ip: Ip) -> bool {
        ip.0.wrapping_sub(self.start.0) < self.len
    }
}
