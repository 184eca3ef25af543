//! Round trips: what [`super::write`] writes, [`super::reader`] reads back.

use std::io::Cursor as IoCursor;

use super::attr::{Attr, branch, flag, sample};
use super::auxtrace::{AuxtraceKind, IntelPtInfo, TscConversion};
use super::header::EventAttr;
use super::write::{FeatureData, PerfDataWriter, PipeWriter, RecordWriter, intel_pt_attr};
use super::*;
use crate::pevent::record::{Body, SampleId, aux_flag};

fn sid(pid: u32, tid: u32, time: u64, cpu: u32) -> SampleId {
    SampleId {
        pid_tid: Some((pid, tid)),
        time: Some(time),
        cpu: Some(cpu),
        identifier: Some(7),
        ..SampleId::default()
    }
}

fn pt_info() -> IntelPtInfo {
    IntelPtInfo {
        pmu_type: 8,
        tsc: TscConversion {
            time_shift: 31,
            time_mult: 0x1234,
            time_zero: 99,
            cap_user_time_zero: true,
        },
        tsc_bit: 1 << 10,
        noretcomp_bit: 1 << 11,
        have_sched_switch: 1,
        snapshot_mode: false,
        per_cpu_mmaps: false,
        mtc_bit: Some(1 << 9),
        mtc_freq_bits: Some(0xf << 14),
        tsc_ctc_ratio_n: Some(0xa8),
        tsc_ctc_ratio_d: Some(2),
        cyc_bit: Some(2),
        max_non_turbo_ratio: Some(24),
        filter: Some(b"filter 0x1000/0x20@/bin/true".to_vec()),
    }
}

/// A small file: PT attr, AUXTRACE_INFO, sideband, two AUXTRACE buffers of
/// one thread with a hole between them, a truncated AUX record, a LOST.
fn sample_file() -> Vec<u8> {
    let attrs = [EventAttr {
        attr: intel_pt_attr(8, 0x2001),
        ids: vec![7],
    }];
    let mut w = PerfDataWriter::new(IoCursor::new(Vec::new()), &attrs).unwrap();
    w.auxtrace_info_pt(&pt_info()).unwrap();
    w.comm(42, 42, "true", true, &sid(42, 42, 10, 0)).unwrap();
    w.mmap2(
        2,
        42,
        42,
        0x40_0000,
        0x1000,
        0,
        5,
        2,
        "/bin/true",
        &sid(42, 42, 11, 0),
    )
    .unwrap();
    w.itrace_start(42, 42, &sid(42, 42, 12, 0)).unwrap();
    w.auxtrace(&[0x02, 0x82, 0x02, 0x82], 0, 0, 0, 42, u32::MAX)
        .unwrap();
    w.aux(0, 8, aux_flag::TRUNCATED, &sid(42, 42, 13, 0))
        .unwrap();
    w.auxtrace(&[0u8; 16], 0x100, 0, 0, 42, u32::MAX).unwrap();
    w.write_event(
        crate::pevent::record::record_type::LOST,
        0,
        &[7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0],
        &sid(42, 42, 14, 0),
    )
    .unwrap();
    w.finished_round().unwrap();
    let f = FeatureData {
        hostname: Some("box".into()),
        arch: Some("x86_64".into()),
        nrcpus: Some((4, 2)),
        cpuid: Some("GenuineIntel,6,85,4".into()),
        cmdline: Some(vec!["hwtrace".into(), "record".into()]),
        build_ids: vec![(42, vec![0xab; 20], "/bin/true".into())],
        ..FeatureData::default()
    };
    w.finish(&f).unwrap().into_inner()
}

