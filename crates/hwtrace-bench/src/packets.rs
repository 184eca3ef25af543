//! Packet decoding: hwtrace-packet against libipt's `pt_pkt_next`.

use crate::corpus::real_traces_repeated;
use crate::stats::{mb_per_s, median};
use anyhow::{Result, ensure};
use hwtrace_packet::PacketDecoder;

/// Decodes every packet, resyncing after errors; returns (packets, errors).
pub(crate) fn hwtrace_count(trace: &[u8]) -> (u64, u64) {
    let mut d = PacketDecoder::new(trace);
    let (mut packets, mut errors) = (0u64, 0u64);
    if d.sync_forward().is_err() {
        return (0, 0);
    }
    loop {
        match d.next_packet() {
            Ok(Some(_)) => packets += 1,
            Ok(None) => break,
            Err(_) => {
                errors += 1;
                if d.resync().is_err() {
                    break;
                }
            }
        }
    }
    (packets, errors)
}

pub fn run(size_mib: usize, runs: usize) -> Result<()> {
    let trace = real_traces_repeated(size_mib << 20)?;
    let mib = trace.len() as f64 / (1 << 20) as f64;
    println!(
        "packets: real traces (foo, Unzip, icelake_tip) repeated to {mib:.0} MiB, median of {runs} runs"
    );

    let (ours_t, ours) = median(runs, || hwtrace_count(&trace));
    let cfg = hwtrace_libipt::Config::default();
    let (ipt_t, ipt) = median(runs, || hwtrace_libipt::count_packets(&trace, &cfg));
    let ipt = ipt?;
    ensure!(
        ours == ipt,
        "hwtrace decoded {ours:?} (packets, errors), libipt {ipt:?}"
    );

    let ours_mb = mb_per_s(trace.len(), ours_t);
    let ipt_mb = mb_per_s(trace.len(), ipt_t);
    println!(
        "  {:<28} {:>10} {:>12} {:>14}",
        "decoder", "MB/s", "packets", "Mpackets/s"
    );
    for (name, mbs, t) in [
        ("hwtrace-packet", ours_mb, ours_t),
        ("libipt pt_pkt_next (2.0.5)", ipt_mb, ipt_t),
    ] {
        println!(
            "  {name:<28} {mbs:>10.0} {:>12} {:>14.1}",
            ours.0,
            ours.0 as f64 / t.as_secs_f64() / 1e6
        );
    }
    println!("  ratio hwtrace / libipt: {:.2}x", ours_mb / ipt_mb);
    Ok(())
}
