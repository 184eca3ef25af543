//! Running the built `hwtrace` binary, shared by the CLI test files.
#![allow(dead_code)] // each test binary uses a different subset

use std::process::{Command, Output};

pub mod parallel;
pub mod qemu;

/// Runs `hwtrace ARGS…`.
pub fn hwtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()
        .expect("the hwtrace binary runs")
}

/// Runs `hwtrace ARGS…` in `dir` (a test case's folder, which its
/// arguments name files in).
pub fn hwtrace_in(dir: &std::path::Path, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .current_dir(dir)
        .args(args)
        .output()
}

/// Runs `hwtrace ARGS…`, which must succeed, and returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = hwtrace(args);
    assert!(
        out.status.success(),
        "hwtrace {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// Runs `hwtrace ARGS…`, which must fail, and returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = hwtrace(args);
    assert!(!out.status.success(), "hwtrace {args:?} should fail");
    String::from_utf8(out.stderr).expect("UTF-8 output")
}

/// `../shared/corpus`.
pub fn shared() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

/// One libipt corpus case as `hwtrace flow` takes it.
pub struct FlowCase {
    pub name: String,
    /// The case's folder: the arguments name files in it.
    pub dir: std::path::PathBuf,
    /// The trace, `--image FILE@ADDR`, and `--cpu F/M` when the case has one.
    pub args: Vec<String>,
}

/// Every `step`-th folder of `../shared/corpus/libipt` (in name order)
/// whose case has a trace and an image.
pub fn libipt_flow_cases(step: usize) -> anyhow::Result<Vec<FlowCase>> {
    use anyhow::Context;
    let mut dirs: Vec<_> = std::fs::read_dir(shared().join("libipt"))
        .context("../shared/corpus/libipt")?
        .flatten()
        .collect();
    dirs.sort_by_key(|d| d.file_name());
    let mut cases = Vec::new();
    for dir in dirs.iter().step_by(step) {
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("case.json"))?)?;
        let (Some(image), Some(trace)) = (case["images"].get(0), case["trace"].as_str()) else {
            continue;
        };
        let (Some(file), Some(at)) = (image["file"].as_str(), image["load_address"].as_str())
        else {
            continue;
        };
        let mut args = vec![trace.to_owned(), "--image".into(), format!("{file}@{at}")];
        if let Some(cpu) = case["cpu"].as_str() {
            args.extend(["--cpu".into(), cpu.to_owned()]);
        }
        cases.push(FlowCase {
            name: dir.file_name().to_string_lossy().into_owned(),
            dir: dir.path(),
            args,
        });
    }
    Ok(cases)
}

/// The timing configuration a decoder needs for traces the simulator wrote
/// with `timing` (what `perf` reads from the CPU and passes to its
/// decoder): the MTC frequency, the crystal clock's CPUID ratio and the
/// nominal core:bus ratio, so MTC and CYC packets become time.
pub fn decoder_time(timing: &hwtrace_sim::Timing) -> hwtrace_flow::TimeConfig {
    let (eax, ebx) = timing.tsc_ctc_ratio.unwrap_or((0, 0));
    hwtrace_flow::TimeConfig {
        mtc_freq: timing.mtc_freq.unwrap_or(0),
        nom_freq: timing.tsc_bus_ratio,
        cpuid_0x15_eax: eax,
        cpuid_0x15_ebx: ebx,
        skl168: false,
    }
}
