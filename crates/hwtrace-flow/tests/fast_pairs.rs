//! Disable/enable pairs (TIP.PGD right followed by TIP.PGE: the code
//! called out of the traced range and came back), after a TNT packet or
//! after a TIP, passed over by counting chains, the first time and then
//! from the chains' memo of passes
//! (`insn/pairmemo.rs`), which replays what the first pass did to the
//! return stack. Each trace is checked as the `fast_decode` fuzz target
//! checks its inputs (`fuzz/fuzz_targets/fast_compare.rs`): the
//! instruction decoder, the block-cached decoder's runs, its counted runs
//! and its visited runs agreeing item for item.

use hwtrace_packet::{IpPayload, Packet, Tnt, TraceBuilder};
use hwtrace_types::{BytesAt, Ip};

#[path = "../../../fuzz/fuzz_targets/fast_compare.rs"]
mod fast_compare;

const BASE: u64 = 0x1000;
/// Outside the code: where the call out of the range goes.
const OUT: u64 = 0x10_0000;

/// A loop that calls out of the traced range from a function it calls:
///
/// ```text
/// 1000: test eax, eax
/// 1002: jne 1010          ; a TNT bit before each pair
/// 1004: ret               ; (the loop's exit)
/// 1010: call 1020         ; pushes 1015 as the pair is passed over
/// 1015: jmp 1000
/// 1020: call 100000       ; out of the range: TIP.PGD 100000
/// 1025: ret               ; back: TIP.PGE 1025; a compressed return to 1015
/// ```
fn code() -> Vec<u8> {
    let mut c = vec![0x90u8; 0x26];
    c[0x00..0x05].copy_from_slice(&[0x85, 0xc0, 0x75, 0x0c, 0xc3]);
    c[0x10..0x17].copy_from_slice(&[0xe8, 0x0b, 0x00, 0x00, 0x00, 0xeb, 0xe9]);
    let rel = (OUT - (BASE + 0x25)) as u32;
    c[0x20] = 0xe8;
    c[0x21..0x25].copy_from_slice(&rel.to_le_bytes());
    c[0x25] = 0xc3;
    c
}

fn tnt(t: &mut TraceBuilder, bits: u64, len: u8) {
    t.push(Packet::Tnt(Tnt {
        bits,
        len,
        long: false,
    }))
    .expect("a TNT-8 packet");
}

fn pair(t: &mut TraceBuilder, pads: usize, back: u64) {
    t.push(Packet::TipPgd(IpPayload::full(OUT)))
        .expect("a TIP.PGD");
    for _ in 0..pads {
        t.push(Packet::Pad).expect("a PAD");
    }
    t.push(Packet::TipPge(IpPayload::full(back)))
        .expect("a TIP.PGE");
}

/// `rounds` times round the loop, the return after each pair in a TNT
/// packet of its own (`split`) or sharing one with the next round's jump.
fn trace(rounds: usize, split: bool, pads: usize) -> Vec<u8> {
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).expect("a PSB+");
    // The first round's jump.
    tnt(&mut t, 1, 1);
    pair(&mut t, pads, BASE + 0x25);
    for _ in 1..rounds {
        if split {
            // The return, then the jump with the pair after it.
            tnt(&mut t, 1, 1);
            tnt(&mut t, 1, 1);
        } else {
            tnt(&mut t, 0b11, 2);
        }
        pair(&mut t, pads, BASE + 0x25);
    }
    // The return, then out of the loop: the trace ends at its `ret`.
    tnt(&mut t, 0b10, 2);
    t.finish()
}

/// A loop whose function calls out of the range from a function it calls
/// through a register, the pair right after that call's TIP:
///
/// ```text
/// 1000: test eax, eax
/// 1002: jne 1010          ; a TNT bit
/// 1004: ret               ; (the loop's exit)
/// 1010: call 1020         ; pushes 1015
/// 1015: jmp 1000
/// 1020: call rax          ; TIP 1030; pushes 1022 as the pair is passed over
/// 1022: ret               ; a compressed return to 1015
/// 1030: call 100000       ; out of the range: TIP.PGD 100000
/// 1035: ret               ; back: TIP.PGE 1035; a compressed return to 1022
/// ```
fn code_through_a_register() -> Vec<u8> {
    let mut c = vec![0x90u8; 0x36];
    c[0x00..0x05].copy_from_slice(&[0x85, 0xc0, 0x75, 0x0c, 0xc3]);
    c[0x10..0x17].copy_from_slice(&[0xe8, 0x0b, 0x00, 0x00, 0x00, 0xeb, 0xe9]);
    c[0x20..0x23].copy_from_slice(&[0xff, 0xd0, 0xc3]);
    let rel = (OUT - (BASE + 0x35)) as u32;
    c[0x30] = 0xe8;
    c[0x31..0x35].copy_from_slice(&rel.to_le_bytes());
    c[0x35] = 0xc3;
    c
}

/// `rounds` times round [`code_through_a_register`]'s loop.
fn trace_through_a_register(rounds: usize, pads: usize) -> Vec<u8> {
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).expect("a PSB+");
    for round in 0..rounds {
        if round == 0 {
            tnt(&mut t, 1, 1);
        } else {
            // The two returns, then the jump.
            tnt(&mut t, 0b111, 3);
        }
        t.ip(Packet::Tip, BASE + 0x30).expect("a TIP");
        pair(&mut t, pads, BASE + 0x35);
    }
    // The two returns, then out of the loop: the trace ends at its `ret`.
    tnt(&mut t, 0b110, 3);
    t.finish()
}

