//! `hwtrace-bench`: hwtrace's decoders against their peers, measured in the
//! same run on the same bytes, reported as medians and ratios.
//!
//! Run it through `scripts/bench.sh`, which builds in release mode.

mod corpus;
mod decode;
mod flow;
mod packets;
mod stats;

use anyhow::{Context, Result, bail};
use std::path::Path;

const USAGE: &str = "usage: hwtrace-bench [packets|flow|decode|answers|all] [--size-mib N] [--exec-size-mib N] [--runs N]
       decode and answers options: [--size-mib N (1024)] [--rss-size-mib N (256)] [--prefix-mib N (32)] [--perf-mib N (1)] [--runs N (5)] [--row-budget-secs N (150)]";

fn number<T: std::str::FromStr>(args: &mut impl Iterator<Item = String>, flag: &str) -> Result<T> {
    let v = args
        .next()
        .with_context(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| anyhow::anyhow!("{flag} {v:?}: not a number"))
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "all".into());
    if matches!(what.as_str(), "-h" | "--help" | "help") {
        println!("{USAGE}");
        return Ok(());
    }
    if what == "decoder" {
        // A child of `decode`: one library decoder over one trace.
        let (Some(name), Some(trace), Some(corpus)) = (args.next(), args.next(), args.next())
        else {
            bail!("usage: hwtrace-bench decoder NAME TRACE CORPUS_DIR");
        };
        return decode::child_main(&name, Path::new(&trace), Path::new(&corpus));
    }
    // Default sizes: 256 MiB of packets, 64 MiB of real/foo for flow.
    let mut size_mib: Option<usize> = None;
    let mut runs: Option<usize> = None;
    // gzip's trace holds ~29 instructions a byte, foo's ~4: 8 MiB of it is
    // about as many instructions as 64 MiB of foo.
    let mut exec_size_mib = 8usize;
    let mut dec = decode::Options::default();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size-mib" => size_mib = Some(number(&mut args, &a)?),
            "--runs" => runs = Some(number(&mut args, &a)?),
            "--exec-size-mib" => exec_size_mib = number(&mut args, &a)?,
            "--rss-size-mib" => dec.rss_size_mib = number(&mut args, &a)?,
            "--prefix-mib" => dec.prefix_mib = number(&mut args, &a)?,
            "--perf-mib" => dec.perf_mib = number(&mut args, &a)?,
            "--row-budget-secs" => dec.row_budget_secs = number(&mut args, &a)?,
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown option {other}\n{USAGE}"),
        }
    }
    if let Some(s) = size_mib {
        dec.size_mib = s as u64;
    }
    if let Some(r) = runs {
        dec.runs = r;
    }
    let runs = runs.unwrap_or(5);
    let packets = || packets::run(size_mib.unwrap_or(256), runs);
    let flow = || flow::run(size_mib.unwrap_or(64), exec_size_mib, runs);
    let decode = || decode::run(&dec);
    let answers = || decode::answers(&dec);
    match what.as_str() {
        "packets" => packets(),
        "flow" => flow(),
        "decode" => decode(),
        "answers" => answers(),
        "all" => packets()
            .and_then(|()| flow())
            .and_then(|()| decode())
            .and_then(|()| answers()),
        other => bail!(
            "unknown benchmark {other:?}; known: packets, flow, decode, answers, all\n{USAGE}"
        ),
    }
}
