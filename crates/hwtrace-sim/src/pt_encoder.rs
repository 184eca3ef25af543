//! The Intel PT a CPU would write for an execution.
//!
//! The simulated configuration is user-mode tracing:
//! `IA32_RTIT_CTL.TraceEn = 1, User = 1, OS = 0`, `BranchEn` as
//! [`PtConfig::branch_en`] says, a CR3 filter as [`PtConfig::cr3_filter`]
//! says, IP filter ranges as [`PtConfig::ip_filter`] says, `DisRETC` as
//! [`PtConfig::return_compression`] says, PSBs as often as
//! [`PtConfig::psb_period`] asks ([`PtConfig::psb_period_for_freq`] maps
//! PSBFreq), a TSC packet in each PSB+ with [`PtConfig::tsc`], and MTC,
//! CYC and CBR as [`PtConfig::timing`] says (the clocks are in
//! [`crate::clock`]).
//! Every executed instruction is classified with iced-x86 and produces what
//! SDM vol. 3C, chapter 33 ("Intel Processor Trace") says it produces: 33.2.1
//! "Change of Flow Instruction (COFI) Tracing", 33.4.2 "Packet Definitions"
//! (TNT 33.4.2.1, TIP 33.4.2.2, TIP.PGE 33.4.2.3, TIP.PGD 33.4.2.4, FUP
//! 33.4.2.5), and the table "Packet Generation under Different Enable
//! Conditions" at the end of the chapter:
//!
//! | instruction | packets |
//! |---|---|
//! | not a branch, direct JMP, direct CALL | none (the decoder follows the code) |
//! | conditional branch (Jcc, LOOPcc, JrCXZ) | one TNT bit, taken or not (33.2.1.1, 33.4.2.1) |
//! | near RET whose target is the youngest entry of the call stack, without DisRETC | one taken TNT bit: a compressed return (33.4.2.2, "Indirect Transfer Compression for Returns") |
//! | any other near RET, indirect JMP or CALL | TIP with the target (33.2.1.2, 33.4.2.2) |
//! | far JMP/CALL/RET, IRET staying in user mode | MODE.Exec if the mode changed, then TIP (33.2.1.3) |
//! | SYSCALL, SYSENTER | the kernel runs at CPL 0, which `OS = 0` filters out: TIP.PGD with the IP suppressed (33.4.2.4; 33.4.2.2 gives exactly this SYSCALL as the example of a suppressed IP) |
//! | INT n, INT3, INTO, INT1 | FUP with the interrupt instruction's own IP (CLIP), then TIP.PGD with the IP suppressed (the software-interrupt rows of the table "Packet Generation under Different Enable Conditions"). libipt reads the pair as a disable *before* the INT, so it does not report the INT itself |
//! | the first instruction back in user mode | MODE.Exec if the mode changed since the last one or none was written since the last PSB, then TIP.PGE with its IP (33.4.2.3) |
//!
//! Pending TNT bits are written before any TIP, TIP.PGD, FUP or PSB, so the
//! decoder meets the outcomes in execution order; a TNT packet is also
//! written as soon as it is full (6 bits short, 47 bits in TNT-64). This
//! encoder never defers TIPs ("Deferred TIPs" in 33.4.2.2 allows, never
//! requires, it).
//!
//! **PSB+** (33.4.2.17/18): the trace opens with PSB, (TSC), PSBEND, then
//! MODE.Exec and TIP.PGE at the first instruction. Later, whenever at least
//! `psb_period` bytes were written since the last PSB, the next instruction
//! boundary gets PSB, (TSC), MODE.Exec, FUP (the IP of the instruction about
//! to execute), PSBEND. MODE.Exec and FUP belong in a PSB+ only while
//! packets are enabled; real Skylake traces (`../shared/corpus/real/foo`)
//! show exactly this: PSB+ written outside the traced region hold neither,
//! and the next TIP.PGE is preceded by MODE.Exec. A PSB resets the last IP,
//! so the next IP packet is written uncompressed (33.4.2.2 "IP
//! Compression"), and it empties the call
//! stack: "only RETs that correspond to CALLs which have been seen since the
//! last PSB packet may be compressed" (33.2.1.2), which is what lets a
//! decoder start at any PSB.
//!
//! **IP filtering** ([`PtConfig::ip_filter`], 33.2.4.3 "Filtering by IP",
//! 33.2.5.5 "Filter Enable"): FilterEn is evaluated where a taken branch or
//! an event lands, not on straight-line flow. A taken branch from inside to
//! outside writes TIP.PGD instead of its own packet: with the target IP for
//! JMP, CALL, indirect branches, uncompressed RETs and far transfers, with
//! the IP suppressed for conditional branches and compressed RETs
//! (33.4.2.4). A branch, or a return from the kernel, landing inside writes
//! MODE.Exec? and TIP.PGE. Instructions run outside write nothing. libipt
//! 2.0.5 binds a suppressed TIP.PGD only to far branches (unless it is
//! given the filter and the SKL014 erratum), so it cannot follow a
//! conditional branch leaving a range; ranges that end between mapped
//! objects, as in the tests, never have one.
//!
//! **Call stack**: near CALLs push their next IP, except zero-length direct
//! CALLs (the `call next; pop` idiom of position-independent code), which
//! the SDM excludes, and CALLs that leave the IP filter (libipt does not
//! push a CALL its TIP.PGD binds to); 64 entries, the oldest pushed out. A
//! RET that is not compressed leaves the stack alone, as libipt's decoders
//! model it (they
//! pop only for compressed returns), so encoder and decoder stacks stay
//! equal.
//!
//! **End**: a program's last instruction is its `exit_group` SYSCALL, whose
//! TIP.PGD ends the trace. An execution cut short (see
//! [`Execution::successor`]) ends as if software had cleared TraceEn
//! there: FUP with the IP of the first instruction not traced, then TIP.PGD
//! with the IP suppressed, so a decoder stops exactly after the last
//! executed instruction. Real traces whose recorder stopped tracing this
//! way (`../shared/corpus/real/Unzip`) end each stretch with just this pair.
//!
//! **Timing** (33.3.7 "Timing Packets"): PSB+ is PSB, TSC?, TMA? (after
//! the TSC when MTCEn = 1), CBR? (with a core:bus ratio), PIP?, then
//! MODE.Exec and FUP while PacketEn = 1, PSBEND. MTC packets depend on
//! TriggerEn only: before each instruction, one MTC per CTC period that
//! began since the last (payload CTC[MTCFreq+7:MTCFreq]), traced region
//! or not; while PacketEn = 0, a PSB+ is written when they cross the PSB
//! period. CYC packets (CYCEn) are written only while PacketEn = 1, before
//! TNT, TIP, TIP.PGE, TIP.PGD, FUP, MODE.Exec and MTC outside PSB+, when
//! at least `2^(CYCThresh-1)` core cycles passed since the last CYC; they
//! carry the cycles since then, up to the start of the instruction being
//! encoded.
//!
//! **CR3 filter** (33.2.4.2 "Filtering by CR3"): the recorded program is
//! one process. If IA32_RTIT_CR3_MATCH is its CR3, ContextEn is 1 and
//! everything is traced as without the filter, with a PIP carrying the
//! CR3 in every PSB+ (33.4.2.7; NR = 0). Otherwise ContextEn stays 0: the
//! trace is the first PSB+ and timing packets (MTC and the PSB+ they make
//! due), nothing else.
//!
//! **BranchEn = 0** (33.2.5.1: `PacketEn = TriggerEn AND ContextEn AND
//! FilterEn AND BranchEn`): PacketEn never becomes 1, so no TNT, TIP,
//! TIP.PGE, TIP.PGD, FUP or MODE.Exec is written, and no CYC either (this
//! encoder writes CYC only while PacketEn = 1); PSB+ (without MODE.Exec
//! and FUP) and MTC packets remain.
//!
//! IP packets are compressed against the last IP as the hardware does
//! ([`hwtrace_packet::IpPayload::compress`], 33.4.2.2); a suppressed IP
//! leaves the last IP alone.

