//! `hwtrace flow`: the instructions (or blocks, or branches) a PT trace
//! says were executed, over code images and/or a physical memory dump.

use crate::flow::counted::{self, Tally};
use crate::flow::{
    Blocks, Branches, FailureLines, FlowMemory, Format, Item, Items, MappedTrace, Piece,
    PieceBatch, Printer, RunEndBatch, RunEndItems, RunPiece, RunPieces, Stats,
};
use crate::image_args::ImageArgs;
use crate::ptdump::cpu::Cpu;
use crate::timing_args::TimingArgs;
use anyhow::{Context, Result, bail};
use clap::{Arg, ArgAction, ArgMatches, Command};
use hwtrace_flow::insn::{FastDecoder, InsnDecoder};
use hwtrace_flow::parallel::{self, FastSource, Flow, FlowItem, ParallelConfig, Sink, StepSource};
use hwtrace_flow::{Config, Errata, TimeConfig};
use hwtrace_mem::paging::{PagingConfig, PagingMode};
use hwtrace_mem::phys::Dump;
use hwtrace_mem::virt::DumpMemory;
use hwtrace_types::{Cr3, PhysAddr, ReadMemory};
use std::cell::Cell;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Decode a trace into executed instructions, blocks or branches.
#[derive(Debug, clap::Args)]
pub struct FlowArgs {
    /// The raw Intel PT trace (memory-mapped).
    trace: PathBuf,
    #[command(flatten)]
    images: ImageArgs,
    #[command(flatten)]
    dump: DumpArgs,
    /// One line per block of sequentially executed instructions.
    #[arg(long, conflicts_with = "branches")]
    blocks: bool,
    /// One line per taken branch, `from => to  kind` (like `perf script --itrace=b`).
    #[arg(long)]
    branches: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// Addresses only, no disassembly.
    #[arg(long)]
    no_disasm: bool,
    /// Print nothing per item (errors still go to stderr; with --stats, the counts).
    #[arg(long)]
    quiet: bool,
    /// Print counts at the end.
    #[arg(long)]
    stats: bool,
    /// Print times: each instruction, block or branch with the time (TSC,
    /// hex) of the last event before it, each event with its own, as
    /// ptxed's `--time` and `--event:time` do (JSON: a `"tsc"` field). MTC
    /// and CYC packets become time only with the timing options below.
    #[arg(long)]
    time: bool,
    /// Tick events, as ptxed's `--event:tick`: a `[tick]` where a timing
    /// packet moved the time at a branch, so the instructions after it
    /// carry a finer time (CYC-timed traces).
    #[arg(long)]
    ticks: bool,
    #[command(flatten)]
    timing: TimingArgs,
    /// Keep the CYC calibration across an overflow (libipt's
    /// `--insn:keep-tcal-on-ovf`): by default it is measured again, the
    /// clock having been unknown for the overflow's time.
    #[arg(long)]
    keep_tcal_on_ovf: bool,
    /// The processor that wrote the trace (display family/model[/stepping],
    /// e.g. 6/85): applies the Intel PT errata workarounds known for it, as
    /// libipt's `--cpu` does.
    #[arg(long, value_name = "F/M[/S]", value_parser = parse_cpu)]
    cpu: Option<Cpu>,
    /// Read tracing's on/off status as Linux perf and libxdc do: decode on
    /// where a PSB+ says tracing is on while it was off, and through a
    /// TIP.PGE while it is on (real traces show both after a VM exit);
    /// libipt, and the default, report an error there and skip to the next
    /// PSB.
    #[arg(long)]
    lenient: bool,
    /// Decode on N threads, the trace split at its PSBs (1: one thread, no
    /// splitting). The output is the same. Default: every core when only
    /// counting (`--quiet` without `--blocks`/`--branches`), else 1:
    /// printing is slower than one decoding thread, and threads running
    /// ahead of it hold their work units' items (tens of MiB each where
    /// the code loops tightly).
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    jobs: Option<u64>,
    /// The least trace bytes a parallel work unit covers (tests use tiny
    /// units to put seams everywhere).
    #[arg(long, value_name = "BYTES", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    unit_bytes: Option<u64>,
    /// Instructions in a row without trace before an endless loop is
    /// reported (tests make loops small enough to compare every path on).
    #[arg(long, value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    max_stall: Option<u64>,
    /// The decoder underneath: the block-cached one, or the instruction
    /// decoder it must agree with (kept so tests compare the two through
    /// this command).
    #[arg(long, value_enum, default_value_t = Decoder::Fast, hide = true)]
    decoder: Decoder,
}

