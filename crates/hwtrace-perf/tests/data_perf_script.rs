//! A perf.data written by hwtrace around an Intel PT trace of a real ELF
//! (`/usr/bin/true` at a PIE load address) decodes with Debian's
//! `perf script --itrace` to the instructions the trace says ran.
//!
//! The trace: PSB, PSBEND, MODE.Exec (64-bit), TIP.PGE at the ELF's entry
//! point, then TIP.PGD with a suppressed IP at the first branch that needs
//! trace data. The expected addresses come from decoding the ELF's code with
//! iced-x86 from the entry point to that branch. Skipped, with a printed
//! reason, when `perf` is not installed.

use std::io::Cursor;
use std::path::Path;
use std::process::Command;

use hwtrace_packet::{IpPayload, ModeExec, Packet, TraceBuilder};
use hwtrace_perf::data::attr::{Attr, flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{
    FeatureData, PerfDataWriter, PipeWriter, RecordWriter, intel_pt_attr,
};
use hwtrace_perf::data::{AuxStreams, IntelPtInfo, PerfData, PerfRecord};
use hwtrace_perf::pevent::SampleId;
use iced_x86::{Decoder, DecoderOptions, FlowControl};
use object::{Object, ObjectSegment};

const PT_PMU_TYPE: u32 = 8;
const BASE: u64 = 0x5555_5555_4000;
const PID: u32 = 4242;

struct Program {
    path: String,
    entry: u64,
    /// (address, file offset, size) of the executable segment.
    text: (u64, u64, u64),
    /// The instruction addresses from the entry to the first branch that
    /// needs trace data, inclusive.
    expected: Vec<u64>,
}

fn program() -> Program {
    let path = std::fs::canonicalize("/bin/true").unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let base = if elf.kind() == object::ObjectKind::Dynamic {
        BASE
    } else {
        0
    };
    let entry = base + elf.entry();
    let seg = elf
        .segments()
        .find(|s| (s.address()..s.address() + s.size()).contains(&elf.entry()))
        .unwrap();
    let (foff, fsize) = seg.file_range();
    let code = &bytes[foff as usize..(foff + fsize) as usize];
    let seg_addr = base + seg.address();
    let mut dec = Decoder::with_ip(64, code, seg_addr, DecoderOptions::NONE);
    dec.set_position((entry - seg_addr) as usize).unwrap();
    dec.set_ip(entry);
    let mut expected = Vec::new();
    for insn in &mut dec {
        expected.push(insn.ip());
        if insn.flow_control() != FlowControl::Next {
            break;
        }
    }
    // Page-align the mapping the way the loader does.
    let page = 0xfff;
    let map_addr = seg_addr & !page;
    let map_off = foff & !page;
    let map_len = (seg_addr + seg.size() - map_addr + page) & !page;
    Program {
        path: path.to_string_lossy().into_owned(),
        entry,
        text: (map_addr, map_off, map_len),
        expected,
    }
}

fn trace(entry: u64) -> Vec<u8> {
    let mut t = TraceBuilder::new();
    let mode = Packet::ModeExec(ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    });
    t.push(Packet::Psb).unwrap();
    t.push(mode).unwrap();
    t.push(Packet::Psbend).unwrap();
    t.ip(Packet::TipPge, entry).unwrap();
    t.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    t.finish()
}

fn attrs() -> [EventAttr; 1] {
    // pt | branch, no TSC: perf decodes "timeless", per thread.
    let config = 1 | 1 << 13;
    let mut attr: Attr = intel_pt_attr(PT_PMU_TYPE, config);
    attr.sample_type &= !sample::TIME;
    attr.set(flag::COMM, true);
    attr.set(flag::MMAP2, true);
    attr.set(flag::MMAP, true);
    [EventAttr { attr, ids: vec![1] }]
}

fn features() -> FeatureData {
    FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        cmdline: Some(vec!["hwtrace".into(), "test".into()]),
        ..FeatureData::default()
    }
}