use std::collections::HashMap;

use hwtrace_packet::{ExecMode, IpPayload, ModeExec, Packet, Pip, Tnt, TraceBuilder};
use hwtrace_types::{Cr3, Ip, TraceOffset};
use iced_x86::{FlowControl, Instruction, Mnemonic};

use crate::clock::{Clock, Timing, TimingError};
use crate::execution::{Execution, decode_at};
use crate::state::{RetStack, TntBuffer};

/// What the simulated `IA32_RTIT_CTL` and friends ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtConfig {
    /// Compress returns (`DisRETC = 0`, the default). With `false`, every
    /// RET is a TIP.
    pub return_compression: bool,
    /// Bytes of trace between PSBs (the PSBFreq setting: the hardware
    /// offers 2 KiB · 2^n); must be at least 1.
    pub psb_period: u32,
    /// Write TNT-64 packets (up to 47 outcomes) instead of short TNT-8s
    /// (up to 6).
    pub long_tnt: bool,
    /// Put a TSC packet into each PSB+ (`TSCEn = 1`).
    pub tsc: Option<TscModel>,
    /// IP filter ranges (`ADDRn_CFG = 1`, `IA32_RTIT_ADDRn_A/B`); when any is
    /// set, only code inside one of them is traced. Up to four, as
    /// IA32_RTIT_CTL has ADDR0..ADDR3.
    pub ip_filter: [Option<IpRange>; 4],
    /// MTC, CYC and CBR (MTCEn/MTCFreq, CYCEn/CYCThresh) and the clock
    /// ratios behind them; see [`crate::clock`].
    pub timing: Timing,
    /// CR3 filtering (`CR3Filter = 1` with `IA32_RTIT_CR3_MATCH`).
    pub cr3_filter: Option<Cr3Filter>,
    /// `BranchEn`: with `false`, PacketEn never becomes 1 (33.2.5.1:
    /// `PacketEn = TriggerEn AND ContextEn AND FilterEn AND BranchEn`).
    pub branch_en: bool,
}

