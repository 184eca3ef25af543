//! An execution over code in memory, for traces of code we cannot run.
//!
//! A memory dump holds the code of every process of a machine, but none of
//! them can be run again. To check that a decoder reads each part of a
//! whole-system trace in its own address space, this module makes up a
//! plausible execution over that real code: [`CodeWalker`] decodes the
//! instruction at an address of one address space (read through
//! [`ReadMemory`], e.g. a dump's page tables), and follows it:
//!
//! * fall-through and direct jumps go where the code says;
//! * direct calls go to their target and push the return address on a
//!   shadow stack; their targets are remembered as known code;
//! * a conditional branch's outcome is drawn from a seeded generator;
//! * a return pops the shadow stack;
//! * an indirect jump or call (and a return with an empty stack) goes to
//!   one of the addresses already known to be code (the start points and
//!   the direct-call targets seen);
//! * where the next instruction cannot be read or decoded, or the
//!   instruction is one user code cannot run on (system calls, far
//!   transfers, faulting or privileged instructions), the stretch stops
//!   before it, and the walker starts over at known code.
//!
//! [`walk_spaces`] walks several address spaces in turn, switching every
//! few instructions as a scheduler does, and [`encode_switches`] writes the
//! Intel PT such an execution produces: each stretch encoded by
//! [`PtEncoder`], joined as a trace with `OS = 1` and an IP filter around
//! user code joins them (SDM vol. 3C, chapter 33, "Packet Generation under
//! Different Enable Conditions"): the interrupt that ends a stretch writes
//! FUP with the next instruction's IP and TIP.PGD (row "HW Interrupt",
//! PacketEn 1 → 0, ContextEn 1); the kernel's MOV CR3 writes a PIP with the
//! new CR3 (row "MOV to CR3", PacketEn 0, ContextEn 1); the IRET into the
//! next process writes MODE.Exec and TIP.PGE (row "Far Branch", PacketEn
//! 0 → 1). With `OS = 1` every PSB+ carries the current CR3 in a PIP
//! (33.3.7, "PSB+"), so a decoder can start at any PSB.

use std::collections::HashSet;

use hwtrace_packet::{ExecMode, IpCompression, LastIp, Packet, PacketDecoder, Pip, TraceBuilder};
use hwtrace_types::{AddressSpace, Cr3, Ip, ReadMemory, TraceOffset};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

use crate::memory::CodeImageBuilder;
use crate::pt_encoder::{Cr3Filter, EncodeError, PsbMark, PtConfig, PtEncoder};
use crate::{CodeConflict, Execution};

/// How to walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkConfig {
    /// The seed of the generator that picks branch outcomes and targets.
    pub seed: u64,
    /// Instructions per time slice: how many a space runs before the walk
    /// switches to the next one.
    pub slice_len: usize,
    /// How many time slices in all.
    pub slices: usize,
    /// How many times in a row a space may fail to make progress from its
    /// known code before the walk gives up.
    pub max_restarts: usize,
}

impl Default for WalkConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            slice_len: 200,
            slices: 6,
            max_restarts: 64,
        }
    }
}

/// Why a walk failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WalkError {
    /// No start point of this space leads anywhere.
    #[error("CR3 {cr3}: no progress from any of {known} known code addresses (last tried {ip})")]
    Stuck {
        /// The address space.
        cr3: Cr3,
        /// How many addresses were known as code.
        known: usize,
        /// The last address tried.
        ip: Ip,
    },
    /// A space was given no start point.
    #[error("CR3 {cr3}: no start point")]
    NoStart {
        /// The address space.
        cr3: Cr3,
    },
    /// One address held two different instructions within a stretch
    /// (cannot happen over a fixed memory; reported rather than hidden).
    #[error(transparent)]
    Code(#[from] CodeConflict),
}

/// SplitMix64: small, seeded, and the same on every machine, so a walk is
/// reproducible from its seed.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

/// How an instruction moves the walk (the classes [`PtEncoder`] encodes
/// for user code, and the ones the walk stops at).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Next,
    Cond(Ip),
    Jump(Ip),
    Call(Ip),
    IndirectJump,
    IndirectCall,
    Return,
    /// System calls, far transfers, interrupts, exceptions, TSX, and the
    /// privileged instructions user code would fault on.
    Stop,
}

