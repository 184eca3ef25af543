//! `hwtrace sim pt|bts|lbr`: what the trace hardware would have written
//! for a real program, recorded with qemu-user (`hwtrace_sim`).
//!
//! * `sim pt` encodes the execution as user-mode Intel PT
//!   (`hwtrace_sim::PtEncoder`, SDM Vol. 3C chapter 33) and writes the raw
//!   trace; with `--topa` or `--single-range` the bytes go through the
//!   output stage (§33.2.7 “Trace Output”, `hwtrace_sim::output`) and the
//!   file holds what a reader of the buffer gets, and the final
//!   IA32_RTIT_OUTPUT_BASE, _OUTPUT_MASK_PTRS and _STATUS are explained.
//! * `sim bts` writes the branches as BTS records into a 64-bit DS area
//!   (SDM Vol. 3B §18.4.9 “Branch Trace Store”), draining at each threshold
//!   PMI, and prints the records oldest first.
//! * `sim lbr` runs the branches through the LBR stack of a
//!   micro-architecture under MSR_LBR_SELECT (§18.4.8) and prints the MSRs as
//!   they read at the end, in the text format `hwtrace lbr decode` reads.
//!
//! Options come before `--`; everything after it is the command.
//!
//! Instead of `--qemu -- CMD`, `--from-trace TRACE` with image options
//! (`--elf`, `--pages`, …, as for `hwtrace flow`) takes the execution from
//! a decoded Intel PT trace: the instructions hwtrace-flow decodes, with
//! the bytes each one ran as code. A trace is made of traced stretches
//! (from an enable to the next disable); each stretch becomes an
//! execution of its own, ending where the trace says the last branch went
//! (the disable's IP), and the simulators run them one after the other:
//! one branch stream for BTS and LBR, and for PT one encoding per stretch,
//! each from its PSB+, in one file.

use crate::flow::{Item, Items};
use crate::image_args::ImageArgs;
use crate::input::MappedFile;
use crate::ptdump::cpu::Cpu;
use anyhow::{Context as _, Result, anyhow, bail, ensure};
use hwtrace_flow::event::EventKind;
use hwtrace_flow::insn::InsnDecoder;
use hwtrace_flow::{Config, Errata};
use hwtrace_mem::pagecache::PageCacheWriter;
use hwtrace_packet::ExecMode;
use hwtrace_regs::Uarch;
use hwtrace_regs::cpuid::{CpuidRegs, PtCaps};
use hwtrace_regs::debugctl::{DebugCtl, DebugCtlFlag, DebugCtlLayout};
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::dump::{BtsDump, BtsOrder};
use hwtrace_regs::explain::{Context, RegisterId, explain, parse_number};
use hwtrace_regs::output::SingleRange;
use hwtrace_regs::rtit::{AddrCfg, RtitCtl};
use hwtrace_regs::topa::{TopaEntry, TopaLink, TopaRegion, TopaSize, build_table};
use hwtrace_sim::decode::bts_branches;
use hwtrace_sim::{
    Branch, BtsConfig, BtsSim, CodeImageBuilder, Consumer, Cr3Filter, EncodeStats, Execution,
    IpRange, LbrConfig, LbrSim, Limits, OutputRun, OutputTarget, PtConfig, PtEncoder, Timing,
    TopaTable, TscModel, branches, write_output,
};
use hwtrace_types::{Cr3, Ip, PhysAddr};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Simulated trace hardware.
#[derive(Debug, clap::Args)]
pub struct SimArgs {
    #[command(subcommand)]
    command: SimCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SimCommand {
    /// Write the Intel PT a CPU would have written for a recorded command or a decoded trace.
    Pt(PtArgs),
    /// Print the BTS records a CPU would have stored for a recorded command or a decoded trace.
    Bts(BtsArgs),
    /// Print the LBR MSRs as they read at the end of a recorded command or a decoded trace.
    Lbr(LbrArgs),
}

/// Where the execution comes from: a program recorded with qemu-user, or
/// a decoded trace.
#[derive(Debug, clap::Args)]
struct Recorder {
    /// Record the command after `--` with qemu-x86_64 (-singlestep).
    #[arg(
        long,
        required_unless_present = "from_trace",
        conflicts_with = "from_trace"
    )]
    qemu: bool,
    /// Take the execution from this raw Intel PT trace, decoded over the
    /// image options (instead of --qemu).
    #[arg(long, value_name = "TRACE")]
    from_trace: Option<PathBuf>,
    #[command(flatten)]
    images: ImageArgs,
    /// With --from-trace: the processor that wrote the trace (display
    /// family/model[/stepping], e.g. 6/85), for its PT errata workarounds.
    #[arg(long, value_name = "F/M[/S]", value_parser = parse_cpu)]
    cpu: Option<Cpu>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, num_args = 1.., conflicts_with = "from_trace")]
    command: Vec<String>,
}