/// CR3 filtering of the one recorded process (SDM vol. 3C, 33.2.4.2
/// "Filtering by CR3"): ContextEn requires `CR3 == IA32_RTIT_CR3_MATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cr3Filter {
    /// IA32_RTIT_CR3_MATCH.
    pub cr3_match: Cr3,
    /// The CR3 the recorded process runs with (qemu-user has none, so the
    /// simulation is told).
    pub process_cr3: Cr3,
}

impl Cr3Filter {
    /// Whether the process's CR3 matches (bits 63:5 compared; 33.2.8.6:
    /// bits 4:0 of the MSR are reserved, and CR3's are flags).
    pub fn matches(&self) -> bool {
        self.cr3_match.0 & !0x1f == self.process_cr3.0 & !0x1f
    }
}

/// One IP filter range: `start..=end`, as ADDRn_A and ADDRn_B bound it
/// (SDM vol. 3C, 33.2.4.3 "Filtering by IP").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpRange {
    /// The first address inside (ADDRn_A).
    pub start: Ip,
    /// The last address inside (ADDRn_B).
    pub end: Ip,
}

impl IpRange {
    /// Whether `ip` is inside.
    pub fn contains(&self, ip: Ip) -> bool {
        self.start.0 <= ip.0 && ip.0 <= self.end.0
    }
}

impl PtConfig {
    /// FilterEn for code at `ip`: no range configured, or `ip` in one.
    pub fn filter_allows(&self, ip: Ip) -> bool {
        let mut ranges = self.ip_filter.iter().flatten().peekable();
        ranges.peek().is_none() || ranges.any(|r| r.contains(ip))
    }

    /// ContextEn (by CR3; User = 1 is modelled by the instructions being
    /// user mode) AND BranchEn: whether PacketEn can ever be 1.
    pub fn packets_possible(&self) -> bool {
        self.branch_en && self.cr3_filter.is_none_or(|f| f.matches())
    }

    /// The PSB period `IA32_RTIT_CTL.PSBFreq = n` asks for: a PSB+ every
    /// `2^(n+11)` bytes (SDM vol. 3C, 33.2.8.2; n is 4 bits), for
    /// [`PtConfig::psb_period`].
    pub fn psb_period_for_freq(psb_freq: u8) -> Option<u32> {
        (psb_freq <= 15).then(|| 1u32 << (psb_freq + 11))
    }
}

impl Default for PtConfig {
    /// Return compression on, a PSB every 4 KiB, short TNTs, no timing, no
    /// IP filter.
    fn default() -> Self {
        PtConfig {
            return_compression: true,
            psb_period: 4096,
            long_tnt: false,
            tsc: None,
            ip_filter: [None; 4],
            timing: Timing::default(),
            cr3_filter: None,
            branch_en: true,
        }
    }
}

/// A simple clock for TSC packets: the TSC at the first instruction, and
/// how many TSC ticks each instruction takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscModel {
    /// The TSC when the first instruction executes.
    pub start: u64,
    /// Ticks per executed instruction.
    pub ticks_per_insn: u64,
}

impl TscModel {
    /// The clock used for timing packets when no TSC model is configured
    /// (`TSCEn = 0`): starts at 0 and ticks once per instruction.
    pub const DEFAULT_CLOCK: TscModel = TscModel {
        start: 0,
        ticks_per_insn: 1,
    };

    fn at(&self, index: usize) -> u64 {
        // TSC packets carry 56 bits.
        self.start
            .wrapping_add(self.ticks_per_insn.wrapping_mul(index as u64))
            & ((1 << 56) - 1)
    }
}

