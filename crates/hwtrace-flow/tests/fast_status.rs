//! PSB+ written while tracing is off (an IP-filtered trace between a
//! TIP.PGD and the next TIP.PGE: the hardware still writes its status
//! every few KiB), whose status updates counting decodes pass over
//! (`insn/decoder/passed_status.rs`, `event/decoder/filtered_psb.rs`).
//! Each trace is checked as the `fast_decode` fuzz target checks its
//! inputs (`fuzz/fuzz_targets/fast_compare.rs`): the instruction decoder,
//! the block-cached decoder's runs, its counted runs (status updates
//! passed over counted apart) and its visited runs agreeing item for
//! item.

use hwtrace_flow::Config;
use hwtrace_flow::insn::FastDecoder;
use hwtrace_flow::parallel::{FastSource, Flow, MAX_STALL};
use hwtrace_packet::{IpPayload, ModeExec, ModeTsx, Packet, Pip, Tma, Tnt, TraceBuilder};
use hwtrace_types::{BytesAt, Cr3, Ip, TraceOffset};

#[path = "../../../fuzz/fuzz_targets/fast_compare.rs"]
mod fast_compare;

const BASE: u64 = 0x1000;
/// Outside the code: where the call out of the range goes.
const OUT: u64 = 0x10_0000;

/// A loop calling out of the traced range:
///
/// ```text
/// 1000: test eax, eax
/// 1002: jne 1010          ; a TNT bit each round
/// 1004: ret               ; (the loop's exit)
/// 1010: call 100000       ; out of the range: TIP.PGD 100000
/// 1015: jmp 1000          ; back: TIP.PGE 1015
/// ```
fn code() -> Vec<u8> {
    let mut c = vec![0x90u8; 0x17];
    c[0x00..0x05].copy_from_slice(&[0x85, 0xc0, 0x75, 0x0c, 0xc3]);
    let rel = (OUT - (BASE + 0x15)) as u32;
    c[0x10] = 0xe8;
    c[0x11..0x15].copy_from_slice(&rel.to_le_bytes());
    c[0x15..0x17].copy_from_slice(&[0xeb, 0xe9]);
    c
}

/// What the PSB+ written while execution is out of the range hold.
#[derive(Clone, Copy, Debug)]
enum Status {
    /// MODE.TSX, PIP, VMCS, CBR.
    Plain,
    /// TSC and TMA first, CR3 and the transaction state changing.
    Timed,
    /// Every third one has something the bytes are not read for (a
    /// MODE.Exec, an MNT, a FUP saying tracing is on) in turn.
    Odd,
}

fn push(t: &mut TraceBuilder, p: Packet) {
    t.push(p).expect("an encodable packet");
}

fn psb_off(t: &mut TraceBuilder, status: Status, n: u64) {
    push(t, Packet::Psb);
    if let Status::Timed = status {
        push(t, Packet::Tsc(0x10_0000 + 0x1000 * n));
        push(
            t,
            Packet::Tma(Tma {
                ctc: (n * 5) as u16,
                fc: 3,
            }),
        );
    }
    let timed = matches!(status, Status::Timed);
    push(
        t,
        Packet::ModeTsx(ModeTsx {
            intx: timed && n % 2 == 1,
            abrt: false,
        }),
    );
    push(
        t,
        Packet::Pip(Pip {
            cr3: Cr3(if timed { 0x1000 * (n % 3) } else { 0x1ee7_3000 }),
            nr: true,
        }),
    );
    push(t, Packet::Vmcs(0x3_52e9_9000));
    push(t, Packet::Cbr(0x28));
    if let Status::Odd = status
        && n % 3 == 2
    {
        match n % 9 {
            2 => push(
                t,
                Packet::ModeExec(ModeExec {
                    csl: true,
                    csd: false,
                    iflag: false,
                }),
            ),
            5 => push(t, Packet::Mnt(n)),
            _ => push(t, Packet::Fup(IpPayload::full(BASE + 0x15))),
        }
    }
    push(t, Packet::Psbend);
}

