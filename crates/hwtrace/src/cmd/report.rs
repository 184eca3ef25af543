//! `hwtrace report`: a summary a person can read — what ran (top
//! functions by instructions and time, images, threads), how healthy the
//! trace is (errors, overflows, lost data, resynchronisations, with their
//! offsets), and where the other outputs asked for were written (they all
//! come from the same single decode).

use super::calls::{CommonArgs, create, decode, input_name, open, problems, write_stacks};
use super::timeline::clock;
use crate::answers::SourceArgs;
use anyhow::{Context as _, Result};
use hwtrace_report::calls::{
    CallSink, Context, FoldedStacks, Functions, Profile, Sinks, ThreadKey, TreeWriter, TscRate,
};
use hwtrace_report::exec::GapKind;
use hwtrace_report::timeline::{TimelineOptions, TimelineWriter};
use hwtrace_types::{TraceOffset, Tsc};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Summarise a trace: top functions, images, threads, trace health.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// How many functions to list.
    #[arg(long, default_value_t = 20)]
    top: usize,
    /// Also write an SVG flame graph to FILE.
    #[arg(long, value_name = "FILE")]
    flame: Option<PathBuf>,
    /// Also write folded stacks to FILE.
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// Also write a Perfetto / Chrome trace JSON timeline to FILE.
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// Also write the indented call trace to FILE.
    #[arg(long, value_name = "FILE")]
    tree: Option<PathBuf>,
    /// The timeline's time axis: auto, tsc or insns.
    #[arg(long, default_value = "auto", value_parser = ["auto", "tsc", "insns"])]
    clock: String,
    #[command(flatten)]
    common: CommonArgs,
}

/// Offsets kept per kind of gap.
const OFFSETS_KEPT: usize = 8;

/// Gaps by kind, with the first offsets of each, and the time span.
#[derive(Debug, Default)]
struct Health {
    gaps: BTreeMap<&'static str, (u64, Vec<TraceOffset>)>,
    first_tsc: Option<Tsc>,
    last_tsc: Option<Tsc>,
}

impl Health {
    fn time(&mut self, cx: &Context<'_>) {
        if let Some(t) = cx.now.tsc {
            self.first_tsc.get_or_insert(t);
            self.last_tsc = Some(t);
        }
    }
}

impl CallSink for Health {
    fn gap(&mut self, cx: &Context<'_>, offset: TraceOffset, why: GapKind) -> std::io::Result<()> {
        self.time(cx);
        let name = match why {
            GapKind::Disabled => "tracing disabled (filters, system calls, stream ends)",
            GapKind::Interrupted => "tracing interrupted (interrupts, exceptions, VM exits)",
            GapKind::Overflow => "overflows (the processor lost trace)",
            GapKind::DecodeError => "decode errors (resynchronised at the next PSB)",
            GapKind::Lost => "data lost before it was recorded",
            GapKind::Stuck => "endless loops without trace (resynchronised)",
        };
        let entry = self.gaps.entry(name).or_default();
        entry.0 += 1;
        if entry.1.len() < OFFSETS_KEPT {
            entry.1.push(offset);
        }
        Ok(())
    }

    fn exit(
        &mut self,
        cx: &Context<'_>,
        _stack: &[hwtrace_report::calls::Frame],
        _how: hwtrace_report::calls::ExitHow,
    ) -> std::io::Result<()> {
        self.time(cx);
        Ok(())
    }
}

