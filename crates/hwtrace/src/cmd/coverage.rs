//! `hwtrace coverage`: the basic blocks and edges a trace executed, with
//! hit counts, written as drcov (Lighthouse, Cartographer, bncov), lcov
//! (`genhtml`), an AFL-style edge bitmap and JSON; a per-image summary on
//! stdout. Inputs are those of every answer command
//! ([`crate::answers::SourceArgs`]); block and edge rules are
//! `hwtrace_report::coverage`'s.

use crate::answers::{Source, SourceArgs};
use crate::progress::Progress;
use anyhow::{Context, Result, bail};
use hwtrace_report::coverage::libxdc::LibxdcMap;
use hwtrace_report::coverage::{Coverage, CoverageBuilder, CoveragePart, afl, drcov, json, lcov};
use hwtrace_report::exec::{Detail, Exec};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Coverage of a trace.
#[derive(Debug, clap::Args)]
pub struct CoverageArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Write a drcov file (module table + basic blocks) for Lighthouse,
    /// Cartographer or bncov.
    #[arg(long, value_name = "FILE")]
    drcov: Option<PathBuf>,
    /// Write an lcov tracefile (source line hit counts via DWARF) for genhtml.
    #[arg(long, value_name = "FILE")]
    lcov: Option<PathBuf>,
    /// The lcov test name (TN:).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "hwtrace",
        requires = "lcov"
    )]
    test_name: String,
    /// Write an AFL-style edge bitmap: libxdc's edge hash, 8-bit counters,
    /// 64 KiB unless `--afl-map-size`. The summary prints libxdc's hash of
    /// it; with `--lenient` (tracing's on/off status read as libxdc reads
    /// it) map and hash are the ones kAFL/Nyx's libxdc computes for the
    /// same trace.
    #[arg(long, value_name = "FILE")]
    afl_map: Option<PathBuf>,
    /// Which edges the AFL map counts: `conditional` (libxdc's: the outcome
    /// of each conditional branch, which with the code decides every other
    /// transfer) or `all` (every block-to-block transfer, as a
    /// compiler-instrumented target's map).
    #[arg(long, value_enum, value_name = "EDGES", default_value_t = AflEdgesArg::Conditional)]
    afl_edges: AflEdgesArg,
    /// The AFL map's size in bytes: a power of two from 256 to 16M (libxdc's
    /// `bitmap_size`, AFL++'s `MAP_SIZE`; suffixes K and M).
    #[arg(long, value_name = "BYTES", default_value = "64K", value_parser = parse_map_size)]
    afl_map_size: usize,
    /// Write libxdc's edge list (its trace mode: one `src->dst` line in hex
    /// per edge in trace order, a conditional branch's fall-through too,
    /// `ffffffffffffffff` where tracing is switched on and off), from a
    /// second decode of a raw Intel PT trace (`hwtrace_report`'s
    /// `LibxdcMap::decode_with_edges`); `--lenient` reads the trace as
    /// libxdc does.
    #[arg(long, value_name = "FILE")]
    libxdc_edges: Option<PathBuf>,
    /// Write every block and edge with hit counts as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// No progress bar, no summary on stdout, no problems on stderr.
    #[arg(long)]
    quiet: bool,
}

/// `--afl-edges`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum AflEdgesArg {
    /// Conditional branches' outcomes (libxdc's map).
    Conditional,
    /// Every transfer between blocks.
    All,
}

impl From<AflEdgesArg> for afl::AflEdges {
    fn from(a: AflEdgesArg) -> Self {
        match a {
            AflEdgesArg::Conditional => Self::Conditional,
            AflEdgesArg::All => Self::All,
        }
    }
}

/// `--afl-map-size`: bytes, decimal or 0x-hex, or with K or M.
pub(crate) fn parse_map_size(text: &str) -> Result<usize, String> {
    let (digits, unit) = match text.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1 << 10),
        None => match text.strip_suffix(['M', 'm']) {
            Some(d) => (d, 1 << 20),
            None => (text, 1),
        },
    };
    let n = match digits.strip_prefix("0x") {
        Some(hex) => usize::from_str_radix(hex, 16),
        None => digits.parse(),
    }
    .map_err(|e| format!("{text:?}: {e}"))?;
    let size = n
        .checked_mul(unit)
        .ok_or_else(|| format!("{text:?}: too large"))?;
    if !size.is_power_of_two() || !(256..=afl::MAX_MAP_SIZE).contains(&size) {
        return Err(format!(
            "{text:?}: the map size must be a power of two from 256 to 16M bytes"
        ));
    }
    Ok(size)
}

fn create(path: &Path, what: &str) -> Result<BufWriter<File>> {
    let f = File::create(path)
        .with_context(|| format!("--{what}: cannot create {}", path.display()))?;
    Ok(BufWriter::new(f))
}

fn write_file(
    path: &Path,
    what: &str,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let mut w = create(path, what)?;
    body(&mut w)
        .and_then(|()| w.flush())
        .with_context(|| format!("--{what}: writing {}", path.display()))
}

