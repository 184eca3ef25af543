//! `hwtrace record --portable` and the automatic fallback, run as the built
//! binary: the perf.data it writes is read back by `hwtrace perf info` and
//! decoded by Debian's `perf script`, whose instructions and branches must
//! be exactly those of the program's execution, recorded again here with
//! hwtrace-sim's qemu recorder. perf and qemu-user are installed by
//! scripts/setup.sh: without them these tests fail.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hwtrace_perf::data::{PerfData, PerfRecord};
use hwtrace_perf::pevent::{Body, Record};
use hwtrace_sim::{BranchKind, Execution, Limits, branches};

fn hwtrace(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the hwtrace binary runs")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "hwtrace-record-portable-{tag}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn require(tool: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "`{tool}` is not installed (scripts/setup.sh installs it)"
    );
}

/// The program's execution, recorded here independently of hwtrace.
fn execution(program: &str, args: &[&str]) -> Execution {
    let limits = Limits {
        max_instructions: None,
        timeout: Some(std::time::Duration::from_secs(60)),
    };
    Execution::record_qemu(program, args, limits)
        .unwrap_or_else(|e| panic!("qemu-user could not record {program}: {e}"))
        .execution
}

fn perf_script(file: &Path, extra: &[&str]) -> String {
    let out = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(file)
        .args(extra)
        .output()
        .expect("perf runs");
    assert!(
        out.status.success(),
        "perf script {extra:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The number in "(N instructions recorded with qemu-user" on stderr.
fn reported_instructions(stderr: &str) -> usize {
    let (before, _) = stderr
        .split_once(" instructions recorded with qemu-user")
        .unwrap_or_else(|| panic!("no instruction count in: {stderr}"));
    before
        .rsplit('(')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad instruction count in: {stderr}"))
}

/// `hwtrace perf info` sees one per-thread AUX stream and the sideband of a
/// started command; the MMAP2 records cover every executed instruction.
fn check_info_and_sideband(
    dir: &Path,
    file: &Path,
    execution: &Execution,
    program: &str,
) -> Vec<(u64, u64, String)> {
    let info = hwtrace(dir, &["perf", "info", file.to_str().unwrap()]);
    let out = text(&info.stdout);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert!(out.contains("type intel_pt"), "{out}");
    assert!(out.contains("aux streams: 1\n"), "{out}");
    assert!(out.contains("  cpu -1 tid "), "per-thread stream: {out}");
    for rec in [
        "AUXTRACE_INFO: 1",
        "AUXTRACE: 1",
        "AUX: 1",
        "COMM: 1",
        "ITRACE_START: 1",
    ] {
        assert!(out.contains(rec), "{rec} missing: {out}");
    }
    let bytes = std::fs::read(file).unwrap();
    let data = PerfData::parse(&bytes).unwrap();
    let mut maps = Vec::new();
    for r in data.records() {
        let item = r.unwrap();
        if let PerfRecord::Event(Record {
            body: Body::Mmap2(m),
            ..
        }) = item.record
        {
            maps.push((
                m.addr,
                m.len,
                String::from_utf8_lossy(m.filename).into_owned(),
            ));
        }
    }
    let program = std::fs::canonicalize(program).unwrap();
    assert!(
        maps.iter()
            .any(|(_, _, n)| std::fs::canonicalize(n).is_ok_and(|p| p == program)),
        "no MMAP2 of {}: {maps:?}",
        program.display()
    );
    assert!(
        maps.iter().any(|(_, _, n)| n.contains("libc.so")),
        "no MMAP2 of libc: {maps:?}"
    );
    let uncovered = execution
        .insns()
        .iter()
        .filter(|ip| !maps.iter().any(|(a, l, _)| *a <= ip.0 && ip.0 - a < *l))
        .count();
    assert_eq!(
        uncovered, 0,
        "executed instructions outside every MMAP2: {maps:?}"
    );
    maps
}

/// The first executable PT_LOAD of an ELF64 file: (p_vaddr, p_memsz).
fn text_segment(path: &str) -> (u64, u64) {
    let b = std::fs::read(path).unwrap();
    let u = |at: usize, n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&b[at..at + n]);
        u64::from_le_bytes(v)
    };
    let (phoff, phentsize, phnum) = (u(32, 8) as usize, u(54, 2) as usize, u(56, 2) as usize);
    (0..phnum)
        .map(|i| phoff + i * phentsize)
        .find(|&ph| u(ph, 4) == 1 && u(ph + 4, 4) & 1 != 0)
        .map(|ph| (u(ph + 16, 8), u(ph + 40, 8)))
        .expect("an executable PT_LOAD")
}

/// `FROM => TO` pairs of `perf script --itrace=b`, without the ends of
/// traced stretches (0 on one side: system calls leave user space).
fn perf_branches(file: &Path) -> Vec<(u64, u64)> {
    // `comm pid 1 branches:u: FROM sym (dso) => TO sym (dso)`
    perf_script(file, &["--itrace=b"])
        .lines()
        .filter_map(|l| {
            let (from, to) = l.split_once("=>")?;
            let from = from.split_once("branches:")?.1.split_once(':')?.1;
            let hex = |s: &str| u64::from_str_radix(s.split_whitespace().next()?, 16).ok();
            Some((hex(from)?, hex(to)?))
        })
        .filter(|&(f, t)| f != 0 && t != 0)
        .collect()
}

fn decoded_ips(file: &Path) -> Vec<u64> {
    perf_script(file, &["--itrace=i0ns", "-F", "ip"])
        .lines()
        .filter_map(|l| u64::from_str_radix(l.trim(), 16).ok())
        .collect()
}

#[test]
fn portable_pt_capture_decodes_in_perf_to_the_executed_instructions() {
    require("perf");
    require("qemu-x86_64");
    let dir = tmpdir("pt");
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "-o",
            "echo.data",
            "--",
            "/bin/echo",
            "hi",
        ],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        text(&out.stdout),
        "hi\n",
        "the program's output is passed on"
    );
    let file = dir.join("echo.data");
    assert!(!dir.join("echo.data.hwtrace-partial").exists());
    let executed = execution("/bin/echo", &["hi"]);
    let maps = check_info_and_sideband(&dir, &file, &executed, "/bin/echo");

    let decoded = decoded_ips(&file);
    assert_eq!(
        decoded.len(),
        reported_instructions(&stderr),
        "perf decodes as many instructions as hwtrace recorded"
    );
    let expected: Vec<u64> = executed.insns().iter().map(|ip| ip.0).collect();
    let first_diff = decoded.iter().zip(&expected).position(|(a, b)| a != b);
    assert!(
        decoded == expected,
        "perf decoded {} instructions, qemu executed {}; first difference at {first_diff:?}",
        decoded.len(),
        expected.len()
    );
    let taken: Vec<(u64, u64)> = branches(&executed)
        .unwrap()
        .iter()
        .map(|b| (b.from.0, b.to.0))
        .collect();
    assert!(
        perf_branches(&file) == taken,
        "perf's branches are the taken branches"
    );

    // --filter ADDR/SIZE@FILE: only echo's own code is traced.
    let (vaddr, size) = text_segment("/bin/echo");
    let echo = std::fs::canonicalize("/bin/echo").unwrap();
    let (start, _, _) = maps
        .iter()
        .find(|(_, _, n)| std::fs::canonicalize(n).is_ok_and(|p| p == echo))
        .unwrap();
    let range = start + vaddr % 4096..start + vaddr % 4096 + size;
    let spec = format!("{vaddr:#x}/{size:#x}@/bin/echo");
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "--filter",
            &spec,
            "-o",
            "filter.data",
            "--",
            "/bin/echo",
            "hi",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let decoded = decoded_ips(&dir.join("filter.data"));
    let inside: Vec<u64> = expected
        .iter()
        .copied()
        .filter(|ip| range.contains(ip))
        .collect();
    assert!(!inside.is_empty() && inside.len() < expected.len());
    assert_eq!(decoded, inside, "perf decodes just the filtered range");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_intel_pt_record_falls_back_to_the_portable_capture() {
    require("perf");
    require("qemu-x86_64");
    let dir = tmpdir("fallback");
    // An empty sysfs: no intel_pt PMU, whatever this machine has.
    let sysfs = dir.join("sys");
    std::fs::create_dir_all(&sysfs).unwrap();
    let sysfs = sysfs.to_str().unwrap();

    let out = hwtrace(
        &dir,
        &[
            "record",
            "--no-fallback",
            "--sysfs-root",
            sysfs,
            "-o",
            "no.data",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(!dir.join("no.data").exists());

    let out = hwtrace(
        &dir,
        &[
            "record",
            "--sysfs-root",
            sysfs,
            "-o",
            "true.data",
            "--",
            "/bin/true",
        ],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no Intel PT on this ")
            && stderr.contains(": recording with qemu-user instead (--portable)"),
        "{stderr}"
    );
    let file = dir.join("true.data");
    let executed = execution("/bin/true", &[]);
    check_info_and_sideband(&dir, &file, &executed, "/bin/true");
    let decoded = decoded_ips(&file);
    assert_eq!(decoded.len(), reported_instructions(&stderr));
    assert_eq!(
        decoded.len(),
        executed.len(),
        "perf's instructions vs qemu's"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn portable_lbr_samples_show_branch_stacks_in_perf() {
    require("perf");
    require("qemu-x86_64");
    let dir = tmpdir("lbr");
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "--lbr",
            "-o",
            "lbr.data",
            "--",
            "/bin/true",
        ],
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let samples: usize = stderr
        .split_once(" LBR samples")
        .and_then(|(b, _)| b.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no sample count: {stderr}"));
    let executed = execution("/bin/true", &[]);
    assert_eq!(samples, executed.len() / 10_007, "one sample per period");
    let taken: HashSet<(u64, u64)> = branches(&executed)
        .unwrap()
        .iter()
        .map(|b| (b.from.0, b.to.0))
        .collect();

    let script = perf_script(&dir.join("lbr.data"), &["-F", "ip,brstack"]);
    let lines: Vec<&str> = script.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), samples, "{script}");
    let mut entries = 0;
    for line in &lines {
        // `IP FROM/TO/P/-/-/0/ ...`
        for e in line.split_whitespace().skip(1) {
            let mut f = e.split('/');
            let hex = |s: Option<&str>| {
                u64::from_str_radix(s.unwrap().trim_start_matches("0x"), 16).unwrap()
            };
            let (from, to) = (hex(f.next()), hex(f.next()));
            assert!(
                taken.contains(&(from, to)),
                "{from:#x} -> {to:#x} is not a branch the program took"
            );
            entries += 1;
        }
    }
    assert_eq!(
        entries,
        samples * 32,
        "Skylake's 32 LBRs, full after the first period"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn portable_capture_refuses_what_qemu_user_cannot_see() {
    let dir = tmpdir("refuse");
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "--kernel",
            "-o",
            "k.data",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("user space only"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("k.data").exists());
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "-o",
            "n.data",
            "--",
            "/no/such/program",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("/no/such/program does not exist"),
        "{}",
        text(&out.stderr)
    );
    let out = hwtrace(
        &dir,
        &["record", "--portable", "--snapshot", "--", "/bin/true"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--snapshot applies to the perf_event_open capture"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn portable_bts_capture_decodes_in_perf_to_the_taken_branches() {
    require("perf");
    require("qemu-x86_64");
    let dir = tmpdir("bts");
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "--bts",
            "-o",
            "bts.data",
            "--",
            "/bin/true",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let file = dir.join("bts.data");
    let info = text(&hwtrace(&dir, &["perf", "info", "bts.data"]).stdout);
    assert!(
        info.contains("type intel_bts") && info.contains("aux streams: 1\n"),
        "{info}"
    );
    let executed = execution("/bin/true", &[]);
    let taken: Vec<(u64, u64)> = branches(&executed)
        .unwrap()
        .iter()
        .map(|b| (b.from.0, b.to.0))
        .collect();
    let bts = perf_branches(&file);
    // perf's intel-bts decoder (`intel_bts_process_buffer` in
    // tools/perf/util/intel-bts.c) loops `for (; sz > bsz; ...)`: while
    // more than one record is left, so it never reports a buffer's last
    // record.
    assert!(
        !taken.is_empty() && bts == taken[..taken.len() - 1],
        "perf reported {} BTS branches, the program took {}",
        bts.len(),
        taken.len()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn portable_lbr_branch_filter_keeps_only_calls() {
    require("perf");
    require("qemu-x86_64");
    let dir = tmpdir("lbr-calls");
    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "--lbr",
            "-j",
            "any_call",
            "-o",
            "calls.data",
            "--",
            "/bin/true",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let executed = execution("/bin/true", &[]);
    let calls: HashSet<(u64, u64)> = branches(&executed)
        .unwrap()
        .iter()
        .filter(|b| matches!(b.kind, BranchKind::NearRelCall | BranchKind::NearIndCall))
        .map(|b| (b.from.0, b.to.0))
        .collect();
    let script = perf_script(&dir.join("calls.data"), &["-F", "ip,brstack"]);
    let mut entries = 0;
    for e in script.lines().flat_map(|l| l.split_whitespace().skip(1)) {
        let mut f = e.split('/');
        let mut hex =
            || u64::from_str_radix(f.next().unwrap().trim_start_matches("0x"), 16).unwrap();
        let (from, to) = (hex(), hex());
        assert!(
            calls.contains(&(from, to)),
            "{from:#x} -> {to:#x} is not a call"
        );
        entries += 1;
    }
    assert!(entries > 0, "{script}");

    let out = hwtrace(
        &dir,
        &[
            "record",
            "--portable",
            "--lbr",
            "-j",
            "in_tx",
            "--",
            "/bin/true",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("-j `in_tx`"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).ok();
}
