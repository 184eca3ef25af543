//! [`SourceArgs`]: the inputs every answer command accepts, and
//! [`Source`]: those inputs opened and decoded as a stream of [`Exec`].
//!
//! ```text
//! TRACE                         raw Intel PT, or perf.data (by its magic)
//!   --image/--elf/--pe/--pages/--cr3, --dump/--la57         (raw PT, as `hwtrace flow`)
//!   --cpu                        (errata; perf.data: instead of its CPUID header's)
//!   --mtc-freq, --nom-freq, --cpuid-0x15.eax/.ebx             (raw PT's timing, as ptdump)
//!   --sysroot DIR, --vdso FILE, --kcore DIR|FILE             (perf.data, as `hwtrace perf decode`)
//!   --kallsyms FILE                                          (kernel symbols, any input)
//! --bts FILE | --bts-ds DS --bts-buffer BUF [--bts-format 32|64]
//! --lbr FILE [--lbr-format N] [--lbr-uarch NAME] [--lbr-tos N]
//! ```
//!
//! The image options serve every input: they are the code raw PT is
//! decoded over, and for all inputs they are the files symbols come from
//! ([`Source::mappings`]).

use super::{branches, perf, pipeline, pt};
use crate::cmd::flow::{DumpArgs, decoder_config, open_dump, parse_cpu};
use crate::flow::{FlowMemory, Item, Items, MappedTrace};
use crate::image_args::ImageArgs;
use crate::input::MappedFile;
use crate::ptdump::cpu::Cpu;
use crate::timing_args::TimingArgs;
use anyhow::{Context, Result, bail};
use hwtrace_flow::Config;
use hwtrace_flow::insn::FastDecoder;
use hwtrace_flow::parallel::{FastSource, MAX_STALL};
use hwtrace_report::exec::{Detail, Exec, GapKind, Mapping};
use hwtrace_report::symbols::Kallsyms;
use hwtrace_report::symbols::{Space, Symbolizer};
use hwtrace_types::Ip;
use std::path::{Path, PathBuf};

/// Where [`Source::run`] hands each record; an error stops decoding.
pub type Sink<'a> = &'a mut dyn FnMut(Exec) -> Result<()>;

/// The inputs of an answer command. Use with `#[command(flatten)]`.
#[derive(Debug, clap::Args)]
pub struct SourceArgs {
    /// The trace: a raw Intel PT trace (decoded over the image options or
    /// --dump), or a perf.data file (recognised by its PERFILE2 magic).
    #[arg(value_name = "TRACE", required_unless_present_any = ["bts", "bts_ds", "lbr"])]
    pub trace: Option<PathBuf>,
    #[command(flatten)]
    pub images: ImageArgs,
    #[command(flatten)]
    pub dump: DumpArgs,
    /// The processor that wrote the trace (family/model[/stepping]):
    /// applies its errata workarounds, as `hwtrace flow --cpu` does (for
    /// perf.data, instead of the processor its CPUID header names).
    #[arg(long, value_name = "F/M[/S]", value_parser = parse_cpu)]
    pub cpu: Option<Cpu>,
    /// Read tracing's on/off status as perf does (see `hwtrace flow
    /// --lenient`): raw PT and perf.data.
    #[arg(long)]
    pub lenient: bool,
    #[command(flatten)]
    pub timing: TimingArgs,
    /// perf.data: prefix for every file the MMAP records name.
    #[arg(long, value_name = "DIR")]
    pub sysroot: Option<PathBuf>,
    /// perf.data: a dump of the traced process's vDSO.
    #[arg(long, value_name = "FILE")]
    pub vdso: Option<PathBuf>,
    /// perf.data: kernel code, as `hwtrace perf decode --kcore`: `perf
    /// record --kcore`'s directory (its `kcore`, and its `kallsyms` unless
    /// --kallsyms is given), or an ELF core whose segments are kernel
    /// virtual addresses, like /proc/kcore.
    #[arg(long, value_name = "DIR|FILE")]
    pub kcore: Option<PathBuf>,
    /// Kernel symbols (/proc/kallsyms text) naming kernel addresses, for
    /// every input; for perf.data with --kcore and no kernel mapping in
    /// the sideband, its _stext.._etext is also the kernel code read.
    #[arg(long, value_name = "FILE")]
    pub kallsyms: Option<PathBuf>,
    /// BTS: raw 64- or 32-bit records, oldest first (instead of TRACE).
    #[arg(long, value_name = "RAWFILE", conflicts_with_all = ["trace", "bts_ds", "lbr"])]
    pub bts: Option<PathBuf>,
    /// BTS: the DS buffer management area (with --bts-buffer; instead of TRACE).
    #[arg(long, value_name = "DSFILE", requires = "bts_buffer", conflicts_with_all = ["trace", "lbr"])]
    pub bts_ds: Option<PathBuf>,
    /// BTS: the BTS buffer from its base (with --bts-ds).
    #[arg(long, value_name = "BUFFILE", requires = "bts_ds")]
    pub bts_buffer: Option<PathBuf>,
    /// BTS record layout: 64 (24-byte records) or 32 (12-byte records).
    #[arg(long, default_value = "64", value_parser = ["32", "64"])]
    pub bts_format: String,
    /// LBR: a text dump of the LBR MSRs, `REGISTER VALUE` per line (instead of TRACE).
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    pub lbr: Option<PathBuf>,
    /// LBR format, `IA32_PERF_CAPABILITIES[5:0]` (default: the dump's, else --lbr-uarch's).
    #[arg(long, value_name = "N", requires = "lbr")]
    pub lbr_format: Option<String>,
    /// LBR: the micro-architecture (skylake, haswell, ...) for the format.
    #[arg(long, value_name = "NAME", requires = "lbr")]
    pub lbr_uarch: Option<String>,
    /// LBR: MSR_LASTBRANCH_TOS (default: the dump's).
    #[arg(long, value_name = "N", requires = "lbr")]
    pub lbr_tos: Option<String>,
    /// Threads to decode on (default: every core). A raw Intel PT trace is
    /// decoded by PSB work units on N threads (coverage also builds on
    /// them); perf.data and branch lists decode on a thread of their own
    /// beside the answer (2 or more), except for coverage, which takes
    /// them on one thread unless N asks for two. 1: everything on one
    /// thread. The answer is the same.
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub jobs: Option<u64>,
    /// The least trace bytes a parallel work unit covers (tests use tiny
    /// units to put seams everywhere).
    #[arg(long, value_name = "BYTES", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub unit_bytes: Option<u64>,
}