fn flow_of(insn: &Instruction) -> Flow {
    let stop_mnemonic = matches!(
        insn.mnemonic(),
        Mnemonic::Syscall
            | Mnemonic::Sysenter
            | Mnemonic::Sysexit
            | Mnemonic::Sysret
            | Mnemonic::Retf
            | Mnemonic::Iret
            | Mnemonic::Iretd
            | Mnemonic::Iretq
            | Mnemonic::Hlt
            | Mnemonic::Vmlaunch
            | Mnemonic::Vmresume
            | Mnemonic::Vmcall
            | Mnemonic::Vmptrld
            | Mnemonic::Ptwrite
    );
    let writes_cr = insn.mnemonic() == Mnemonic::Mov && insn.op0_register().is_cr();
    if stop_mnemonic
        || writes_cr
        || insn.is_jmp_far()
        || insn.is_jmp_far_indirect()
        || insn.is_call_far()
        || insn.is_call_far_indirect()
    {
        return Flow::Stop;
    }
    let target = Ip(insn.near_branch_target());
    match insn.flow_control() {
        FlowControl::Next => Flow::Next,
        FlowControl::ConditionalBranch => Flow::Cond(target),
        FlowControl::UnconditionalBranch => Flow::Jump(target),
        FlowControl::Call => Flow::Call(target),
        FlowControl::IndirectBranch => Flow::IndirectJump,
        FlowControl::IndirectCall => Flow::IndirectCall,
        FlowControl::Return => Flow::Return,
        FlowControl::Interrupt | FlowControl::Exception | FlowControl::XbeginXabortXend => {
            Flow::Stop
        }
    }
}

/// One decoded instruction the walk may execute.
#[derive(Debug, Clone, Copy)]
struct Step {
    len: usize,
    bytes: [u8; 15],
    flow: Flow,
}

/// Walks the code of one address space.
#[derive(Debug, Clone)]
pub struct CodeWalker<M> {
    mem: M,
    space: AddressSpace,
    ip: Ip,
    shadow: Vec<Ip>,
    /// Addresses known to hold code (start points, direct-call targets),
    /// in the order found (the generator indexes it, so no hash order).
    known: Vec<Ip>,
    known_set: HashSet<u64>,
    rng: Rng,
}

/// How deep the shadow stack may grow before its oldest entry is dropped
/// (deep recursion in made-up flow is not worth memory).
const MAX_SHADOW: usize = 1024;

/// How many direct-call targets are remembered as known code.
const MAX_KNOWN: usize = 4096;

impl<M: ReadMemory> CodeWalker<M> {
    /// A walker over `mem` in the address space of `cr3`, starting at the
    /// first of `starts` (all of them are known code), drawing from `seed`.
    pub fn new(mem: M, cr3: Cr3, starts: &[Ip], seed: u64) -> Result<Self, WalkError> {
        let &first = starts.first().ok_or(WalkError::NoStart { cr3 })?;
        let mut w = Self {
            mem,
            space: AddressSpace::with_cr3(cr3),
            ip: first,
            shadow: Vec::new(),
            known: Vec::new(),
            known_set: HashSet::new(),
            rng: Rng(seed),
        };
        for &s in starts {
            w.learn(s);
        }
        Ok(w)
    }

    /// The CR3 walked.
    pub fn cr3(&self) -> Cr3 {
        self.space.cr3.unwrap_or(Cr3(0))
    }

    /// Where the next stretch starts.
    pub fn ip(&self) -> Ip {
        self.ip
    }

    /// The addresses known to hold code so far.
    pub fn known(&self) -> &[Ip] {
        &self.known
    }

    fn learn(&mut self, ip: Ip) {
        if self.known.len() < MAX_KNOWN && self.known_set.insert(ip.0) {
            self.known.push(ip);
        }
    }

