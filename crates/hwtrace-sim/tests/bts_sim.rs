//! BTS simulation checked by decoding what it wrote: seed 001's buffer
//! (2000 records, interrupt at record 1900, drain and re-arm), circular
//! buffers in both layouts, and random streams and configurations.

use hwtrace_regs::debugctl::{BtsMode, DebugCtl, DebugCtlFlag, DebugCtlLayout};
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::dump::{BtsDump, BtsOrder};
use hwtrace_sim::decode::bts_branches;
use hwtrace_sim::{Branch, BranchKind, BtsConfig, BtsSim, RecordedBranch};
use hwtrace_types::Ip;
use proptest::prelude::*;

/// Branch `i` of a synthetic stream: distinct addresses, every seventh one
/// mispredicted.
fn branch(i: u64) -> Branch {
    Branch {
        mispredicted: Some(i % 7 == 3),
        ..Branch::user(
            Ip(0x8000_1240 + 0x10 * i),
            Ip(0x8000_2000 + 0x10 * i),
            BranchKind::Jcc,
        )
    }
}

fn area(format: DsFormat, capacity: u64, threshold: u64) -> DsManagementArea {
    let size = format.bts_record_size();
    let base = 0x8100_0000;
    DsManagementArea {
        bts_buffer_base: base,
        bts_index: base,
        bts_absolute_maximum: base + capacity * size,
        bts_interrupt_threshold: base + threshold * size,
        ..DsManagementArea::default()
    }
}

/// Everything a draining run leaves: drained records, then the buffer from
/// base to index, decoded.
fn decode_linear(sim: &BtsSim, drained: &[u8]) -> Vec<RecordedBranch> {
    let format = sim.config().format;
    let raw = BtsDump::raw(drained, format).expect("whole records drained");
    let area_bytes = sim.area_bytes().expect("pointers fit");
    let area = DsManagementArea::parse(&area_bytes, format).expect("area parses back");
    let rest = BtsDump::new(&area, sim.buffer(), format, BtsOrder::Linear).expect("valid");
    let mut all = bts_branches(&raw);
    all.extend(bts_branches(&rest));
    all
}

/// Seed 001 on a Pentium 4: MSR_DEBUGCTLA = 0x1C (TR, BTS, BTINT), a
/// 2000-record 32-bit buffer with the threshold at record 1900; the handler
/// copies the records out and resets the index.
#[test]
fn seed_001_interrupts_at_record_1900_and_drains() {
    let debugctl = DebugCtl::from_raw(0x1C, DebugCtlLayout::NetBurst);
    assert_eq!(debugctl.bts_mode(), BtsMode::InterruptOnThreshold);
    let config = BtsConfig {
        format: DsFormat::Bits32,
        area: area(DsFormat::Bits32, 2000, 1900),
        debugctl,
        pmi_latency: 0,
    };
    let stream: Vec<Branch> = (0..5000).map(branch).collect();
    let mut sim = BtsSim::new(config).expect("seed 001 is valid");
    let (report, drained) = sim.run_draining(&stream).expect("runs");
    let at: Vec<(usize, u64)> = report.pmis.iter().map(|p| (p.branch, p.records)).collect();
    assert_eq!(at, vec![(1899, 1900), (3799, 1900)]);
    assert_eq!((report.written, report.lost, report.wraps), (5000, 0, 0));
    assert_eq!(drained.len(), 3800 * 12);
    assert_eq!(sim.records_before_index(), 1200);
    let want: Vec<_> = stream.iter().map(RecordedBranch::bts).collect();
    assert_eq!(decode_linear(&sim, &drained), want);
}

/// The threshold leaves 100 records of headroom: an interrupt delivered 50
/// branches late loses nothing, one delivered 150 late loses 50 records.
#[test]
fn seed_001_headroom_covers_interrupt_latency_up_to_100_records() {
    let stream: Vec<Branch> = (0..2500).map(branch).collect();
    for (latency, lost) in [(50u32, 0u64), (99, 0), (150, 50)] {
        let config = BtsConfig {
            format: DsFormat::Bits32,
            area: area(DsFormat::Bits32, 2000, 1900),
            debugctl: DebugCtl::from_raw(0x1C, DebugCtlLayout::NetBurst),
            pmi_latency: latency,
        };
        let mut sim = BtsSim::new(config).expect("valid");
        let (report, drained) = sim.run_draining(&stream).expect("runs");
        assert_eq!(report.lost, lost, "latency {latency}");
        let first = report.pmis[0];
        assert_eq!(first.records, 1900);
        assert_eq!(
            first.records_at_handler,
            (1900 + u64::from(latency)).min(2000)
        );
        // The lost records are the ones after the buffer filled, before the handler ran.
        let want: Vec<_> = stream
            .iter()
            .enumerate()
            .filter(|(i, _)| !(2000..2000 + lost as usize).contains(i))
            .map(|(_, b)| RecordedBranch::bts(b))
            .collect();
        assert_eq!(decode_linear(&sim, &drained), want, "latency {latency}");
    }
}