/// What decoding found besides the records: counts and the first
/// [`pt::MAX_PROBLEMS`] problems in words.
#[derive(Clone, Debug, Default)]
pub struct SourceReport {
    /// Bytes of trace input (the PT trace, the AUX data, the BTS buffer).
    pub trace_bytes: u64,
    /// `Exec::Insn` records.
    pub insns: u64,
    /// `Exec::Branch` records.
    pub branches: u64,
    /// `Exec::Gap` records.
    pub gaps: u64,
    /// Decode errors (each followed by a resynchronisation).
    pub errors: u64,
    /// Overflows (the processor lost trace).
    pub overflows: u64,
    /// Trace bytes not decoded after errors.
    pub skipped_bytes: u64,
    /// Bytes lost before they were recorded (perf.data gaps).
    pub lost_bytes: u64,
    /// Problems in words, each naming the input and where.
    pub problems: Vec<String>,
    /// Problems beyond the first [`pt::MAX_PROBLEMS`], counted only.
    pub more_problems: u64,
    /// Decode errors that were a PSB+ status update the decoder did not
    /// expect (after VM exits: tracing said on where it was off).
    pub status_errors: u64,
    /// Whether tracing's status was read as perf reads it (`--lenient`).
    pub lenient: bool,
}

impl SourceReport {
    /// Keeps `text` (or counts it once enough are kept).
    pub fn problem(&mut self, text: String) {
        if self.problems.len() < pt::MAX_PROBLEMS {
            self.problems.push(text);
        } else {
            self.more_problems += 1;
        }
    }

    /// Adds what decoding the next stretch of the same input found (its
    /// problems after these, as far as they are kept).
    pub fn add(&mut self, next: SourceReport) {
        self.insns += next.insns;
        self.branches += next.branches;
        self.gaps += next.gaps;
        self.errors += next.errors;
        self.overflows += next.overflows;
        self.skipped_bytes += next.skipped_bytes;
        self.lost_bytes += next.lost_bytes;
        self.status_errors += next.status_errors;
        for p in next.problems {
            self.problem(p);
        }
        self.more_problems += next.more_problems;
    }

    /// Whether anything went wrong.
    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty()
    }

    /// Where errors were status updates `--lenient` decodes through: a
    /// line saying so (as `hwtrace flow` prints it).
    pub fn lenient_hint(&self) -> Option<String> {
        (self.status_errors > 0 && !self.lenient)
            .then(|| crate::flow::status_error_hint(self.status_errors, "perf and libxdc decode"))
    }
}

