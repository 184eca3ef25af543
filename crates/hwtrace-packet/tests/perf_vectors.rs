//! Every single-packet vector of Linux perf's packet-decoder test
//! (`../shared/corpus/perf-packet-vectors.jsonl`) decodes to the packet,
//! length and payload perf reports, and encodes back to the same bytes where
//! the encoding is canonical.

use hwtrace_packet::{IpCompression, Packet, PacketDecoder, encode};
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/perf-packet-vectors.jsonl")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// What perf prints for a packet, rebuilt from our decoded fields, in perf's
/// words (tools/perf/util/intel-pt-decoder/intel-pt-pkt-decoder.c's
/// descriptions as the vectors record them).
fn perf_description(p: &Packet) -> String {
    match *p {
        Packet::Pad => "PAD".into(),
        Packet::Psb => "PSB".into(),
        Packet::Psbend => "PSBEND".into(),
        Packet::Ovf => "OVF".into(),
        Packet::Stop => "TraceSTOP".into(),
        Packet::Tnt(t) => {
            let bits: String = t.iter().map(|b| if b { 'T' } else { 'N' }).collect();
            format!("TNT {bits} ({})", t.len)
        }
        Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) | Packet::Fup(ip) => {
            let name = p.kind().name().to_uppercase();
            if ip.compression == IpCompression::Suppressed {
                format!("{name} no ip")
            } else {
                format!("{name} {:#x}", ip.raw)
            }
        }
        Packet::Pip(pip) => format!("PIP {:#x} (NR={})", pip.cr3.0 >> 5, u8::from(pip.nr)),
        Packet::ModeExec(m) => {
            let bits = match (m.csl, m.csd) {
                (true, _) => 64,
                (false, true) => 32,
                (false, false) => 16,
            };
            format!("MODE.Exec IF:{} {bits}", u8::from(m.iflag))
        }
        Packet::ModeTsx(m) => format!(
            "MODE.TSX TXAbort:{} InTX:{}",
            u8::from(m.abrt),
            u8::from(m.intx)
        ),
        Packet::Cbr(v) => format!("CBR {v:#x}"),
        Packet::Tsc(v) => format!("TSC {v:#x}"),
        Packet::Mtc(v) => format!("MTC {v:#x}"),
        Packet::Tma(t) => format!("TMA CTC {:#x} FC {:#x}", t.ctc, t.fc),
        Packet::Cyc(v) => format!("CYC {v:#x}"),
        Packet::Vmcs(v) => format!("VMCS {:#x}", v >> 12),
        Packet::Mnt(v) => format!("MNT {v:#x}"),
        Packet::Ptw(w) => format!("PTWRITE {:#x} IP:{}", w.payload, u8::from(w.ip)),
        Packet::Exstop { ip } => format!("EXSTOP IP:{}", u8::from(ip)),
        Packet::Mwait(m) => {
            let raw = u64::from(m.hints) | u64::from(m.ext) << 32;
            format!(
                "MWAIT {raw:#x} Hints {:#x} Extensions {:#x}",
                m.hints & 0xff,
                m.ext & 0x3
            )
        }
        Packet::Pwre(w) => format!(
            "PWRE {:#x} HW:{} CState:{} Sub-CState:{}",
            w.raw,
            u8::from(w.hw()),
            w.state(),
            w.sub_state()
        ),
        Packet::Pwrx(x) => format!(
            "PWRX {:#x} Last CState:{} Deepest CState:{} Wake Reason {:#x}",
            x.raw,
            x.last(),
            x.deepest(),
            x.wake_reason()
        ),
        Packet::Bbp(b) => format!(
            "BBP SZ {}-byte Type {:#x}",
            if b.four_bytes { 4 } else { 8 },
            b.ty
        ),
        Packet::Bip { id, value, .. } => format!("BIP ID {id:#04x} Value {value:#x}"),
        Packet::Bep { ip } => format!("BEP IP:{}", u8::from(ip)),
        Packet::Cfe(c) => format!(
            "CFE IP:{} Type {:#04x} Vector {:#x}",
            u8::from(c.ip),
            c.ty,
            c.vector
        ),
        Packet::Evd(e) => format!("EVD Type {:#04x} Payload {:#x}", e.ty, e.payload),
        Packet::Trig(_) => unreachable!("perf's vectors have no TRIG"),
    }
}

#[test]
fn every_perf_vector_decodes_as_perf_says() {
    let text = std::fs::read_to_string(corpus()).expect("perf vectors in ../shared/corpus");
    let mut checked = 0;
    for (line_no, line) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let bytes = hex(v["hex"].as_str().unwrap());
        let len = v["len"].as_u64().unwrap() as usize;
        let desc = v["perf_desc"].as_str().unwrap();
        // BIP only exists inside a block that a BBP opened: give it one.
        let (prefix, ctx_len): (&[u8], usize) = match v.get("ctx").and_then(|c| c.as_str()) {
            Some("BLK_4") => (&[0x02, 0x63, 0x80], 3),
            Some("BLK_8") => (&[0x02, 0x63, 0x00], 3),
            _ => (&[], 0),
        };
        let trace: Vec<u8> = prefix.iter().chain(&bytes).copied().collect();
        let mut d = PacketDecoder::new(&trace);
        if ctx_len > 0 {
            d.next_packet().unwrap().unwrap();
        }
        let got = d
            .next_packet()
            .unwrap_or_else(|e| panic!("line {}: {} failed: {e}", line_no + 1, v["hex"]))
            .expect("one packet");
        assert_eq!(
            got.size as usize,
            len,
            "line {}: length of {desc}",
            line_no + 1
        );
        assert_eq!(
            perf_description(&got.packet),
            desc,
            "line {}: {}",
            line_no + 1,
            v["hex"]
        );

        // Re-encoding gives the same packet back (and, where the vector has
        // no reserved bits set, the same bytes).
        let mut buf = [0u8; 16];
        let n = encode(&got.packet, &mut buf).unwrap();
        let mut re: Vec<u8> = trace[..ctx_len].to_vec();
        re.extend_from_slice(&buf[..n]);
        let mut d2 = PacketDecoder::new(&re);
        if ctx_len > 0 {
            d2.next_packet().unwrap();
        }
        assert_eq!(
            d2.next_packet().unwrap().unwrap().packet,
            got.packet,
            "line {}",
            line_no + 1
        );
        checked += 1;
    }
    assert_eq!(checked, 120, "the corpus has 120 vectors");
}
