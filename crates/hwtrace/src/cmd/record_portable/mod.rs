//! `hwtrace record --portable`: a capture on any x86-64 Linux machine, with
//! or without Intel trace hardware.
//!
//! The command runs under qemu-user, single-stepped (hwtrace-sim's
//! [`QemuRecorder`]), so every executed user-space instruction is known.
//! That execution is then turned into what the hardware would have written
//! and saved in a perf.data shaped like a real `hwtrace record` capture:
//!
//! * `--pt` (default): the Intel PT of user-mode branch tracing
//!   ([`PtEncoder`] under a real capture's terms, `pt,branch,tsc,mtc,
//!   mtc_period=3` unless `--terms` says otherwise, timed by the
//!   simulator's clock: [`terms`]; `--filter` as an IP range), as one
//!   per-thread AUX stream: an `intel_pt`
//!   attribute, AUXTRACE_INFO, COMM, one MMAP2 per executable mapping,
//!   ITRACE_START, AUXTRACE + AUX, and build ids.
//! * `--bts`: the BTS records of the taken branches ([`BtsSim`]) as an
//!   `intel_bts` AUX stream.
//! * `--lbr`: one SAMPLE every [`LBR_PERIOD`] instructions with the 32-entry
//!   LBR stack of a Skylake ([`LbrSim`]) as its branch stack (the event is
//!   counted in instructions, not cycles: the emulator has no clock).
//!
//! Where the mappings come from is explained in [`maps`]. The PMU type
//! numbers written for `intel_pt`/`intel_bts` are the ones Linux gives
//! them on most Intel machines (8 and 9); perf matches them with
//! AUXTRACE_INFO, not with this machine's sysfs.
//!
//! Speed: qemu single-steps and logs every instruction: a few hundred
//! thousand instructions per second (`/bin/echo hi`, 279,397 instructions,
//! takes 1.6 s on a 2-core VM); meant for small programs and test inputs.
//! Options of the real capture that have no meaning here (`--snapshot`,
//! `-p`) are refused.

mod maps;
mod terms;