/// Where a PSB was written and which instruction executes right after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsbMark {
    /// The offset of the PSB packet.
    pub offset: TraceOffset,
    /// The index (into [`Execution::insns`]) of the first instruction a
    /// decoder starting at this PSB will see.
    pub insn_index: usize,
}

/// Counts of what was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncodeStats {
    /// Conditional branches (TNT bits other than compressed returns).
    pub cond_branches: u64,
    /// Returns written as a taken TNT bit.
    pub compressed_returns: u64,
    /// Returns written as TIP.
    pub uncompressed_returns: u64,
    /// TIP packets (indirect branches, uncompressed returns, far transfers).
    pub tips: u64,
    /// TNT packets.
    pub tnt_packets: u64,
    /// TIP.PGE packets (tracing resumed in user mode).
    pub enables: u64,
    /// TIP.PGD packets (user mode left, or the trace end).
    pub disables: u64,
    /// PSB packets.
    pub psbs: u64,
    /// MTC packets.
    pub mtcs: u64,
    /// CYC packets.
    pub cycs: u64,
    /// CBR packets.
    pub cbrs: u64,
    /// TMA packets.
    pub tmas: u64,
    /// PIP packets.
    pub pips: u64,
}

/// A simulated trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedTrace {
    /// The trace bytes, as they would be in the output buffer.
    pub bytes: Vec<u8>,
    /// Every PSB, in order.
    pub psbs: Vec<PsbMark>,
    /// What was written.
    pub stats: EncodeStats,
}

/// Why an execution could not be encoded; `index` and `ip` name the
/// executed instruction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("instruction {index} at {ip}: {kind}")]
pub struct EncodeError {
    /// The index into [`Execution::insns`].
    pub index: usize,
    /// The instruction's address.
    pub ip: Ip,
    /// What was wrong.
    pub kind: EncodeErrorKind,
}

/// What was wrong with an executed instruction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeErrorKind {
    /// The execution's code image has no bytes there.
    #[error("no code bytes")]
    NoCode,
    /// The bytes there are not a valid instruction.
    #[error("the code bytes are not a valid instruction")]
    Undecodable,
    /// The next executed instruction is not one this instruction can go to
    /// (an asynchronous event such as a signal, which this encoder does
    /// not model).
    #[error("`{mnemonic}` cannot continue at {next} (asynchronous events are not modelled)")]
    UnexplainedTransfer {
        /// The instruction's mnemonic.
        mnemonic: String,
        /// Where execution went next.
        next: Ip,
    },
    /// The last instruction is a branch and nothing says where it went.
    #[error("`{mnemonic}` is the last instruction and its target is unknown")]
    NoSuccessor {
        /// The instruction's mnemonic.
        mnemonic: String,
    },
    /// An instruction whose trace this encoder does not produce (TSX, UD2
    /// and other faulting instructions).
    #[error("`{mnemonic}` is not supported")]
    Unsupported {
        /// The instruction's mnemonic.
        mnemonic: String,
    },
    /// A packet could not be encoded.
    #[error("cannot encode a packet: {0}")]
    Packet(hwtrace_packet::EncodeError),
    /// The timing configuration cannot be simulated.
    #[error("timing configuration: {0}")]
    Timing(TimingError),
}

/// How an instruction changes the flow, as far as PT is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Plain,
    Cond { target: u64 },
    Jump { target: u64 },
    Call { target: u64 },
    IndirectJump,
    IndirectCall,
    Return,
    Far,
    LeaveUser,
    SoftwareInterrupt,
    Unsupported,
}

#[derive(Debug, Clone, Copy)]
struct Decoded {
    len: u64,
    class: Class,
    mnemonic: Mnemonic,
}

fn classify(insn: &Instruction) -> Class {
    match insn.mnemonic() {
        Mnemonic::Syscall | Mnemonic::Sysenter => return Class::LeaveUser,
        Mnemonic::Retf | Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq => return Class::Far,
        _ => {}
    }
    if insn.is_jmp_far() || insn.is_jmp_far_indirect() || insn.is_call_far() {
        return Class::Far;
    }
    if insn.is_call_far_indirect() {
        return Class::Far;
    }
    match insn.flow_control() {
        FlowControl::Next => Class::Plain,
        FlowControl::ConditionalBranch => Class::Cond {
            target: insn.near_branch_target(),
        },
        FlowControl::UnconditionalBranch => Class::Jump {
            target: insn.near_branch_target(),
        },
        FlowControl::Call => Class::Call {
            target: insn.near_branch_target(),
        },
        FlowControl::IndirectBranch => Class::IndirectJump,
        FlowControl::IndirectCall => Class::IndirectCall,
        FlowControl::Return => Class::Return,
        FlowControl::Interrupt => Class::SoftwareInterrupt,
        FlowControl::XbeginXabortXend | FlowControl::Exception => Class::Unsupported,
    }
}