fn parse_cpu(text: &str) -> Result<Cpu, String> {
    Cpu::parse(text).map_err(|e| format!("{text:?}: {e}"))
}

impl Recorder {
    /// The executions to simulate, in order: one for a recorded program,
    /// one per traced stretch of a trace.
    fn record(&self) -> Result<Vec<Execution>> {
        if let Some(trace) = &self.from_trace {
            return executions_of_trace(trace, &self.images, self.cpu);
        }
        ensure!(self.qemu, "give --qemu -- CMD or --from-trace TRACE");
        ensure!(
            self.images.is_empty(),
            "image options (--elf, --pages, ...) go with --from-trace, not --qemu"
        );
        ensure!(
            self.cpu.is_none(),
            "--cpu goes with --from-trace (the processor that wrote the trace), not --qemu"
        );
        let (program, args) = self
            .command
            .split_first()
            .context("no command given after --")?;
        let rec = Execution::record_qemu(program, args, Limits::default())
            .with_context(|| format!("recording {program} under qemu-x86_64"))?;
        Ok(vec![rec.execution])
    }

    /// Whether the executions come from a trace.
    fn is_trace(&self) -> bool {
        self.from_trace.is_some()
    }
}

/// One traced stretch of a decoded trace, being collected.
#[derive(Debug, Default)]
struct Stretch {
    insns: Vec<Ip>,
    mode: Option<ExecMode>,
    code: CodeImageBuilder,
}

impl Stretch {
    /// The stretch as an execution that went on at `successor` (`None`:
    /// the trace ended); nothing when it is empty.
    fn close(&mut self, successor: Option<u64>, out: &mut Vec<Execution>) -> Result<()> {
        let stretch = std::mem::take(self);
        if stretch.insns.is_empty() {
            return Ok(());
        }
        let memory = stretch.code.build()?;
        out.push(Execution::from_parts(
            stretch.insns,
            stretch.mode.unwrap_or(ExecMode::Bits64),
            memory,
            successor.map(Ip),
        ));
        Ok(())
    }
}