use std::ffi::OsString;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail, ensure};
use hwtrace_perf::capture::Tracer;
use hwtrace_perf::capture::session::{build_ids, machine_features};
use hwtrace_perf::data::attr::{Attr, attr_type, branch, flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{PerfDataWriter, RecordWriter, SampleData, intel_pt_attr};
use hwtrace_perf::data::{BranchEntry, IntelBtsInfo, IntelPtInfo};
use hwtrace_perf::pevent::SampleId;
use hwtrace_regs::Uarch;
use hwtrace_regs::debugctl::{DebugCtl, DebugCtlFlag, DebugCtlLayout};
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_sim::{
    BtsConfig, BtsSim, Execution, IpRange, LbrConfig, LbrSim, PtEncoder, QemuRecorder, RecordEnd,
    branches,
};
use hwtrace_types::Ip;

use maps::{GuestLog, Mapping, guest_mappings};
use terms::PtTerms;

/// Instructions between two LBR samples.
pub const LBR_PERIOD: u64 = 10_007;
/// The `intel_pt` PMU type written (see the module docs).
const PT_PMU_TYPE: u32 = 8;
/// The `intel_bts` PMU type written.
const BTS_PMU_TYPE: u32 = 9;
/// The sample id every record carries.
const EVENT_ID: u64 = 1;

/// What to record.
#[derive(Debug, Clone)]
pub struct PortableRequest {
    /// PT, BTS or LBR.
    pub tracer: Tracer,
    /// `--kernel` was asked for (refused: qemu-user sees no kernel).
    pub kernel: bool,
    /// `--filter ADDR/SIZE@FILE`.
    pub filter: Option<String>,
    /// `--terms`: the `intel_pt` config terms (PT only).
    pub terms: Option<String>,
    /// `-j`: perf's `branch_sample_type` names (LBR).
    pub branch_filter: Option<String>,
    /// Real-capture options given that do not apply (refused).
    pub inapplicable: Vec<&'static str>,
    /// The output file.
    pub output: PathBuf,
    /// The command.
    pub command: Vec<OsString>,
}

/// What was written.
#[derive(Debug, Clone, Copy)]
pub struct PortableSummary {
    /// Executed instructions recorded.
    pub instructions: usize,
    /// Executable mappings written.
    pub mappings: usize,
    /// AUX bytes written (PT, BTS).
    pub aux_bytes: usize,
    /// Samples written (LBR).
    pub samples: usize,
    /// The command's exit status, when it ran to its end.
    pub exit_code: Option<i32>,
}

/// Finds `prog` as execvp would (qemu-user takes a path, not a name).
fn resolve(prog: &OsString) -> Result<PathBuf> {
    let p = Path::new(prog);
    if p.components().count() > 1 || p.is_absolute() {
        ensure!(p.is_file(), "{} does not exist", p.display());
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
        .with_context(|| format!("{} is not in PATH", p.display()))
}

/// Records `req.command` under qemu-user and writes `req.output`.
pub fn record_portable(req: &PortableRequest) -> Result<PortableSummary> {
    ensure!(
        !req.kernel,
        "--kernel: the portable capture runs the program under qemu-user, which sees user space only"
    );
    if let Some(opt) = req.inapplicable.first() {
        bail!("{opt} applies to the perf_event_open capture, not to the portable one");
    }
    if req.filter.is_some() && req.tracer != Tracer::IntelPt {
        bail!("--filter applies to Intel PT only");
    }
    if req.branch_filter.is_some() && req.tracer != Tracer::Lbr {
        bail!("-j applies to LBR only");
    }
    if req.terms.is_some() && req.tracer != Tracer::IntelPt {
        bail!("--terms applies to Intel PT only");
    }
    // Checked before the (slow) recording.
    let lbr_filter = lbr_filter(req.branch_filter.as_deref())?;
    let terms = match &req.terms {
        Some(t) => PtTerms::parse(t, PT_PMU_TYPE)?,
        None => PtTerms::real_default(PT_PMU_TYPE),
    };
    let (program, args) = req
        .command
        .split_first()
        .context("give a command after `--`")?;
    let program = resolve(program)?;
    let rec = QemuRecorder::new()
        .log_mappings(true)
        .record(&program, args)
        .with_context(|| format!("recording {} under qemu-x86_64", program.display()))?;
    // What the program wrote, passed on (qemu's own log went to its pipe).
    {
        use std::io::Write as _;
        std::io::stdout().write_all(&rec.stdout).ok();
        std::io::stderr().write_all(&rec.stderr).ok();
    }
    let execution = &rec.execution;
    let log = GuestLog::parse(&rec.mapping_log);
    let executed: Vec<(u64, u64)> = execution
        .memory()
        .segments()
        .iter()
        .map(|s| (s.addr.0, s.end()))
        .collect();
    let maps = guest_mappings(&program, &log, &executed)?;
    // qemu runs the program in its own process: its pid is the guest's.
    let pid = log.pid.unwrap_or(std::process::id());
    let comm = program
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect::<String>())
        .unwrap_or_default();
    let side = Sideband {
        pid,
        comm: &comm,
        maps: &maps,
        // Just before the first instruction when the trace is timed.
        time: if terms.timed() {
            terms::TSC_START - 1
        } else {
            0
        },
    };

    let mut tmp = req.output.clone().into_os_string();
    tmp.push(".hwtrace-partial");
    let tmp = PathBuf::from(tmp);
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let written = write_capture(
        req,
        lbr_filter,
        terms,
        execution,
        &side,
        BufWriter::new(file),
    )
    .and_then(|(n, w)| {
        w.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &req.output)
            .with_context(|| format!("cannot rename to {}", req.output.display()))?;
        Ok(n)
    });
    if written.is_err() {
        std::fs::remove_file(&tmp).ok();
    }
    let (aux_bytes, samples) = written?;
    Ok(PortableSummary {
        instructions: execution.len(),
        mappings: maps.len(),
        aux_bytes,
        samples,
        exit_code: match rec.end {
            RecordEnd::Exited(s) => s.code(),
            RecordEnd::Limit => None,
        },
    })
}