#[test]
fn write_then_read_gives_the_same_records() {
    let bytes = sample_file();
    let file = PerfData::parse(&bytes).unwrap();
    assert_eq!(file.attrs.len(), 1);
    assert_eq!(file.attrs[0].attr, intel_pt_attr(8, 0x2001).with_size(128));
    assert_eq!(file.attrs[0].ids, vec![7]);
    let f = &file.features;
    assert_eq!(f.hostname, Some(&b"box"[..]));
    assert_eq!(f.arch, Some(&b"x86_64"[..]));
    assert_eq!(f.nrcpus, Some((4, 2)));
    assert_eq!(f.cpuid, Some(&b"GenuineIntel,6,85,4"[..]));
    assert_eq!(f.cmdline, Some(vec![&b"hwtrace"[..], &b"record"[..]]));
    assert_eq!(f.build_ids.len(), 1);
    assert_eq!(f.build_ids[0].build_id, &[0xab; 20][..]);
    assert_eq!(f.build_ids[0].filename, b"/bin/true");
    assert!(f.errors.is_empty());

    let recs: Vec<_> = file.records().collect::<Result<_, _>>().unwrap();
    let kinds: Vec<_> = recs
        .iter()
        .map(|r| record_type_name(r.header.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            "AUXTRACE_INFO",
            "COMM",
            "MMAP2",
            "ITRACE_START",
            "AUXTRACE",
            "AUX",
            "AUXTRACE",
            "LOST",
            "FINISHED_ROUND"
        ]
    );
    match &recs[0].record {
        PerfRecord::AuxtraceInfo(i) => assert_eq!(i.kind, AuxtraceKind::IntelPt(pt_info())),
        r => panic!("{r:?}"),
    }
    match &recs[2].record {
        PerfRecord::Event(r) => {
            let Body::Mmap2(m) = r.body else { panic!() };
            assert_eq!(
                (m.pid, m.addr, m.len, m.prot, m.filename),
                (42, 0x40_0000, 0x1000, 5, &b"/bin/true"[..])
            );
            assert_eq!(r.sample, sid(42, 42, 11, 0));
        }
        r => panic!("{r:?}"),
    }
    match &recs[4].record {
        PerfRecord::Auxtrace(a) => {
            assert_eq!((a.size, a.offset, a.tid, a.cpu), (8, 0, 42, u32::MAX));
            assert_eq!(&a.data[..4], &[0x02, 0x82, 0x02, 0x82]);
            // The payload is a slice of the file, not a copy.
            let base = bytes.as_ptr() as usize;
            assert_eq!(a.data.as_ptr() as usize - base, a.data_offset as usize);
        }
        r => panic!("{r:?}"),
    }

    let streams = AuxStreams::collect(&file);
    assert!(streams.errors.is_empty());
    let (key, q) = streams.find(None, Some(42)).unwrap();
    assert_eq!(
        *key,
        QueueKey {
            cpu: u32::MAX,
            tid: 42
        }
    );
    assert_eq!(q.len(), 24);
    assert_eq!(q.gaps.len(), 1);
    assert_eq!(q.gaps[0].lost_bytes(), 0x100 - 8);
    assert_eq!(q.gaps[0].stream_offset, 8);
    assert_eq!(streams.aux_losses.len(), 1);
    assert_eq!(streams.aux_losses[0].tid, Some(42));
    assert_eq!(streams.lost_records.len(), 1);
    assert_eq!(streams.lost_records[0].1, 3);
    let mut out = Vec::new();
    q.write_to(&mut out).unwrap();
    assert_eq!(out.len(), 24);
}

/// A SAMPLE record with a branch stack, hand-built.
#[test]
fn sample_with_branch_stack() {
    let mut attr = Attr {
        sample_type: sample::IP | sample::TID | sample::BRANCH_STACK,
        branch_sample_type: branch::ANY | branch::USER | branch::HW_INDEX,
        ..Attr::default()
    };
    attr.set(flag::SAMPLE_ID_ALL, true);
    let attrs = [EventAttr { attr, ids: vec![] }];
    let mut w = PerfDataWriter::new(IoCursor::new(Vec::new()), &attrs).unwrap();
    let mut body = Vec::new();
    for v in [0x401000u64, (5u64 << 32) | 5, 2, 3] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    // mispred, cycles 0x12, type 4 (call); then predicted, in_tx, abort, type 6.
    let flags0 = 1 | (0x12 << 4) | (4 << 20);
    let flags1 = 2 | 4 | 8 | (6 << 20);
    for v in [0x401010u64, 0x402000, flags0, 0x402010, 0x401015, flags1] {
        body.extend_from_slice(&v.to_le_bytes());
    }
    w.write_record(9, 2, &body).unwrap();
    let bytes = w.finish(&FeatureData::default()).unwrap().into_inner();
    let file = PerfData::parse(&bytes).unwrap();
    let rec = file.records().next().unwrap().unwrap();
    let PerfRecord::Sample { attr_index, sample } = rec.record else {
        panic!()
    };
    assert_eq!(attr_index, Some(0));
    assert_eq!(sample.ip, Some(0x401000));
    assert_eq!(sample.pid_tid, Some((5, 5)));
    let bs = sample.branch_stack.unwrap();
    assert_eq!(bs.hw_idx, Some(3));
    let e: Vec<_> = bs.entries().collect();
    assert_eq!(e.len(), 2);
    assert_eq!((e[0].from, e[0].to), (0x401010, 0x402000));
    assert!(e[0].mispred() && !e[0].predicted());
    assert_eq!((e[0].cycles(), e[0].branch_type()), (0x12, 4));
    assert!(e[1].predicted() && e[1].in_tx() && e[1].abort());
    assert_eq!(e[1].branch_type(), 6);
}