/// Decodes `path` over the images and splits what ran into executions,
/// one per traced stretch. A trace that does not decode cleanly (errors,
/// lost packets) is refused: a gap would be simulated as a branch that
/// never happened.
fn executions_of_trace(
    path: &Path,
    images: &ImageArgs,
    cpu: Option<Cpu>,
) -> Result<Vec<Execution>> {
    ensure!(
        !images.is_empty(),
        "--from-trace {}: give the code it ran over (--elf, --pages, --image, --pe)",
        path.display()
    );
    let image = images.load()?;
    let trace = MappedFile::open(path)?;
    let mut config = Config::default();
    if let Some(cpu) = cpu {
        config.errata = Errata::for_model(cpu.family, cpu.model).map_err(|_| {
            anyhow!(
                "--cpu {}/{}: no Intel PT errata known for it",
                cpu.family,
                cpu.model
            )
        })?;
    }
    let name = path.display();
    let mut out = Vec::new();
    let mut stretch = Stretch::default();
    for item in Items::new(InsnDecoder::new(trace.bytes(), config, image)) {
        match item {
            Item::Insn { insn, .. } => {
                let mode = insn.mode.unwrap_or(ExecMode::Bits64);
                if stretch.mode.is_some_and(|m| m != mode) {
                    // One mode per execution: a mode switch starts another.
                    stretch.close(Some(insn.ip), &mut out)?;
                }
                stretch.mode = Some(mode);
                stretch.insns.push(Ip(insn.ip));
                stretch
                    .code
                    .add(Ip(insn.ip), insn.bytes())
                    .with_context(|| format!("{name}: the code at {:#x}", insn.ip))?;
            }
            Item::Event { event, offset } => {
                let known = |ip: u64| (!event.ip_suppressed).then_some(ip);
                match event.kind {
                    EventKind::Disabled { ip } => stretch.close(known(ip), &mut out)?,
                    // Stopped before `at` (or taken away to `to` by an
                    // interrupt): the stretch was cut short there.
                    EventKind::AsyncDisabled { at, .. } => stretch.close(Some(at), &mut out)?,
                    EventKind::AsyncBranch { from, .. }
                    | EventKind::AsyncPaging { ip: from, .. }
                        if !stretch.insns.is_empty() =>
                    {
                        stretch.close(Some(from), &mut out)?;
                    }
                    EventKind::Overflow { .. } => {
                        bail!(
                            "{name}: packets were lost (OVF at offset {offset:#x}): the execution has a gap"
                        )
                    }
                    _ => {}
                }
            }
            Item::Error(e) => bail!("{name}: error at {e}: the execution has a gap"),
            Item::Stuck { offset, ip, insns } => bail!(
                "{name}: error at {offset:#x}, ip {ip:#x}: {insns} instructions without trace: an endless loop"
            ),
            Item::Resync { .. } | Item::Block(_) | Item::Branch(_) => {}
        }
    }
    stretch.close(None, &mut out)?;
    ensure!(!out.is_empty(), "{name}: no instruction decodes from it");
    Ok(out)
}

/// The taken branches of the executions, one after the other.
fn branch_stream(executions: &[Execution]) -> Result<Vec<Branch>> {
    let mut stream = Vec::new();
    for e in executions {
        stream.extend(branches(e)?);
    }
    Ok(stream)
}