/// The sideband every capture starts with.
struct Sideband<'a> {
    pid: u32,
    comm: &'a str,
    maps: &'a [Mapping],
    /// The perf time of the sideband records (0 when untimed).
    time: u64,
}

impl Sideband<'_> {
    fn sample_id(&self) -> SampleId {
        SampleId {
            pid_tid: Some((self.pid, self.pid)),
            time: Some(self.time),
            cpu: Some(0),
            identifier: Some(EVENT_ID),
            id: Some(EVENT_ID),
            ..SampleId::default()
        }
    }

    fn write(&self, w: &mut impl RecordWriter) -> std::io::Result<()> {
        let sid = self.sample_id();
        w.comm(self.pid, self.pid, self.comm, true, &sid)?;
        for m in self.maps {
            // PROT_READ|PROT_EXEC, MAP_PRIVATE; user-mode record (misc 2).
            w.mmap2(
                2, self.pid, self.pid, m.start, m.len, m.pgoff, 5, 2, &m.name, &sid,
            )?;
        }
        Ok(())
    }
}

/// The IP range `ADDR/SIZE@FILE` covers at run time.
fn filter_range(spec: &str, maps: &[Mapping]) -> Result<IpRange> {
    let bad =
        || format!("--filter `{spec}` is not ADDR/SIZE@FILE (e.g. 0x1130/0x40@/usr/bin/true)");
    let (range, file) = spec.split_once('@').with_context(bad)?;
    let (addr, size) = range.split_once('/').with_context(bad)?;
    let num = |s: &str| {
        let s = s.trim();
        match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => s.parse().ok(),
        }
    };
    let (addr, size) = (num(addr).with_context(bad)?, num(size).with_context(bad)?);
    ensure!(size > 0, "--filter `{spec}`: SIZE is 0");
    let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    let want = canon(file);
    let bias = maps
        .iter()
        .find(|m| m.bias.is_some() && canon(&m.name) == want)
        .and_then(|m| m.bias)
        .with_context(|| {
            format!("--filter `{spec}`: {file} was not mapped executable by the program")
        })?;
    Ok(IpRange {
        start: Ip(bias.wrapping_add(addr)),
        end: Ip(bias.wrapping_add(addr).wrapping_add(size - 1)),
    })
}

fn pt_attr(terms: PtTerms) -> Attr {
    let mut attr = intel_pt_attr(PT_PMU_TYPE, terms.config);
    if !terms.timed() {
        attr.sample_type &= !sample::TIME; // no TSC: perf decodes timeless
    }
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    attr.set(flag::COMM_EXEC, true);
    attr
}

fn features(maps: &[Mapping]) -> hwtrace_perf::data::write::FeatureData {
    let mut f = machine_features(Path::new("/proc"));
    f.nrcpus = Some((1, 1));
    let files = maps
        .iter()
        .filter(|m| m.name.starts_with('/'))
        .map(|m| m.name.as_bytes().to_vec())
        .collect();
    f.build_ids = build_ids(&files);
    f
}

type Written<W> = ((usize, usize), W);

fn write_capture<W: std::io::Write + std::io::Seek>(
    req: &PortableRequest,
    lbr_filter: LbrFilter,
    terms: PtTerms,
    execution: &Execution,
    side: &Sideband<'_>,
    out: W,
) -> Result<Written<W>> {
    match req.tracer {
        Tracer::IntelPt => write_pt(req, terms, execution, side, out),
        Tracer::IntelBts => write_bts(execution, side, out),
        Tracer::Lbr => write_lbr(execution, side, lbr_filter, out),
        Tracer::Software => {
            bail!("--sideband-only records real perf events; it has no portable form")
        }
    }
}

