//! Arbitrary bytes as an Intel PT trace over a fixed code image, decoded
//! four ways that must agree item for item ([`fast_compare`]). None may
//! panic; the fast decoder's claim is exactness, so any difference is a
//! bug. Then libxdc's map and edge list from the same bytes
//! (`LibxdcMap`): listing the edges (libxdc's walks through the code at
//! FUPs included) must leave the map as counting alone does.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "branchy_image.rs"]
mod branchy_image;
use branchy_image::image;

#[path = "fast_compare.rs"]
mod fast_compare;

#[path = "libxdc_check.rs"]
mod libxdc_check;

fuzz_target!(|data: &[u8]| {
    fast_compare::check("input", data, image());
    libxdc_check::check(data, image());
});
