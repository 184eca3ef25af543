//! Arbitrary bytes as a perf.data file or pipe stream: parsing the header,
//! attributes and features, iterating every record (compressed ones
//! expanded), parsing every record type, assembling the AUX streams and
//! reading the data section as libipt-style sideband must neither panic,
//! loop, nor allocate more than the input justifies.
#![no_main]

use hwtrace_perf::data::{AuxStreams, AuxtraceKind, PerfData, PerfRecord};
use hwtrace_perf::pevent::record::RecordReader;
use hwtrace_perf::pevent::{ChannelConfig, OutputOptions, PrintFlags, Session, print_record};
use libfuzzer_sys::fuzz_target;

/// Touches every field the parsers produced, so nothing is optimised away.
fn visit(record: &PerfRecord<'_>, sink: &mut u64) {
    match record {
        PerfRecord::Sample { sample, .. } => {
            *sink ^= sample.ip.unwrap_or(0) ^ sample.time.unwrap_or(0);
            if let Some(b) = sample.branch_stack {
                for e in b.entries() {
                    *sink ^= e.from ^ e.to ^ u64::from(e.cycles()) ^ u64::from(e.branch_type());
                }
                *sink ^= b.hw_idx.unwrap_or(0);
            }
            *sink ^= sample.callchain_ips().fold(0, |a, b| a ^ b);
        }
        PerfRecord::AuxtraceInfo(i) => match &i.kind {
            AuxtraceKind::IntelPt(p) => {
                *sink ^= p.tsc.time_zero ^ p.mtc_bit.unwrap_or(0);
                *sink ^= p.filter.as_ref().map_or(0, |f| f.len() as u64);
            }
            AuxtraceKind::IntelBts(b) => *sink ^= b.tsc.time_zero,
            _ => {}
        },
        PerfRecord::Auxtrace(a) => *sink ^= a.data.len() as u64 ^ a.offset,
        PerfRecord::Event(r) => {
            *sink ^= r.raw.len() as u64;
            let mut out = std::io::sink();
            let flags = PrintFlags {
                compact: true,
                verbose: true,
                offset: true,
                ..PrintFlags::default()
            };
            let _ = print_record(&mut out, r, None, "f", flags);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let mut sink = 0u64;
    let Ok(file) = PerfData::parse(data) else {
        return;
    };
    sink ^= file.features.build_ids.len() as u64;
    let mut records = file.records();
    // Every record is at least 8 bytes of the input, or of what one
    // COMPRESSED record may expand to: the walk ends (libFuzzer's timeout
    // catches it if not).
    while let Some(item) = records.next_expanded().transpose() {
        if let Ok(item) = item {
            visit(&item.item().record, &mut sink);
        }
    }
    // The plain iterator too (COMPRESSED records unexpanded).
    for item in file.records().flatten() {
        visit(&item.record, &mut sink);
    }
    let streams = AuxStreams::collect(&file);
    for q in streams.queues.values() {
        sink ^= q.len() ^ q.gaps.len() as u64;
    }
    // The data section read as a sideband file, with the first attribute's
    // sample_type (what `ptdump --pevent` would be given).
    let st = file.attrs.first().map_or(0, |a| a.attr.sample_type);
    let (start, size) = (
        file.header.data.offset as usize,
        file.header.data.size as usize,
    );
    if let Some(section) = data.get(start..start.saturating_add(size).min(data.len())) {
        for r in RecordReader::new(section, st).flatten() {
            sink ^= r.raw.len() as u64;
        }
        // And through libipt-sb's session, as `ptdump --pevent:primary`
        // would load it: every record applied and printed.
        let mut session = Session::new(OutputOptions {
            records: PrintFlags {
                compact: true,
                verbose: true,
                time: true,
                ..PrintFlags::default()
            },
            warnings: true,
            switches: true,
        });
        let config = ChannelConfig {
            sample_type: st,
            primary: true,
            ..ChannelConfig::default()
        };
        session.add_buffer("perf.data", section.to_vec(), config);
        let mut out = std::io::sink();
        if session.start(&mut out).is_ok() {
            let _ = session.dump_rest(&mut out);
        }
    }
    std::hint::black_box(sink);
});
