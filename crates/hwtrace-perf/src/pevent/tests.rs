//! Unit tests across the pevent layers, with a tiny record-writing DSL.

use proptest::prelude::*;

use super::record::{ErrorKind, misc, record_type as t, sample_type as st};
use super::*;
use hwtrace_types::{Ip, Tsc};

/// Builds one record: header, body fields, then the sample trailer.
struct Rec {
    kind: u32,
    misc: u16,
    body: Vec<u8>,
}

impl Rec {
    fn new(kind: u32) -> Self {
        Self {
            kind,
            misc: 0,
            body: Vec::new(),
        }
    }
    fn misc(mut self, m: u16) -> Self {
        self.misc = m;
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.body.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(mut self, s: &str) -> Self {
        self.body.extend_from_slice(s.as_bytes());
        self.body.push(0);
        while !self.body.len().is_multiple_of(8) {
            self.body.push(0);
        }
        self
    }
    /// TID 1/2, TIME `time`.
    fn tid_time(self, time: u64) -> Self {
        self.u32(1).u32(2).u64(time)
    }
    fn build(self) -> Vec<u8> {
        let size = (8 + self.body.len()) as u16;
        let mut v = Vec::new();
        v.extend_from_slice(&self.kind.to_le_bytes());
        v.extend_from_slice(&self.misc.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&self.body);
        v
    }
}

const TT: u64 = st::TID | st::TIME;

fn compact(bytes: &[u8], stype: u64) -> String {
    let rec = parse_record(bytes, SidebandOffset(0x40), stype).unwrap();
    let mut out = Vec::new();
    let flags = PrintFlags {
        compact: true,
        ..PrintFlags::default()
    };
    print_record(&mut out, &rec, rec.sample.time.map(Tsc), "f.sb", flags).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn mmap() {
    let b = Rec::new(t::MMAP)
        .u32(1)
        .u32(2)
        .u64(0x1000)
        .u64(0x200)
        .u64(0x30)
        .str("/bin/true")
        .tid_time(9)
        .build();
    let r = parse_record(&b, SidebandOffset(0), TT).unwrap();
    let Body::Mmap(m) = r.body else {
        panic!("{r:?}")
    };
    assert_eq!(
        (m.pid, m.tid, m.addr, m.len, m.pgoff),
        (1, 2, 0x1000, 0x200, 0x30)
    );
    assert_eq!(m.filename, b"/bin/true");
    assert_eq!(r.sample.time, Some(9));
    assert_eq!(
        compact(&b, TT),
        "PERF_RECORD_MMAP  1/2, 1000, 200, 30, /bin/true  { 1/2 9 }\n"
    );
}

#[test]
fn mmap2_with_device_and_build_id() {
    let dev = Rec::new(t::MMAP2)
        .u32(1)
        .u32(1)
        .u64(0x1000)
        .u64(0x10)
        .u64(0)
        .u32(8)
        .u32(1)
        .u64(0x77)
        .u64(2)
        .u32(5)
        .u32(2)
        .str("a")
        .build();
    let r = parse_record(&dev, SidebandOffset(0), 0).unwrap();
    let Body::Mmap2(m) = r.body else {
        panic!("{r:?}")
    };
    assert_eq!(
        (m.maj, m.min, m.ino, m.ino_generation, m.prot, m.flags),
        (8, 1, 0x77, 2, 5, 2)
    );
    assert_eq!(m.build_id(r.header.misc), None);
    assert_eq!(
        compact(&dev, 0),
        "PERF_RECORD_MMAP2  1/1, 1000, 10, 0, 8, 1, 77, 2, 5, 2, a  { }\n"
    );

    let mut id = vec![3u8, 0, 0, 0];
    id.extend((1..=20).map(|i| i as u8));
    let mut with_id = Rec::new(t::MMAP2)
        .misc(misc::MMAP_BUILD_ID)
        .u32(1)
        .u32(1)
        .u64(0x1000)
        .u64(0x10)
        .u64(0);
    with_id.body.extend_from_slice(&id);
    let b = with_id.u32(5).u32(2).str("b").build();
    let r = parse_record(&b, SidebandOffset(0), 0).unwrap();
    let Body::Mmap2(m) = r.body else {
        panic!("{r:?}")
    };
    assert_eq!(m.build_id(r.header.misc), Some(&[1u8, 2, 3][..]));
}

#[test]
fn simple_bodies_print_like_libipt() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            Rec::new(t::LOST).u64(3).u64(8).tid_time(0).build(),
            "PERF_RECORD_LOST  3, 8  { 1/2 0 }",
        ),
        (
            Rec::new(t::COMM)
                .u32(5)
                .u32(6)
                .str("foo")
                .tid_time(1)
                .build(),
            "PERF_RECORD_COMM  5/6, foo  { 1/2 1 }",
        ),
        (
            Rec::new(t::COMM)
                .misc(misc::COMM_EXEC)
                .u32(5)
                .u32(6)
                .str("bar")
                .tid_time(1)
                .build(),
            "PERF_RECORD_COMM.EXEC  5/6, bar  { 1/2 1 }",
        ),
        (
            Rec::new(t::EXIT)
                .u32(2)
                .u32(1)
                .u32(3)
                .u32(4)
                .u64(5)
                .tid_time(1)
                .build(),
            "PERF_RECORD_EXIT  2/3, 1/4, 5  { 1/2 1 }",
        ),
        (
            Rec::new(t::FORK)
                .u32(2)
                .u32(1)
                .u32(3)
                .u32(4)
                .u64(5)
                .tid_time(1)
                .build(),
            "PERF_RECORD_FORK  2/3, 1/4, 5  { 1/2 1 }",
        ),
        (
            Rec::new(t::THROTTLE)
                .u64(1)
                .u64(2)
                .u64(3)
                .tid_time(1)
                .build(),
            "PERF_RECORD_THROTTLE  1, 2, 3  { 1/2 1 }",
        ),
        (
            Rec::new(t::UNTHROTTLE)
                .u64(1)
                .u64(2)
                .u64(3)
                .tid_time(1)
                .build(),
            "PERF_RECORD_UNTHROTTLE  1, 2, 3  { 1/2 1 }",
        ),
        (
            Rec::new(t::AUX)
                .u64(0xa000)
                .u64(0x1000)
                .u64(0)
                .tid_time(1)
                .build(),
            "PERF_RECORD_AUX  a000, 1000, 0  { 1/2 1 }",
        ),
        (
            Rec::new(t::AUX)
                .u64(0xb000)
                .u64(0x700)
                .u64(7)
                .tid_time(1)
                .build(),
            "PERF_RECORD_AUX.TRUNCATED  b000, 700, 7  { 1/2 1 }",
        ),
        (
            Rec::new(t::ITRACE_START).u32(1).u32(2).tid_time(1).build(),
            "PERF_RECORD_ITRACE_START  1/2  { 1/2 1 }",
        ),
        (
            Rec::new(t::LOST_SAMPLES).u64(8).tid_time(1).build(),
            "PERF_RECORD_LOST_SAMPLES  8  { 1/2 1 }",
        ),
        (
            Rec::new(t::SWITCH).tid_time(1).build(),
            "PERF_RECORD_SWITCH.IN  { 1/2 1 }",
        ),
        (
            Rec::new(t::SWITCH)
                .misc(misc::SWITCH_OUT)
                .tid_time(1)
                .build(),
            "PERF_RECORD_SWITCH.OUT  { 1/2 1 }",
        ),
        (
            Rec::new(t::SWITCH_CPU_WIDE)
                .u32(8)
                .u32(9)
                .tid_time(1)
                .build(),
            "PERF_RECORD_SWITCH_CPU_WIDE.IN  8/9  { 1/2 1 }",
        ),
        (
            Rec::new(t::SWITCH_CPU_WIDE)
                .misc(misc::SWITCH_OUT)
                .u32(8)
                .u32(9)
                .tid_time(1)
                .build(),
            "PERF_RECORD_SWITCH_CPU_WIDE.OUT  8/9  { 1/2 1 }",
        ),
        // Unknown types keep their bytes and get no trailer.
        (
            Rec::new(t::SAMPLE).misc(2).u64(1).build(),
            "UNKNOWN (9, 2)  { }",
        ),
    ];
    for (bytes, line) in cases {
        assert_eq!(compact(&bytes, TT), format!("{line}\n"));
    }
}