#[derive(Debug, clap::Args)]
struct PtArgs {
    #[command(flatten)]
    recorder: Recorder,
    /// Write the raw trace here (with --topa/--single-range: what a reader
    /// of the buffer gets at the end, oldest byte first).
    #[arg(short = 'o', long = "output", required = true)]
    output: PathBuf,
    /// Also write the code the program ran (the bytes of every instruction
    /// executed; the rest of each page zero) as a page cache folder
    /// (`pages.addr`, `pages.dump`), so `hwtrace flow OUTPUT --pages DIR`
    /// decodes the trace.
    #[arg(long, value_name = "DIR")]
    code_out: Option<PathBuf>,
    /// No return compression (IA32_RTIT_CTL.DisRETC = 1): every RET is a TIP.
    #[arg(long)]
    no_retcomp: bool,
    /// Bytes of trace between PSBs (default 4096).
    #[arg(long, value_name = "BYTES")]
    psb_period: Option<String>,
    /// PSBFreq N: a PSB+ every 2^(N+11) bytes (instead of --psb-period).
    #[arg(long, value_name = "N", conflicts_with = "psb_period")]
    psb_freq: Option<u8>,
    /// A TSC packet in each PSB+ (TSCEn = 1).
    #[arg(long)]
    tsc: bool,
    /// MTC packets every 2^N crystal-clock ticks (MTCEn = 1, MTCFreq = N;
    /// TMA after each TSC, CBR in PSB+).
    #[arg(long, value_name = "N")]
    mtc_freq: Option<u8>,
    /// CYC packets (CYCEn = 1) with CYCThresh THRESH (CBR in PSB+).
    #[arg(long, value_name = "THRESH")]
    cyc: Option<u8>,
    /// CR3 filtering (CR3Filter = 1): IA32_RTIT_CR3_MATCH is `match` (the
    /// simulated process's CR3), `mismatch` (another one) or a value.
    #[arg(long, value_name = "match|mismatch|0xCR3")]
    cr3_filter: Option<String>,
    /// BranchEn = 0: no control-flow packets, only PSB+ and timing.
    #[arg(long)]
    no_branches: bool,
    /// IP filter range START-END (ADDRn_CFG = 1), up to four; addresses
    /// hex (0x optional), both inside.
    #[arg(long, value_name = "START-END")]
    filter: Vec<String>,
    /// ToPA output: region sizes (4K..128M), optionally ending in `int`,
    /// `stop` or both for the last entry; END links back to the table.
    #[arg(
        long,
        value_name = "SIZE,SIZE,…[,stop|,int]",
        conflicts_with = "single_range"
    )]
    topa: Option<String>,
    /// Single-range output of SIZE bytes (a power of two, 128 B to 4 GiB).
    #[arg(long, value_name = "SIZE")]
    single_range: Option<String>,
    /// A reader that drains N bytes per M produced and whose unread bytes
    /// may not be overwritten (packets are lost, then OVF before a PSB);
    /// the file then holds everything that reader read, in order.
    #[arg(long, value_name = "N/M")]
    consumer: Option<String>,
}

#[derive(Debug, clap::Args)]
struct BtsArgs {
    #[command(flatten)]
    recorder: Recorder,
    /// Records the BTS buffer holds (BTS absolute maximum).
    #[arg(long, default_value = "4096")]
    records: String,
    /// Record count at which the threshold PMI fires (default: 7/8 of --records).
    #[arg(long)]
    threshold: Option<String>,
}

#[derive(Debug, clap::Args)]
struct LbrArgs {
    #[command(flatten)]
    recorder: Recorder,
    /// Micro-architecture (nehalem, westmere, sandybridge, haswell, skylake, ...).
    #[arg(long, required = true)]
    uarch: String,
    /// MSR_LBR_SELECT value (default 0: no filtering).
    #[arg(long, value_name = "0xVAL")]
    select: Option<String>,
}

/// Runs `hwtrace sim`.
pub fn run(args: SimArgs) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match args.command {
        SimCommand::Pt(a) => pt(&a, &mut out)?,
        SimCommand::Bts(a) => bts(&a, &mut out)?,
        SimCommand::Lbr(a) => lbr(&a, &mut out)?,
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

fn number(flag: &str, s: &str) -> Result<u64> {
    parse_number(s).ok_or_else(|| anyhow!("{flag} `{s}` is not a number"))
}

/// A size with an optional K/M/G suffix (powers of 1024).
fn size(flag: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n = number(flag, digits)?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| anyhow!("{flag} `{s}` is too large"))
}

/// The TSC `--tsc` writes: 0 at the first instruction, one tick per
/// instruction (`hwtrace_sim::clock` derives the other clocks from it).
const TSC_CLOCK: TscModel = TscModel {
    start: 0,
    ticks_per_insn: 1,
};

/// The CR3 the recorded process is given for `--cr3-filter`.
const PROCESS_CR3: Cr3 = Cr3(0x0000_0001_2345_6000);

