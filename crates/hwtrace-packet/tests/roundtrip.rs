//! Property tests: random valid packet sequences encode and decode back to
//! the same packets at the same offsets, and random bytes never panic.

mod common;

use common::stream;
use hwtrace_packet::{LastIp, Packet, PacketDecoder, TraceBuilder};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn encode_then_decode_is_identity(packets in stream()) {
        let mut b = TraceBuilder::new();
        let mut offsets = Vec::new();
        for p in &packets {
            offsets.push(b.as_bytes().len() as u64);
            b.push(*p).unwrap();
        }
        let bytes = b.finish();
        let decoded: Vec<_> = PacketDecoder::new(&bytes).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), packets.len());
        for ((d, p), off) in decoded.iter().zip(&packets).zip(&offsets) {
            prop_assert_eq!(&d.packet, p);
            prop_assert_eq!(d.offset.0, *off);
        }
    }

    #[test]
    fn compressed_ips_reconstruct(ips in proptest::collection::vec(any::<u64>(), 1..100)) {
        let mut b = TraceBuilder::new();
        for &ip in &ips {
            b.ip(Packet::Tip, ip).unwrap();
        }
        let bytes = b.finish();
        let mut last = LastIp::new();
        let mut got = Vec::new();
        for p in PacketDecoder::new(&bytes) {
            last.update(p.unwrap().packet.ip_payload().unwrap());
            got.push(last.ip().unwrap());
        }
        prop_assert_eq!(got, ips);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut d = PacketDecoder::new(&bytes);
        let _ = d.sync_forward();
        let mut steps = 0;
        loop {
            steps += 1;
            prop_assert!(steps < 10_000, "decoder made no progress");
            match d.next_packet() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => if d.resync().is_err() { break },
            }
        }
        let mut back = PacketDecoder::new(&bytes);
        while back.sync_backward().is_ok() {
            steps += 1;
            prop_assert!(steps < 20_000, "sync_backward made no progress");
            if back.offset().0 == 0 { break }
            // Step one byte back so the next search looks earlier.
            let here = back.offset().0;
            back.set_offset(hwtrace_types::TraceOffset(here - 1)).unwrap();
        }
    }
}
