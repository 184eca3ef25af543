//! Inputs of the `fast_decode` fuzz target (`testdata/fuzz/fast_decode/`)
//! through its libxdc check (`fuzz/fuzz_targets/libxdc_check.rs`, included
//! here): libxdc's map the same whether its edges are listed or not, over
//! the target's code image.

use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/libxdc_check.rs"]
mod libxdc_check;

#[path = "../../../fuzz/fuzz_targets/branchy_image.rs"]
mod branchy_image;

#[test]
fn every_saved_fuzz_input_passes() {
    let image = branchy_image::image();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/fast_decode");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/fast_decode is there") {
        let data = std::fs::read(entry.expect("directory entry").path()).expect("readable input");
        libxdc_check::check(&data, image);
        seen += 1;
    }
    assert!(seen > 0, "no inputs in {}", dir.display());
}
