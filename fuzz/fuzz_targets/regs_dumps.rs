//! Arbitrary bytes as the register and memory dumps `hwtrace bts`,
//! `hwtrace lbr` and `hwtrace msr` read (checks in `regs_check.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod regs_check;

fuzz_target!(|data: &[u8]| {
    regs_check::check(data);
});