/// `--decoder`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Decoder {
    /// [`FastDecoder`]: straight-line code decoded once per block.
    Fast,
    /// [`InsnDecoder`]: one instruction at a time.
    Insn,
}

pub(crate) fn parse_cpu(text: &str) -> Result<Cpu, String> {
    Cpu::parse(text).map_err(|e| format!("{text:?}: {e}"))
}

/// The decoder configuration `--cpu` asks for. A processor missing from the
/// errata table decodes without workarounds, and says so.
pub(crate) fn decoder_config(cpu: Option<Cpu>, lenient: bool) -> Config {
    let base = Config {
        lenient_status: lenient,
        ..Config::default()
    };
    match cpu {
        Some(cpu) => with_errata(base, cpu).unwrap_or_else(|| {
            eprintln!(
                "hwtrace flow: warning: no Intel PT errata known for cpu {}/{}: decoding without workarounds",
                cpu.family, cpu.model
            );
            base
        }),
        None => base,
    }
}

/// `base` with the errata workarounds of `cpu` (libipt's table); `None`
/// when the table does not know the processor (newer ones need none).
pub(crate) fn with_errata(base: Config, cpu: Cpu) -> Option<Config> {
    let errata = Errata::for_model(cpu.family, cpu.model).ok()?;
    Some(Config {
        errata,
        // SKL168 also makes calibration distrust the first MTC period
        // after a PSB (as ptxed's `--cpu` does).
        time: TimeConfig {
            skl168: errata.skl168,
            ..base.time
        },
        ..base
    })
}

/// `--dump FILE[@PHYSBASE]` and `--la57`, with the `--cr3` of the image
/// options read for the dump too (see [`DumpArgs::cr3`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DumpArgs {
    pub(crate) dump: Option<String>,
    /// The CR3 reads use before a PIP packet names one: the `--cr3` in
    /// effect at `--dump` (they apply to what follows), else the first
    /// `--cr3` after it; `None`: vCPU 0's CR3 of an ELF core.
    cr3: Option<Cr3>,
    la57: bool,
}

impl clap::Args for DumpArgs {
    fn augment_args(cmd: Command) -> Command {
        cmd.arg(
            Arg::new("dump")
                .long("dump")
                .value_name("FILE[@PHYSBASE]")
                .action(ArgAction::Set)
                .help("Physical memory (raw dump, or QEMU dump-guest-memory ELF core) read through the page tables of the CR3 PIP packets report; --cr3 gives the CR3 before the first PIP"),
        )
        .arg(
            Arg::new("la57")
                .long("la57")
                .action(ArgAction::SetTrue)
                .requires("dump")
                .help("The dump's page tables are 5-level (CR4.LA57 = 1); default: from an ELF core's CR4"),
        )
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for DumpArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = Self::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.dump = matches.get_one::<String>("dump").cloned();
        self.la57 = matches.get_flag("la57");
        let Some(at) = matches.index_of("dump") else {
            return Ok(());
        };
        // `--cr3` belongs to the image options (its values are theirs to
        // type); the raw text is enough here.
        let cr3s: Vec<(usize, Option<u64>)> =
            match (matches.indices_of("cr3"), matches.get_raw("cr3")) {
                (Some(indices), Some(raw)) => indices
                    .zip(raw)
                    .map(|(i, v)| (i, v.to_str().and_then(parse_hex)))
                    .collect(),
                _ => Vec::new(),
            };
        let before = cr3s.iter().rev().find(|(i, _)| *i < at);
        let after = cr3s.iter().find(|(i, _)| *i > at);
        self.cr3 = before.or(after).and_then(|(_, v)| *v).map(Cr3);
        Ok(())
    }
}

