//! Inputs the `fast_decode` fuzz target (`fuzz/fuzz_targets/fast_decode.rs`)
//! once broke us with, kept under `testdata/fuzz/fast_decode/`, named after
//! what broke. Each must pass the target's own checks
//! (`fuzz/fuzz_targets/fast_compare.rs`, included here): the instruction
//! decoder, the block-cached decoder's expanded runs, its counted runs and
//! its visited runs agreeing item for item, over the target's code image.

use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/fast_compare.rs"]
mod fast_compare;

// The fuzz target's image itself (an `hwtrace-mem` image of its code at
// both addresses), so the inputs decode over exactly what they broke.
#[path = "../../../fuzz/fuzz_targets/branchy_image.rs"]
mod branchy_image;

#[test]
fn every_saved_fuzz_input_passes() {
    let image = branchy_image::image();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/fast_decode");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/fast_decode is there") {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("readable input");
        fast_compare::check(&path.display().to_string(), &data, image);
        seen += 1;
    }
    assert!(seen > 0, "no inputs in {}", dir.display());
}
