//! Arbitrary bytes as an Intel PT trace over a fixed code image, decoded
//! four ways that must agree item for item ([`fast_compare`]). None may
//! panic; the fast decoder's claim is exactness, so any difference is a
//! bug.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "branchy_image.rs"]
mod branchy_image;
use branchy_image::image;

#[path = "fast_compare.rs"]
mod fast_compare;

fuzz_target!(|data: &[u8]| {
    fast_compare::check("input", data, image());
});
