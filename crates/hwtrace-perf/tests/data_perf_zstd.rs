//! hwtrace reads what Debian's `perf record -z` writes on this machine
//! (zstd-compressed records, file and pipe format): with the COMPRESSED
//! records expanded, every record count equals `perf report -D`'s (which
//! counts the COMPRESSED records and the records inside them), and the
//! samples equal `perf script`'s lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hwtrace_perf::data::{PerfData, PerfRecord, record_type_name};

fn tmp(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-zstd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn perf(args: &[&str]) -> std::process::Output {
    match Command::new("perf")
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("`perf` is not installed (scripts/setup.sh installs linux-perf): {e}"),
    }
}

/// `perf record -z` of a small workload into `out` (pipe format through
/// stdout when `pipe`).
fn record(out: &Path, pipe: bool) -> Vec<u8> {
    let target = if pipe {
        "-".to_string()
    } else {
        out.display().to_string()
    };
    let o = perf(&[
        "record",
        "-q",
        "-z",
        "-e",
        "cpu-clock",
        "-c",
        "20000",
        "--switch-events",
        "-o",
        &target,
        "--",
        "/bin/sh",
        "-c",
        "ls -R /usr/share/perl5 >/dev/null",
    ]);
    assert!(
        o.status.success(),
        "perf record -z failed (is this perf built with zstd? `perf version --build-options`): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    if pipe {
        // The workload shares perf's stdout: cut what precedes the magic.
        let start = o
            .stdout
            .windows(8)
            .position(|w| w == b"PERFILE2")
            .expect("a perf stream on perf's stdout");
        std::fs::write(out, &o.stdout[start..]).unwrap();
    }
    std::fs::read(out).unwrap()
}

/// `perf report -D`'s "Aggregated stats": record name → count.
fn perf_counts(file: &Path) -> BTreeMap<String, u64> {
    let o = perf(&["report", "-D", "-f", "-i", &file.display().to_string()]);
    let text = String::from_utf8_lossy(&o.stdout);
    let stats = text
        .split("Aggregated stats:")
        .nth(1)
        .expect("perf report -D prints stats");
    let mut counts = BTreeMap::new();
    for line in stats.lines().skip(1) {
        let Some((name, rest)) = line.split_once(" events:") else {
            break;
        };
        let n: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
        if name.trim() != "TOTAL" && n > 0 {
            counts.insert(name.trim().to_string(), n);
        }
    }
    counts
}

/// Our counts with COMPRESSED records expanded, and the number of samples.
fn our_counts(bytes: &[u8]) -> (BTreeMap<String, u64>, u64) {
    let file = PerfData::parse(bytes).unwrap();
    let mut counts = BTreeMap::new();
    let mut samples = 0;
    let mut inner = 0;
    let mut records = file.records();
    while let Some(r) = records.next_expanded().transpose() {
        let r = r.unwrap();
        inner += u64::from(r.is_decompressed());
        let item = r.item();
        if let PerfRecord::Sample { sample, .. } = &item.record {
            assert!(sample.ip.is_some() && sample.pid_tid.is_some());
            samples += 1;
        }
        *counts
            .entry(record_type_name(item.header.kind).to_string())
            .or_insert(0) += 1;
    }
    assert!(inner > 0, "no record came out of a COMPRESSED record");
    let compression = if file.header.is_pipe() {
        records.pipe_features().compressed
    } else {
        file.features.compressed
    };
    let c = compression.expect("HEADER_COMPRESSED");
    assert_eq!(c.kind, 1, "zstd");
    assert!(c.mmap_len > 0);
    (counts, samples)
}

fn perf_script_lines(file: &Path) -> u64 {
    let o = perf(&["script", "-f", "-i", &file.display().to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).lines().count() as u64
}

fn check(name: &str, pipe: bool) {
    let path = tmp(name);
    let bytes = record(&path, pipe);
    let (ours, samples) = our_counts(&bytes);
    assert_eq!(ours, perf_counts(&path));
    for k in ["COMPRESSED", "SAMPLE", "MMAP2", "SWITCH", "COMM"] {
        assert!(ours.contains_key(k), "{k} missing: {ours:?}");
    }
    assert_eq!(samples, perf_script_lines(&path));
    std::fs::remove_file(&path).ok();
    // The other test may still use the directory: remove it only when empty.
    std::fs::remove_dir(path.parent().unwrap()).ok();
}

#[test]
fn perf_record_z_file_format_counts_match_perf_report_and_script() {
    check("file.data", false);
}

#[test]
fn perf_record_z_pipe_format_counts_match_perf_report_and_script() {
    check("pipe.data", true);
}
