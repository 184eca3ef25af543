//! Random packets for the property tests.
#![allow(dead_code)] // each test binary uses a different subset

use hwtrace_packet::{
    Bbp, Cfe, Evd, IpCompression, IpPayload, ModeExec, ModeTsx, Mwait, Packet, Pip, Ptw, Pwre,
    Pwrx, Tma, Tnt, Trig,
};
use hwtrace_types::Cr3;
use proptest::prelude::*;

/// An IP payload of any valid compression, with only the bits it carries.
pub fn ip_payload() -> impl Strategy<Value = IpPayload> {
    (prop::sample::select(vec![0u8, 1, 2, 3, 4, 6]), any::<u64>()).prop_map(|(bits, raw)| {
        let compression = IpCompression::from_bits(bits).unwrap();
        let raw = match compression.payload_len() * 8 {
            0 => 0,
            64 => raw,
            n => raw & ((1u64 << n) - 1),
        };
        IpPayload { compression, raw }
    })
}

/// A TNT-8 with 1..=6 branches or a TNT-64 with 1..=47.
pub fn tnt() -> impl Strategy<Value = Tnt> {
    (any::<bool>(), any::<u64>(), 1u8..=47).prop_map(|(long, bits, len)| {
        let len = if long { len } else { 1 + len % 6 };
        Tnt {
            bits: bits & ((1u64 << len) - 1),
            len,
            long,
        }
    })
}

/// The packets libipt 2.0.5 knows, with the field values it accepts: no
/// IF bit in MODE.Exec and CYC below 2^61 (libipt refuses a CYC that needs
/// a ninth extension byte).
pub fn packet_known_to_libipt() -> impl Strategy<Value = Packet> {
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
        (any::<bool>(), any::<bool>()).prop_map(|(csl, csd)| Packet::ModeExec(ModeExec {
            csl,
            csd,
            iflag: false
        })),
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
        any::<u64>().prop_map(|v| Packet::Cyc(v >> 3)),
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
    ]
}

/// Any packet that can appear outside a PEBS block.
pub fn packet() -> impl Strategy<Value = Packet> {
    prop_oneof![
        8 => packet_known_to_libipt(),
        1 => any::<u64>().prop_map(Packet::Cyc),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(csl, csd)| Packet::ModeExec(ModeExec { csl, csd, iflag: true })),
        1 => (0u8..32, any::<bool>(), any::<u8>()).prop_map(|(ty, ip, vector)| Packet::Cfe(Cfe { ty, ip, vector })),
        1 => (0u8..64, any::<u64>()).prop_map(|(ty, payload)| Packet::Evd(Evd { ty, payload })),
        1 => (any::<u8>(), any::<bool>(), any::<bool>(), proptest::option::of(any::<u16>()))
            .prop_map(|(trbv, ip, mult, icnt)| Packet::Trig(Trig { trbv, ip, mult, icnt })),
        1 => any::<bool>().prop_map(|ip| Packet::Bep { ip }),
    ]
}

/// A PEBS block: BBP, items of its size, BEP.
pub fn block() -> impl Strategy<Value = Vec<Packet>> {
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

/// A stream of packets and PEBS blocks.
pub fn stream() -> impl Strategy<Value = Vec<Packet>> {
    proptest::collection::vec(
        prop_oneof![4 => packet().prop_map(|p| vec![p]), 1 => block()],
        0..200,
    )
    .prop_map(|chunks| chunks.into_iter().flatten().collect())
}
