//! `hwtrace perf`: look inside perf.data files.
//!
//! * `info`: attributes, features, AUX streams per CPU/thread with their
//!   sizes and gaps, lost data, sideband counts.
//! * `dump-aux`: write one CPU's or thread's AUX stream (e.g. raw Intel PT).
//! * `decode`: the instructions (or branches) of every Intel PT stream over
//!   the mapped files (see [`crate::perfdecode`]).

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use hwtrace_perf::data::attr::{attr_type, sample};
use hwtrace_perf::data::{
    AuxStreams, AuxtraceKind, EventAttr, Expanded, PerfData, PerfRecord, QueueKey, record_type_name,
};

use crate::input::MappedFile;

/// Look inside perf.data files.
#[derive(Debug, clap::Args)]
pub struct PerfArgs {
    #[command(subcommand)]
    command: PerfCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PerfCommand {
    /// Attributes, features, AUX streams per CPU/thread, lost data, record counts.
    Info {
        /// The perf.data file (file or pipe format).
        file: PathBuf,
    },
    /// Write the AUX stream (e.g. raw Intel PT) of one CPU or thread.
    DumpAux {
        /// The perf.data file.
        file: PathBuf,
        /// The CPU (per-CPU recordings).
        #[arg(long)]
        cpu: Option<u32>,
        /// The thread (per-thread recordings).
        #[arg(long)]
        tid: Option<u32>,
        /// Output file.
        #[arg(short = 'o', long)]
        output: PathBuf,
    },
    /// Decode every Intel PT AUX stream (one `tid cpu ip` line per
    /// instruction, over the files the MMAP2 records name), every intel_bts
    /// stream (one `tid cpu from -> to kind` line per branch) and every LBR
    /// sample (one `tid cpu ip ENTRY...` line, entries as perf's brstack).
    /// Missing code and lost trace are reported on stderr with where and
    /// how much (exit code 2).
    Decode(DecodeArgs),
}

/// `hwtrace perf decode`'s arguments.
#[derive(Debug, clap::Args)]
struct DecodeArgs {
    /// The perf.data file (file or pipe format; `-`: standard input, e.g. `perf record -o - | hwtrace perf decode -`); it is memory-mapped.
    file: PathBuf,
    /// Prefix for the paths of the mapped files (a copy of the traced
    /// machine's file system).
    #[arg(long, value_name = "DIR")]
    sysroot: Option<PathBuf>,
    /// A dump of the traced process's vDSO, mapped where `[vdso]` was.
    #[arg(long, value_name = "FILE")]
    vdso: Option<PathBuf>,
    /// Kernel code: `perf record --kcore`'s directory (its `kcore`, and its
    /// `kallsyms` unless --kallsyms is given), or an ELF core whose
    /// segments are kernel virtual addresses, like /proc/kcore.
    #[arg(long, value_name = "DIR|FILE")]
    kcore: Option<PathBuf>,
    /// Kernel symbols (/proc/kallsyms text) for kernel addresses (--sym).
    #[arg(long, value_name = "FILE")]
    kallsyms: Option<PathBuf>,
    /// Read tracing's on/off status as perf itself does (see `hwtrace flow
    /// --lenient`): where a PSB+ says tracing is on while it was off, and
    /// at a TIP.PGE while it is on, decode on instead of reporting an
    /// error and skipping to the next PSB.
    #[arg(long)]
    lenient: bool,
    /// Name addresses `symbol+0xoff` after the mapped files' symbols (and
    /// --kallsyms for kernel addresses): `ip (sym)`, `from (sym) -> to
    /// (sym)`, brstacksym-style LBR entries.
    #[arg(long)]
    sym: bool,
    /// Taken branches (`from -> to kind`), like `perf script --itrace=b`.
    #[arg(long, conflicts_with = "stats")]
    branches: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Intel PT: each instruction or branch with its perf time (seconds,
    /// as `perf script` shows it; JSON: `time` in nanoseconds): the TSC
    /// of the last timing event before it (libipt's and ptxed's time),
    /// converted with the recording's TSC conversion; `-` where the trace
    /// has told no time yet.
    #[arg(long, conflicts_with = "stats")]
    time: bool,
    /// The processor that wrote the trace (display family/model[/stepping],
    /// e.g. 6/85), for its Intel PT errata workarounds (libipt's table, as
    /// `hwtrace flow --cpu`). Default: the processor perf.data's CPUID
    /// header names.
    #[arg(long, value_name = "F/M[/S]", value_parser = crate::cmd::flow::parse_cpu)]
    cpu: Option<crate::ptdump::cpu::Cpu>,
    /// Only counts per stream.
    #[arg(long)]
    stats: bool,
    /// With --stats: decode each Intel PT stream on N threads, split at its
    /// PSBs (default: every core; the counts are the same). A stream whose
    /// code changes with the process switched in (a per-CPU stream of
    /// several processes, a process that exec'd) decodes on one thread.
    #[arg(long, short = 'j', value_name = "N", requires = "stats", value_parser = clap::value_parser!(u64).range(1..=1024))]
    jobs: Option<u64>,
    /// The least trace bytes a parallel work unit covers (tests use tiny
    /// units to put seams everywhere).
    #[arg(long, value_name = "BYTES", hide = true, requires = "stats", value_parser = clap::value_parser!(u64).range(1..))]
    unit_bytes: Option<u64>,
}

/// Runs `hwtrace perf`.
pub fn run(args: PerfArgs) -> Result<ExitCode> {
    match args.command {
        PerfCommand::Info { file } => info(&file),
        PerfCommand::DumpAux {
            file,
            cpu,
            tid,
            output,
        } => dump_aux(&file, cpu, tid, &output),
        PerfCommand::Decode(args) => decode(&args),
    }
}

const SAMPLE_BITS: &[(u64, &str)] = &[
    (sample::IP, "IP"),
    (sample::TID, "TID"),
    (sample::TIME, "TIME"),
    (sample::ADDR, "ADDR"),
    (sample::READ, "READ"),
    (sample::CALLCHAIN, "CALLCHAIN"),
    (sample::ID, "ID"),
    (sample::CPU, "CPU"),
    (sample::PERIOD, "PERIOD"),
    (sample::STREAM_ID, "STREAM_ID"),
    (sample::RAW, "RAW"),
    (sample::BRANCH_STACK, "BRANCH_STACK"),
    (sample::REGS_USER, "REGS_USER"),
    (sample::STACK_USER, "STACK_USER"),
    (sample::WEIGHT, "WEIGHT"),
    (sample::DATA_SRC, "DATA_SRC"),
    (sample::IDENTIFIER, "IDENTIFIER"),
    (sample::TRANSACTION, "TRANSACTION"),
    (sample::REGS_INTR, "REGS_INTR"),
    (sample::PHYS_ADDR, "PHYS_ADDR"),
    (sample::AUX, "AUX"),
    (sample::CGROUP, "CGROUP"),
    (sample::DATA_PAGE_SIZE, "DATA_PAGE_SIZE"),
    (sample::CODE_PAGE_SIZE, "CODE_PAGE_SIZE"),
    (sample::WEIGHT_STRUCT, "WEIGHT_STRUCT"),
];

fn sample_names(t: u64) -> String {
    let names: Vec<&str> = SAMPLE_BITS
        .iter()
        .filter(|(b, _)| t & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join("|")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn type_name(kind: u32, aux_pmus: &BTreeMap<u32, &'static str>) -> String {
    match kind {
        attr_type::HARDWARE => "hardware".into(),
        attr_type::SOFTWARE => "software".into(),
        attr_type::TRACEPOINT => "tracepoint".into(),
        attr_type::HW_CACHE => "hw_cache".into(),
        attr_type::RAW => "raw".into(),
        attr_type::BREAKPOINT => "breakpoint".into(),
        k => aux_pmus
            .get(&k)
            .map_or(format!("pmu {k}"), |n| format!("{n} (pmu {k})")),
    }
}

fn print_attr(
    out: &mut dyn Write,
    i: usize,
    a: &EventAttr,
    aux_pmus: &BTreeMap<u32, &'static str>,
) -> Result<()> {
    let at = &a.attr;
    writeln!(
        out,
        "event {i}: type {}, config {:#x}",
        type_name(at.kind, aux_pmus),
        at.config
    )?;
    writeln!(
        out,
        "  sample_type {:#x} ({})",
        at.sample_type,
        sample_names(at.sample_type)
    )?;
    if at.branch_sample_type != 0 {
        writeln!(out, "  branch_sample_type {:#x}", at.branch_sample_type)?;
    }
    if at.config1 != 0 || at.config2 != 0 || at.config3 != 0 {
        writeln!(
            out,
            "  config1 {:#x}, config2 {:#x}, config3 {:#x}",
            at.config1, at.config2, at.config3
        )?;
    }
    writeln!(
        out,
        "  flags {:#x}, sample_period {}, aux_watermark {}, aux_sample_size {}, ids {}",
        at.flags,
        at.sample_period,
        at.aux_watermark,
        at.aux_sample_size,
        a.ids.len()
    )?;
    Ok(())
}

fn show_id(v: u32) -> String {
    if v == u32::MAX {
        "-1".into()
    } else {
        v.to_string()
    }
}

fn info(path: &Path) -> Result<ExitCode> {
    let map = MappedFile::open(path)?;
    let bytes = map.bytes();
    let file = PerfData::parse(bytes).with_context(|| format!("{}", path.display()))?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let h = &file.header;
    let format = if h.is_pipe() { "pipe" } else { "file" };
    writeln!(
        out,
        "{}: perf.data ({format} format), {} bytes",
        path.display(),
        bytes.len()
    )?;
    writeln!(
        out,
        "data: offset {:#x}, size {:#x}",
        h.data.offset, h.data.size
    )?;

    // One pass over the records: counts, AUXTRACE_INFO, pipe attrs.
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    let mut aux_pmus = BTreeMap::new();
    let mut infos = Vec::new();
    let mut errors = Vec::new();
    let mut records = file.records();
    // Records inside COMPRESSED ones (`perf record -z`) are counted by
    // their own type too, as `perf report -D` counts them.
    loop {
        match records.next_expanded() {
            Ok(None) => break,
            Ok(Some(e)) => {
                *counts
                    .entry(record_type_name(e.item().header.kind))
                    .or_default() += 1;
                // AUXTRACE_INFO is never compressed (perf writes it with
                // the file's own records).
                if let Expanded::File(r) = e
                    && let PerfRecord::AuxtraceInfo(i) = r.record
                {
                    match &i.kind {
                        AuxtraceKind::IntelPt(p) => {
                            aux_pmus.insert(p.pmu_type, "intel_pt");
                        }
                        AuxtraceKind::IntelBts(b) => {
                            aux_pmus.insert(b.pmu_type, "intel_bts");
                        }
                        _ => {}
                    }
                    infos.push(i);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    let features = file.features_after(&records).clone();
    for (i, a) in records.attrs().iter().enumerate() {
        print_attr(&mut out, i, a, &aux_pmus)?;
    }

    writeln!(out, "features:")?;
    let strings = [
        ("hostname", features.hostname),
        ("osrelease", features.osrelease),
        ("version", features.version),
        ("arch", features.arch),
        ("cpudesc", features.cpudesc),
        ("cpuid", features.cpuid),
    ];
    for (name, v) in strings {
        if let Some(v) = v {
            writeln!(out, "  {name}: {}", text(v))?;
        }
    }
    if let Some((avail, online)) = features.nrcpus {
        writeln!(out, "  nrcpus: {online} online, {avail} available")?;
    }
    if let Some(c) = &features.cmdline {
        let args: Vec<String> = c.iter().map(|a| text(a)).collect();
        writeln!(out, "  cmdline: {}", args.join(" "))?;
    }
    for b in &features.build_ids {
        let id: String = b.build_id.iter().map(|x| format!("{x:02x}")).collect();
        writeln!(out, "  build-id: {id} {}", text(b.filename))?;
    }
    for e in &features.errors {
        writeln!(out, "  error: {e}")?;
    }

    for i in &infos {
        match &i.kind {
            AuxtraceKind::IntelPt(p) => {
                writeln!(out, "auxtrace: intel_pt (pmu {})", p.pmu_type)?;
                let t = &p.tsc;
                writeln!(
                    out,
                    "  tsc conversion: time_shift {}, time_mult {}, time_zero {}, cap_user_time_zero {}",
                    t.time_shift, t.time_mult, t.time_zero, t.cap_user_time_zero
                )?;
                writeln!(
                    out,
                    "  {} mmaps, snapshot {}, have_sched_switch {}",
                    if p.per_cpu_mmaps {
                        "per-cpu"
                    } else {
                        "per-thread"
                    },
                    p.snapshot_mode,
                    p.have_sched_switch
                )?;
                let opt = |v: Option<u64>| v.map_or("-".into(), |v| format!("{v:#x}"));
                writeln!(
                    out,
                    "  config bits: tsc {:#x}, noretcomp {:#x}, mtc {}, mtc_freq {}, cyc {}",
                    p.tsc_bit,
                    p.noretcomp_bit,
                    opt(p.mtc_bit),
                    opt(p.mtc_freq_bits),
                    opt(p.cyc_bit)
                )?;
                writeln!(
                    out,
                    "  tsc:ctc ratio {}/{}, max non-turbo ratio {}",
                    p.tsc_ctc_ratio_n.unwrap_or(0),
                    p.tsc_ctc_ratio_d.unwrap_or(0),
                    p.max_non_turbo_ratio.unwrap_or(0)
                )?;
                if let Some(f) = &p.filter {
                    writeln!(out, "  filter: {}", text(f))?;
                }
            }
            AuxtraceKind::IntelBts(b) => {
                writeln!(
                    out,
                    "auxtrace: intel_bts (pmu {}), snapshot {}",
                    b.pmu_type, b.snapshot_mode
                )?;
            }
            _ => writeln!(out, "auxtrace: type {}", i.kind_code)?,
        }
    }

    let streams = AuxStreams::collect(&file);
    writeln!(out, "aux streams: {}", streams.queues.len())?;
    for (k, q) in &streams.queues {
        let lost: u64 = q.gaps.iter().map(|g| g.lost_bytes()).sum();
        writeln!(
            out,
            "  cpu {} tid {}: {} bytes in {} buffers, {} gaps ({} bytes lost)",
            show_id(k.cpu),
            show_id(k.tid),
            q.len(),
            q.chunks.len(),
            q.gaps.len(),
            lost
        )?;
        for g in &q.gaps {
            writeln!(
                out,
                "    gap at stream offset {:#x} (record at {}): aux offset {:#x} expected, {:#x} found",
                g.stream_offset, g.record_offset, g.expected_aux_offset, g.found_aux_offset
            )?;
        }
    }
    for l in &streams.aux_losses {
        writeln!(
            out,
            "lost: AUX record at {} flags {:#x} (truncated/partial), aux offset {:#x} size {:#x}, cpu {} tid {}",
            l.record_offset,
            l.flags,
            l.aux_offset,
            l.aux_size,
            l.cpu.map_or("?".into(), show_id),
            l.tid.map_or("?".into(), show_id)
        )?;
    }
    for (off, n) in &streams.lost_records {
        writeln!(out, "lost: LOST record at {off}: {n} events")?;
    }
    writeln!(out, "records:")?;
    for (name, n) in &counts {
        writeln!(out, "  {name}: {n}")?;
    }
    for e in &errors {
        writeln!(out, "error: {e}")?;
    }
    out.flush()?;
    Ok(if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn dump_aux(path: &Path, cpu: Option<u32>, tid: Option<u32>, output: &Path) -> Result<ExitCode> {
    let map = MappedFile::open(path)?;
    let file = PerfData::parse(map.bytes()).with_context(|| format!("{}", path.display()))?;
    let streams = AuxStreams::collect(&file);
    let list = || {
        streams
            .queues
            .iter()
            .map(|(k, q): (&QueueKey, _)| {
                format!(
                    "--cpu {} --tid {} ({} bytes)",
                    show_id(k.cpu),
                    show_id(k.tid),
                    q.len()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    if streams.queues.is_empty() {
        bail!("{} has no AUX data", path.display());
    }
    let (key, queue) = if cpu.is_none() && tid.is_none() {
        if streams.queues.len() != 1 {
            bail!(
                "{} has {} AUX streams: pick one with --cpu or --tid: {}",
                path.display(),
                streams.queues.len(),
                list()
            );
        }
        streams.queues.iter().next().context("one stream")?
    } else {
        streams
            .find(cpu, tid)
            .with_context(|| format!("no AUX stream for that cpu/tid; the file has: {}", list()))?
    };
    let f = std::fs::File::create(output)
        .with_context(|| format!("cannot create {}", output.display()))?;
    let mut w = BufWriter::new(f);
    queue
        .write_to(&mut w)
        .with_context(|| format!("writing {}", output.display()))?;
    w.flush()?;
    for g in &queue.gaps {
        eprintln!(
            "hwtrace perf dump-aux: warning: {} bytes lost before output offset {:#x} (AUXTRACE record at {})",
            g.lost_bytes(),
            g.stream_offset,
            g.record_offset
        );
    }
    for e in &streams.errors {
        eprintln!("hwtrace perf dump-aux: warning: {e}");
    }
    eprintln!(
        "hwtrace perf dump-aux: wrote {} bytes of cpu {} tid {} to {}",
        queue.len(),
        show_id(key.cpu),
        show_id(key.tid),
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn decode(args: &DecodeArgs) -> Result<ExitCode> {
    use crate::perfdecode::bts::{BtsDecoder, BufferTimes};
    use crate::perfdecode::kernel::Kernel;
    use crate::perfdecode::stream::{PtSettings, QueueDecoder};
    use crate::perfdecode::symbols::Names;
    use crate::perfdecode::{Format, ImageOptions, Options, image, lbr, sideband::Sideband};

    let path = &args.file;
    let map = MappedFile::open(path)?;
    let file = PerfData::parse(map.bytes()).with_context(|| format!("{}", path.display()))?;
    let mut pt = None;
    let mut bts = None;
    // Each AUXTRACE record's `reference` (the TSC perf record read it at):
    // the time of a BTS buffer.
    let mut references = BTreeMap::new();
    let mut records = file.records();
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
    let branch_stacks = records
        .attrs()
        .iter()
        .any(|a| a.attr.sample_type & sample::BRANCH_STACK != 0);
    if pt.is_none() && bts.is_none() && !branch_stacks {
        bail!(
            "{}: nothing to decode: no intel_pt or intel_bts AUXTRACE_INFO record and no event samples branch stacks (LBR)",
            path.display()
        );
    }
    let settings = pt.as_ref().map(|info| {
        PtSettings::for_recording(
            info,
            records.attrs(),
            file.features_after(&records).cpuid,
            args.cpu,
            args.lenient,
            "hwtrace perf decode",
        )
    });
    let opts = Options {
        image: ImageOptions {
            sysroot: args.sysroot.clone(),
            vdso: args.vdso.clone(),
        },
        format: if args.stats {
            Format::Stats
        } else if args.branches {
            Format::Branches
        } else {
            Format::Insns
        },
        json: args.json,
        time: args.time,
        jobs: match args.jobs {
            Some(n) => usize::try_from(n).unwrap_or(1),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        },
        unit_bytes: args.unit_bytes,
    };
    let sb = Sideband::collect(&file);
    let kernel = Kernel::for_sideband(&sb, args.kcore.as_deref(), args.kallsyms.as_deref())?;
    let mut names = args.sym.then(|| Names::new(&sb, &opts.image, &kernel));
    let streams = AuxStreams::collect(&file);
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let stderr = std::io::stderr();
    let mut diag = stderr.lock();
    let mut problems = 0u64;
    for l in &streams.aux_losses {
        problems += 1;
        writeln!(
            diag,
            "hwtrace perf decode: lost: the AUX record at file offset {} says the hardware lost trace (flags {:#x}) in aux offset {:#x}..{:#x}, cpu {} tid {}",
            l.record_offset,
            l.flags,
            l.aux_offset,
            l.aux_offset.wrapping_add(l.aux_size),
            l.cpu.map_or("?".into(), show_id),
            l.tid.map_or("?".into(), show_id)
        )?;
    }
    for (off, n) in &streams.lost_records {
        problems += 1;
        writeln!(
            diag,
            "hwtrace perf decode: lost: the LOST record at file offset {off}: {n} sideband events lost"
        )?;
    }
    for e in &streams.errors {
        problems += 1;
        writeln!(diag, "hwtrace perf decode: {}: {e}", path.display())?;
    }
    if (pt.is_some() || bts.is_some()) && streams.queues.is_empty() {
        writeln!(diag, "hwtrace perf decode: {}: no AUX data", path.display())?;
    }
    let mut said = std::collections::BTreeSet::new();
    let mut say_missing = |diag: &mut dyn Write, m: &image::Missing| -> Result<()> {
        if said.insert(m.mapping.record_offset) {
            writeln!(
                diag,
                "hwtrace perf decode: not loaded: {} (pid {}, {:#x}-{:#x}): {}",
                m.path,
                m.mapping.pid,
                m.mapping.addr,
                m.mapping.addr.wrapping_add(m.mapping.len),
                m.reason
            )?;
        }
        Ok(())
    };
    let mut build_ids = Default::default();
    for (key, queue) in &streams.queues {
        let report = if let Some(settings) = settings {
            let dec = QueueDecoder::new(
                *key,
                &sb,
                settings,
                &opts,
                &kernel,
                &mut build_ids,
                &mut diag,
            )?;
            for m in dec.missing() {
                say_missing(&mut diag, m)?;
            }
            dec.run(queue, names.as_mut(), &mut out, &mut diag)?
        } else {
            let times = bts.map(|b| BufferTimes {
                tsc: b.tsc,
                reference: &references,
            });
            let dec = BtsDecoder::new(*key, &sb, &opts.image, times, &kernel, &mut build_ids)?;
            for m in dec.missing() {
                say_missing(&mut diag, m)?;
            }
            dec.run(queue, names.as_mut(), &opts, &mut out, &mut diag)?
        };
        problems += report.problems;
        if args.stats {
            let s = match &settings {
                Some(settings) => json_or_text_stats(*key, queue, &report, settings, args.json),
                None => bts_stats(*key, queue, &report, args.json),
            };
            writeln!(out, "{s}")?;
        }
    }
    if branch_stacks {
        let r = lbr::decode(&file, names.as_mut(), args.json, !args.stats, &mut out)?;
        for (off, n) in &r.lost {
            problems += 1;
            writeln!(
                diag,
                "hwtrace perf decode: lost: the LOST_SAMPLES record at file offset {off}: {n} samples (and their branch stacks) lost"
            )?;
        }
        if args.stats {
            if args.json {
                let v = serde_json::json!({"lbr_samples": r.samples, "lbr_entries": r.entries});
                writeln!(out, "{v}")?;
            } else {
                writeln!(
                    out,
                    "LBR: {} samples with branch stacks, {} entries",
                    r.samples, r.entries
                )?;
            }
        }
    }
    out.flush()?;
    Ok(if problems == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn bts_stats(
    key: QueueKey,
    queue: &hwtrace_perf::data::AuxQueue<'_>,
    r: &crate::perfdecode::stream::QueueReport,
    json: bool,
) -> String {
    if json {
        serde_json::json!({
            "cpu": (key.cpu != u32::MAX).then_some(key.cpu),
            "tid": (key.tid != u32::MAX).then_some(key.tid),
            "bytes": queue.len(), "buffers": queue.chunks.len(), "gaps": queue.gaps.len(),
            "lost_bytes": r.lost_bytes, "branches": r.branches, "unclassified": r.errors,
            "padding_records": r.padding_records, "skipped_bytes": r.skipped_bytes,
        })
        .to_string()
    } else {
        format!(
            "{key}: intel_bts, {} bytes in {} buffers, {} gaps ({} bytes lost), {} branches ({} of unknown kind), {} padding records, {} bytes of cut records",
            queue.len(),
            queue.chunks.len(),
            queue.gaps.len(),
            r.lost_bytes,
            r.branches,
            r.errors,
            r.padding_records,
            r.skipped_bytes
        )
    }
}

fn json_or_text_stats(
    key: QueueKey,
    queue: &hwtrace_perf::data::AuxQueue<'_>,
    r: &crate::perfdecode::stream::QueueReport,
    settings: &crate::perfdecode::stream::PtSettings,
    json: bool,
) -> String {
    let t = &settings.config.time;
    if json {
        serde_json::json!({
            "cpu": (key.cpu != u32::MAX).then_some(key.cpu),
            "tid": (key.tid != u32::MAX).then_some(key.tid),
            "bytes": queue.len(), "buffers": queue.chunks.len(), "gaps": queue.gaps.len(),
            "lost_bytes": r.lost_bytes, "insns": r.insns, "errors": r.errors,
            "skipped_bytes": r.skipped_bytes, "return_compression": settings.return_compression,
            "mtc_freq": t.mtc_freq, "tsc_ctc": [t.cpuid_0x15_ebx, t.cpuid_0x15_eax],
        })
        .to_string()
    } else {
        format!(
            "{key}: {} bytes in {} buffers, {} gaps ({} bytes lost), {} instructions, {} errors ({} bytes skipped); return compression {}, mtc_freq {}, tsc:ctc {}/{}",
            queue.len(),
            queue.chunks.len(),
            queue.gaps.len(),
            r.lost_bytes,
            r.insns,
            r.errors,
            r.skipped_bytes,
            if settings.return_compression {
                "on"
            } else {
                "off"
            },
            t.mtc_freq,
            t.cpuid_0x15_ebx,
            t.cpuid_0x15_eax
        )
    }
}
