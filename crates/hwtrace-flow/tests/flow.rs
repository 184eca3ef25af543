//! The flow decoder on small traces built packet by packet: what each
//! packet pattern means for the instructions reported, and that arbitrary
//! bytes never make it panic or run away.

use hwtrace_flow::event::{EventDecoder, EventKind};
use hwtrace_flow::insn::{BlockDecoder, BlockStep, InsnClass, InsnDecoder, Step};
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_packet::{IpPayload, Packet, Tnt, TraceBuilder};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
use proptest::prelude::*;

/// Code bytes at an address.
struct Code {
    base: u64,
    bytes: Vec<u8>,
}

impl ReadMemory for Code {
    fn read_memory(
        &self,
        _space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let off = addr.0.wrapping_sub(self.base);
        let Some(rest) = usize::try_from(off).ok().and_then(|o| self.bytes.get(o..)) else {
            return Err(MemoryError::Unmapped { addr });
        };
        if rest.is_empty() {
            return Err(MemoryError::Unmapped { addr });
        }
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
}

const BASE: u64 = 0x1000;

/// Every step until the end or the first error, as text.
fn steps(trace: &[u8], code: Code) -> Vec<String> {
    let mut dec = InsnDecoder::new(trace, Config::default(), code);
    let mut out = Vec::new();
    if let Err(e) = dec.sync_forward() {
        out.push(format!("sync error: {}", e.kind));
        return out;
    }
    loop {
        match dec.next() {
            Ok(Some(Step::Insn(i))) => out.push(format!("{:x}", i.ip)),
            Ok(Some(Step::Event(e))) if e.status_update => {}
            Ok(Some(Step::Event(e))) => out.push(format!("{:?}", e.kind)),
            Ok(None) => break,
            Err(e) => {
                out.push(format!("error: {}", e.kind));
                break;
            }
        }
    }
    out
}

#[test]
fn conditional_branches_follow_tnt_bits() {
    // 1000: jz 1004; 1002: nop; 1003: nop; 1004: jmp [rax]
    let code = Code {
        base: BASE,
        bytes: vec![0x74, 0x02, 0x90, 0x90, 0xff, 0xe0],
    };
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    t.push(Packet::Tnt(Tnt {
        bits: 1,
        len: 1,
        long: false,
    }))
    .unwrap();
    t.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    let got = steps(&t.finish(), code);
    assert_eq!(got, ["1000", "1004", "Disabled { ip: 0 }"]);
}

#[test]
fn compressed_return_uses_the_return_stack() {
    // 1000: call 1006; 1005: hlt; 1006: ret
    let code = Code {
        base: BASE,
        bytes: vec![0xe8, 0x01, 0x00, 0x00, 0x00, 0xf4, 0xc3],
    };
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    // The return is compressed: one taken bit; then tracing stops at 1005.
    t.push(Packet::Tnt(Tnt {
        bits: 1,
        len: 1,
        long: false,
    }))
    .unwrap();
    t.ip(Packet::Fup, BASE + 5).unwrap();
    t.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    let got = steps(&t.finish(), code);
    // The return goes back to 1005, where tracing stops before the hlt.
    assert_eq!(got[..2], ["1000", "1006"]);
    let stop = format!(
        "{:?}",
        EventKind::AsyncDisabled {
            at: BASE + 5,
            ip: 0
        }
    );
    assert_eq!(got[2..], [stop]);
}

#[test]
fn missing_memory_is_an_error_with_offset_and_ip() {
    let code = Code {
        base: BASE,
        bytes: vec![0xeb, 0x10],
    };
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    // More trace follows (so decoding goes on), but the jump leaves the code.
    t.push(Packet::Tnt(Tnt {
        bits: 1,
        len: 1,
        long: false,
    }))
    .unwrap();
    let trace = t.finish();
    let mut dec = InsnDecoder::new(&trace, Config::default(), code);
    dec.sync_forward().unwrap();
    let mut seen = Vec::new();
    let err = loop {
        match dec.next() {
            Ok(Some(Step::Insn(i))) => seen.push(i.ip),
            Ok(Some(Step::Event(_))) => {}
            Ok(None) => panic!("expected an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(seen, [BASE]);
    assert_eq!(err.kind, ErrorKind::NoMap);
    assert_eq!(err.ip, Some(BASE + 0x12));
}

#[test]
fn an_endless_untraced_loop_is_cut_off() {
    // 1000: jmp 1000, and no trace after the PSB.
    let code = Code {
        base: BASE,
        bytes: vec![0xeb, 0xfe],
    };
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    // A TNT waits for a conditional branch that never comes.
    t.push(Packet::Tnt(Tnt {
        bits: 1,
        len: 1,
        long: false,
    }))
    .unwrap();
    let got = steps(&t.finish(), code);
    assert_eq!(
        got.last().map(String::as_str),
        Some("error: no trace for too many instructions")
    );
}

#[test]
fn fup_tip_is_an_interrupt() {
    // 1000: nop; 1001: nop; interrupt at 1001 to 2000 (nop), then disable.
    let code = Code {
        base: BASE,
        bytes: [vec![0x90, 0x90], vec![0x90; 0xffe], vec![0x90, 0xf4]].concat(),
    };
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    t.ip(Packet::Fup, BASE + 1).unwrap();
    t.ip(Packet::Tip, 0x2000).unwrap();
    t.ip(Packet::Fup, 0x2001).unwrap();
    t.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    let got = steps(&t.finish(), code);
    let interrupt = format!(
        "{:?}",
        EventKind::AsyncBranch {
            from: 0x1001,
            to: 0x2000
        }
    );
    assert_eq!(
        got[..3],
        ["1000".to_string(), interrupt, "2000".to_string()]
    );
    assert!(got[3].starts_with("AsyncDisabled"), "{got:?}");
}

#[test]
fn overflow_resumes_at_its_fup() {
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    t.push(Packet::Ovf).unwrap();
    t.ip(Packet::Fup, 0x1234).unwrap();
    let trace = t.finish();
    let mut dec = EventDecoder::new(&trace, Config::default());
    dec.sync_forward().unwrap();
    let mut kinds = Vec::new();
    while let Ok(ev) = dec.next_event() {
        kinds.push((ev.kind, ev.ip_suppressed));
    }
    assert!(
        kinds.contains(&(EventKind::Overflow { ip: 0x1234 }, false)),
        "{kinds:?}"
    );
}

#[test]
fn the_instruction_class_is_reported() {
    let code = Code {
        base: BASE,
        bytes: vec![0x90, 0xff, 0xe0],
    };
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    t.ip(Packet::Tip, BASE).unwrap();
    t.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    let trace = t.finish();
    let mut dec = InsnDecoder::new(&trace, Config::default(), code);
    dec.sync_forward().unwrap();
    let mut classes = Vec::new();
    while let Ok(Some(step)) = dec.next() {
        if let Step::Insn(i) = step {
            classes.push(i.class);
        }
    }
    assert_eq!(classes[..2], [InsnClass::Other, InsnClass::Jump]);
}

#[test]
fn blocks_hold_the_same_instructions_as_the_instruction_decoder() {
    // 1000: call 1007; 1005: hlt; 1006: hlt; 1007: nop; 1008: jz 100b;
    // 100a: nop; 100b: ret
    let bytes = vec![
        0xe8, 0x02, 0x00, 0x00, 0x00, 0xf4, 0xf4, 0x90, 0x74, 0x01, 0x90, 0xc3,
    ];
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).unwrap();
    // jz taken, ret compressed.
    t.push(Packet::Tnt(Tnt {
        bits: 0b11,
        len: 2,
        long: false,
    }))
    .unwrap();
    t.ip(Packet::Fup, BASE + 5).unwrap();
    t.push(Packet::TipPgd(IpPayload::SUPPRESSED)).unwrap();
    let trace = t.finish();

    let flat = steps(
        &trace,
        Code {
            base: BASE,
            bytes: bytes.clone(),
        },
    );
    let mut dec = BlockDecoder::new(&trace, Config::default(), Code { base: BASE, bytes });
    dec.sync_forward().unwrap();
    let mut lines = Vec::new();
    let mut blocks = Vec::new();
    while let Some(step) = dec.next().unwrap() {
        match step {
            BlockStep::Block(b) => {
                blocks.push((b.ip(), b.end_ip(), b.insns.len()));
                lines.extend(b.insns.iter().map(|i| format!("{:x}", i.ip)));
            }
            BlockStep::Event(e) if e.status_update => {}
            BlockStep::Event(e) => lines.push(format!("{:?}", e.kind)),
        }
    }
    assert_eq!(lines, flat);
    // The direct call stays inside the first block, which ends at the jz.
    assert_eq!(blocks, [(0x1000, 0x1008, 3), (0x100b, 0x100b, 1)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes after a valid PSB+, over code with every kind of
    /// branch: the decoder reports errors, never panics, and always ends.
    #[test]
    fn arbitrary_trace_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
        let code = Code {
            base: BASE,
            bytes: vec![0x74, 0x02, 0xff, 0xe0, 0xe8, 0xf7, 0xff, 0xff, 0xff, 0xc3, 0xcd, 0x80, 0xeb, 0xf2],
        };
        let mut t = TraceBuilder::new();
        t.psb_plus_64(BASE).unwrap();
        t.raw(&tail);
        let trace = t.finish();
        let mut dec = InsnDecoder::new(&trace, Config::default(), code);
        let mut syncs = 0;
        'outer: while dec.sync_forward().is_ok() {
            syncs += 1;
            prop_assert!(syncs < 64);
            loop {
                match dec.next() {
                    Ok(Some(_)) => {}
                    Ok(None) => break 'outer,
                    Err(_) => continue 'outer,
                }
            }
        }
    }
}
