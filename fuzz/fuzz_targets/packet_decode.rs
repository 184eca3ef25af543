//! Arbitrary bytes as an Intel PT trace: decoding, syncing both ways,
//! resyncing after every error and re-encoding every decoded packet must
//! never panic, always make progress, and round-trip.
#![no_main]

use hwtrace_packet::{LastIp, MAX_PACKET_LEN, PacketDecoder, encode};
use hwtrace_types::TraceOffset;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = PacketDecoder::new(data);
    let mut last_ip = LastIp::new();
    let mut steps = 0usize;
    loop {
        steps += 1;
        assert!(steps <= 2 * data.len() + 2, "decoder made no progress");
        match d.next_packet() {
            Ok(Some(p)) => {
                assert!(p.size as usize <= MAX_PACKET_LEN);
                if let Some(ip) = p.packet.ip_payload() {
                    last_ip.update(ip);
                    let _ = last_ip.ip();
                }
                // Every decoded packet encodes, and the encoding decodes to it.
                let mut buf = [0u8; MAX_PACKET_LEN];
                let n = encode(&p.packet, &mut buf).expect("decoded packets encode");
                let again = PacketDecoder::new(&buf[..n]).next_packet();
                if !matches!(p.packet, hwtrace_packet::Packet::Bip { .. }) {
                    assert_eq!(
                        again.expect("re-decodes").expect("one packet").packet,
                        p.packet
                    );
                }
            }
            Ok(None) => break,
            Err(e) => {
                assert!(e.offset.0 <= data.len() as u64);
                if d.resync().is_err() {
                    break;
                }
                last_ip.reset();
            }
        }
    }
    // Backward sync from the end visits PSBs in strictly decreasing order.
    let mut back = PacketDecoder::new(data);
    let mut previous = u64::MAX;
    while let Ok(at) = back.sync_backward() {
        assert!(at.0 < previous, "sync_backward repeated {at:?}");
        previous = at.0;
        if at.0 == 0 || back.set_offset(TraceOffset(at.0 - 1)).is_err() {
            break;
        }
    }
});