/// Hex with or without `0x`, `_` ignored.
fn parse_hex(s: &str) -> Option<u64> {
    let digits: String = s.chars().filter(|c| *c != '_').collect();
    let hex = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(&digits);
    u64::from_str_radix(hex, 16).ok()
}

/// `FILE@PHYSBASE`: a suffix that is not a number stays in the name.
fn parse_dump_arg(arg: &str) -> (PathBuf, Option<PhysAddr>) {
    if let Some((file, base)) = arg.rsplit_once('@')
        && let Some(base) = parse_hex(base)
    {
        return (PathBuf::from(file), Some(PhysAddr(base)));
    }
    (PathBuf::from(arg), None)
}

pub(crate) fn open_dump(args: &DumpArgs, spec: &str) -> Result<DumpMemory<Dump>> {
    let (path, base) = parse_dump_arg(spec);
    let dump = Dump::open(&path, base).context("--dump")?;
    let cpu = dump.cpus().first().copied();
    let cr3 = args.cr3.or(cpu.map(|c| c.cr3()));
    let mode = if args.la57 {
        PagingMode::Level5
    } else {
        cpu.map_or(PagingMode::Level4, |c| c.paging_mode())
    };
    let config = PagingConfig {
        mode,
        ..PagingConfig::default()
    };
    Ok(DumpMemory::new(dump, cr3, config))
}

fn memory(args: &FlowArgs) -> Result<FlowMemory> {
    if args.images.is_empty() && args.dump.dump.is_none() {
        bail!("no code to decode over: give --image, --elf, --pe, --pages or --dump");
    }
    let image = if args.images.is_empty() {
        None
    } else {
        Some(args.images.load()?)
    };
    let dump = match &args.dump.dump {
        Some(spec) => Some(open_dump(&args.dump, spec)?),
        None => None,
    };
    Ok(FlowMemory::new(image, dump))
}

/// Runs `hwtrace flow`: exit code 2 when the trace had errors.
pub fn run(args: FlowArgs) -> Result<ExitCode> {
    let trace = MappedTrace::open(&args.trace)?;
    let mem = memory(&args)?;
    let mut config = decoder_config(args.cpu, args.lenient);
    config.time = args.timing.apply(config.time);
    config.tick_events = args.ticks;
    config.keep_tcal_on_ovf = args.keep_tcal_on_ovf;
    let bytes = trace.bytes();
    // Only counts are printed: the fast decoder's runs need not be
    // expanded into instructions, and units cost no memory for their
    // items, so they can be large.
    let counting = args.quiet && !args.blocks && !args.branches;
    let jobs = match args.jobs {
        Some(n) => usize::try_from(n).unwrap_or(1),
        None if counting => std::thread::available_parallelism().map_or(1, |n| n.get()),
        None => 1,
    };
    let mut parallel = if counting {
        ParallelConfig::counting(jobs, bytes.len() as u64)
    } else {
        ParallelConfig::new(jobs)
    };
    if let Some(unit) = args.unit_bytes {
        parallel.unit_bytes = unit;
    }
    if let Some(max) = args.max_stall {
        parallel.max_stall = max;
    }
    let mem = &mem;
    let max_stall = parallel.max_stall;
    let job = Job {
        args: &args,
        trace: &trace,
        jobs,
        parallel: &parallel,
        counting,
    };
    // Without --time and --ticks nothing printed depends on the time: the
    // fast sources then leave the timing state out of their seams, so
    // CYC-timed traces split as well as others. Ticks are events the clock
    // decides, so they keep it.
    let timed = args.time || args.ticks;
    let source = |s| timing(s, timed);
    match args.decoder {
        Decoder::Insn => job.decode(|| InsnDecoder::new(bytes, config, mem)),
        Decoder::Fast if counting => job.decode(|| {
            source(FastSource::counting(
                FastDecoder::new(bytes, config, mem),
                max_stall,
            ))
        }),
        Decoder::Fast if args.branches => job.branches(|| {
            source(FastSource::runs(
                FastDecoder::new(bytes, config, mem),
                max_stall,
            ))
        }),
        Decoder::Fast if args.blocks => job.blocks(
            || {
                source(FastSource::runs(
                    FastDecoder::new(bytes, config, mem),
                    max_stall,
                ))
            },
            mem,
        ),
        Decoder::Fast => {
            job.decode(|| source(FastSource::new(FastDecoder::new(bytes, config, mem))))
        }
    }
}

