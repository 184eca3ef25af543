//! LBR samples written by hwtrace (`RecordWriter::sample` with branch
//! stacks) read back through our reader and through Debian's
//! `perf script -F brstack` to the same branches and flags. Skipped, with a
//! printed reason, without `perf`.

use std::io::Cursor;
use std::process::Command;

use hwtrace_perf::data::attr::{Attr, attr_type, branch, flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter, SampleData};
use hwtrace_perf::data::{BranchEntry, PerfData, PerfRecord};
use hwtrace_perf::pevent::SampleId;

const PID: u32 = 31337;

fn attr() -> Attr {
    let mut a = Attr {
        kind: attr_type::HARDWARE,
        config: 0, // cycles
        sample_period: 100_003,
        sample_type: sample::IDENTIFIER
            | sample::IP
            | sample::TID
            | sample::TIME
            | sample::CPU
            | sample::PERIOD
            | sample::BRANCH_STACK,
        branch_sample_type: branch::ANY | branch::USER | branch::HW_INDEX,
        ..Attr::default()
    };
    for f in [
        flag::SAMPLE_ID_ALL,
        flag::COMM,
        flag::MMAP2,
        flag::EXCLUDE_KERNEL,
    ] {
        a.set(f, true);
    }
    a
}

/// Flags as `struct perf_branch_entry` packs them.
fn flags(mispred: bool, in_tx: bool, abort: bool, cycles: u16) -> u64 {
    u64::from(mispred)
        | u64::from(!mispred) << 1
        | u64::from(in_tx) << 2
        | u64::from(abort) << 3
        | u64::from(cycles) << 4
}

/// Three samples of a made-up loop, each with a stack of 1–3 branches.
fn stacks() -> Vec<(u64, Vec<BranchEntry>)> {
    let e = |from, to, f| BranchEntry { from, to, flags: f };
    vec![
        (
            0x401020,
            vec![e(0x401018, 0x401000, flags(false, false, false, 12))],
        ),
        (
            0x401004,
            vec![
                e(0x401018, 0x401000, flags(true, false, false, 3)),
                e(0x401030, 0x401010, flags(false, true, false, 0)),
            ],
        ),
        (
            0x401030,
            vec![
                e(0x401040, 0x401030, flags(false, false, true, 100)),
                e(0x401018, 0x401000, flags(false, false, false, 7)),
                e(0x401009, 0x401040, flags(true, true, false, 65535)),
            ],
        ),
    ]
}

fn write() -> Vec<u8> {
    let attrs = [EventAttr {
        attr: attr(),
        ids: vec![5],
    }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    let sid = SampleId {
        pid_tid: Some((PID, PID)),
        time: Some(1),
        cpu: Some(0),
        identifier: Some(5),
        ..SampleId::default()
    };
    w.comm(PID, PID, "loop", true, &sid).unwrap();
    w.mmap2(
        2,
        PID,
        PID,
        0x400000,
        0x10000,
        0,
        5,
        2,
        "/hwtrace/loop",
        &sid,
    )
    .unwrap();
    for (i, (ip, stack)) in stacks().iter().enumerate() {
        let s = SampleData {
            ip: *ip,
            pid_tid: (PID, PID),
            time: 10 + i as u64,
            id: 5,
            period: 100_003,
            branches: stack,
            hw_idx: i as u64,
            ..SampleData::default()
        };
        w.sample(&attr(), 2, &s).unwrap();
    }
    w.finish(&FeatureData {
        arch: Some("x86_64".into()),
        nrcpus: Some((1, 1)),
        ..FeatureData::default()
    })
    .unwrap()
    .into_inner()
}

#[test]
fn lbr_samples_read_back() {
    let bytes = write();
    let file = PerfData::parse(&bytes).unwrap();
    let mut got = Vec::new();
    for r in file.records() {
        if let PerfRecord::Sample { sample, .. } = r.unwrap().record {
            let bs = sample.branch_stack.unwrap();
            assert_eq!(bs.hw_idx, Some(got.len() as u64));
            assert_eq!(sample.pid_tid, Some((PID, PID)));
            got.push((sample.ip.unwrap(), bs.entries().collect::<Vec<_>>()));
        }
    }
    assert_eq!(got, stacks());
    // A sample type the writer cannot fill is refused, not written wrong.
    let mut a = attr();
    a.sample_type |= sample::CALLCHAIN;
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &[]).unwrap();
    assert!(w.sample(&a, 2, &SampleData::default()).is_err());
}

#[test]
fn perf_script_prints_our_branch_stacks() {
    assert!(
        Command::new("perf")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "`perf` is not installed (Debian linux-perf; scripts/setup.sh installs it)"
    );
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-perf-lbr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("perf.data");
    std::fs::write(&path, write()).unwrap();
    let out = Command::new("perf")
        .args(["script", "-f", "-i"])
        .arg(&path)
        .args(["-F", "ip,brstack"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // `IP FROM/TO/P|M/X|-/A|-/CYCLES ...` per sample.
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    for (ip, stack) in stacks() {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("too few samples in:\n{text}"));
        let mut words = line.split_whitespace();
        assert_eq!(
            u64::from_str_radix(words.next().unwrap(), 16).unwrap(),
            ip,
            "{line}"
        );
        let entries: Vec<&str> = words.collect();
        assert_eq!(entries.len(), stack.len(), "{line}");
        for (w, e) in entries.iter().zip(&stack) {
            let f: Vec<&str> = w.split('/').collect();
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
            assert_eq!((hex(f[0]), hex(f[1])), (e.from, e.to), "{w}");
            assert_eq!(f[2], if e.mispred() { "M" } else { "P" }, "{w}");
            assert_eq!(f[3], if e.in_tx() { "X" } else { "-" }, "{w}");
            assert_eq!(f[4], if e.abort() { "A" } else { "-" }, "{w}");
            assert_eq!(f[5].parse::<u16>().unwrap(), e.cycles(), "{w}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