#[test]
fn aux_flags() {
    let b = Rec::new(t::AUX).u64(0).u64(0).u64(6).build();
    let Body::Aux(a) = parse_record(&b, SidebandOffset(0), 0).unwrap().body else {
        panic!()
    };
    assert!(!a.truncated() && a.overwrite() && a.partial());
}

#[test]
fn every_sample_field_in_abi_order() {
    let all = st::TID | st::TIME | st::ID | st::STREAM_ID | st::CPU | st::IDENTIFIER;
    let b = Rec::new(t::SWITCH)
        .u32(1)
        .u32(2) // tid
        .u64(3) // time
        .u64(4) // id
        .u64(5) // stream id
        .u32(6)
        .u32(0xdead) // cpu + reserved
        .u64(7) // identifier
        .build();
    let r = parse_record(&b, SidebandOffset(0), all).unwrap();
    assert_eq!(
        r.sample,
        SampleId {
            pid_tid: Some((1, 2)),
            time: Some(3),
            id: Some(4),
            stream_id: Some(5),
            cpu: Some(6),
            identifier: Some(7),
        }
    );
    // libipt prints cpu before stream id.
    assert_eq!(
        compact(&b, all),
        "PERF_RECORD_SWITCH.IN  { 1/2 3 4 cpu-6 5 7 }\n"
    );
}

