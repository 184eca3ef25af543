//! `hwtrace flow --no-disasm` against libipt's ptxed expectations: every
//! corpus case decoded with plain options (no ptxed-only options, no
//! sideband) must print what ptxed prints, with `--cpu` for errata cases.
//!
//! `hwtrace flow` says a little more than ptxed in four places, and the
//! comparison allows exactly those:
//! - an asynchronous branch names where it came from and went to:
//!   `[interrupt, from: A, to: B]` where ptxed prints `[interrupt]`;
//! - an error names the IP the decoder was at where ptxed prints 0;
//! - after an error with no PSB left, a line says the rest was skipped;
//! - ptxed's `[end of trace]` (its decoder ran out of trace inside a
//!   block) is not printed: the end of the output says as much.

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/libipt")
}

fn normalise(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

/// Our line in ptxed's words, or `None` for the lines ptxed does not print.
fn as_ptxed(line: &str) -> Option<String> {
    if line.starts_with("[no PSB after ") {
        return None;
    }
    if line.starts_with("[interrupt, from: ") {
        return Some("[interrupt]".into());
    }
    // `[offset, ip: error: what]` — compare offset and what.
    if let Some(rest) = line.strip_prefix('[')
        && let Some((offset, tail)) = rest.split_once(", ")
        && let Some((_, what)) = tail.split_once(": error: ")
    {
        return Some(format!("[{offset}, _: error: {what}"));
    }
    Some(line.to_string())
}

fn expected_as_compared(line: &str) -> Option<String> {
    if line == "[end of trace]" {
        return None;
    }
    if let Some(rest) = line.strip_prefix('[')
        && let Some((offset, tail)) = rest.split_once(", ")
        && let Some((_, what)) = tail.split_once(": error: ")
    {
        return Some(format!("[{offset}, _: error: {what}"));
    }
    Some(line.to_string())
}

#[test]
fn flow_prints_what_ptxed_prints() {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(corpus())
        .expect("../shared/corpus/libipt")
        .flatten()
        .collect();
    dirs.sort_by_key(|d| d.file_name());
    for dir in dirs {
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("case.json")).unwrap())
                .unwrap();
        let plain = case["ptxed_options"].as_array().unwrap().is_empty()
            && case["sideband_arguments"].as_array().unwrap().is_empty();
        let Some(exp) = case["expected"]["flow"].as_array().and_then(|a| a.first()) else {
            continue;
        };
        if !plain {
            continue;
        }
        let image = &case["images"][0];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hwtrace"));
        cmd.current_dir(dir.path()).arg("flow");
        if let Some(cpu) = case["cpu"].as_str() {
            cmd.args(["--cpu", cpu]);
        }
        let out = cmd
            .arg("--image")
            .arg(format!(
                "{}@{}",
                image["file"].as_str().unwrap(),
                image["load_address"].as_str().unwrap()
            ))
            .arg(case["trace"].as_str().unwrap())
            .arg("--no-disasm")
            .output()
            .unwrap();
        let ours: Vec<_> = normalise(&String::from_utf8_lossy(&out.stdout))
            .iter()
            .filter_map(|l| as_ptxed(l))
            .collect();
        let want: Vec<_> =
            normalise(&std::fs::read_to_string(dir.path().join(exp.as_str().unwrap())).unwrap())
                .iter()
                .filter_map(|l| expected_as_compared(l))
                .collect();
        if ours != want {
            let at = ours
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(ours.len().min(want.len()));
            failures.push(format!(
                "{}: line {}: ours {:?}, ptxed {:?}",
                dir.file_name().to_string_lossy(),
                at + 1,
                ours.get(at),
                want.get(at)
            ));
        }
        checked += 1;
    }
    assert!(checked > 300, "only {checked} cases found");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
