//! The checks of the `parallel_decode` fuzz target, shared with the
//! regression test that replays its saved inputs
//! (`crates/hwtrace-flow/tests/parallel_fuzz_regressions.rs`).
//!
//! A trace is decoded sequentially and by PSB units in parallel
//! (hwtrace-flow's engine, every PSB a unit of its own, two threads,
//! small item budgets so the merging thread decodes too), with the
//! instruction decoder and with the block-cached one; the items must be
//! the same, one for one, times included. The decoder's configuration
//! converts MTC and CYC packets to time (the crystal clock ratio, MTC
//! frequency and nominal ratio are set), so a unit's clock, warmed over
//! the packets before its PSB, is compared at every seam; inputs of odd
//! length decode with `lenient_status`.

use hwtrace_flow::insn::{FastDecoder, InsnDecoder};
use hwtrace_flow::parallel::{self, FastSource, Flow, FlowItem, ParallelConfig, StepSource};
use hwtrace_flow::{Config, TimeConfig};
use hwtrace_types::ReadMemory;

/// Instructions without trace before a flow gives up: small, so inputs
/// that loop stay cheap.
const MAX_STALL: u64 = 1 << 12;

/// Fails naming the first item the parallel decode of `data` got wrong.
pub fn check<M: ReadMemory + Copy + Send + Sync>(name: &str, data: &[u8], image: M) {
    if parallel::psb_offsets(data).len() < 2 {
        return;
    }
    let config = config(data);
    same(name, "insn", data, || InsnDecoder::new(data, config, image));
    same(name, "fast", data, || {
        FastSource::new(FastDecoder::new(data, config, image))
    });
}

/// The decoder's configuration for `data`: MTC and CYC packets become
/// time; inputs of odd length read status leniently, those starting with
/// an odd byte apply erratum SKL168's check.
pub fn config(data: &[u8]) -> Config {
    Config {
        time: TimeConfig {
            mtc_freq: 3,
            nom_freq: 20,
            cpuid_0x15_eax: 2,
            cpuid_0x15_ebx: 125,
            skl168: data.first().is_some_and(|b| b & 1 == 1),
        },
        lenient_status: data.len() % 2 == 1,
        ..Config::default()
    }
}

fn same<S: StepSource + Send>(name: &str, what: &str, data: &[u8], make: impl Fn() -> S + Sync) {
    let want: Vec<FlowItem> = Flow::new(make()).with_max_stall(MAX_STALL).collect();
    let split = ParallelConfig {
        unit_bytes: 1,
        window: 4,
        max_stall: MAX_STALL,
        unit_items: 64,
        batch: 7,
        ..ParallelConfig::new(2)
    };
    let mut got = Vec::with_capacity(want.len());
    let decoded = parallel::decode(data, &split, make, |batch| {
        got.extend(batch);
        Ok::<(), ()>(())
    });
    assert!(
        decoded.is_ok(),
        "{name} ({what}): the parallel decode failed"
    );
    if let Some(at) = (0..want.len().max(got.len())).find(|&i| want.get(i) != got.get(i)) {
        panic!(
            "{name} ({what}): item {at} of {} differs: sequential {:?}, parallel {:?}",
            want.len(),
            want.get(at),
            got.get(at)
        );
    }
}