/// Turns executions into PT.
#[derive(Debug, Clone)]
pub struct PtEncoder {
    config: PtConfig,
}

impl PtEncoder {
    /// An encoder for `config`.
    pub fn new(config: PtConfig) -> Self {
        PtEncoder { config }
    }

    /// The configuration.
    pub fn config(&self) -> &PtConfig {
        &self.config
    }

    /// The trace a CPU would write while executing `execution`.
    pub fn encode(&self, execution: &Execution) -> Result<EncodedTrace, EncodeError> {
        let mut run = Run::new(self.config, execution);
        run.encode()?;
        Ok(EncodedTrace {
            bytes: run.out.finish(),
            psbs: run.psbs,
            stats: run.stats,
        })
    }
}

/// One encoding in progress.
struct Run<'e> {
    config: PtConfig,
    exec: &'e Execution,
    out: TraceBuilder,
    tnt: TntBuffer,
    calls: RetStack,
    /// PacketEn: in user mode and inside the IP filter.
    enabled: bool,
    /// The instruction about to execute was reached by a taken branch or
    /// an event, so FilterEn and ContextEn are evaluated for it (they are
    /// not on straight-line flow).
    evaluate: bool,
    /// The mode the last MODE.Exec reported.
    last_mode: Option<ExecMode>,
    /// Where the last PSB starts.
    psb_at: usize,
    psbs: Vec<PsbMark>,
    stats: EncodeStats,
    cache: HashMap<u64, Decoded>,
    /// The clocks behind TSC, TMA, MTC and CYC.
    clock: Clock,
    /// The instruction whose boundary packets are being written (time
    /// "now" for CYC).
    now: usize,
    /// `CTC >> MTCFreq` when the last MTC (or the PSB+ at the start) was
    /// written.
    mtc_period: u64,
    /// Core cycles at the last CYC (or the start).
    cyc_at: u64,
    /// Writing a PSB+ (no CYC inside it).
    in_psb: bool,
}

impl<'e> Run<'e> {
    fn new(config: PtConfig, exec: &'e Execution) -> Self {
        Run {
            config,
            exec,
            out: TraceBuilder::new(),
            tnt: TntBuffer::new(config.long_tnt),
            calls: RetStack::new(),
            enabled: false,
            evaluate: true,
            last_mode: None,
            psb_at: 0,
            psbs: Vec::new(),
            stats: EncodeStats::default(),
            cache: HashMap::new(),
            clock: Clock::new(config.tsc.unwrap_or(TscModel::DEFAULT_CLOCK), config.timing),
            now: 0,
            mtc_period: 0,
            cyc_at: 0,
            in_psb: false,
        }
    }

    fn encode(&mut self) -> Result<(), EncodeError> {
        let insns = self.exec.insns();
        let Some(&first) = insns.first() else {
            return Ok(());
        };
        self.config.timing.validate().map_err(|e| EncodeError {
            index: 0,
            ip: first,
            kind: EncodeErrorKind::Timing(e),
        })?;
        if let Some(freq) = self.config.timing.mtc_freq {
            self.mtc_period = self.clock.mtc_period(0, freq);
        }
        self.psb_plus(0, first, self.exec.mode_at(0))
            .map_err(|kind| EncodeError {
                index: 0,
                ip: first,
                kind,
            })?;
        let mut end = None;
        for (index, &ip) in insns.iter().enumerate() {
            end = self
                .step(index, ip)
                .map_err(|kind| EncodeError { index, ip, kind })?;
        }
        if let (true, Some(next)) = (self.enabled, end) {
            let last = insns.len() - 1;
            self.now = insns.len();
            self.mtc(insns.len()).map_err(|kind| EncodeError {
                index: last,
                ip: insns[last],
                kind,
            })?;
            self.finish(next).map_err(|kind| EncodeError {
                index: last,
                ip: insns[last],
                kind,
            })?;
        }
        Ok(())
    }

