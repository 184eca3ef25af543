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
use std::collections::{BTreeMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;

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
    /// Decode on N threads, a trace at a time each (default: every core).
    /// The output is the same.
    #[arg(short, long, value_name = "N")]
    jobs: Option<usize>,
}

/// Runs `hwtrace libxdc`: exit code 2 when a trace had decode errors or
/// could not be read (it is named on stderr and the others go on).
///
/// Traces are decoded on `--jobs` threads, each with its own map and the
/// code it learned, and reported in the order given: a trace's new
/// counters are those no trace before it in that order set.
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
    LibxdcMap::new(args.map_size)?;
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, args.traces.len().max(1));
    let mut report = Report {
        seen: vec![false; args.map_size],
        hashes: HashSet::new(),
        errors: 0,
        unreadable: 0,
        out: BufWriter::new(std::io::stdout().lock()),
        json: args.json,
    };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, Result<Outcome>)>();
    let reported = std::thread::scope(|s| -> Result<()> {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (next, stop, image, args) = (&next, &stop, &image, &args);
            s.spawn(move || {
                let Ok(mut map) = LibxdcMap::new(args.map_size) else {
                    return;
                };
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(path) = args.traces.get(i) else {
                        return;
                    };
                    let outcome = decode_one(&mut map, path, image, config, args.edges.as_deref());
                    if tx.send((i, outcome)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        // Reported in the order given, whichever thread finished first.
        let mut waiting = BTreeMap::new();
        let mut due = 0;
        for (i, outcome) in rx {
            waiting.insert(i, outcome);
            while let Some(outcome) = waiting.remove(&due) {
                let done = outcome.and_then(|o| report.trace(&args.traces[due], o));
                if done.is_err() {
                    stop.store(true, Ordering::Relaxed);
                    return done;
                }
                due += 1;
            }
        }
        Ok(())
    });
    reported?;
    report.finish(&args)
}

/// What decoding one trace gave.
enum Outcome {
    /// Its map's hash, the counters it set, what the decode counted.
    Decoded {
        hash: u64,
        set: Vec<u32>,
        summary: TraceSummary,
    },
    /// It could not be read (named in the error).
    Unreadable(anyhow::Error),
}

/// Decodes the trace at `path` into `map` (cleared first), writing its edge
/// list into `edges` when given.
fn decode_one<M: ReadMemory>(
    map: &mut LibxdcMap,
    path: &Path,
    memory: M,
    config: Config,
    edges: Option<&Path>,
) -> Result<Outcome> {
    let trace = match MappedFile::open(path) {
        Ok(trace) => trace,
        Err(e) => return Ok(Outcome::Unreadable(e)),
    };
    map.reset_map();
    let summary = match edges {
        Some(dir) => {
            let edges = edges_file(dir, path);
            let file = std::fs::File::create(&edges)
                .with_context(|| format!("--edges: cannot create {}", edges.display()))?;
            let mut w = BufWriter::new(file);
            write_edges(map, trace.bytes(), config, memory, &mut w)
                .and_then(|summary| w.flush().map(|()| summary))
                .with_context(|| format!("--edges: writing {}", edges.display()))?
        }
        None => map.decode(trace.bytes(), config, memory),
    };
    let set = (0u32..)
        .zip(map.map())
        .filter(|&(_, &c)| c != 0)
        .map(|(i, _)| i)
        .collect();
    Ok(Outcome::Decoded {
        hash: map.hash(),
        set,
        summary,
    })
}

/// The traces reported so far: every counter any of them set, the hashes
/// seen, and the output.
struct Report<W: Write> {
    seen: Vec<bool>,
    hashes: HashSet<u64>,
    errors: u64,
    unreadable: usize,
    out: W,
    json: bool,
}

impl<W: Write> Report<W> {
    /// Reports the next trace, at `path`.
    fn trace(&mut self, path: &Path, outcome: Outcome) -> Result<()> {
        let (hash, set, summary) = match outcome {
            // One unreadable trace among thousands is reported, not the end.
            Outcome::Unreadable(e) => {
                eprintln!("hwtrace libxdc: {e:#}");
                self.unreadable += 1;
                return Ok(());
            }
            Outcome::Decoded { hash, set, summary } => (hash, set, summary),
        };
        let mut new = 0;
        for &i in &set {
            if let Some(seen) = self.seen.get_mut(i as usize) {
                new += usize::from(!*seen);
                *seen = true;
            }
        }
        let first = self.hashes.insert(hash);
        self.errors += summary.errors;
        let line = Line {
            path,
            hash,
            set: set.len(),
            new,
            first,
            summary,
        };
        if self.json {
            writeln!(self.out, "{}", line.json())?;
        } else {
            writeln!(self.out, "{}", line.text())?;
        }
        Ok(())
    }

    /// The totals; the exit code.
    fn finish(mut self, args: &LibxdcArgs) -> Result<ExitCode> {
        if !self.json {
            let total = self.seen.iter().filter(|&&s| s).count();
            writeln!(
                self.out,
                "{} traces, {} distinct maps; {total} of {} counters set by any{}",
                args.traces.len() - self.unreadable,
                self.hashes.len(),
                args.map_size,
                if self.unreadable > 0 {
                    format!("; {} traces unreadable", self.unreadable)
                } else {
                    String::new()
                }
            )?;
        }
        self.out.flush()?;
        if self.errors > 0 && !args.lenient {
            eprintln!(
                "hwtrace libxdc: {} decode errors; libxdc reads tracing's status as --lenient does (a PSB+ saying tracing is on after a VM exit), which may decode through them",
                self.errors
            );
        }
        Ok(if self.errors > 0 || self.unreadable > 0 {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        })
    }
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