/// `rounds` times round the loop, `psbs` PSB+ written each time
/// execution is out of the range (`pads` PADs after each).
fn trace(rounds: u64, psbs: u64, pads: usize, status: Status) -> Vec<u8> {
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).expect("a PSB+");
    let mut n = 0;
    for _ in 0..rounds {
        push(
            &mut t,
            Packet::Tnt(Tnt {
                bits: 1,
                len: 1,
                long: false,
            }),
        );
        t.ip(Packet::TipPgd, OUT).expect("a TIP.PGD");
        for _ in 0..psbs {
            psb_off(&mut t, status, n);
            n += 1;
            for _ in 0..pads {
                push(&mut t, Packet::Pad);
            }
        }
        push(
            &mut t,
            Packet::ModeExec(ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            }),
        );
        t.ip(Packet::TipPge, BASE + 0x15).expect("a TIP.PGE");
    }
    // Out of the loop: the trace ends at its `ret`.
    push(
        &mut t,
        Packet::Tnt(Tnt {
            bits: 0,
            len: 1,
            long: false,
        }),
    );
    t.finish()
}

/// How many status updates a counting decode of `data` passes over.
fn passed_over(data: &[u8], image: BytesAt<'_>) -> u64 {
    let source = FastSource::counting(FastDecoder::new(data, Config::default(), image), MAX_STALL);
    let mut flow = Flow::new(source);
    let mut passed = 0;
    loop {
        passed += flow.skip_runs(TraceOffset(u64::MAX)).status_updates;
        if flow.next().is_none() {
            return passed;
        }
    }
}

#[test]
fn status_updates_tracing_off_count_as_the_instruction_decoder() {
    let code = code();
    let image = BytesAt::new(Ip(BASE), &code);
    for status in [Status::Plain, Status::Timed, Status::Odd] {
        for rounds in [1, 2, 30] {
            for psbs in [0, 1, 2, 7] {
                for pads in [0, 3] {
                    let data = trace(rounds, psbs, pads, status);
                    let name = format!("{status:?}: {rounds} rounds, {psbs} PSB+, {pads} PADs");
                    fast_compare::check(&name, &data, image);
                    if psbs > 0 {
                        // Five each, but for the first PSB+'s first two
                        // (and, in the odd ones, what is not passed over).
                        let passed = passed_over(&data, image);
                        assert!(passed >= rounds * 3, "{name}: {passed} passed over");
                    }
                    // Odd lengths decode believing a PSB+ that says
                    // tracing is on (perf's reading); the other length
                    // too.
                    let mut longer = data.clone();
                    longer.push(0);
                    fast_compare::check(&format!("{name}, one PAD more"), &longer, image);
                }
            }
        }
    }
}

#[test]
fn traces_ending_among_them_count_as_the_instruction_decoder() {
    let code = code();
    let image = BytesAt::new(Ip(BASE), &code);
    for status in [Status::Plain, Status::Timed, Status::Odd] {
        let data = trace(3, 7, 1, status);
        // Cut anywhere in the last round's PSB+: at a packet's start, in
        // its middle, right after a PSBEND.
        for cut in (data.len() - 200..data.len()).step_by(3) {
            let name = format!("{status:?}: cut at {cut}");
            fast_compare::check(&name, &data[..cut], image);
        }
    }
}

/// A loop leaving the range at every round without a conditional branch
/// in between: the disable after an enable is fetched before the call it
/// binds to is reached, and must wait for it:
///
/// ```text
/// 1000: call 100000       ; out of the range: TIP.PGD 100000
/// 1005: jmp 1000          ; back: TIP.PGE 1005
/// ```
fn back_to_back_code() -> Vec<u8> {
    let mut c = vec![0u8; 7];
    let rel = (OUT - (BASE + 5)) as u32;
    c[0] = 0xe8;
    c[1..5].copy_from_slice(&rel.to_le_bytes());
    c[5..7].copy_from_slice(&[0xeb, 0xf9]);
    c
}

#[test]
fn disables_right_after_enables_count_as_the_instruction_decoder() {
    let code = back_to_back_code();
    let image = BytesAt::new(Ip(BASE), &code);
    for status in [Status::Plain, Status::Timed] {
        for psbs in [0, 1, 3] {
            let mut t = TraceBuilder::new();
            t.psb_plus_64(BASE).expect("a PSB+");
            let mut n = 0;
            for _ in 0..5 {
                t.ip(Packet::TipPgd, OUT).expect("a TIP.PGD");
                for _ in 0..psbs {
                    psb_off(&mut t, status, n);
                    n += 1;
                }
                t.ip(Packet::TipPge, BASE + 5).expect("a TIP.PGE");
            }
            let data = t.finish();
            let name = format!("back to back, {status:?}, {psbs} PSB+");
            fast_compare::check(&name, &data, image);
            if psbs > 0 {
                let passed = passed_over(&data, image);
                assert!(passed > 0, "{name}: {passed} passed over");
            }
        }
    }
}
