//! `hwtrace libxdc`: libxdc's bitmap for each of many raw traces, as
//! kAFL/Nyx compute it once per execution, with the code decoded once for
//! them all (`hwtrace_report::coverage::libxdc::LibxdcMap`): each trace's
//! hash, the counters it sets and how many of them no earlier trace set
//! (what a fuzzer keeps an input for), and on request its edge list in
//! libxdc's trace-mode format.

use super::coverage::parse_map_size;
use super::flow::{decoder_config, parse_cpu};
use crate::image_args::ImageArgs;
use crate::input::MappedFile;
use crate::ptdump::cpu::Cpu;
use anyhow::{Context, Result, bail};
use hwtrace_flow::Config;
use hwtrace_report::coverage::libxdc::{LibxdcMap, TraceSummary};
use hwtrace_types::ReadMemory;
use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// libxdc's bitmap of each trace.
#[derive(Debug, clap::Args)]
pub struct LibxdcArgs {
    /// Raw Intel PT traces (LZ4-compressed ones too, as kAFL saves them),
    /// decoded one after the other over the same code.
    #[arg(value_name = "TRACE", required = true)]
    traces: Vec<PathBuf>,
    #[command(flatten)]
    images: ImageArgs,
    /// The processor the traces were recorded on (family/model[/stepping]),
    /// for its errata.
    #[arg(long, value_name = "F/M[/S]", value_parser = parse_cpu)]
    cpu: Option<Cpu>,
    /// Read tracing's on/off status as libxdc does (a PSB+ saying tracing
    /// is on after a VM exit decodes on instead of an error).
    #[arg(long)]
    lenient: bool,
    /// The map's size in bytes: a power of two from 256 to 16M (libxdc's
    /// `bitmap_size`; suffixes K and M).
    #[arg(long, value_name = "BYTES", default_value = "64K", value_parser = parse_map_size)]
    map_size: usize,
    /// Write each trace's edge list (libxdc's trace mode: `src->dst` per
    /// edge, `ffffffffffffffff` where tracing switches on and off) into
    /// DIR, as TRACE's file name with `.edges` appended.
    #[arg(long, value_name = "DIR")]
    edges: Option<PathBuf>,
    /// One JSON object per trace instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `hwtrace libxdc`: exit code 2 when a trace had decode errors or
/// could not be read (it is named on stderr and the others go on).
pub fn run(args: LibxdcArgs) -> Result<ExitCode> {
    if args.images.is_empty() {
        bail!(
            "the traces need the code they ran: give --pages (a kAFL/Nyx work folder), --image, --elf or --pe"
        );
    }
    let image = args.images.load()?;
    let config = decoder_config(args.cpu, args.lenient);
    if let Some(dir) = &args.edges {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--edges: cannot create {}", dir.display()))?;
    }
    let mut map = LibxdcMap::new(args.map_size)?;
    // Every counter any trace set so far, and the hashes seen.
    let mut seen = vec![false; args.map_size];
    let mut hashes = HashSet::new();
    let mut errors = 0;
    let mut unreadable = 0;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for path in &args.traces {
        // One unreadable trace among thousands is reported, not the end.
        let trace = match MappedFile::open(path) {
            Ok(trace) => trace,
            Err(e) => {
                eprintln!("hwtrace libxdc: {e:#}");
                unreadable += 1;
                continue;
            }
        };
        map.reset_map();
        let summary = match &args.edges {
            Some(dir) => {
                let edges = edges_file(dir, path);
                let file = std::fs::File::create(&edges)
                    .with_context(|| format!("--edges: cannot create {}", edges.display()))?;
                let mut w = BufWriter::new(file);
                write_edges(&mut map, trace.bytes(), config, &image, &mut w)
                    .and_then(|summary| w.flush().map(|()| summary))
                    .with_context(|| format!("--edges: writing {}", edges.display()))?
            }
            None => map.decode(trace.bytes(), config, &image),
        };
        let mut set = 0;
        let mut new = 0;
        for (counter, seen) in map.map().iter().zip(seen.iter_mut()) {
            if *counter != 0 {
                set += 1;
                new += usize::from(!*seen);
                *seen = true;
            }
        }
        let hash = map.hash();
        let first = hashes.insert(hash);
        errors += summary.errors;
        let line = Line {
            path,
            hash,
            set,
            new,
            first,
            summary,
        };
        if args.json {
            writeln!(out, "{}", line.json())?;
        } else {
            writeln!(out, "{}", line.text())?;
        }
    }
    if !args.json {
        let total = seen.iter().filter(|&&s| s).count();
        writeln!(
            out,
            "{} traces, {} distinct maps; {total} of {} counters set by any{}",
            args.traces.len() - unreadable,
            hashes.len(),
            args.map_size,
            if unreadable > 0 {
                format!("; {unreadable} traces unreadable")
            } else {
                String::new()
            }
        )?;
    }
    out.flush()?;
    if errors > 0 && !args.lenient {
        eprintln!(
            "hwtrace libxdc: {errors} decode errors; libxdc reads tracing's status as --lenient does (a PSB+ saying tracing is on after a VM exit), which may decode through them"
        );
    }
    Ok(if errors > 0 || unreadable > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// Decodes `trace` into `map` and writes its edges to `w` as libxdc's
/// trace mode lists them (`src->dst` in hex, one a line); stops writing at
/// the first write error, which it returns.
pub(crate) fn write_edges<M: ReadMemory>(
    map: &mut LibxdcMap,
    trace: &[u8],
    config: Config,
    memory: M,
    w: &mut dyn Write,
) -> std::io::Result<TraceSummary> {
    let mut result = Ok(());
    let summary = map.decode_with_edges(trace, config, memory, |from, to| {
        if result.is_ok() {
            result = writeln!(w, "{from:x}->{to:x}");
        }
    });
    result.map(|()| summary)
}

/// `DIR/NAME.edges` for the trace at `path`.
fn edges_file(dir: &Path, path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or(path.as_os_str()).to_owned();
    name.push(".edges");
    dir.join(name)
}

/// What one trace gave.
struct Line<'a> {
    path: &'a Path,
    hash: u64,
    set: usize,
    new: usize,
    first: bool,
    summary: TraceSummary,
}

impl Line<'_> {
    fn text(&self) -> String {
        format!(
            "{}  hash {:#018x}{}  {} counters set, {} new  {} instructions, {} conditional outcomes, {} errors, {} overflows",
            self.path.display(),
            self.hash,
            if self.first { "" } else { " (seen)" },
            self.set,
            self.new,
            self.summary.insns,
            self.summary.edges,
            self.summary.errors,
            self.summary.overflows
        )
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "trace": self.path.display().to_string(),
            "hash": format!("{:#018x}", self.hash),
            "first_with_hash": self.first,
            "counters_set": self.set,
            "counters_new": self.new,
            "insns": self.summary.insns,
            "conditional_outcomes": self.summary.edges,
            "errors": self.summary.errors,
            "overflows": self.summary.overflows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_files_are_named_after_their_trace() {
        assert_eq!(
            edges_file(Path::new("out"), Path::new("traces/fuzz_00001.bin.lz4")),
            Path::new("out/fuzz_00001.bin.lz4.edges")
        );
    }
}
