//! The checks of the `regs_dumps` fuzz target, shared with hwtrace-regs'
//! `tests/fuzz_regressions.rs`: arbitrary bytes as the register and memory
//! dumps `hwtrace bts`, `hwtrace lbr` and `hwtrace msr` read.
//!
//! The first byte picks the input's kind:
//! - 0: a DS management area (32- or 64-bit layout) followed by its BTS
//!   buffer, read linearly and circularly;
//! - 1: raw BTS records one after the other;
//! - 2: a text LBR MSR dump (`REGISTER VALUE` lines), then the stack it
//!   makes in every LBR format at every TOS the dump allows;
//! - 3: `NAME VALUE` for `hwtrace msr`: the register looked up by name or
//!   number and its value explained for every micro-architecture.
//!
//! Nothing may panic; what is read must stay within what was given.
//! [`check`] returns how many records, entries and fields it read, so a
//! test can tell a well-formed input from one rejected at the door.

use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::dump::{BtsDump, BtsOrder, LbrMsrDump};
use hwtrace_regs::explain::parse_number;
use hwtrace_regs::lbr::LbrFormat;
use hwtrace_regs::{Context, RegisterId, Uarch, explain};

const UARCHES: [&str; 11] = [
    "netburst",
    "core2",
    "nehalem",
    "westmere",
    "sandybridge",
    "ivybridge",
    "haswell",
    "broadwell",
    "skylake",
    "goldmont",
    "goldmontplus",
];

/// Runs every check on one input; how many things it read.
pub fn check(data: &[u8]) -> usize {
    let Some((&kind, rest)) = data.split_first() else {
        return 0;
    };
    match kind % 4 {
        0 => ds_and_buffer(rest),
        1 => raw_records(rest),
        2 => lbr_dump(rest),
        _ => msr_value(rest),
    }
}

fn formats() -> [DsFormat; 2] {
    [DsFormat::Bits32, DsFormat::Bits64]
}

fn ds_and_buffer(data: &[u8]) -> usize {
    let mut read = 0;
    for format in formats() {
        let Ok(area) = DsManagementArea::parse(data, format) else {
            continue;
        };
        let buffer = data.get(format.area_size()..).unwrap_or(&[]);
        for order in [BtsOrder::Linear, BtsOrder::Circular] {
            let Ok(dump) = BtsDump::new(&area, buffer, format, order) else {
                continue;
            };
            let record = format.bts_record_size();
            let mut n = 0u64;
            for e in dump.records() {
                // Every record read lies in the bytes given.
                assert!((e.slot + 1) * record <= buffer.len() as u64);
                n += 1;
            }
            assert_eq!(n, dump.len());
            read += n as usize;
        }
    }
    read
}

fn raw_records(data: &[u8]) -> usize {
    let mut read = 0;
    for format in formats() {
        if let Ok(dump) = BtsDump::raw(data, format) {
            let n = dump.records().count();
            assert_eq!(n as u64 * format.bts_record_size(), data.len() as u64);
            read += n;
        }
    }
    read
}

fn lbr_dump(data: &[u8]) -> usize {
    let text = String::from_utf8_lossy(data);
    let Ok(dump) = LbrMsrDump::parse(&text) else {
        return 0;
    };
    let depth = dump.depth();
    let _ = dump.format();
    let Ok(values) = dump.values(depth) else {
        return 0;
    };
    let mut read = 0;
    for encoding in 0..8u64 {
        let Ok(format) = LbrFormat::from_perf_capabilities(encoding) else {
            continue;
        };
        for tos in [
            0,
            1,
            u64::from(depth).saturating_sub(1),
            u64::from(depth),
            u64::MAX,
        ] {
            let Ok(stack) = values.stack(tos, format) else {
                continue;
            };
            let mut n = 0;
            for e in stack.entries() {
                assert!(e.slot < depth);
                let _ = (e.mispredicted(), e.cycles());
                n += 1;
            }
            assert!(n <= usize::from(depth));
            read += n;
        }
    }
    read
}

fn msr_value(data: &[u8]) -> usize {
    let text = String::from_utf8_lossy(data);
    let mut words = text.split_whitespace();
    let (Some(name), value) = (words.next(), words.next()) else {
        return 0;
    };
    let Ok(id) = RegisterId::parse(name) else {
        return 0;
    };
    let mut read = 0;
    let raw = value.and_then(parse_number).unwrap_or(0);
    let mut contexts = vec![Context::default()];
    contexts.extend(UARCHES.iter().filter_map(|n| {
        Uarch::from_name(n).ok().map(|u| Context {
            uarch: Some(u),
            lbr_format: None,
        })
    }));
    for ctx in &contexts {
        if let Ok(e) = explain(id, raw, ctx) {
            for f in e.fields() {
                let _ = format!("{f:?}");
                read += 1;
            }
            let _ = e.reserved_ranges().count();
        }
    }
    read
}
