//! Timing helpers: run a closure several times, keep the median.

use std::time::{Duration, Instant};

/// The median duration of `runs` calls of `f` (after one warm-up call), and
/// the value the last call returned.
pub fn median<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut last = f();
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            last = std::hint::black_box(f());
            t.elapsed()
        })
        .collect();
    times.sort();
    (times[times.len() / 2], last)
}

/// Megabytes (10^6 bytes) per second.
pub fn mb_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}
