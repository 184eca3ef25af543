//! `hwtrace-bench`: hwtrace's decoders against their peers, measured in the
//! same run on the same bytes, reported as medians and ratios.
//!
//! Run it through `scripts/bench.sh`, which builds in release mode.

mod corpus;
mod packets;
mod stats;

use anyhow::{Result, bail};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "all".into());
    let mut size_mib = 256usize;
    let mut runs = 5usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size-mib" => size_mib = args.next().and_then(|v| v.parse().ok()).unwrap_or(size_mib),
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            other => bail!(
                "unknown option {other}; usage: hwtrace-bench [packets|all] [--size-mib N] [--runs N]"
            ),
        }
    }
    match what.as_str() {
        "packets" | "all" => packets::run(size_mib, runs),
        other => bail!("unknown benchmark {other:?}; known: packets, all"),
    }
}