#[test]
fn errors_carry_offsets() {
    let mut bytes = sample_file();
    // Bad magic.
    let mut bad = bytes.clone();
    bad[0] = b'X';
    let e = PerfData::parse(&bad).unwrap_err();
    assert_eq!(e.offset, FileOffset(0));
    assert!(matches!(e.kind, ErrorKind::BadMagic { .. }));
    // Data section past the end.
    let file = PerfData::parse(&bytes).unwrap();
    let data = file.header.data;
    bytes.truncate(data.offset as usize + 10);
    let e = PerfData::parse(&bytes).unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::SectionOutOfBounds { what: "data", .. }),
        "{e}"
    );
    // Features cut off: the records still read, the loss is reported.
    let good = sample_file();
    let file = PerfData::parse(&good).unwrap();
    let end = (file.header.data.offset + file.header.data.size) as usize;
    let cut = &good[..end + 8];
    let file = PerfData::parse(cut).unwrap();
    assert!(matches!(
        file.features.errors[0].kind,
        ErrorKind::SectionOutOfBounds {
            what: "feature table",
            ..
        }
    ));
    assert_eq!(file.records().count(), 9);
    // An AUXTRACE record whose payload runs out of the data section.
    let good = sample_file();
    let file = PerfData::parse(&good).unwrap();
    let aux = file
        .records()
        .filter_map(Result::ok)
        .find(|r| matches!(r.record, PerfRecord::Auxtrace(_)))
        .unwrap();
    let mut bad = good.clone();
    let at = aux.offset.0 as usize + 8;
    bad[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let file = PerfData::parse(&bad).unwrap();
    let e = file.records().find_map(Result::err).unwrap();
    assert_eq!(e.offset, aux.offset);
    assert!(
        matches!(e.kind, ErrorKind::AuxtracePayload { size: u64::MAX, .. }),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("{}", aux.offset)));
}

#[test]
fn pipe_mode_learns_attrs_from_records() {
    // Pipe header, then HEADER_ATTR, then a COMM with a TID|TIME trailer.
    let mut attr = Attr {
        sample_type: sample::TID | sample::TIME,
        ..Attr::default()
    };
    attr.set(flag::SAMPLE_ID_ALL, true);
    let mut b = Vec::new();
    b.extend_from_slice(b"PERFILE2");
    b.extend_from_slice(&16u64.to_le_bytes());
    let a = attr.to_bytes();
    let size = (8 + a.len() + 8) as u16;
    b.extend_from_slice(&64u32.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&a);
    b.extend_from_slice(&5u64.to_le_bytes());
    let mut comm = Vec::new();
    comm.extend_from_slice(&1u32.to_le_bytes());
    comm.extend_from_slice(&1u32.to_le_bytes());
    comm.extend_from_slice(b"init\0\0\0\0");
    comm.extend_from_slice(&1u32.to_le_bytes());
    comm.extend_from_slice(&1u32.to_le_bytes());
    comm.extend_from_slice(&77u64.to_le_bytes());
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&((8 + comm.len()) as u16).to_le_bytes());
    b.extend_from_slice(&comm);
    let file = PerfData::parse(&b).unwrap();
    assert!(file.header.is_pipe());
    let mut recs = file.records();
    assert_eq!(
        recs.next().unwrap().unwrap().record,
        PerfRecord::HeaderAttr(0)
    );
    assert_eq!(recs.attrs()[0].ids, vec![5]);
    let PerfRecord::Event(r) = recs.next().unwrap().unwrap().record else {
        panic!()
    };
    let Body::Comm(c) = r.body else { panic!() };
    assert_eq!(c.comm, b"init");
    assert_eq!(r.sample.time, Some(77));
    assert!(recs.next().is_none());
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn walk(bytes: &[u8]) {
        if let Ok(file) = PerfData::parse(bytes) {
            for r in file.records().take(10_000) {
                let _ = r.map(|r| format!("{r:?}"));
            }
            let s = AuxStreams::collect(&file);
            for q in s.queues.values() {
                assert!(q.len() <= bytes.len() as u64);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            walk(&bytes);
        }

        #[test]
        fn mutated_files_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                     cut in any::<prop::sample::Index>()) {
            let mut bytes = sample_file();
            for (i, v) in edits {
                let i = i.index(bytes.len());
                bytes[i] = v;
            }
            walk(&bytes);
            let n = cut.index(bytes.len());
            walk(&bytes[..n]);
        }
    }
}

