//! `hwtrace ptxed` against libipt's scenario corpus.
//!
//! Every case in `../shared/corpus/libipt/*/case.json` with a ptxed
//! expectation is run as libipt's harness runs ptxed, inside the case
//! folder: `ptxed --raw BIN:ADDR [--cpu F/M] OPTIONS --no-inst --check
//! --pt TRACE SIDEBAND`. The output must equal the expectation line by
//! line with runs of whitespace collapsed (libipt compares with `diff -ub`).
//! The test fails listing every failing case with its first differing line,
//! except the cases in [`EXCEPTIONS`], each with the reason; an exception
//! that starts passing is reported too, so the list only shrinks.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Cases allowed to fail, with the reason. None today: every case matches.
const EXCEPTIONS: &[(&str, &str)] = &[];

fn corpus_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    workspace.join("../shared/corpus/libipt")
}

fn normalize(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
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

/// Runs one case against one expectation; `Err` names the first
/// difference.
fn run_case(dir: &Path, case: &Value, expected_name: &str) -> Result<(), String> {
    let image = &case["images"][0];
    let file = image["file"].as_str().ok_or("no image file")?;
    let addr = image["load_address"].as_str().ok_or("no load address")?;
    let mut args = vec![
        "ptxed".to_string(),
        "--raw".to_string(),
        format!("{file}:{addr}"),
    ];
    if let Some(cpu) = case["cpu"].as_str() {
        args.extend(["--cpu".to_string(), cpu.to_string()]);
    }
    args.extend(strings(&case["ptxed_options"]));
    args.extend(["--no-inst", "--check", "--pt"].map(String::from));
    args.push(case["trace"].as_str().ok_or("no trace")?.to_string());
    args.extend(strings(&case["sideband_arguments"]));

    let expected = std::fs::read_to_string(dir.join(expected_name))
        .map_err(|e| format!("reading {expected_name}: {e}"))?;
    let output = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(&args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running hwtrace: {e}"))?;
    let mut got = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        got.push_str(&format!(
            "exit {:?}: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let (want, got) = (normalize(&expected), normalize(&got));
    if want == got {
        return Ok(());
    }
    let at = (0..want.len().max(got.len()))
        .find(|&i| want.get(i) != got.get(i))
        .unwrap_or(0);
    Err(format!(
        "line {}: expected {:?}, got {:?}",
        at + 1,
        want.get(at).map(String::as_str).unwrap_or("<end>"),
        got.get(at).map(String::as_str).unwrap_or("<end>")
    ))
}

#[test]
fn libipt_corpus_ptxed() {
    let root = corpus_dir();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    dirs.sort();
    let (mut total, mut passed) = (0, 0);
    let mut failures = Vec::new();
    let mut fixed = Vec::new();
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join("case.json")) else {
            continue;
        };
        let case: Value = serde_json::from_str(&text).expect("case.json parses");
        let name = case["name"].as_str().unwrap_or("?").to_string();
        for expected in strings(&case["expected"]["flow"]) {
            total += 1;
            let excepted = EXCEPTIONS.iter().any(|(n, _)| *n == name);
            match run_case(&dir, &case, &expected) {
                Ok(()) => {
                    passed += 1;
                    if excepted {
                        fixed.push(name.clone());
                    }
                }
                Err(e) if !excepted => failures.push(format!("{name}: {e}")),
                Err(_) => {}
            }
        }
    }
    eprintln!("ptxed corpus: {passed}/{total} cases pass");
    assert_eq!(total, 440, "the corpus has 440 ptxed expectations");
    assert!(
        failures.is_empty(),
        "{} cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        fixed.is_empty(),
        "these exceptions pass now; remove them from EXCEPTIONS: {fixed:?}"
    );
}
