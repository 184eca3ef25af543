//! Inputs the `fast_decode` fuzz target (`fuzz/fuzz_targets/fast_decode.rs`)
//! once broke us with, kept under `testdata/fuzz/fast_decode/`, named after
//! what broke. Each must pass the target's own checks
//! (`fuzz/fuzz_targets/fast_compare.rs`, included here): the instruction
//! decoder, the block-cached decoder's expanded runs, its counted runs and
//! its visited runs agreeing item for item, over the target's code image.

use hwtrace_types::{AddressSpace, BytesAt, Ip, MemoryError, ReadMemory};
use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/fast_compare.rs"]
mod fast_compare;

#[path = "../../../fuzz/fuzz_targets/branchy_code.rs"]
mod branchy_code;
use branchy_code::{BASES, CODE};

/// The code at both of its addresses.
struct Image([BytesAt<'static>; 2]);

impl ReadMemory for Image {
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        self.0[0]
            .read_memory(space, addr, buf)
            .or_else(|_| self.0[1].read_memory(space, addr, buf))
    }
}

#[test]
fn every_saved_fuzz_input_passes() {
    let image = Image(BASES.map(|base| BytesAt::new(Ip(base), CODE)));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/fast_decode");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/fast_decode is there") {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("readable input");
        fast_compare::check(&path.display().to_string(), &data, &image);
        seen += 1;
    }
    assert!(seen > 0, "no inputs in {}", dir.display());
}
