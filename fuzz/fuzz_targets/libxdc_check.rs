//! The `fast_decode` fuzz target's check of libxdc's map and edge list
//! (`hwtrace_report::coverage::libxdc::LibxdcMap`), shared with
//! hwtrace-report's `tests/libxdc_fuzz_regressions.rs`: listing the edges
//! (libxdc's walks through the code at FUPs included) must leave the map
//! and the summary as counting alone does, and list every counted edge.
//! Inputs of odd length decode with `lenient_status`, as `fast_compare`'s.

use hwtrace_flow::Config;
use hwtrace_report::coverage::libxdc::LibxdcMap;
use hwtrace_types::ReadMemory;

/// Decodes `data` over `image` counting, then listing; panics where the
/// two differ.
pub fn check<M: ReadMemory + Copy>(data: &[u8], image: M) {
    let config = Config {
        lenient_status: data.len() % 2 == 1,
        ..Config::default()
    };
    let mut counting = LibxdcMap::new(1 << 16).expect("a power of two");
    let counted = counting.decode(data, config, image);
    let mut listing = LibxdcMap::new(1 << 16).expect("a power of two");
    let mut edges = 0u64;
    let listed = listing.decode_with_edges(data, config, image, |_, _| edges += 1);
    assert_eq!(counted, listed, "the summaries differ");
    assert!(
        counting.map() == listing.map(),
        "listing the edges changed the map"
    );
    assert!(
        edges >= listed.edges,
        "{edges} edges listed, {} counted",
        listed.edges
    );
}
