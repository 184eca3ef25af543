//! Inputs of the `regs_dumps` fuzz target (`fuzz/fuzz_targets/regs_dumps.rs`),
//! kept under `testdata/fuzz/regs_dumps/`: `seed-*` are the well-formed
//! dumps `fuzz/make_seeds.py` starts the fuzzer from (a DS area with its
//! BTS buffer, linear and wrapped; raw records; LBR MSR dumps; register
//! lines), anything else an input that once broke us, named after what
//! broke. Each must pass the target's own checks (`regs_check.rs`,
//! included here); the seeds must also be read, not refused.

use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/regs_check.rs"]
mod regs_check;

#[test]
fn every_saved_fuzz_input_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/regs_dumps");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/regs_dumps is there") {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("readable input");
        let read = regs_check::check(&data);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("seed-") {
            assert!(read > 0, "{name}: nothing read from a well-formed dump");
            seeds += 1;
        }
    }
    assert!(seeds >= 4, "{seeds} seeds in {}", dir.display());
}
