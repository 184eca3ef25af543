//! `testdata/example.pt`, the trace the README runs, is written by our own
//! encoder from the packet list below. This test rebuilds it and fails if the
//! committed file differs; `HWTRACE_BLESS=1 cargo test -p hwtrace --test
//! example_fixture` rewrites it after an intended change.

use hwtrace_packet::{
    Bbp, Cfe, Evd, IpPayload, ModeExec, ModeTsx, Mwait, Packet, Pip, Ptw, Pwre, Pwrx, Tma, Tnt,
    TraceBuilder, Trig,
};
use hwtrace_types::Cr3;
use std::path::Path;

fn tnt(pattern: &str) -> Packet {
    let bits = pattern
        .bytes()
        .fold(0u64, |acc, b| acc << 1 | u64::from(b == b'!'));
    let len = pattern.len() as u8;
    Packet::Tnt(Tnt {
        bits,
        len,
        long: len > Tnt::MAX_SHORT,
    })
}

/// A user-space program traced with timing, as a CPU would write it: two
/// PSB segments, a loop, calls through TIP, a CR3 switch, an overflow and
/// its recovery; then one of each remaining packet so the listing shows the
/// whole vocabulary.
fn example() -> Vec<u8> {
    let mut b = TraceBuilder::new();
    let base = 0x0000_5555_5555_4000u64;
    let segment = |b: &mut TraceBuilder, at: u64, tsc: u64| {
        b.push(Packet::Psb).unwrap();
        b.push(Packet::Tsc(tsc)).unwrap();
        b.push(Packet::Tma(Tma {
            ctc: 0x1234,
            fc: 0x55,
        }))
        .unwrap();
        b.push(Packet::Cbr(0x28)).unwrap();
        b.push(Packet::ModeExec(ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        }))
        .unwrap();
        b.push(Packet::Pip(Pip {
            cr3: Cr3(0x1ee7_3000),
            nr: false,
        }))
        .unwrap();
        b.ip(Packet::Fup, at).unwrap();
        b.push(Packet::Psbend).unwrap();
    };
    segment(&mut b, base + 0x10, 0x0012_3456_7890);
    b.push(Packet::ModeExec(ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    }))
    .unwrap();
    b.ip(Packet::TipPge, base + 0x10).unwrap();
    for i in 0..4u64 {
        b.push(tnt("!!!!..")).unwrap();
        b.push(Packet::Cyc(0x40 + i)).unwrap();
        b.ip(Packet::Tip, base + 0x1200 + i * 0x10).unwrap();
        b.push(tnt("!.!")).unwrap();
        b.ip(Packet::Tip, base + 0x48 + i).unwrap();
    }
    b.push(Packet::Mtc(0x35)).unwrap();
    b.push(tnt("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!."))
        .unwrap();
    b.ip(Packet::Tip, 0x7fff_f7a1_2340).unwrap();
    b.ip(Packet::TipPgd, 0x7fff_f7a1_2345).unwrap();
    segment(&mut b, 0x7fff_f7a1_2345, 0x0012_3456_9000);
    b.push(Packet::Pip(Pip {
        cr3: Cr3(0x2bad_0000),
        nr: false,
    }))
    .unwrap();
    b.ip(Packet::TipPge, base + 0x2000).unwrap();
    b.push(Packet::Ovf).unwrap();
    b.ip(Packet::Fup, base + 0x2100).unwrap();
    b.push(tnt(".!")).unwrap();
    b.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    // The rest of the vocabulary.
    b.push(Packet::ModeTsx(ModeTsx {
        intx: true,
        abrt: false,
    }))
    .unwrap();
    b.push(Packet::Vmcs(0x3_52e9_9000)).unwrap();
    b.push(Packet::Stop).unwrap();
    b.push(Packet::Mnt(0x2a22_42e5_d4c3_b2a1)).unwrap();
    b.push(Packet::Ptw(Ptw {
        payload: 0x90ab_cdef,
        eight_bytes: false,
        ip: true,
    }))
    .unwrap();
    b.push(Packet::Exstop { ip: true }).unwrap();
    b.push(Packet::Mwait(Mwait {
        hints: 0x20,
        ext: 1,
    }))
    .unwrap();
    b.push(Packet::Pwre(Pwre { raw: 0x2080 })).unwrap();
    b.push(Packet::Pwrx(Pwrx { raw: 0x1_25 })).unwrap();
    b.push(Packet::Bbp(Bbp {
        four_bytes: false,
        ty: 1,
    }))
    .unwrap();
    b.push(Packet::Bip {
        id: 0x1,
        value: base + 0x2100,
        four_bytes: false,
    })
    .unwrap();
    b.push(Packet::Bep { ip: false }).unwrap();
    b.push(Packet::Cfe(Cfe {
        ty: 1,
        ip: true,
        vector: 14,
    }))
    .unwrap();
    b.push(Packet::Evd(Evd {
        ty: 0,
        payload: 0x7fff_0000_1000,
    }))
    .unwrap();
    b.push(Packet::Trig(Trig {
        trbv: 0xa1,
        ip: false,
        mult: true,
        icnt: Some(23),
    }))
    .unwrap();
    b.push(Packet::Pad).unwrap();
    b.finish()
}

#[test]
fn example_trace_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/example.pt");
    let bytes = example();
    if std::env::var_os("HWTRACE_BLESS").is_some() {
        std::fs::write(&path, &bytes).unwrap();
    }
    let committed = std::fs::read(&path).expect("testdata/example.pt (HWTRACE_BLESS=1 writes it)");
    assert!(
        committed == bytes,
        "testdata/example.pt is stale: run with HWTRACE_BLESS=1"
    );
}

#[test]
fn example_trace_dumps_cleanly() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(["dump", "--stats"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/example.pt"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{text}");
    assert!(text.contains("errors: 0, bytes skipped: 0"), "{text}");
    for kind in ["psb", "tip.pge", "tnt.64", "pip", "ovf", "bip", "trig"] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("  {kind} "))),
            "no {kind} in\n{text}"
        );
    }
}
