//! intel_bts AUX data: the 64-bit BTS records the hardware wrote (branch
//! from, branch to, flags with bit 4 "predicted"; SDM Vol. 3B §18.4.9,
//! read with [`hwtrace_regs::bts::BtsRecord`]), 24 bytes each, one after the
//! other in the AUX stream.
//!
//! Each record is one taken branch (or interrupt) of the queue's thread; on
//! a per-CPU queue, of the thread switched in when perf read the buffer
//! (see [`BufferTimes`]).
//! Its kind is read from the code at `from` in the process's image, as
//! perf's intel-bts decoder does; where that code is missing the kind is
//! `?` and the mapping is blamed, with a count, at the end. All-zero
//! records are the kernel's padding between buffer halves and are skipped
//! (perf skips them too). A record cut by a gap between AUXTRACE buffers,
//! or by the end of the stream, is reported with its offset and size.
//!
//! Unlike perf (`intel_bts_process_buffer` loops while more than one
//! record is left in a buffer, so it never reports a buffer's last
//! record), every complete record is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use anyhow::Result;
use hwtrace_flow::insn::{InsnClass, MAX_INSN_SIZE, classify};
use hwtrace_packet::ExecMode;
use hwtrace_perf::data::{AuxQueue, FileOffset, QueueKey, TscConversion};
use hwtrace_regs::bts::BtsRecord;
use hwtrace_regs::ds::DsFormat;
use hwtrace_types::{AddressSpace, Ip, ReadMemory};
use serde_json::json;

use super::image::{self, ImageOptions, ProcessImage};
use super::kernel::Kernel;
use super::sideband::Sideband;
use super::stream::{Options, QueueReport, Shown, perf_time, show};
use super::symbols::Names;

/// Bytes per record (the 64-bit DS layout).
pub const RECORD: usize = 24;

/// The class of the instruction at `from`; `Unknown` when the code
/// cannot be read.
fn class_at(image: &ProcessImage, from: u64) -> InsnClass {
    let mut raw = [0u8; MAX_INSN_SIZE];
    let Ok(n) = image
        .image
        .read_memory(AddressSpace::UNKNOWN, Ip(from), &mut raw)
    else {
        return InsnClass::Unknown;
    };
    classify(&raw[..n], from, ExecMode::Bits64).map_or(InsnClass::Unknown, |d| d.class)
}

/// The kind of a branch whose instruction is of `class`, as `hwtrace perf
/// decode --branches` names PT branches; `None` when the code could not be
/// read.
fn kind_name(class: InsnClass) -> Option<&'static str> {
    Some(match class {
        InsnClass::Call => "call",
        InsnClass::Return => "return",
        InsnClass::Jump => "jmp",
        InsnClass::CondJump => "jcc",
        InsnClass::FarCall => "far call",
        InsnClass::FarReturn => "far return",
        InsnClass::FarJump => "far jmp",
        // Not a branch: the record is an interrupt or exception taken
        // at this instruction.
        InsnClass::Other | InsnClass::Ptwrite => "interrupt",
        InsnClass::Unknown => return None,
    })
}

/// When each AUXTRACE buffer was read: perf record puts the TSC in the
/// record's `reference`; BTS records carry no time, so on a per-CPU queue
/// a buffer's branches go to the thread switched in at that time (as
/// perf's intel-bts decoder attributes them).
#[derive(Clone, Copy, Debug)]
pub struct BufferTimes<'a> {
    /// AUXTRACE_INFO's TSC conversion.
    pub tsc: TscConversion,
    /// Each AUXTRACE record's `reference`, by its file offset.
    pub reference: &'a BTreeMap<FileOffset, u64>,
}

/// One step through a queue's records ([`BtsDecoder::walk`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BtsStep {
    /// `bytes` were lost before the buffer at stream offset `at`, whose
    /// AUXTRACE record is at file offset `record`.
    Lost {
        bytes: u64,
        at: u64,
        record: FileOffset,
    },
    /// A record cut short: `bytes` of it at stream offset `at`, which no
    /// more bytes complete; not decoded.
    Cut { bytes: usize, at: u64 },
    /// A taken branch (or interrupt) of the current thread
    /// ([`BtsDecoder::tid`]): from, to, the class of the instruction at
    /// `from` (`Unknown`: its code could not be read), and whether the
    /// hardware said it was predicted.
    Branch {
        from: u64,
        to: u64,
        class: InsnClass,
        predicted: bool,
    },
}

