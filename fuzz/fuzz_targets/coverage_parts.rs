//! Arbitrary bytes as a stream of one thread's records and the places it
//! is cut: coverage built in parts and merged in order must be the
//! coverage of the whole stream (checks in `coverage_check.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod coverage_check;

fuzz_target!(|data: &[u8]| {
    coverage_check::check(data);
});
