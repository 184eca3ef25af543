//! The encoder's rules on a hand-assembled program whose packets can be
//! worked out from the SDM by hand, then decoded by libipt.

use hwtrace_libipt::{Config, Image, Sections, insn_addresses};
use hwtrace_packet::{ExecMode, LastIp, Packet, decode_packet};
use hwtrace_sim::{CodeImageBuilder, EncodedTrace, Execution, IpRange, PtConfig, PtEncoder};
use hwtrace_types::Ip;

/// ```text
/// 1000: e8 0b 00 00 00   call 1010
/// 1005: 0f 05            syscall
/// 1007: 75 f7            jne  1000
/// 1009: ff e0            jmp  rax
/// 1010: c3               ret
/// 1020: 90               nop
/// 1021: 90               nop
/// ```
fn program() -> Execution {
    let mut code = CodeImageBuilder::new();
    code.add(
        Ip(0x1000),
        &[0xe8, 0x0b, 0, 0, 0, 0x0f, 0x05, 0x75, 0xf7, 0xff, 0xe0],
    )
    .unwrap();
    code.add(Ip(0x1010), &[0xc3]).unwrap();
    code.add(Ip(0x1020), &[0x90, 0x90]).unwrap();
    let insns = [
        0x1000, 0x1010, 0x1005, // call, compressible ret, syscall
        0x1007, // jne taken
        0x1000, 0x1010, 0x1005, // call, ret, syscall
        0x1007, // jne not taken
        0x1009, // jmp rax
        0x1020, // nop; then cut short before the second nop
    ];
    Execution::from_parts(
        insns.iter().map(|&ip| Ip(ip)).collect(),
        ExecMode::Bits64,
        code.build().unwrap(),
        Some(Ip(0x1021)),
    )
}

/// The packets as short words, IPs reconstructed.
fn listing(trace: &EncodedTrace) -> Vec<String> {
    let mut out = Vec::new();
    let mut last = LastIp::new();
    let mut at = 0;
    while at < trace.bytes.len() {
        let (packet, len) = decode_packet(&trace.bytes[at..]).unwrap();
        at += len;
        let ip = |last: &mut LastIp, p| {
            last.update(p);
            last.ip().map_or("-".to_string(), |ip| format!("{ip:#x}"))
        };
        out.push(match packet {
            Packet::Psb => {
                last.reset();
                "psb".into()
            }
            Packet::Psbend => "psbend".into(),
            Packet::ModeExec(m) => format!("mode.exec {:?}", m.mode()),
            Packet::Tnt(t) => format!(
                "tnt {}",
                t.iter()
                    .map(|b| if b { 'T' } else { 'N' })
                    .collect::<String>()
            ),
            Packet::Tip(p) => format!("tip {}", ip(&mut last, p)),
            Packet::TipPge(p) => format!("tip.pge {}", ip(&mut last, p)),
            Packet::TipPgd(p) => format!("tip.pgd {}", ip(&mut last, p)),
            Packet::Fup(p) => format!("fup {}", ip(&mut last, p)),
            other => format!("{:?}", other.kind()),
        });
    }
    out
}

fn libipt(execution: &Execution, bytes: &[u8]) -> Vec<u64> {
    let mut sections = Sections::new();
    for seg in execution.memory().segments() {
        sections.insert(seg.addr.0, &seg.bytes).unwrap();
    }
    let image = Image::with_memory(&sections).unwrap();
    let (ips, errors) = insn_addresses(bytes, &Config::default(), &image).unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    ips
}

fn executed(e: &Execution) -> Vec<u64> {
    e.insns().iter().map(|ip| ip.0).collect()
}

#[test]
fn with_return_compression() {
    let e = program();
    let trace = PtEncoder::new(PtConfig::default()).encode(&e).unwrap();
    assert_eq!(
        listing(&trace),
        [
            "psb",
            "psbend",
            // PSB+ outside user mode carries no MODE.Exec; it comes with
            // the TIP.PGE.
            "mode.exec Bits64",
            "tip.pge 0x1000",
            // The RET goes to the CALL's next IP: one taken bit, written
            // before the SYSCALL's TIP.PGD, whose IP is suppressed (CPL 0).
            "tnt T",
            "tip.pgd -",
            // Back in user mode; the mode is unchanged since the PSB+.
            "tip.pge 0x1007",
            "tnt TT",
            "tip.pgd -",
            "tip.pge 0x1007",
            "tnt N",
            "tip 0x1020",
            // Cut short before 0x1021.
            "fup 0x1021",
            "tip.pgd -",
        ]
    );
    assert_eq!(trace.stats.compressed_returns, 2);
    assert_eq!(libipt(&e, &trace.bytes), executed(&e));
}

