//! Arbitrary bytes as the ELF and PE files the image options load, the
//! object files and DWARF the symboliser reads, and the image options'
//! syntax (checks in `object_check.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod object_check;

fuzz_target!(|data: &[u8]| {
    object_check::check(data);
});