/// AUXTRACE_INFO, sideband for the program, the trace.
fn write_records(w: &mut impl RecordWriter, p: &Program, pt: &[u8]) {
    let info = IntelPtInfo {
        ..IntelPtInfo::linux_pmu(PT_PMU_TYPE)
    };
    w.auxtrace_info_pt(&info).unwrap();
    let sid = SampleId {
        pid_tid: Some((PID, PID)),
        cpu: Some(0),
        identifier: Some(1),
        ..SampleId::default()
    };
    w.comm(PID, PID, "true", true, &sid).unwrap();
    let (addr, off, len) = p.text;
    // PROT_READ|PROT_EXEC, MAP_PRIVATE; user-space cpumode (2).
    w.mmap2(2, PID, PID, addr, len, off, 5, 2, &p.path, &sid)
        .unwrap();
    w.itrace_start(PID, PID, &sid).unwrap();
    w.auxtrace(pt, 0, 0, 0, PID, u32::MAX).unwrap();
    w.aux(0, pt.len() as u64, 0, &sid).unwrap();
    w.finished_round().unwrap();
}

fn write_perf_data(p: &Program, pt: &[u8]) -> Vec<u8> {
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs()).unwrap();
    write_records(&mut w, p, pt);
    w.finish(&features()).unwrap().into_inner()
}

fn write_pipe_data(p: &Program, pt: &[u8]) -> Vec<u8> {
    let mut w = PipeWriter::new(Vec::new(), &attrs(), &features()).unwrap();
    write_records(&mut w, p, pt);
    w.finish().unwrap()
}

fn perf() -> Option<&'static str> {
    let ok = Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "`perf` is not installed (scripts/setup.sh installs it)");
    ok.then_some("perf")
}

fn perf_script_fields(file: &Path, itrace: &str, fields: &str) -> String {
    let out = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(file)
        .arg(format!("--itrace={itrace}"))
        .args(["-F", fields])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "perf script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hex_column(text: &str, col: usize) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(col))
        .filter_map(|w| u64::from_str_radix(w, 16).ok())
        .collect()
}

/// `... branches:u: FROM sym (dso) => TO sym (dso)` → (FROM, TO).
fn branch_of_line(line: &str) -> Option<(u64, u64)> {
    let (left, right) = line.split_once("=>")?;
    let last_hex = |s: &str| {
        s.split_whitespace()
            .filter_map(|w| u64::from_str_radix(w, 16).ok())
            .next_back()
    };
    let from = last_hex(left.split(':').next_back()?)?;
    let to = right
        .split_whitespace()
        .next()
        .and_then(|w| u64::from_str_radix(w, 16).ok())?;
    Some((from, to))
}

#[test]
fn our_reader_reads_back_what_we_wrote() {
    let p = program();
    let pt = trace(p.entry);
    let bytes = write_perf_data(&p, &pt);
    let file = PerfData::parse(&bytes).unwrap();
    let kinds: Vec<u32> = file.records().map(|r| r.unwrap().header.kind).collect();
    // AUXTRACE_INFO, COMM, MMAP2, ITRACE_START, AUXTRACE, AUX, FINISHED_ROUND.
    assert_eq!(kinds, [70, 3, 10, 12, 71, 11, 68]);
    let streams = AuxStreams::collect(&file);
    let (_, q) = streams.find(None, Some(PID)).unwrap();
    let mut got = Vec::new();
    q.write_to(&mut got).unwrap();
    assert_eq!(&got[..pt.len()], &pt[..]);
    assert!(
        got[pt.len()..].iter().all(|&b| b == 0),
        "padding is zero (PAD packets)"
    );
    let has_mmap = file
        .records()
        .any(|r| matches!(r.unwrap().record, PerfRecord::Event(_)));
    assert!(has_mmap);
}