/// The sideband, then `aux` as one per-thread stream read at perf time
/// `end` (0 when untimed; a timed recording's reference must not be 0:
/// perf 6.1 dies on it).
fn write_aux<W: std::io::Write + std::io::Seek>(
    w: &mut PerfDataWriter<W>,
    side: &Sideband<'_>,
    aux: &[u8],
    end: u64,
) -> std::io::Result<()> {
    let sid = side.sample_id();
    side.write(w)?;
    w.itrace_start(side.pid, side.pid, &sid)?;
    // Per-thread AUX stream: cpu -1, tid = the thread.
    w.auxtrace(aux, 0, end, 0, side.pid, u32::MAX)?;
    let read = SampleId {
        time: sid.time.map(|t| t.max(end)),
        ..sid
    };
    w.aux(0, aux.len() as u64, 0, &read)?;
    w.finished_round()
}

fn write_pt<W: std::io::Write + std::io::Seek>(
    req: &PortableRequest,
    terms: PtTerms,
    execution: &Execution,
    side: &Sideband<'_>,
    out: W,
) -> Result<Written<W>> {
    let mut config = terms.pt_config();
    if let Some(f) = &req.filter {
        config.ip_filter[0] = Some(filter_range(f, side.maps)?);
    }
    let trace = PtEncoder::new(config)
        .encode(execution)
        .context("encoding the execution as Intel PT")?;
    let attr = pt_attr(terms);
    let attrs = [EventAttr {
        attr,
        ids: vec![EVENT_ID],
    }];
    let mut w = PerfDataWriter::new(out, &attrs)?;
    w.auxtrace_info_pt(&IntelPtInfo {
        // perf parses this string with its address-filter grammar, which
        // wants the `filter` keyword.
        filter: req
            .filter
            .as_ref()
            .map(|f| format!("filter {}", f.trim()).into_bytes()),
        ..terms.info(PT_PMU_TYPE)
    })?;
    // Read when the program ended: the TSC after its last instruction.
    let end = match config.tsc {
        Some(tsc) => tsc.start + tsc.ticks_per_insn * execution.len() as u64,
        None => 0,
    };
    write_aux(&mut w, side, &trace.bytes, end)?;
    let out = w.finish(&features(side.maps))?;
    Ok(((trace.bytes.len(), 0), out))
}

fn write_bts<W: std::io::Write + std::io::Seek>(
    execution: &Execution,
    side: &Sideband<'_>,
    out: W,
) -> Result<Written<W>> {
    let stream = branches(execution).context("deriving the taken branches")?;
    let records = 4096u64;
    let base = 0xFFFF_FE00_0000_0000u64;
    let debugctl = [DebugCtlFlag::Tr, DebugCtlFlag::Bts, DebugCtlFlag::Btint]
        .into_iter()
        .try_fold(DebugCtl::new(DebugCtlLayout::Modern), |c, f| {
            c.with(f, true)
        })?;
    let mut sim = BtsSim::new(BtsConfig {
        format: DsFormat::Bits64,
        area: DsManagementArea {
            bts_buffer_base: base,
            bts_index: base,
            bts_absolute_maximum: base + records * 24,
            bts_interrupt_threshold: base + (records - records / 8) * 24,
            ..DsManagementArea::default()
        },
        debugctl,
        pmi_latency: 0,
    })?;
    let (_, mut aux) = sim.run_draining(&stream)?;
    let left = usize::try_from(sim.records_before_index())? * 24;
    aux.extend_from_slice(sim.buffer().get(..left).unwrap_or_default());
    let mut attr = intel_pt_attr(BTS_PMU_TYPE, 0);
    attr.sample_type &= !sample::TIME;
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    attr.set(flag::COMM_EXEC, true);
    let attrs = [EventAttr {
        attr,
        ids: vec![EVENT_ID],
    }];
    let mut w = PerfDataWriter::new(out, &attrs)?;
    w.auxtrace_info_bts(&IntelBtsInfo {
        pmu_type: BTS_PMU_TYPE,
        ..IntelBtsInfo::default()
    })?;
    write_aux(&mut w, side, &aux, 0)?;
    let out = w.finish(&features(side.maps))?;
    Ok(((aux.len(), 0), out))
}

