//! `hwtrace perf decode` end to end on a real execution: `/bin/true`
//! recorded with qemu-user (hwtrace-sim), encoded as the Intel PT a CPU
//! would write, wrapped in a perf.data by hwtrace-perf's writer.
//!
//! The MMAP2 records name files this test writes itself: each segment of
//! the execution's code image (the bytes qemu saw executed, at the
//! addresses it ran them) in a file of its own, mapped at its address from
//! offset 0. Mapping the real `/bin/true` and `ld.so` would need their
//! guest load bases, which qemu-user's trace log does not state; the
//! segment files give the decoders exactly the code that ran, and the
//! perf.data path (MMAP2 → file on disk → image) is the same.
//!
//! Debian's `perf` and `qemu-x86_64` are required (scripts/setup.sh
//! installs them): their absence fails the tests.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use hwtrace_perf::data::IntelPtInfo;
use hwtrace_perf::data::attr::{flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter, intel_pt_attr};
use hwtrace_perf::pevent::SampleId;
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder};

const PID: u32 = 4242;

struct Recorded {
    execution: Execution,
    pt: Vec<u8>,
}

/// `/bin/true` recorded once for every test.
fn recorded() -> &'static Recorded {
    static R: OnceLock<Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let limits = Limits {
            max_instructions: None,
            timeout: Some(std::time::Duration::from_secs(120)),
        };
        let rec = Execution::record_qemu("/bin/true", &[] as &[&str], limits).unwrap_or_else(|e| {
            panic!(
                "qemu-user could not record /bin/true (scripts/setup.sh installs qemu-user): {e}"
            )
        });
        let config = PtConfig {
            psb_period: 1024,
            ..PtConfig::default()
        };
        let pt = PtEncoder::new(config).encode(&rec.execution).unwrap().bytes;
        Recorded {
            execution: rec.execution,
            pt,
        }
    })
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("hwtrace-perf-decode-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// How the AUX data is laid out.
struct Layout {
    /// Per-CPU queue on CPU 0 (the thread is known from ITRACE_START)
    /// instead of a per-thread queue.
    per_cpu: bool,
    /// Split the trace at this byte (a multiple of 8) into two AUXTRACE
    /// buffers, the second claiming this many bytes were lost before it.
    split: Option<(usize, u64)>,
}

/// Writes the code files and perf.data into `dir`; returns the perf.data
/// path and the code files (in the order of the execution's segments).
fn write_perf_data(dir: &Path, layout: &Layout) -> (PathBuf, Vec<PathBuf>) {
    let r = recorded();
    let mut attr = intel_pt_attr(8, 1 | 1 << 13);
    attr.sample_type &= !sample::TIME;
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&IntelPtInfo {
        pmu_type: 8,
        tsc_bit: 1 << 10,
        noretcomp_bit: 1 << 11,
        mtc_bit: Some(1 << 9),
        mtc_freq_bits: Some(0xf << 14),
        tsc_ctc_ratio_n: Some(0),
        tsc_ctc_ratio_d: Some(0),
        cyc_bit: Some(1 << 1),
        max_non_turbo_ratio: Some(0),
        per_cpu_mmaps: layout.per_cpu,
        ..IntelPtInfo::default()
    })
    .unwrap();
    let sid = SampleId {
        pid_tid: Some((PID, PID)),
        cpu: Some(0),
        identifier: Some(1),
        ..SampleId::default()
    };
    w.comm(PID, PID, "true", true, &sid).unwrap();
    let mut files = Vec::new();
    for seg in r.execution.memory().segments() {
        let path = dir.join(format!("code-{:x}.bin", seg.addr.0));
        std::fs::write(&path, &seg.bytes).unwrap();
        let len = seg.bytes.len() as u64;
        w.mmap2(
            2,
            PID,
            PID,
            seg.addr.0,
            len,
            0,
            5,
            2,
            path.to_str().unwrap(),
            &sid,
        )
        .unwrap();
        files.push(path);
    }
    w.itrace_start(PID, PID, &sid).unwrap();
    let (tid, cpu) = if layout.per_cpu {
        (u32::MAX, 0)
    } else {
        (PID, u32::MAX)
    };
    match layout.split {
        None => w.auxtrace(&r.pt, 0, 0, 0, tid, cpu).unwrap(),
        Some((at, lost)) => {
            w.auxtrace(&r.pt[..at], 0, 0, 0, tid, cpu).unwrap();
            w.auxtrace(&r.pt[at..], at as u64 + lost, 0, 0, tid, cpu)
                .unwrap();
        }
    }
    w.aux(0, r.pt.len() as u64, 0, &sid).unwrap();
    w.finished_round().unwrap();
    let f = FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        ..FeatureData::default()
    };
    let bytes = w.finish(&f).unwrap().into_inner();
    let file = dir.join("perf.data");
    std::fs::write(&file, bytes).unwrap();
    (file, files)
}

fn hwtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()
        .unwrap()
}

/// `(tid, cpu, ip)` of each `tid cpu ip` line.
fn decoded(out: &Output) -> Vec<(String, String, u64)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "not `tid cpu ip`: {l:?}");
            let ip = u64::from_str_radix(f[2], 16).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            (f[0].to_string(), f[1].to_string(), ip)
        })
        .collect()
}

fn executed() -> Vec<u64> {
    recorded().execution.insns().iter().map(|ip| ip.0).collect()
}