/// Decodes one intel_bts queue.
pub struct BtsDecoder<'s> {
    key: QueueKey,
    tid: Option<u32>,
    pid: Option<u32>,
    /// Image 0: the queue's thread's process, or every process that ran
    /// on the CPU; with buffer times, one image per process after it.
    images: Vec<ProcessImage>,
    image_of_pid: BTreeMap<u32, usize>,
    current: usize,
    /// Per-CPU queues with timed switch records and buffer times.
    timeline: Option<(&'s Sideband, BufferTimes<'s>)>,
    /// Threads that ran on the queue's CPU when neither the queue nor
    /// timed switch records say which one a branch is of.
    unattributed: Option<usize>,
    /// Per missing mapping (MMAP record offset): branches not classified.
    blame: BTreeMap<FileOffset, u64>,
    /// Branches whose code is in no mapping at all.
    unmapped: u64,
    report: QueueReport,
}

impl<'s> BtsDecoder<'s> {
    /// Works out the thread (per buffer, from `times`, on per-CPU queues
    /// with switch records) and builds the images.
    pub fn new(
        key: QueueKey,
        sb: &'s Sideband,
        opts: &ImageOptions,
        times: Option<BufferTimes<'s>>,
        kernel: &Kernel,
        build_ids: &mut image::BuildIdCache,
    ) -> Result<Self> {
        let times = times.filter(|t| {
            key.tid == u32::MAX
                && key.cpu != u32::MAX
                && sb.switches.contains_key(&key.cpu)
                && (t.tsc.cap_user_time_zero || t.tsc.time_mult != 0)
        });
        let tid = if key.tid != u32::MAX {
            Some(key.tid)
        } else {
            sb.only_thread_on(key.cpu)
        };
        let unattributed = (tid.is_none() && times.is_none()).then(|| sb.thread_count_on(key.cpu));
        let pid = tid.and_then(|t| sb.pid_of.get(&t).copied());
        let pids: Option<BTreeSet<u32>> = if times.is_some() {
            Some(sb.pids_switched_in(key.cpu))
        } else {
            pid.map(|p| BTreeSet::from([p]))
        };
        let mut images = vec![image::build_with_kernel(
            sb,
            pids.as_ref(),
            opts,
            kernel,
            build_ids,
        )?];
        let mut image_of_pid = BTreeMap::new();
        if times.is_some() {
            for &p in pids.iter().flatten() {
                let one = BTreeSet::from([p]);
                image_of_pid.insert(p, images.len());
                images.push(image::build_with_kernel(
                    sb,
                    Some(&one),
                    opts,
                    kernel,
                    build_ids,
                )?);
            }
        }
        Ok(Self {
            key,
            tid,
            pid,
            images,
            image_of_pid,
            current: 0,
            timeline: times.map(|t| (sb, t)),
            unattributed,
            blame: BTreeMap::new(),
            unmapped: 0,
            report: QueueReport::default(),
        })
    }

    /// The mappings that could not be loaded, over all images (the same
    /// mapping may be listed more than once).
    pub fn missing(&self) -> impl Iterator<Item = &image::Missing> {
        self.images.iter().flat_map(|i| &i.missing)
    }

    /// The buffer at `record` was read: the thread switched in then runs.
    fn at_buffer(&mut self, record: FileOffset) {
        let Some((sb, times)) = self.timeline else {
            return;
        };
        let Some(&reference) = times.reference.get(&record) else {
            return;
        };
        let time = perf_time(&times.tsc, reference);
        let Some(tid) = sb.thread_at(self.key.cpu, time) else {
            return;
        };
        self.tid = Some(tid);
        self.pid = sb.pid_of.get(&tid).copied();
        self.current = self
            .pid
            .and_then(|p| self.image_of_pid.get(&p).copied())
            .unwrap_or(0);
    }

