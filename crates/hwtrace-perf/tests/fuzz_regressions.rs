//! Inputs that broke the perf.data reader, kept under
//! `testdata/fuzz/perf_data/` and named after what broke (found by
//! `fuzz/fuzz_targets/perf_data.rs` or by reviewing what it feeds). Each
//! must now pass what the fuzz target does: parse, walk every record with
//! COMPRESSED records expanded and without, assemble the AUX streams and
//! read the data section as sideband, without panicking, and quickly.

use std::path::Path;
use std::time::{Duration, Instant};

use hwtrace_perf::data::{AuxStreams, ErrorKind, PerfData, PerfRecord};
use hwtrace_perf::pevent::{PrintFlags, RecordReader, print_record};

/// Everything the fuzz target does; returns how many records were seen.
fn check(data: &[u8]) -> usize {
    let Ok(file) = PerfData::parse(data) else {
        return 0;
    };
    let mut n = 0;
    let mut records = file.records();
    while let Some(item) = records.next_expanded().transpose() {
        n += 1;
        if let Ok(item) = item
            && let PerfRecord::Sample { sample, .. } = &item.item().record
            && let Some(b) = sample.branch_stack
        {
            assert!(b.entries().count() == b.len());
        }
    }
    n += file.records().count();
    let streams = AuxStreams::collect(&file);
    for q in streams.queues.values() {
        assert_eq!(
            q.len(),
            q.chunks.iter().map(|c| c.data.len() as u64).sum::<u64>()
        );
    }
    let st = file.attrs.first().map_or(0, |a| a.attr.sample_type);
    let start = file.header.data.offset as usize;
    let end = start
        .saturating_add(file.header.data.size as usize)
        .min(data.len());
    if let Some(section) = data.get(start..end) {
        let flags = PrintFlags {
            compact: true,
            verbose: true,
            ..PrintFlags::default()
        };
        for r in RecordReader::new(section, st).flatten() {
            print_record(&mut std::io::sink(), &r, None, "f", flags).unwrap();
        }
    }
    n
}

#[test]
fn every_saved_fuzz_input_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/perf_data");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let t = Instant::now();
        check(&std::fs::read(&path).unwrap());
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{} took {:?}",
            path.display(),
            t.elapsed()
        );
        n += 1;
    }
    assert!(n >= 1, "no inputs in {}", dir.display());
}

/// 600 events whose ids sections all span the whole file: each read the
/// whole file as its ids (600 × 6,000 ids) before the reader refused ids
/// that add up to more than the file holds.
#[test]
fn overlapping_ids_sections_are_refused() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/fuzz/perf_data/attr-ids-sections-overlap.data");
    let bytes = std::fs::read(path).unwrap();
    let e = PerfData::parse(&bytes).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::BadSize { .. }), "{e}");
}