    /// Decodes the instruction at `ip`, if all its bytes can be read.
    fn decode(&self, ip: Ip) -> Option<Step> {
        let mut bytes = [0u8; 15];
        let n = self.mem.read_memory(self.space, ip, &mut bytes).ok()?;
        let avail = bytes.get(..n)?;
        let mut decoder = Decoder::with_ip(64, avail, ip.0, DecoderOptions::NONE);
        let insn = decoder.decode();
        if insn.is_invalid() || insn.len() > n {
            return None;
        }
        Some(Step {
            len: insn.len(),
            bytes,
            flow: flow_of(&insn),
        })
    }

    /// Whether `ip` holds an instruction the walk can execute.
    fn runnable(&self, ip: Ip) -> bool {
        self.decode(ip).is_some_and(|s| s.flow != Flow::Stop)
    }

    /// A known code address the walk can execute, drawn at random.
    fn pick_known(&mut self) -> Option<Ip> {
        let n = self.known.len();
        let first = self.rng.below(n);
        (0..n)
            .map(|i| self.known[(first + i) % n])
            .find(|&ip| self.runnable(ip))
    }

    /// Executes up to `max` instructions from the current IP. Returns the
    /// executed instructions and the one that would run next; stops early
    /// where the walk cannot go on (see the module documentation), leaving
    /// the walker at known code for the next stretch.
    fn stretch(&mut self, max: usize) -> (Vec<Ip>, CodeImageBuilder, Result<Ip, Ip>) {
        let mut insns = Vec::new();
        let mut code = CodeImageBuilder::new();
        while insns.len() < max {
            let ip = self.ip;
            let Some(step) = self.decode(ip) else {
                return (insns, code, Err(ip));
            };
            let fall = ip.add(step.len as u64);
            let next = match step.flow {
                Flow::Stop => None,
                Flow::Next => Some(fall),
                Flow::Jump(t) | Flow::Call(t) => Some(t),
                Flow::Cond(t) => {
                    let (first, second) = if self.rng.coin() {
                        (t, fall)
                    } else {
                        (fall, t)
                    };
                    [first, second].into_iter().find(|&n| self.runnable(n))
                }
                Flow::IndirectJump | Flow::IndirectCall => self.pick_known(),
                Flow::Return => match self.shadow.last() {
                    Some(&ret) => Some(ret),
                    None => self.pick_known(),
                },
            };
            let Some(next) = next.filter(|&n| self.runnable(n)) else {
                return (insns, code, Err(ip));
            };
            // Committed: the instruction runs.
            match step.flow {
                // A zero-length call (`call next; pop`) reads the IP; it
                // returns nowhere.
                Flow::Call(t) if t == fall => {}
                Flow::Call(t) => {
                    self.learn(t);
                    self.push(fall);
                }
                Flow::IndirectCall => self.push(fall),
                Flow::Return => {
                    self.shadow.pop();
                }
                _ => {}
            }
            if code.add(ip, &step.bytes[..step.len]).is_err() {
                // Cannot happen over one fixed memory; end the stretch
                // rather than record two codes at one address.
                return (insns, code, Err(ip));
            }
            insns.push(ip);
            self.ip = next;
        }
        let next = self.ip;
        (insns, code, Ok(next))
    }

    fn push(&mut self, ret: Ip) {
        if self.shadow.len() >= MAX_SHADOW {
            self.shadow.remove(0);
        }
        self.shadow.push(ret);
    }

    /// Walks one stretch of at most `max` instructions: an [`Execution`]
    /// whose successor is the instruction that would run next (so the
    /// trace can end exactly there). A stretch that has to stop early ends
    /// before the instruction it could not execute, and the walker starts
    /// over at known code; an empty stretch is retried from there, up to
    /// `max_restarts` times.
    pub fn walk(&mut self, max: usize, max_restarts: usize) -> Result<Execution, WalkError> {
        for _ in 0..=max_restarts {
            let (insns, code, end) = self.stretch(max);
            let successor = match end {
                Ok(next) => next,
                Err(stopped) => {
                    self.shadow.clear();
                    let restart = self.pick_known();
                    if let Some(ip) = restart {
                        self.ip = ip;
                    }
                    if insns.is_empty() {
                        if restart.is_none() {
                            break;
                        }
                        continue;
                    }
                    stopped
                }
            };
            if insns.is_empty() {
                break;
            }
            return Ok(Execution::from_parts(
                insns,
                ExecMode::Bits64,
                code.build()?,
                Some(successor),
            ));
        }
        Err(WalkError::Stuck {
            cr3: self.cr3(),
            known: self.known.len(),
            ip: self.ip,
        })
    }
}