/// perf's `branch_sample_type` and the MSR_LBR_SELECT value Linux programs
/// for it.
#[derive(Debug, Clone, Copy)]
struct LbrFilter {
    sample_type: u64,
    select: u64,
}

/// `-j` names → `branch_sample_type` and MSR_LBR_SELECT, as Linux's
/// `arch/x86/events/intel/lbr.c` maps them on Sandy Bridge and later
/// (`hsw_lbr_sel_map`): the branches wanted are collected, and every
/// LBR_SELECT bit not wanted is set (a set bit suppresses its class).
fn lbr_filter(names: Option<&str>) -> Result<LbrFilter> {
    use branch::{ANY, USER};
    const KERNEL: u64 = 1 << 1;
    const ANY_CALL: u64 = 1 << 4;
    const ANY_RETURN: u64 = 1 << 5;
    const IND_CALL: u64 = 1 << 6;
    const COND: u64 = 1 << 10;
    const IND_JUMP: u64 = 1 << 12;
    const CALL: u64 = 1 << 13;
    // LBR_SELECT bits: CPL_EQ_0, CPL_NEQ_0, JCC, NEAR_REL_CALL,
    // NEAR_IND_CALL, NEAR_RET, NEAR_IND_JMP, NEAR_REL_JMP, FAR_BRANCH.
    const MAP: [(u64, u64); 9] = [
        (KERNEL, 1 << 0),
        (USER, 1 << 1),
        (ANY, 0x1fc),
        (ANY_CALL, 1 << 3 | 1 << 4 | 1 << 8),
        (ANY_RETURN, 1 << 5 | 1 << 8),
        (IND_CALL, 1 << 4),
        (COND, 1 << 2),
        (IND_JUMP, 1 << 6),
        (CALL, 1 << 3),
    ];
    let mut bits = 0;
    for n in names.unwrap_or("any").split(',').map(str::trim) {
        if n.is_empty() {
            continue;
        }
        let b = branch::by_name(n)
            .filter(|b| MAP.iter().any(|(m, _)| m == b))
            .with_context(|| {
                let known: Vec<&str> = branch::NAMES
                    .iter()
                    .filter(|(_, b)| MAP.iter().any(|(m, _)| m == b))
                    .map(|(n, _)| *n)
                    .collect();
                format!("-j `{n}`: the portable capture models {}", known.join(","))
            })?;
        bits |= b;
    }
    if bits & (USER | KERNEL) == 0 {
        bits |= USER;
    }
    if bits & !(USER | KERNEL) == 0 {
        bits |= ANY;
    }
    let wanted = MAP
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .fold(0, |m, (_, sel)| m | sel);
    Ok(LbrFilter {
        sample_type: bits,
        select: wanted ^ 0x1ff,
    })
}

