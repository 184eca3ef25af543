//! COMPRESSED/COMPRESSED2 records built the way perf builds them: one zstd
//! stream for the whole file, flushed after each chunk and never ended,
//! cut into records; what [`Records::next_expanded`] yields must equal the
//! records of the same file written uncompressed.

use std::io::Cursor as IoCursor;

use super::attr::{Attr, flag, sample};
use super::compressed::{CHUNK, COMPRESSED, COMPRESSED2};
use super::header::EventAttr;
use super::write::{PerfDataWriter, PipeWriter, RecordWriter, SampleData, encode_sample};
use super::*;
use crate::pevent::record::{SampleId, record_type};

fn attrs() -> Vec<EventAttr> {
    let mut attr = Attr {
        kind: 1,
        config: 0,
        sample_period: 10_000,
        sample_type: sample::IP | sample::TID | sample::TIME | sample::CPU | sample::IDENTIFIER,
        ..Attr::default()
    };
    attr.set(flag::SAMPLE_ID_ALL, true);
    attr.set(flag::MMAP2, true);
    attr.set(flag::COMM, true);
    vec![EventAttr { attr, ids: vec![7] }]
}

fn sid(time: u64) -> SampleId {
    SampleId {
        pid_tid: Some((42, 42)),
        time: Some(time),
        cpu: Some(1),
        identifier: Some(7),
        ..SampleId::default()
    }
}

/// The records perf's ring buffer would hold: COMM, MMAP2s with long
/// names, SAMPLEs, a SWITCH, an EXIT; about `n` of them.
fn ring_records(w: &mut impl RecordWriter, n: u64) {
    let attr = attrs()[0].attr;
    w.comm(42, 42, "workload", true, &sid(1)).unwrap();
    for i in 0..n {
        if i % 7 == 0 {
            let name = format!(
                "/usr/lib/x86_64-linux-gnu/libsomething-{i}.so.{}",
                "9".repeat(40)
            );
            w.mmap2(
                2,
                42,
                42,
                0x7f00_0000_0000 + i * 0x1000,
                0x1000,
                0,
                5,
                2,
                &name,
                &sid(2 + i),
            )
            .unwrap();
        }
        let s = SampleData {
            ip: 0x40_1000 + i * 3,
            pid_tid: (42, 42),
            time: 100 + i,
            cpu: 1,
            id: 7,
            period: 10_000,
            ..SampleData::default()
        };
        let body = encode_sample(&attr, &s).unwrap();
        w.write_record(record_type::SAMPLE, 2, &body).unwrap();
    }
    w.write_event(record_type::SWITCH, 0, &[], &sid(9000))
        .unwrap();
    w.write_event(
        record_type::EXIT,
        0,
        &[
            42, 0, 0, 0, 1, 0, 0, 0, 42, 0, 0, 0, 1, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0,
        ],
        &sid(9001),
    )
    .unwrap();
}

/// Records written to memory, as a ring buffer holds them.
struct Ring(Vec<u8>);

impl RecordWriter for Ring {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
    fn trailer_type(&self) -> Option<u64> {
        Some(attrs()[0].attr.sample_type)
    }
}

/// The data-section bytes of [`ring_records`].
fn ring_bytes(n: u64) -> Vec<u8> {
    let mut w = Ring(Vec::new());
    ring_records(&mut w, n);
    w.0
}

/// Compresses `data` as perf does: one stream, flushed after every
/// `push`-sized piece, never ended; the output cut into pieces of at most
/// `record` bytes.
fn perf_zstd(data: &[u8], push: usize, record: usize) -> Vec<Vec<u8>> {
    let mut cctx = zstd_safe::CCtx::create();
    cctx.set_parameter(zstd_safe::CParameter::CompressionLevel(1))
        .unwrap();
    let mut stream = Vec::new();
    for piece in data.chunks(push) {
        let mut input = zstd_safe::InBuffer::around(piece);
        while input.pos() < piece.len() {
            let mut out = vec![0u8; 1 << 17];
            let mut o = zstd_safe::OutBuffer::around(&mut out[..]);
            cctx.compress_stream(&mut o, &mut input).unwrap();
            let n = o.pos();
            stream.extend_from_slice(&out[..n]);
        }
        loop {
            let mut out = vec![0u8; 1 << 17];
            let mut o = zstd_safe::OutBuffer::around(&mut out[..]);
            let left = cctx.flush_stream(&mut o).unwrap();
            let n = o.pos();
            stream.extend_from_slice(&out[..n]);
            if left == 0 {
                break;
            }
        }
    }
    stream.chunks(record).map(<[u8]>::to_vec).collect()
}