fn pt_config(a: &PtArgs) -> Result<PtConfig> {
    let mut config = PtConfig {
        return_compression: !a.no_retcomp,
        ..PtConfig::default()
    };
    if let Some(p) = &a.psb_period {
        let p = size("--psb-period", p)?;
        config.psb_period = u32::try_from(p)
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| anyhow!("--psb-period must be 1 to 4294967295 bytes"))?;
    }
    if let Some(n) = a.psb_freq {
        config.psb_period = PtConfig::psb_period_for_freq(n)
            .ok_or_else(|| anyhow!("--psb-freq {n}: PSBFreq is 0 to 15"))?;
    }
    if a.tsc {
        config.tsc = Some(TSC_CLOCK);
    }
    // The clock ratios behind --mtc-freq and --cyc (decoders take
    // `--nom-freq 24 --cpuid-0x15.eax 2 --cpuid-0x15.ebx 216`).
    if let Some(timing) = Timing::with_whole_ratios(a.mtc_freq, a.cyc) {
        config.timing = timing;
        config
            .timing
            .validate()
            .map_err(|e| anyhow!("--mtc-freq/--cyc: {e}"))?;
    }
    if let Some(f) = &a.cr3_filter {
        let cr3_match = match f.to_ascii_lowercase().as_str() {
            "match" => PROCESS_CR3,
            "mismatch" => Cr3(PROCESS_CR3.0 ^ 0x1000),
            _ => Cr3(number("--cr3-filter", f)?),
        };
        config.cr3_filter = Some(Cr3Filter {
            cr3_match,
            process_cr3: PROCESS_CR3,
        });
    }
    config.branch_en = !a.no_branches;
    ensure!(
        a.filter.len() <= config.ip_filter.len(),
        "at most {} --filter ranges (ADDR0..ADDR3)",
        config.ip_filter.len()
    );
    for (slot, f) in config.ip_filter.iter_mut().zip(&a.filter) {
        let (start, end) = f
            .split_once('-')
            .ok_or_else(|| anyhow!("--filter `{f}` is not START-END"))?;
        let hex = |n: &str| {
            hwtrace_mem::image::parse_hex(n.trim())
                .ok_or_else(|| anyhow!("--filter `{f}`: `{n}` is not a hex address"))
        };
        let (start, end) = (hex(start)?, hex(end)?);
        ensure!(start <= end, "--filter `{f}`: START is above END");
        *slot = Some(IpRange {
            start: Ip(start),
            end: Ip(end),
        });
    }
    Ok(config)
}

/// The IA32_RTIT_CTL value the configuration corresponds to (SDM Vol. 3C
/// §33.2.8.2): TraceEn, User, BranchEn, ToPA, TSCEn, DisRETC, CR3Filter,
/// MTCEn/MTCFreq, CYCEn/CYCThresh, PSBFreq, ADDRn_CFG.
fn rtit_ctl(config: &PtConfig, topa: bool) -> Result<RtitCtl> {
    let mut ctl = RtitCtl::new()
        .with_trace_en(true)
        .with_user(true)
        .with_branch_en(config.branch_en)
        .with_topa(topa)
        .with_tsc_en(config.tsc.is_some())
        .with_dis_retc(!config.return_compression)
        .with_cr3_filter(config.cr3_filter.is_some());
    if let Some(n) = config.timing.mtc_freq {
        ctl = ctl.with_mtc_en(true).with_mtc_freq(u64::from(n))?;
    }
    if let Some(n) = config.timing.cyc_thresh {
        ctl = ctl.with_cyc_en(true).with_cyc_thresh(u64::from(n))?;
    }
    // PSBFreq n asks for a PSB every 2 KiB · 2^n (§33.2.8.2); other periods
    // have no encoding and leave the field 0.
    let period = u64::from(config.psb_period);
    if period >= 2048 && period.is_power_of_two() && period <= 2048 << 15 {
        ctl = ctl.with_psb_freq(u64::from((period >> 11).trailing_zeros()))?;
    }
    for (n, r) in config.ip_filter.iter().enumerate() {
        if r.is_some() {
            ctl = ctl
                .with_addr_cfg(n as u8, AddrCfg::Filter)
                .context("ADDRn_CFG index")?;
        }
    }
    Ok(ctl)
}

/// Where simulated output regions live: above 4 GiB, out of the way of
/// the tables at 0x1000.
const REGION_BASE: u64 = 1 << 32;
const TABLE_BASE: PhysAddr = PhysAddr(0x1000);

