//! hwtrace reads what Debian's `perf record` writes on this machine (software
//! events, context-switch and mmap sideband), in file and pipe format, with
//! the same record counts `perf report -D` shows. Skipped, with a printed
//! reason, when `perf` is missing or may not record here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hwtrace_perf::data::{PerfData, PerfRecord, record_type_name};

fn tmp(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `perf record` of `/bin/ls` with cpu-clock samples and switch events;
/// `None` (after saying why) when perf cannot record here.
fn record(out: &Path, pipe: bool) -> Option<Vec<u8>> {
    let mut cmd = Command::new("perf");
    cmd.args([
        "record",
        "-q",
        "-e",
        "cpu-clock",
        "-c",
        "20000",
        "--switch-events",
        "-o",
    ]);
    cmd.arg(if pipe { Path::new("-") } else { out });
    cmd.args(["--", "/bin/sh", "-c", "ls -R /usr/share/perl5 >/dev/null"])
        .stderr(Stdio::piped());
    let result = if pipe {
        cmd.stdout(Stdio::piped()).output()
    } else {
        cmd.stdout(Stdio::null()).output()
    };
    let o = match result {
        Ok(o) if o.status.success() => o,
        Ok(o) => panic!("perf record failed: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => panic!("`perf` is not installed (scripts/setup.sh installs it): {e}"),
    };
    if pipe {
        // The workload shares perf's stdout: the test cuts what precedes
        // the stream's magic.
        std::fs::write(out, &o.stdout).unwrap();
    }
    Some(std::fs::read(out).unwrap())
}

/// `perf report -D`'s "Aggregated stats": record name → count.
fn perf_counts(file: &Path) -> BTreeMap<String, u64> {
    let o = Command::new("perf")
        .args(["report", "-D", "-f", "-i"])
        .arg(file)
        .output()
        .unwrap();
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
        let name = name.trim();
        let n: u64 = rest.split_whitespace().next().unwrap().parse().unwrap();
        if name != "TOTAL" && n > 0 {
            counts.insert(name.to_string(), n);
        }
    }
    counts
}

fn our_counts(bytes: &[u8]) -> BTreeMap<String, u64> {
    let file = PerfData::parse(bytes).unwrap();
    let mut counts = BTreeMap::new();
    let mut records = file.records();
    for r in &mut records {
        let r = r.unwrap();
        if let PerfRecord::Sample { sample, .. } = &r.record {
            assert!(sample.ip.is_some() && sample.pid_tid.is_some());
        }
        *counts
            .entry(record_type_name(r.header.kind).to_string())
            .or_insert(0) += 1;
    }
    if !file.header.is_pipe() {
        assert!(!file.attrs.is_empty());
        assert!(file.features.cmdline.as_ref().is_some_and(|c| c.len() > 2));
        assert!(file.features.nrcpus.is_some());
        assert!(
            file.features.errors.is_empty(),
            "{:?}",
            file.features.errors
        );
    } else {
        assert!(
            !records.attrs().is_empty(),
            "pipe mode brings attrs as records"
        );
        assert!(records.pipe_features().cmdline.is_some());
    }
    counts
}

#[test]
fn perf_record_file_format_counts_match_perf_report() {
    let path = tmp("file.data");
    let Some(bytes) = record(&path, false) else {
        return;
    };
    let ours = our_counts(&bytes);
    assert_eq!(ours, perf_counts(&path));
    let wanted = ["SWITCH", "MMAP2", "SAMPLE", "COMM"];
    assert!(wanted.iter().all(|k| ours.contains_key(*k)), "{ours:?}");
    std::fs::remove_file(&path).ok();
    // The other test may still use the directory: remove it only when empty.
    std::fs::remove_dir(path.parent().unwrap()).ok();
}

#[test]
fn perf_record_pipe_format_counts_match_perf_report() {
    let path = tmp("pipe.data");
    let Some(bytes) = record(&path, true) else {
        return;
    };
    let Some(start) = bytes.windows(8).position(|w| w == b"PERFILE2") else {
        panic!("no perf stream in perf's stdout")
    };
    let bytes = bytes[start..].to_vec();
    std::fs::write(&path, &bytes).unwrap();
    let ours = our_counts(&bytes);
    assert_eq!(ours, perf_counts(&path));
    assert!(ours.contains_key("ATTR"));
    std::fs::remove_file(&path).ok();
    // The other test may still use the directory: remove it only when empty.
    std::fs::remove_dir(path.parent().unwrap()).ok();
}