fn assert_same(what: &str, got: &[u64], want: &[u64]) {
    let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got == want,
        "{what}: {} instructions, {} executed; first difference at {first_diff:?}",
        got.len(),
        want.len()
    );
}

#[test]
fn decodes_exactly_the_executed_instructions_of_the_thread() {
    let dir = scratch("exact");
    let (file, _) = write_perf_data(
        &dir,
        &Layout {
            per_cpu: false,
            split: None,
        },
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let lines = decoded(&out);
    assert!(
        lines
            .iter()
            .all(|(tid, cpu, _)| *tid == PID.to_string() && cpu == "-")
    );
    let ips: Vec<u64> = lines.iter().map(|l| l.2).collect();
    assert_same("hwtrace perf decode", &ips, &executed());

    // --stats counts the same instructions, and says the settings.
    let out = hwtrace(&[
        "perf",
        "decode",
        "--stats",
        "--json",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["insns"], executed().len() as u64);
    assert_eq!(v["return_compression"], true);
    assert_eq!(v["tid"], PID);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_missing_file_is_named_with_what_it_cost_and_decoding_goes_on() {
    let dir = scratch("missing");
    let (file, code) = write_perf_data(
        &dir,
        &Layout {
            per_cpu: false,
            split: None,
        },
    );
    let want = executed();
    let segs = recorded().execution.memory().segments();
    // Remove the file of a segment whose code runs only in the first half
    // of the execution, so that there is code to decode after it.
    let last = *want.last().unwrap();
    let victim = segs
        .iter()
        .position(|s| {
            let inside = |ip: &u64| *ip >= s.addr.0 && *ip < s.end();
            let runs = want.iter().filter(|ip| inside(ip)).count();
            let last_run = want.iter().rposition(inside);
            runs > 10 && last_run.is_some_and(|i| i < want.len() / 2)
        })
        .expect("a segment to remove");
    std::fs::remove_file(&code[victim]).unwrap();
    let seg = &segs[victim];
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let name = code[victim].display().to_string();
    let line = stderr
        .lines()
        .find(|l| l.contains(&name) && l.contains("decoding stopped"))
        .unwrap_or_else(|| panic!("no report naming {name}: {stderr}"));
    assert!(line.contains("file not found"), "{line}");
    let stops: u64 = line
        .split("decoding stopped ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(stops > 0, "{line}");
    assert!(stderr.contains(&format!("{:#x}", seg.addr.0)), "{stderr}");

    // What was decoded is what ran, in order (a subsequence), nothing
    // inside the missing file, and it reaches the end of the execution.
    let ips: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert!(ips.iter().all(|ip| *ip < seg.addr.0 || *ip >= seg.end()));
    let mut it = want.iter();
    assert!(
        ips.iter().all(|ip| it.any(|w| w == ip)),
        "not a subsequence of the execution"
    );
    assert_eq!(
        ips.last(),
        Some(&last),
        "decoding did not go on to the end: {} of {} decoded, the last at {:?} in the execution; {stderr}",
        ips.len(),
        want.len(),
        ips.last().and_then(|l| want.iter().rposition(|w| w == l))
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_gap_between_aux_buffers_is_reported_with_offset_and_size() {
    let dir = scratch("gap");
    let pt_len = recorded().pt.len();
    let at = (pt_len / 2) & !7;
    let lost = 0x1000;
    let (file, _) = write_perf_data(
        &dir,
        &Layout {
            per_cpu: true,
            split: Some((at, lost)),
        },
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let expect = format!("lost {lost} bytes of trace at stream offset {at:#x}");
    assert!(stderr.contains(&expect), "no `{expect}` in: {stderr}");
    assert!(stderr.contains("cpu 0 tid -1"), "{stderr}");
    // Per-CPU queue: the thread comes from the sideband.
    let lines = decoded(&out);
    assert!(
        lines
            .iter()
            .all(|(tid, cpu, _)| *tid == PID.to_string() && cpu == "0")
    );
    let want = executed();
    let ips: Vec<u64> = lines.iter().map(|l| l.2).collect();
    let mut it = want.iter();
    assert!(
        ips.iter().all(|ip| it.any(|w| w == ip)),
        "not a subsequence of the execution"
    );
    assert!(
        ips.len() < want.len() && ips.len() > want.len() / 4,
        "{} of {}",
        ips.len(),
        want.len()
    );
    assert_eq!(
        ips.last(),
        want.last(),
        "decoding did not go on after the gap"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn perf_script_decodes_the_same_instructions() {
    let dir = scratch("perf");
    let (file, _) = write_perf_data(
        &dir,
        &Layout {
            per_cpu: false,
            split: None,
        },
    );
    let perf = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(&file)
        .args(["--itrace=i0ns", "-F", "ip"])
        .output()
        .unwrap_or_else(|e| panic!("`perf` cannot run (scripts/setup.sh installs it): {e}"));
    assert!(
        perf.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&perf.stderr)
    );
    let theirs: Vec<u64> = String::from_utf8_lossy(&perf.stdout)
        .lines()
        .map(|l| u64::from_str_radix(l.trim(), 16).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert!(!ours.is_empty());
    assert_same("perf script vs hwtrace perf decode", &theirs, &ours);
    std::fs::remove_dir_all(&dir).ok();
}
