//! The perf.data fixtures of `testdata/perf/` (see its README): they read
//! without errors, with the record counts `perf report -D` shows (when perf
//! is installed), and mutated copies never make the reader panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use hwtrace_perf::data::{AuxStreams, PerfData, PerfRecord, record_type_name};
use hwtrace_perf::pevent::Body;
use proptest::prelude::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/perf")
        .join(name)
}

const FIXTURES: [&str; 3] = ["sw-switch.data", "sw-pipe.data", "pt-true.data"];

fn counts(bytes: &[u8]) -> BTreeMap<String, u64> {
    let file = PerfData::parse(bytes).unwrap();
    let mut out = BTreeMap::new();
    for r in file.records() {
        let r = r.unwrap();
        *out.entry(record_type_name(r.header.kind).to_string())
            .or_insert(0) += 1;
    }
    out
}

fn perf_counts(path: &Path) -> Option<BTreeMap<String, u64>> {
    let o = Command::new("perf")
        .args(["report", "-D", "-f", "-i"])
        .arg(path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&o.stdout);
    let stats = text.split("Aggregated stats:").nth(1)?;
    let mut out = BTreeMap::new();
    for line in stats.lines().skip(1) {
        let Some((name, rest)) = line.split_once(" events:") else {
            break;
        };
        let n: u64 = rest.split_whitespace().next()?.parse().ok()?;
        if name.trim() != "TOTAL" && n > 0 {
            out.insert(name.trim().to_string(), n);
        }
    }
    Some(out)
}

#[test]
fn fixtures_read_with_perfs_record_counts() {
    for name in FIXTURES {
        let path = fixture(name);
        let bytes = std::fs::read(&path).unwrap();
        let ours = counts(&bytes);
        match perf_counts(&path) {
            Some(theirs) => assert_eq!(ours, theirs, "{name}"),
            None => eprintln!("{name}: perf not installed, counts not compared"),
        }
    }
}

#[test]
fn software_fixture_samples_and_switches() {
    let bytes = std::fs::read(fixture("sw-switch.data")).unwrap();
    let file = PerfData::parse(&bytes).unwrap();
    assert!(
        file.features
            .cmdline
            .as_ref()
            .is_some_and(|c| c.iter().any(|a| *a == b"record"))
    );
    assert!(
        file.features
            .cpuid
            .is_some_and(|c| c.starts_with(b"AuthenticAMD"))
    );
    let (mut samples, mut switches_out, mut switches_in) = (0, 0, 0);
    for r in file.records() {
        match r.unwrap().record {
            PerfRecord::Sample { attr_index, sample } => {
                samples += 1;
                assert_eq!(attr_index, Some(0));
                assert!(sample.ip.is_some() && sample.time.is_some() && sample.pid_tid.is_some());
            }
            PerfRecord::Event(ev) if matches!(ev.body, Body::Switch) => {
                assert!(ev.sample.time.is_some(), "switches carry sample_id");
                if ev.is_switch_out() {
                    switches_out += 1;
                } else {
                    switches_in += 1;
                }
            }
            _ => {}
        }
    }
    assert!(samples > 0 && switches_out > 0 && switches_in > 0);
    assert!(AuxStreams::collect(&file).queues.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]
    #[test]
    fn mutated_fixtures_never_panic(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = std::fs::read(fixture(FIXTURES[which])).unwrap();
        for (i, v) in edits {
            let i = i.index(bytes.len());
            bytes[i] = v;
        }
        let n = cut.index(bytes.len() + 1);
        for input in [&bytes[..], &bytes[..n]] {
            if let Ok(file) = PerfData::parse(input) {
                let n = file.records().take(100_000).count();
                prop_assert!(n <= input.len() / 8 + 1);
                let s = AuxStreams::collect(&file);
                for q in s.queues.values() {
                    prop_assert!(q.len() <= input.len() as u64);
                }
            }
        }
    }
}