fn topa_tables(spec: &str) -> Result<Vec<TopaTable>> {
    let mut regions = Vec::new();
    let (mut int, mut stop) = (false, false);
    let mut next = REGION_BASE;
    for part in spec.split(',').map(str::trim) {
        match part.to_ascii_lowercase().as_str() {
            "int" => int = true,
            "stop" => stop = true,
            _ => {
                ensure!(
                    !int && !stop,
                    "--topa: `int`/`stop` must come after the sizes"
                );
                let bytes = size("--topa", part)?;
                let size = TopaSize::from_bytes(bytes).ok_or_else(|| {
                    anyhow!("--topa: `{part}` is not a ToPA size (4K, 8K, … 128M)")
                })?;
                let base = next.next_multiple_of(bytes);
                next = base + bytes;
                regions.push(TopaRegion {
                    base: PhysAddr(base),
                    size,
                    int: false,
                    stop: false,
                });
            }
        }
    }
    let last = regions
        .last_mut()
        .context("--topa needs at least one region size")?;
    last.int = int;
    last.stop = stop;
    let caps = PtCaps {
        sub0: CpuidRegs {
            eax: 1,
            ebx: 0,
            ecx: 0b111,
            edx: 0,
        },
        sub1: CpuidRegs::default(),
    };
    let mut entries = vec![TopaEntry::new(); regions.len() + 1];
    let n = build_table(
        TABLE_BASE,
        &regions,
        TopaLink::End(TABLE_BASE),
        &mut entries,
        &caps,
        52,
    )?;
    entries.truncate(n);
    Ok(vec![TopaTable {
        base: TABLE_BASE,
        entries,
    }])
}

fn output_target(a: &PtArgs) -> Result<Option<OutputTarget>> {
    if let Some(spec) = &a.topa {
        return Ok(Some(OutputTarget::Topa {
            tables: topa_tables(spec)?,
        }));
    }
    if let Some(s) = &a.single_range {
        let bytes = size("--single-range", s)?;
        // Refused here, before recording, as the output stage would.
        let range = SingleRange::new(PhysAddr(REGION_BASE), bytes)
            .map_err(|e| anyhow!("--single-range `{s}`: {e}"))?;
        return Ok(Some(OutputTarget::SingleRange {
            base: range.base(),
            size: range.size(),
        }));
    }
    Ok(None)
}

fn consumer(spec: &str) -> Result<Consumer> {
    let (n, m) = spec
        .split_once('/')
        .ok_or_else(|| anyhow!("--consumer `{spec}` is not N/M"))?;
    Ok(Consumer {
        drain: size("--consumer", n)?,
        per: size("--consumer", m)?,
    })
}