    /// The thread the branches are of at this point of a walk (`None`:
    /// not known).
    pub fn tid(&self) -> Option<u32> {
        self.tid
    }

    /// The process of [`Self::tid`].
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// How many threads ran on the queue's CPU when nothing says which
    /// one each branch is of (`None`: the thread is known, or timed switch
    /// records tell).
    pub fn unattributed_threads(&self) -> Option<usize> {
        self.unattributed
    }

    /// Walks every record of `queue` in order: each buffer switches to
    /// the thread read in then (per-CPU queues with timed switch records),
    /// records split across two AUXTRACE buffers are put together, lost
    /// data and records cut short are steps of their own, the kernel's
    /// all-zero padding records are counted and skipped. `f` sees each
    /// step with the decoder (its thread) as it stands then.
    pub fn walk(
        &mut self,
        queue: &AuxQueue<'_>,
        mut f: impl FnMut(&Self, BtsStep) -> Result<()>,
    ) -> Result<()> {
        let gap_at: BTreeMap<FileOffset, u64> = queue
            .gaps
            .iter()
            .map(|g| (g.record_offset, g.lost_bytes()))
            .collect();
        // A record split across two AUXTRACE buffers is put together here.
        let mut carry: Vec<u8> = Vec::with_capacity(RECORD);
        let mut carry_at = 0u64;
        for c in &queue.chunks {
            self.at_buffer(c.record_offset);
            if let Some(&bytes) = gap_at.get(&c.record_offset) {
                self.report.lost_bytes += bytes;
                let at = c.stream_offset;
                f(
                    self,
                    BtsStep::Lost {
                        bytes,
                        at,
                        record: c.record_offset,
                    },
                )?;
                self.cut(&mut carry, carry_at, &mut f)?;
            }
            let mut data = c.data;
            let mut at = c.stream_offset;
            if !carry.is_empty() {
                let need = (RECORD - carry.len()).min(data.len());
                carry.extend_from_slice(&data[..need]);
                data = &data[need..];
                at += need as u64;
                if carry.len() == RECORD {
                    let rec = std::mem::take(&mut carry);
                    self.record(&rec, &mut f)?;
                }
            }
            let mut records = data.chunks_exact(RECORD);
            for rec in &mut records {
                self.record(rec, &mut f)?;
                at += RECORD as u64;
            }
            let rest = records.remainder();
            if !rest.is_empty() {
                carry_at = at;
                carry.extend_from_slice(rest);
            }
        }
        self.cut(&mut carry, carry_at, &mut f)
    }

    /// A partial record that no more bytes complete.
    fn cut(
        &mut self,
        carry: &mut Vec<u8>,
        at: u64,
        f: &mut impl FnMut(&Self, BtsStep) -> Result<()>,
    ) -> Result<()> {
        if carry.is_empty() {
            return Ok(());
        }
        self.report.skipped_bytes += carry.len() as u64;
        let bytes = carry.len();
        carry.clear();
        f(self, BtsStep::Cut { bytes, at })
    }

    fn record(
        &mut self,
        rec: &[u8],
        f: &mut impl FnMut(&Self, BtsStep) -> Result<()>,
    ) -> Result<()> {
        let Ok(r) = BtsRecord::parse(rec, DsFormat::Bits64) else {
            return Ok(());
        };
        let (from, to) = (r.from.0, r.to.0);
        if from == 0 && to == 0 {
            self.report.padding_records += 1;
            return Ok(());
        }
        self.report.branches += 1;
        let image = &self.images[self.current];
        let class = class_at(image, from);
        if class == InsnClass::Unknown {
            self.report.errors += 1;
            match image.missing_at(from) {
                Some(i) => {
                    *self
                        .blame
                        .entry(image.missing[i].mapping.record_offset)
                        .or_default() += 1
                }
                None => self.unmapped += 1,
            }
        }
        f(
            self,
            BtsStep::Branch {
                from,
                to,
                class,
                predicted: r.predicted,
            },
        )
    }