/// `source`, left timed when `timed`, else told no times are read
/// ([`FastSource::untimed`]).
fn timing<M: ReadMemory>(source: FastSource<'_, M>, timed: bool) -> FastSource<'_, M> {
    if timed { source } else { source.untimed() }
}

/// One decode `hwtrace flow` runs: what was asked, the trace, on how many
/// threads and how split, and whether it only counts.
#[derive(Clone, Copy)]
struct Job<'a> {
    args: &'a FlowArgs,
    trace: &'a MappedTrace,
    jobs: usize,
    parallel: &'a ParallelConfig,
    counting: bool,
}

impl Job<'_> {
    /// Decodes with the step sources `make` creates, on `jobs` threads.
    fn decode<S: StepSource + Send>(self, make: impl Fn() -> S + Sync) -> Result<ExitCode> {
        let Self {
            args,
            trace,
            jobs,
            parallel,
            counting,
        } = self;
        if jobs <= 1 && !(counting && args.decoder == Decoder::Fast) {
            let items = Items::new(make()).with_max_stall(parallel.max_stall);
            return output(args, trace, items, &Cell::new(0));
        }
        if counting {
            return self.quiet(make);
        }
        self.print_parallel(make, Vec::with_capacity, |batches| {
            let items = batches.flat_map(|batch: Vec<FlowItem>| batch.into_iter().map(Item::from));
            output(args, trace, items, &Cell::new(0))
        })
    }

    /// `--branches` with the fast decoder (`make` keeps runs whole): runs
    /// of plain code come as their first and last instruction only, all
    /// that reshaping into branches looks at ([`crate::flow::RunEndItems`]),
    /// on `jobs` threads; `--stats` still counts every instruction.
    fn branches<S: StepSource + Send>(self, make: impl Fn() -> S + Sync) -> Result<ExitCode> {
        let beyond = Cell::new(0);
        if self.jobs <= 1 {
            let flow = Flow::new(make()).with_max_stall(self.parallel.max_stall);
            let items = RunEndItems::new(flow, &beyond);
            return output(self.args, self.trace, items, &beyond);
        }
        let (args, trace) = (self.args, self.trace);
        self.print_parallel(make, RunEndBatch::with_capacity, |batches| {
            let items = batches.flat_map(|batch: RunEndBatch| {
                beyond.set(beyond.get() + batch.beyond);
                batch.items
            });
            output(args, trace, items, &beyond)
        })
    }

    /// `--blocks` with the fast decoder (`make` keeps runs whole): runs of
    /// plain code are folded into blocks as they are ([`RunPiece`]: their
    /// last instruction read again from `mem` where needed, by the workers
    /// on `jobs` threads); `--stats` still counts every instruction.
    fn blocks<S: StepSource + Send, M: ReadMemory + Sync>(
        self,
        make: impl Fn() -> S + Sync,
        mem: &M,
    ) -> Result<ExitCode> {
        let (args, trace) = (self.args, self.trace);
        let per_run = || RunPiece::new(mem, !args.no_disasm && !args.quiet);
        if self.jobs <= 1 {
            let flow = Flow::new(make()).with_max_stall(self.parallel.max_stall);
            let blocks = Blocks::new(RunPieces::with(flow, per_run()));
            return output(args, trace, blocks, &Cell::new(0));
        }
        let new_sink = |n: usize| PieceBatch::with_capacity(per_run(), n);
        self.print_parallel(make, new_sink, |batches| {
            let pieces = batches.flat_map(|batch: PieceBatch<'_, M>| batch.pieces);
            output(args, trace, Blocks::new(pieces), &Cell::new(0))
        })
    }

    /// Decodes on the parallel engine beside the printing (`print`, given
    /// the sinks in trace order): the sinks `new_sink` makes (a unit's, or
    /// a batch of the merge's own) cross one at a time, so when the
    /// printing is the slower side (it usually is) the items waiting are
    /// the decode's window and one batch.
    fn print_parallel<S, K>(
        self,
        make: impl Fn() -> S + Sync,
        new_sink: impl Fn(usize) -> K + Sync,
        print: impl FnOnce(&mut dyn Iterator<Item = K>) -> Result<ExitCode>,
    ) -> Result<ExitCode>
    where
        S: StepSource + Send,
        K: Sink,
    {
        let (trace, parallel) = (self.trace, self.parallel);
        let bytes = trace.bytes();
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<K>(1);
            let (make, new_sink) = (&make, &new_sink);
            let decoder = scope.spawn(move || {
                parallel::decode_into(bytes, parallel, make, new_sink, |batch| tx.send(batch))
            });
            let code = print(&mut rx.iter());
            // A failed output drops the receiver, which stops the decode.
            match decoder.join() {
                Ok(_) => code,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// `--quiet` (without `--blocks`/`--branches`): counts, on `jobs`
    /// threads.
    fn quiet<S: StepSource + Send>(self, make: impl Fn() -> S + Sync) -> Result<ExitCode> {
        let Self {
            args,
            trace,
            jobs,
            parallel,
            ..
        } = self;
        let bytes = trace.bytes();
        let mut stats = Stats::default();
        // Failures are written a line at a time through one buffer (an
        // unbuffered stderr writes each piece of a line on its own). Not
        // locked for the whole decode: a worker thread that panics prints to
        // stderr, and must not wait for a lock the merging thread holds.
        let mut err = std::io::BufWriter::new(std::io::stderr());
        let mut failures = FailureLines::new(&args.trace);
        counted::count(bytes, jobs, parallel, make, |t: Tally| {
            for f in &t.failures {
                failures.write(f, &mut err);
            }
            stats.insns += t.stats.insns;
            stats.blocks += t.stats.blocks;
            stats.branches += t.stats.branches;
            stats.events += t.stats.events;
            stats.errors += t.stats.errors;
            stats.skipped += t.stats.skipped;
            stats.status_errors += t.stats.status_errors;
            trace.decoded_to(t.offset);
        });
        let format = if args.json {
            Format::Json
        } else {
            Format::Text
        };
        err.flush().context("writing to stderr")?;
        let mut out = BufWriter::new(std::io::stdout().lock());
        if args.stats {
            Printer::new(format, !args.no_disasm).stats(&stats, &mut out)?;
        }
        out.flush()?;
        Ok(exit_code(args, &stats))
    }
}

/// Exit code 2 when the trace had errors; a hint on stderr when some were
/// PSB+ status updates that `--lenient` decodes through.
fn exit_code(args: &FlowArgs, stats: &Stats) -> ExitCode {
    if stats.status_errors > 0 && !args.lenient {
        eprintln!(
            "hwtrace: {}: {}",
            args.trace.display(),
            crate::flow::status_error_hint(stats.status_errors, "perf and libxdc decode")
        );
    }
    if stats.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

/// Writes `items` as `args` ask: exit code 2 when the trace had errors.
/// `beyond` holds the instructions executed that are not among `items`
/// (runs given by their ends) once they are all taken; `items` may come
/// folded into blocks already (their instructions are counted from
/// them).
fn output(
    args: &FlowArgs,
    trace: &MappedTrace,
    items: impl Iterator<Item = Item>,
    beyond: &Cell<u64>,
) -> Result<ExitCode> {
    let len = trace.bytes().len() as u64;
    // Instructions are counted as decoded (or as folded before): --blocks
    // and --branches fold them into other items.
    let insns = Cell::new(0u64);
    let mut placed = 0u64;
    let mut items = items.inspect(|item| {
        let offset = match item {
            Item::Insn { offset, .. } => {
                insns.set(insns.get() + 1);
                *offset
            }
            Item::Block(b) => {
                insns.set(insns.get() + u64::from(b.insns));
                b.offset
            }
            _ => return,
        };
        placed += 1;
        if placed & 0xffff == 0 {
            trace.decoded_to(offset);
        }
    });
    let out = std::io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, out);
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let mut printer = Printer::new(format, !args.no_disasm).with_time(args.time);
    let mut stats = Stats::default();
    // Unlocked, as in `quiet`: decoder threads may print a panic.
    let mut err = BufWriter::new(std::io::stderr());
    let mut failures = FailureLines::new(&args.trace);
    let mut emit = |item: Item| -> Result<()> {
        stats.count(&item, len);
        if !args.quiet {
            printer.item(&item, &mut out)?;
        } else {
            failures.write(&item, &mut err);
        }
        Ok(())
    };
    if args.blocks {
        Blocks::new(items.map(Piece::Item)).try_for_each(&mut emit)?;
    } else if args.branches {
        Branches::new(items).try_for_each(&mut emit)?;
    } else {
        items.try_for_each(&mut emit)?;
    }
    err.flush().context("writing to stderr")?;
    stats.insns = insns.get() + beyond.get();
    if args.stats {
        printer.stats(&stats, &mut out)?;
    }
    out.flush()?;
    Ok(exit_code(args, &stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        flow: FlowArgs,
    }

    #[test]
    fn cpu_errata_reach_the_clock() {
        // Skylake (6/94) has SKL168: calibration distrusts the first MTC
        // period after a PSB, as ptxed's --cpu makes it.
        let skl = decoder_config(Some(parse_cpu("6/94").unwrap()), false);
        assert!(skl.errata.skl168 && skl.time.skl168);
        let none = decoder_config(None, true);
        assert!(!none.time.skl168 && none.lenient_status);
    }

    fn parse(args: &[&str]) -> FlowArgs {
        Cli::try_parse_from(std::iter::once("flow").chain(args.iter().copied()))
            .unwrap()
            .flow
    }

    #[test]
    fn clap_accepts_the_definitions() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn the_dump_takes_the_cr3_in_effect_or_the_one_after_it() {
        let a = parse(&["t.pt", "--dump", "d.raw", "--cr3", "0x1000"]);
        assert_eq!(a.dump.cr3, Some(Cr3(0x1000)));
        let b = parse(&[
            "t.pt",
            "--cr3",
            "2000",
            "--dump",
            "d.raw@1000",
            "--cr3",
            "3000",
        ]);
        assert_eq!(b.dump.cr3, Some(Cr3(0x2000)));
        assert_eq!(
            parse_dump_arg(b.dump.dump.as_deref().unwrap()),
            (PathBuf::from("d.raw"), Some(PhysAddr(0x1000)))
        );
        let c = parse(&["t.pt", "--dump", "d", "--cr3", "default", "--la57"]);
        assert_eq!((c.dump.cr3, c.dump.la57), (None, true));
        let d = parse(&["t.pt", "--cr3", "5000", "--elf", "/bin/true"]);
        assert_eq!(d.dump, DumpArgs::default());
    }
}
