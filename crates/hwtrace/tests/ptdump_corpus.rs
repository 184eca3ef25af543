//! `hwtrace ptdump` against libipt's scenario corpus.
//!
//! Every case in `../shared/corpus/libipt/*/case.json` is run as libipt's
//! test harness runs ptdump: inside the case folder, with the case's ptdump
//! options, its sideband arguments, `--cpu F/M` for errata cases, and the
//! trace file. The output must equal the case's `-ptdump*.exp` line by line
//! with runs of whitespace collapsed and trailing whitespace dropped (libipt
//! compares with `diff -ub`, and the expected files' spacing is partly
//! hand-written).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Cases allowed to fail, as (case-name prefix, reason). None today: every
/// case must match.
const EXCEPTIONS: &[(&str, &str)] = &[];

fn corpus_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    workspace.join("../shared/corpus/libipt")
}

fn normalize(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs one case; `Err` describes the first difference.
fn run_case(dir: &Path, case: &Value) -> Result<(), String> {
    let mut args = Vec::new();
    if let Some(cpu) = case["cpu"].as_str() {
        args.extend(["--cpu".to_string(), cpu.to_string()]);
    }
    args.extend(strings(&case["ptdump_options"]));
    args.extend(strings(&case["sideband_arguments"]));
    args.push(case["trace"].as_str().ok_or("no trace")?.to_string());

    let expected_name = case["expected"]["dump"][0]
        .as_str()
        .ok_or("no expected dump")?;
    let expected = std::fs::read_to_string(dir.join(expected_name))
        .map_err(|e| format!("reading {expected_name}: {e}"))?;

    let output = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("ptdump")
        .args(&args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running hwtrace: {e}"))?;
    let actual = String::from_utf8_lossy(&output.stdout);

    let (got, want) = (normalize(&actual), normalize(&expected));
    if got == want {
        return Ok(());
    }
    let line = (0..got.len().max(want.len()))
        .find(|&i| got.get(i) != want.get(i))
        .unwrap_or(0);
    Err(format!(
        "line {}: got {:?}, expected {:?}{}",
        line + 1,
        got.get(line).map_or("<end>", String::as_str),
        want.get(line).map_or("<end>", String::as_str),
        if output.stderr.is_empty() {
            String::new()
        } else {
            format!(
                " (stderr: {})",
                String::from_utf8_lossy(&output.stderr).trim()
            )
        }
    ))
}

#[test]
fn every_libipt_case_dumps_like_ptdump() {
    let corpus = corpus_dir();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap_or_else(|e| panic!("corpus not found at {}: {e}", corpus.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.json").is_file())
        .collect();
    dirs.sort();
    assert_eq!(
        dirs.len(),
        491,
        "expected 491 cases in {}",
        corpus.display()
    );

    let mut passed = 0;
    let mut excused = Vec::new();
    let mut failures = Vec::new();
    for dir in &dirs {
        let text = std::fs::read_to_string(dir.join("case.json")).expect("case.json");
        let case: Value = serde_json::from_str(&text).expect("case.json is JSON");
        let name = case["name"].as_str().unwrap_or("?").to_string();
        match run_case(dir, &case) {
            Ok(()) => passed += 1,
            Err(why) => match EXCEPTIONS.iter().find(|(p, _)| name.starts_with(p)) {
                Some((_, reason)) => excused.push(format!("{name}: {reason}")),
                None => failures.push(format!("{name}: {why}")),
            },
        }
    }

    eprintln!("ptdump corpus: {passed}/{} cases pass", dirs.len());
    for e in &excused {
        eprintln!("  excused {e}");
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ from libipt's ptdump:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