/// Runs `hwtrace coverage`: exit code 2 when the trace had problems.
pub fn run(args: CoverageArgs) -> Result<ExitCode> {
    let source = Source::open(&args.source)?;
    if args.libxdc_edges.is_some() && source.raw_pt().is_none() {
        bail!(
            "--libxdc-edges: libxdc decodes raw Intel PT: give the trace file itself, not perf.data or a branch list"
        );
    }
    let symbols = source.symbolizer();
    let mut builder = CoverageBuilder::new();
    let name = super::calls::input_name(&args.source);
    let mut progress = Progress::bytes(source.trace_bytes(), &name, args.quiet);
    let jobs = match args.source.jobs {
        Some(n) => usize::try_from(n).unwrap_or(1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // A raw trace on every core: each stretch's coverage built by the
    // thread that decoded it, the parts merged in trace order.
    let folded = if jobs > 1 {
        source.run_folded(
            jobs,
            args.source.unit_bytes,
            CoveragePart::new,
            |part, at| {
                progress.at(at);
                builder.merge(part);
                Ok(())
            },
        )?
    } else {
        None
    };
    let report = match folded {
        Some(report) => report,
        None => {
            let mut sink = |e: Exec| {
                // Gaps carry trace offsets: the bar moves at each.
                progress.at(match e {
                    Exec::Gap { offset, .. } => Some(offset.0),
                    _ => None,
                });
                builder.push(&e);
                Ok(())
            };
            // The builder's work per run is a fraction of the decode's: a
            // second thread would spend more handing each run over (64 bytes
            // from one core's cache to the other's) than it takes off the
            // decode (32 MiB of the real traces: 1.20 s on one thread, 1.30 s
            // on two). So one thread unless `--jobs` asks for two.
            if args.source.jobs.is_some() {
                source.run(Detail::Runs, &mut sink)?
            } else {
                source.run_here(Detail::Runs, &mut sink)?
            }
        }
    };
    progress.finish();
    let cov = builder.finish();
    let table = drcov::table(&cov, &symbols);
    if let Some(path) = &args.drcov {
        write_file(path, "drcov", |w| drcov::write(&table, w))?;
    }
    if let Some(path) = &args.lcov {
        let counts = lcov::line_counts(&cov, &symbols);
        if counts.is_empty() && !args.quiet {
            eprintln!(
                "hwtrace coverage: warning: --lcov: no traced image has DWARF line information; {} has no records",
                path.display()
            );
        }
        write_file(path, "lcov", |w| lcov::write(&counts, &args.test_name, w))?;
    }
    let map = afl::bitmap(&cov, args.afl_edges.into(), args.afl_map_size);
    if let Some(path) = &args.afl_map {
        write_file(path, "afl-map", |w| afl::write(&map, w))?;
    }
    if let Some(path) = &args.json {
        write_file(path, "json", |w| json::write(&cov, &table, &symbols, w))?;
    }
    if let (Some(path), Some((trace, memory, config))) = (&args.libxdc_edges, source.raw_pt()) {
        let mut map = LibxdcMap::new(args.afl_map_size)?;
        write_file(path, "libxdc-edges", |w| {
            super::libxdc::write_edges(&mut map, trace, config, memory, w).map(drop)
        })?;
    }
    if !args.quiet {
        for p in &report.problems {
            eprintln!("hwtrace coverage: {p}");
        }
        if report.more_problems > 0 {
            eprintln!(
                "hwtrace coverage: ... and {} more problems",
                report.more_problems
            );
        }
        if let Some(hint) = report.lenient_hint() {
            eprintln!("hwtrace coverage: {hint}");
        }
        if table.dropped > 0 {
            eprintln!(
                "hwtrace coverage: warning: --drcov: {} blocks lie more than 4 GiB above their image's base (or past 65535 images) and were left out",
                table.dropped
            );
        }
        let stdout = std::io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        summary(&cov, &table, &report, &mut out)?;
        let set = map.iter().filter(|&&c| c != 0).count();
        let which = match args.afl_edges {
            AflEdgesArg::Conditional => "conditional branches",
            AflEdgesArg::All => "all edges",
        };
        writeln!(
            out,
            "  AFL map ({which}): {set} of {} counters set, libxdc hash {:#018x}",
            map.len(),
            afl::libxdc_hash(&map)
        )?;
        out.flush()?;
    }
    Ok(if report.has_problems() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Totals, then blocks and instructions per image.
fn summary(
    cov: &Coverage,
    table: &drcov::DrcovTable,
    report: &crate::answers::SourceReport,
    out: &mut dyn Write,
) -> Result<()> {
    let hits: u64 = cov.edges.iter().map(|e| e.hits).sum();
    writeln!(
        out,
        "{} blocks, {} edges ({hits} transfers), {} instructions, {} branch records from {} bytes of trace; {} gaps, {} errors",
        cov.blocks.len(),
        cov.edges.len(),
        cov.insns,
        report.branches,
        report.trace_bytes,
        report.gaps,
        report.errors
    )?;
    let mut per: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for (b, m) in cov.blocks.iter().zip(&table.module_of) {
        if let Some(m) = m {
            let e = per.entry(*m).or_default();
            e.0 += 1;
            e.1 += b.hits * u64::from(b.insns);
        }
    }
    for (m, (blocks, insns)) in per {
        let module = &table.modules[usize::from(m)];
        writeln!(
            out,
            "  {:#x}-{:#x} {}: {blocks} blocks, {insns} instructions",
            module.base.0, module.end.0, module.path
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_map_size;

    #[test]
    fn map_sizes_are_powers_of_two_libxdc_can_fill() {
        assert_eq!(parse_map_size("64K"), Ok(1 << 16));
        assert_eq!(parse_map_size("0x10000"), Ok(1 << 16));
        assert_eq!(parse_map_size("1M"), Ok(1 << 20));
        assert_eq!(parse_map_size("256"), Ok(256));
        assert_eq!(parse_map_size("16M"), Ok(1 << 24));
        for bad in ["100", "0", "128", "32M", "1G", "lots", "0xq"] {
            assert!(parse_map_size(bad).is_err(), "{bad}");
        }
    }
}
