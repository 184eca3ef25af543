//! Inputs of the `coverage_parts` fuzz target
//! (`fuzz/fuzz_targets/coverage_parts.rs`), kept under
//! `testdata/fuzz/coverage_parts/`: `seed-*` are streams of a few hundred
//! records cut in a few places (`fuzz/make_seeds.py`), anything else an
//! input that once broke us, named after what broke. Each must pass the
//! target's own check (`coverage_check.rs`, included here): coverage built
//! in parts and merged is the coverage of the whole stream.

use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/coverage_check.rs"]
mod coverage_check;

#[test]
fn every_saved_fuzz_input_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/coverage_parts");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/coverage_parts is there") {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("readable input");
        let records = coverage_check::check(&data);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("seed-") {
            assert!(records > 100, "{name}: only {records} records");
            seeds += 1;
        }
    }
    assert!(seeds >= 4, "{seeds} seeds in {}", dir.display());
}
