//! `hwtrace-bench`: hwtrace's decoders against their peers, measured in the
//! same run on the same bytes, reported as medians and ratios.
//!
//! Run it through `scripts/bench.sh`, which builds in release mode.

mod corpus;
mod flow;
mod packets;
mod stats;

use anyhow::{Result, bail};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "all".into());
    // Default sizes: 256 MiB of packets, 64 MiB of real/foo for flow.
    let mut size_mib: Option<usize> = None;
    let mut runs = 5usize;
    // gzip's trace holds ~29 instructions a byte, foo's ~4: 8 MiB of it is
    // about as many instructions as 64 MiB of foo.
    let mut exec_size_mib = 8usize;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size-mib" => size_mib = args.next().and_then(|v| v.parse().ok()).or(size_mib),
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            "--exec-size-mib" => {
                exec_size_mib = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(exec_size_mib)
            }
            other => bail!(
                "unknown option {other}; usage: hwtrace-bench [packets|flow|all] [--size-mib N] [--exec-size-mib N] [--runs N]"
            ),
        }
    }
    let packets = || packets::run(size_mib.unwrap_or(256), runs);
    let flow = || flow::run(size_mib.unwrap_or(64), exec_size_mib, runs);
    match what.as_str() {
        "packets" => packets(),
        "flow" => flow(),
        "all" => packets().and_then(|()| flow()),
        other => bail!("unknown benchmark {other:?}; known: packets, flow, all"),
    }
}