/// A stretch of a walk: instructions run in one address space without a
/// break. A time slice is one or more stretches of one space: where the
/// walk had to stop and start over (see [`CodeWalker::walk`]) a new
/// stretch begins, as after a system call or a signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stretch {
    /// The address space.
    pub cr3: Cr3,
    /// What ran, with the instruction that would have run next.
    pub execution: Execution,
}

/// Walks the address spaces of `starts` (each a CR3 and its start points)
/// in turn, `config.slice_len` instructions at a time (a time slice, in
/// one or more stretches), `config.slices` slices in all. Each space keeps
/// its own place and shadow stack between its slices, as a process does.
pub fn walk_spaces<M: ReadMemory + Copy>(
    mem: M,
    starts: &[(Cr3, Vec<Ip>)],
    config: &WalkConfig,
) -> Result<Vec<Stretch>, WalkError> {
    let mut walkers = starts
        .iter()
        .enumerate()
        .map(|(i, (cr3, s))| {
            CodeWalker::new(mem, *cr3, s, config.seed.wrapping_add(i as u64 * 0x1_0000))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(config.slices);
    if walkers.is_empty() {
        return Ok(out);
    }
    for n in 0..config.slices {
        let i = n % walkers.len();
        let w = &mut walkers[i];
        let mut ran = 0;
        // Each stretch runs at least one instruction (or the walk fails),
        // so a slice ends.
        while ran < config.slice_len {
            let execution = w.walk(config.slice_len - ran, config.max_restarts)?;
            ran += execution.len();
            out.push(Stretch {
                cr3: w.cr3(),
                execution,
            });
        }
    }
    Ok(out)
}

/// Why a switching execution could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SwitchEncodeError {
    /// [`PtEncoder`] refused stretch `stretch`.
    #[error("stretch {stretch}")]
    Encode {
        /// The stretch's index.
        stretch: usize,
        /// Why.
        source: EncodeError,
    },
    /// The encoder's own output did not decode (a bug, reported with the
    /// offset in that stretch's trace).
    #[error("stretch {stretch}: re-reading the encoder's packets at offset {offset}: {message}")]
    Reread {
        /// The stretch's index.
        stretch: usize,
        /// The offset in the stretch's trace.
        offset: u64,
        /// What went wrong.
        message: String,
    },
}

/// The trace of a switching execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchTrace {
    /// The trace bytes.
    pub bytes: Vec<u8>,
    /// Every PSB written: its offset in [`SwitchTrace::bytes`] and the
    /// index, counted over all stretches' instructions in order, of the
    /// first instruction a decoder starting there sees.
    pub psbs: Vec<PsbMark>,
    /// PIPs written between stretches (the switches: one wherever the
    /// next stretch runs in another address space).
    pub switch_pips: usize,
    /// Returns written as one taken TNT bit (return compression).
    pub compressed_returns: u64,
}

