//! `hwtrace calls`: the call/return structure of a trace as an indented
//! call trace, JSON lines, folded stacks or an SVG flame graph.
//!
//! Also the decode loop `hwtrace timeline` and `hwtrace report` share:
//! [`decode`] runs any input ([`SourceArgs`]) through a
//! [`CallTracker`] into a set of sinks, with a progress bar, and
//! [`Names`] names functions with the one symboliser.

use crate::answers::{Source, SourceArgs, SourceReport};
use crate::progress::Progress;
use anyhow::{Context as _, Result};
use hwtrace_report::calls::{
    CallSink, CallTracker, CodeAddr, FoldedStacks, FunctionName, JsonLines, Sinks, Symbolize,
    TreeWriter, TscRate,
};
use hwtrace_report::exec::{Detail, Exec};
use hwtrace_report::flame;
use hwtrace_report::symbols::{Space, Symbolizer};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Rebuild calls and returns: call trace, folded stacks, flame graph.
#[derive(Debug, clap::Args)]
pub struct CallsArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Print the indented call trace on stdout (the default when no other
    /// output is asked for).
    #[arg(long)]
    tree: bool,
    /// Print one JSON object per frame entry and exit on stdout.
    #[arg(long, conflicts_with = "tree")]
    json: bool,
    /// Write folded stacks (`main;f;g 42`, instructions per stack) to FILE.
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// Write an SVG flame graph (instructions per stack) to FILE.
    #[arg(long, value_name = "FILE")]
    flame: Option<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
}

/// Options of every command that rebuilds calls.
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    /// The TSC frequency in Hz (durations in seconds instead of ticks).
    #[arg(long, value_name = "HZ")]
    pub tsc_hz: Option<f64>,
    /// No progress bar.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Names functions with the symboliser over the input's mappings: the
/// function symbol, else `image+0xoff`, else the address.
pub struct Names(pub Symbolizer);

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Names").finish_non_exhaustive()
    }
}

impl Symbolize for Names {
    fn function(&mut self, at: CodeAddr) -> FunctionName {
        let space = Space {
            pid: at.pid,
            cr3: at.cr3,
        };
        let module = self.0.module(space, at.ip);
        let image = module.map(|m| m.name.clone());
        let name = match (self.0.function(space, at.ip), module) {
            (Some(f), _) => f.name.to_owned(),
            (None, Some(m)) => format!("{}+{:#x}", m.name, at.ip.0.wrapping_sub(m.base.0)),
            (None, None) => format!("{:#x}", at.ip),
        };
        FunctionName { name, image }
    }
}

/// What [`decode`] leaves: the tracker (its function names) and the
/// input's own report.
#[derive(Debug)]
pub struct Decoded {
    /// The tracker after `finish`.
    pub tracker: CallTracker,
    /// Counts and problems of the input.
    pub report: SourceReport,
}

/// Opens the input.
pub fn open(args: &SourceArgs) -> Result<Source> {
    Source::open(args)
}

/// A short name for the input (progress bar, titles).
pub fn input_name(args: &SourceArgs) -> String {
    let path = args
        .trace
        .as_deref()
        .or(args.bts.as_deref())
        .or(args.bts_buffer.as_deref())
        .or(args.lbr.as_deref());
    path.and_then(Path::file_name)
        .map_or_else(|| "trace".to_owned(), |n| n.to_string_lossy().into_owned())
}

/// Decodes `source` into `sink`, drawing progress unless `quiet`.
pub fn decode(
    source: &Source,
    name: &str,
    quiet: bool,
    sink: &mut dyn CallSink,
) -> Result<Decoded> {
    let symbols = source.symbolizer();
    let mut tracker = CallTracker::new(Box::new(Names(symbols)));
    let mut progress = Progress::bytes(source.trace_bytes(), name, quiet);
    let report = source.run(Detail::Calls, &mut |exec| {
        progress.at(match exec {
            Exec::Gap { offset, .. } => Some(offset.0),
            _ => None,
        });
        tracker.feed(&exec, sink).context("writing the output")
    })?;
    tracker.finish(sink).context("writing the output")?;
    progress.finish();
    Ok(Decoded { tracker, report })
}

/// Creates `path` for writing (buffered), naming it on failure.
pub fn create(path: &Path, what: &str) -> Result<BufWriter<File>> {
    let file =
        File::create(path).with_context(|| format!("{what}: cannot create {}", path.display()))?;
    Ok(BufWriter::with_capacity(1 << 16, file))
}

/// Writes folded stacks and/or a flame graph from `folded`.
pub fn write_stacks(
    folded: &mut FoldedStacks,
    tracker: &CallTracker,
    folded_path: Option<&Path>,
    flame_path: Option<&Path>,
    title: &str,
) -> Result<()> {
    let lines = folded.lines(tracker.functions());
    if let Some(path) = folded_path {
        let mut out = create(path, "--folded")?;
        for line in &lines {
            writeln!(out, "{line}")?;
        }
        out.flush()
            .with_context(|| format!("--folded: writing {}", path.display()))?;
    }
    if let Some(path) = flame_path {
        let mut out = create(path, "--flame")?;
        flame::write_svg(&lines, title, &mut out)
            .with_context(|| format!("--flame: {}", path.display()))?;
        out.flush()
            .with_context(|| format!("--flame: writing {}", path.display()))?;
    }
    Ok(())
}

/// Prints the input's problems on stderr; exit code 2 if there were any.
pub fn problems(report: &SourceReport) -> ExitCode {
    for p in &report.problems {
        eprintln!("hwtrace: {p}");
    }
    if report.more_problems > 0 {
        eprintln!("hwtrace: ... and {} more problems", report.more_problems);
    }
    if let Some(hint) = report.lenient_hint() {
        eprintln!("hwtrace: {hint}");
    }
    if report.has_problems() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs `hwtrace calls`.
pub fn run(args: CallsArgs) -> Result<ExitCode> {
    let source = open(&args.source)?;
    let name = input_name(&args.source);
    let rate = TscRate(args.common.tsc_hz.or_else(|| source.tsc_hz()));
    let out = BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let tree = args.tree || !(args.json || args.folded.is_some() || args.flame.is_some());
    let (mut tree_sink, mut json_sink) = if args.json {
        (None, Some(JsonLines::new(out)))
    } else if tree {
        (Some(TreeWriter::new(out, rate)), None)
    } else {
        (None, None)
    };
    let mut folded = (args.folded.is_some() || args.flame.is_some()).then(FoldedStacks::new);

    let mut sinks = Sinks::default();
    if let Some(s) = tree_sink.as_mut() {
        sinks.0.push(s);
    }
    if let Some(s) = json_sink.as_mut() {
        sinks.0.push(s);
    }
    if let Some(s) = folded.as_mut() {
        sinks.0.push(s);
    }
    let decoded = decode(&source, &name, args.common.quiet, &mut sinks)?;
    drop(sinks);
    if let Some(s) = tree_sink {
        s.into_inner().context("writing the call trace")?;
    }
    if let Some(s) = json_sink {
        s.into_inner().context("writing the JSON lines")?;
    }
    if let Some(folded) = folded.as_mut() {
        write_stacks(
            folded,
            &decoded.tracker,
            args.folded.as_deref(),
            args.flame.as_deref(),
            &format!("hwtrace calls: {name}"),
        )?;
    }
    Ok(problems(&decoded.report))
}