/// Percent of `part` in `whole`.
fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Runs `hwtrace report`.
pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let source = open(&args.source)?;
    let name = input_name(&args.source);
    let rate = TscRate(args.common.tsc_hz.or_else(|| source.tsc_hz()));

    let mut profile = Profile::new();
    let mut health = Health::default();
    let mut folded = (args.folded.is_some() || args.flame.is_some()).then(FoldedStacks::new);
    let mut timeline = match &args.timeline {
        Some(path) => Some(
            TimelineWriter::new(
                create(path, "--timeline")?,
                TimelineOptions {
                    clock: clock(&args.clock),
                    tsc_hz: args.common.tsc_hz.or_else(|| source.tsc_hz()),
                    title: name.clone(),
                },
            )
            .with_context(|| format!("--timeline: writing {}", path.display()))?,
        ),
        None => None,
    };
    let mut tree: Option<TreeWriter<BufWriter<File>>> = match &args.tree {
        Some(path) => Some(TreeWriter::new(create(path, "--tree")?, rate)),
        None => None,
    };
    let mut sinks = Sinks(vec![&mut profile, &mut health]);
    if let Some(s) = folded.as_mut() {
        sinks.0.push(s);
    }
    if let Some(s) = timeline.as_mut() {
        sinks.0.push(s);
    }
    if let Some(s) = tree.as_mut() {
        sinks.0.push(s);
    }
    let decoded = decode(&source, &name, args.common.quiet, &mut sinks)?;
    drop(sinks);

    let mut written: Vec<(&str, PathBuf)> = Vec::new();
    if let (Some(t), Some(path)) = (timeline, &args.timeline) {
        t.finish()
            .with_context(|| format!("--timeline: writing {}", path.display()))?;
        written.push(("timeline (Perfetto / Chrome trace JSON)", path.clone()));
    }
    if let (Some(t), Some(path)) = (tree, &args.tree) {
        t.into_inner()
            .with_context(|| format!("--tree: writing {}", path.display()))?;
        written.push(("call trace", path.clone()));
    }
    if let Some(folded) = folded.as_mut() {
        write_stacks(
            folded,
            &decoded.tracker,
            args.folded.as_deref(),
            args.flame.as_deref(),
            &format!("hwtrace report: {name}"),
        )?;
        if let Some(p) = &args.folded {
            written.push(("folded stacks", p.clone()));
        }
        if let Some(p) = &args.flame {
            written.push(("flame graph (SVG)", p.clone()));
        }
    }

    let mut out = BufWriter::new(std::io::stdout().lock());
    let text = Text {
        name: &name,
        top: args.top,
        rate,
        funcs: decoded.tracker.functions(),
        profile: &profile,
        health: &health,
        report: &decoded.report,
        written: &written,
    };
    text.write(&mut out).context("writing the report")?;
    out.flush().context("writing the report")?;
    Ok(problems(&decoded.report))
}

/// Everything the printed report shows.
struct Text<'a> {
    name: &'a str,
    top: usize,
    rate: TscRate,
    funcs: &'a Functions,
    profile: &'a Profile,
    health: &'a Health,
    report: &'a crate::answers::SourceReport,
    written: &'a [(&'a str, PathBuf)],
}