/// The input opened: files mapped, images loaded, ready to decode.
#[derive(Debug)]
pub struct Source {
    input: Input,
    mappings: Vec<Mapping>,
    /// `--kallsyms` (for perf.data also its kcore_dir's `kallsyms`).
    kallsyms: Option<Kallsyms>,
    /// Threads [`run`](Self::run) decodes on: a raw trace on all of them
    /// ([`run_parallel`](Self::run_parallel)), other inputs on a thread of
    /// their own beside the answer's when more than one; and the least
    /// bytes of a raw trace's work units (`--unit-bytes`).
    jobs: usize,
    unit_bytes: Option<u64>,
    /// `--lenient`.
    lenient: bool,
}

#[derive(Debug)]
enum Input {
    Pt(RawPt),
    Perf(Box<perf::PerfInput>),
    Branches {
        list: Vec<(Ip, Ip)>,
        bytes: u64,
        memory: Option<Box<FlowMemory>>,
    },
}

/// A raw Intel PT input: the trace and its file, the code it ran and the
/// decoder's configuration.
#[derive(Debug)]
pub(super) struct RawPt {
    pub path: PathBuf,
    pub trace: MappedTrace,
    pub memory: Box<FlowMemory>,
    pub config: hwtrace_flow::Config,
}

impl RawPt {
    /// The trace as problems name it.
    pub fn name(&self) -> String {
        show(&self.path)
    }
}

/// `PERFILE2`, the first bytes of a perf.data file (file or pipe format).
const PERF_MAGIC: &[u8; 8] = b"PERFILE2";

impl Source {
    /// The TSC frequency the input tells (a perf.data recording's TSC
    /// conversion), for `--tsc-hz` left out.
    pub fn tsc_hz(&self) -> Option<f64> {
        match &self.input {
            Input::Perf(p) => p.tsc_hz(),
            _ => None,
        }
    }

