//! `hwtrace-bench answers`: what the answer commands (report, calls,
//! coverage, timeline) cost over the decode they stand on. Each runs as a
//! child process over the decode benchmark's prefix traces (the mixed
//! corpus and the real hardware traces), timed from spawn to exit with its
//! peak RSS; medians over runs. The reference is `hwtrace flow --jobs 1
//! --stats` on the same bytes in the same run: no peer computes these
//! answers from a raw PT trace, so the ratio that matters is the answer's
//! time over the decode's. The answers run as users run them (a raw trace
//! decoded by work units on every core, coverage built there too), and
//! `report --jobs 1` and `coverage --jobs 1` on one thread. Outputs go to
//! /dev/null.

use super::{Bench, Input, Options, Spec, mib, open};
use anyhow::{Result, ensure};
use std::process::Command;

/// The answer commands timed, with the arguments that write their outputs
/// to /dev/null.
const ANSWERS: [(&str, &[&str]); 7] = [
    ("report", &[]),
    // The answers decode on every core: the same answer on one thread,
    // for the ratio.
    ("report --jobs 1", &["--jobs", "1"]),
    ("calls", &["--folded", "/dev/null"]),
    // Coverage of a raw trace decodes and builds on every core; on one
    // thread for the ratio.
    (
        "coverage",
        &[
            "--drcov",
            "/dev/null",
            "--json",
            "/dev/null",
            "--afl-map",
            "/dev/null",
        ],
    ),
    (
        "coverage --jobs 1",
        &[
            "--drcov",
            "/dev/null",
            "--json",
            "/dev/null",
            "--afl-map",
            "/dev/null",
            "--jobs",
            "1",
        ],
    ),
    ("timeline", &["-o", "/dev/null"]),
    ("report --flame", &["--flame", "/dev/null"]),
];

impl Bench {
    /// `hwtrace ANSWER TRACE --pages DIR --quiet ARGS...`.
    fn answer_spec(&self, answer: &str, args: &[&str], input: Input) -> Spec {
        let command = answer.split(' ').next().unwrap_or(answer);
        let mut cmd = Command::new(&self.hwtrace);
        cmd.arg(command)
            .arg(self.trace(input))
            .arg("--pages")
            .arg(self.corpus.pages_dir())
            .arg("--quiet")
            .args(args);
        Spec {
            name: format!("hwtrace {answer}"),
            cmds: vec![cmd],
            ok_codes: &[0, 2],
            parse: |_, _| {},
        }
    }
}

/// Runs the answers benchmark.
pub fn run(opts: &Options) -> Result<()> {
    let bench = open(opts, &[Input::Prefix, Input::Real])?;
    eprintln!("timing (median of {} runs each):", bench.runs);
    println!("answers: each command over a trace, against hwtrace flow --jobs 1 on the same trace");
    println!(
        "| trace | command | wall (median) | MB/s | M insns/s | peak RSS | × decode time |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for (input, what) in [(Input::Prefix, "corpus"), (Input::Real, "real traces")] {
        // The decode and every answer on it, their runs in turn.
        let mut specs = vec![bench.hwtrace_spec("hwtrace flow --jobs 1", input, 1)];
        for (answer, args) in ANSWERS {
            specs.push(bench.answer_spec(answer, args, input));
        }
        let rows = bench.in_turn(input, &specs)?;
        let insns = rows.first().and_then(|decode| decode.counts.insns);
        ensure!(insns.is_some(), "hwtrace flow printed no instruction count");
        let base = rows[0].wall.as_secs_f64();
        let label = format!("{what} ({:.0} MiB)", mib(bench.bytes(input)?));
        for r in &rows {
            let wall = r.wall.as_secs_f64();
            let m_insns = insns.map_or(0.0, |n| n as f64 / wall / 1e6);
            println!(
                "| {label} | {} | {wall:.2} s | {:.1} | {m_insns:.1} | {} MiB | {:.1}× |",
                r.name,
                r.mb_s(),
                r.max_rss_kib / 1024,
                wall / base
            );
        }
    }
    Ok(())
}