    /// Encodes instruction `index`; returns where execution went next
    /// (when known).
    fn step(&mut self, index: usize, ip: Ip) -> Result<Option<Ip>, EncodeErrorKind> {
        let mode = self.exec.mode_at(index);
        self.now = index;
        let timing_bytes = self.mtc(index)?;
        // While PacketEn = 0 only MTCs grow the byte count; a PSB+ is due
        // when they cross the period, as it is while tracing (33.4.2.17).
        let period = self.config.psb_period.max(1) as usize;
        if !self.enabled && timing_bytes && self.out.as_bytes().len() - self.psb_at >= period {
            self.psb_plus(index, ip, mode)?;
        }
        if !self.enabled
            && self.evaluate
            && self.config.packets_possible()
            && self.config.filter_allows(ip)
        {
            // PacketEn is 1 from here: a CYC may precede MODE.Exec.
            self.enabled = true;
            self.mode_exec(mode)?;
            self.ip_packet(Packet::TipPge, ip)?;
            self.stats.enables += 1;
        }
        if !self.enabled {
            return self.untraced_step(index, ip, mode);
        }
        if self.out.as_bytes().len() - self.psb_at >= period {
            self.psb_plus(index, ip, mode)?;
        }
        let d = self.decode(ip, mode)?;
        let fall = Ip(ip.0.wrapping_add(d.len));
        let next = self
            .exec
            .insns()
            .get(index + 1)
            .copied()
            .or(self.exec.successor());
        let unexplained = |next: Ip| EncodeErrorKind::UnexplainedTransfer {
            mnemonic: format!("{:?}", d.mnemonic).to_lowercase(),
            next,
        };
        let need_next = || {
            next.ok_or_else(|| EncodeErrorKind::NoSuccessor {
                mnemonic: format!("{:?}", d.mnemonic).to_lowercase(),
            })
        };
        let expect = |want: Ip| match next {
            Some(n) if n != want => Err(unexplained(n)),
            _ => Ok(Some(want)),
        };
        // A taken branch whose target is outside the IP filter clears
        // FilterEn: TIP.PGD replaces the branch's own packet, with the
        // target IP, or suppressed for conditional branches and compressed
        // RETs (33.4.2.4; the enable table's rows for Jcc, indirect and far
        // branches with PacketEn 1 -> 0).
        let config = self.config;
        let leaves = |n: Ip| !config.filter_allows(n);
        match d.class {
            Class::Plain => expect(fall),
            Class::Jump { target } => {
                let n = expect(Ip(target))?;
                if leaves(Ip(target)) {
                    self.leave_filter(Some(Ip(target)))?;
                }
                Ok(n)
            }
            Class::Call { target } => {
                let n = expect(Ip(target))?;
                if leaves(Ip(target)) {
                    self.leave_filter(Some(Ip(target)))?;
                } else if target != fall.0 {
                    // Zero-length calls are not pushed (33.4.2.2).
                    self.calls.push(fall);
                }
                Ok(n)
            }
            Class::Cond { target } => {
                let n = need_next()?;
                let taken = if n.0 == target {
                    true
                } else if n == fall {
                    false
                } else {
                    return Err(unexplained(n));
                };
                self.stats.cond_branches += 1;
                if taken && leaves(n) {
                    self.leave_filter(None)?;
                } else {
                    self.tnt_bit(taken)?;
                }
                Ok(Some(n))
            }
            Class::IndirectJump => {
                let n = need_next()?;
                self.tip_or_leave(n)?;
                Ok(Some(n))
            }
            Class::IndirectCall => {
                let n = need_next()?;
                if config.filter_allows(n) {
                    self.calls.push(fall);
                }
                self.tip_or_leave(n)?;
                Ok(Some(n))
            }
            Class::Return => {
                let n = need_next()?;
                if self.config.return_compression && self.calls.top() == Some(n) {
                    self.calls.pop();
                    self.stats.compressed_returns += 1;
                    if leaves(n) {
                        self.leave_filter(None)?;
                    } else {
                        self.tnt_bit(true)?;
                    }
                } else {
                    self.stats.uncompressed_returns += 1;
                    self.tip_or_leave(n)?;
                }
                Ok(Some(n))
            }
            Class::Far => {
                let n = need_next()?;
                self.flush_tnt()?;
                if leaves(n) {
                    self.leave_filter(Some(n))?;
                } else {
                    let next_mode = self.exec.mode_at(index + 1);
                    self.mode_exec(next_mode)?;
                    self.tip(n)?;
                }
                Ok(Some(n))
            }
            Class::LeaveUser | Class::SoftwareInterrupt => {
                self.flush_tnt()?;
                if d.class == Class::SoftwareInterrupt {
                    self.ip_packet(Packet::Fup, ip)?;
                }
                self.push(Packet::TipPgd(IpPayload::SUPPRESSED))?;
                self.stats.disables += 1;
                self.enabled = false;
                // Back in user mode, ContextEn and FilterEn are evaluated at
                // the return IP.
                self.evaluate = true;
                Ok(next)
            }
            Class::Unsupported => Err(EncodeErrorKind::Unsupported {
                mnemonic: format!("{:?}", d.mnemonic).to_lowercase(),
            }),
        }
    }

