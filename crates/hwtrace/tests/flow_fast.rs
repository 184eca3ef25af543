//! `hwtrace flow` decodes with the block-cached fast decoder; the hidden
//! `--decoder insn` keeps the instruction decoder it must agree with. Both
//! must print the same bytes (stdout, stderr and exit code) in every output
//! format — instructions with disassembly, JSON (every instruction's trace
//! offset), blocks, branches (where the fast path gives runs by their ends
//! only, and `--stats` must still count every instruction), and `--quiet
//! --stats`, where the fast path only counts its runs — sequentially and on several threads with a seam
//! at every PSB, on the real traces `foo` (clean) and `Unzip` (with
//! errors) and on a sample of libipt's corpus cases.

use anyhow::{Context, Result, ensure};
use std::path::Path;

mod common;
use common::{hwtrace_in, libipt_flow_cases, shared};

/// The output formats compared.
const FORMATS: [&[&str]; 10] = [
    &[],
    &["--no-disasm", "--stats"],
    &["--json"],
    &["--blocks"],
    &["--blocks", "--json"],
    &["--blocks", "--stats", "--json"],
    &["--branches"],
    &["--branches", "--stats", "--json"],
    &["--quiet", "--stats"],
    &["--quiet", "--stats", "--json"],
];

/// Sequential, and 3 threads with one work unit per PSB.
const JOBS: [&[&str]; 2] = [&["--jobs", "1"], &["--jobs", "3", "--unit-bytes", "1"]];

/// Exit code, stdout and stderr of `hwtrace flow ARGS` in `dir`.
type Run = (Option<i32>, Vec<u8>, Vec<u8>);

fn flow(dir: &Path, args: &[&str]) -> Result<Run> {
    let args: Vec<&str> = ["flow"].iter().chain(args).copied().collect();
    let out = hwtrace_in(dir, &args).context("running hwtrace flow")?;
    Ok((out.status.code(), out.stdout, out.stderr))
}

/// Runs `base` in every format and job count with the default (fast)
/// decoder and with `--decoder insn`; fails naming the first difference.
/// Returns the instruction decoder's runs, for the caller's own checks.
fn same_both_ways(what: &str, dir: &Path, base: &[&str]) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for format in FORMATS {
        for jobs in JOBS {
            let args = [base, format, jobs].concat();
            let insn = flow(dir, &[&args[..], &["--decoder", "insn"]].concat())?;
            let fast = flow(dir, &args)?;
            if fast != insn {
                let (a, b) = (
                    String::from_utf8_lossy(&fast.1),
                    String::from_utf8_lossy(&insn.1),
                );
                let line = a.lines().zip(b.lines()).position(|(x, y)| x != y);
                anyhow::bail!(
                    "{what} {format:?} {jobs:?}: fast decoder differs (exit {:?} vs {:?}, {} vs {} bytes out, {} vs {} bytes err; first differing line {:?}: {:?} vs {:?})",
                    fast.0,
                    insn.0,
                    fast.1.len(),
                    insn.1.len(),
                    fast.2.len(),
                    insn.2.len(),
                    line,
                    line.and_then(|l| a.lines().nth(l)),
                    line.and_then(|l| b.lines().nth(l)),
                );
            }
            runs.push(insn);
        }
    }
    Ok(runs)
}

#[test]
fn the_real_traces_print_the_same_with_either_decoder() -> Result<()> {
    for (name, code, insns) in [("foo", 0, Some(117_967)), ("Unzip", 2, None)] {
        let dir = shared().join("real").join(name);
        let runs = same_both_ways(name, &dir, &["trace.pt", "--pages", "."])?;
        for run in &runs {
            ensure!(
                run.0 == Some(code) && !run.1.is_empty(),
                "{name}: exit {:?}, {} bytes out",
                run.0,
                run.1.len()
            );
        }
        if let Some(insns) = insns {
            // --quiet --stats counted every instruction.
            let at = |format: &[&str]| {
                FORMATS
                    .iter()
                    .position(|f| *f == format)
                    .map(|i| i * JOBS.len())
            };
            let quiet = at(&["--quiet", "--stats"]).context("no quiet run")?;
            let stats = String::from_utf8_lossy(&runs[quiet].1).into_owned();
            ensure!(
                stats.starts_with(&format!("[stats: {insns} instructions")),
                "{name}: {stats}"
            );
            // So did --branches and --blocks with --stats (JSON), which
            // give runs by their ends or fold them whole.
            for format in [
                &["--branches", "--stats", "--json"][..],
                &["--blocks", "--stats", "--json"],
            ] {
                let i = at(format).with_context(|| format!("no {format:?} run"))?;
                let out = String::from_utf8_lossy(&runs[i].1).into_owned();
                ensure!(
                    out.contains(&format!("\"insns\":{insns},")),
                    "{name} {format:?}: {}",
                    out.lines().last().unwrap_or_default()
                );
            }
        }
    }
    Ok(())
}

#[test]
fn libipt_cases_print_the_same_with_either_decoder() -> Result<()> {
    let mut checked = 0;
    let mut insns = 0;
    // Every 30th case with an image and a trace: over a dozen, across the
    // corpus's processors and packet kinds (each is run 40 times).
    for case in libipt_flow_cases(30)? {
        let base: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let runs = same_both_ways(&case.name, &case.dir, &base)?;
        insns += String::from_utf8_lossy(&runs[0].1).lines().count();
        checked += 1;
    }
    ensure!(checked >= 12, "only {checked} cases found");
    ensure!(insns > 50, "only {insns} lines decoded in {checked} cases");
    Ok(())
}