fn pt(a: &PtArgs, out: &mut dyn Write) -> Result<()> {
    let config = pt_config(a)?;
    let target = output_target(a)?;
    let consumer = a.consumer.as_deref().map(consumer).transpose()?;
    if consumer.is_some() && target.is_none() {
        bail!("--consumer needs --topa or --single-range");
    }
    if a.recorder.is_trace() {
        // Each stretch is encoded on its own: their clocks would each
        // start at 0.
        ensure!(
            config.tsc.is_none() && config.timing == Timing::default(),
            "--tsc, --mtc-freq and --cyc need one continuous execution (--qemu)"
        );
    }
    let executions = a.recorder.record()?;
    let encoder = PtEncoder::new(config);
    let mut trace_bytes = Vec::new();
    let mut psbs = 0;
    let mut stats = EncodeStats::default();
    for (n, execution) in executions.iter().enumerate() {
        let trace = encoder
            .encode(execution)
            .with_context(|| format!("traced stretch {n} (from {})", execution.insns()[0]))?;
        trace_bytes.extend_from_slice(&trace.bytes);
        psbs += trace.psbs.len();
        let t = &trace.stats;
        stats.mtcs += t.mtcs;
        stats.cycs += t.cycs;
        stats.cbrs += t.cbrs;
        stats.tmas += t.tmas;
        stats.pips += t.pips;
    }
    let insns: usize = executions.iter().map(Execution::len).sum();
    writeln!(
        out,
        "{insns} instructions, {} trace bytes, {psbs} PSBs",
        trace_bytes.len(),
    )?;
    if config.ip_filter.iter().any(Option::is_some) {
        let inside = executions
            .iter()
            .flat_map(|e| e.insns())
            .filter(|&&ip| config.filter_allows(ip))
            .count();
        writeln!(out, "{inside} of them inside the --filter ranges")?;
        if inside == 0 {
            // A range that misses the program traces nothing but PSB+:
            // a typo, or addresses taken from another run's layout.
            eprintln!(
                "hwtrace sim pt: warning: none of the {insns} instructions executed is inside the --filter ranges, so the trace holds no branch"
            );
        }
    }
    if executions.len() > 1 {
        writeln!(
            out,
            "{} traced stretches, each from a PSB+",
            executions.len()
        )?;
    }
    if let Some(dir) = &a.code_out {
        let mut pages = PageCacheWriter::new();
        for execution in &executions {
            for seg in execution.memory().segments() {
                pages.add(seg.addr.0, &seg.bytes);
            }
        }
        pages
            .write(dir)
            .with_context(|| format!("--code-out {}", dir.display()))?;
        writeln!(
            out,
            "code: {} pages in {} (hwtrace flow {} --pages {})",
            pages.len(),
            dir.display(),
            a.output.display(),
            dir.display()
        )?;
    }
    let s = &stats;
    if config.timing != Timing::default() || config.cr3_filter.is_some() {
        writeln!(
            out,
            "{} MTCs, {} CYCs, {} CBRs, {} TMAs, {} PIPs",
            s.mtcs, s.cycs, s.cbrs, s.tmas, s.pips
        )?;
    }
    if let Some(f) = config.cr3_filter {
        writeln!(
            out,
            "process CR3 {:#x}: {}",
            f.process_cr3.0,
            if f.matches() {
                "matches, traced"
            } else {
                "does not match, not traced"
            }
        )?;
        print_register(out, RegisterId::RtitCr3Match, f.cr3_match.0)?;
    }
    let ctl = rtit_ctl(&config, matches!(target, Some(OutputTarget::Topa { .. })))?;
    let bytes = match &target {
        None => {
            print_register(out, RegisterId::RtitCtl, ctl.raw())?;
            trace_bytes
        }
        Some(target) => {
            let run = write_output(&trace_bytes, target, consumer)?;
            print_run(out, &run, ctl.raw())?;
            if consumer.is_some() {
                // Everything the consumer read, in order, OVFs included.
                let written = usize::try_from(run.written)?;
                run.stream[..written].to_vec()
            } else {
                run.read_back()
            }
        }
    };
    std::fs::write(&a.output, &bytes)
        .with_context(|| format!("cannot write {}", a.output.display()))?;
    writeln!(out, "wrote {} bytes to {}", bytes.len(), a.output.display())?;
    Ok(())
}

fn print_run(out: &mut dyn Write, run: &OutputRun, ctl: u64) -> Result<()> {
    writeln!(
        out,
        "output: {} bytes written, {} lost after a ToPA STOP",
        run.written, run.lost_after_stop
    )?;
    for r in &run.regions {
        writeln!(
            out,
            "  region {} ({} bytes): {} bytes written",
            r.base,
            r.size,
            r.bytes.len()
        )?;
    }
    for p in &run.pmis {
        writeln!(
            out,
            "  PMI after byte {}: ToPA entry {} of table {} (region {}) filled",
            p.written, p.entry, p.table, p.region
        )?;
    }
    for l in &run.losses {
        match l.ovf_at {
            Some(at) => writeln!(
                out,
                "  lost {} bytes from trace offset {:#x}; OVF at output offset {:#x}",
                l.bytes, l.from.0, at.0
            )?,
            None => writeln!(
                out,
                "  lost {} bytes from trace offset {:#x} to the end",
                l.bytes, l.from.0
            )?,
        }
    }
    print_register(out, RegisterId::RtitCtl, ctl)?;
    print_register(out, RegisterId::RtitOutputBase, run.output_base.raw())?;
    print_register(out, RegisterId::RtitOutputMaskPtrs, run.mask_ptrs.raw())?;
    print_register(out, RegisterId::RtitStatus, run.status.raw())?;
    Ok(())
}