    /// Opens the input `args` name: maps files, loads images, reads
    /// dumps. Fails naming the option and the file.
    pub fn open(args: &SourceArgs) -> Result<Self> {
        let image = if args.images.is_empty() {
            None
        } else {
            Some(args.images.load()?)
        };
        let mut mappings: Vec<Mapping> = image
            .iter()
            .flat_map(|i| i.sections())
            .map(|s| Mapping {
                path: PathBuf::from(&s.name),
                cr3: s.cr3,
                pid: None,
                start: s.addr,
                len: s.len,
                file_offset: s.file_offset,
            })
            .collect();
        let dump = match &args.dump.dump {
            Some(spec) => Some(open_dump(&args.dump, spec)?),
            None => None,
        };
        let has_code = image.is_some() || dump.is_some();
        let memory = Box::new(FlowMemory::new(image, dump));
        // perf.data inputs read it with their kernel (or from its kcore_dir).
        let kallsyms = || {
            args.kallsyms
                .as_deref()
                .map(Kallsyms::load)
                .transpose()
                .context("--kallsyms")
        };
        let jobs = args.jobs.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |n| usize::try_from(n).unwrap_or(usize::MAX),
        );
        if args.bts.is_some() || args.bts_ds.is_some() {
            let (list, bytes) = branches::bts(args)?;
            return Ok(Self {
                input: Input::Branches {
                    list,
                    bytes,
                    memory: has_code.then_some(memory),
                },
                mappings,
                kallsyms: kallsyms()?,
                jobs,
                unit_bytes: args.unit_bytes,
                lenient: args.lenient,
            });
        }
        if let Some(path) = &args.lbr {
            let list = branches::lbr(args, path)?;
            return Ok(Self {
                input: Input::Branches {
                    list,
                    bytes: 0,
                    memory: has_code.then_some(memory),
                },
                mappings,
                kallsyms: kallsyms()?,
                jobs,
                unit_bytes: args.unit_bytes,
                lenient: args.lenient,
            });
        }
        let Some(path) = &args.trace else {
            bail!("no input: give a TRACE (raw PT or perf.data), --bts, --bts-ds or --lbr");
        };
        let trace = MappedFile::open(path)?;
        if trace.bytes().starts_with(PERF_MAGIC) {
            let input = perf::PerfInput::open(path, trace, args)?;
            mappings.extend(input.mappings());
            let kallsyms = input.kallsyms().cloned();
            return Ok(Self {
                input: Input::Perf(Box::new(input)),
                mappings,
                kallsyms,
                jobs,
                unit_bytes: args.unit_bytes,
                lenient: args.lenient,
            });
        }
        if !has_code {
            bail!(
                "{}: a raw Intel PT trace needs the code it ran: give --image, --elf, --pe, --pages or --dump",
                path.display()
            );
        }
        // Kept as a trace whose decoded pages go back to the kernel: the
        // resident size stays flat on huge traces.
        let trace = MappedTrace::from_map(trace.into_map());
        Ok(Self {
            input: Input::Pt(RawPt {
                path: path.clone(),
                trace,
                memory,
                config: {
                    let config = decoder_config(args.cpu, args.lenient);
                    Config {
                        time: args.timing.apply(config.time),
                        ..config
                    }
                },
            }),
            mappings,
            kallsyms: kallsyms()?,
            jobs,
            unit_bytes: args.unit_bytes,
            lenient: args.lenient,
        })
    }

    /// The files mapped into the traced address spaces: the image options'
    /// files, and for perf.data every executable mapping of its sideband.
    #[cfg(test)]
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The symboliser every answer names addresses with: the files of
    /// [`Self::mappings`], and over them the kernel symbols of
    /// `--kallsyms` as the module `[kernel.kallsyms]` (where perf's kernel
    /// mapping and the list overlap, the list's functions name it).
    pub fn symbolizer(&self) -> Symbolizer {
        let mut s = Symbolizer::from_mappings(&self.mappings);
        if let Some(k) = &self.kallsyms {
            s.add_symbol_list(Path::new("[kernel.kallsyms]"), Space::ANY, k.functions());
        }
        s
    }

    /// A raw Intel PT input's trace, memory and decoder configuration
    /// (`None` for perf.data and branch lists): for answers that decode
    /// the trace their own way (`coverage --libxdc-edges`).
    pub fn raw_pt(&self) -> Option<(&[u8], &FlowMemory, hwtrace_flow::Config)> {
        self.raw_pt_input()
            .map(|pt| (pt.trace.bytes(), &*pt.memory, pt.config))
    }

    /// A raw Intel PT input as it was opened (`None` for perf.data and
    /// branch lists).
    pub(super) fn raw_pt_input(&self) -> Option<&RawPt> {
        match &self.input {
            Input::Pt(pt) => Some(pt),
            _ => None,
        }
    }

    /// Whether [`run`](Self::run) decodes perf.data and branch lists on a
    /// thread of its own.
    fn beside(&self) -> bool {
        self.jobs >= 2
    }

    /// An empty report of this input's decode.
    pub(super) fn new_report(&self) -> SourceReport {
        SourceReport {
            trace_bytes: self.trace_bytes(),
            lenient: self.lenient,
            ..SourceReport::default()
        }
    }

    /// Bytes of trace the input has (for progress).
    pub fn trace_bytes(&self) -> u64 {
        match &self.input {
            Input::Pt(pt) => pt.trace.bytes().len() as u64,
            Input::Perf(p) => p.aux_bytes(),
            Input::Branches { bytes, .. } => *bytes,
        }
    }

    /// Decodes the whole input, handing every record to `sink` in trace
    /// order (perf.data: one AUX stream after the other, each starting
    /// with its `Exec::Thread`): a raw trace on every thread `--jobs`
    /// allows ([`run_parallel`](Self::run_parallel)), other inputs beside
    /// the answer ([`pipeline`]) or on this thread.
    /// `detail`: what the answer needs of the flow ([`Detail::Calls`]:
    /// runs that neither call nor return joined with the ones after them).
    pub fn run(&self, detail: Detail, sink: Sink<'_>) -> Result<SourceReport> {
        if self.jobs > 1
            && let Some(report) = self.run_parallel(detail, self.jobs, self.unit_bytes, sink)?
        {
            return Ok(report);
        }
        if self.beside() {
            pipeline::run_beside(self, detail, sink)
        } else {
            self.run_here(detail, sink)
        }
    }

    /// [`run`](Self::run) on this thread alone.
    pub fn run_here(&self, detail: Detail, sink: Sink<'_>) -> Result<SourceReport> {
        let mut report = self.new_report();
        match &self.input {
            Input::Pt(raw) => {
                let bytes = raw.trace.bytes();
                // The block-cached decoder: runs of plain code handed out
                // whole, every other step as InsnDecoder's items.
                let dec =
                    FastSource::runs(FastDecoder::new(bytes, raw.config, &*raw.memory), MAX_STALL);
                let mut map =
                    pt::ItemMapper::new(0, bytes.len() as u64, raw.name()).with_detail(detail);
                let mut items = Items::new(dec);
                loop {
                    if let Some(offset) = map.runs(|v| items.visit_runs(v), sink, &mut report)? {
                        raw.trace.decoded_to(offset);
                    }
                    let Some(item) = items.next() else { break };
                    if let Item::Insn { offset, .. } = item {
                        raw.trace.decoded_to(offset);
                    }
                    map.item(item, sink, &mut report)?;
                }
                map.gap(bytes.len() as u64, GapKind::Disabled, sink, &mut report)?;
            }
            Input::Perf(p) => p.run(detail, sink, &mut report)?,
            Input::Branches { list, memory, .. } => {
                let memory = memory.as_deref();
                for &(from, to) in list {
                    report.branches += 1;
                    sink(Exec::Branch {
                        from,
                        to,
                        class: branches::class_at(memory, from),
                    })?;
                }
            }
        }
        Ok(report)
    }
}

