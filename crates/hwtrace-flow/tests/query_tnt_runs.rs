//! The query layer hands TNT packets to the TNT cache without building an
//! event for each (`EventDecoder::next_tnt`); these tests check that it
//! still answers exactly as the event stream says: the same events (time
//! stamps included) and offsets when asked for every event, and the same
//! bits in order, across PADs, timing packets and TIPs.

use hwtrace_flow::event::{Event, EventDecoder, EventKind, QueryDecoder};
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_packet::{ModeExec, Packet, Tnt, TraceBuilder};
use hwtrace_types::TraceOffset;

const MODE64: ModeExec = ModeExec {
    csl: true,
    csd: false,
    iflag: false,
};

fn tnt(bits: u64, len: u8) -> Packet {
    Packet::Tnt(Tnt {
        bits,
        len,
        long: len > Tnt::MAX_SHORT,
    })
}

/// PSB+ enabled at 0x1000, then runs of TNT packets split by PADs, timing
/// packets and TIPs, a long TNT, and a disable; `bits` are the branch
/// outcomes in trace order.
fn trace() -> (Vec<u8>, Vec<bool>) {
    let mut t = TraceBuilder::new();
    let mut bits = Vec::new();
    let mut push_tnt = |t: &mut TraceBuilder, b: u64, len: u8| {
        t.push(tnt(b, len)).unwrap();
        bits.extend((0..len).rev().map(|i| b >> i & 1 != 0));
    };
    t.push(Packet::Psb).unwrap();
    t.push(Packet::Tsc(0x1_0000)).unwrap();
    t.push(Packet::ModeExec(MODE64)).unwrap();
    t.ip(Packet::Fup, 0x1000).unwrap();
    t.push(Packet::Psbend).unwrap();
    push_tnt(&mut t, 0b101, 3);
    push_tnt(&mut t, 0b1, 1);
    t.push(Packet::Pad).unwrap();
    t.push(Packet::Pad).unwrap();
    push_tnt(&mut t, 0b110010, 6);
    t.push(Packet::Tsc(0x2_0000)).unwrap();
    push_tnt(&mut t, 0b01, 2);
    t.ip(Packet::Tip, 0x2000).unwrap();
    push_tnt(&mut t, 0b0110, 4);
    push_tnt(&mut t, 0x5555_5555_5555 >> 1, 46);
    t.push(Packet::Pad).unwrap();
    push_tnt(&mut t, 0b1, 1);
    t.ip(Packet::TipPgd, 0x3000).unwrap();
    (t.finish(), bits)
}

#[test]
fn every_event_and_offset_as_the_event_decoder_gives_them() {
    let (bytes, _) = trace();
    // The query layer keeps one event ahead: after handing one out it has
    // decoded the next, and its offset is the event decoder's then.
    let mut evdec = EventDecoder::new(&bytes, Config::default());
    evdec.sync_forward().unwrap();
    let mut want: Vec<(Event, TraceOffset)> = Vec::new();
    let mut next = evdec.next_event();
    loop {
        match next {
            Ok(ev) => {
                next = evdec.next_event();
                want.push((ev, evdec.offset()));
            }
            Err(ErrorKind::Eos) => break,
            Err(e) => panic!("event decoder: {e}"),
        }
    }
    let tnts = want
        .iter()
        .filter(|(e, _)| matches!(e.kind, EventKind::Tnt { .. }))
        .count();
    assert_eq!(tnts, 7, "{want:?}");

    let mut query = QueryDecoder::new(&bytes, Config::default());
    query.sync_forward().unwrap();
    let mut got = Vec::new();
    loop {
        match query.next_any() {
            Ok((ev, _)) => got.push((ev, query.offset())),
            Err(ErrorKind::Eos) => break,
            Err(e) => panic!("query decoder: {e}"),
        }
    }
    assert_eq!(got, want);
}

#[test]
fn tnt_bits_come_out_in_order_with_the_time_of_their_packet() {
    let (bytes, bits) = trace();
    let mut query = QueryDecoder::new(&bytes, Config::default());
    let (ip, status) = query.sync_forward().unwrap();
    assert_eq!(ip, Some(0x1000));
    let mut status = status;
    while status.event_pending {
        status = query.event().unwrap().1;
    }
    let mut got = Vec::new();
    let mut tsc_at = Vec::new();
    // The TIP comes after the 12th bit.
    for i in 0..bits.len() {
        if i == 12 {
            let (to, _) = query.indirect_branch().unwrap();
            assert_eq!(to, Some(0x2000));
        }
        let (taken, s) = query.cond_branch().unwrap();
        got.push(taken);
        tsc_at.push(query.time().estimate().tsc.0);
        status = s;
    }
    assert_eq!(got, bits);
    // The second TSC comes after the third TNT packet: bits of the first
    // three packets were answered at the first TSC, the others later.
    assert!(tsc_at[..10].iter().all(|&t| t == 0x1_0000), "{tsc_at:x?}");
    assert!(tsc_at[10..].iter().all(|&t| t == 0x2_0000), "{tsc_at:x?}");
    // Then the disable, and the end.
    assert!(status.event_pending);
    let (ev, s) = query.event().unwrap();
    assert!(
        matches!(ev.kind, EventKind::Disabled { ip: 0x3000 }),
        "{ev:?}"
    );
    assert!(s.eos);
}

/// What a parallel decode compares at its seams: the bits held for the
/// branches to come, cached or read ahead, change as bits are used, and
/// two decodes that used a packet's bits differently do not look alike.
#[test]
fn the_tnt_state_says_which_bits_are_held() {
    let (bytes, _) = trace();
    let mut query = QueryDecoder::new(&bytes, Config::default());
    let mut status = query.sync_forward().unwrap().1;
    while status.event_pending {
        status = query.event().unwrap().1;
    }
    let fresh = query.tnt_state();
    let mut other = query.clone();
    // The first packet's three bits (taken, not, taken) are loaded by the
    // first question: two are then left.
    assert!(query.cond_branch().unwrap().0);
    let one = query.tnt_state();
    assert_ne!(one, fresh);
    assert_eq!(query.cached_tnt(), (0b01, 2));
    // The same bits used alike: the same state.
    assert!(other.cond_branch().unwrap().0);
    assert_eq!(other.tnt_state(), one);
    // One more bit used: not the same.
    assert!(!query.cond_branch().unwrap().0);
    assert_ne!(query.tnt_state(), other.tnt_state());
    assert_eq!(query.cached_tnt(), (0b1, 1));
}