mod round_trip {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Rec {
        Comm(u32, u32, String, bool),
        Mmap2(u32, u64, u64, u64, u32, String),
        ItraceStart(u32, u32),
        Aux(u64, u64, u64),
        Auxtrace(Vec<u8>, Vec<u8>, u64, u32, u32),
    }

    fn rec() -> impl Strategy<Value = Rec> {
        let name = "[a-z/._-]{0,40}";
        prop_oneof![
            (any::<u32>(), any::<u32>(), name, any::<bool>())
                .prop_map(|(p, t, c, e)| Rec::Comm(p, t, c, e)),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                0u32..8,
                name
            )
                .prop_map(|(p, a, l, o, prot, f)| Rec::Mmap2(p, a, l, o, prot, f)),
            (any::<u32>(), any::<u32>()).prop_map(|(p, t)| Rec::ItraceStart(p, t)),
            (any::<u64>(), any::<u64>(), 0u64..8).prop_map(|(o, s, f)| Rec::Aux(o, s, f)),
            (
                proptest::collection::vec(any::<u8>(), 0..40),
                proptest::collection::vec(any::<u8>(), 0..40),
                any::<u64>(),
                any::<u32>(),
                any::<u32>()
            )
                .prop_map(|(a, b, o, t, c)| Rec::Auxtrace(a, b, o, t, c)),
        ]
    }

    fn write(w: &mut impl RecordWriter, recs: &[Rec], s: &SampleId) {
        for r in recs {
            match r {
                Rec::Comm(p, t, c, e) => w.comm(*p, *t, c, *e, s).unwrap(),
                Rec::Mmap2(p, a, l, o, prot, f) => {
                    w.mmap2(2, *p, *p, *a, *l, *o, *prot, 2, f, s).unwrap()
                }
                Rec::ItraceStart(p, t) => w.itrace_start(*p, *t, s).unwrap(),
                Rec::Aux(o, sz, f) => w.aux(*o, *sz, *f, s).unwrap(),
                // Two parts, as a wrapped AUX area gives them.
                Rec::Auxtrace(a, b, o, t, c) => {
                    w.auxtrace_parts(&[a, b], *o, 9, 0, *t, *c).unwrap()
                }
            }
        }
    }

    fn check(recs: &[Rec], items: &[RecordItem<'_>], s: &SampleId) {
        assert_eq!(recs.len(), items.len());
        for (r, item) in recs.iter().zip(items) {
            match (r, &item.record) {
                (Rec::Comm(p, t, c, e), PerfRecord::Event(ev)) => {
                    let Body::Comm(got) = ev.body else {
                        panic!("{ev:?}")
                    };
                    assert_eq!((got.pid, got.tid, got.comm), (*p, *t, c.as_bytes()));
                    assert_eq!(ev.is_comm_exec(), *e);
                    assert_eq!(ev.sample, *s);
                }
                (Rec::Mmap2(p, a, l, o, prot, f), PerfRecord::Event(ev)) => {
                    let Body::Mmap2(m) = ev.body else {
                        panic!("{ev:?}")
                    };
                    assert_eq!(
                        (m.pid, m.addr, m.len, m.pgoff, m.prot, m.filename),
                        (*p, *a, *l, *o, *prot, f.as_bytes())
                    );
                    assert_eq!(ev.sample, *s);
                }
                (Rec::ItraceStart(p, t), PerfRecord::Event(ev)) => {
                    assert_eq!(
                        ev.body,
                        Body::ItraceStart(crate::pevent::record::ItraceStart { pid: *p, tid: *t })
                    );
                }
                (Rec::Aux(o, sz, f), PerfRecord::Event(ev)) => {
                    let Body::Aux(a) = ev.body else {
                        panic!("{ev:?}")
                    };
                    assert_eq!((a.aux_offset, a.aux_size, a.flags), (*o, *sz, *f));
                }
                (Rec::Auxtrace(a, b, o, t, c), PerfRecord::Auxtrace(x)) => {
                    let joined: Vec<u8> = a.iter().chain(b).copied().collect();
                    assert_eq!(&x.data[..joined.len()], &joined[..]);
                    assert!(
                        x.data[joined.len()..].iter().all(|&v| v == 0) && x.data.len() % 8 == 0
                    );
                    assert_eq!((x.offset, x.reference, x.tid, x.cpu), (*o, 9, *t, *c));
                }
                (r, got) => panic!("wrote {r:?}, read {got:?}"),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn random_records_round_trip_in_file_and_pipe_format(recs in proptest::collection::vec(rec(), 0..20)) {
            let attrs = [EventAttr { attr: intel_pt_attr(8, 1), ids: vec![7] }];
            let s = sid(1, 2, 3, 4);
            let mut w = PerfDataWriter::new(IoCursor::new(Vec::new()), &attrs).unwrap();
            write(&mut w, &recs, &s);
            let bytes = w.finish(&FeatureData::default()).unwrap().into_inner();
            let file = PerfData::parse(&bytes).unwrap();
            let items: Vec<_> = file.records().collect::<Result<_, _>>().unwrap();
            check(&recs, &items, &s);

            let mut w = PipeWriter::new(Vec::new(), &attrs, &FeatureData::default()).unwrap();
            write(&mut w, &recs, &s);
            let bytes = w.finish().unwrap();
            let file = PerfData::parse(&bytes).unwrap();
            let items: Vec<_> = file.records().collect::<Result<_, _>>().unwrap();
            prop_assert!(matches!(items[0].record, PerfRecord::HeaderAttr(0)));
            check(&recs, &items[1..], &s);
        }
    }
}

fn words(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn auxtrace_info_of_every_vintage() {
    use super::auxtrace::{AuxtraceInfo, IntelBtsInfo};
    // perf 4.1: the ten base words only.
    let mut body = words(&[1 << 32 | 1]); // type 1 (intel_pt), reserved 1
    body.extend(words(&[8, 31, 0x1234, 99, 1, 1 << 10, 1 << 11, 1, 0, 1]));
    let AuxtraceKind::IntelPt(pt) = AuxtraceInfo::parse(&body, 0).unwrap().kind else {
        panic!()
    };
    assert_eq!(
        (
            pt.pmu_type,
            pt.tsc.time_shift,
            pt.tsc.time_mult,
            pt.tsc.time_zero
        ),
        (8, 31, 0x1234, 99)
    );
    assert!(pt.tsc.cap_user_time_zero && pt.per_cpu_mmaps && !pt.snapshot_mode);
    assert_eq!(
        (
            pt.mtc_bit,
            pt.cyc_bit,
            pt.max_non_turbo_ratio,
            pt.filter.as_deref()
        ),
        (None, None, None, None)
    );
    // The full current layout round-trips, filter included.
    let full = pt_info();
    let filter = full.filter.clone().unwrap();
    let w = full.to_words();
    // perf's layout: the length word is strlen, the string takes
    // roundup(len + 1, 8) bytes.
    assert_eq!(w[16], filter.len() as u64);
    assert_eq!(w.len(), 17 + (filter.len() + 1).div_ceil(8));
    let mut body = words(&[1]);
    body.extend(words(&full.to_words()));
    assert_eq!(
        AuxtraceInfo::parse(&body, 0).unwrap().kind,
        AuxtraceKind::IntelPt(full)
    );
    // A filter length beyond the record is a typed error at its offset.
    let mut cut = body.clone();
    cut.truncate(8 + 17 * 8 + 4);
    let e = AuxtraceInfo::parse(&cut, 0x100).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::Truncated {
                what: "intel_pt filter string",
                ..
            }
        ),
        "{e}"
    );
    // Intel BTS.
    let bts = IntelBtsInfo {
        pmu_type: 9,
        tsc: pt_info().tsc,
        snapshot_mode: true,
    };
    let mut body = words(&[2]);
    body.extend(words(&bts.to_words()));
    assert_eq!(
        AuxtraceInfo::parse(&body, 0).unwrap().kind,
        AuxtraceKind::IntelBts(bts)
    );
    // Another tracer (CoreSight = 3) stays raw; a header-only record is truncated.
    let mut body = words(&[3]);
    body.extend(words(&[5, 6]));
    assert!(
        matches!(AuxtraceInfo::parse(&body, 0).unwrap().kind, AuxtraceKind::Other(w) if w.len() == 16)
    );
    assert!(AuxtraceInfo::parse(&[1, 0, 0], 0).is_err());
}

#[test]
fn sample_with_every_variable_field() {
    use super::attr::read_format;
    use super::sample::parse_sample;
    let attr = Attr {
        sample_type: sample::IDENTIFIER
            | sample::IP
            | sample::TID
            | sample::TIME
            | sample::ADDR
            | sample::ID
            | sample::CPU
            | sample::PERIOD
            | sample::READ
            | sample::CALLCHAIN
            | sample::RAW
            | sample::BRANCH_STACK
            | sample::REGS_USER
            | sample::STACK_USER
            | sample::WEIGHT
            | sample::DATA_SRC
            | sample::PHYS_ADDR
            | sample::AUX,
        read_format: read_format::GROUP | read_format::ID | read_format::TOTAL_TIME_ENABLED,
        branch_sample_type: branch::ANY | branch::COUNTERS,
        sample_regs_user: 0b1011,
        ..Attr::default()
    };
    let mut b = vec![9, 0, 0, 0, 0, 0, 0, 0]; // header, size patched below
    b.extend(words(&[
        0x77,
        0x401000,
        5 << 32 | 4,
        1000,
        0xdead,
        0x77,
        3,
        10,
    ]));
    b.extend(words(&[2, 111, 50, 1, 60, 2])); // read: nr, enabled, {value, id} x2
    b.extend(words(&[3, 0xa, 0xb, 0xc])); // callchain
    b.extend(&12u32.to_le_bytes()); // raw: 4 + 12 bytes
    b.extend(&[0xee; 12]);
    b.extend(words(&[1, 0x10, 0x20, 1, 0x99])); // branch stack: 1 entry + 1 counter
    b.extend(words(&[2, 1, 2, 3])); // regs_user: abi 2, 3 regs
    b.extend(words(&[16, 0, 0, 16])); // stack_user: size 16, data, dyn_size
    b.extend(words(&[7, 8, 0x1000])); // weight, data_src, phys_addr
    b.extend(words(&[8, 0x55])); // aux: size 8, data
    let size = b.len() as u16;
    b[6..8].copy_from_slice(&size.to_le_bytes());
    let s = parse_sample(&b, 0x40, &attr).unwrap();
    assert_eq!(
        (s.identifier, s.ip, s.pid_tid, s.time, s.addr),
        (
            Some(0x77),
            Some(0x401000),
            Some((4, 5)),
            Some(1000),
            Some(0xdead)
        )
    );
    assert_eq!((s.id, s.cpu, s.period), (Some(0x77), Some(3), Some(10)));
    assert_eq!(s.read.unwrap().len(), 6 * 8);
    assert_eq!(s.callchain_ips().collect::<Vec<_>>(), [0xa, 0xb, 0xc]);
    assert_eq!(s.raw.unwrap(), &[0xee; 12]);
    let e: Vec<_> = s.branch_stack.unwrap().entries().collect();
    assert_eq!(
        (e.len(), e[0].from, e[0].to, e[0].mispred()),
        (1, 0x10, 0x20, true)
    );
    assert_eq!(
        (s.weight, s.data_src, s.phys_addr),
        (Some(7), Some(8), Some(0x1000))
    );
    assert_eq!(s.aux.unwrap(), &0x55u64.to_le_bytes());
    // One byte short: the error names the field and the record's offset.
    let mut short = b[..b.len() - 8].to_vec();
    short[6..8].copy_from_slice(&(size - 8).to_le_bytes());
    let e = parse_sample(&short, 0x40, &attr).unwrap_err();
    assert_eq!(e.offset, FileOffset(0x40));
    assert!(
        matches!(e.kind, ErrorKind::SampleTooShort { field: "aux", .. }),
        "{e}"
    );
}
