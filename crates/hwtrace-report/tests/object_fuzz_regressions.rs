//! Inputs of the `object_files` fuzz target (`fuzz/fuzz_targets/object_files.rs`),
//! kept under `testdata/fuzz/object_files/`: `seed-*` are the well-formed
//! files `fuzz/make_seeds.py` starts the fuzzer from (a small static ELF
//! with DWARF built by gcc, as an image and for the symboliser; a minimal
//! PE32+ image; image option strings; a QEMU core and kcore headers; a PDB
//! clang and lld-link wrote; kallsyms text), anything else an input that once
//! broke us, named after what broke. Each must pass the target's own
//! checks (`object_check.rs`, included here); the seeds must also be read,
//! not refused.

use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/object_check.rs"]
mod object_check;

#[test]
fn every_saved_fuzz_input_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/object_files");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/object_files is there") {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("readable input");
        let got = object_check::check(&data);
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("seed-") {
            assert!(got > 0, "{name}: nothing read from a well-formed file");
            seeds += 1;
        }
    }
    assert!(seeds >= 9, "{seeds} seeds in {}", dir.display());
}
