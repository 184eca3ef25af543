//! `hwtrace timeline`: function entries and exits on a time axis, as
//! Chrome trace event JSON that Perfetto (ui.perfetto.dev) and
//! `chrome://tracing` open, one track per thread. Written while the trace
//! is decoded: memory holds the open frames, not the events.

use super::calls::{CommonArgs, create, decode, input_name, open, problems};
use crate::answers::SourceArgs;
use anyhow::{Context as _, Result};
use hwtrace_report::timeline::{Clock, TimelineOptions, TimelineWriter};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Write a Perfetto / Chrome trace JSON timeline of function calls.
#[derive(Debug, clap::Args)]
pub struct TimelineArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// The JSON file to write (`-`: stdout).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// The time axis: `auto` (TSC when the trace has timestamps,
    /// instruction counts otherwise), `tsc` or `insns`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "tsc", "insns"])]
    clock: String,
    #[command(flatten)]
    common: CommonArgs,
}

/// The clock `--clock` names.
pub fn clock(name: &str) -> Clock {
    match name {
        "tsc" => Clock::Tsc,
        "insns" => Clock::Instructions,
        _ => Clock::Auto,
    }
}

/// Runs `hwtrace timeline`.
pub fn run(args: TimelineArgs) -> Result<ExitCode> {
    let source = open(&args.source)?;
    let name = input_name(&args.source);
    let options = TimelineOptions {
        clock: clock(&args.clock),
        tsc_hz: args.common.tsc_hz.or_else(|| source.tsc_hz()),
        title: name.clone(),
    };
    let out: Box<dyn Write> = if args.output.as_os_str() == "-" {
        Box::new(BufWriter::with_capacity(1 << 16, std::io::stdout().lock()))
    } else {
        Box::new(create(&args.output, "-o")?)
    };
    let mut writer = TimelineWriter::new(out, options).context("writing the timeline")?;
    let decoded = decode(&source, &name, args.common.quiet, &mut writer)?;
    let (_, events) = writer
        .finish()
        .with_context(|| format!("writing {}", args.output.display()))?;
    if args.output.as_os_str() != "-" {
        eprintln!(
            "hwtrace: {} events for {} functions written to {}",
            events,
            decoded.tracker.functions().len(),
            args.output.display()
        );
    }
    Ok(problems(&decoded.report))
}