    /// An instruction executed while PacketEn is 0 (outside the IP
    /// filter): nothing is written and no CALL is remembered, but whether
    /// it transferred control decides whether FilterEn is evaluated at the
    /// next instruction.
    fn untraced_step(
        &mut self,
        index: usize,
        ip: Ip,
        mode: ExecMode,
    ) -> Result<Option<Ip>, EncodeErrorKind> {
        let d = self.decode(ip, mode)?;
        let fall = Ip(ip.0.wrapping_add(d.len));
        let next = self
            .exec
            .insns()
            .get(index + 1)
            .copied()
            .or(self.exec.successor());
        self.evaluate = match d.class {
            Class::Plain => false,
            Class::Cond { .. } => next != Some(fall),
            Class::Unsupported => {
                return Err(EncodeErrorKind::Unsupported {
                    mnemonic: format!("{:?}", d.mnemonic).to_lowercase(),
                });
            }
            _ => true,
        };
        Ok(next.or((d.class == Class::Plain).then_some(fall)))
    }

    /// TIP to `target`, or TIP.PGD with it when it is outside the filter.
    fn tip_or_leave(&mut self, target: Ip) -> Result<(), EncodeErrorKind> {
        if self.config.filter_allows(target) {
            self.tip(target)
        } else {
            self.leave_filter(Some(target))
        }
    }

    /// A branch left the IP filter: TIP.PGD with `target` (or suppressed).
    fn leave_filter(&mut self, target: Option<Ip>) -> Result<(), EncodeErrorKind> {
        match target {
            Some(ip) => self.ip_packet(Packet::TipPgd, ip)?,
            None => {
                self.flush_tnt()?;
                self.push(Packet::TipPgd(IpPayload::SUPPRESSED))?;
            }
        }
        self.stats.disables += 1;
        self.enabled = false;
        self.evaluate = true;
        Ok(())
    }

    /// Ends a trace that was cut short before `next` executed.
    fn finish(&mut self, next: Ip) -> Result<(), EncodeErrorKind> {
        self.flush_tnt()?;
        self.ip_packet(Packet::Fup, next)?;
        self.push(Packet::TipPgd(IpPayload::SUPPRESSED))?;
        self.stats.disables += 1;
        self.enabled = false;
        Ok(())
    }

    fn decode(&mut self, ip: Ip, mode: ExecMode) -> Result<Decoded, EncodeErrorKind> {
        if let Some(d) = self.cache.get(&ip.0) {
            return Ok(*d);
        }
        if self.exec.memory().bytes_at(ip).is_none() {
            return Err(EncodeErrorKind::NoCode);
        }
        let insn = decode_at(self.exec.memory(), ip, mode).ok_or(EncodeErrorKind::Undecodable)?;
        let d = Decoded {
            len: insn.len() as u64,
            class: classify(&insn),
            mnemonic: insn.mnemonic(),
        };
        self.cache.insert(ip.0, d);
        Ok(d)
    }

    /// PSB+ before instruction `index` at `ip`.
    fn psb_plus(&mut self, index: usize, ip: Ip, mode: ExecMode) -> Result<(), EncodeErrorKind> {
        self.flush_tnt()?;
        self.psb_at = self.out.as_bytes().len();
        self.psbs.push(PsbMark {
            offset: TraceOffset(self.psb_at as u64),
            insn_index: index,
        });
        self.stats.psbs += 1;
        self.in_psb = true;
        self.push(Packet::Psb)?;
        if let Some(tsc) = self.config.tsc {
            self.push(Packet::Tsc(tsc.at(index)))?;
            // TMA right after the TSC when MTCEn = 1 (33.4.2.12).
            if self.config.timing.mtc_freq.is_some() {
                self.push(Packet::Tma(self.clock.tma(index)))?;
                self.stats.tmas += 1;
            }
        }
        if let Some(cbr) = self.config.timing.cbr {
            self.push(Packet::Cbr(cbr))?;
            self.stats.cbrs += 1;
        }
        // PIP with the CR3 in PSB+ while tracing by CR3 (33.4.2.7; CR3
        // bits 51:5, NR = 0: no VMX).
        if let Some(f) = self.config.cr3_filter.filter(|f| f.matches()) {
            self.push(Packet::Pip(Pip {
                cr3: Cr3(f.process_cr3.0 & 0x000f_ffff_ffff_ffe0),
                nr: false,
            }))?;
            self.stats.pips += 1;
        }
        // MODE.Exec and FUP only while packets are enabled; otherwise the
        // MODE.Exec goes before the next TIP.PGE.
        self.last_mode = None;
        if self.enabled {
            self.mode_exec(mode)?;
            self.ip_packet(Packet::Fup, ip)?;
        }
        self.push(Packet::Psbend)?;
        self.in_psb = false;
        self.calls.clear();
        Ok(())
    }

