//! The answers of a raw trace decoded on several threads give byte for
//! byte what they give on one. `coverage` builds each work unit's blocks
//! and edges on the thread that decoded it and merges the parts in trace
//! order, so every seam (a block cut in two, the edge across it, a
//! conditional branch whose target left the IP filter just before it, the
//! address space at a unit's start) must be stitched exactly; the call
//! answers (`report` with its flame graph, folded stacks, call tree and
//! timeline; `calls`; `timeline`) take records each unit's thread made,
//! in trace order: a record a seam cut in two, a time two units both read
//! must not show. Compared: every output file, stdout, stderr and the exit
//! code, with tiny work units that put seams at nearly every PSB.
//!
//! Inputs: the three real hardware traces (strict and `--lenient`: errors,
//! resynchronisations, PIPs, filter exits), every 7th libipt corpus case
//! with an image (timing packets among them), the real traces
//! concatenated with errors between them (each piece's CR3 must not leak
//! into the next), and gzip recorded with qemu-user and encoded with TSC,
//! MTC and CYC packets (the timeline's times), with and without a slow
//! consumer's overflows. `coverage_qemu.rs` checks its recorded runs the
//! same way, besides against their truth.
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`) for the recorded run.

mod common;

use anyhow::{Result, ensure};
use common::parallel::{concatenated_real_traces, same, same_answer};
use common::qemu::{Scratch, need};
use common::{libipt_flow_cases, shared};
use std::path::Path;
use std::process::Command;

/// Every answer of `args` (run in `dir`), on one thread and on several:
/// `coverage` with all its outputs, `report` with all its outputs, `calls
/// --tree`/`--folded`, `timeline`. Returns `report`'s stdout.
fn same_answers(name: &str, dir: &Path, args: &[String]) -> Result<String> {
    same(name, dir, args)?;
    let with = |command: &str| -> Vec<String> {
        std::iter::once(command.to_owned())
            .chain(args.iter().cloned())
            .collect()
    };
    let report = same_answer(
        &format!("{name}-report"),
        dir,
        &with("report"),
        &[
            ("--flame", "svg"),
            ("--folded", "folded"),
            ("--tree", "tree"),
            ("--timeline", "json"),
        ],
    )?;
    same_answer(
        &format!("{name}-calls"),
        dir,
        &with("calls"),
        &[("--tree", "tree"), ("--folded", "folded")],
    )?;
    same_answer(
        &format!("{name}-timeline"),
        dir,
        &with("timeline"),
        &[("-o", "json")],
    )?;
    Ok(report)
}

#[test]
fn the_real_traces_answer_the_same_on_every_core() -> Result<()> {
    let real = shared().join("real");
    for name in ["foo", "Unzip", "icelake_tip"] {
        let dir = real.join(name);
        for lenient in [false, true] {
            let mut args: Vec<String> = vec!["trace.pt".into(), "--pages".into(), ".".into()];
            if lenient {
                args.push("--lenient".into());
            }
            let report = same_answers(name, &dir, &args)?;
            eprintln!(
                "{name} (lenient: {lenient}): {}",
                report.lines().next().unwrap_or_default()
            );
        }
    }
    Ok(())
}

#[test]
fn libipt_corpus_cases_answer_the_same_on_every_core() -> Result<()> {
    let cases = libipt_flow_cases(7)?;
    ensure!(cases.len() > 40, "only {} cases", cases.len());
    for case in &cases {
        same_answers(&case.name, &case.dir, &case.args)?;
    }
    Ok(())
}

/// The real traces one after the other, errors between them
/// ([`concatenated_real_traces`]).
#[test]
fn concatenated_traces_answer_the_same_on_every_core() -> Result<()> {
    let dir = Scratch::new("answers-parallel", "concatenated")?;
    let args = concatenated_real_traces(&dir.0)?;
    same_answers("concatenated", &dir.0, &args)?;
    Ok(())
}

/// gzip recorded with qemu-user, encoded by `hwtrace sim pt` with a TSC in
/// every PSB+, MTC and CYC packets (the time between timestamps), a PSB
/// every 512 bytes; and again read by a consumer too slow to keep up
/// (overflows).
#[test]
fn a_timed_real_execution_answers_the_same_on_every_core() -> Result<()> {
    need("qemu-x86_64", "qemu-user")?;
    let dir = Scratch::new("answers-parallel", "gzip-timed")?;
    let input: String = (0..400)
        .map(|i| format!("line {i} of the input\n"))
        .collect();
    let input = dir.file("in.txt", input.as_bytes())?;
    for (name, extra) in [
        ("timed", &[][..]),
        ("overflows", &["--topa", "4K,4K", "--consumer", "1/2"][..]),
    ] {
        let trace = dir.0.join(format!("{name}.pt"));
        let code = dir.0.join(format!("{name}-code"));
        let run = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
            .args([
                "sim",
                "pt",
                "--qemu",
                "--tsc",
                "--mtc-freq",
                "3",
                "--cyc",
                "1",
            ])
            .args(["--psb-period", "512"])
            .args(extra)
            .arg("-o")
            .arg(&trace)
            .arg("--code-out")
            .arg(&code)
            .args(["--", "/usr/bin/gzip", "-c", "-6"])
            .arg(&input)
            .output()?;
        ensure!(run.status.success(), "sim pt: {run:?}");
        let args: Vec<String> = [
            trace.display().to_string(),
            "--pages".into(),
            code.display().to_string(),
            "--mtc-freq".into(),
            "3".into(),
            "--nom-freq".into(),
            "24".into(),
            "--cpuid-0x15.eax".into(),
            "2".into(),
            "--cpuid-0x15.ebx".into(),
            "216".into(),
        ]
        .into();
        let report = same_answers(name, &dir.0, &args)?;
        eprintln!(
            "gzip ({name}): {}",
            report.lines().next().unwrap_or_default()
        );
    }
    Ok(())
}