/// BTINT = 0 with the threshold beyond the maximum: no interrupt, the
/// buffer wraps and keeps the newest `capacity` records, in both layouts.
#[test]
fn circular_buffers_keep_the_newest_records_in_both_layouts() {
    for format in [DsFormat::Bits32, DsFormat::Bits64] {
        for n in [0u64, 5, 64, 65, 1000] {
            let debugctl = DebugCtl::new(DebugCtlLayout::Modern)
                .with(DebugCtlFlag::Tr, true)
                .and_then(|c| c.with(DebugCtlFlag::Bts, true))
                .expect("modern flags");
            let config = BtsConfig {
                format,
                area: area(format, 64, 65),
                debugctl,
                pmi_latency: 0,
            };
            let stream: Vec<Branch> = (0..n).map(branch).collect();
            let mut sim = BtsSim::new(config).expect("valid");
            let report = sim.run(&stream, |_, _| {}).expect("runs");
            assert!(report.pmis.is_empty());
            assert_eq!(report.wraps, n / 64);
            let area_bytes = sim.area_bytes().expect("fits");
            let a = DsManagementArea::parse(&area_bytes, format).expect("parses");
            let dump = BtsDump::new(&a, sim.buffer(), format, BtsOrder::Circular).expect("valid");
            let keep = n.saturating_sub(64) as usize;
            let want: Vec<_> = stream[keep..].iter().map(RecordedBranch::bts).collect();
            assert_eq!(bts_branches(&dump), want, "{format:?}, {n} branches");
        }
    }
}

/// A DEBUGCTL configuration drawn from the valid TR/BTS/BTINT combinations
/// of seed 002 plus the CPL filters.
fn debugctl(btint: bool, off_os: bool, off_usr: bool) -> DebugCtl {
    [
        (DebugCtlFlag::Tr, true),
        (DebugCtlFlag::Bts, true),
        (DebugCtlFlag::Btint, btint),
        (DebugCtlFlag::BtsOffOs, off_os),
        (DebugCtlFlag::BtsOffUsr, off_usr),
    ]
    .into_iter()
    .fold(DebugCtl::new(DebugCtlLayout::Modern), |c, (f, on)| {
        c.with(f, on).expect("modern flag")
    })
}

proptest! {
    /// Random streams (addresses, CPLs, predictions) through random
    /// buffers: what the DS area and buffer hold decodes to exactly the
    /// stored branches, in order.
    #[test]
    fn simulate_then_decode_gives_the_stored_branches(
        raw in proptest::collection::vec((1u64..0xFFFF_FFFF, 0u64..0xFFFF_FFFF, any::<bool>(), 0u8..4), 0..300),
        wide in any::<bool>(),
        capacity in 1u64..40,
        threshold_off in 0u64..40,
        latency in 0u32..8,
        btint in any::<bool>(),
        off_os in any::<bool>(),
        off_usr in any::<bool>(),
    ) {
        let format = if wide { DsFormat::Bits64 } else { DsFormat::Bits32 };
        let stream: Vec<Branch> = raw
            .iter()
            .map(|&(from, to, mis, cpl)| Branch {
                from_cpl: cpl,
                to_cpl: cpl,
                mispredicted: Some(mis),
                ..Branch::user(Ip(from), Ip(to), BranchKind::NearIndJmp)
            })
            .collect();
        let stored: Vec<RecordedBranch> = stream
            .iter()
            .filter(|b| !(if b.from_cpl == 0 { off_os } else { off_usr }))
            .map(RecordedBranch::bts)
            .collect();
        let threshold = if btint { threshold_off % capacity } else { capacity + 1 };
        let config = BtsConfig {
            format,
            area: area(format, capacity, threshold),
            debugctl: debugctl(btint, off_os, off_usr),
            pmi_latency: latency,
        };
        let mut sim = BtsSim::new(config).expect("valid configuration");
        if btint {
            let (report, drained) = sim.run_draining(&stream).expect("runs");
            let got = decode_linear(&sim, &drained);
            prop_assert_eq!(got.len() as u64 + report.lost, stored.len() as u64);
            if report.lost == 0 {
                prop_assert_eq!(got, stored);
            } else {
                // Lost records are a gap; what remains keeps its order.
                let mut it = stored.iter();
                prop_assert!(got.iter().all(|g| it.any(|s| s == g)));
            }
        } else {
            sim.run(&stream, |_, _| {}).expect("runs");
            let bytes = sim.area_bytes().expect("fits");
            let a = DsManagementArea::parse(&bytes, format).expect("parses");
            let dump = BtsDump::new(&a, sim.buffer(), format, BtsOrder::Circular).expect("valid");
            let keep = stored.len().saturating_sub(capacity as usize);
            prop_assert_eq!(bts_branches(&dump), stored[keep..].to_vec());
        }
    }
}