    /// MTC packets for every CTC period that began since the last one,
    /// before instruction `index` (33.4.2.13: sent when CTC bit MTCFreq
    /// toggles, with CTC[MTCFreq+7:MTCFreq]). MTC depends on TriggerEn,
    /// not PacketEn, so it is written outside the traced region too.
    /// Returns whether any was written.
    fn mtc(&mut self, index: usize) -> Result<bool, EncodeErrorKind> {
        let Some(freq) = self.config.timing.mtc_freq else {
            return Ok(false);
        };
        let period = self.clock.mtc_period(index, freq);
        let wrote = self.mtc_period < period;
        while self.mtc_period < period {
            self.mtc_period += 1;
            self.cyc()?;
            self.push(Packet::Mtc(self.mtc_period as u8))?;
            self.stats.mtcs += 1;
        }
        Ok(wrote)
    }

    /// A CYC packet before a CYC-eligible packet (33.3.6 "Cycle-Accurate
    /// Mode"): written only while PacketEn = 1 and outside PSB+, before
    /// TNT, TIP, TIP.PGE, TIP.PGD, FUP, MODE.Exec and MTC, when at least
    /// the CYCThresh number of core cycles passed since the last CYC; it
    /// carries the cycles since then (time "now" is the start of the
    /// instruction being encoded).
    fn cyc(&mut self) -> Result<(), EncodeErrorKind> {
        let Some(threshold) = self.config.timing.cyc_threshold_cycles() else {
            return Ok(());
        };
        if self.in_psb || !self.enabled {
            return Ok(());
        }
        let now = self.clock.cycles(self.now);
        let elapsed = now.saturating_sub(self.cyc_at);
        if elapsed >= threshold {
            self.out
                .push(Packet::Cyc(elapsed))
                .map_err(EncodeErrorKind::Packet)?;
            self.stats.cycs += 1;
            self.cyc_at = now;
        }
        Ok(())
    }

    /// MODE.Exec, unless the last one (since the last PSB) said the same.
    fn mode_exec(&mut self, mode: ExecMode) -> Result<(), EncodeErrorKind> {
        if self.last_mode == Some(mode) {
            return Ok(());
        }
        let (csl, csd) = match mode {
            ExecMode::Bits16 => (false, false),
            ExecMode::Bits32 => (false, true),
            ExecMode::Bits64 => (true, false),
            ExecMode::Reserved => (true, true),
        };
        self.push(Packet::ModeExec(ModeExec {
            csl,
            csd,
            iflag: false,
        }))?;
        self.last_mode = Some(mode);
        Ok(())
    }

    fn tnt_bit(&mut self, taken: bool) -> Result<(), EncodeErrorKind> {
        if let Some(tnt) = self.tnt.push(taken) {
            self.tnt_packet(tnt)?;
        }
        Ok(())
    }

    fn flush_tnt(&mut self) -> Result<(), EncodeErrorKind> {
        if let Some(tnt) = self.tnt.flush() {
            self.tnt_packet(tnt)?;
        }
        Ok(())
    }

    fn tnt_packet(&mut self, tnt: Tnt) -> Result<(), EncodeErrorKind> {
        self.stats.tnt_packets += 1;
        self.push(Packet::Tnt(tnt))
    }

    fn tip(&mut self, target: Ip) -> Result<(), EncodeErrorKind> {
        self.flush_tnt()?;
        self.stats.tips += 1;
        self.ip_packet(Packet::Tip, target)
    }

    fn ip_packet(&mut self, make: fn(IpPayload) -> Packet, ip: Ip) -> Result<(), EncodeErrorKind> {
        self.flush_tnt()?;
        self.cyc()?;
        self.out
            .ip(make, ip.0)
            .map(|_| ())
            .map_err(EncodeErrorKind::Packet)
    }

    fn push(&mut self, packet: Packet) -> Result<(), EncodeErrorKind> {
        if matches!(
            packet,
            Packet::Tnt(_) | Packet::TipPgd(_) | Packet::ModeExec(_)
        ) {
            self.cyc()?;
        }
        self.out
            .push(packet)
            .map(|_| ())
            .map_err(EncodeErrorKind::Packet)
    }
}
