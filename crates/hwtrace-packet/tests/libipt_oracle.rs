//! Cross-check with Intel's reference decoder: random packet streams written
//! by our encoder are decoded by libipt 2.0.5 (Debian `libipt-dev`, through
//! the test-only `hwtrace-libipt` bindings) and by our decoder, and both must
//! report the same packets at the same offsets with the same payloads. The
//! encoder and decoder therefore cannot share a mistake unnoticed.
//!
//! libipt 2.0.5 predates CFE, EVD, TRIG and the PEBS block packets, so the
//! streams here leave those out; the perf vectors and the ptdump corpus
//! cover them.

use hwtrace_libipt::{Config, OracleKind, SyncMode};
use hwtrace_packet::{Packet, PacketDecoder, TraceBuilder};
use proptest::prelude::*;

mod common;

/// Our packet in libipt's terms.
fn as_oracle(p: &Packet) -> OracleKind {
    match *p {
        Packet::Pad => OracleKind::Pad,
        Packet::Psb => OracleKind::Psb,
        Packet::Psbend => OracleKind::Psbend,
        Packet::Ovf => OracleKind::Ovf,
        Packet::Stop => OracleKind::Stop,
        Packet::Tnt(t) if t.long => OracleKind::Tnt64 {
            bit_size: t.len,
            payload: t.bits,
        },
        Packet::Tnt(t) => OracleKind::Tnt8 {
            bit_size: t.len,
            payload: t.bits,
        },
        Packet::Tip(i) => OracleKind::Tip {
            ipc: i.compression.bits(),
            ip: i.raw,
        },
        Packet::TipPge(i) => OracleKind::TipPge {
            ipc: i.compression.bits(),
            ip: i.raw,
        },
        Packet::TipPgd(i) => OracleKind::TipPgd {
            ipc: i.compression.bits(),
            ip: i.raw,
        },
        Packet::Fup(i) => OracleKind::Fup {
            ipc: i.compression.bits(),
            ip: i.raw,
        },
        Packet::ModeExec(m) => OracleKind::ModeExec {
            csl: m.csl,
            csd: m.csd,
        },
        Packet::ModeTsx(m) => OracleKind::ModeTsx {
            intx: m.intx,
            abrt: m.abrt,
        },
        Packet::Pip(p) => OracleKind::Pip {
            cr3: p.cr3.0,
            nr: p.nr,
        },
        Packet::Tsc(tsc) => OracleKind::Tsc { tsc },
        Packet::Cbr(ratio) => OracleKind::Cbr { ratio },
        Packet::Tma(t) => OracleKind::Tma {
            ctc: t.ctc,
            fc: t.fc,
        },
        Packet::Mtc(ctc) => OracleKind::Mtc { ctc },
        Packet::Cyc(value) => OracleKind::Cyc { value },
        Packet::Vmcs(base) => OracleKind::Vmcs { base },
        Packet::Mnt(payload) => OracleKind::Mnt { payload },
        Packet::Exstop { ip } => OracleKind::Exstop { ip },
        Packet::Mwait(m) => OracleKind::Mwait {
            hints: m.hints,
            ext: m.ext,
        },
        // libipt reads PWRE's HW flag from bit 3 of byte 2; the SDM (and
        // perf) put it in bit 7. Compare what each reads from the same bits.
        Packet::Pwre(w) => OracleKind::Pwre {
            state: w.state(),
            sub_state: w.sub_state(),
            hw: w.raw & 0x08 != 0,
        },
        Packet::Pwrx(x) => OracleKind::Pwrx {
            last: x.last(),
            deepest: x.deepest(),
            interrupt: x.interrupt(),
            store: x.store(),
            autonomous: x.autonomous(),
        },
        Packet::Ptw(w) => OracleKind::Ptw {
            plc: u8::from(w.eight_bytes),
            ip: w.ip,
            payload: w.payload,
        },
        other => panic!("libipt 2.0.5 has no {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn libipt_decodes_our_streams_as_we_do(packets in proptest::collection::vec(common::packet_known_to_libipt(), 1..300)) {
        let mut b = TraceBuilder::new();
        for p in &packets {
            b.push(*p).unwrap();
        }
        let bytes = b.finish();
        let cfg = Config { sync: SyncMode::AssumeAtStart, ..Config::default() };
        let theirs: Vec<_> = hwtrace_libipt::packets(&bytes, &cfg)
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| TestCaseError::fail(format!("libipt: {e:?}")))?;
        let ours: Vec<_> = PacketDecoder::new(&bytes).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(theirs.len(), ours.len());
        for (t, o) in theirs.iter().zip(&ours) {
            prop_assert_eq!(t.offset, o.offset.0);
            prop_assert_eq!(t.size, o.size);
            prop_assert_eq!(&t.kind, &as_oracle(&o.packet), "at offset {:#x}", o.offset.0);
        }
    }
}

/// The real hardware trace, decoded by both: same packets everywhere.
#[test]
fn real_trace_packets_match_libipt() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/real/foo/trace.pt");
    let bytes = std::fs::read(path).unwrap();
    let theirs: Vec<_> = hwtrace_libipt::packets(&bytes, &Config::default())
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let mut d = PacketDecoder::new(&bytes);
    d.sync_forward().unwrap();
    let ours: Vec<_> = d.collect::<Result<_, _>>().unwrap();
    assert_eq!(theirs.len(), ours.len());
    assert!(theirs.len() > 16_000);
    for (t, o) in theirs.iter().zip(&ours) {
        assert_eq!(
            (t.offset, t.size, &t.kind),
            (o.offset.0, o.size, &as_oracle(&o.packet))
        );
    }
}
