//! `hwtrace perf decode` end to end on a real execution: `/bin/true`
//! recorded with qemu-user (hwtrace-sim), encoded as the Intel PT a CPU
//! would write, wrapped in a perf.data by hwtrace-perf's writer.
//!
//! The MMAP2 records name the real files: `/usr/bin/true`, its ELF
//! interpreter (PT_INTERP) and the libraries `ldd` lists, each mapped where qemu loaded it. The load bias is found by
//! matching the code the execution ran against each file's executable
//! PT_LOAD segment, page by page (qemu-user's trace log does not state
//! where it put the program and the interpreter, which it loads itself).
//! The files' real GNU build ids go in the HEADER_BUILD_ID feature. Code the
//! execution ran outside every such file (none is expected for /bin/true)
//! would be written to a file of its own and mapped at its address, and the
//! test says how much.
//!
//! Debian's `perf` and `qemu-x86_64` are required (scripts/setup.sh
//! installs them): their absence fails the tests.

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use hwtrace_perf::data::IntelPtInfo;
use hwtrace_perf::data::TscConversion;
use hwtrace_perf::data::attr::{flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{
    FeatureData, PerfDataWriter, PipeWriter, RecordWriter, intel_pt_attr,
};
use hwtrace_perf::data::{PerfData, PerfRecord};
use hwtrace_perf::pevent::SampleId;
use hwtrace_perf::pevent::record::{Body, aux_flag, record_type};
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder, QemuRecorder, TscModel};

const PID: u32 = 4242;

struct Recorded {
    execution: Execution,
    pt: Vec<u8>,
    /// The real files and where they were mapped.
    maps: Vec<FileMap>,
    /// Execution segments (by index) no real file holds.
    uncovered: Vec<usize>,
}

/// An executable PT_LOAD segment of a real file, placed at `bias`.
#[derive(Clone, Debug)]
struct FileMap {
    path: String,
    /// Page-aligned start address, length and file offset.
    addr: u64,
    len: u64,
    pgoff: u64,
}

const PAGE: u64 = 0x1000;

/// `(p_type, p_flags, p_offset, p_vaddr, p_filesz)` of each program header.
fn program_headers(elf: &[u8]) -> Vec<(u32, u32, u64, u64, u64)> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    assert_eq!(&elf[..4], b"\x7fELF");
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36) as usize, u16_at(0x38));
    (0..usize::from(phnum))
        .map(|i| {
            let h = phoff + i * phentsize;
            (
                u32_at(h),
                u32_at(h + 4),
                u64_at(h + 8),
                u64_at(h + 16),
                u64_at(h + 32),
            )
        })
        .collect()
}

/// Where the execution's code shows `path`'s executable segment was
/// loaded: the page-aligned bias at which every execution segment inside
/// the segment's range matches the file's bytes (at least one must).
fn place(path: &str, execution: &Execution) -> Option<FileMap> {
    let elf = std::fs::read(path).ok()?;
    let segs = execution.memory().segments();
    for (kind, flags, off, vaddr, filesz) in program_headers(&elf) {
        if kind != 1 || flags & 1 == 0 {
            continue;
        }
        let file_at = |addr: u64, bias: u64, len: usize| {
            let v = addr.checked_sub(bias)?;
            let rel = v.checked_sub(vaddr).filter(|r| r + len as u64 <= filesz)?;
            elf.get((off + rel) as usize..(off + rel) as usize + len)
        };
        for s in segs {
            let a = s.addr.0;
            for page in 0..=filesz / PAGE + 1 {
                let v = (vaddr & !(PAGE - 1)) + page * PAGE + (a & (PAGE - 1));
                let Some(bias) = a.checked_sub(v) else {
                    continue;
                };
                if file_at(a, bias, s.bytes.len()) != Some(&s.bytes[..]) {
                    continue;
                }
                let (lo, hi) = (vaddr + bias, vaddr + bias + filesz);
                let all = segs
                    .iter()
                    .filter(|t| t.addr.0 >= lo && t.addr.0 < hi)
                    .all(|t| file_at(t.addr.0, bias, t.bytes.len()) == Some(&t.bytes[..]));
                if all {
                    let addr = lo & !(PAGE - 1);
                    return Some(FileMap {
                        path: path.to_string(),
                        addr,
                        len: (hi - addr).next_multiple_of(PAGE),
                        pgoff: off & !(PAGE - 1),
                    });
                }
            }
        }
    }
    None
}

/// `program` (`/usr/bin/true`), its interpreter and the libraries `ldd`
/// says it loads.
fn candidate_files(program: &str) -> Vec<String> {
    let exe = std::fs::canonicalize(program).unwrap();
    let elf = std::fs::read(&exe).unwrap();
    let mut files = vec![exe.display().to_string()];
    for (kind, _, off, _, filesz) in program_headers(&elf) {
        if kind == 3 {
            let interp = &elf[off as usize..(off + filesz) as usize];
            let interp = String::from_utf8_lossy(interp.strip_suffix(b"\0").unwrap_or(interp));
            files.push(interp.into_owned());
        }
    }
    let ldd = Command::new("ldd").arg(&exe).output().expect("ldd runs");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some((_, rest)) = line.split_once("=> ")
            && let Some(path) = rest.split_whitespace().next()
        {
            files.push(path.to_string());
        }
    }
    let mut real: Vec<String> = files
        .iter()
        .filter_map(|f| std::fs::canonicalize(f).ok())
        .map(|p| p.display().to_string())
        .collect();
    real.dedup();
    real
}

/// `/bin/true` recorded once for every test.
fn recorded() -> &'static Recorded {
    static R: OnceLock<Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let limits = Limits {
            max_instructions: None,
            timeout: Some(std::time::Duration::from_secs(120)),
        };
        let rec = QemuRecorder::new()
            .limits(limits)
            .record("/bin/true", &[] as &[&str])
            .unwrap_or_else(|e| {
                panic!("qemu-user could not record /bin/true (scripts/setup.sh installs qemu-user): {e}")
            });
        let config = PtConfig {
            psb_period: 1024,
            ..PtConfig::default()
        };
        let pt = PtEncoder::new(config).encode(&rec.execution).unwrap().bytes;
        let maps: Vec<FileMap> = candidate_files("/bin/true")
            .iter()
            .filter_map(|f| place(f, &rec.execution))
            .collect();
        let uncovered = (0..rec.execution.memory().segments().len())
            .filter(|&i| {
                let a = rec.execution.memory().segments()[i].addr.0;
                !maps.iter().any(|m| a >= m.addr && a < m.addr + m.len)
            })
            .collect();
        Recorded {
            execution: rec.execution,
            pt,
            maps,
            uncovered,
        }
    })
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-decode-{name}-{}", std::process::id()));
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
    /// Record this (wrong) build id for the file whose path ends so.
    wrong_build_id: Option<&'static str>,
    /// TSC packets (the [`TSC`] model) and SWITCH records on CPU 0: the
    /// thread [`PID`] switched in before the trace, the thread [`PID`]` + 1`
    /// of the same process at the time of this instruction.
    switch_at: Option<usize>,
    /// Name the mapping of the file whose path ends so `[vdso]`.
    vdso_for: Option<&'static str>,
    /// A LOST record (7 events) and the AUX record flagged TRUNCATED.
    losses: bool,
    /// Pipe format instead of file format.
    pipe: bool,
}

/// TSC of the first instruction and ticks per instruction; perf time is
/// the TSC (the conversion written is the identity).
const TSC: TscModel = TscModel {
    start: 1_000_000,
    ticks_per_insn: 10,
};

/// Writes perf.data (and the code no real file holds) into `dir`; returns
/// the perf.data path.
fn write_perf_data(dir: &Path, layout: &Layout) -> PathBuf {
    // `pt,branch`, and `tsc` for the timed layout (`hwtrace record`'s
    // default terms): perf then decodes with timestamps.
    let mut attr = intel_pt_attr(8, 1 | 1 << 13);
    if layout.switch_at.is_none() {
        attr.sample_type &= !sample::TIME;
    } else {
        attr.config |= 1 << 10;
    }
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let files = recorded()
        .maps
        .iter()
        .map(|m| m.path.as_bytes().to_vec())
        .collect();
    let mut build_ids = hwtrace_perf::capture::session::build_ids(&files);
    for (_, id, name) in &mut build_ids {
        if layout.wrong_build_id.is_some_and(|end| name.ends_with(end)) {
            id.iter_mut().for_each(|b| *b ^= 0xff);
        }
    }
    let f = FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        build_ids,
        ..FeatureData::default()
    };
    let bytes = if layout.pipe {
        let mut w = PipeWriter::new(Vec::new(), &attrs, &f).unwrap();
        write_records(&mut w, dir, layout);
        w.finish().unwrap()
    } else {
        let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
        write_records(&mut w, dir, layout);
        w.finish(&f).unwrap().into_inner()
    };
    let file = dir.join("perf.data");
    std::fs::write(&file, bytes).unwrap();
    file
}

