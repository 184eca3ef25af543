//! The perf.data reader on hand-built SAMPLE records with branch stacks
//! (LBR): every field of `struct perf_branch_entry`'s flags word, and the
//! three layouts of `PERF_SAMPLE_BRANCH_STACK` (`nr, entries`;
//! `nr, hw_idx, entries` with `PERF_SAMPLE_BRANCH_HW_INDEX`; and entries
//! followed by one counters word each with `PERF_SAMPLE_BRANCH_COUNTERS`),
//! with fields on both sides of the stack so that a wrong length shows.
//! The record bodies are written word by word here, not by the crate's
//! writer, so the reader is checked against the kernel's layout
//! (include/uapi/linux/perf_event.h), not against itself.

use std::io::Cursor;

use hwtrace_perf::data::attr::{Attr, branch, flag, sample};
use hwtrace_perf::data::header::EventAttr;
use hwtrace_perf::data::write::{FeatureData, PerfDataWriter, RecordWriter};
use hwtrace_perf::data::{BranchEntry, ErrorKind, PerfData, PerfRecord, Sample};

/// `PERF_RECORD_SAMPLE`.
const SAMPLE: u32 = 9;

/// The flags word of one entry, field by field (bit positions of
/// `struct perf_branch_entry`).
#[derive(Clone, Copy, Debug, Default)]
struct Flags {
    mispred: bool,
    predicted: bool,
    in_tx: bool,
    abort: bool,
    cycles: u16,
    kind: u8,
    spec: u8,
    new_type: u8,
    privilege: u8,
}

impl Flags {
    fn word(self) -> u64 {
        u64::from(self.mispred)
            | u64::from(self.predicted) << 1
            | u64::from(self.in_tx) << 2
            | u64::from(self.abort) << 3
            | u64::from(self.cycles) << 4
            | u64::from(self.kind) << 20
            | u64::from(self.spec) << 24
            | u64::from(self.new_type) << 26
            | u64::from(self.privilege) << 30
    }
}

/// Entries exercising each field alone and all at once.
fn flag_cases() -> Vec<Flags> {
    let none = Flags::default();
    let mut v = vec![
        none,
        Flags {
            mispred: true,
            ..none
        },
        Flags {
            predicted: true,
            ..none
        },
        Flags {
            in_tx: true,
            ..none
        },
        Flags {
            abort: true,
            ..none
        },
        Flags {
            cycles: 0xffff,
            ..none
        },
        Flags { cycles: 1, ..none },
        Flags {
            mispred: true,
            predicted: false,
            in_tx: true,
            abort: true,
            cycles: 0x8001,
            kind: 15,
            spec: 3,
            new_type: 15,
            privilege: 7,
        },
    ];
    v.extend((0..16).map(|kind| Flags { kind, ..none }));
    v.extend((0..4).map(|spec| Flags { spec, ..none }));
    v.extend((0..16).map(|new_type| Flags { new_type, ..none }));
    v.extend((0..8).map(|privilege| Flags { privilege, ..none }));
    v
}

fn words(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A file of one attribute and the given SAMPLE bodies.
fn file(attr: Attr, bodies: &[Vec<u8>]) -> Vec<u8> {
    let attrs = [EventAttr { attr, ids: vec![] }];
    let mut w = PerfDataWriter::new(Cursor::new(Vec::new()), &attrs).unwrap();
    for b in bodies {
        w.write_record(SAMPLE, 2, b).unwrap();
    }
    w.finish(&FeatureData::default()).unwrap().into_inner()
}

fn attr(branch_sample_type: u64) -> Attr {
    let mut a = Attr {
        // IP and TID before the stack, WEIGHT after it.
        sample_type: sample::IP | sample::TID | sample::BRANCH_STACK | sample::WEIGHT,
        branch_sample_type,
        ..Attr::default()
    };
    a.set(flag::SAMPLE_ID_ALL, true);
    a
}

/// The body: ip, pid/tid, the stack as `layout` says, weight.
fn body(entries: &[(u64, u64, u64)], hw_idx: Option<u64>, counters: bool) -> Vec<u8> {
    let mut v = vec![0x40_1000, (7u64 << 32) | 6, entries.len() as u64];
    v.extend(hw_idx);
    for &(from, to, flags) in entries {
        v.extend([from, to, flags]);
    }
    if counters {
        v.extend((0..entries.len() as u64).map(|i| 0xc0 + i));
    }
    v.push(0x5eed); // PERF_SAMPLE_WEIGHT
    words(&v)
}

fn samples(bytes: &[u8]) -> Vec<Sample<'_>> {
    let data = PerfData::parse(bytes).unwrap();
    data.records()
        .map(|r| match r.unwrap().record {
            PerfRecord::Sample { sample, .. } => sample,
            other => panic!("not a sample: {other:?}"),
        })
        .collect()
}