/// Encodes `stretches` as one trace (see the module documentation): each
/// by a [`PtEncoder`] with `config` (its CR3 filter set to the stretch's
/// CR3, which makes every PSB+ carry that CR3 in a PIP, as `OS = 1`
/// does), joined by FUP and TIP.PGD (the encoder's ending for an
/// execution cut short), a PIP with the next CR3 if it changes, and the
/// next stretch's MODE.Exec and TIP.PGE. The next stretch's opening PSB+
/// is left out: the hardware writes none at a switch, so the decoder must
/// take the new address space from the switch's PIP. `kernel_entry`, if given, is
/// the interrupt handler's address the TIP.PGD carries (with `OS = 1` and
/// an IP filter the processor reports where it went); `None` suppresses it.
///
/// IP packets are re-compressed against the joined trace's last IP, as
/// the hardware would have compressed them.
pub fn encode_switches(
    stretches: &[Stretch],
    config: PtConfig,
    kernel_entry: Option<Ip>,
) -> Result<SwitchTrace, SwitchEncodeError> {
    let mut out = TraceBuilder::new();
    let mut psbs = Vec::new();
    // Instructions of the stretches before this one.
    let mut base = 0;
    let mut switch_pips = 0;
    let mut compressed_returns = 0;
    let last = stretches.len().saturating_sub(1);
    for (index, s) in stretches.iter().enumerate() {
        let cfg = PtConfig {
            cr3_filter: Some(Cr3Filter {
                cr3_match: s.cr3,
                process_cr3: s.cr3,
            }),
            ..config
        };
        let encoded = PtEncoder::new(cfg).encode(&s.execution).map_err(|source| {
            SwitchEncodeError::Encode {
                stretch: index,
                source,
            }
        })?;
        compressed_returns += encoded.stats.compressed_returns;
        let packets = reread(&encoded.bytes, index)?;
        let mut rest = packets.as_slice();
        // The encoder's PSB marks, in order; the opening one is dropped
        // below for every stretch but the first.
        let mut marks = encoded.psbs.iter();
        if index > 0 {
            marks.next();
            // Drop the opening PSB+; the switch's PIP takes its place.
            let end = rest
                .iter()
                .position(|(p, _)| matches!(p, Packet::Psbend))
                .map_or(0, |i| i + 1);
            rest = &rest[end..];
            if stretches[index - 1].cr3 != s.cr3 {
                push(&mut out, Packet::Pip(pip(s.cr3)), None, index)?;
                switch_pips += 1;
            }
        }
        let n = rest.len();
        for (i, &(packet, ip)) in rest.iter().enumerate() {
            let closing = i + 1 == n && index < last;
            let (packet, ip) = match (packet, kernel_entry) {
                (Packet::TipPgd(_), Some(entry)) if closing => (packet, Some(entry.0)),
                _ => (packet, ip),
            };
            if matches!(packet, Packet::Psb)
                && let Some(mark) = marks.next()
            {
                psbs.push(PsbMark {
                    offset: TraceOffset(out.as_bytes().len() as u64),
                    insn_index: base + mark.insn_index,
                });
            }
            push(&mut out, packet, ip, index)?;
        }
        base += s.execution.len();
    }
    Ok(SwitchTrace {
        bytes: out.finish(),
        psbs,
        switch_pips,
        compressed_returns,
    })
}

/// A PIP for `cr3`: bits 51:5, NR = 0 (SDM vol. 3C, 33.4.2.7).
fn pip(cr3: Cr3) -> Pip {
    Pip {
        cr3: Cr3(cr3.0 & 0x000f_ffff_ffff_ffe0),
        nr: false,
    }
}

/// Every packet of `bytes` with the full IP an IP packet stands for
/// (`None` for other packets and suppressed IPs).
fn reread(bytes: &[u8], stretch: usize) -> Result<Vec<(Packet, Option<u64>)>, SwitchEncodeError> {
    let mut decoder = PacketDecoder::new(bytes);
    let mut last = LastIp::new();
    let mut out = Vec::new();
    loop {
        let offset = decoder.offset().0;
        let p = match decoder.next_packet() {
            Ok(Some(p)) => p.packet,
            Ok(None) => break,
            Err(e) => {
                return Err(SwitchEncodeError::Reread {
                    stretch,
                    offset,
                    message: e.to_string(),
                });
            }
        };
        if matches!(p, Packet::Psb | Packet::Ovf) {
            last.reset();
        }
        let ip = match p.ip_payload() {
            Some(payload) if payload.compression != IpCompression::Suppressed => {
                last.update(payload);
                last.ip().ok()
            }
            _ => None,
        };
        out.push((p, ip));
    }
    Ok(out)
}

