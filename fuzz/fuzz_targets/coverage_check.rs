//! The checks of the `coverage_parts` fuzz target, shared with the
//! regression test that replays its saved inputs
//! (`crates/hwtrace-report/tests/coverage_fuzz_regressions.rs`).
//!
//! The input is read as a stream of records one thread's raw trace could
//! give (runs and single instructions over a small program, under three
//! CR3s, with every kind of gap and times between) and as the places the
//! stream is cut: each stretch's coverage is built apart
//! (`CoveragePart`) and the parts merged in order must be exactly the
//! coverage of the stream taken whole (blocks, edges, hits, left-filter
//! marks, instructions).

use hwtrace_flow::insn::InsnClass;
use hwtrace_report::coverage::{Coverage, CoverageBuilder, CoveragePart};
use hwtrace_report::exec::{Exec, ExecInsn, ExecRun, GapKind};
use hwtrace_types::{AddressSpace, Cr3, Ip, TraceOffset};

/// The classes a record's last instruction may have.
const CLASSES: [InsnClass; 5] = [
    InsnClass::CondJump,
    InsnClass::Jump,
    InsnClass::Call,
    InsnClass::Return,
    InsnClass::Other,
];

const GAPS: [GapKind; 5] = [
    GapKind::Disabled,
    GapKind::Interrupted,
    GapKind::Lost,
    GapKind::Overflow,
    GapKind::DecodeError,
];

/// The records and the cuts `data` stands for.
pub fn records(data: &[u8]) -> (Vec<Exec>, Vec<usize>) {
    let (cuts, rest) = match data.split_first() {
        Some((&n, rest)) => {
            let n = usize::from(n % 8).min(rest.len() / 2);
            rest.split_at(2 * n)
        }
        None => (&[][..], data),
    };
    let mut space = AddressSpace::UNKNOWN;
    let mut out = Vec::new();
    for r in rest.chunks_exact(3) {
        let (k, a, b) = (r[0], r[1], r[2]);
        let ip = 0x1000 + 0x20 * u64::from(a % 16) + 2 * u64::from((a >> 4) % 4);
        let class = if b & 4 != 0 {
            CLASSES[usize::from(b >> 3) % CLASSES.len()]
        } else {
            InsnClass::Other
        };
        match k % 8 {
            0..=3 => {
                let insns = 1 + u32::from(b % 3);
                out.push(Exec::Run(ExecRun {
                    space,
                    ip: Ip(ip),
                    insns,
                    last_ip: Ip(ip + 2 * u64::from(insns - 1)),
                    last_size: 2,
                    last_class: class,
                }));
            }
            4 => out.push(Exec::Insn(ExecInsn {
                space,
                ip: Ip(ip),
                size: if b & 0x80 != 0 { 0 } else { 2 },
                class,
            })),
            5 => out.push(Exec::Gap {
                offset: TraceOffset(u64::from(a)),
                why: GAPS[usize::from(a) % GAPS.len()],
            }),
            6 => {
                space.cr3 = [None, Some(Cr3(0x5000)), Some(Cr3(0x6000))][usize::from(a % 3)];
            }
            _ => out.push(Exec::Time(u64::from(a))),
        }
    }
    let mut cuts: Vec<usize> = cuts
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (out.len() + 1))
        .collect();
    cuts.sort_unstable();
    (out, cuts)
}

/// Fails if the parts merged differ from the whole; returns how many
/// records the input gave.
pub fn check(data: &[u8]) -> usize {
    let (records, cuts) = records(data);
    let whole = Coverage::from_execs(&records);
    let mut merged = CoverageBuilder::new();
    let mut from = 0;
    for &to in cuts.iter().chain([&records.len()]) {
        let mut part = CoveragePart::new();
        for e in &records[from..to] {
            part.push(e);
        }
        merged.merge(part);
        from = to;
    }
    let merged = merged.finish();
    assert!(
        merged == whole,
        "cut at {cuts:?}, {} records: merged {merged:?}, whole {whole:?}",
        records.len()
    );
    records.len()
}