#[test]
fn without_return_compression() {
    let e = program();
    let config = PtConfig {
        return_compression: false,
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(&e).unwrap();
    assert_eq!(
        listing(&trace),
        [
            "psb",
            "psbend",
            // PSB+ outside user mode carries no MODE.Exec; it comes with
            // the TIP.PGE.
            "mode.exec Bits64",
            "tip.pge 0x1000",
            "tip 0x1005",
            "tip.pgd -",
            "tip.pge 0x1007",
            // The JNE's bit must precede the RET's TIP.
            "tnt T",
            "tip 0x1005",
            "tip.pgd -",
            "tip.pge 0x1007",
            "tnt N",
            "tip 0x1020",
            "fup 0x1021",
            "tip.pgd -",
        ]
    );
    assert_eq!(trace.stats.compressed_returns, 0);
    assert_eq!(libipt(&e, &trace.bytes), executed(&e));
}

#[test]
fn psb_plus_carries_the_ip_and_empties_the_call_stack() {
    let e = program();
    // A PSB at every instruction boundary.
    let config = PtConfig {
        psb_period: 1,
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(&e).unwrap();
    let l = listing(&trace);
    // After the PSB between the CALL and the RET the RET cannot be
    // compressed: the decoder may have started at that PSB.
    assert_eq!(trace.stats.compressed_returns, 0);
    assert!(
        l.windows(4)
            .any(|w| w == ["psb", "mode.exec Bits64", "fup 0x1010", "psbend"])
    );
    assert_eq!(libipt(&e, &trace.bytes), executed(&e));
    for psb in &trace.psbs {
        let from = usize::try_from(psb.offset.0).unwrap();
        assert_eq!(
            libipt(&e, &trace.bytes[from..]),
            executed(&e)[psb.insn_index..],
            "from the PSB at {:#x}",
            psb.offset.0
        );
    }
}

#[test]
fn an_unexplained_transfer_is_an_error_naming_the_instruction() {
    let e = program();
    // The NOP at 0x1020 cannot be followed by 0x1000.
    let mut insns = e.insns().to_vec();
    insns.push(Ip(0x1000));
    let broken = Execution::from_parts(insns, ExecMode::Bits64, e.memory().clone(), None);
    let err = PtEncoder::new(PtConfig::default())
        .encode(&broken)
        .unwrap_err();
    assert_eq!((err.index, err.ip), (9, Ip(0x1020)));
    assert!(
        err.to_string().contains("`nop` cannot continue at 0x1000"),
        "{err}"
    );
}

/// `INT n` leaves user mode with FUP(CLIP), TIP.PGD() (SDM table "Packet
/// Generation under Different Enable Conditions", software interrupt with
/// PacketEn 1 → 0 and ContextEn 0); a far return that stays in 64-bit user
/// mode is a TIP without MODE.Exec.
///
/// ```text
/// 2000: cd 80            int 0x80
/// 2002: 48 cb            retfq
/// 3000: 90               nop
/// 3001: 0f 05            syscall      (exit)
/// ```
#[test]
fn software_interrupts_and_far_returns() {
    let mut code = CodeImageBuilder::new();
    code.add(Ip(0x2000), &[0xcd, 0x80, 0x48, 0xcb]).unwrap();
    code.add(Ip(0x3000), &[0x90, 0x0f, 0x05]).unwrap();
    let e = Execution::from_parts(
        [0x2000, 0x2002, 0x3000, 0x3001].map(Ip).to_vec(),
        ExecMode::Bits64,
        code.build().unwrap(),
        None,
    );
    for return_compression in [true, false] {
        let config = PtConfig {
            return_compression,
            ..PtConfig::default()
        };
        let trace = PtEncoder::new(config).encode(&e).unwrap();
        assert_eq!(
            listing(&trace),
            [
                "psb",
                "psbend",
                "mode.exec Bits64",
                "tip.pge 0x2000",
                // A software interrupt reports its own IP (CLIP) first.
                "fup 0x2000",
                "tip.pgd -",
                "tip.pge 0x2002",
                "tip 0x3000",
                // The program's last instruction: its TIP.PGD ends the trace.
                "tip.pgd -",
            ]
        );
        // FUP(CLIP) + TIP.PGD is an asynchronous disable *at* the INT to
        // libipt: it stops before the INT, so the INT itself is the one
        // executed instruction no decoder following libipt reports.
        let mut want = executed(&e);
        want.retain(|&ip| ip != 0x2000);
        assert_eq!(libipt(&e, &trace.bytes), want);
    }
}

#[test]
fn instructions_the_encoder_cannot_trace_are_refused() {
    // ud2 faults: the CPU would write FUP + TIP.PGD before it, which needs
    // knowing it faulted; the encoder says so instead of guessing.
    let mut code = CodeImageBuilder::new();
    code.add(Ip(0x1000), &[0x0f, 0x0b]).unwrap();
    let e = Execution::from_parts(
        vec![Ip(0x1000)],
        ExecMode::Bits64,
        code.build().unwrap(),
        None,
    );
    let err = PtEncoder::new(PtConfig::default()).encode(&e).unwrap_err();
    assert_eq!(err.index, 0);
    assert!(err.to_string().contains("`ud2` is not supported"), "{err}");

    // No code at all.
    let e = Execution::from_parts(
        vec![Ip(0x5000)],
        ExecMode::Bits64,
        CodeImageBuilder::new().build().unwrap(),
        None,
    );
    let err = PtEncoder::new(PtConfig::default()).encode(&e).unwrap_err();
    assert_eq!(err.to_string(), "instruction 0 at 0x5000: no code bytes");
}

/// IP filtering: a JMP out of the range writes TIP.PGD with its target, a
/// JMP back in TIP.PGE; a conditional branch out writes TIP.PGD with the IP
/// suppressed and no TNT bit (SDM 33.4.2.5).
///
/// ```text
/// 1000: 74 0e            je   1010
/// 1002: e9 f9 0f 00 00   jmp  2000
/// 1010: 90               nop
/// 2000: e9 fb ef ff ff   jmp  1000
/// ```
#[test]
fn ip_filter_transitions() {
    let mut code = CodeImageBuilder::new();
    code.add(Ip(0x1000), &[0x74, 0x0e, 0xe9, 0xf9, 0x0f, 0, 0])
        .unwrap();
    code.add(Ip(0x1010), &[0x90]).unwrap();
    code.add(Ip(0x2000), &[0xe9, 0xfb, 0xef, 0xff, 0xff])
        .unwrap();
    let code = code.build().unwrap();
    let filter = |start, end| {
        let mut f = [None; 4];
        f[0] = Some(IpRange {
            start: Ip(start),
            end: Ip(end),
        });
        f
    };

    let e = Execution::from_parts(
        [0x1000, 0x1002, 0x2000, 0x1000, 0x1010].map(Ip).to_vec(),
        ExecMode::Bits64,
        code.clone(),
        Some(Ip(0x1011)),
    );
    let config = PtConfig {
        ip_filter: filter(0x1000, 0x1fff),
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(&e).unwrap();
    assert_eq!(
        listing(&trace),
        [
            "psb",
            "psbend",
            "mode.exec Bits64",
            "tip.pge 0x1000",
            "tnt N",
            "tip.pgd 0x2000",
            // The JMP at 0x2000 runs untraced and lands inside again.
            "tip.pge 0x1000",
            "tnt T",
            "fup 0x1011",
            "tip.pgd -",
        ]
    );
    assert_eq!(libipt(&e, &trace.bytes), [0x1000, 0x1002, 0x1000, 0x1010]);

    // The JE's taken target 0x1010 is outside [0x1000, 0x100f].
    let e = Execution::from_parts(
        [0x1000, 0x1010].map(Ip).to_vec(),
        ExecMode::Bits64,
        code,
        Some(Ip(0x1011)),
    );
    let config = PtConfig {
        ip_filter: filter(0x1000, 0x100f),
        ..PtConfig::default()
    };
    let trace = PtEncoder::new(config).encode(&e).unwrap();
    assert_eq!(
        listing(&trace),
        [
            "psb",
            "psbend",
            "mode.exec Bits64",
            "tip.pge 0x1000",
            "tip.pgd -"
        ]
    );
    // libipt 2.0.5 binds a suppressed TIP.PGD only to far branches, so it
    // is not asked to decode this one.
}