impl Text<'_> {
    fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let r = self.report;
        let p = self.profile;
        let insns: u64 = p.threads.values().map(|t| t.insns).sum();
        writeln!(out, "hwtrace report: {}", self.name)?;
        writeln!(out)?;
        writeln!(out, "input")?;
        writeln!(out, "  trace bytes      {}", r.trace_bytes)?;
        if r.branches > 0 {
            writeln!(out, "  branch records   {}", r.branches)?;
        }
        writeln!(out, "  instructions     {}", r.insns)?;
        writeln!(out, "  functions        {}", self.funcs.len())?;
        writeln!(out, "  threads          {}", p.threads.len())?;
        let span = match (self.health.first_tsc, self.health.last_tsc) {
            (Some(a), Some(b)) => Some(b.0.saturating_sub(a.0)),
            _ => None,
        };
        match span {
            Some(ticks) => writeln!(out, "  time             {}", self.rate.duration(ticks))?,
            None => writeln!(out, "  time             no timestamps in the trace")?,
        }
        self.functions(out, insns, span.is_some())?;
        self.images(out, insns)?;
        self.threads(out, insns)?;
        self.trace_health(out)?;
        if !self.written.is_empty() {
            writeln!(out)?;
            writeln!(out, "written")?;
            for (what, path) in self.written {
                writeln!(out, "  {what}: {}", path.display())?;
            }
        }
        Ok(())
    }

    fn functions(&self, out: &mut dyn Write, insns: u64, timed: bool) -> std::io::Result<()> {
        writeln!(out)?;
        writeln!(
            out,
            "top functions by own instructions (of {} functions)",
            self.funcs.len()
        )?;
        write!(
            out,
            "  {:>7} {:>12} {:>7} {:>12} {:>9}",
            "self%", "self", "total%", "total", "calls"
        )?;
        if timed {
            write!(out, " {:>14}", "time")?;
        }
        writeln!(out, "  function [image]")?;
        for (f, s) in self.profile.by_self().into_iter().take(self.top) {
            write!(
                out,
                "  {:>6.2}% {:>12} {:>6.2}% {:>12} {:>9}",
                pct(s.self_insns, insns),
                s.self_insns,
                pct(s.total_insns, insns),
                s.total_insns,
                s.calls
            )?;
            if timed {
                write!(out, " {:>14}", self.rate.duration(s.total_ticks))?;
            }
            write!(out, "  {}", self.funcs.name(f))?;
            match self.funcs.image(f) {
                Some(image) => writeln!(out, " [{image}]")?,
                None => writeln!(out)?,
            }
        }
        Ok(())
    }

    fn images(&self, out: &mut dyn Write, insns: u64) -> std::io::Result<()> {
        let mut by_image: HashMap<&str, u64> = HashMap::new();
        for (&f, s) in &self.profile.functions {
            let image = self.funcs.image(f).unwrap_or("(no image)");
            *by_image.entry(image).or_default() += s.self_insns;
        }
        let mut images: Vec<(&str, u64)> = by_image.into_iter().collect();
        images.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        writeln!(out)?;
        writeln!(out, "images")?;
        for (image, n) in images {
            writeln!(out, "  {:>6.2}% {:>12}  {image}", pct(n, insns), n)?;
        }
        Ok(())
    }

    fn threads(&self, out: &mut dyn Write, insns: u64) -> std::io::Result<()> {
        let mut threads: Vec<(&ThreadKey, _)> = self.profile.threads.iter().collect();
        threads.sort_by(|a, b| b.1.insns.cmp(&a.1.insns).then(a.0.cmp(b.0)));
        writeln!(out)?;
        writeln!(out, "threads")?;
        writeln!(
            out,
            "  {:>7} {:>12} {:>9} {:>9}  thread",
            "insns%", "insns", "calls", "depth"
        )?;
        for (key, t) in threads {
            writeln!(
                out,
                "  {:>6.2}% {:>12} {:>9} {:>9}  {key}",
                pct(t.insns, insns),
                t.insns,
                t.calls,
                t.max_depth
            )?;
        }
        Ok(())
    }

    fn trace_health(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let r = self.report;
        writeln!(out)?;
        writeln!(out, "trace health")?;
        writeln!(out, "  decode errors    {}", r.errors)?;
        writeln!(out, "  overflows        {}", r.overflows)?;
        writeln!(out, "  bytes skipped    {}", r.skipped_bytes)?;
        writeln!(out, "  bytes lost       {}", r.lost_bytes)?;
        writeln!(
            out,
            "  returns that unwound frames (longjmp-like) {}",
            self.profile.unwound
        )?;
        writeln!(
            out,
            "  returns above the first frame (began mid-function) {}",
            self.profile.callers
        )?;
        for (what, (n, offsets)) in &self.health.gaps {
            let list: Vec<String> = offsets.iter().map(ToString::to_string).collect();
            let more = if *n as usize > offsets.len() {
                ", ..."
            } else {
                ""
            };
            writeln!(out, "  {what}: {n} at {}{more}", list.join(", "))?;
        }
        if !r.problems.is_empty() {
            writeln!(out, "  problems:")?;
            for p in &r.problems {
                writeln!(out, "    {p}")?;
            }
            if r.more_problems > 0 {
                writeln!(out, "    ... and {} more", r.more_problems)?;
            }
        }
        Ok(())
    }
}
