//! The trace output stage (SDM Vol. 3C §33.2.7) fed with the PT of a real
//! execution: seed 000's ToPA (one 4 KiB region per page, INT and STOP on
//! the last entry, END back to the table) and its single-range 4 KiB mask
//! (`MASK_PTRS = (1 << PAGE_SHIFT) - 1`). What is read back from the
//! regions must be the encoder's stream (or its newest part after a wrap),
//! and decode; when a slow consumer made the tracer drop packets, the OVF
//! packets must be where the losses say and the stream must still decode.
//!
//! Needs `qemu-x86_64` and libipt 2.0.5 (`scripts/setup.sh`).

use std::sync::OnceLock;

use anyhow::{Context, Result, ensure};
use hwtrace_libipt::{Config, Image, Sections, insn_addresses};
use hwtrace_packet::{Packet, PacketDecoder, find_psb_forward};
use hwtrace_regs::cpuid::{CpuidRegs, PtCaps};
use hwtrace_regs::output::{SingleRange, TopaPosition};
use hwtrace_regs::rtit::{RtitOutputBase, RtitOutputMaskPtrs};
use hwtrace_regs::topa::{TopaEntry, TopaLink, TopaRegion, TopaSize, build_table};
use hwtrace_sim::{
    Consumer, EncodedTrace, Execution, Limits, OutputRun, OutputTarget, PtConfig, PtEncoder,
    TopaTable, TscModel, write_output,
};
use hwtrace_types::PhysAddr;

/// `ls -l /` recorded once, and its PT with every RET a TIP, a TSC in each
/// PSB+ and PSBs every 256 bytes: more than seed 000's 16 KiB ToPA holds
/// (the tests that need this check it).
fn recorded() -> &'static (Execution, EncodedTrace) {
    static CELL: OnceLock<(Execution, EncodedTrace)> = OnceLock::new();
    CELL.get_or_init(|| {
        let rec = Execution::record_qemu("/bin/ls", &["-l", "/"], Limits::default())
            .expect("qemu-x86_64 records /bin/true (scripts/setup.sh installs qemu-user)");
        let config = PtConfig {
            psb_period: 256,
            return_compression: false,
            tsc: Some(TscModel {
                start: 0x1_0000,
                ticks_per_insn: 3,
            }),
            ..PtConfig::default()
        };
        let trace = PtEncoder::new(config)
            .encode(&rec.execution)
            .expect("the execution encodes");
        (rec.execution, trace)
    })
}

fn caps() -> PtCaps {
    PtCaps {
        sub0: CpuidRegs {
            eax: 1,
            ebx: 0,
            ecx: 0b111,
            edx: 0,
        },
        sub1: CpuidRegs::default(),
    }
}

const SEED_TABLE: PhysAddr = PhysAddr(0x7_0000);
const SEED_PAGES: [u64; 4] = [0x10_0000, 0x23_4000, 0x11_1000, 0x9_F000];

/// Seed 000's AllocAndSetTopa: one 4 KiB entry per page, `int`/`stop` on
/// the last, END back to the table.
fn seed_topa(int: bool, stop: bool) -> Result<Vec<TopaTable>> {
    let mut regions: Vec<TopaRegion> = SEED_PAGES
        .iter()
        .map(|&p| TopaRegion {
            base: PhysAddr(p),
            size: TopaSize::SIZE_4K,
            int: false,
            stop: false,
        })
        .collect();
    if let Some(last) = regions.last_mut() {
        last.int = int;
        last.stop = stop;
    }
    let mut out = [TopaEntry::new(); 8];
    let n = build_table(
        SEED_TABLE,
        &regions,
        TopaLink::End(SEED_TABLE),
        &mut out,
        &caps(),
        39,
    )?;
    Ok(vec![TopaTable {
        base: SEED_TABLE,
        entries: out[..n].to_vec(),
    }])
}