    /// Branches whose kind could not be read, in words: per mapping whose
    /// code is missing, and those no mapping holds.
    pub fn unclassified(&self) -> Vec<String> {
        let key = self.key;
        let mut said = BTreeSet::new();
        let mut out = Vec::new();
        for m in self.images.iter().flat_map(|i| &i.missing) {
            let Some(&n) = self.blame.get(&m.mapping.record_offset) else {
                continue;
            };
            if !said.insert(m.mapping.record_offset) {
                continue;
            }
            out.push(format!(
                "{key}, pid {}: cannot read code of {} mapped at {:#x}-{:#x} (MMAP record at file offset {}): {}; the kind of {n} branches from it is shown as ?",
                m.mapping.pid,
                m.path,
                m.mapping.addr,
                m.mapping.addr.wrapping_add(m.mapping.len),
                m.mapping.record_offset,
                m.reason
            ));
        }
        if self.unmapped > 0 {
            out.push(format!(
                "{key}: {} branches from addresses no MMAP record maps: their kind is shown as ?",
                self.unmapped
            ));
        }
        out
    }

    /// Decodes every record of `queue`, printing as `opts` says.
    pub fn run(
        mut self,
        queue: &AuxQueue<'_>,
        mut names: Option<&mut Names<'_>>,
        opts: &Options,
        out: &mut dyn Write,
        diag: &mut dyn Write,
    ) -> Result<QueueReport> {
        let key = self.key;
        let mut problems = 0;
        // Said, but not a problem of the trace (exit code 0).
        if let Some(n) = self.unattributed {
            writeln!(
                diag,
                "hwtrace perf decode: {key}: {n} threads ran on this CPU, BTS records carry no time and no timed switch records say which ran when: its branches are shown with tid ?"
            )?;
        }
        self.walk(queue, |dec, step| {
            match step {
                BtsStep::Lost { bytes, at, record } => {
                    problems += 1;
                    writeln!(
                        diag,
                        "hwtrace perf decode: {key}: lost {bytes} bytes of BTS records ({} records) at stream offset {at:#x} (before the AUXTRACE record at file offset {record})",
                        bytes / RECORD as u64
                    )?;
                }
                BtsStep::Cut { bytes, at } => {
                    problems += 1;
                    writeln!(
                        diag,
                        "hwtrace perf decode: {key}: a BTS record cut short: {bytes} of its {RECORD} bytes at stream offset {at:#x}, not decoded"
                    )?;
                }
                BtsStep::Branch {
                    from,
                    to,
                    class,
                    predicted,
                } => {
                    if opts.format != super::Format::Stats {
                        let syms = names
                            .as_deref_mut()
                            .map(|n| (n.name(dec.pid, from), n.name(dec.pid, to)));
                        print_branch(dec, (from, to, class, predicted), syms, opts.json, out)?;
                    }
                }
            }
            Ok(())
        })?;
        for line in self.unclassified() {
            problems += 1;
            writeln!(diag, "hwtrace perf decode: {line}")?;
        }
        self.report.problems += problems;
        Ok(self.report)
    }
}

/// One branch line (or JSON object) of `hwtrace perf decode` for BTS.
fn print_branch(
    dec: &BtsDecoder<'_>,
    (from, to, class, predicted): (u64, u64, InsnClass, bool),
    syms: Option<(Option<String>, Option<String>)>,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let kind = kind_name(class).unwrap_or("?");
    let key = dec.key;
    if json {
        let mut v = json!({"tid": dec.tid, "cpu": (key.cpu != u32::MAX).then_some(key.cpu),
            "from": format!("{from:#x}"), "to": format!("{to:#x}"), "kind": kind,
            "predicted": predicted});
        if let Some((f, t)) = syms {
            v["from_sym"] = json!(f);
            v["to_sym"] = json!(t);
        }
        writeln!(out, "{v}")?;
    } else {
        let paren = |s: &Option<String>| format!(" ({})", s.as_deref().unwrap_or("?"));
        let (fs, ts) = syms
            .as_ref()
            .map_or((String::new(), String::new()), |(f, t)| {
                (paren(f), paren(t))
            });
        let tid = dec.tid.map_or(Shown::Unknown, Shown::Num);
        writeln!(
            out,
            "{tid} {} {from:x}{fs} -> {to:x}{ts} {kind}",
            show(key.cpu)
        )?;
    }
    Ok(())
}