fn write_lbr<W: std::io::Write + std::io::Seek>(
    execution: &Execution,
    side: &Sideband<'_>,
    filter: LbrFilter,
    out: W,
) -> Result<Written<W>> {
    let stream = branches(execution).context("deriving the taken branches")?;
    let mut attr = Attr {
        kind: attr_type::HARDWARE,
        config: 1, // PERF_COUNT_HW_INSTRUCTIONS
        sample_period: LBR_PERIOD,
        sample_type: sample::IP | sample::TID | sample::ID | sample::BRANCH_STACK,
        branch_sample_type: filter.sample_type,
        ..Attr::default()
    };
    for bit in [
        flag::DISABLED,
        flag::EXCLUDE_KERNEL,
        flag::EXCLUDE_HV,
        flag::SAMPLE_ID_ALL,
        flag::ENABLE_ON_EXEC,
        flag::MMAP2,
        flag::COMM,
        flag::COMM_EXEC,
    ] {
        attr.set(bit, true);
    }
    let attrs = [EventAttr {
        attr,
        ids: vec![EVENT_ID],
    }];
    let mut w = PerfDataWriter::new(out, &attrs)?;
    side.write(&mut w)?;
    let mut sim = LbrSim::new(LbrConfig::for_uarch(Uarch::Skylake)?.with_select(filter.select))?;
    let insns = execution.insns();
    let mut next = 0usize; // next branch to run through the LBR
    let mut at = 0usize; // instruction index the branch search resumes at
    let mut samples = 0;
    let period = usize::try_from(LBR_PERIOD)?;
    let mut entries = Vec::new();
    for i in (period..insns.len()).step_by(period) {
        // Branches that completed before instruction i: from insns[j] to
        // insns[j + 1] with j + 1 <= i.
        while let Some(b) = stream.get(next) {
            let found = (at..i).find(|&j| insns[j] == b.from && insns.get(j + 1) == Some(&b.to));
            let Some(j) = found else { break };
            sim.step(next, b)?;
            next += 1;
            at = j + 1;
        }
        let snap = sim.snapshot();
        entries.clear();
        for e in snap.stack()?.entries() {
            let mispred = e.mispredicted().unwrap_or(false);
            let cycles = u64::from(e.cycles().unwrap_or(0));
            entries.push(BranchEntry {
                from: e.from.ip.0,
                to: e.to.ip.0,
                flags: if mispred { 1 } else { 2 } | (cycles & 0xffff) << 4,
            });
        }
        entries.reverse(); // perf wants the newest first
        w.sample(
            &attr,
            2,
            &SampleData {
                ip: insns[i].0,
                pid_tid: (side.pid, side.pid),
                id: EVENT_ID,
                branches: &entries,
                ..SampleData::default()
            },
        )?;
        samples += 1;
    }
    w.finished_round()?;
    let out = w.finish(&features(side.maps))?;
    Ok(((0, samples), out))
}

/// The tracer and output as said on stderr.
pub fn describe(s: &PortableSummary, output: &Path, tracer: Tracer) -> String {
    let status = s
        .exit_code
        .map_or(String::new(), |c| format!(", the command exited with {c}"));
    let what = match tracer {
        Tracer::Lbr => format!("{} LBR samples", s.samples),
        _ => format!("{} {} bytes", s.aux_bytes, tracer.hardware()),
    };
    format!(
        "hwtrace record --portable: wrote {} ({} instructions recorded with qemu-user, {what}, {} executable mappings{status})",
        output.display(),
        s.instructions,
        s.mappings
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_filters_become_lbr_select_values() {
        // Default: every class, user space: only CPL_EQ_0 suppressed.
        let f = lbr_filter(None).unwrap();
        assert_eq!(f.sample_type, branch::ANY | branch::USER);
        assert_eq!(f.select, 0x001);
        // any_call: near relative/indirect calls and far branches kept.
        let f = lbr_filter(Some("any_call")).unwrap();
        assert_eq!(f.select, 0x1ff ^ (1 << 1 | 1 << 3 | 1 << 4 | 1 << 8));
        // Kernel only: ring > 0 suppressed, ring 0 kept.
        let f = lbr_filter(Some("k")).unwrap();
        assert_eq!(f.select & 0b11, 0b10);
        let e = lbr_filter(Some("cond,no_cycles")).unwrap_err().to_string();
        assert!(e.contains("`no_cycles`"), "{e}");
    }

    #[test]
    fn filters_name_a_mapped_file() {
        let maps = [Mapping {
            start: 0x40_0000_2000,
            len: 0x5000,
            pgoff: 0x2000,
            name: "/bin/true".into(),
            bias: Some(0x40_0000_0000),
        }];
        let r = filter_range("0x2000/0x10@/bin/true", &maps).unwrap();
        assert_eq!((r.start, r.end), (Ip(0x40_0000_2000), Ip(0x40_0000_200f)));
        assert!(filter_range("0x2000/0x10@/bin/false", &maps).is_err());
        assert!(filter_range("0x2000@/bin/true", &maps).is_err());
        assert!(filter_range("0x2000/0@/bin/true", &maps).is_err());
    }
}