/// Decodes `trace` with libipt over the execution's code, from its first
/// PSB; returns the instruction addresses.
fn libipt_decode(execution: &Execution, trace: &[u8]) -> Result<Vec<u64>> {
    let mut sections = Sections::new();
    for seg in execution.memory().segments() {
        sections
            .insert(seg.addr.0, &seg.bytes)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let image = Image::with_memory(&sections).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (ips, errors) =
        insn_addresses(trace, &Config::default(), &image).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(errors.is_empty(), "libipt reported errors: {errors:?}");
    Ok(ips)
}

/// Every packet of `bytes` from its first PSB, or the first decode error.
fn packets(bytes: &[u8]) -> Result<Vec<(u64, Packet)>> {
    let mut dec = PacketDecoder::new(bytes);
    dec.sync_forward().context("no PSB")?;
    let mut out = Vec::new();
    while let Some(p) = dec.next_packet()? {
        out.push((p.offset.0, p.packet));
    }
    Ok(out)
}

/// The encoder's stream is longer than seed 000's 16 KiB ToPA, so the
/// STOP on the last entry fires: exactly 16 KiB are written, the PMI comes
/// with the last byte, Stopped is set and TriggerEn cleared, and the MSRs
/// point at the STOP entry with OutputOffset = region size (§33.2.7.2
/// “ToPA STOP”).
#[test]
fn seed_000_topa_stop_and_int_on_the_last_entry() -> Result<()> {
    let (_, trace) = recorded();
    let capacity = 4 * 4096;
    ensure!(
        trace.bytes.len() > capacity,
        "the trace ({} bytes) must overflow the 16 KiB ToPA",
        trace.bytes.len()
    );
    let run = write_output(
        &trace.bytes,
        &OutputTarget::Topa {
            tables: seed_topa(true, true)?,
        },
        None,
    )?;
    assert_eq!(run.written, capacity as u64);
    assert_eq!(run.lost_after_stop, (trace.bytes.len() - capacity) as u64);
    assert_eq!(run.read_back(), trace.bytes[..capacity].to_vec());
    for (region, page) in run.regions.iter().zip(SEED_PAGES) {
        assert_eq!(region.base, PhysAddr(page));
        assert_eq!(region.bytes.len(), 4096);
    }
    assert_eq!(run.pmis.len(), 1);
    assert_eq!(run.pmis[0].written, capacity as u64);
    assert_eq!(run.pmis[0].entry, 3);
    assert_eq!(run.pmis[0].region, PhysAddr(0x9_F000));
    assert!(run.status.stopped());
    assert!(!run.status.trigger_en());
    assert_eq!(run.output_base.base_phys_addr(), SEED_TABLE.0);
    assert_eq!(run.mask_ptrs.mask_or_table_offset(), 3);
    assert_eq!(run.mask_ptrs.output_offset(), 4096);
    assert_eq!(run.mask_ptrs.lower_mask(), 0x7F);
    // What was written is a prefix of the stream; its packets decode up to
    // the cut (the last packet may be cut in the middle, as the SDM says).
    let kept = run.read_back();
    let last_psb = trace
        .psbs
        .iter()
        .rev()
        .find(|m| (m.offset.0 as usize) < capacity)
        .context("a PSB inside the first 16 KiB")?;
    let whole = &kept[..last_psb.offset.0 as usize];
    assert!(!packets(whole)?.is_empty());
    Ok(())
}

/// Without STOP the END entry makes a ring: INT raises a PMI each time the
/// last region fills, and the buffer holds the newest 16 KiB.
#[test]
fn seed_000_topa_ring_wraps_with_a_pmi_per_lap() -> Result<()> {
    let (_, trace) = recorded();
    let len = trace.bytes.len() as u64;
    let capacity = 4 * 4096u64;
    let run = write_output(
        &trace.bytes,
        &OutputTarget::Topa {
            tables: seed_topa(true, false)?,
        },
        None,
    )?;
    assert_eq!(run.written, len);
    assert_eq!(run.lost_after_stop, 0);
    assert!(!run.status.stopped());
    assert!(run.status.trigger_en());
    let laps: Vec<u64> = (1..=len / capacity).map(|k| k * capacity).collect();
    let pmis: Vec<u64> = run.pmis.iter().map(|p| p.written).collect();
    assert_eq!(pmis, laps);
    let back = run.read_back();
    assert_eq!(back, trace.bytes[(len - capacity) as usize..].to_vec());
    // The MSRs name where the next byte goes.
    let pos = TopaPosition::from_msrs(run.output_base, run.mask_ptrs)?;
    let in_lap = len % capacity;
    assert_eq!(u64::from(pos.entry_index()), in_lap / 4096);
    assert_eq!(u64::from(pos.offset()), in_lap % 4096);
    // The newest bytes decode from their first PSB.
    let psb = find_psb_forward(&back, 0).context("a PSB in the newest 16 KiB")?;
    assert!(!packets(&back[psb..])?.is_empty());
    Ok(())
}

/// Two tables linked by END entries (regions of 4 and 8 KiB), the second
/// linking back to the first: a ring large enough for the whole trace
/// reads back as exactly the encoder's stream, which libipt decodes to the
/// executed instructions.
#[test]
fn two_linked_tables_hold_the_whole_trace_and_decode() -> Result<()> {
    let (execution, trace) = recorded();
    let len = trace.bytes.len() as u64;
    let (a, b) = (PhysAddr(0x1000), PhysAddr(0x2000));
    let big = TopaSize::from_bytes((len / 2).next_power_of_two().max(8192)).context("size")?;
    let region = |base: u64, size, int| TopaRegion {
        base: PhysAddr(base),
        size,
        int,
        stop: false,
    };
    let mut ta = [TopaEntry::new(); 4];
    let mut tb = [TopaEntry::new(); 4];
    let na = build_table(
        a,
        &[region(0x10_0000, TopaSize::SIZE_4K, false)],
        TopaLink::End(b),
        &mut ta,
        &caps(),
        46,
    )?;
    let nb = build_table(
        b,
        &[
            region(0x1000_0000, big, true),
            region(0x2000_0000, big, false),
        ],
        TopaLink::End(a),
        &mut tb,
        &caps(),
        46,
    )?;
    let run = write_output(
        &trace.bytes,
        &OutputTarget::Topa {
            tables: vec![
                TopaTable {
                    base: a,
                    entries: ta[..na].to_vec(),
                },
                TopaTable {
                    base: b,
                    entries: tb[..nb].to_vec(),
                },
            ],
        },
        None,
    )?;
    assert_eq!(run.read_back(), trace.bytes);
    assert_eq!(run.pmis.len(), usize::from(len >= 4096 + big.bytes()));
    assert_eq!(
        libipt_decode(execution, &run.read_back())?,
        execution.insns().iter().map(|ip| ip.0).collect::<Vec<_>>()
    );
    Ok(())
}

/// Seed 000's single range: `MASK_PTRS = 0xFFF`, a 4 KiB page. The write
/// offset wraps; the buffer holds the newest 4 KiB, and the MSRs read back
/// as a position the processor accepts.
#[test]
fn seed_000_single_range_4k_wraps() -> Result<()> {
    let (_, trace) = recorded();
    let len = trace.bytes.len() as u64;
    let base = PhysAddr(0x1234_5000);
    let start = SingleRange::from_msrs(
        RtitOutputBase::from_raw(base.0),
        RtitOutputMaskPtrs::from_raw((1 << 12) - 1),
    )?;
    let run = write_output(
        &trace.bytes,
        &OutputTarget::SingleRange {
            base: start.base(),
            size: start.size(),
        },
        None,
    )?;
    let end = SingleRange::from_msrs(run.output_base, run.mask_ptrs)?;
    assert_eq!(end.base(), base);
    assert_eq!(end.offset(), len % 4096);
    assert_eq!(run.mask_ptrs.raw() & 0xFFFF_FFFF, 0xFFF);
    assert_eq!(run.regions.len(), 1);
    assert_eq!(run.regions[0].bytes.len(), 4096);
    let back = run.read_back();
    assert_eq!(back, trace.bytes[(len - 4096) as usize..].to_vec());
    let psb = find_psb_forward(&back, 0).context("a PSB in the newest 4 KiB")?;
    assert!(!packets(&back[psb..])?.is_empty());
    Ok(())
}

/// A single range large enough for the whole trace: read back, the bytes
/// are the encoder's, and libipt decodes them to the executed instructions.
#[test]
fn single_range_without_wrap_reads_back_the_stream() -> Result<()> {
    let (execution, trace) = recorded();
    let size = (trace.bytes.len() as u64).next_power_of_two();
    let run = write_output(
        &trace.bytes,
        &OutputTarget::SingleRange {
            base: PhysAddr(size * 4),
            size,
        },
        None,
    )?;
    assert_eq!(run.read_back(), trace.bytes);
    assert_eq!(run.mask_ptrs.output_offset(), trace.bytes.len() as u64);
    assert!(run.losses.is_empty());
    assert_eq!(
        libipt_decode(execution, &run.read_back())?,
        execution.insns().iter().map(|ip| ip.0).collect::<Vec<_>>()
    );
    Ok(())
}

fn check_losses(run: &OutputRun, original: &[u8]) -> Result<()> {
    ensure!(!run.losses.is_empty(), "the slow consumer lost nothing");
    let decoded = packets(&run.stream)?;
    let ovfs: Vec<u64> = decoded
        .iter()
        .filter(|(_, p)| matches!(p, Packet::Ovf))
        .map(|&(at, _)| at)
        .collect();
    let expected: Vec<u64> = run
        .losses
        .iter()
        .filter_map(|l| l.ovf_at)
        .map(|o| o.0)
        .collect();
    assert_eq!(ovfs, expected, "an OVF exactly where each loss ended");
    for &at in &ovfs {
        let next = decoded
            .iter()
            .find(|(o, _)| *o > at)
            .context("a packet after OVF")?;
        assert!(matches!(next.1, Packet::Psb), "OVF is followed by a PSB");
    }
    let lost: u64 = run.losses.iter().map(|l| l.bytes).sum();
    assert_eq!(
        run.stream.len() as u64 + lost,
        original.len() as u64 + 2 * ovfs.len() as u64
    );
    // Each loss starts on a packet boundary of the original stream.
    let boundaries: Vec<u64> = packets(original)?.iter().map(|&(at, _)| at).collect();
    for loss in &run.losses {
        ensure!(
            boundaries.binary_search(&loss.from.0).is_ok(),
            "loss at {} is not a packet boundary",
            loss.from.0
        );
    }
    Ok(())
}

/// A consumer draining 1 KiB per 4 KiB produced cannot keep up with a
/// 4 KiB range: packets are lost and each loss ends with OVF before a PSB;
/// the whole written stream decodes packet by packet.
#[test]
fn slow_consumer_on_a_single_range_loses_packets_and_writes_ovf() -> Result<()> {
    let (_, trace) = recorded();
    let run = write_output(
        &trace.bytes,
        &OutputTarget::SingleRange {
            base: PhysAddr(0x1234_5000),
            size: 4096,
        },
        Some(Consumer {
            drain: 1024,
            per: 4096,
        }),
    )?;
    check_losses(&run, &trace.bytes)
}

/// The same consumer behind seed 000's ToPA ring (no STOP).
#[test]
fn slow_consumer_on_the_seed_topa_ring() -> Result<()> {
    let (_, trace) = recorded();
    let run = write_output(
        &trace.bytes,
        &OutputTarget::Topa {
            tables: seed_topa(true, false)?,
        },
        Some(Consumer {
            drain: 2048,
            per: 8192,
        }),
    )?;
    check_losses(&run, &trace.bytes)?;
    // Nothing unread was overwritten: the ring holds the newest bytes.
    let keep = run.stream.len().min(4 * 4096);
    assert_eq!(
        run.read_back(),
        run.stream[run.stream.len() - keep..].to_vec()
    );
    Ok(())
}

/// A consumer at least as fast as the tracer loses nothing: the stream
/// goes through unchanged.
#[test]
fn fast_consumer_loses_nothing() -> Result<()> {
    let (_, trace) = recorded();
    let run = write_output(
        &trace.bytes,
        &OutputTarget::SingleRange {
            base: PhysAddr(0x1234_5000),
            size: 4096,
        },
        Some(Consumer { drain: 64, per: 64 }),
    )?;
    assert!(run.losses.is_empty());
    assert_eq!(run.stream, trace.bytes);
    Ok(())
}