/// A file whose data section is `before`, the COMPRESSED records, `after`.
fn compressed_file(pieces: &[Vec<u8>], kind: u32) -> Vec<u8> {
    let mut w = PerfDataWriter::new(IoCursor::new(Vec::new()), &attrs()).unwrap();
    for p in pieces {
        put_compressed(&mut w, p, kind);
    }
    w.write_record(super::reader::user_type::FINISHED_ROUND, 0, &[])
        .unwrap();
    w.finish(&Default::default()).unwrap().into_inner()
}

fn put_compressed(w: &mut impl RecordWriter, p: &[u8], kind: u32) {
    if kind == COMPRESSED {
        w.write_record(COMPRESSED, 0, p).unwrap();
    } else {
        let mut body = (p.len() as u64).to_le_bytes().to_vec();
        body.extend_from_slice(p);
        while !body.len().is_multiple_of(8) {
            body.push(0);
        }
        w.write_record(COMPRESSED2, 0, &body).unwrap();
    }
}

/// `s` without the `offset: SidebandOffset(..)` of kernel records (a
/// record inside a COMPRESSED record is at that record's offset).
fn without_offsets(s: String) -> String {
    let mut out = String::new();
    let mut rest = s.as_str();
    while let Some(i) = rest.find("offset: SidebandOffset(") {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        rest = &rest[rest.find(')').map_or(rest.len(), |j| j + 1)..];
    }
    out.push_str(rest);
    out
}

/// The records `next_expanded` yields: (decompressed?, header, Debug of
/// the record), and the errors.
fn expand(bytes: &[u8]) -> (Vec<(bool, String)>, Vec<Error>) {
    let file = PerfData::parse(bytes).unwrap();
    let mut records = file.records();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    while let Some(r) = records.next_expanded().transpose() {
        match r {
            Ok(e) => out.push((
                e.is_decompressed(),
                without_offsets(format!("{:?} {:?}", e.item().header, e.item().record)),
            )),
            Err(e) => errors.push(e),
        }
    }
    (out, errors)
}

/// What the uncompressed records parse to, the same way.
fn plain(data: &[u8]) -> Vec<String> {
    let mut w = PerfDataWriter::new(IoCursor::new(Vec::new()), &attrs()).unwrap();
    w.put(data).unwrap();
    let bytes = w.finish(&Default::default()).unwrap().into_inner();
    let (recs, errors) = expand(&bytes);
    assert!(errors.is_empty(), "{errors:?}");
    recs.into_iter().map(|(_, r)| r).collect()
}

#[test]
fn records_inside_compressed_records_equal_the_uncompressed_ones() {
    let data = ring_bytes(3000);
    let want = plain(&data);
    assert!(want.len() > 3000);
    for kind in [COMPRESSED, COMPRESSED2] {
        // Pushes of 4 KiB, records of 1000 bytes: inner records straddle
        // COMPRESSED records, zstd blocks straddle them too.
        let pieces = perf_zstd(&data, 4096, 1000);
        assert!(pieces.len() > 3, "{}", pieces.len());
        let bytes = compressed_file(&pieces, kind);
        assert!(bytes.len() < data.len(), "compression did something");
        let (got, errors) = expand(&bytes);
        assert!(errors.is_empty(), "{errors:?}");
        let inner: Vec<String> = got.iter().filter(|r| r.0).map(|r| r.1.clone()).collect();
        assert_eq!(inner, want);
        // Each COMPRESSED record is yielded itself too, then FINISHED_ROUND.
        let outer = got.iter().filter(|r| !r.0).count();
        assert_eq!(outer, pieces.len() + 1);
        assert!(got.last().unwrap().1.contains("FinishedRound"));

        // The plain iterator sees the COMPRESSED records, not inside them.
        let file = PerfData::parse(&bytes).unwrap();
        let n = file
            .records()
            .filter(|r| matches!(r.as_ref().unwrap().record, PerfRecord::Compressed(_)))
            .count();
        assert_eq!(n, pieces.len());
    }
}

