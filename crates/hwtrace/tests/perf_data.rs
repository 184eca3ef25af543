//! `hwtrace record`, `hwtrace perf info` and `hwtrace perf dump-aux`, run as
//! the built binary.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hwtrace_packet::{ModeExec, Packet, TraceBuilder};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter, intel_pt_attr};
use hwtrace_perf::data::{IntelPtInfo, TscConversion};
use hwtrace_perf::pevent::SampleId;
use hwtrace_perf::pevent::record::aux_flag;

fn hwtrace_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the hwtrace binary runs")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-cli-perf-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn vendor() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("vendor_id"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default()
}

#[test]
fn record_without_intel_pt_fails_clearly_and_leaves_no_file() {
    if Path::new("/sys/bus/event_source/devices/intel_pt").exists() {
        eprintln!("skipped: this machine has Intel PT");
        return;
    }
    let dir = tmpdir("nopt");
    for args in [
        &["record", "--no-fallback", "--", "/bin/true"][..],
        &[
            "record",
            "--no-fallback",
            "--pt",
            "-o",
            "x.data",
            "--",
            "/bin/true",
        ],
    ] {
        let o = hwtrace_in(&dir, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("has no Intel PT"), "{e}");
        assert!(e.contains(&vendor()), "{e}");
        assert!(e.contains("hwtrace record --portable"), "{e}");
    }
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "no partial output: {left:?}");
    let o = hwtrace_in(
        &dir,
        &["record", "--no-fallback", "--bts", "--", "/bin/true"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("has no Intel BTS"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn record_lbr_without_lbr_fails_clearly() {
    if Path::new("/sys/bus/event_source/devices/cpu").exists() {
        eprintln!("skipped: this machine has a hardware PMU; LBR may work");
        return;
    }
    let dir = tmpdir("nolbr");
    let o = hwtrace_in(
        &dir,
        &[
            "record",
            "--no-fallback",
            "--lbr",
            "-j",
            "any_call",
            "--",
            "/bin/true",
        ],
    );
    let e = stderr(&o);
    if o.status.code() == Some(3) {
        eprintln!("skipped: not permitted here: {e}");
        return;
    }
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("no LBR") && e.contains(&vendor()) && e.contains("--portable"),
        "{e}"
    );
    assert!(!dir.join("perf.data").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn record_option_errors() {
    let dir = tmpdir("opts");
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "record",
                "--lbr",
                "--filter",
                "0x1000/0x10@/bin/true",
                "--",
                "/bin/true",
            ],
            "Intel PT only",
        ),
        (&["record", "--sideband-only"], "give a command"),
        (
            &["record", "--sideband-only", "-m", "lots", "--", "/bin/true"],
            "not a size",
        ),
        (
            &["record", "--lbr", "-j", "sideways", "--", "/bin/true"],
            "unknown branch filter `sideways`",
        ),
        (
            &["record", "--sideband-only", "--", "/nonexistent/prog"],
            "execv",
        ),
    ];
    for (args, want) in cases {
        let o = hwtrace_in(&dir, args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    assert!(!dir.join("perf.data").exists() && !dir.join("perf.data.hwtrace-partial").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sideband_capture_reads_back_with_perf_info() {
    let dir = tmpdir("sb");
    let o = hwtrace_in(&dir, &["record", "--sideband-only", "--", "/bin/true"]);
    if o.status.code() == Some(3) {
        eprintln!("skipped: not permitted here: {}", stderr(&o));
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("wrote perf.data"), "{}", stderr(&o));
    let info = hwtrace_in(&dir, &["perf", "info", "perf.data"]);
    assert!(info.status.success(), "{}", stderr(&info));
    let text = stdout(&info);
    assert!(
        text.contains("event 0: type software, config 0x9"),
        "{text}"
    );
    assert!(
        text.contains("COMM: 1") && text.contains("EXIT: 1"),
        "{text}"
    );
    assert!(text.contains("aux streams: 0"), "{text}");
    // The build ids we wrote are those perf lists (and name the program).
    let ours: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("build-id: "))
        .map(str::to_string)
        .collect();
    assert!(ours.iter().any(|l| l.ends_with("/true")), "{text}");
    if let Ok(p) = Command::new("perf")
        .current_dir(&dir)
        .args(["buildid-list", "-i", "perf.data"])
        .output()
    {
        let theirs: Vec<String> = String::from_utf8_lossy(&p.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(ours, theirs);
    }
    // perf itself agrees on the records.
    assert_counts_like_perf_report(&dir, "perf.data", &text);
    std::fs::remove_dir_all(&dir).ok();
}

/// Every record count `hwtrace perf info` printed (`text`) equals the one
/// `perf report -D` prints for `file` (Debian's linux-perf, installed by
/// scripts/setup.sh).
fn assert_counts_like_perf_report(dir: &Path, file: &str, text: &str) {
    let p = Command::new("perf")
        .current_dir(dir)
        .args(["report", "-D", "-f", "-i", file])
        .output()
        .expect("perf (Debian linux-perf, see scripts/setup.sh)");
    let report = String::from_utf8_lossy(&p.stdout);
    let mut compared = 0;
    for line in text.lines().skip_while(|l| *l != "records:").skip(1) {
        let Some((name, n)) = line.trim().split_once(": ") else {
            break;
        };
        let want = format!("{name} events:");
        let theirs = report
            .lines()
            .find(|l| l.trim_start().starts_with(&want))
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap_or_else(|| panic!("perf report -D lacks {name}:\n{report}"));
        assert_eq!(theirs, n, "{name}");
        compared += 1;
    }
    assert!(compared > 0, "no record counts in:\n{text}");
}

/// `perf record -z` puts the samples and the sideband inside zstd
/// COMPRESSED records: `perf info` counts what is inside, by type, as
/// `perf report -D` does.
#[test]
fn perf_info_counts_the_records_inside_zstd_compressed_files() {
    let dir = tmpdir("zstd");
    let rec = Command::new("perf")
        .current_dir(&dir)
        .args([
            "record",
            "-q",
            "-z",
            "-e",
            "cpu-clock",
            "-c",
            "10000",
            "-o",
            "z.data",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done",
        ])
        .output()
        .expect("perf (Debian linux-perf, see scripts/setup.sh)");
    assert!(rec.status.success(), "{}", stderr(&rec));
    let info = hwtrace_in(&dir, &["perf", "info", "z.data"]);
    assert!(info.status.success(), "{}", stderr(&info));
    let text = stdout(&info);
    for kind in ["COMPRESSED:", "SAMPLE:", "MMAP2:", "COMM:"] {
        assert!(
            text.lines().any(|l| l.trim().starts_with(kind)),
            "{kind} missing:\n{text}"
        );
    }
    assert_counts_like_perf_report(&dir, "z.data", &text);
    std::fs::remove_dir_all(&dir).ok();
}

/// A PT trace: PSB, MODE.Exec, PSBEND, TIP.PGE, TIP.PGD.
fn pt_bytes(ip: u64) -> Vec<u8> {
    let mut t = TraceBuilder::new();
    t.push(Packet::Psb).unwrap();
    t.push(Packet::ModeExec(ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    }))
    .unwrap();
    t.push(Packet::Psbend).unwrap();
    t.ip(Packet::TipPge, ip).unwrap();
    t.ip(Packet::TipPgd, ip + 0x20).unwrap();
    t.finish()
}

/// Two threads, the second with two buffers and 0x40 bytes lost between.
fn two_thread_file() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let attrs = [EventAttr {
        attr: intel_pt_attr(8, 1 | 1 << 10 | 1 << 13),
        ids: vec![3],
    }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&IntelPtInfo {
        pmu_type: 8,
        tsc: TscConversion {
            time_shift: 10,
            time_mult: 600,
            time_zero: 5,
            cap_user_time_zero: true,
        },
        tsc_bit: 1 << 10,
        filter: Some(b"filter 0x1000/0x100@/bin/true".to_vec()),
        ..IntelPtInfo::default()
    })
    .unwrap();
    let sid = |tid| SampleId {
        pid_tid: Some((100, tid)),
        time: Some(1),
        cpu: Some(0),
        identifier: Some(3),
        ..SampleId::default()
    };
    w.comm(100, 100, "prog", true, &sid(100)).unwrap();
    w.comm(100, 101, "prog", false, &sid(101)).unwrap();
    let a = pt_bytes(0x401000);
    let b1 = pt_bytes(0x402000);
    let b2 = pt_bytes(0x403000);
    w.auxtrace(&a, 0, 0, 0, 100, u32::MAX).unwrap();
    w.auxtrace(&b1, 0, 0, 1, 101, u32::MAX).unwrap();
    let next = (b1.len() as u64).next_multiple_of(8) + 0x40;
    w.aux(0, 0x40, aux_flag::TRUNCATED, &sid(101)).unwrap();
    w.auxtrace(&b2, next, 0, 1, 101, u32::MAX).unwrap();
    let bytes = w
        .finish(&FeatureData {
            arch: Some("x86_64".into()),
            nrcpus: Some((8, 4)),
            ..FeatureData::default()
        })
        .unwrap()
        .into_inner();
    let mut want101 = b1.clone();
    want101.resize(b1.len().next_multiple_of(8), 0);
    want101.extend_from_slice(&b2);
    want101.resize(want101.len().next_multiple_of(8), 0);
    let mut want100 = a.clone();
    want100.resize(a.len().next_multiple_of(8), 0);
    (bytes, want100, want101)
}

#[test]
fn perf_info_and_dump_aux_on_a_two_thread_pt_file() {
    let dir = tmpdir("pt");
    let (bytes, want100, want101) = two_thread_file();
    std::fs::write(dir.join("pt.data"), &bytes).unwrap();
    let info = hwtrace_in(&dir, &["perf", "info", "pt.data"]);
    assert!(info.status.success(), "{}", stderr(&info));
    let text = stdout(&info);
    for want in [
        "event 0: type intel_pt (pmu 8), config 0x2401",
        "auxtrace: intel_pt (pmu 8)",
        "time_shift 10, time_mult 600, time_zero 5, cap_user_time_zero true",
        "per-thread mmaps, snapshot false",
        "filter: filter 0x1000/0x100@/bin/true",
        "nrcpus: 4 online, 8 available",
        "aux streams: 2",
        &format!(
            "cpu -1 tid 100: {} bytes in 1 buffers, 0 gaps",
            want100.len()
        ),
        &format!(
            "cpu -1 tid 101: {} bytes in 2 buffers, 1 gaps (64 bytes lost)",
            want101.len()
        ),
        "lost: AUX record at",
        "AUXTRACE: 3",
        "COMM: 2",
    ] {
        assert!(text.contains(want), "missing `{want}` in:\n{text}");
    }

    let o = hwtrace_in(
        &dir,
        &[
            "perf", "dump-aux", "pt.data", "--tid", "101", "-o", "t101.pt",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("64 bytes lost before output offset"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(dir.join("t101.pt")).unwrap(), want101);
    let o = hwtrace_in(
        &dir,
        &[
            "perf", "dump-aux", "pt.data", "--tid", "100", "-o", "t100.pt",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(dir.join("t100.pt")).unwrap(), want100);
    // The extracted stream is real PT: hwtrace dump decodes it.
    let d = hwtrace_in(&dir, &["dump", "t100.pt"]);
    assert!(d.status.success(), "{}", stderr(&d));
    assert!(stdout(&d).contains("401000"), "{}", stdout(&d));

    // Ambiguous or missing selections are refused with the choices listed.
    let o = hwtrace_in(&dir, &["perf", "dump-aux", "pt.data", "-o", "x.pt"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--tid 100") && stderr(&o).contains("--tid 101"),
        "{}",
        stderr(&o)
    );
    let o = hwtrace_in(
        &dir,
        &["perf", "dump-aux", "pt.data", "--cpu", "3", "-o", "x.pt"],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no AUX stream"), "{}", stderr(&o));

    // A damaged file: error with its offset, non-zero exit.
    let mut bad = bytes.clone();
    bad[..8].copy_from_slice(b"NOTPERF!");
    std::fs::write(dir.join("bad.data"), &bad).unwrap();
    let o = hwtrace_in(&dir, &["perf", "info", "bad.data"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("offset 0x0: bad magic"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A fake sysfs with an Intel PT PMU (of a type this kernel does not have)
/// and a fake procfs with the given paranoid level and no capabilities.
fn fake_intel(dir: &Path, paranoid: i32, ranges: u32) -> (String, String) {
    let pt = dir.join("sys/bus/event_source/devices/intel_pt");
    std::fs::create_dir_all(pt.join("format")).unwrap();
    std::fs::create_dir_all(pt.join("caps")).unwrap();
    std::fs::write(pt.join("type"), "4093\n").unwrap();
    for (t, f) in [
        ("pt", "config:0"),
        ("tsc", "config:10"),
        ("branch", "config:13"),
        ("noretcomp", "config:11"),
    ] {
        std::fs::write(pt.join("format").join(t), f).unwrap();
    }
    std::fs::write(pt.join("caps/num_address_ranges"), format!("{ranges}\n")).unwrap();
    let proc_ = dir.join("proc");
    std::fs::create_dir_all(proc_.join("sys/kernel")).unwrap();
    std::fs::create_dir_all(proc_.join("self")).unwrap();
    std::fs::write(
        proc_.join("sys/kernel/perf_event_paranoid"),
        format!("{paranoid}\n"),
    )
    .unwrap();
    std::fs::write(proc_.join("self/status"), "CapEff:\t0000000000000000\n").unwrap();
    std::fs::write(
        proc_.join("cpuinfo"),
        "vendor_id\t: GenuineIntel\nmodel name\t: Fake Lake\n",
    )
    .unwrap();
    (
        format!("--sysfs-root={}", dir.join("sys").display()),
        format!("--procfs-root={}", proc_.display()),
    )
}

/// Injected failures on a machine that "has" Intel PT: each prints its
/// message, exits non-zero and leaves no file.
#[test]
fn injected_capture_failures_exit_nonzero_without_a_file() {
    let dir = tmpdir("inject");
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let run = |paranoid, ranges, extra: &[&str]| {
        let (sys, proc_) = fake_intel(&dir, paranoid, ranges);
        let mut args = vec!["record", sys.as_str(), proc_.as_str()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/bin/true"]);
        hwtrace_in(&work, &args)
    };
    let cases: Vec<(Output, u8, &str)> = vec![
        // Debian's paranoid 3 without CAP_PERFMON.
        (
            run(3, 2, &[]),
            3,
            "perf_event_paranoid is 3, tracing your own process needs 2",
        ),
        (run(2, 2, &["--kernel"]), 3, "kernel tracing needs 1"),
        // sysfs lists the PMU, this kernel has no such type: perf_event_open fails.
        (
            run(2, 2, &[]),
            1,
            "the kernel rejected the Intel PT event (PMU type 4093",
        ),
        (
            run(2, 0, &["--filter", "0x1000/0x100@/usr/bin/true"]),
            1,
            "num_address_ranges = 0",
        ),
        (
            run(2, 2, &["--terms", "pt,cyc"]),
            1,
            "has no config term `cyc`",
        ),
        (run(2, 2, &["-m", "12K"]), 1, "power-of-two"),
    ];
    for (o, code, want) in cases {
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(i32::from(code)), "{e}");
        assert!(e.contains(want), "want `{want}` in: {e}");
        let left: Vec<_> = std::fs::read_dir(&work).unwrap().collect();
        assert!(left.is_empty(), "no file left after `{want}`: {left:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// 256 MiB of AUX data: `perf info` maps the file and touches only record
/// headers, so its peak memory stays far below the file size. Measured with
/// `/usr/bin/time` (Debian's `time`, which scripts/setup.sh installs).
#[test]
fn perf_info_memory_stays_bounded_on_a_big_file() {
    assert!(
        Path::new("/usr/bin/time").exists(),
        "/usr/bin/time is not installed (scripts/setup.sh installs it)"
    );
    let dir = tmpdir("big");
    let path = dir.join("big.data");
    {
        let attrs = [EventAttr {
            attr: intel_pt_attr(8, 1),
            ids: vec![1],
        }];
        let f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut w = PerfDataWriter::new(f, &attrs).unwrap();
        w.auxtrace_info_pt(&IntelPtInfo {
            pmu_type: 8,
            per_cpu_mmaps: true,
            ..IntelPtInfo::default()
        })
        .unwrap();
        let chunk = vec![0u8; 4 << 20];
        for i in 0..64u64 {
            w.auxtrace(
                &chunk,
                i * (4 << 20),
                0,
                (i % 2) as u32,
                u32::MAX,
                (i % 2) as u32,
            )
            .unwrap();
        }
        w.finish(&FeatureData::default()).unwrap();
    }
    let o = Command::new("/usr/bin/time")
        .args([
            "-f",
            "maxrss_kb=%M",
            env!("CARGO_BIN_EXE_hwtrace"),
            "perf",
            "info",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("cpu 0 tid -1: 134217728 bytes in 32 buffers"),
        "{text}"
    );
    assert!(
        text.contains("cpu 1 tid -1: 134217728 bytes in 32 buffers"),
        "{text}"
    );
    let rss: u64 = stderr(&o)
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(rss < 64 * 1024, "peak RSS {rss} kB for a 256 MiB file");
    std::fs::remove_dir_all(&dir).ok();
}