/// Appends `packet`, re-compressing its IP (`ip`) against `out`'s last IP.
fn push(
    out: &mut TraceBuilder,
    packet: Packet,
    ip: Option<u64>,
    stretch: usize,
) -> Result<(), SwitchEncodeError> {
    let make: Option<fn(hwtrace_packet::IpPayload) -> Packet> = match packet {
        Packet::Tip(_) => Some(Packet::Tip),
        Packet::TipPge(_) => Some(Packet::TipPge),
        Packet::TipPgd(_) => Some(Packet::TipPgd),
        Packet::Fup(_) => Some(Packet::Fup),
        _ => None,
    };
    let offset = out.as_bytes().len() as u64;
    let result = match (make, ip) {
        (Some(make), Some(ip)) => out.ip(make, ip).map(|_| ()),
        _ => out.push(packet).map(|_| ()),
    };
    result.map_err(|e| SwitchEncodeError::Reread {
        stretch,
        offset,
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_packet::ModeExec;
    use hwtrace_types::MemoryError;
    use std::collections::HashMap;

    /// Code per CR3: `(cr3, base) -> bytes`.
    #[derive(Debug, Default)]
    struct Spaces(HashMap<u64, Vec<(u64, Vec<u8>)>>);

    impl Spaces {
        fn add(mut self, cr3: u64, base: u64, bytes: &[u8]) -> Self {
            self.0.entry(cr3).or_default().push((base, bytes.to_vec()));
            self
        }
    }

    impl ReadMemory for Spaces {
        fn read_memory(
            &self,
            space: AddressSpace,
            addr: Ip,
            buf: &mut [u8],
        ) -> Result<usize, MemoryError> {
            let cr3 = space.cr3.ok_or(MemoryError::Unmapped { addr })?.0;
            for (base, bytes) in self.0.get(&cr3).into_iter().flatten() {
                if addr.0 >= *base && addr.0 < base + bytes.len() as u64 {
                    let from = (addr.0 - base) as usize;
                    let n = buf.len().min(bytes.len() - from);
                    buf[..n].copy_from_slice(&bytes[from..from + n]);
                    return Ok(n);
                }
            }
            Err(MemoryError::Unmapped { addr })
        }
    }

    /// ```text
    /// 1000  31 c0           xor eax,eax
    /// 1002  74 05           je 1009
    /// 1004  e8 07 00 00 00  call 1010
    /// 1009  90              nop
    /// 100a  eb f4           jmp 1000
    /// 100c  ff e0           jmp rax
    /// 100e  0f 05           syscall
    /// 1010  90              nop
    /// 1011  74 f9           je 100c
    /// 1013  c3              ret
    /// ```
    const LOOP: &[u8] = &[
        0x31, 0xc0, 0x74, 0x05, 0xe8, 0x07, 0, 0, 0, 0x90, 0xeb, 0xf4, 0xff, 0xe0, 0x0f, 0x05,
        0x90, 0x74, 0xf9, 0xc3,
    ];

    /// Where each instruction of [`LOOP`] may go next.
    fn loop_successors(ip: u64, known: &[Ip]) -> Vec<u64> {
        match ip {
            0x1000 => vec![0x1002],
            0x1002 => vec![0x1004, 0x1009],
            0x1004 => vec![0x1010],
            0x1009 => vec![0x100a],
            0x100a => vec![0x1000],
            0x100c => known.iter().map(|k| k.0).collect(),
            0x1010 => vec![0x1011],
            0x1011 => vec![0x1013, 0x100c],
            0x1013 => vec![0x1009],
            other => panic!("{other:#x} is not an instruction of LOOP"),
        }
    }

    #[test]
    fn the_walk_follows_the_code() {
        let mem = Spaces::default().add(1, 0x1000, LOOP);
        let mut w = CodeWalker::new(&mem, Cr3(1), &[Ip(0x1000)], 7).expect("walker");
        let e = w.walk(500, 4).expect("walk");
        assert_eq!(e.insns()[0], Ip(0x1000));
        let mut all: Vec<u64> = e.insns().iter().map(|i| i.0).collect();
        all.extend(e.successor().map(|s| s.0));
        for pair in all.windows(2) {
            assert!(
                loop_successors(pair[0], w.known()).contains(&pair[1]),
                "{:#x} -> {:#x}",
                pair[0],
                pair[1]
            );
        }
        // Both outcomes of the first conditional branch were drawn, the
        // call target is known code, and the syscall never ran.
        assert!(all.contains(&0x1009) && all.contains(&0x1004));
        assert!(w.known().contains(&Ip(0x1010)));
        assert!(!all.contains(&0x100e));
        // Every instruction's bytes are in the execution's code.
        for ip in e.insns() {
            assert!(e.memory().bytes_at(*ip).is_some());
        }

        // The same seed walks the same way; another seed does not.
        let again = CodeWalker::new(&mem, Cr3(1), &[Ip(0x1000)], 7)
            .expect("walker")
            .walk(500, 4)
            .expect("walk");
        assert_eq!(again, e);
        let other = CodeWalker::new(&mem, Cr3(1), &[Ip(0x1000)], 8)
            .expect("walker")
            .walk(500, 4)
            .expect("walk");
        assert_ne!(other.insns(), e.insns());
    }

    #[test]
    fn a_stretch_stops_before_code_it_cannot_read() {
        // 2000: nop; nop; call 3000 (outside); the memory ends after it.
        let code = [0x90, 0x90, 0xe8, 0xf9, 0x0f, 0, 0];
        let mem = Spaces::default().add(2, 0x2000, &code);
        let mut w = CodeWalker::new(&mem, Cr3(2), &[Ip(0x2000)], 1).expect("walker");
        let e = w.walk(10, 2).expect("walk");
        assert_eq!(e.insns(), &[Ip(0x2000), Ip(0x2001)]);
        assert_eq!(e.successor(), Some(Ip(0x2002)));
        // The next stretch starts over at known code.
        assert_eq!(w.ip(), Ip(0x2000));

        // Code that can never go on is an error naming the space.
        let mem = Spaces::default().add(3, 0x2000, &[0x0f, 0x05]);
        let mut w = CodeWalker::new(&mem, Cr3(3), &[Ip(0x2000)], 1).expect("walker");
        assert!(matches!(
            w.walk(10, 2),
            Err(WalkError::Stuck { cr3: Cr3(3), .. })
        ));
        assert!(matches!(
            CodeWalker::new(&mem, Cr3(3), &[], 1),
            Err(WalkError::NoStart { cr3: Cr3(3) })
        ));
    }

    /// Two spaces with different code at the same address: each walked in
    /// its own, switching every 20 instructions; the trace joins the
    /// stretches with FUP, TIP.PGD, PIP (the next CR3), MODE.Exec and
    /// TIP.PGE, and every PSB+ names its stretch's CR3.
    #[test]
    fn switching_spaces_writes_a_pip_at_each_switch() {
        // Space 5: LOOP. Space 6 at the same address: nop; jmp back.
        let mem =
            Spaces::default()
                .add(0x5000, 0x1000, LOOP)
                .add(0x6000, 0x1000, &[0x90, 0xeb, 0xfd]);
        let config = WalkConfig {
            seed: 3,
            slice_len: 20,
            slices: 5,
            max_restarts: 4,
        };
        let starts = [
            (Cr3(0x5000), vec![Ip(0x1000)]),
            (Cr3(0x6000), vec![Ip(0x1000)]),
        ];
        let stretches = walk_spaces(&mem, &starts, &config).expect("walk");
        // Slices: consecutive stretches of one space, 20 instructions each.
        let mut slices: Vec<(u64, usize)> = Vec::new();
        for s in &stretches {
            match slices.last_mut() {
                Some((cr3, n)) if *cr3 == s.cr3.0 => *n += s.execution.len(),
                _ => slices.push((s.cr3.0, s.execution.len())),
            }
        }
        assert_eq!(
            slices,
            [
                (0x5000, 20),
                (0x6000, 20),
                (0x5000, 20),
                (0x6000, 20),
                (0x5000, 20)
            ]
        );
        // Space 6 only ever runs its own two instructions.
        for s in stretches.iter().filter(|s| s.cr3 == Cr3(0x6000)) {
            assert!(
                s.execution
                    .insns()
                    .iter()
                    .all(|i| [0x1000, 0x1001].contains(&i.0))
            );
        }
        // Where the space changes: (the stretch before, the one after).
        let switches_at: Vec<(&Stretch, &Stretch)> = stretches
            .windows(2)
            .filter(|w| w[0].cr3 != w[1].cr3)
            .map(|w| (&w[0], &w[1]))
            .collect();
        let pt = PtConfig {
            psb_period: 8,
            ..PtConfig::default()
        };
        let entry = Ip(0xffff_ffff_8100_0000);
        let trace = encode_switches(&stretches, pt, Some(entry)).expect("encode");
        assert_eq!(trace.switch_pips, 4);
        assert!(trace.psbs.len() > 1, "PSBs inside stretches too");
        // Each mark is a PSB and names an instruction of the walk.
        let total: usize = stretches.iter().map(|s| s.execution.len()).sum();
        for m in &trace.psbs {
            assert!(hwtrace_packet::is_psb_at(&trace.bytes, m.offset.0 as usize));
            assert!(m.insn_index < total);
        }
        assert_eq!(trace.psbs[0].insn_index, 0);

        let packets = reread(&trace.bytes, 0).expect("decodes");
        let mut in_psb = false;
        let mut cr3 = None;
        let mut switches = 0;
        for (i, (p, ip)) in packets.iter().enumerate() {
            match p {
                Packet::Psb => in_psb = true,
                Packet::Psbend => in_psb = false,
                Packet::Pip(pip) if in_psb => {
                    // PSB+ names the stretch running.
                    assert_eq!(Some(pip.cr3), cr3.or(Some(Cr3(0x5000))));
                }
                Packet::Pip(pip) => {
                    let (prev, s) = switches_at[switches];
                    assert_eq!(pip.cr3, s.cr3);
                    // FUP (where the previous stretch would have gone on),
                    // TIP.PGD (the handler), PIP, MODE.Exec, TIP.PGE.
                    assert!(
                        matches!(packets[i - 2], (Packet::Fup(_), ip) if ip == prev.execution.successor().map(|s| s.0))
                    );
                    assert!(matches!(packets[i - 1], (Packet::TipPgd(_), Some(e)) if e == entry.0));
                    assert!(matches!(
                        packets[i + 1].0,
                        Packet::ModeExec(ModeExec { csl: true, .. })
                    ));
                    assert_eq!(
                        packets[i + 2],
                        (packets[i + 2].0, Some(s.execution.insns()[0].0))
                    );
                    assert!(matches!(packets[i + 2].0, Packet::TipPge(_)));
                    cr3 = Some(pip.cr3);
                    switches += 1;
                }
                _ => {}
            }
            let _ = ip;
        }
        assert_eq!(switches, 4);
        // The last stretch ends as an execution cut short: FUP, TIP.PGD().
        let n = packets.len();
        assert!(matches!(packets[n - 1], (Packet::TipPgd(_), None)));
        assert!(matches!(packets[n - 2].0, Packet::Fup(_)));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// Arbitrary bytes as the code of two spaces: a walk never
            /// panics, and whatever it walks the encoder accepts (every
            /// transfer the walk makes is one the encoder can explain).
            #[test]
            fn any_walk_encodes(
                a in proptest::collection::vec(any::<u8>(), 16..256),
                b in proptest::collection::vec(any::<u8>(), 16..256),
                seed in any::<u64>(),
                compression in any::<bool>(),
            ) {
                let mem = Spaces::default().add(0x1000, 0x40_0000, &a).add(0x2000, 0x40_0000, &b);
                let config = WalkConfig { seed, slice_len: 50, slices: 4, max_restarts: 8 };
                let starts = [
                    (Cr3(0x1000), vec![Ip(0x40_0000), Ip(0x40_0007)]),
                    (Cr3(0x2000), vec![Ip(0x40_0000), Ip(0x40_0003)]),
                ];
                if let Ok(stretches) = walk_spaces(&mem, &starts, &config) {
                    let pt = PtConfig { return_compression: compression, psb_period: 40, ..PtConfig::default() };
                    let trace = encode_switches(&stretches, pt, None);
                    prop_assert!(trace.is_ok(), "{:?}", trace.err());
                }
            }
        }
    }
}