#[test]
fn verbose_and_prefixes() {
    let b = Rec::new(t::LOST).u64(3).u64(8).tid_time(5).build();
    let r = parse_record(&b, SidebandOffset(0x68), TT).unwrap();
    let mut out = Vec::new();
    let flags = PrintFlags {
        verbose: true,
        filename: true,
        offset: true,
        time: true,
        ..PrintFlags::default()
    };
    print_record(&mut out, &r, Some(Tsc(0x50)), "x.sb", flags).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "x.sb:0000000000000068  0000000000000050  PERF_RECORD_LOST\n  id: 3\n  lost: 8\n  pid: 1\n  tid: 2\n  time: 5\n"
    );
    // No flags: nothing at all.
    let mut out = Vec::new();
    print_record(&mut out, &r, None, "x.sb", PrintFlags::default()).unwrap();
    assert!(out.is_empty());
}

#[test]
fn errors_carry_offset_and_type() {
    let good = Rec::new(t::ITRACE_START).u32(1).u32(1).build();
    let at = |bytes: &[u8], stype| parse_record(bytes, SidebandOffset(0x10), stype).unwrap_err();

    let e = at(&good[..5], 0);
    assert_eq!(e.offset, SidebandOffset(0x10));
    assert_eq!(e.kind, ErrorKind::TruncatedHeader { available: 5 });
    assert!(e.kind.is_end_of_stream());

    let mut small = good.clone();
    small[6] = 4;
    assert_eq!(
        at(&small, 0).kind,
        ErrorKind::SizeTooSmall {
            record_type: t::ITRACE_START,
            size: 4
        }
    );

    assert_eq!(
        at(&good[..12], 0).kind,
        ErrorKind::SizeTooBig {
            record_type: t::ITRACE_START,
            size: 16,
            available: 12
        }
    );

    let zero = Rec::new(0).u64(0).build();
    assert_eq!(at(&zero, 0).kind, ErrorKind::ZeroType);

    // The trailer the sample type asks for is missing.
    let e = at(&good, st::TIME);
    assert_eq!(
        e.kind,
        ErrorKind::SampleSizeMismatch {
            record_type: t::ITRACE_START,
            needed: 24,
            size: 16
        }
    );
    assert_eq!(e.kind.libipt_message(), "decoder out of sync");
    assert!(e.to_string().contains("0x10"));

    let unterminated = Rec::new(t::COMM).u32(1).u32(1).u64(u64::MAX).build();
    assert_eq!(
        at(&unterminated, 0).kind,
        ErrorKind::BadString {
            record_type: t::COMM,
            field: "comm"
        }
    );

    let short = Rec::new(t::MMAP).u32(1).u32(1).build();
    assert_eq!(
        at(&short, 0).kind,
        ErrorKind::BodyTooShort {
            record_type: t::MMAP,
            needed: 40,
            size: 16
        }
    );
}