fn entries(cases: &[Flags]) -> Vec<(u64, u64, u64)> {
    cases
        .iter()
        .enumerate()
        .map(|(i, f)| (0x40_2000 + i as u64, 0x40_3000 + i as u64, f.word()))
        .collect()
}

fn check(e: &BranchEntry, f: &Flags) {
    assert_eq!(e.mispred(), f.mispred, "{f:?}");
    assert_eq!(e.predicted(), f.predicted, "{f:?}");
    assert_eq!(e.in_tx(), f.in_tx, "{f:?}");
    assert_eq!(e.abort(), f.abort, "{f:?}");
    assert_eq!(e.cycles(), f.cycles, "{f:?}");
    assert_eq!(e.branch_type(), f.kind, "{f:?}");
    assert_eq!(e.spec(), f.spec, "{f:?}");
    assert_eq!(e.new_type(), f.new_type, "{f:?}");
    assert_eq!(e.privilege(), f.privilege, "{f:?}");
}

#[test]
fn every_flag_field_reads_back_in_all_three_layouts() {
    let cases = flag_cases();
    let list = entries(&cases);
    let layouts = [
        (branch::ANY, None, false),
        (branch::ANY | branch::HW_INDEX, Some(0x1f), false),
        // hw_idx -1: the stack is not a whole LBR snapshot.
        (branch::ANY | branch::HW_INDEX, Some(u64::MAX), false),
        (
            branch::ANY | branch::HW_INDEX | branch::COUNTERS,
            Some(3),
            true,
        ),
        (branch::ANY | branch::COUNTERS, None, true),
    ];
    for (bst, hw_idx, counters) in layouts {
        let bytes = file(
            attr(bst),
            &[body(&list, hw_idx, counters), body(&[], hw_idx, counters)],
        );
        let s = samples(&bytes);
        assert_eq!(s.len(), 2);
        for (n, sample) in s.iter().enumerate() {
            assert_eq!(sample.ip, Some(0x40_1000));
            assert_eq!(sample.pid_tid, Some((6, 7)));
            // The field after the stack is where the layout puts it.
            assert_eq!(sample.weight, Some(0x5eed), "layout {bst:#x}");
            let stack = sample.branch_stack.expect("a branch stack");
            assert_eq!(stack.hw_idx, hw_idx, "layout {bst:#x}");
            let got: Vec<BranchEntry> = stack.entries().collect();
            let want = if n == 0 { &list[..] } else { &[] };
            assert_eq!(got.len(), want.len());
            assert_eq!(stack.len(), want.len());
            assert_eq!(stack.is_empty(), want.is_empty());
            for ((e, w), f) in got.iter().zip(want).zip(&cases) {
                assert_eq!((e.from, e.to, e.flags), *w);
                check(e, f);
            }
        }
    }
}

#[test]
fn a_stack_longer_than_its_record_is_an_error_at_the_record() {
    let list = entries(&flag_cases()[..4]);
    let mut b = body(&list, Some(1), false);
    // nr says one entry more than the record holds.
    b[16..24].copy_from_slice(&5u64.to_le_bytes());
    let bytes = file(attr(branch::ANY | branch::HW_INDEX), &[b]);
    let data = PerfData::parse(&bytes).unwrap();
    let err = data.records().next().unwrap().unwrap_err();
    assert_eq!(err.offset.0, data.header.data.offset, "{err}");
    assert!(
        matches!(
            err.kind,
            ErrorKind::SampleTooShort {
                field: "branch_stack.entries",
                ..
            }
        ),
        "{err}"
    );
    // Without HW_INDEX the same words are read as nr and entries: the
    // hw_idx word becomes the first `from`, so the layout matters.
    let list = entries(&flag_cases()[..2]);
    let bytes = file(attr(branch::ANY), &[body(&list, Some(9), false)]);
    let data = PerfData::parse(&bytes).unwrap();
    let r = data.records().next().unwrap();
    match r {
        Ok(item) => {
            let PerfRecord::Sample { sample, .. } = item.record else {
                panic!("not a sample")
            };
            let first = sample.branch_stack.unwrap().entries().next().unwrap();
            assert_eq!(first.from, 9, "hw_idx read as an entry");
        }
        Err(e) => panic!("{e}"),
    }
}
