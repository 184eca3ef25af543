//! Small Intel PT traces for unit tests: PSB+ with the packets a 64-bit
//! decode starts from, and TNT packets, so each test states only what
//! differs (time, address space, first IP, branch outcomes).

use hwtrace_packet::{ModeExec, Packet, Pip, Tnt, TraceBuilder};
use hwtrace_types::Cr3;

/// PSB+: PSB, a TSC (`tsc`), a PIP (`cr3`), 64-bit MODE.Exec, FUP `ip`
/// (tracing on there), PSBEND.
pub fn psb_plus(t: &mut TraceBuilder, tsc: Option<u64>, cr3: Option<Cr3>, ip: u64) {
    t.push(Packet::Psb).unwrap();
    if let Some(tsc) = tsc {
        t.push(Packet::Tsc(tsc)).unwrap();
    }
    if let Some(cr3) = cr3 {
        t.push(Packet::Pip(Pip { cr3, nr: false })).unwrap();
    }
    t.push(Packet::ModeExec(ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    }))
    .unwrap();
    t.ip(Packet::Fup, ip).unwrap();
    t.push(Packet::Psbend).unwrap();
}

/// A short TNT packet: `len` outcomes, the oldest in the highest bit of
/// `bits`.
pub fn tnt(t: &mut TraceBuilder, bits: u64, len: u8) {
    t.push(Packet::Tnt(Tnt {
        bits,
        len,
        long: false,
    }))
    .unwrap();
}