#[test]
fn reader_walks_records_and_stops_on_error() {
    let mut bytes = Rec::new(t::LOST_SAMPLES).u64(1).build();
    bytes.extend(Rec::new(t::SWITCH).build());
    bytes.extend([1, 0, 0]);
    let mut r = RecordReader::new(&bytes, 0);
    assert!(matches!(
        r.next_record().unwrap().unwrap().body,
        Body::LostSamples(1)
    ));
    assert!(matches!(
        r.next_record().unwrap().unwrap().body,
        Body::Switch
    ));
    let e = r.next_record().unwrap_err();
    assert_eq!(e.offset, SidebandOffset(24));
    assert_eq!(r.next_record(), Ok(None));
}

fn session_over(channels: Vec<(Vec<u8>, ChannelConfig)>, output: OutputOptions) -> Session {
    session_ids(channels, output).0
}

fn session_ids(
    channels: Vec<(Vec<u8>, ChannelConfig)>,
    output: OutputOptions,
) -> (Session, Vec<ChannelId>) {
    let mut s = Session::new(output);
    let ids = channels
        .into_iter()
        .enumerate()
        .map(|(i, (data, config))| s.add_buffer(&format!("ch{i}.sb"), data, config))
        .collect();
    (s, ids)
}

fn compact_output() -> OutputOptions {
    OutputOptions {
        records: PrintFlags {
            compact: true,
            ..PrintFlags::default()
        },
        ..OutputOptions::default()
    }
}

fn lost_at(time: u64, id: u64) -> Vec<u8> {
    Rec::new(t::LOST).u64(id).u64(0).u64(time).build()
}

fn timed() -> ChannelConfig {
    ChannelConfig {
        sample_type: st::TIME,
        ..ChannelConfig::default()
    }
}

fn ids(out: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .unwrap_or("")
                .trim_end_matches(',')
                .to_owned()
        })
        .collect()
}

#[test]
fn merge_by_tsc_with_libipt_tie_breaking() {
    let a: Vec<u8> = [lost_at(1, 0xa1), lost_at(3, 0xa3), lost_at(3, 0xa4)].concat();
    let b: Vec<u8> = [lost_at(1, 0xb1), lost_at(2, 0xb2), lost_at(3, 0xb3)].concat();
    let mut s = session_over(vec![(a, timed()), (b, timed())], compact_output());
    assert_eq!(s.next_tsc(), None); // not started yet
    let mut out = Vec::new();
    s.start(&mut out).unwrap();
    assert_eq!(s.next_tsc(), Some(Tsc(1)));
    s.dump_due(Tsc(0), &mut out).unwrap();
    assert!(out.is_empty());
    s.dump_due(Tsc(2), &mut out).unwrap();
    // The first channel wins the tie at start; b then keeps its turn.
    assert_eq!(ids(&out), ["a1", "b1", "b2"]);
    out.clear();
    s.dump_rest(&mut out).unwrap();
    // a3 was queued before b3 came back with an equal TSC, b3 goes first.
    assert_eq!(ids(&out), ["b3", "a3", "a4"]);
}

#[test]
fn time_conversion_and_offset_order_records() {
    let conv = ChannelConfig {
        sample_type: st::TIME,
        time: TimeConversion {
            zero: 100,
            shift: 1,
            mult: 1,
        },
        tsc_offset: 10,
        ..ChannelConfig::default()
    };
    // time 110 -> (10 << 1) = 20 -> minus offset 10 = 10.
    let mut s = session_over(vec![(lost_at(110, 1), conv)], compact_output());
    let mut out = Vec::new();
    s.dump_due(Tsc(9), &mut out).unwrap();
    assert!(out.is_empty());
    s.dump_due(Tsc(10), &mut out).unwrap();
    assert_eq!(ids(&out), ["1"]);
}