#[test]
fn one_push_larger_than_the_decompression_chunk_streams_through() {
    // One flush of ~1 MiB: decoded CHUNK by CHUNK, never all at once.
    let data = ring_bytes(6_000);
    assert!(data.len() > 4 * CHUNK);
    let pieces = perf_zstd(&data, data.len(), 60_000);
    let (got, errors) = expand(&compressed_file(&pieces, COMPRESSED));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(got.iter().filter(|r| r.0).count(), plain(&data).len());
}

#[test]
fn pipe_stream_with_header_compressed_feature() {
    let data = ring_bytes(200);
    let pieces = perf_zstd(&data, 2048, 700);
    let mut w = PipeWriter::new(Vec::new(), &attrs(), &Default::default()).unwrap();
    // HEADER_FEATURE(COMPRESSED): version 1, zstd, level 1, ratio 3, mmap_len.
    let mut feat = u64::from(header::feature::COMPRESSED)
        .to_le_bytes()
        .to_vec();
    for v in [1u32, 1, 1, 3, 528_384] {
        feat.extend_from_slice(&v.to_le_bytes());
    }
    feat.extend_from_slice(&[0; 4]);
    w.write_record(reader::user_type::HEADER_FEATURE, 0, &feat)
        .unwrap();
    for p in &pieces {
        put_compressed(&mut w, p, COMPRESSED);
    }
    let bytes = w.finish().unwrap();
    let file = PerfData::parse(&bytes).unwrap();
    let mut records = file.records();
    let mut inner = 0;
    while let Some(r) = records.next_expanded().transpose() {
        inner += usize::from(r.unwrap().is_decompressed());
    }
    assert_eq!(inner, plain(&data).len());
    let c = records.pipe_features().compressed.unwrap();
    assert_eq!((c.kind, c.level, c.ratio, c.mmap_len), (1, 1, 3, 528_384));
}

#[test]
fn broken_stream_is_one_error_per_compressed_record_and_iteration_goes_on() {
    let data = ring_bytes(100);
    let mut pieces = perf_zstd(&data, data.len(), 100_000);
    // Not zstd at all, then a good stream that starts afresh.
    pieces.insert(0, vec![0x55; 40]);
    let (got, errors) = expand(&compressed_file(&pieces, COMPRESSED));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        matches!(errors[0].kind, ErrorKind::Zstd { .. }),
        "{errors:?}"
    );
    let data_start = PerfData::parse(&compressed_file(&pieces, COMPRESSED))
        .unwrap()
        .header
        .data
        .offset;
    assert_eq!(
        errors[0].offset,
        FileOffset(data_start),
        "the COMPRESSED record's offset"
    );
    assert_eq!(got.iter().filter(|r| r.0).count(), plain(&data).len());
}

#[test]
fn record_cut_off_at_the_end_of_the_stream_is_reported() {
    let mut data = ring_bytes(10);
    data.truncate(data.len() - 5);
    let pieces = perf_zstd(&data, data.len(), 100_000);
    let (_, errors) = expand(&compressed_file(&pieces, COMPRESSED));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let ErrorKind::InCompressed {
        kind,
        stream_offset,
    } = &errors[0].kind
    else {
        panic!("{errors:?}")
    };
    assert!(matches!(**kind, ErrorKind::Truncated { .. }), "{kind:?}");
    assert!(*stream_offset > 0 && *stream_offset < data.len() as u64);
}

