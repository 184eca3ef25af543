//! Generated executions as ground truth: a random walk through a small
//! program (conditional branches, a direct call, an indirect jump, returns
//! compressed or not) is encoded as the trace a CPU would write, with PSB+,
//! interrupts (FUP+TIP), overflows (OVF+FUP) and disable/enable pairs
//! sprinkled in. Decoding
//! must give back every executed instruction, and libipt (the reference)
//! must agree, so generator and decoder cannot share a mistake.

use hwtrace_flow::Config;
use hwtrace_flow::insn::{InsnDecoder, Step};
use hwtrace_packet::{IpPayload, ModeExec, Packet, Tnt, TraceBuilder};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};

const BASE: u64 = 0x1000;

/// The program, with the control flow written out by hand (not decoded
/// by the code under test).
const CODE: [u8; 20] = [
    0x90, // 1000: nop
    0x74, 0x05, // 1001: jz 1008
    0xe8, 0x08, 0x00, 0x00, 0x00, // 1003: call 1010
    0xff, 0xe0, // 1008: jmp rax
    0xf4, 0xf4, 0xf4, 0xf4, 0xf4, 0xf4, // 100a: hlt (never reached)
    0x90, // 1010: nop
    0x75, 0xee, // 1011: jnz 1001
    0xc3, // 1013: ret
];

enum Kind {
    Next(u64),
    Cond { taken: u64, not: u64 },
    Call { target: u64, ret: u64 },
    Indirect,
    Ret,
}

fn kind(ip: u64) -> Kind {
    match ip {
        0x1000 => Kind::Next(0x1001),
        0x1001 => Kind::Cond {
            taken: 0x1008,
            not: 0x1003,
        },
        0x1003 => Kind::Call {
            target: 0x1010,
            ret: 0x1008,
        },
        0x1008 => Kind::Indirect,
        0x1010 => Kind::Next(0x1011),
        0x1011 => Kind::Cond {
            taken: 0x1001,
            not: 0x1013,
        },
        0x1013 => Kind::Ret,
        _ => unreachable!("the walk only visits instruction starts"),
    }
}

/// Places an indirect branch may go.
const TARGETS: [u64; 3] = [0x1000, 0x1010, 0x1013];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.next() % 1000 < per_mille
    }
    fn pick(&mut self, from: &[u64]) -> u64 {
        from[(self.next() % from.len() as u64) as usize]
    }
}

struct Gen {
    t: TraceBuilder,
    bits: u64,
    nbits: u8,
}

impl Gen {
    fn bit(&mut self, taken: bool) {
        self.bits = (self.bits << 1) | u64::from(taken);
        self.nbits += 1;
        if self.nbits == Tnt::MAX_SHORT {
            self.flush();
        }
    }
    fn flush(&mut self) {
        if self.nbits > 0 {
            let tnt = Tnt {
                bits: self.bits,
                len: self.nbits,
                long: false,
            };
            self.t.push(Packet::Tnt(tnt)).expect("tnt encodes");
        }
        self.bits = 0;
        self.nbits = 0;
    }
    fn psb(&mut self, ip: u64) {
        self.flush();
        let mode = ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        };
        self.t.push(Packet::Psb).expect("psb");
        self.t.push(Packet::ModeExec(mode)).expect("mode");
        self.t.ip(Packet::Fup, ip).expect("fup");
        self.t.push(Packet::Psbend).expect("psbend");
    }
}