#[test]
fn bad_records_and_zero_mult_are_diagnosed() {
    let mut bad = lost_at(1, 1);
    bad.extend(Rec::new(t::ITRACE_START).u32(1).u32(1).build()); // no time trailer
    let zero_mult = ChannelConfig {
        time: TimeConversion {
            zero: 0,
            shift: 0,
            mult: 0,
        },
        ..timed()
    };
    let (mut s, ids) = session_ids(
        vec![(bad, timed()), (lost_at(5, 2), zero_mult)],
        compact_output(),
    );
    let mut out = Vec::new();
    s.start(&mut out).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "[ch1.sb:0000000000000000 sideband error: bad configuration]\n"
    );
    out.clear();
    s.dump_rest(&mut out).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "PERF_RECORD_LOST  1, 0  { 1 }\n[ch0.sb:0000000000000020 sideband error: decoder out of sync]\n"
    );
    assert!(s.channel_stop(ids[0]).is_some());
}

#[test]
fn truncated_tail_ends_the_channel_quietly() {
    let mut data = lost_at(1, 1);
    data.extend(&lost_at(2, 2)[..20]);
    let (mut s, chans) = session_ids(vec![(data, timed())], compact_output());
    let mut out = Vec::new();
    s.dump_rest(&mut out).unwrap();
    assert_eq!(ids(&out), ["1"]);
    let stop = s.channel_stop(chans[0]).unwrap();
    assert!(matches!(stop.kind, ErrorKind::SizeTooBig { .. }));
}

#[test]
fn contexts_follow_exec_fork_and_mmap() {
    let at = |r: Rec, time: u64| r.u64(time).build();
    let data = [
        at(
            Rec::new(t::MMAP)
                .u32(1)
                .u32(1)
                .u64(0x1000)
                .u64(0x100)
                .u64(0)
                .str("/a"),
            0,
        ),
        // Kernel MMAPs are ignored.
        at(
            Rec::new(t::MMAP)
                .misc(misc::KERNEL)
                .u32(1)
                .u32(1)
                .u64(0xffff_0000)
                .u64(0x100)
                .u64(0)
                .str("/vmlinux"),
            0,
        ),
        at(Rec::new(t::ITRACE_START).u32(1).u32(1), 0),
        at(Rec::new(t::FORK).u32(2).u32(1).u32(2).u32(1).u64(0), 0),
        at(
            Rec::new(t::COMM)
                .misc(misc::COMM_EXEC)
                .u32(1)
                .u32(1)
                .str("b"),
            5,
        ),
        at(
            Rec::new(t::MMAP)
                .u32(1)
                .u32(1)
                .u64(0x2000)
                .u64(0x100)
                .u64(0)
                .str("/b"),
            5,
        ),
    ]
    .concat();
    let config = ChannelConfig {
        kernel_start: Ip(0xffff_0000),
        ..timed()
    };
    let mut s = Session::new(OutputOptions {
        switches: true,
        ..OutputOptions::default()
    });
    let ch = s.add_buffer("c.sb", data, config);
    let mut out = Vec::new();
    let event = |tsc, ip| TraceEvent {
        tsc: Tsc(tsc),
        hint: LocationHint::Ip(Ip(ip)),
    };
    // ITRACE_START switches at once.
    let first = s.apply_event(event(0, 0x1000), &mut out).unwrap().unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "[context: pid-1]\n");
    let ctx = s.contexts().get(first).unwrap();
    assert_eq!(ctx.lookup(Ip(0x1010)).unwrap().filename, "/a");
    assert!(ctx.lookup(Ip(0xffff_0010)).is_none());
    // The forked child starts with the parent's image.
    let child = s.contexts().find(2).unwrap();
    assert_eq!(s.contexts().get(child).unwrap().mappings().len(), 1);
    // The exec is applied in user space: its switch waits for the kernel.
    out.clear();
    assert_eq!(s.apply_event(event(5, 0x1004), &mut out).unwrap(), None);
    assert!(out.is_empty());
    assert_eq!(s.current_context(ch), Some(first));
    let second = s
        .apply_event(event(6, 0xffff_0100), &mut out)
        .unwrap()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "[context: pid-1]\n");
    assert_ne!(first, second);
    let ctx = s.contexts().get(second).unwrap();
    assert_eq!(ctx.pid(), 1);
    assert!(ctx.lookup(Ip(0x1010)).is_none());
    assert_eq!(ctx.lookup(Ip(0x2010)).unwrap().filename, "/b");
    assert_eq!(s.current_context(ch), Some(second));
}