#[test]
fn perf_script_decodes_our_perf_data() {
    let Some(_) = perf() else { return };
    let p = program();
    assert!(
        p.expected.len() >= 3,
        "entry code too short: {:x?}",
        p.expected
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-script-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("perf.data");
    std::fs::write(&file, write_perf_data(&p, &trace(p.entry))).unwrap();

    let insns = hex_column(&perf_script_fields(&file, "i1i", "ip"), 0);
    assert_eq!(insns, p.expected, "perf script --itrace=i1i -F ip");
    let insns = hex_column(&perf_script_fields(&file, "i0ns", "ip"), 0);
    assert_eq!(insns, p.expected, "perf script --itrace=i0ns -F ip");

    // Branches: tracing starts at the entry (perf shows it as a branch
    // from 0) and stops at the last instruction (a branch to 0).
    let out = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(&file)
        .arg("--itrace=b")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let branches: Vec<(u64, u64)> = text.lines().filter_map(branch_of_line).collect();
    let last = *p.expected.last().unwrap();
    assert_eq!(
        branches,
        [(0, p.entry), (last, 0)],
        "perf script --itrace=b:\n{text}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn pipe_format_reads_back_and_decodes_in_perf() {
    let p = program();
    let pt = trace(p.entry);
    let bytes = write_pipe_data(&p, &pt);
    let file = PerfData::parse(&bytes).unwrap();
    assert!(file.header.is_pipe());
    let mut records = file.records();
    let kinds: Vec<u32> = (&mut records).map(|r| r.unwrap().header.kind).collect();
    // ATTR, FEATUREs (arch, nrcpus, cmdline), then what the file format holds.
    assert_eq!(kinds, [64, 80, 80, 80, 70, 3, 10, 12, 71, 11, 68]);
    assert_eq!(
        records.attrs(),
        &attrs()[..]
            .iter()
            .map(|a| {
                let mut a = a.clone();
                a.attr = a.attr.with_size(a.attr.encoded_size());
                a
            })
            .collect::<Vec<_>>()[..]
    );
    assert_eq!(records.pipe_features().nrcpus, Some((1, 1)));
    assert_eq!(records.pipe_features().arch, Some(&b"x86_64"[..]));
    let streams = AuxStreams::collect(&file);
    let (_, q) = streams.find(None, Some(PID)).unwrap();
    assert_eq!(q.chunks[0].data[..pt.len()], pt[..]);

    let Some(_) = perf() else { return };
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-pipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Through a real pipe: perf script -i - reads stdin.
    let mut child = Command::new("perf")
        .args(["script", "-f", "-i", "-", "--itrace=i1i", "-F", "ip"])
        .current_dir(&dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let insns = hex_column(&String::from_utf8_lossy(&out.stdout), 0);
    assert_eq!(insns, p.expected, "perf script -i - (pipe format)");
    std::fs::remove_dir_all(&dir).ok();
}

/// `testdata/perf/pt-true.data`: this test's perf.data for the machine that
/// wrote it (`HWTRACE_BLESS=1` rewrites it). Elsewhere the fixture is read
/// back: one Intel PT queue whose stream is this test's trace for the
/// entry point recorded in its MMAP2.
#[test]
fn pt_fixture() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/perf/pt-true.data");
    if std::env::var_os("HWTRACE_BLESS").is_some() {
        let p = program();
        std::fs::write(&path, write_perf_data(&p, &trace(p.entry))).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let file = PerfData::parse(&bytes).unwrap();
    let mut entry = None;
    for r in file.records() {
        match r.unwrap().record {
            PerfRecord::AuxtraceInfo(i) => {
                assert!(
                    matches!(i.kind, hwtrace_perf::data::AuxtraceKind::IntelPt(ref pt) if pt.pmu_type == PT_PMU_TYPE)
                );
            }
            PerfRecord::Event(ev) => {
                if let hwtrace_perf::pevent::Body::Mmap2(m) = ev.body {
                    entry = Some(m.addr);
                }
            }
            _ => {}
        }
    }
    let streams = AuxStreams::collect(&file);
    assert_eq!(streams.queues.len(), 1);
    let (_, q) = streams.find(None, Some(PID)).unwrap();
    // The trace starts with PSB, MODE, PSBEND and a TIP.PGE inside the mapping.
    let data = q.chunks[0].data;
    assert_eq!(&data[..16], &[0x02, 0x82].repeat(8)[..]);
    let pge = hwtrace_packet::PacketDecoder::new(data)
        .map_while(Result::ok)
        .find_map(|p| match p.packet {
            Packet::TipPge(ip) => Some(ip),
            _ => None,
        });
    assert!(
        pge.is_some() && entry.is_some(),
        "TIP.PGE and an MMAP2 in the fixture"
    );
}
