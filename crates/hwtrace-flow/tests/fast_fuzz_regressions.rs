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

/// The fuzz target's code (`fuzz/fuzz_targets/branchy_image.rs`, which
/// builds an `hwtrace-mem` image of it): every kind of branch, at 0x1000
/// and at a kernel-looking copy.
const CODE: &[u8] = &[
    0x74, 0x05, 0xe8, 0x09, 0x00, 0x00, 0x00, 0xff, 0xe0, 0x0f, 0x05, 0xeb, 0xf3, 0x90, 0x90, 0x90,
    0x48, 0x01, 0xc8, 0x75, 0xfb, 0xff, 0xd0, 0xc3, 0xcf,
];

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
    let image = Image([
        BytesAt::new(Ip(0x1000), CODE),
        BytesAt::new(Ip(0xffff_ffff_8000_1000), CODE),
    ]);
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