/// The records of the perf.data: AUXTRACE_INFO, COMM, MMAP2s, switches,
/// the trace.
fn write_records(w: &mut impl RecordWriter, dir: &Path, layout: &Layout) {
    let r = recorded();
    w.auxtrace_info_pt(&IntelPtInfo {
        per_cpu_mmaps: layout.per_cpu,
        tsc: TscConversion {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
            cap_user_time_zero: true,
        },
        ..IntelPtInfo::linux_pmu(8)
    })
    .unwrap();
    let sid = pid_on_cpu0();
    w.comm(PID, PID, "true", true, &sid).unwrap();
    for m in &r.maps {
        let name = match layout.vdso_for {
            Some(end) if m.path.ends_with(end) => "[vdso]",
            _ => &m.path,
        };
        w.mmap2(2, PID, PID, m.addr, m.len, m.pgoff, 5, 2, name, &sid)
            .unwrap();
    }
    for &i in &r.uncovered {
        let seg = &r.execution.memory().segments()[i];
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
    }
    w.itrace_start(PID, PID, &sid).unwrap();
    let timed_pt;
    let pt = match layout.switch_at {
        None => &r.pt,
        Some(at) => {
            for (tid, time) in [(PID, TSC.start - 1), (PID + 1, TSC.start + 10 * at as u64)] {
                let sid = SampleId {
                    pid_tid: Some((PID, tid)),
                    time: Some(time),
                    ..sid
                };
                w.write_event(record_type::SWITCH, 0, &[], &sid).unwrap();
            }
            let config = PtConfig {
                psb_period: 1024,
                tsc: Some(TSC),
                ..PtConfig::default()
            };
            timed_pt = PtEncoder::new(config).encode(&r.execution).unwrap().bytes;
            &timed_pt
        }
    };
    let (tid, cpu) = if layout.per_cpu {
        (u32::MAX, 0)
    } else {
        (PID, u32::MAX)
    };
    // The AUX data read when the program ended, as `hwtrace record` (and
    // perf) stamp it: the TSC then (timed layout; 0 leaves perf's timed
    // decoding nothing to start from, and perf 6.1 dies on it).
    let reference = match layout.switch_at {
        Some(_) => TSC.start + TSC.ticks_per_insn * r.execution.len() as u64,
        None => 0,
    };
    match layout.split {
        None => w.auxtrace(pt, 0, reference, 0, tid, cpu).unwrap(),
        Some((at, lost)) => {
            w.auxtrace(&pt[..at], 0, reference, 0, tid, cpu).unwrap();
            w.auxtrace(&pt[at..], at as u64 + lost, reference, 0, tid, cpu)
                .unwrap();
        }
    }
    let flags = if layout.losses {
        let mut lost = 1u64.to_le_bytes().to_vec();
        lost.extend_from_slice(&7u64.to_le_bytes());
        w.write_event(record_type::LOST, 0, &lost, &sid).unwrap();
        aux_flag::TRUNCATED
    } else {
        0
    };
    w.aux(0, pt.len() as u64, flags, &sid).unwrap();
    w.finished_round().unwrap();
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

const PLAIN: Layout = Layout {
    per_cpu: false,
    split: None,
    wrong_build_id: None,
    switch_at: None,
    vdso_for: None,
    losses: false,
    pipe: false,
};

#[test]
fn the_real_files_hold_all_the_code_that_ran() {
    let r = recorded();
    let names: Vec<&str> = r.maps.iter().map(|m| m.path.as_str()).collect();
    for want in ["/true", "/ld-linux-x86-64.so.2", "/libc.so.6"] {
        assert!(
            names.iter().any(|n| n.ends_with(want)),
            "{want} not placed: {:?}",
            r.maps
        );
    }
    assert!(
        r.uncovered.is_empty(),
        "{} code segments outside every real file",
        r.uncovered.len()
    );
}

#[test]
fn decodes_exactly_the_executed_instructions_of_the_thread() {
    let dir = scratch("exact");
    let file = write_perf_data(&dir, &PLAIN);
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

    // The same recording in pipe format.
    let file = write_perf_data(
        &dir,
        &Layout {
            pipe: true,
            ..PLAIN
        },
    );
    assert_eq!(
        &std::fs::read(&file).unwrap()[8..16],
        &16u64.to_le_bytes(),
        "not a pipe header"
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "pipe format: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ips: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert_same("pipe format", &ips, &executed());
    // Through a pipe, as `perf record -o - | hwtrace perf decode -`.
    let mut cat = Command::new("cat")
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let piped = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(["perf", "decode", "-"])
        .stdin(cat.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(cat.wait().unwrap().success());
    assert!(piped.status.success(), "{piped:?}");
    assert!(
        piped.stdout == out.stdout,
        "decoded from a pipe, the output differs"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A tree under `dir` with a symlink to each real file but `except`.
fn sysroot(dir: &Path, except: &str) -> PathBuf {
    let root = dir.join("root");
    for m in &recorded().maps {
        if m.path.ends_with(except) {
            continue;
        }
        let link = root.join(m.path.trim_start_matches('/'));
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        if !link.exists() {
            std::os::unix::fs::symlink(&m.path, &link).unwrap();
        }
    }
    root
}

/// The number after `word ` in `line`.
fn count_after(line: &str, word: &str) -> u64 {
    line.split(&format!("{word} "))
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count after {word:?} in {line}"))
}

/// `got` is a subsequence of `want` (decoded in execution order); returns
/// the earliest index in `want` each element of `got` can stand for.
fn assert_subsequence(got: &[u64], want: &[u64]) -> Vec<usize> {
    let mut at = 0;
    let mut positions = Vec::with_capacity(got.len());
    for ip in got {
        let found = want[at..].iter().position(|w| w == ip);
        let Some(i) = found else {
            panic!("not a subsequence of the execution: {ip:#x} after index {at}");
        };
        positions.push(at + i);
        at += i + 1;
    }
    positions
}

#[test]
fn a_missing_file_is_named_with_what_it_cost_and_decoding_goes_on() {
    let dir = scratch("missing");
    let file = write_perf_data(&dir, &PLAIN);
    let root = sysroot(&dir, "/libc.so.6");
    let libc = recorded()
        .maps
        .iter()
        .find(|m| m.path.ends_with("/libc.so.6"))
        .unwrap();
    let out = hwtrace(&[
        "perf",
        "decode",
        "--sysroot",
        root.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let name = root
        .join(libc.path.trim_start_matches('/'))
        .display()
        .to_string();
    let line = stderr
        .lines()
        .find(|l| l.contains(&name) && l.contains("decoding stopped"))
        .unwrap_or_else(|| panic!("no report naming {name}: {stderr}"));
    assert!(line.contains("file not found"), "{line}");
    assert!(line.contains(&format!("{:#x}", libc.addr)), "{line}");
    assert!(count_after(line, "stopped") > 0, "{line}");
    assert!(count_after(line, "and") > 0, "{line}");

    // What was decoded is what ran, in order, nothing inside libc, and
    // decoding went on after libc's code first ran.
    let want = executed();
    let in_libc = |ip: &u64| *ip >= libc.addr && *ip < libc.addr + libc.len;
    let ips: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert!(!ips.iter().any(in_libc));
    let positions = assert_subsequence(&ips, &want);
    let first_libc = want.iter().position(in_libc).expect("libc ran");
    let after = positions.iter().filter(|&&p| p > first_libc).count();
    assert!(
        after > 0,
        "nothing decoded after libc first ran (instruction {first_libc} of {})",
        want.len()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_build_id_mismatch_is_named_and_its_code_left_out() {
    let dir = scratch("buildid");
    let file = write_perf_data(
        &dir,
        &Layout {
            wrong_build_id: Some("/ld-linux-x86-64.so.2"),
            ..PLAIN
        },
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| {
            l.contains("ld-linux-x86-64.so.2")
                && l.contains("build id mismatch")
                && l.contains("decoding stopped")
        })
        .unwrap_or_else(|| panic!("no mismatch report: {stderr}"));
    assert!(count_after(line, "stopped") > 0, "{line}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_gap_between_aux_buffers_is_reported_with_offset_and_size() {
    let dir = scratch("gap");
    let pt_len = recorded().pt.len();
    let at = (pt_len / 2) & !7;
    let lost = 0x1000;
    let file = write_perf_data(
        &dir,
        &Layout {
            per_cpu: true,
            split: Some((at, lost)),
            losses: true,
            ..PLAIN
        },
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let expect = format!("lost {lost} bytes of trace at stream offset {at:#x}");
    assert!(stderr.contains(&expect), "no `{expect}` in: {stderr}");
    assert!(stderr.contains("cpu 0 tid -1"), "{stderr}");
    // The LOST and the truncated AUX record, each at its file offset.
    let bytes = std::fs::read(&file).unwrap();
    let data = PerfData::parse(&bytes).unwrap();
    let offset_of = |want: fn(&Body<'_>) -> bool| {
        data.records()
            .filter_map(Result::ok)
            .find(|r| matches!(&r.record, PerfRecord::Event(e) if want(&e.body)))
            .map(|r| r.offset)
            .unwrap()
    };
    let lost_at = offset_of(|b| matches!(b, Body::Lost(_)));
    let aux_at = offset_of(|b| matches!(b, Body::Aux(_)));
    let expect = format!("LOST record at file offset {lost_at}: 7 sideband events lost");
    assert!(stderr.contains(&expect), "no `{expect}` in: {stderr}");
    let expect = format!("AUX record at file offset {aux_at} says the hardware lost trace");
    assert!(stderr.contains(&expect), "no `{expect}` in: {stderr}");
    // Per-CPU queue: the thread comes from the sideband.
    let lines = decoded(&out);
    assert!(
        lines
            .iter()
            .all(|(tid, cpu, _)| *tid == PID.to_string() && cpu == "0")
    );
    let want = executed();
    let ips: Vec<u64> = lines.iter().map(|l| l.2).collect();
    assert_subsequence(&ips, &want);
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

/// `perf script --itrace=i0ns -F ip` of `file` (and `extra` options).
fn perf_script_ips(file: &Path, extra: &[&str]) -> Vec<u64> {
    let mut args = vec!["--itrace=i0ns", "-F", "ip"];
    args.extend_from_slice(extra);
    perf_script(file, &args)
        .lines()
        .map(|l| u64::from_str_radix(l.trim(), 16).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[test]
fn perf_script_decodes_the_same_instructions() {
    let dir = scratch("perf");
    let file = write_perf_data(&dir, &PLAIN);
    let theirs = perf_script_ips(&file, &[]);
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

/// The sample id of thread [`PID`] on CPU 0, event id 1 (no time).
fn pid_on_cpu0() -> SampleId {
    SampleId {
        pid_tid: Some((PID, PID)),
        cpu: Some(0),
        identifier: Some(1),
        ..SampleId::default()
    }
}

/// A perf.data writer for one intel_pt event without timestamps (PMU 8,
/// id 1; MMAP2 and COMM records), its AUXTRACE_INFO written, and the
/// sample id of thread [`PID`] on CPU 0.
fn timeless_pt_writer() -> (PerfDataWriter<Cursor<Vec<u8>>>, SampleId) {
    let mut attr = intel_pt_attr(8, 1 | 1 << 13);
    attr.sample_type &= !sample::TIME;
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&IntelPtInfo {
        pmu_type: 8,
        noretcomp_bit: 1 << 11,
        ..IntelPtInfo::default()
    })
    .unwrap();
    let sid = pid_on_cpu0();
    (w, sid)
}

/// A real hardware trace (`../shared/corpus/real/NAME`) as perf.data: one
/// per-thread stream, one MMAP2 per run of consecutive pages of the case's
/// `pages.dump`, no timestamps.
fn wrap_real_case(dir: &Path, name: &str) -> PathBuf {
    let case = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/real")
        .join(name);
    wrap_trace(dir, name, &case.join("trace.pt"), &case, None)
}

/// A raw trace over a page cache (`pages.addr`, `pages.dump` in `pages`)
/// written as `dir/NAME.perf.data`: one MMAP2 per run of mapped pages
/// into the dump, a per-thread stream, and `cpuid` as the CPUID header.
fn wrap_trace(dir: &Path, name: &str, trace: &Path, pages: &Path, cpuid: Option<&str>) -> PathBuf {
    let addrs: Vec<u64> = std::fs::read(pages.join("pages.addr"))
        .unwrap()
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // (address, size, offset in pages.dump) of each run of mapped pages.
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for (i, &a) in addrs.iter().enumerate() {
        let off = i as u64 * 4096;
        match runs.last_mut() {
            _ if a & 0xfff != 0 => continue,
            Some(r) if r.0 + r.1 == a && r.2 + r.1 == off => r.1 += 4096,
            _ => runs.push((a, 4096, off)),
        }
    }
    let (mut w, sid) = timeless_pt_writer();
    w.comm(PID, PID, name, true, &sid).unwrap();
    let dump = pages.join("pages.dump").canonicalize().unwrap();
    let dump = dump.to_str().unwrap();
    for (addr, size, off) in runs {
        w.mmap2(2, PID, PID, addr, size, off, 5, 2, dump, &sid)
            .unwrap();
    }
    w.itrace_start(PID, PID, &sid).unwrap();
    let trace = std::fs::read(trace).unwrap();
    w.auxtrace(&trace, 0, 0, 0, PID, u32::MAX).unwrap();
    w.aux(0, trace.len() as u64, 0, &sid).unwrap();
    w.finished_round().unwrap();
    let f = FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        cpuid: cpuid.map(str::to_owned),
        ..FeatureData::default()
    };
    let bytes = w.finish(&f).unwrap().into_inner();
    let file = dir.join(format!("{name}.perf.data"));
    std::fs::write(&file, bytes).unwrap();
    file
}

/// Unzip, where PSB+ says tracing is on after an asynchronous disable and
/// a TIP.PGE follows: `perf script` decodes on; `hwtrace perf decode
/// --lenient` gives its instructions exactly (and perf-insn.txt's), and
/// without `--lenient` libipt's (ptxed's 121,052, errors reported).
#[test]
fn lenient_status_decodes_a_real_trace_as_perf_script_does() {
    let dir = scratch("lenient");
    let file = wrap_real_case(&dir, "Unzip");
    let f = file.to_str().unwrap();
    // --guest-code: the trace was recorded in a VM (its PIPs set NR).
    let theirs = perf_script_ips(&file, &["--guest-code"]);
    assert_eq!(theirs.len(), 149_576);
    let out = hwtrace(&["perf", "decode", "--lenient", f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert_same(
        "perf script vs hwtrace perf decode --lenient",
        &theirs,
        &ours,
    );
    let out = hwtrace(&["perf", "decode", f]);
    assert_eq!(out.status.code(), Some(2), "errors reported");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad status update"), "{stderr}");
    assert!(stderr.contains("so does --lenient"), "the hint: {stderr}");
    assert_eq!(decoded(&out).len(), 121_052);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_shipped_pt_fixture_decodes_like_perf_script() {
    // testdata/perf/pt-true.data: /usr/bin/true's entry traced up to its
    // first call (see testdata/perf/README.md).
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/perf/pt-true.data");
    let theirs = perf_script_ips(&file, &[]);
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert!(ours.len() > 1, "{ours:x?}");
    assert_same("pt-true.data", &theirs, &ours);
}

#[test]
fn per_cpu_instructions_go_to_the_thread_switched_in_at_their_time() {
    let dir = scratch("switch");
    let want = executed();
    let at = want.len() / 2;
    let file = write_perf_data(
        &dir,
        &Layout {
            per_cpu: true,
            switch_at: Some(at),
            ..PLAIN
        },
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let lines = decoded(&out);
    let ips: Vec<u64> = lines.iter().map(|l| l.2).collect();
    assert_same("hwtrace perf decode", &ips, &want);
    assert!(lines.iter().all(|(_, cpu, _)| cpu == "0"));
    // The thread changes once, at the first timed event (a PSB+ with its
    // TSC) at or after the switch: never before it, and within one PSB
    // period (a small part of the execution) after it.
    let (a, b) = (PID.to_string(), (PID + 1).to_string());
    let first_b = lines.iter().position(|l| l.0 == b).expect("thread B");
    assert!(
        lines[..first_b].iter().all(|l| l.0 == a),
        "before the switch: not all {a}"
    );
    assert!(
        lines[first_b..].iter().all(|l| l.0 == b),
        "after the switch: not all {b}"
    );
    assert!(
        first_b >= at && first_b - at < want.len() / 4,
        "switched at {at}, attributed from {first_b} of {}",
        want.len()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_vdso_comes_from_the_vdso_option() {
    let dir = scratch("vdso");
    // The program's own code stands in for the vDSO: mapped as `[vdso]`,
    // it can only be read from --vdso.
    let file = write_perf_data(
        &dir,
        &Layout {
            vdso_for: Some("/true"),
            ..PLAIN
        },
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("[vdso]") && l.contains("decoding stopped"))
        .unwrap_or_else(|| panic!("no vDSO report: {stderr}"));
    assert!(line.contains("--vdso"), "{line}");
    assert!(count_after(line, "stopped") > 0, "{line}");

    let exe = recorded()
        .maps
        .iter()
        .find(|m| m.path.ends_with("/true"))
        .unwrap();
    let out = hwtrace(&[
        "perf",
        "decode",
        "--vdso",
        &exe.path,
        file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let ips: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert_same("with --vdso", &ips, &executed());
    std::fs::remove_dir_all(&dir).ok();
}

/// `(from, to)` of perf's `--itrace=b` lines:
/// `comm pid 1 branches:u: FROM sym (dso) => TO sym (dso)`.
fn perf_branches(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let (from, to) = l.split_once("=>")?;
            let from = from
                .split_once("branches")?
                .1
                .split_once(':')?
                .1
                .split_once(':')?
                .1;
            let hex = |s: &str| u64::from_str_radix(s.split_whitespace().next()?, 16).ok();
            Some((hex(from)?, hex(to)?))
        })
        .collect()
}

#[test]
fn branches_match_perf_script_itrace_b() {
    let dir = scratch("branches");
    let file = write_perf_data(&dir, &PLAIN);
    let perf = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(&file)
        .arg("--itrace=b")
        .output()
        .unwrap_or_else(|e| panic!("`perf` cannot run (scripts/setup.sh installs it): {e}"));
    assert!(
        perf.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&perf.stderr)
    );
    let theirs = perf_branches(&String::from_utf8_lossy(&perf.stdout));
    let out = hwtrace(&["perf", "decode", "--branches", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours: Vec<(u64, u64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s, 16).ok();
            Some((hex(f.get(2)?)?, hex(f.get(4)?)?))
        })
        .collect();
    // Both sides' transfers with both ends known (trace begin/end have one
    // end 0).
    let known = |v: &[(u64, u64)]| -> Vec<(u64, u64)> {
        v.iter()
            .copied()
            .filter(|&(f, t)| f != 0 && t != 0)
            .collect()
    };
    let (theirs, ours) = (known(&theirs), known(&ours));
    assert!(ours.len() > 100, "{} branches", ours.len());
    let first_diff = theirs.iter().zip(&ours).position(|(a, b)| a != b);
    assert!(
        theirs == ours,
        "perf {} branches, hwtrace {}; first difference at {first_diff:?}",
        theirs.len(),
        ours.len()
    );

    // --json: one object per branch, the same ones.
    let out = hwtrace(&[
        "perf",
        "decode",
        "--branches",
        "--json",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let objs: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let from_json: Vec<(u64, u64)> = objs
        .iter()
        .filter_map(|v| {
            let hex =
                |k: &str| u64::from_str_radix(v[k].as_str()?.trim_start_matches("0x"), 16).ok();
            Some((hex("from")?, hex("to")?))
        })
        .collect();
    assert_eq!(known(&from_json), ours);
    assert!(objs.iter().all(|v| v["tid"] == PID && v["cpu"].is_null()));
    std::fs::remove_dir_all(&dir).ok();
}

// ---- intel_bts -------------------------------------------------------------

/// The intel_bts PMU type the hand-built files use.
const BTS_PMU: u32 = 9;

/// `hwtrace record --portable FLAG -o DIR/NAME -- PROGRAM...`.
fn record_portable(dir: &Path, flag: &str, name: &str, program: &[&str]) -> PathBuf {
    let file = dir.join(name);
    let mut args = vec![
        "record",
        "--portable",
        flag,
        "-o",
        file.to_str().unwrap(),
        "--",
    ];
    args.extend_from_slice(program);
    let out = hwtrace(&args);
    assert!(
        out.status.success(),
        "hwtrace record (qemu-user is installed by scripts/setup.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    file
}

/// `perf script ARGS` of `file`, which must succeed.
fn perf_script(file: &Path, args: &[&str]) -> String {
    let perf = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(file)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`perf` cannot run (scripts/setup.sh installs it): {e}"));
    assert!(
        perf.status.success(),
        "perf script {args:?}: {:?}: {}",
        perf.status,
        String::from_utf8_lossy(&perf.stderr)
    );
    String::from_utf8_lossy(&perf.stdout).into_owned()
}

/// `(tid, from, to, kind)` of `tid cpu from -> to kind` lines.
fn bts_lines(out: &Output) -> Vec<(String, u64, u64, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(
                f.len() >= 6 && f[3] == "->",
                "not `tid cpu from -> to kind`: {l:?}"
            );
            let hex = |s: &str| u64::from_str_radix(s, 16).unwrap_or_else(|e| panic!("{l:?}: {e}"));
            (f[0].to_string(), hex(f[2]), hex(f[4]), f[5..].join(" "))
        })
        .collect()
}

/// The kind hwtrace names a branch of the simulator's class.
fn kind_name(k: hwtrace_sim::BranchKind) -> &'static str {
    use hwtrace_sim::BranchKind as K;
    match k {
        K::Jcc => "jcc",
        K::NearRelJmp | K::NearIndJmp => "jmp",
        K::NearRelCall | K::NearIndCall => "call",
        K::NearRet => "return",
        K::FarJmp => "far jmp",
        K::FarCall | K::SystemCall => "far call",
        K::FarRet | K::Iret => "far return",
        _ => "interrupt",
    }
}

#[test]
fn bts_branches_are_the_executed_ones_and_perf_scripts() {
    let dir = scratch("bts");
    let file = record_portable(&dir, "--bts", "bts.data", &["/bin/true"]);
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let ours = bts_lines(&out);

    // Every branch /bin/true took, in order, of the kind its code says.
    let taken = hwtrace_sim::branches(&recorded().execution).unwrap();
    assert!(taken.len() > 1000, "{} branches", taken.len());
    let pairs: Vec<(u64, u64)> = ours.iter().map(|b| (b.1, b.2)).collect();
    let want: Vec<(u64, u64)> = taken.iter().map(|b| (b.from.0, b.to.0)).collect();
    assert!(
        pairs == want,
        "{} branches decoded, {} taken",
        pairs.len(),
        want.len()
    );
    for (b, t) in ours.iter().zip(&taken) {
        assert_eq!(b.3, kind_name(t.kind), "{:#x} -> {:#x}", b.1, b.2);
    }

    // perf's intel-bts decoder: the same branches of the same thread, but
    // for the last record of each AUXTRACE buffer, which its loop
    // (`for (; sz > bsz; ...)` in intel_bts_process_buffer) never reports.
    let bytes = std::fs::read(&file).unwrap();
    let data = PerfData::parse(&bytes).unwrap();
    let streams = hwtrace_perf::data::AuxStreams::collect(&data);
    let mut last_of_buffer = std::collections::BTreeSet::new();
    let mut n = 0;
    for c in streams.queues.values().flat_map(|q| &q.chunks) {
        n += c.data.len() / 24;
        last_of_buffer.insert(n - 1);
    }
    assert_eq!(n, ours.len(), "one branch per record");
    let script = perf_script(&file, &["--itrace=b"]);
    let theirs = perf_branches(&script);
    let ours_but_last: Vec<(u64, u64)> = pairs
        .iter()
        .enumerate()
        .filter(|(i, _)| !last_of_buffer.contains(i))
        .map(|(_, p)| *p)
        .collect();
    assert!(
        theirs == ours_but_last,
        "perf {} branches, hwtrace {} ({} buffers)",
        theirs.len(),
        ours.len(),
        last_of_buffer.len()
    );
    let perf_tids: std::collections::BTreeSet<&str> = script
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let our_tids: std::collections::BTreeSet<&str> = ours.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(perf_tids, our_tids);

    // --sym names the dynamic loader's code after its file (it is
    // stripped) and --json carries the predicted bit.
    let out = hwtrace(&["perf", "decode", "--sym", "--json", file.to_str().unwrap()]);
    assert!(out.status.success());
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert!(
        first["from_sym"].as_str().unwrap().contains("+0x"),
        "{first}"
    );
    assert!(first["predicted"].is_boolean(), "{first}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A 64-bit BTS record.
fn bts_record(from: u64, to: u64) -> Vec<u8> {
    [from, to, 0x10]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

/// An intel_bts perf.data of thread [`PID`] with `buffers` as AUXTRACE
/// buffers at the given AUX offsets, the mappings of /bin/true (and
/// `extra_maps`), and an AUX record flagged TRUNCATED when `truncated`.
fn write_bts_data(
    dir: &Path,
    buffers: &[(u64, Vec<u8>)],
    extra_maps: &[(u32, u64, u64, &str)],
    truncated: bool,
) -> PathBuf {
    let mut attr = intel_pt_attr(BTS_PMU, 0);
    attr.sample_type &= !sample::TIME;
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_bts(&hwtrace_perf::data::IntelBtsInfo {
        pmu_type: BTS_PMU,
        ..Default::default()
    })
    .unwrap();
    let sid = pid_on_cpu0();
    w.comm(PID, PID, "true", true, &sid).unwrap();
    for m in &recorded().maps {
        w.mmap2(2, PID, PID, m.addr, m.len, m.pgoff, 5, 2, &m.path, &sid)
            .unwrap();
    }
    for &(pid, addr, len, name) in extra_maps {
        w.mmap2(1, pid, pid, addr, len, addr, 5, 2, name, &sid)
            .unwrap();
    }
    w.itrace_start(PID, PID, &sid).unwrap();
    let mut end = 0;
    for (offset, data) in buffers {
        w.auxtrace(data, *offset, 0, 0, PID, u32::MAX).unwrap();
        end = offset + data.len() as u64;
    }
    let flags = if truncated { aux_flag::TRUNCATED } else { 0 };
    w.aux(0, end, flags, &sid).unwrap();
    w.finished_round().unwrap();
    let bytes = w.finish(&FeatureData::default()).unwrap().into_inner();
    let file = dir.join("bts.data");
    std::fs::write(&file, bytes).unwrap();
    file
}

#[test]
fn bts_gaps_cut_records_and_padding_are_reported_with_where_and_how_much() {
    let dir = scratch("bts-lost");
    let taken = hwtrace_sim::branches(&recorded().execution).unwrap();
    let rec = |i: usize| bts_record(taken[i].from.0, taken[i].to.0);
    // Buffer 1: records 0..10, then 8 bytes of record 10 (the rest lost).
    let mut first: Vec<u8> = (0..10).flat_map(rec).collect();
    first.extend_from_slice(&rec(10)[..8]);
    // Buffer 2, 232 bytes later in the AUX area: a padding record, records
    // 20..30.
    let mut second = vec![0u8; 24];
    second.extend((20..30).flat_map(rec));
    let lost = 16 + 9 * 24;
    let file = write_bts_data(
        &dir,
        &[(0, first.clone()), (first.len() as u64 + lost, second)],
        &[],
        true,
    );
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let got: Vec<(u64, u64)> = bts_lines(&out).iter().map(|b| (b.1, b.2)).collect();
    let want: Vec<(u64, u64)> = (0..10)
        .chain(20..30)
        .map(|i| (taken[i].from.0, taken[i].to.0))
        .collect();
    assert_eq!(got, want);
    assert!(
        stderr.contains(&format!(
            "lost {lost} bytes of BTS records (9 records) at stream offset 0xf8"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("a BTS record cut short: 8 of its 24 bytes at stream offset 0xf0"),
        "{stderr}"
    );
    assert!(stderr.contains("says the hardware lost trace"), "{stderr}");
    let out = hwtrace(&["perf", "decode", "--stats", file.to_str().unwrap()]);
    let stats = String::from_utf8_lossy(&out.stdout);
    assert!(
        stats.contains(&format!("({lost} bytes lost), 20 branches (0 of unknown kind), 1 padding records, 8 bytes of cut records")),
        "{stats}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn per_cpu_bts_buffers_go_to_the_thread_switched_in_when_they_were_read() {
    let dir = scratch("bts-cpu");
    let taken = hwtrace_sim::branches(&recorded().execution).unwrap();
    let rec = |i: usize| bts_record(taken[i].from.0, taken[i].to.0);
    let (a, b) = (PID, PID + 1);
    let mut attr = intel_pt_attr(BTS_PMU, 0);
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    attr.set(flag::CONTEXT_SWITCH, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_bts(&hwtrace_perf::data::IntelBtsInfo {
        pmu_type: BTS_PMU,
        tsc: TscConversion {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
            cap_user_time_zero: true,
        },
        snapshot_mode: false,
    })
    .unwrap();
    let sid = |tid: u32, time: u64| SampleId {
        pid_tid: Some((PID, tid)),
        cpu: Some(0),
        time: Some(time),
        identifier: Some(1),
        ..SampleId::default()
    };
    w.comm(PID, a, "true", true, &sid(a, 100)).unwrap();
    for m in &recorded().maps {
        w.mmap2(
            2,
            PID,
            a,
            m.addr,
            m.len,
            m.pgoff,
            5,
            2,
            &m.path,
            &sid(a, 100),
        )
        .unwrap();
    }
    // Thread a runs from 900, thread b (of the same process) from 2000.
    w.write_event(record_type::SWITCH, 0, &[], &sid(a, 900))
        .unwrap();
    w.write_event(record_type::SWITCH, 0, &[], &sid(b, 2000))
        .unwrap();
    w.finished_round().unwrap();
    // Buffers read at TSC 1000 (a's) and 3000 (b's).
    let first: Vec<u8> = (0..10).flat_map(rec).collect();
    let second: Vec<u8> = (10..20).flat_map(rec).collect();
    w.auxtrace(&first, 0, 1000, 0, u32::MAX, 0).unwrap();
    w.auxtrace(&second, first.len() as u64, 3000, 0, u32::MAX, 0)
        .unwrap();
    w.finished_round().unwrap();
    let bytes = w.finish(&FeatureData::default()).unwrap().into_inner();
    let file = dir.join("bts.data");
    std::fs::write(&file, bytes).unwrap();

    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let lines = bts_lines(&out);
    let tids: Vec<String> = lines.iter().map(|l| l.0.clone()).collect();
    let want: Vec<String> = (0..20)
        .map(|i| if i < 10 { a } else { b }.to_string())
        .collect();
    assert_eq!(tids, want);
    let pairs: Vec<(u64, u64)> = lines.iter().map(|l| (l.1, l.2)).collect();
    let taken20: Vec<(u64, u64)> = taken[..20].iter().map(|t| (t.from.0, t.to.0)).collect();
    assert_eq!(pairs, taken20);
    assert!(
        lines.iter().all(|l| l.3 != "?"),
        "kinds from the process's image"
    );

    // The answers give each buffer's branches to the same thread.
    let out = hwtrace(&["report", "--quiet", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let threads: Vec<(u64, String)> = text
        .lines()
        .skip_while(|l| *l != "threads")
        .skip(2)
        .take_while(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[f.len() - 1].to_string())
        })
        .collect();
    assert_eq!(
        threads,
        [(10, format!("{PID}/{a}")), (10, format!("{PID}/{b}"))],
        "{text}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

// ---- kernel code: --kcore, --kallsyms ---------------------------------------

const KTEXT: u64 = 0xffff_ffff_8100_0000;

/// An x86-64 ELF core with one PT_LOAD of `code` at `vaddr`, laid out as
/// /proc/kcore is (written byte by byte: the workspace's `object` cannot
/// write).
fn elf_core(vaddr: u64, code: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"\x7fELF\x02\x01\x01");
    b.resize(16, 0);
    b.extend_from_slice(&4u16.to_le_bytes()); // ET_CORE
    b.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    b.extend_from_slice(&1u32.to_le_bytes());
    for v in [0u64, 64, 0] {
        b.extend_from_slice(&v.to_le_bytes()); // entry, phoff, shoff
    }
    b.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, 1, 0, 0, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b.extend_from_slice(&7u32.to_le_bytes());
    let size = code.len() as u64;
    for v in [120u64, vaddr, 0, size, size, 0x1000] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(code);
    b
}

#[test]
fn kernel_branches_read_kcore_code_and_kallsyms_names() {
    let dir = scratch("kernel");
    // start_kernel: call helper; ...; helper: ret.
    let mut code = vec![0x90u8; 0x1000];
    code[..5].copy_from_slice(&[0xe8, 0xfb, 0x00, 0x00, 0x00]);
    code[0x100] = 0xc3;
    let kcore_dir = dir.join("kcore_dir");
    std::fs::create_dir_all(&kcore_dir).unwrap();
    std::fs::write(kcore_dir.join("kcore"), elf_core(KTEXT, &code)).unwrap();
    let kallsyms = "ffffffff81000000 T _stext\nffffffff81000000 T start_kernel\n\
                    ffffffff81000100 t helper\nffffffff81001000 T _etext\n";
    let branches = [(KTEXT, KTEXT + 0x100), (KTEXT + 0x100, KTEXT + 5)];
    let data: Vec<u8> = branches
        .iter()
        .flat_map(|&(f, t)| bts_record(f, t))
        .collect();
    let file = write_bts_data(
        &dir,
        &[(0, data)],
        &[(u32::MAX, KTEXT, 0x1000, "[kernel.kallsyms]_text")],
        false,
    );
    let f = file.to_str().unwrap();

    // Without --kcore: the branches, kind unknown, the kernel named as
    // missing with what it cost.
    let out = hwtrace(&["perf", "decode", f]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let kinds: Vec<String> = bts_lines(&out).into_iter().map(|b| b.3).collect();
    assert_eq!(kinds, ["?", "?"]);
    assert!(
        stderr.contains("[kernel.kallsyms]_text")
            && stderr.contains("give --kcore")
            && stderr.contains("the kind of 2 branches from it is shown as ?"),
        "{stderr}"
    );

    // With perf's kcore_dir and a kallsyms file: kinds and names.
    let ksyms = dir.join("kallsyms.txt");
    std::fs::write(&ksyms, kallsyms).unwrap();
    let args = [
        "perf",
        "decode",
        "--sym",
        "--kcore",
        kcore_dir.to_str().unwrap(),
        "--kallsyms",
        ksyms.to_str().unwrap(),
        f,
    ];
    let out = hwtrace(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "{PID} - ffffffff81000000 (start_kernel+0x0) -> ffffffff81000100 (helper+0x0) call"
            ),
            format!(
                "{PID} - ffffffff81000100 (helper+0x0) -> ffffffff81000005 (start_kernel+0x5) return"
            ),
        ]
    );

    // kcore_dir/kallsyms is read when --kallsyms is not given, as perf
    // record --kcore leaves it; a plain ELF core file works too.
    std::fs::write(kcore_dir.join("kallsyms"), kallsyms).unwrap();
    let core = kcore_dir.join("kcore");
    for kcore in [kcore_dir.to_str().unwrap(), core.to_str().unwrap()] {
        let out = hwtrace(&[
            "perf",
            "decode",
            "--sym",
            "--kcore",
            kcore,
            "--kallsyms",
            ksyms.to_str().unwrap(),
            f,
        ]);
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout), text);
    }
    let out = hwtrace(&[
        "perf",
        "decode",
        "--sym",
        "--kcore",
        kcore_dir.to_str().unwrap(),
        f,
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), text);

    // The answers name kernel addresses by the same kallsyms (given, or
    // in the kcore_dir); with neither, by perf's kernel mapping.
    let calls = |extra: &[&str]| {
        let mut args = vec!["calls", "--quiet"];
        args.extend_from_slice(extra);
        args.push(f);
        let out = hwtrace(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let tree = |caller: &str, callee: &str| {
        format!(
            "[thread {PID}/{PID}]\n(trace begins in) {caller} {{\n  {callee}  1 insns\n}} {caller}  2 insns (self 1) [trace ends]\n"
        )
    };
    let core = core.to_str().unwrap();
    let named = tree("start_kernel", "helper");
    assert_eq!(
        calls(&["--kcore", core, "--kallsyms", ksyms.to_str().unwrap()]),
        named
    );
    assert_eq!(calls(&["--kcore", kcore_dir.to_str().unwrap()]), named);
    assert_eq!(
        calls(&["--kcore", core]),
        tree("[kernel.kallsyms]_text+0x0", "[kernel.kallsyms]_text+0x100")
    );

    // A kcore that is not one is refused, naming it.
    let bad = dir.join("bad-kcore");
    std::fs::write(&bad, b"not an ELF core file, just some text of some length").unwrap();
    let out = hwtrace(&["perf", "decode", "--kcore", bad.to_str().unwrap(), f]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--kcore") && stderr.contains("not a kcore file"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

// ---- LBR samples -----------------------------------------------------------

/// `(ip, entries)` of `tid cpu ip [hw_idx=N] ENTRY...` lines, and the
/// `hw_idx` words.
fn lbr_lines(out: &Output) -> Vec<(String, Option<String>, Vec<String>)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut f = l.split_whitespace().skip(2);
            let ip = f.next().unwrap_or_else(|| panic!("{l:?}")).to_string();
            let mut rest: Vec<String> = f.map(str::to_string).collect();
            let hw =
                (rest.first().is_some_and(|w| w.starts_with("hw_idx="))).then(|| rest.remove(0));
            (ip, hw, rest)
        })
        .collect()
}

/// `(ip, entries)` of `perf script -F ip,brstack`.
fn perf_brstack(file: &Path) -> Vec<(String, Vec<String>)> {
    perf_script(file, &["-F", "ip,brstack"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut f = l.split_whitespace();
            let ip = f.next().unwrap().to_string();
            (ip, f.map(str::to_string).collect())
        })
        .collect()
}

#[test]
fn lbr_samples_read_like_perf_script_brstack() {
    let dir = scratch("lbr");
    let file = record_portable(&dir, "--lbr", "lbr.data", &["/bin/true"]);
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let ours: Vec<(String, Vec<String>)> = lbr_lines(&out)
        .into_iter()
        .map(|(ip, hw, e)| {
            assert_eq!(hw, None, "the portable capture asks for no hw_idx");
            (ip, e)
        })
        .collect();
    let theirs = perf_brstack(&file);
    assert!(ours.len() >= 5, "{} samples", ours.len());
    assert!(ours.iter().all(|(_, e)| e.len() == 32), "Skylake's 32 LBRs");
    assert_eq!(ours, theirs);
    // Every thread column is the traced process.
    let tids: std::collections::BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    let perf_tids: std::collections::BTreeSet<String> = perf_script(&file, &["-F", "tid"])
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(tids, perf_tids);
    let out = hwtrace(&["perf", "decode", "--stats", file.to_str().unwrap()]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "LBR: {} samples with branch stacks, {} entries",
            ours.len(),
            ours.len() * 32
        )
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A branch entry's flags word from its fields.
fn lbr_flags(
    mispred: bool,
    predicted: bool,
    in_tx: bool,
    abort: bool,
    cycles: u16,
    kind: u64,
) -> u64 {
    u64::from(mispred)
        | u64::from(predicted) << 1
        | u64::from(in_tx) << 2
        | u64::from(abort) << 3
        | u64::from(cycles) << 4
        | kind << 20
}

#[test]
fn lbr_flags_types_and_hw_idx_read_like_perf() {
    use hwtrace_perf::data::BranchEntry;
    use hwtrace_perf::data::attr::{Attr, attr_type, branch};
    use hwtrace_perf::data::write::SampleData;
    let dir = scratch("lbr-flags");
    let mut attr = Attr {
        kind: attr_type::HARDWARE,
        config: 1,
        sample_period: 1000,
        sample_type: sample::IP
            | sample::TID
            | sample::TIME
            | sample::CPU
            | sample::ID
            | sample::BRANCH_STACK,
        branch_sample_type: branch::ANY | branch::USER | branch::HW_INDEX | (1 << 16),
        ..Attr::default()
    };
    attr.set(flag::SAMPLE_ID_ALL, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    // Every flag alone and together, cycle counts, and every PERF_BR_*
    // type perf names.
    let mut entries = vec![
        lbr_flags(false, false, false, false, 0, 0),
        lbr_flags(true, false, false, false, 0, 1),
        lbr_flags(false, true, false, false, 1, 2),
        lbr_flags(false, false, true, false, 0x1234, 3),
        lbr_flags(false, false, false, true, 0xffff, 4),
        lbr_flags(true, false, true, true, 7, 5),
    ];
    entries.extend((6..15).map(|t| lbr_flags(false, true, false, false, t as u16, t)));
    let entries: Vec<BranchEntry> = entries
        .iter()
        .enumerate()
        .map(|(i, &flags)| BranchEntry {
            from: 0x401000 + 0x10 * i as u64,
            to: 0x402000 + 0x20 * i as u64,
            flags,
        })
        .collect();
    // In time order: perf sorts samples by time.
    for (i, (n, hw_idx)) in [(entries.len(), 5u64), (3, 31), (0, u64::MAX)]
        .into_iter()
        .enumerate()
    {
        let s = SampleData {
            ip: 0x401234 + n as u64,
            pid_tid: (PID, PID + 1),
            time: 1_000 + i as u64,
            cpu: 3,
            id: 1,
            branches: &entries[..n],
            hw_idx,
            ..SampleData::default()
        };
        w.sample(&attrs[0].attr, 2, &s).unwrap();
    }
    // The kernel could not write 4 samples.
    let sid = SampleId {
        pid_tid: Some((PID, PID + 1)),
        time: Some(2_000),
        cpu: Some(3),
        id: Some(1),
        ..SampleId::default()
    };
    w.write_event(record_type::LOST_SAMPLES, 0, &4u64.to_le_bytes(), &sid)
        .unwrap();
    w.finished_round().unwrap();
    let bytes = w.finish(&FeatureData::default()).unwrap().into_inner();
    let file = dir.join("lbr.data");
    std::fs::write(&file, bytes).unwrap();

    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the LOST_SAMPLES record at file offset") && stderr.contains(": 4 samples"),
        "{stderr}"
    );
    let ours = lbr_lines(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .all(|l| l.starts_with(&format!("{} 3 ", PID + 1))),
        "{text}"
    );
    let hw: Vec<Option<String>> = ours.iter().map(|l| l.1.clone()).collect();
    assert_eq!(
        hw,
        [
            Some("hw_idx=5".into()),
            Some("hw_idx=31".into()),
            Some("hw_idx=-1".into())
        ]
    );
    let theirs = perf_brstack(&file);
    let ours: Vec<(String, Vec<String>)> = ours.into_iter().map(|(ip, _, e)| (ip, e)).collect();
    assert_eq!(ours, theirs);
    assert!(
        ours[0].1.iter().any(|e| e.ends_with("/M/X/A/7/IND_CALL")),
        "{:?}",
        ours[0]
    );

    // JSON: every field of every entry.
    let out = hwtrace(&["perf", "decode", "--json", file.to_str().unwrap()]);
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["hw_idx"], 5);
    assert_eq!(first["cpu"], 3);
    assert_eq!(first["time"], 1_000);
    let e = &first["entries"][4];
    assert_eq!(
        (
            e["abort"].as_bool(),
            e["in_tx"].as_bool(),
            e["cycles"].as_u64(),
            e["type_name"].as_str()
        ),
        (Some(true), Some(false), Some(0xffff), Some("CALL"))
    );
    std::fs::remove_dir_all(&dir).ok();
}

// ---- two processes on one CPU -----------------------------------------------

/// A second process on CPU 0: `/bin/echo`, recorded with qemu-user.
const PID_B: u32 = 5151;

struct Second {
    execution: Execution,
    maps: Vec<FileMap>,
}

fn second() -> &'static Second {
    static S: OnceLock<Second> = OnceLock::new();
    S.get_or_init(|| {
        let limits = Limits {
            max_instructions: None,
            timeout: Some(std::time::Duration::from_secs(120)),
        };
        let rec = QemuRecorder::new()
            .limits(limits)
            .record("/bin/echo", &["two processes"])
            .unwrap_or_else(|e| panic!("qemu-user could not record /bin/echo: {e}"));
        let maps = candidate_files("/bin/echo")
            .iter()
            .filter_map(|f| place(f, &rec.execution))
            .collect();
        Second {
            execution: rec.execution,
            maps,
        }
    })
}

/// The byte the execution's memory holds at `addr`.
fn byte_at(e: &Execution, addr: u64) -> Option<u8> {
    e.memory().segments().iter().find_map(|s| {
        let off = addr.checked_sub(s.addr.0)?;
        s.bytes.get(usize::try_from(off).ok()?).copied()
    })
}

/// A per-CPU perf.data: /bin/true (thread [`PID`]) then /bin/echo
/// ([`PID_B`]) on CPU 0, each with its own COMM and MMAP2 records, SWITCH
/// records when each is switched in, one AUX stream holding both traces
/// (each with TSC packets), and the TSC conversion the identity. Without
/// `switches`, no SWITCH records. With `exec`, one process instead: thread
/// [`PID`] runs /bin/true, then execs /bin/echo (timed COMM exec records),
/// traced per thread.
fn write_two_processes(dir: &Path, switches: bool, exec: bool) -> PathBuf {
    let pid_b = if exec { PID } else { PID_B };
    let a = recorded();
    let b = second();
    let tsc_a = TSC;
    let tsc_b = TscModel {
        start: TSC.start + 10 * a.execution.insns().len() as u64 + 100_000,
        ticks_per_insn: 10,
    };
    let encode = |e: &Execution, tsc: TscModel| {
        let config = PtConfig {
            psb_period: 1024,
            tsc: Some(tsc),
            ..PtConfig::default()
        };
        PtEncoder::new(config).encode(e).unwrap().bytes
    };
    let mut pt = encode(&a.execution, tsc_a);
    pt.extend(encode(&b.execution, tsc_b));

    // The config's TSC bit on: perf then times the trace (and its thread
    // switches) by the TSC packets.
    let mut attr = intel_pt_attr(8, 1 | 1 << 10 | 1 << 13);
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    attr.set(flag::CONTEXT_SWITCH, true);
    let attrs = [EventAttr { attr, ids: vec![1] }];
    let mut files: std::collections::BTreeSet<Vec<u8>> = a
        .maps
        .iter()
        .chain(&b.maps)
        .map(|m| m.path.as_bytes().to_vec())
        .collect();
    let f = FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        build_ids: hwtrace_perf::capture::session::build_ids(&std::mem::take(&mut files)),
        ..FeatureData::default()
    };
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&IntelPtInfo {
        have_sched_switch: 2,
        per_cpu_mmaps: !exec,
        tsc: TscConversion {
            time_shift: 0,
            time_mult: 1,
            time_zero: 0,
            cap_user_time_zero: true,
        },
        ..IntelPtInfo::linux_pmu(8)
    })
    .unwrap();
    for (pid, comm, maps, start, time) in [
        (PID, "true", &a.maps, true, tsc_a.start - 10),
        (pid_b, "echo", &b.maps, false, tsc_b.start - 10),
    ] {
        let sid = SampleId {
            pid_tid: Some((pid, pid)),
            cpu: Some(0),
            time: Some(time - 5),
            identifier: Some(1),
            ..SampleId::default()
        };
        w.comm(pid, pid, comm, true, &sid).unwrap();
        for m in maps {
            w.mmap2(2, pid, pid, m.addr, m.len, m.pgoff, 5, 2, &m.path, &sid)
                .unwrap();
        }
        if start {
            w.itrace_start(pid, pid, &sid).unwrap();
        }
        let sid = SampleId {
            time: Some(time),
            ..sid
        };
        if switches {
            w.write_event(record_type::SWITCH, 0, &[], &sid).unwrap();
        }
    }
    // The buffer's reference is the TSC it starts at, as perf record
    // writes it (perf 6.1 crashes on a timed queue whose reference is 0).
    w.finished_round().unwrap();
    if exec {
        w.auxtrace(&pt, 0, tsc_a.start, 0, PID, u32::MAX).unwrap();
    } else {
        w.auxtrace(&pt, 0, tsc_a.start, 0, u32::MAX, 0).unwrap();
    }
    let sid = SampleId {
        pid_tid: Some((pid_b, pid_b)),
        cpu: Some(0),
        time: Some(tsc_b.start + 10 * b.execution.insns().len() as u64),
        identifier: Some(1),
        ..SampleId::default()
    };
    w.aux(0, pt.len() as u64, 0, &sid).unwrap();
    w.finished_round().unwrap();
    let bytes = w.finish(&f).unwrap().into_inner();
    let file = dir.join("two.data");
    std::fs::write(&file, bytes).unwrap();
    file
}

#[test]
fn a_per_cpu_stream_decodes_each_process_over_its_own_image() {
    let dir = scratch("two");
    let (a, b) = (recorded(), second());
    // The two programs have different code at one address: one image for
    // both could not decode both.
    let clash = b
        .execution
        .insns()
        .iter()
        .any(|ip| matches!((byte_at(&a.execution, ip.0), byte_at(&b.execution, ip.0)), (Some(x), Some(y)) if x != y));
    assert!(clash, "no address with different code in the two programs");

    let file = write_two_processes(&dir, true, false);
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let ours: Vec<(String, u64)> = decoded(&out)
        .into_iter()
        .map(|(tid, cpu, ip)| {
            assert_eq!(cpu, "0");
            (tid, ip)
        })
        .collect();
    let want: Vec<(String, u64)> = a
        .execution
        .insns()
        .iter()
        .map(|ip| (PID.to_string(), ip.0))
        .chain(
            b.execution
                .insns()
                .iter()
                .map(|ip| (PID_B.to_string(), ip.0)),
        )
        .collect();
    let first_diff = ours.iter().zip(&want).position(|(x, y)| x != y);
    assert!(
        ours == want,
        "{} decoded, {} executed; first difference at {first_diff:?}: {:?} vs {:?}",
        ours.len(),
        want.len(),
        first_diff.map(|i| &ours[i]),
        first_diff.map(|i| &want[i])
    );

    // Without the switch records nothing says echo ran: decoded over the
    // image of true (the only thread seen on the CPU), its code reads as
    // true's and decoding fails where they differ.
    let file = write_two_processes(&dir, false, false);
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error at stream offset"), "{stderr}");
    let ips: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert!(ips != want.iter().map(|w| w.1).collect::<Vec<_>>());

    // Debian's perf 6.1 cannot serve as the oracle here: it never switches
    // this queue to echo's thread (nor image) and decodes echo's trace over
    // true's code without end (more than 10^8 lines before it was
    // stopped); without the buffer's TSC reference it crashes. The
    // executed instructions are the oracle.
    std::fs::remove_dir_all(&dir).ok();
}

/// The answers read perf.data through the same per-process images as
/// `perf decode`: `hwtrace coverage` on the per-CPU two-process stream
/// finds exactly the blocks (with their hits) and edges of each
/// execution, under its own process; without the switch records (one
/// thread and image for both) it cannot.
#[test]
fn coverage_of_a_per_cpu_stream_has_each_process_blocks() {
    use common::qemu::{from_json, truth};
    let dir = scratch("two-coverage");
    let (a, b) = (recorded(), second());
    let coverage = |file: &Path, json: &Path| {
        hwtrace(&[
            "coverage",
            file.to_str().unwrap(),
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ])
    };
    let file = write_two_processes(&dir, true, false);
    let json = dir.join("two.json");
    let out = coverage(&file, &json);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    for (pid, execution) in [(PID, &a.execution), (PID_B, &b.execution)] {
        let want = truth(execution).unwrap();
        let got = from_json(&json, Some(u64::from(pid))).unwrap();
        assert!(!want.blocks.is_empty());
        assert_eq!(got.blocks, want.blocks, "pid {pid}: blocks");
        assert_eq!(got.edges, want.edges, "pid {pid}: edges");
    }
    // No block outside the two processes.
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let both =
        truth(&a.execution).unwrap().blocks.len() + truth(&b.execution).unwrap().blocks.len();
    assert_eq!(doc["blocks"].as_array().map(Vec::len), Some(both));

    let file = write_two_processes(&dir, false, false);
    let json = dir.join("one-image.json");
    let out = coverage(&file, &json);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Everything is true's thread's then, echo's code read as true's.
    let got = from_json(&json, Some(u64::from(PID))).unwrap();
    assert_ne!(got.blocks, truth(&a.execution).unwrap().blocks);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn kernel_instructions_of_a_pt_trace_decode_over_kcore() {
    use hwtrace_sim::CodeImageBuilder;
    use hwtrace_types::Ip;
    let dir = scratch("kernel-pt");
    // start_kernel: call helper; jmp far_away. helper: ret. far_away: nop.
    let mut code = vec![0x90u8; 0x1000];
    code[..5].copy_from_slice(&[0xe8, 0xfb, 0x00, 0x00, 0x00]);
    code[5..10].copy_from_slice(&[0xe9, 0xf6, 0x01, 0x00, 0x00]);
    code[0x100] = 0xc3;
    let insns: Vec<u64> = [0, 0x100, 5, 0x200, 0x201]
        .iter()
        .map(|o| KTEXT + o)
        .collect();
    let mut mem = CodeImageBuilder::new();
    mem.add(Ip(KTEXT), &code).unwrap();
    let execution = Execution::from_parts(
        insns.iter().map(|&a| Ip(a)).collect(),
        hwtrace_packet::ExecMode::Bits64,
        mem.build().unwrap(),
        None,
    );
    let config = PtConfig {
        psb_period: 1024,
        ..PtConfig::default()
    };
    let pt = PtEncoder::new(config).encode(&execution).unwrap().bytes;

    let kcore_dir = dir.join("kcore_dir");
    std::fs::create_dir_all(&kcore_dir).unwrap();
    std::fs::write(kcore_dir.join("kcore"), elf_core(KTEXT, &code)).unwrap();
    std::fs::write(
        kcore_dir.join("kallsyms"),
        "ffffffff81000000 T _stext\nffffffff81000000 T start_kernel\n\
         ffffffff81000100 t helper\nffffffff81000200 t far_away\nffffffff81001000 T _etext\n",
    )
    .unwrap();

    let (mut w, sid) = timeless_pt_writer();
    w.comm(PID, PID, "kthread", false, &sid).unwrap();
    w.mmap2(
        1,
        u32::MAX,
        u32::MAX,
        KTEXT,
        0x1000,
        KTEXT,
        5,
        2,
        "[kernel.kallsyms]_text",
        &sid,
    )
    .unwrap();
    w.auxtrace(&pt, 0, 0, 0, PID, u32::MAX).unwrap();
    w.finished_round().unwrap();
    let bytes = w.finish(&FeatureData::default()).unwrap().into_inner();
    let file = dir.join("kernel.data");
    std::fs::write(&file, bytes).unwrap();
    let f = file.to_str().unwrap();

    // Without --kcore: nothing decodes, and the kernel mapping is blamed.
    let out = hwtrace(&["perf", "decode", f]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(decoded(&out).is_empty());
    let line = stderr
        .lines()
        .find(|l| l.contains("[kernel.kallsyms]_text") && l.contains("decoding stopped"))
        .unwrap_or_else(|| panic!("no kernel report: {stderr}"));
    assert!(line.contains("give --kcore"), "{line}");

    // With perf's kcore_dir: exactly the executed kernel instructions, named.
    let out = hwtrace(&["perf", "decode", "--kcore", kcore_dir.to_str().unwrap(), f]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let ips: Vec<u64> = decoded(&out).iter().map(|l| l.2).collect();
    assert_eq!(ips, insns);
    let out = hwtrace(&[
        "perf",
        "decode",
        "--sym",
        "--kcore",
        kcore_dir.to_str().unwrap(),
        f,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let syms: Vec<&str> = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1)
        .collect();
    assert_eq!(
        syms,
        [
            "(start_kernel+0x0)",
            "(helper+0x0)",
            "(start_kernel+0x5)",
            "(far_away+0x0)",
            "(far_away+0x1)"
        ]
    );

    // The answers take --kcore with the same meaning: without it the
    // kernel mapping is blamed and nothing is covered; with it, exactly
    // the executed kernel blocks.
    let json = dir.join("kernel.json");
    let coverage = |extra: &[&str]| {
        let mut args = vec!["coverage", f, "--json", json.to_str().unwrap()];
        args.extend(extra);
        hwtrace(&args)
    };
    let out = coverage(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("[kernel.kallsyms]_text") && stderr.contains("give --kcore"),
        "{stderr}"
    );
    assert!(
        common::qemu::from_json(&json, None)
            .unwrap()
            .blocks
            .is_empty()
    );
    let out = coverage(&["--quiet", "--kcore", kcore_dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let got = common::qemu::from_json(&json, None).unwrap();
    let want = common::qemu::truth(&execution).unwrap();
    assert_eq!(got.blocks.len(), 4, "{got:x?}");
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_process_that_execs_decodes_each_program_over_its_own_image() {
    let dir = scratch("exec");
    let (a, b) = (recorded(), second());
    let file = write_two_processes(&dir, false, true);
    let out = hwtrace(&["perf", "decode", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let lines = decoded(&out);
    assert!(lines.iter().all(|l| l.0 == PID.to_string() && l.1 == "-"));
    let ips: Vec<u64> = lines.iter().map(|l| l.2).collect();
    let want: Vec<u64> = a
        .execution
        .insns()
        .iter()
        .chain(b.execution.insns())
        .map(|ip| ip.0)
        .collect();
    assert_same("true, then echo after the exec", &ips, &want);
    std::fs::remove_dir_all(&dir).ok();
}

/// `--time`: each instruction with the perf time of the last timing event
/// before it. The timed layout's TSC packets (in each PSB+) follow the
/// [`TSC`] model and the conversion written is the identity, so an
/// instruction's time is the clock's at the last PSB+ before it: never
/// after the clock at the instruction itself, never going back, and
/// moving at every PSB+.
#[test]
fn times_are_the_last_psb_tsc_in_perf_time() {
    let dir = scratch("time");
    let want = executed();
    let file = write_perf_data(
        &dir,
        &Layout {
            switch_at: Some(want.len() / 2),
            ..PLAIN
        },
    );
    let out = hwtrace(&["perf", "decode", "--time", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut times = Vec::new();
    let mut ips = Vec::new();
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 4, "not `tid cpu time ip`: {l:?}");
        assert_eq!(
            f[2].split_once('.').map(|(_, ns)| ns.len()),
            Some(9),
            "{l:?}"
        );
        times.push(nanoseconds(f[2]));
        ips.push(u64::from_str_radix(f[3], 16).unwrap());
    }
    assert_same("perf decode --time", &ips, &want);
    for (i, t) in times.iter().enumerate() {
        let clock = TSC.start + TSC.ticks_per_insn * i as u64;
        assert!(*t <= clock, "instruction {i} at {t}, the clock {clock}");
    }
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "time went back");
    let moves = times.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(moves >= 3, "the time moved {moves} times");
    assert_eq!(times[0], TSC.start, "the first PSB+'s TSC");
    // JSON says the same in nanoseconds; taken branches carry the time of
    // their instruction.
    let json = hwtrace(&["perf", "decode", "--time", "--json", file.to_str().unwrap()]);
    let json_times: Vec<u64> = String::from_utf8_lossy(&json.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["time"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(json_times == times, "JSON times differ from the text's");
    let branches = hwtrace(&[
        "perf",
        "decode",
        "--time",
        "--branches",
        file.to_str().unwrap(),
    ]);
    let branch_times: Vec<String> = String::from_utf8_lossy(&branches.stdout)
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert!(branch_times.len() > 1000, "{} branches", branch_times.len());
    assert!(
        branch_times.iter().all(|t| t.contains('.')),
        "a branch without time"
    );
    // A trace without TSC packets has no time to tell.
    let plain = write_perf_data(&dir, &PLAIN);
    let untimed = hwtrace(&["perf", "decode", "--time", plain.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&untimed.stdout)
            .lines()
            .all(|l| l.split_whitespace().nth(2) == Some("-")),
        "times without TSC packets"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Nanoseconds of a time printed as seconds with nine decimals (as `perf
/// decode --time` and `perf script --ns` print them; perf ends it with `:`).
fn nanoseconds(text: &str) -> u64 {
    let (s, ns) = text
        .trim_end_matches(':')
        .split_once('.')
        .unwrap_or_else(|| panic!("not a time: {text:?}"));
    s.parse::<u64>().unwrap() * 1_000_000_000 + ns.parse::<u64>().unwrap()
}

/// `(tid, time in ns, ip)` of `perf script --ns -F tid,time,ip` lines.
fn perf_script_times(file: &Path) -> Vec<(String, u64, u64)> {
    perf_script(file, &["--ns", "--itrace=i0ns", "-F", "tid,time,ip"])
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "not `tid time: ip`: {l:?}");
            (
                f[0].to_string(),
                nanoseconds(f[1]),
                u64::from_str_radix(f[2], 16).unwrap(),
            )
        })
        .collect()
}

/// A timed recording as `hwtrace record` writes one (the `tsc` term,
/// TIME samples, each AUXTRACE record stamped with the TSC it was read at)
/// is one `perf script` decodes with timestamps: the same instructions,
/// per thread and per CPU, each given to the same thread (per CPU, the
/// switch takes effect at the same instruction), and the same times
/// wherever ours move (at each PSB+'s TSC; perf's own estimate runs ahead
/// of the last TSC between them, ours stays at it, so ours are never
/// later). Before the AUXTRACE records carried the TSC (they said 0),
/// perf 6.1 crashed on such files (SIGSEGV, nothing printed).
#[test]
fn timed_recordings_decode_like_perf_script() {
    for per_cpu in [false, true] {
        let dir = scratch(if per_cpu { "timed-cpu" } else { "timed-thread" });
        let want = executed();
        let file = write_perf_data(
            &dir,
            &Layout {
                per_cpu,
                switch_at: Some(want.len() / 2),
                ..PLAIN
            },
        );
        let theirs = perf_script_times(&file);
        let out = hwtrace(&["perf", "decode", "--time", file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours: Vec<(String, u64, u64)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (
                    f[0].to_string(),
                    nanoseconds(f[2]),
                    u64::from_str_radix(f[3], 16).unwrap(),
                )
            })
            .collect();
        let ips = |v: &[(String, u64, u64)]| v.iter().map(|l| l.2).collect::<Vec<u64>>();
        assert_same(
            "perf script vs perf decode --time",
            &ips(&theirs),
            &ips(&ours),
        );
        let threads = |v: &[(String, u64, u64)]| v.iter().map(|l| l.0.clone()).collect::<Vec<_>>();
        assert!(
            threads(&theirs) == threads(&ours),
            "per CPU {per_cpu}: threads differ first at {:?}",
            theirs.iter().zip(&ours).position(|(a, b)| a.0 != b.0)
        );
        if per_cpu {
            assert!(ours.iter().any(|l| l.0 == (PID + 1).to_string()));
        }
        let moves: Vec<usize> = (1..ours.len())
            .filter(|&i| ours[i].1 != ours[i - 1].1)
            .collect();
        assert!(moves.len() >= 3, "our time moved {} times", moves.len());
        for &i in std::iter::once(&0).chain(&moves) {
            assert_eq!(ours[i].1, theirs[i].1, "per CPU {per_cpu}: instruction {i}");
        }
        let later = ours.iter().zip(&theirs).position(|(a, b)| a.1 > b.1);
        assert_eq!(later, None, "per CPU {per_cpu}: ours after perf's");
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// `--stats` counts with the counting decode, split among threads where a
/// stream's code never changes: the same instructions as the printed
/// decode, and the same errors, gaps and missing-code reports in the same
/// order, on one thread or two with seams everywhere (tiny work units).
#[test]
fn stats_count_what_the_printed_decode_prints_on_any_number_of_threads() {
    let dir = scratch("stats-jobs");
    // (perf.data, options, whether errors are reported)
    let mut cases: Vec<(PathBuf, Vec<String>, bool)> = Vec::new();
    for name in ["foo", "Unzip", "icelake_tip"] {
        let file = wrap_real_case(&dir, name);
        // Unzip's PSB+ status updates are errors unless lenient;
        // icelake_tip's trace runs into kernel code no file holds.
        cases.push((file.clone(), vec![], name != "foo"));
        cases.push((file, vec!["--lenient".into()], name == "icelake_tip"));
    }
    // Errors blamed on a missing file.
    let file = write_perf_data(&dir, &PLAIN);
    let root = sysroot(&dir, "/libc.so.6");
    let sysroot = vec!["--sysroot".into(), root.display().to_string()];
    cases.push((file, sysroot, true));
    for (file, extra, errors) in &cases {
        let run = |more: &[&str]| {
            let mut args = vec!["perf", "decode"];
            args.extend(extra.iter().map(String::as_str));
            args.extend(more);
            args.push(file.to_str().unwrap());
            hwtrace(&args)
        };
        let printed = run(&[]);
        let lines = decoded(&printed).len() as u64;
        let one = run(&["--stats", "--jobs", "1"]);
        let two = run(&["--stats", "--jobs", "2", "--unit-bytes", "64"]);
        let what = format!("{} {extra:?}", file.display());
        assert_eq!(one.status.code(), printed.status.code(), "{what}");
        assert_eq!(two.status.code(), printed.status.code(), "{what}");
        assert!(one.stdout == two.stdout, "{what}: the counts differ");
        let stats = String::from_utf8_lossy(&one.stdout);
        assert_eq!(
            count_before(&stats, " instructions"),
            lines,
            "{what}: {stats}"
        );
        let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(err(&one), err(&printed), "{what}");
        assert_eq!(err(&two), err(&printed), "{what}");
        assert_eq!(one.status.code() == Some(2), *errors, "{what}");
        assert!(!errors || !err(&one).is_empty(), "{what}: nothing reported");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The number right before `word` in `line`.
fn count_before(line: &str, word: &str) -> u64 {
    let at = line
        .find(word)
        .unwrap_or_else(|| panic!("no {word:?} in {line}"));
    let digits = line[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap();
    digits.parse().unwrap()
}

/// perf.data's CPUID header names the processor whose Intel PT errata
/// apply, as `hwtrace flow --cpu` does: a trace whose overflows lost the
/// FUP after the OVF (Skylake's SKD010, what a consumer too slow for its
/// buffer makes the simulator write) decodes cleanly from a Skylake
/// recording, with errors from one of no known processor, and `--cpu`
/// overrides the header.
#[test]
fn the_recording_processor_s_errata_apply() {
    let dir = scratch("errata");
    let (trace, pages) = (dir.join("t.pt"), dir.join("pages"));
    let sim = hwtrace(&[
        "sim",
        "pt",
        "--qemu",
        "-o",
        trace.to_str().unwrap(),
        "--code-out",
        pages.to_str().unwrap(),
        "--consumer",
        "1/2",
        "--topa",
        "4K,4K",
        "--",
        "/bin/ls",
        "-la",
        "/usr",
    ]);
    assert!(sim.status.success(), "{sim:?}");
    let flow = |cpu: &[&str]| {
        let mut args = vec![
            "flow",
            trace.to_str().unwrap(),
            "--pages",
            pages.to_str().unwrap(),
        ];
        args.extend(["--quiet", "--stats", "--json"]);
        args.extend(cpu);
        let out = hwtrace(&args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["insns"].as_u64().unwrap(), v["errors"].as_u64().unwrap())
    };
    let (skylake, plain) = (flow(&["--cpu", "6/78"]), flow(&[]));
    assert!(plain.1 > 0 && skylake.1 == 0, "{plain:?} {skylake:?}");
    let stats = |file: &Path, cpu: &[&str]| {
        let mut args = vec!["perf", "decode", "--stats", "--json"];
        args.extend(cpu);
        args.push(file.to_str().unwrap());
        let out = hwtrace(&args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["insns"].as_u64().unwrap(), v["errors"].as_u64().unwrap())
    };
    let intel = wrap_trace(&dir, "skl", &trace, &pages, Some("GenuineIntel,6,78,3"));
    let amd = wrap_trace(&dir, "amd", &trace, &pages, Some("AuthenticAMD,25,1,1"));
    let none = wrap_trace(&dir, "none", &trace, &pages, None);
    assert_eq!(stats(&intel, &[]), skylake);
    assert_eq!(stats(&amd, &[]), plain);
    assert_eq!(stats(&none, &[]), plain);
    assert_eq!(stats(&none, &["--cpu", "6/78"]), skylake);
    // The answers read perf.data the same way.
    let report = |file: &Path, cpu: &[&str]| {
        let mut args = vec!["report", file.to_str().unwrap()];
        args.extend(cpu);
        String::from_utf8_lossy(&hwtrace(&args).stderr).into_owned()
    };
    // (Both report the overflows; only the one without workarounds errs.)
    let errs = |stderr: &str| stderr.lines().filter(|l| l.contains("error")).count();
    let stderr = report(&intel, &[]);
    assert!(
        stderr.contains("overflow") && errs(&stderr) == 0,
        "{stderr}"
    );
    let stderr = report(&none, &[]);
    assert!(errs(&stderr) > 0, "{stderr}");
    assert!(stderr.contains("erratum SKD010"), "the hint: {stderr}");
    assert_eq!(errs(&report(&none, &["--cpu", "6/78"])), 0);
    // A processor the table does not know: no workarounds, said once.
    let out = hwtrace(&[
        "perf",
        "decode",
        "--stats",
        "--cpu",
        "6/250",
        none.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no Intel PT errata known for cpu 6/250"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `hwtrace record --portable --terms`: the `intel_pt` terms of a real
/// capture, simulated. With `tsc,mtc,cyc` the perf.data is timed by the
/// simulator's clock (instruction `i` at TSC 10^9 + i, perf time the TSC)
/// and `perf script` decodes it with timestamps: the same instructions as
/// `hwtrace perf decode --time`, perf's estimates within a microsecond of
/// the clock, ours (ptxed's time: the last timing event's TSC) within the
/// same microsecond wherever they move and never ahead of it by more than
/// CYC's resolution; `noretcomp` and `psb_period` reach the encoder and the
/// settings perf reads.
///
/// CYC packets time a branch from core cycles, and a decoder converts them
/// with a cycle:TSC ratio it recalibrates from MTC to MTC (SDM 33.8.3, as
/// libipt does), so an estimate may run a few ticks ahead of the real TSC
/// (`hwtrace_sim::clock` documents the bound; `timing_filters.rs` sees
/// libipt do the same). Whether it does depends on the path: `/bin/true`
/// runs longer or shorter with the environment ld.so reads, and one
/// environment gave an instruction 1 ns ahead.
#[test]
fn portable_captures_take_the_real_capture_s_terms() {
    let dir = scratch("terms");
    let file = dir.join("timed.data");
    let terms = "pt,branch,tsc,mtc,mtc_period=3,cyc,cyc_thresh=1,noretcomp,psb_period=0";
    let out = hwtrace(&[
        "record",
        "--portable",
        "--pt",
        "--terms",
        terms,
        "-o",
        file.to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    assert!(out.status.success(), "{out:?}");
    let theirs = perf_script_times(&file);
    let out = hwtrace(&["perf", "decode", "--time", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let ours: Vec<(u64, u64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (nanoseconds(f[2]), u64::from_str_radix(f[3], 16).unwrap())
        })
        .collect();
    let ips = ours.iter().map(|l| l.1).collect::<Vec<u64>>();
    let perf_ips = theirs.iter().map(|l| l.2).collect::<Vec<u64>>();
    assert_same("perf script vs perf decode --time", &perf_ips, &ips);
    let clock = |i: usize| 1_000_000_000 + i as u64;
    let off = theirs
        .iter()
        .enumerate()
        .map(|(i, t)| t.1.abs_diff(clock(i)))
        .max();
    assert!(
        off.is_some_and(|d| d < 1000),
        "perf's times off by up to {off:?} ns"
    );
    let moves: Vec<usize> = (1..ours.len())
        .filter(|&i| ours[i].0 != ours[i - 1].0)
        .collect();
    assert!(moves.len() >= 3, "our time moved {} times", moves.len());
    // Where ours move (a PSB+'s TSC, an MTC or CYC at an event), within
    // the timing packets' resolution, the first one exact.
    assert_eq!(ours[0].0, clock(0));
    for &i in &moves {
        assert!(
            ours[i].0.abs_diff(clock(i)) < 1000,
            "instruction {i}: {}",
            ours[i].0
        );
    }
    // Ahead only by CYC's rounding: `3 · ticks_per_insn + 3 + ⌈C / 256⌉`
    // ticks (hwtrace_sim::clock), with C = 2^3 ART ticks · 108 TSC ticks ·
    // 32/24 core cycles per TSC tick = 1,152 cycles in one MTC period.
    let cyc_resolution = 3 + 3 + 1152_u64.div_ceil(256);
    assert_eq!(
        ours.iter()
            .enumerate()
            .position(|(i, o)| o.0 > clock(i) + cyc_resolution),
        None
    );
    // The settings perf reads, and the encoder's: PSBs every 2 KiB.
    let out = hwtrace(&["perf", "decode", "--stats", file.to_str().unwrap()]);
    let stats = String::from_utf8_lossy(&out.stdout);
    assert!(
        stats.contains("return compression off, mtc_freq 3, tsc:ctc 216/2"),
        "{stats}"
    );
    let aux = dir.join("aux.pt");
    let out = hwtrace(&[
        "perf",
        "dump-aux",
        file.to_str().unwrap(),
        "-o",
        aux.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let dump = hwtrace(&["dump", aux.to_str().unwrap()]);
    let psbs: Vec<u64> = String::from_utf8_lossy(&dump.stdout)
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("psb"))
        .map(|l| u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap())
        .collect();
    assert!(
        psbs.len() > 3 && psbs.windows(2).all(|w| w[1] - w[0] < 2048 + 64),
        "{psbs:?}"
    );
    // The timeline: in seconds by the recording's TSC conversion (1 GHz),
    // each call at a time of its own (interpolated by instructions between
    // the trace's timestamps), children inside their parents.
    let json = dir.join("timeline.json");
    let out = hwtrace(&[
        "timeline",
        file.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["otherData"]["tsc_hz"], 1_000_000_000.0);
    let mut frames: Vec<(f64, f64)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (ts, ts + e["dur"].as_f64().unwrap())
        })
        .collect();
    let starts: std::collections::BTreeSet<u64> =
        frames.iter().map(|f| (f.0 * 1000.0) as u64).collect();
    assert!(
        frames.len() > 100 && starts.len() * 10 > frames.len() * 9,
        "{} calls at {} times",
        frames.len(),
        starts.len()
    );
    frames.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    let mut open: Vec<f64> = Vec::new();
    for (start, end) in frames {
        while open.last().is_some_and(|&e| e <= start) {
            open.pop();
        }
        assert!(
            open.last().is_none_or(|&e| end <= e + 1e-9),
            "a call crosses its caller's end"
        );
        open.push(end);
    }
    // `report`'s time per function: on the simulator's clock an
    // instruction takes a nanosecond, so a function's time is its total
    // instructions, within the spreading between timestamps.
    let out = hwtrace(&["report", file.to_str().unwrap(), "--top", "40"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut checked = 0;
    for line in text
        .lines()
        .skip_while(|l| !l.starts_with("top functions"))
        .skip(2)
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 {
            break;
        }
        let total: f64 = f[3].parse().unwrap();
        let unit = match f[6] {
            "s" => 1e9,
            "ms" => 1e6,
            "µs" => 1e3,
            "ns" => 1.0,
            other => panic!("unit {other:?} in {line}"),
        };
        let ns = f[5].parse::<f64>().unwrap() * unit;
        if total >= 10_000.0 {
            assert!((ns - total).abs() < total * 0.05, "{line}");
            checked += 1;
        }
    }
    assert!(checked >= 3, "{text}");
    // Terms the simulator has no model for are refused before recording.
    let out = hwtrace(&[
        "record",
        "--portable",
        "--pt",
        "--terms",
        "pt,pwr_evt",
        "-o",
        dir.join("x.data").to_str().unwrap(),
        "--",
        "/bin/true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("power events"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