fn show(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answers::testing::{psb_plus, tnt};
    use clap::Parser;
    use hwtrace_flow::insn::InsnClass;
    use hwtrace_packet::{Packet, TraceBuilder};
    use hwtrace_report::exec::ExecInsn;
    use hwtrace_types::{AddressSpace, Cr3, TraceOffset};

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        source: SourceArgs,
    }

    fn parse(args: &[&str]) -> Result<SourceArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("answer").chain(args.iter().copied())).map(|c| c.source)
    }

    /// A scratch file holding `bytes`, removed when the test drops it
    /// (whether it passes or fails).
    fn tmp(name: &str, bytes: &[u8]) -> TmpFile {
        let path =
            std::env::temp_dir().join(format!("hwtrace-source-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        TmpFile(path)
    }

    struct TmpFile(PathBuf);

    impl std::ops::Deref for TmpFile {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl AsRef<Path> for TmpFile {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TmpFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn collect(source: &Source) -> (Vec<Exec>, SourceReport) {
        let mut all = Vec::new();
        let report = source
            .run(Detail::Runs, &mut |e| {
                all.push(e);
                Ok(())
            })
            .unwrap();
        (all, report)
    }

    #[test]
    fn clap_accepts_the_definitions() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn one_input_kind_at_a_time() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["t.pt", "--bts", "b.raw"]).is_err());
        assert!(parse(&["--lbr", "l.txt", "--bts", "b.raw"]).is_err());
        assert!(parse(&["--bts-ds", "ds"]).is_err());
        assert!(parse(&["--bts-ds", "ds", "--bts-buffer", "buf"]).is_ok());
        let a = parse(&[
            "t.pt",
            "--elf",
            "/bin/true",
            "--dump",
            "d.raw",
            "--cr3",
            "1000",
        ])
        .unwrap();
        assert_eq!(a.trace.as_deref(), Some(Path::new("t.pt")));
        assert_eq!(a.dump.dump.as_deref(), Some("d.raw"));
    }

    /// 1000: nop; 1001: jz 1000; 1003: ret
    const CODE: [u8; 4] = [0x90, 0x74, 0xfd, 0xc3];

    #[test]
    fn raw_pt_gives_instructions_spaces_times_and_gaps() {
        let mut t = TraceBuilder::new();
        psb_plus(&mut t, Some(0x5000), Some(Cr3(0xa000)), 0x1000);
        // jz taken, then not taken; the ret leaves tracing off.
        tnt(&mut t, 0b10, 2);
        t.ip(Packet::TipPgd, 0).unwrap();
        let trace = tmp("pt", &t.finish());
        let code = tmp("code", &CODE);
        let image = format!("{}@1000", code.display());
        let args = parse(&[trace.to_str().unwrap(), "--image", &image]).unwrap();
        let source = Source::open(&args).unwrap();
        assert_eq!(source.mappings().len(), 1);
        assert_eq!(source.mappings()[0].start, Ip(0x1000));
        assert_eq!(source.mappings()[0].path, *code);
        // Kernel symbols name kernel addresses for raw PT too; the image
        // still names its own.
        let ksyms = tmp(
            "kallsyms",
            b"ffffffff81000000 T _stext\nffffffff81000040 t helper\n",
        );
        let with_ksyms = parse(&[
            trace.to_str().unwrap(),
            "--image",
            &image,
            "--kallsyms",
            ksyms.to_str().unwrap(),
        ])
        .unwrap();
        let symbols = Source::open(&with_ksyms).unwrap().symbolizer();
        let name = |ip: u64| symbols.name(hwtrace_report::symbols::Space::ANY, Ip(ip));
        assert_eq!(name(0xffff_ffff_8100_0041).as_deref(), Some("helper+0x1"));
        assert_eq!(
            name(0x1003),
            Some(format!(
                "{}+0x3",
                code.file_name().unwrap().to_string_lossy()
            ))
        );
        let bad = tmp("bad-kallsyms", b"not kallsyms\n");
        let e = Source::open(
            &parse(&[
                trace.to_str().unwrap(),
                "--image",
                &image,
                "--kallsyms",
                bad.to_str().unwrap(),
            ])
            .unwrap(),
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("--kallsyms"), "{e:#}");
        let (all, report) = collect(&source);
        let space = AddressSpace::with_cr3(Cr3(0xa000));
        let insn = |ip: u64, size: u8, class: InsnClass| {
            Exec::Insn(ExecInsn {
                space,
                ip: Ip(ip),
                size,
                class,
            })
        };
        // Runs of plain code come whole: spelled out here by the code's
        // sizes (only the jz at 0x1001 is two bytes).
        let mut insns = Vec::new();
        let mut runs = 0;
        for e in &all {
            match *e {
                Exec::Insn(_) => insns.push(*e),
                Exec::Run(r) => {
                    runs += 1;
                    assert_eq!(r.space, space);
                    let mut ip = r.ip.0;
                    for k in 1..=r.insns {
                        let (size, class) = if k == r.insns {
                            assert_eq!(ip, r.last_ip.0, "{r:?}");
                            (r.last_size, r.last_class)
                        } else {
                            (if ip == 0x1001 { 2 } else { 1 }, InsnClass::Other)
                        };
                        insns.push(insn(ip, size, class));
                        ip += u64::from(size);
                    }
                }
                _ => {}
            }
        }
        assert!(runs > 0, "{all:?}");
        assert_eq!(
            insns,
            [
                insn(0x1000, 1, InsnClass::Other),
                insn(0x1001, 2, InsnClass::CondJump),
                insn(0x1000, 1, InsnClass::Other),
                insn(0x1001, 2, InsnClass::CondJump),
                insn(0x1003, 1, InsnClass::Return),
            ]
        );
        assert!(matches!(all.first(), Some(Exec::Time(0x5000))), "{all:?}");
        let gaps: Vec<GapKind> = all
            .iter()
            .filter_map(|e| match e {
                Exec::Gap { why, .. } => Some(*why),
                _ => None,
            })
            .collect();
        // The TIP.PGD, then the end of the trace.
        assert_eq!(gaps, [GapKind::Disabled, GapKind::Disabled]);
        assert!(
            matches!(all.last(), Some(Exec::Gap { offset, .. }) if *offset == TraceOffset(std::fs::metadata(&trace).unwrap().len()))
        );
        assert_eq!((report.insns, report.errors, report.gaps), (5, 0, 2));
        assert!(!report.has_problems(), "{:?}", report.problems);
    }

    #[test]
    fn timing_options_turn_mtc_and_cyc_packets_into_time() {
        // The loop at 0x1000 four times, an MTC period of 100 cycles each
        // (one crystal-clock tick, 4 TSC ticks), then 100 cycles more to
        // the disable.
        let mut t = TraceBuilder::new();
        t.push(Packet::Psb).unwrap();
        t.push(Packet::Tsc(0x5000)).unwrap();
        t.push(Packet::Tma(hwtrace_packet::Tma { ctc: 0, fc: 0 }))
            .unwrap();
        t.push(Packet::ModeExec(hwtrace_packet::ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        }))
        .unwrap();
        t.ip(Packet::Fup, 0x1000).unwrap();
        t.push(Packet::Psbend).unwrap();
        for ctc in 1..=4u8 {
            t.push(Packet::Cyc(100)).unwrap();
            tnt(&mut t, 1, 1);
            t.push(Packet::Mtc(ctc)).unwrap();
        }
        t.push(Packet::Cyc(100)).unwrap();
        tnt(&mut t, 0, 1);
        t.ip(Packet::TipPgd, 0).unwrap();
        let trace = tmp("timing", &t.finish());
        let code = tmp("timing-code", &CODE);
        let image = format!("{}@1000", code.display());
        let times = |timing: &[&str]| -> Vec<u64> {
            let mut args = vec![trace.to_str().unwrap(), "--image", &image];
            args.extend(timing);
            let (all, _) = collect(&Source::open(&parse(&args).unwrap()).unwrap());
            all.iter()
                .filter_map(|e| match e {
                    Exec::Time(tsc) => Some(*tsc),
                    _ => None,
                })
                .collect()
        };
        // Without the options only the TSC packet gives time.
        assert_eq!(times(&[]), [0x5000]);
        // With them: 4 MTC periods and 100 cycles at 0.04 ticks a cycle
        // (in fixed point, 10/256: 3 ticks).
        let timing = [
            "--mtc-freq",
            "0",
            "--cpuid-0x15.eax",
            "1",
            "--cpuid-0x15.ebx",
            "4",
        ];
        assert_eq!(times(&timing), [0x5000, 0x5000 + 16 + 3]);
    }

    #[test]
    fn a_decode_error_is_a_gap_and_a_problem_naming_the_offset() {
        let mut t = TraceBuilder::new();
        psb_plus(&mut t, None, None, 0x1000);
        // A TIP where the jz wants a TNT bit.
        t.ip(Packet::Tip, 0x1000).unwrap();
        let trace = tmp("bad", &t.finish());
        let code = tmp("badcode", &CODE);
        let image = format!("{}@1000", code.display());
        let args = parse(&[trace.to_str().unwrap(), "--image", &image]).unwrap();
        let (all, report) = collect(&Source::open(&args).unwrap());
        assert_eq!(report.errors, 1, "{all:?}");
        assert!(all.iter().any(|e| matches!(
            e,
            Exec::Gap {
                why: GapKind::DecodeError,
                ..
            }
        )));
        assert!(
            report.problems[0].contains("error at offset 0x"),
            "{:?}",
            report.problems
        );
    }

    #[test]
    fn raw_pt_without_code_is_refused() {
        let trace = tmp("nocode", &[0u8; 16]);
        let args = parse(&[trace.to_str().unwrap()]).unwrap();
        let err = format!("{:#}", Source::open(&args).unwrap_err());
        assert!(err.contains("needs the code it ran"), "{err}");
    }

    #[test]
    fn bts_records_are_branches_classified_from_the_images() {
        let mut raw = Vec::new();
        for (from, to) in [(0x1001u64, 0x1000u64), (0x1003, 0x2000)] {
            raw.extend_from_slice(&from.to_le_bytes());
            raw.extend_from_slice(&to.to_le_bytes());
            raw.extend_from_slice(&0x10u64.to_le_bytes());
        }
        let bts = tmp("bts", &raw);
        let code = tmp("btscode", &CODE);
        let image = format!("{}@1000", code.display());
        let args = parse(&["--bts", bts.to_str().unwrap(), "--image", &image]).unwrap();
        let (all, report) = collect(&Source::open(&args).unwrap());
        assert_eq!(
            all,
            [
                Exec::Branch {
                    from: Ip(0x1001),
                    to: Ip(0x1000),
                    class: InsnClass::CondJump
                },
                Exec::Branch {
                    from: Ip(0x1003),
                    to: Ip(0x2000),
                    class: InsnClass::Return
                },
            ]
        );
        assert_eq!((report.branches, report.trace_bytes), (2, 48));
        // Without code the class is unknown.
        let args = parse(&["--bts", bts.to_str().unwrap()]).unwrap();
        let (all, _) = collect(&Source::open(&args).unwrap());
        assert!(matches!(
            all[0],
            Exec::Branch {
                class: InsnClass::Unknown,
                ..
            }
        ));
    }

    #[test]
    fn perf_data_is_recognised_and_its_threads_and_mappings_reported() {
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/perf/pt-true.data");
        let args = parse(&[fixture.to_str().unwrap()]).unwrap();
        let source = Source::open(&args).unwrap();
        let true_map = source
            .mappings()
            .iter()
            .find(|m| m.path.ends_with("true"))
            .expect("the mapping of /usr/bin/true");
        assert!(true_map.start.0 >= 0x5555_5555_4000 && true_map.len > 0);
        assert!(true_map.pid.is_some());
        let (all, report) = collect(&source);
        assert!(
            matches!(
                all.first(),
                Some(Exec::Thread {
                    tid: Some(_),
                    pid: Some(_),
                    ..
                })
            ),
            "{all:?}"
        );
        assert!(report.trace_bytes > 0);
        assert!(matches!(
            all.last(),
            Some(Exec::Gap {
                why: GapKind::Disabled,
                ..
            })
        ));
    }

    /// The records and the report of `source`, decoded on this thread and
    /// beside it.
    fn here_and_beside(source: &Source, detail: Detail) -> [(Vec<Exec>, String); 2] {
        let mut here = Vec::new();
        let report = source
            .run_here(detail, &mut |e| {
                here.push(e);
                Ok(())
            })
            .unwrap();
        let here = (here, format!("{report:?}"));
        let mut beside = Vec::new();
        let report = pipeline::run_beside(source, detail, &mut |e| {
            beside.push(e);
            Ok(())
        })
        .unwrap();
        [here, (beside, format!("{report:?}"))]
    }

    /// Real hardware traces (foo's 117,967 instructions over many
    /// batches, its calls out of the IP filter; Unzip's disable/enable
    /// pairs and PSB+) and a perf.data recording, as argument lists.
    fn real_inputs() -> Vec<Vec<String>> {
        let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real");
        let mut inputs: Vec<Vec<String>> = ["foo", "Unzip"]
            .iter()
            .map(|name| {
                let dir = real.join(name);
                vec![
                    dir.join("trace.pt").display().to_string(),
                    "--pages".into(),
                    dir.display().to_string(),
                ]
            })
            .collect();
        let perf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/perf/pt-true.data");
        inputs.push(vec![perf.display().to_string()]);
        inputs
    }

    #[test]
    fn decoding_beside_the_answer_hands_out_the_same_records() {
        for args in &real_inputs() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let source = Source::open(&parse(&args).unwrap()).unwrap();
            for detail in [Detail::Runs, Detail::Calls] {
                let [here, beside] = here_and_beside(&source, detail);
                // The raw traces' runs fill several batches.
                assert!(
                    here.0.len() > 2 * pipeline::BATCH
                        || args.len() == 1
                        || detail == Detail::Calls,
                    "{args:?}: {} records",
                    here.0.len()
                );
                assert_eq!(here, beside, "{args:?} {detail:?}");
            }
        }
    }

    /// The JSON lines of the calls `source` makes, with how many records
    /// made them and the decode's report.
    fn call_lines(source: &Source, detail: Detail) -> (String, usize, String) {
        use hwtrace_report::calls::{CallTracker, JsonLines};
        let mut out = Vec::new();
        let mut json = JsonLines::new(&mut out);
        let names = crate::cmd::calls::Names(source.symbolizer());
        let mut tracker = CallTracker::new(Box::new(names));
        let mut records = 0;
        let report = source
            .run_here(detail, &mut |e| {
                records += 1;
                Ok(tracker.feed(&e, &mut json)?)
            })
            .unwrap();
        tracker.finish(&mut json).unwrap();
        (
            String::from_utf8(out).unwrap(),
            records,
            format!("{report:?}"),
        )
    }

    #[test]
    fn stretches_give_the_calls_runs_give_in_fewer_records() {
        for args in &real_inputs() {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let source = Source::open(&parse(&args).unwrap()).unwrap();
            let (runs, run_records, runs_report) = call_lines(&source, Detail::Runs);
            let (stretches, stretch_records, stretches_report) = call_lines(&source, Detail::Calls);
            let calls = if args.len() > 1 { 100 } else { 1 };
            assert!(runs.lines().count() > calls, "{args:?}: {runs}");
            assert_eq!(runs, stretches, "{args:?}");
            assert_eq!(runs_report, stretches_report, "{args:?}");
            // foo: about a third of its runs end in a call or a return;
            // Unzip: one in a hundred.
            if args.len() > 1 {
                assert!(
                    stretch_records * 2 < run_records,
                    "{args:?}: {stretch_records} of {run_records}"
                );
            } else {
                assert!(stretch_records <= run_records);
            }
        }
    }

    #[test]
    fn an_answer_that_fails_stops_the_decode_beside_it() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real/foo");
        let trace = dir.join("trace.pt");
        let args = parse(&[
            trace.to_str().unwrap(),
            "--pages",
            dir.to_str().unwrap(),
            "--jobs",
            "2",
        ])
        .unwrap();
        let source = Source::open(&args).unwrap();
        // Failing in the first batch and in a later one: the answer's
        // error comes back (not the decoder's stop), and nothing hangs.
        for fail_at in [10, 3 * pipeline::BATCH + 5] {
            let mut seen = 0;
            let e = source
                .run(Detail::Runs, &mut |_| {
                    seen += 1;
                    if seen == fail_at {
                        bail!("the answer's own error");
                    }
                    Ok(())
                })
                .unwrap_err();
            assert_eq!(format!("{e:#}"), "the answer's own error");
            assert_eq!(seen, fail_at);
        }
    }

    #[test]
    fn jobs_choose_the_thread_the_decode_runs_on() {
        let trace = tmp("jobs", &[]);
        let code = tmp("jobs-code", &CODE);
        let image = format!("{}@1000", code.display());
        let open = |jobs: &str| {
            let mut args = vec![trace.to_str().unwrap(), "--image", &image];
            if !jobs.is_empty() {
                args.extend(["--jobs", jobs]);
            }
            Source::open(&parse(&args).unwrap()).unwrap().beside()
        };
        assert!(!open("1"));
        assert!(open("2") && open("16"));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(open(""), cores >= 2);
        assert!(parse(&[trace.to_str().unwrap(), "--jobs", "0"]).is_err());
    }
}
