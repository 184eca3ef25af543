//! Arbitrary bytes as an Intel PT trace over a fixed code image: the
//! instruction decoder must never panic, never loop without consuming trace
//! (bounded steps), and every resync must move forward.
#![no_main]

use hwtrace_flow::Config;
use hwtrace_flow::insn::{InsnDecoder, Step};
use libfuzzer_sys::fuzz_target;

#[path = "branchy_image.rs"]
mod branchy_image;
use branchy_image::image;

fuzz_target!(|data: &[u8]| {
    let mut d = InsnDecoder::new(data, Config::default(), image());
    if d.sync_forward().is_err() {
        return;
    }
    // The decoder stops code that consumes no trace after a few million
    // instructions; allow that, but no more.
    let budget = 8_000_000usize + 64 * data.len();
    let mut last_resync = d.sync_offset();
    for _ in 0..budget {
        match d.next() {
            Ok(Some(Step::Insn(_) | Step::Event(_))) => {}
            Ok(None) => return,
            Err(_) => match d.sync_forward() {
                Ok(_) => {
                    let now = d.sync_offset();
                    assert!(
                        now > last_resync,
                        "resync did not move forward: {last_resync:?} -> {now:?}"
                    );
                    last_resync = now;
                }
                Err(_) => return,
            },
        }
    }
    panic!("decoder did not finish within {budget} steps");
});