/// One register explained field by field (hwtrace-regs' `explain`).
fn print_register(out: &mut dyn Write, id: RegisterId, raw: u64) -> Result<()> {
    let e = explain(id, raw, &Context::default())?;
    writeln!(out, "{id} = {raw:#018x}  ({})", e.def.sdm)?;
    for f in e.fields() {
        writeln!(
            out,
            "  {:<6} {:<18} {:>18}  {}",
            f.bits.to_string(),
            f.name,
            format!("{:#x}", f.value),
            f.meaning
        )?;
    }
    Ok(())
}

fn bts(a: &BtsArgs, out: &mut dyn Write) -> Result<()> {
    let records = number("--records", &a.records)?;
    ensure!(records >= 2, "--records must be at least 2");
    let threshold = match &a.threshold {
        Some(t) => number("--threshold", t)?,
        None => records - records / 8,
    };
    ensure!(
        threshold > 0 && threshold <= records,
        "--threshold must be 1 to --records"
    );
    let stream = branch_stream(&a.recorder.record()?)?;
    let debugctl = [DebugCtlFlag::Tr, DebugCtlFlag::Bts, DebugCtlFlag::Btint]
        .into_iter()
        .try_fold(DebugCtl::new(DebugCtlLayout::Modern), |c, f| {
            c.with(f, true)
        })?;
    let base = 0xFFFF_FE00_0000_0000u64;
    let record = 24u64;
    let config = BtsConfig {
        format: DsFormat::Bits64,
        area: DsManagementArea {
            bts_buffer_base: base,
            bts_index: base,
            bts_absolute_maximum: base + records * record,
            bts_interrupt_threshold: base + threshold * record,
            ..DsManagementArea::default()
        },
        debugctl,
        pmi_latency: 0,
    };
    let mut sim = BtsSim::new(config)?;
    let (report, drained) = sim.run_draining(&stream)?;
    let mut got = bts_branches(&BtsDump::raw(&drained, DsFormat::Bits64)?);
    got.extend(bts_branches(&BtsDump::new(
        &sim.area(),
        sim.buffer(),
        DsFormat::Bits64,
        BtsOrder::Linear,
    )?));
    for (n, b) in got.iter().enumerate() {
        let predicted = match b.mispredicted {
            Some(true) => "  mispredicted",
            _ => "",
        };
        writeln!(out, "{n:>8}  {} -> {}{predicted}", b.from, b.to)?;
    }
    writeln!(
        out,
        "{} records written ({} branches), {} threshold PMIs (drained), {} lost, {} in the buffer at the end",
        report.written,
        stream.len(),
        report.pmis.len(),
        report.lost,
        sim.records_before_index()
    )?;
    Ok(())
}

fn lbr(a: &LbrArgs, out: &mut dyn Write) -> Result<()> {
    let uarch = Uarch::from_name(&a.uarch)?;
    let select = a
        .select
        .as_deref()
        .map(|s| number("--select", s))
        .transpose()?
        .unwrap_or(0);
    let config = LbrConfig::for_uarch(uarch)?.with_select(select);
    let stream = branch_stream(&a.recorder.record()?)?;
    let mut sim = LbrSim::new(config)?;
    sim.run(&stream)?;
    write!(out, "{}", sim.snapshot().to_msr_text())?;
    Ok(())
}
