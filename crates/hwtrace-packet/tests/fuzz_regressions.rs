//! Inputs the fuzzer (`fuzz/fuzz_targets/packet_decode.rs`) once broke us
//! with, kept under `testdata/fuzz/packet_decode/`, named after what broke.
//! Each must now pass the same checks the fuzz target makes.

use hwtrace_packet::{MAX_PACKET_LEN, PacketDecoder, encode};
use hwtrace_types::TraceOffset;
use std::path::Path;

fn check(data: &[u8]) {
    let mut d = PacketDecoder::new(data);
    let mut steps = 0usize;
    loop {
        steps += 1;
        assert!(steps <= 2 * data.len() + 2, "decoder made no progress");
        match d.next_packet() {
            Ok(Some(p)) => {
                let mut buf = [0u8; MAX_PACKET_LEN];
                encode(&p.packet, &mut buf).expect("decoded packets encode");
            }
            Ok(None) => break,
            Err(_) => {
                if d.resync().is_err() {
                    break;
                }
            }
        }
    }
    let mut back = PacketDecoder::new(data);
    let mut previous = u64::MAX;
    while let Ok(at) = back.sync_backward() {
        assert!(at.0 < previous, "sync_backward repeated {at:?}");
        previous = at.0;
        if at.0 == 0 || back.set_offset(TraceOffset(at.0 - 1)).is_err() {
            break;
        }
    }
}

#[test]
fn every_saved_fuzz_input_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/packet_decode");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n >= 1, "no inputs in {}", dir.display());
}