#[test]
fn pairs_after_a_tip_count_as_the_instruction_decoder() {
    let code = code_through_a_register();
    let image = BytesAt::new(Ip(BASE), &code);
    for rounds in [1, 2, 3, 40, 700] {
        for pads in [0, 2] {
            let data = trace_through_a_register(rounds, pads);
            let name = format!("through a register: {rounds} rounds, {pads} PADs");
            fast_compare::check(&name, &data, image);
        }
    }
}

#[test]
fn pairs_passed_over_again_and_again_count_as_the_instruction_decoder() {
    let code = code();
    let image = BytesAt::new(Ip(BASE), &code);
    for rounds in [1, 2, 3, 40, 700] {
        for split in [true, false] {
            for pads in [0, 3] {
                let data = trace(rounds, split, pads);
                let name = format!("{rounds} rounds, split {split}, {pads} PADs");
                fast_compare::check(&name, &data, image);
            }
        }
    }
}

/// [`code`]'s loop with `calls` calls out of the range in a row where it
/// had one (`calls` pairs in a row, nothing the trace answers between
/// them), reached after a TNT bit or, through a register, after a TIP:
///
/// ```text
/// 1000: test eax, eax
/// 1002: jne 1010          ; a TNT bit
/// 1004: ret               ; (the loop's exit)
/// 1010: call 1020         ; pushes 1015
/// 1015: jmp 1000
/// 1020: call rax          ; (through a register) TIP 1030, pushes 1022
/// 1022: ret               ; a compressed return to 1015
/// 1030: call 100000       ; TIP.PGD 100000, TIP.PGE 1035
/// 1035: call 100000       ; TIP.PGD 100000, TIP.PGE 103a
/// ...                     ; `calls` of them
/// 1030+5*calls: ret       ; a compressed return
/// ```
///
/// Without the register, 1020 jumps straight to 1030 (`jmp 1030`).
fn code_calling_out(calls: usize, through_a_register: bool) -> Vec<u8> {
    let end = 0x30 + 5 * calls;
    let mut c = vec![0x90u8; end + 1];
    c[0x00..0x05].copy_from_slice(&[0x85, 0xc0, 0x75, 0x0c, 0xc3]);
    c[0x10..0x17].copy_from_slice(&[0xe8, 0x0b, 0x00, 0x00, 0x00, 0xeb, 0xe9]);
    if through_a_register {
        c[0x20..0x23].copy_from_slice(&[0xff, 0xd0, 0xc3]);
    } else {
        // jmp 1030
        c[0x20..0x22].copy_from_slice(&[0xeb, 0x0e]);
    }
    for i in 0..calls {
        let at = 0x30 + 5 * i;
        let rel = (OUT - (BASE + at as u64 + 5)) as u32;
        c[at] = 0xe8;
        c[at + 1..at + 5].copy_from_slice(&rel.to_le_bytes());
    }
    c[end] = 0xc3;
    c
}

/// `rounds` times round [`code_calling_out`]'s loop, the returns and the
/// jump after them in one TNT packet or (`split`) two.
fn trace_calling_out(
    rounds: usize,
    calls: usize,
    through_a_register: bool,
    split: bool,
    pads: usize,
) -> Vec<u8> {
    let mut t = TraceBuilder::new();
    t.psb_plus_64(BASE).expect("a PSB+");
    // The returns of a round: the one from 1030's code, and 1022's.
    let returns = if through_a_register { 2 } else { 1 };
    for round in 0..rounds {
        if round == 0 {
            tnt(&mut t, 1, 1);
        } else if split {
            // The returns, then the jump's bit in a packet of its own: a
            // sprint's station, the pairs right after its packet.
            tnt(&mut t, (1 << returns) - 1, returns);
            tnt(&mut t, 1, 1);
        } else {
            // The returns, then the jump.
            tnt(&mut t, (1 << (returns + 1)) - 1, returns + 1);
        }
        if through_a_register {
            t.ip(Packet::Tip, BASE + 0x30).expect("a TIP");
        }
        for i in 0..calls {
            pair(&mut t, pads, BASE + 0x30 + 5 * (i as u64 + 1));
        }
    }
    // The returns, then out of the loop: the trace ends at its `ret`.
    tnt(&mut t, ((1 << returns) - 1) << 1, returns + 1);
    t.finish()
}

#[test]
fn pairs_in_a_row_count_as_the_instruction_decoder() {
    // Up to the most a chain passes in one go, and past it.
    for calls in [2, 3, 8, 9, 12] {
        for through_a_register in [false, true] {
            let code = code_calling_out(calls, through_a_register);
            let image = BytesAt::new(Ip(BASE), &code);
            for rounds in [1, 2, 40, 300] {
                for (split, pads) in [(false, 0), (false, 2), (true, 0), (true, 2)] {
                    let data = trace_calling_out(rounds, calls, through_a_register, split, pads);
                    let name = format!(
                        "{calls} pairs in a row, through a register {through_a_register}: \
                         {rounds} rounds, split {split}, {pads} PADs"
                    );
                    fast_compare::check(&name, &data, image);
                }
            }
        }
    }
}