#[test]
fn file_arguments_and_ranges() {
    assert_eq!(
        split_file_arg("a.sb").unwrap(),
        ("a.sb", FileRange::default())
    );
    assert_eq!(
        split_file_arg("a.sb:0x10-0x20").unwrap(),
        (
            "a.sb",
            FileRange {
                begin: 0x10,
                end: Some(0x20)
            }
        )
    );
    assert_eq!(
        split_file_arg("a:b.sb:010").unwrap(),
        (
            "a:b.sb",
            FileRange {
                begin: 8,
                end: None
            }
        )
    );
    // Not a range: the colon belongs to the name.
    assert_eq!(
        split_file_arg("c:\\x.sb").unwrap(),
        ("c:\\x.sb", FileRange::default())
    );
    assert!(split_file_arg("a.sb:0x20-0x10").is_err());

    let dir = std::env::temp_dir().join(format!("hwtrace-perf-range-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r.sb");
    let data = [lost_at(1, 1), lost_at(2, 2)].concat();
    std::fs::write(&path, &data).unwrap();
    let mut s = Session::new(OutputOptions {
        records: PrintFlags {
            compact: true,
            offset: true,
            ..PrintFlags::default()
        },
        ..OutputOptions::default()
    });
    s.add_file(&format!("{}:0x20-0x40", path.display()), timed())
        .unwrap();
    let mut out = Vec::new();
    s.dump_rest(&mut out).unwrap();
    // Offsets count from the start of the range.
    assert_eq!(
        String::from_utf8_lossy(&out),
        "0000000000000000  PERF_RECORD_LOST  2, 0  { 2 }\n"
    );
    assert!(
        s.add_file(&format!("{}:0x1000", path.display()), timed())
            .is_err()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

proptest! {
    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512),
                            stype in any::<u64>()) {
        // The reader stops at the first error.
        for r in RecordReader::new(&bytes, stype).map_while(Result::ok) {
            let mut out = Vec::new();
            let all = PrintFlags { compact: true, verbose: true, filename: true, offset: true, time: true };
            print_record(&mut out, &r, Some(Tsc(1)), "g", all).unwrap();
        }
        let config = ChannelConfig { sample_type: stype, ..ChannelConfig::default() };
        let mut s = session_over(vec![(bytes.clone(), config)], compact_output());
        let mut out = Vec::new();
        s.apply_event(TraceEvent { tsc: Tsc(u64::MAX / 2), hint: LocationHint::None }, &mut out).unwrap();
        s.dump_rest(&mut out).unwrap();
    }

    #[test]
    fn mutated_records_never_panic(pos in 0usize..64, byte in any::<u8>(), cut in 0usize..80) {
        let mut bytes = Rec::new(t::MMAP2).u32(1).u32(1).u64(1).u64(2).u64(3)
            .u32(4).u32(5).u64(6).u64(7).u32(8).u32(9).str("file").tid_time(3).build();
        let pos = pos % bytes.len();
        bytes[pos] = byte;
        bytes.truncate(cut.min(bytes.len()));
        let _ = parse_record(&bytes, SidebandOffset(0), TT);
    }

    #[test]
    fn built_records_round_trip(pid in any::<u32>(), tid in any::<u32>(), addr in any::<u64>(),
                                name in "[a-z/.]{0,40}", time in any::<u64>()) {
        let b = Rec::new(t::MMAP).u32(pid).u32(tid).u64(addr).u64(1).u64(0).str(&name)
            .u32(pid).u32(tid).u64(time).build();
        let r = parse_record(&b, SidebandOffset(0), TT).unwrap();
        prop_assert_eq!(r.raw.len(), b.len());
        let Body::Mmap(m) = r.body else { panic!() };
        prop_assert_eq!((m.pid, m.tid, m.addr), (pid, tid, addr));
        prop_assert_eq!(m.filename, name.as_bytes());
        prop_assert_eq!(r.sample.pid_tid, Some((pid, tid)));
        prop_assert_eq!(r.sample.time, Some(time));
    }
}