/// One random execution: the trace and the executed instructions.
fn generate(seed: u64, steps: usize) -> (Vec<u8>, Vec<u64>) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut g = Gen {
        t: TraceBuilder::new(),
        bits: 0,
        nbits: 0,
    };
    let mut stack: Vec<u64> = Vec::new();
    let mut ip = BASE;
    let mut truth = Vec::new();
    // How much of `truth` the trace reveals (up to the last instruction
    // that left a packet, or the last IP a packet gave).
    let mut traced = 0;
    g.psb(ip);
    for _ in 0..steps {
        // Events between instructions.
        if rng.chance(10) {
            g.psb(ip);
            traced = truth.len();
        } else if rng.chance(10) {
            // An interrupt before `ip` executes.
            g.flush();
            let to = rng.pick(&TARGETS);
            g.t.ip(Packet::Fup, ip).expect("fup");
            g.t.ip(Packet::Tip, to).expect("tip");
            ip = to;
            traced = truth.len();
        } else if stack.is_empty() && rng.chance(5) {
            // Lost packets: tracing resumes at the OVF's FUP. What ran
            // since the last packet is lost with them: no decoder can know
            // it.
            g.flush();
            let to = rng.pick(&TARGETS);
            g.t.push(Packet::Ovf).expect("ovf");
            g.t.ip(Packet::Fup, to).expect("fup");
            truth.truncate(traced);
            traced = truth.len();
            ip = to;
        } else if rng.chance(5) {
            // Tracing off before `ip`, back on somewhere else.
            g.flush();
            let to = rng.pick(&TARGETS);
            g.t.ip(Packet::Fup, ip).expect("fup");
            g.t.push(Packet::TipPgd(IpPayload::SUPPRESSED))
                .expect("pgd");
            g.t.ip(Packet::TipPge, to).expect("pge");
            ip = to;
            traced = truth.len();
        }
        truth.push(ip);
        let at = kind(ip);
        if matches!(at, Kind::Cond { .. } | Kind::Indirect | Kind::Ret) {
            // This instruction leaves a TNT bit or a TIP: decoders know it.
            traced = truth.len();
        }
        ip = match at {
            Kind::Next(n) => n,
            Kind::Cond { taken, not } => {
                let t = rng.chance(500);
                g.bit(t);
                if t { taken } else { not }
            }
            Kind::Call { target, ret } => {
                stack.push(ret);
                target
            }
            Kind::Indirect => {
                g.flush();
                let to = rng.pick(&TARGETS);
                g.t.ip(Packet::Tip, to).expect("tip");
                to
            }
            Kind::Ret => match stack.pop() {
                // With a call to match, the return is compressed.
                Some(back) => {
                    g.bit(true);
                    back
                }
                None => {
                    g.flush();
                    let to = rng.pick(&TARGETS);
                    g.t.ip(Packet::Tip, to).expect("tip");
                    to
                }
            },
        };
    }
    g.flush();
    g.t.ip(Packet::Fup, ip).expect("fup");
    g.t.push(Packet::TipPgd(IpPayload::SUPPRESSED))
        .expect("pgd");
    (g.t.finish(), truth)
}

struct Code;

impl ReadMemory for Code {
    fn read_memory(
        &self,
        _space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let off = addr.0.wrapping_sub(BASE);
        let Some(rest) = usize::try_from(off).ok().and_then(|o| CODE.get(o..)) else {
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

fn hwtrace_ips(trace: &[u8]) -> Vec<u64> {
    let mut dec = InsnDecoder::new(trace, Config::default(), Code);
    let mut ips = Vec::new();
    dec.sync_forward().expect("the trace starts with a PSB");
    loop {
        match dec.next() {
            Ok(Some(Step::Insn(i))) => ips.push(i.ip),
            Ok(Some(Step::Event(_))) => {}
            Ok(None) => break,
            Err(e) => panic!("decode error {e} after {} instructions", ips.len()),
        }
    }
    ips
}

#[test]
fn generated_executions_decode_exactly() {
    for seed in 1..=200 {
        let (trace, truth) = generate(seed, 400);
        let got = hwtrace_ips(&trace);
        let same = got.iter().zip(&truth).take_while(|(a, b)| a == b).count();
        assert!(
            got == truth,
            "seed {seed}: hwtrace differs from the execution after {same} instructions: {:x?} vs {:x?}",
            &got[same.saturating_sub(3)..(same + 3).min(got.len())],
            &truth[same.saturating_sub(3)..(same + 3).min(truth.len())]
        );
    }
}

#[test]
fn libipt_agrees_on_generated_executions() {
    let memory = |addr: u64, buf: &mut [u8]| -> usize {
        let mut n = 0;
        for (i, b) in buf.iter_mut().enumerate() {
            match usize::try_from(addr.wrapping_sub(BASE) + i as u64)
                .ok()
                .and_then(|o| CODE.get(o))
            {
                Some(v) => {
                    *b = *v;
                    n += 1;
                }
                None => break,
            }
        }
        n
    };
    let image = hwtrace_libipt::Image::with_memory(&memory).expect("libipt image");
    for seed in 1..=50 {
        let (trace, truth) = generate(seed, 400);
        let (ips, errors) =
            hwtrace_libipt::insn_addresses(&trace, &hwtrace_libipt::Config::default(), &image)
                .expect("libipt decodes");
        assert!(errors.is_empty(), "seed {seed}: libipt errors {errors:?}");
        assert!(
            ips == truth,
            "seed {seed}: libipt differs from the execution"
        );
    }
}
