//! `hwtrace flow --quiet` only counts: the fast decoder's runs go through
//! the driver whole (`Flow::skip_runs`), never made into instructions.
//! Its counts must be those of the path that hands every instruction out
//! (`--stats` without `--quiet`, the last line printed), and its error
//! and endless-loop reports on stderr those of the instruction decoder
//! (`--decoder insn`), exactly: on the real traces `foo` (clean), `Unzip`
//! (errors) and `icelake_tip` (errors, nothing decodable), on a sample of
//! libipt's corpus, and on a made-up trace with endless loops (reported
//! at their exact last instruction) and errors; sequentially and on two
//! threads, with ordinary units and with one per PSB.

use anyhow::{Context, Result, ensure};
use hwtrace_packet::{Packet, Tnt, TraceBuilder};
use std::path::Path;

mod common;
use common::{hwtrace_in, libipt_flow_cases, shared};

/// Sequential; two threads; two threads with one work unit per PSB.
const JOBS: [&[&str]; 3] = [
    &["--jobs", "1"],
    &["--jobs", "2"],
    &["--jobs", "2", "--unit-bytes", "1"],
];

/// Exit code, stdout and stderr of `hwtrace flow ARGS` in `dir`.
type Run = (Option<i32>, String, String);

fn flow(dir: &Path, args: &[&str]) -> Result<Run> {
    let args: Vec<&str> = ["flow"].iter().chain(args).copied().collect();
    let out = hwtrace_in(dir, &args).context("running hwtrace flow")?;
    Ok((
        out.status.code(),
        String::from_utf8(out.stdout).context("stdout")?,
        String::from_utf8(out.stderr).context("stderr")?,
    ))
}

/// Runs `base` counting and expanded with every [`JOBS`]; fails naming
/// what differs. Returns the counting run's stats line and stderr (both
/// empty when the command refused to decode, as it must then both ways).
fn counts_agree(what: &str, dir: &Path, base: &[&str]) -> Result<(String, String)> {
    let mut first: Option<(String, String)> = None;
    for jobs in JOBS {
        let args = [base, jobs].concat();
        let counted = flow(dir, &[&args[..], &["--quiet", "--stats"]].concat())?;
        let expanded = flow(dir, &[&args[..], &["--stats", "--no-disasm"]].concat())?;
        let insn = flow(
            dir,
            &[&args[..], &["--quiet", "--stats", "--decoder", "insn"]].concat(),
        )?;
        if expanded.0 == Some(1) {
            // Refused before decoding (a case whose image file is empty):
            // the same refusal.
            ensure!(
                counted.0 == expanded.0 && counted.2 == expanded.2 && counted.1.is_empty(),
                "{what} {jobs:?}: counting {counted:?}, expanded {expanded:?}"
            );
            continue;
        }
        let stats = expanded.1.lines().last().unwrap_or_default();
        ensure!(
            stats.starts_with("[stats: "),
            "{what} {jobs:?}: expanded output ends {stats:?}"
        );
        ensure!(
            counted.1.trim_end() == stats && counted.0 == expanded.0,
            "{what} {jobs:?}: counting says {:?} (exit {:?}), expanded {stats:?} (exit {:?})",
            counted.1,
            counted.0,
            expanded.0
        );
        ensure!(
            counted == insn,
            "{what} {jobs:?}: counting differs from the instruction decoder: {counted:?} vs {insn:?}"
        );
        let run = (counted.1, counted.2);
        match &first {
            Some(f) => ensure!(
                *f == run,
                "{what} {jobs:?}: differs from --jobs 1: {run:?} vs {f:?}"
            ),
            None => first = Some(run),
        }
    }
    Ok(first.unwrap_or_default())
}

#[test]
fn counting_the_real_traces_agrees_with_every_instruction_handed_out() -> Result<()> {
    for (name, insns, failures) in [("foo", 117_967, false), ("Unzip", 121_052, true)] {
        let dir = shared().join("real").join(name);
        let (stats, err) = counts_agree(name, &dir, &["trace.pt", "--pages", "."])?;
        ensure!(
            stats.starts_with(&format!("[stats: {insns} instructions")),
            "{name}: {stats}"
        );
        ensure!(
            err.contains(": error at ") == failures,
            "{name}: stderr {err:?}"
        );
    }
    // icelake_tip's code is not in its page cache: errors, no instructions.
    let dir = shared().join("real").join("icelake_tip");
    let (stats, err) = counts_agree("icelake_tip", &dir, &["trace.pt", "--pages", "."])?;
    ensure!(
        stats.starts_with("[stats: 0 instructions") && err.contains(": error at "),
        "icelake_tip: {stats} / {err:?}"
    );
    Ok(())
}

#[test]
fn counting_libipt_cases_agrees_with_every_instruction_handed_out() -> Result<()> {
    let (mut checked, mut decoded) = (0, 0);
    // Every 25th case with an image and a trace, across the corpus's
    // processors and packet kinds.
    for case in libipt_flow_cases(25)? {
        let base: Vec<&str> = case.args.iter().map(String::as_str).collect();
        let (stats, _) = counts_agree(&case.name, &case.dir, &base)?;
        if stats.is_empty() {
            continue;
        }
        decoded += u64::from(!stats.starts_with("[stats: 0 instructions"));
        checked += 1;
    }
    ensure!(checked >= 12, "only {checked} cases found");
    ensure!(
        decoded >= 6,
        "only {decoded} of {checked} cases decoded anything"
    );
    Ok(())
}

/// 1000: nop x3; 1003: jnz 1000 (taken while the TNT says so); 1005: nop;
/// 1006: jmp 1005, a loop no trace can describe.
const LOOPS: &[u8] = &[0x90, 0x90, 0x90, 0x75, 0xfb, 0x90, 0xeb, 0xfd];

/// PSB+ at `ip` then a TNT (bits `tnt`, `len` of them), for each entry
/// of `psbs`: the code at 0x1000 ends in the endless loop, code elsewhere
/// is missing (an error).
fn trace(psbs: &[(u64, u64, u8)]) -> Result<Vec<u8>> {
    let mut t = TraceBuilder::new();
    for &(ip, tnt, len) in psbs {
        t.psb_plus_64(ip)?;
        t.push(Packet::Tnt(Tnt {
            bits: tnt,
            len,
            long: false,
        }))?;
    }
    Ok(t.finish())
}

#[test]
fn counting_reports_endless_loops_and_errors_exactly() -> Result<()> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("flow_counting_loops");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("code.bin"), LOOPS)?;
    let bytes = trace(&[
        (0x1000, 0b110, 3),
        (0x1000, 0b1, 1),
        (0x9000, 0b1, 1),
        (0x1000, 0b11110, 5),
        (0x1000, 0b0, 1),
    ])?;
    std::fs::write(dir.join("loops.pt"), bytes)?;
    for max_stall in ["5", "7", "8", "50", "1000"] {
        let what = format!("--max-stall {max_stall}");
        let base = [
            "loops.pt",
            "--image",
            "code.bin@1000",
            "--max-stall",
            max_stall,
        ];
        let (stats, err) = counts_agree(&what, &dir, &base)?;
        // Decodes end in the loops (and go on at the next PSB after each)
        // and where code is missing; every report is an error counted.
        let loops = err.matches("an endless loop").count();
        let errors = err.lines().count();
        ensure!(
            loops >= 2
                && err.contains("no memory mapped")
                && stats.contains(&format!(" {errors} errors")),
            "{what}: {stats} / {err}"
        );
    }
    Ok(())
}
