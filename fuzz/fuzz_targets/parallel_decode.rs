//! Arbitrary bytes as an Intel PT trace over a fixed code image, decoded
//! sequentially and by PSB units in parallel ([`parallel_compare`]): the
//! items must be the same. The parallel decode's claim is exactness, so
//! any difference is a bug in how seams are found or compared.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "branchy_image.rs"]
mod branchy_image;
use branchy_image::image;

#[path = "parallel_compare.rs"]
mod parallel_compare;

fuzz_target!(|data: &[u8]| {
    parallel_compare::check("input", data, image());
});
