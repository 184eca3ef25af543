//! Property tests: random valid packet sequences encode and decode back to
//! the same packets at the same offsets, and random bytes never panic.

use hwtrace_packet::{
    Bbp, Cfe, Evd, IpCompression, IpPayload, LastIp, ModeExec, ModeTsx, Mwait, Packet,
    PacketDecoder, Pip, Ptw, Pwre, Pwrx, Tma, Tnt, TraceBuilder, Trig,
};
use hwtrace_types::Cr3;
use proptest::prelude::*;

fn ip_payload() -> impl Strategy<Value = IpPayload> {
    let comp = prop_oneof![
        Just(IpCompression::Suppressed),
        Just(IpCompression::Update16),
        Just(IpCompression::Update32),
        Just(IpCompression::Sext48),
        Just(IpCompression::Update48),
        Just(IpCompression::Full),
    ];
    (comp, any::<u64>()).prop_map(|(compression, raw)| {
        let n = compression.payload_len() * 8;
        let raw = if n == 0 {
            0
        } else if n == 64 {
            raw
        } else {
            raw & ((1u64 << n) - 1)
        };
        IpPayload { compression, raw }
    })
}

fn tnt() -> impl Strategy<Value = Tnt> {
    (any::<bool>(), any::<u64>(), 1u8..=47).prop_map(|(long, bits, len)| {
        let len = if long { len } else { 1 + len % 6 };
        Tnt {
            bits: bits & ((1u64 << len) - 1),
            len,
            long,
        }
    })
}

/// Any packet that can appear outside a PEBS block.
fn packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        Just(Packet::Pad),
        Just(Packet::Psb),
        Just(Packet::Psbend),
        Just(Packet::Ovf),
        Just(Packet::Stop),
        tnt().prop_map(Packet::Tnt),
        ip_payload().prop_map(Packet::Tip),
        ip_payload().prop_map(Packet::TipPge),
        ip_payload().prop_map(Packet::TipPgd),
        ip_payload().prop_map(Packet::Fup),
        (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(csl, csd, iflag)| Packet::ModeExec(ModeExec { csl, csd, iflag })),
        (any::<bool>(), any::<bool>())
            .prop_map(|(intx, abrt)| Packet::ModeTsx(ModeTsx { intx, abrt })),
        (any::<u64>(), any::<bool>()).prop_map(|(c, nr)| Packet::Pip(Pip {
            cr3: Cr3(c & 0x000f_ffff_ffff_ffe0),
            nr
        })),
        any::<u64>().prop_map(|v| Packet::Tsc(v >> 8)),
        any::<u8>().prop_map(Packet::Cbr),
        (any::<u16>(), 0u16..512).prop_map(|(ctc, fc)| Packet::Tma(Tma { ctc, fc })),
        any::<u8>().prop_map(Packet::Mtc),
        any::<u64>().prop_map(Packet::Cyc),
        any::<u64>().prop_map(|v| Packet::Vmcs(v & 0x000f_ffff_ffff_f000)),
        any::<u64>().prop_map(Packet::Mnt),
        (any::<u64>(), any::<bool>(), any::<bool>()).prop_map(|(v, eight_bytes, ip)| Packet::Ptw(
            Ptw {
                payload: if eight_bytes { v } else { v & 0xffff_ffff },
                eight_bytes,
                ip
            }
        )),
        any::<bool>().prop_map(|ip| Packet::Exstop { ip }),
        (any::<u32>(), any::<u32>()).prop_map(|(hints, ext)| Packet::Mwait(Mwait { hints, ext })),
        any::<u16>().prop_map(|raw| Packet::Pwre(Pwre { raw })),
        any::<u64>().prop_map(|v| Packet::Pwrx(Pwrx {
            raw: v & 0xff_ffff_ffff
        })),
        (0u8..32, any::<bool>(), any::<u8>()).prop_map(|(ty, ip, vector)| Packet::Cfe(Cfe {
            ty,
            ip,
            vector
        })),
        (0u8..64, any::<u64>()).prop_map(|(ty, payload)| Packet::Evd(Evd { ty, payload })),
        (
            any::<u8>(),
            any::<bool>(),
            any::<bool>(),
            proptest::option::of(any::<u16>())
        )
            .prop_map(|(trbv, ip, mult, icnt)| Packet::Trig(Trig {
                trbv,
                ip,
                mult,
                icnt
            })),
        any::<bool>().prop_map(|ip| Packet::Bep { ip }),
    ]
}

/// A PEBS block: BBP, items of its size, BEP.
fn block() -> impl Strategy<Value = Vec<Packet>> {
    (
        any::<bool>(),
        0u8..32,
        proptest::collection::vec((0u8..32, any::<u64>()), 0..6),
        any::<bool>(),
    )
        .prop_map(|(four_bytes, ty, items, ip)| {
            let mut v = vec![Packet::Bbp(Bbp { four_bytes, ty })];
            v.extend(items.into_iter().map(|(id, value)| Packet::Bip {
                id,
                value: if four_bytes {
                    value & 0xffff_ffff
                } else {
                    value
                },
                four_bytes,
            }));
            v.push(Packet::Bep { ip });
            v
        })
}

fn stream() -> impl Strategy<Value = Vec<Packet>> {
    proptest::collection::vec(
        prop_oneof![4 => packet().prop_map(|p| vec![p]), 1 => block()],
        0..200,
    )
    .prop_map(|chunks| chunks.into_iter().flatten().collect())
}

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