#[test]
fn auxtrace_inside_compressed_data_is_refused() {
    let mut inner = Vec::new();
    inner.extend_from_slice(&71u32.to_le_bytes());
    inner.extend_from_slice(&0u16.to_le_bytes());
    inner.extend_from_slice(&48u16.to_le_bytes());
    inner.extend_from_slice(&[0u8; 40]);
    let pieces = perf_zstd(&inner, inner.len(), 100_000);
    let (_, errors) = expand(&compressed_file(&pieces, COMPRESSED));
    assert_eq!(errors.len(), 1, "{errors:?}");
    let ErrorKind::InCompressed { kind, .. } = &errors[0].kind else {
        panic!("{errors:?}")
    };
    assert_eq!(
        **kind,
        ErrorKind::NotAllowedInCompressed { record_type: 71 }
    );
}

#[test]
fn decompression_bomb_stops_at_the_limit() {
    // Zeros compress to almost nothing; without HEADER_COMPRESSED the
    // limit per COMPRESSED record is DEFAULT_LIMIT (16 MiB).
    let zeros = vec![0u8; 1 << 20];
    let pieces = perf_zstd(&zeros, zeros.len(), 60_000);
    assert_eq!(pieces.len(), 1);
    let bytes = compressed_file(&pieces, COMPRESSED);
    let (_, errors) = expand(&bytes);
    // Zero-filled records have size 0: refused at once, long before the limit.
    assert!(
        matches!(&errors[0].kind, ErrorKind::InCompressed { .. }),
        "{errors:?}"
    );
    // Records of 0x101 bytes each (every byte 1) are valid headers: the limit stops them.
    let ones = vec![1u8; 17 << 20];
    let pieces = perf_zstd(&ones, ones.len(), 60_000);
    let bytes = compressed_file(&pieces, COMPRESSED);
    let file = PerfData::parse(&bytes).unwrap();
    let mut records = file.records();
    let (mut inner, mut errors) = (0u64, Vec::new());
    while let Some(r) = records.next_expanded().transpose() {
        match r {
            Ok(e) => inner += u64::from(e.is_decompressed()),
            Err(e) => errors.push(e),
        }
    }
    assert_eq!(
        errors,
        vec![Error::at(
            file.header.data.offset,
            ErrorKind::CompressedTooLarge {
                limit: super::compressed::DEFAULT_LIMIT
            }
        )]
    );
    assert!(
        inner <= super::compressed::DEFAULT_LIMIT / 0x101 + 1,
        "{inner}"
    );
}

#[test]
fn aux_streams_see_aux_records_inside_compressed_data() {
    // perf record -z: the ring buffer's AUX and LOST records are
    // compressed, the AUXTRACE buffers are written as they are.
    let mut ring = Ring(Vec::new());
    ring.aux(0, 0x40, crate::pevent::record::aux_flag::TRUNCATED, &sid(5))
        .unwrap();
    ring.write_event(
        record_type::LOST,
        0,
        &[7, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0],
        &sid(6),
    )
    .unwrap();
    let pieces = perf_zstd(&ring.0, ring.0.len(), 100_000);
    let mut w = PerfDataWriter::new(IoCursor::new(Vec::new()), &attrs()).unwrap();
    put_compressed(&mut w, &pieces[0], COMPRESSED);
    w.auxtrace(&[0x02, 0x82, 0x02, 0x82], 0, 0, 0, 42, u32::MAX)
        .unwrap();
    w.auxtrace(&[0u8; 16], 0x100, 0, 0, 42, u32::MAX).unwrap();
    let bytes = w.finish(&Default::default()).unwrap().into_inner();
    let file = PerfData::parse(&bytes).unwrap();
    let streams = AuxStreams::collect(&file);
    assert!(streams.errors.is_empty(), "{:?}", streams.errors);
    assert_eq!(streams.aux_losses.len(), 1);
    assert_eq!(streams.aux_losses[0].aux_size, 0x40);
    assert_eq!(streams.aux_losses[0].tid, Some(42));
    assert_eq!(streams.lost_records.len(), 1);
    assert_eq!(streams.lost_records[0].1, 3);
    let q = &streams.queues[&QueueKey {
        cpu: u32::MAX,
        tid: 42,
    }];
    // The writer pads AUXTRACE payloads to 8 bytes, as perf does.
    assert_eq!(q.chunks[0].data.len(), 8);
    assert_eq!(q.len(), 24);
    assert_eq!(q.chunks[1].stream_offset, 8);
    assert_eq!(q.gaps.len(), 1);
}
