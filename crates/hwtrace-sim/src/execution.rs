//! A real execution: the instructions a program executed, in order, and the
//! code they ran over.
//!
//! # Where the code bytes come from
//!
//! qemu-user's `-d in_asm` prints the bytes of every instruction when it
//! translates it, before it runs (see [`crate::qemu_log`]). The code image of
//! an [`Execution`] is made of exactly those bytes: what the guest really
//! executed, at the address it executed them, whoever mapped them there
//! (the program, ld.so, libc, any other library, the vDSO, code generated at
//! run time). This was chosen over rebuilding the guest's memory map from
//! `-d page` (which names no files) or `-d strace` (which misses the program
//! and ld.so, mapped by qemu itself) and reading the mapped files: it needs
//! no knowledge of the loader, and it cannot go stale. The cost: bytes that
//! were never executed are absent, so a decoder that walks off the executed
//! path reads unmapped memory instead of wrong code, which is what a check
//! wants. Code that changes while the program runs (two different bytes at
//! one address) is refused with a [`CodeConflict`].
//!
//! # What an execution can be
//!
//! One thread of one process. A second guest thread shows up as a second
//! CPU index in the log and is refused ([`LogErrorKind::Threads`]). A child
//! process made by `fork` inherits qemu's log and would interleave its
//! instructions with the parent's under the same CPU index; that cannot be
//! told apart in the log, so record programs that do not fork (the encoder
//! then reports the first impossible transfer). Signals delivered to a
//! handler look like such a transfer too and are not modelled.

use std::collections::HashMap;
use std::io::BufRead;

use hwtrace_packet::ExecMode;
use hwtrace_types::Ip;
use iced_x86::{Decoder, DecoderOptions, Instruction};

use crate::memory::{CodeConflict, CodeImage, CodeImageBuilder};
use crate::qemu_log::{Line, LineError, parse_line};

/// How much of a log to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Stop after this many executed instructions (`None`: no limit). The
    /// instruction that ran next is kept as the execution's
    /// [`successor`](Execution::successor), so the trace can end exactly.
    pub max_instructions: Option<usize>,
    /// Give up recording after this long (`None`: wait for the program).
    /// Only [`record_qemu`](crate::QemuRecorder::record) uses it.
    pub timeout: Option<std::time::Duration>,
}

/// Why a log could not be read, and on which line (1-based).
#[derive(Debug, thiserror::Error)]
#[error("qemu log line {line}: {kind}")]
pub struct LogError {
    /// The 1-based line number (0: after the last line).
    pub line: u64,
    /// What was wrong.
    pub kind: LogErrorKind,
}

/// What was wrong with a log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogErrorKind {
    /// A line of ours that does not parse.
    #[error(transparent)]
    Line(#[from] LineError),
    /// Instructions of a second CPU (guest thread): their streams interleave
    /// in the log and one execution cannot hold them.
    #[error(
        "instructions of CPU {other} after CPU {first}: multi-threaded guests are not supported"
    )]
    Threads {
        /// The CPU index seen first.
        first: u32,
        /// The other one.
        other: u32,
    },
    /// A `Stopped execution` line for a block that was not the last one
    /// logged.
    #[error("`Stopped execution` before {pc}, but the last block logged was {last:?}")]
    StoppedMismatch {
        /// The block that did not run.
        pc: Ip,
        /// The last block logged.
        last: Option<Ip>,
    },
    /// Two listings disagree about the code at one address.
    #[error(transparent)]
    Code(#[from] CodeConflict),
    /// The log holds no executed instruction.
    #[error("no executed instruction in the log (was it written with `-d exec,nochain`?)")]
    Empty,
    /// Reading the log failed.
    #[error("reading the log failed")]
    Io(#[from] std::io::Error),
}

/// The executed instructions of one program run, in order, and the code
/// they ran over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    insns: Vec<Ip>,
    /// `(first instruction index, mode)` runs, by index; never empty when
    /// `insns` is not.
    modes: Vec<(usize, ExecMode)>,
    memory: CodeImage,
    successor: Option<Ip>,
}

impl Execution {
    /// An execution from its parts, for synthetic tests: every instruction
    /// in `mode`. `successor` is the instruction that ran after the last one,
    /// if the run went on.
    pub fn from_parts(
        insns: Vec<Ip>,
        mode: ExecMode,
        memory: CodeImage,
        successor: Option<Ip>,
    ) -> Self {
        Execution {
            insns,
            modes: vec![(0, mode)],
            memory,
            successor,
        }
    }

    /// Reads a qemu-user log written with `-singlestep -d exec,nochain,in_asm`
    /// (other `-d` items may be mixed in; their lines are skipped): the
    /// executed instructions from the `Trace` lines and the code from the
    /// `in_asm` listings. Reading stops at the end of `log` or at
    /// `limits.max_instructions`.
    ///
    /// qemu runs each iteration of a `REP` string instruction as a block of
    /// its own; consecutive repeats of such an instruction are folded into one
    /// executed instruction, as the CPU (and Intel PT) counts it, before
    /// the limit is applied.
    pub fn from_qemu_log(log: impl BufRead, limits: &Limits) -> Result<Execution, LogError> {
        parse_log(log, limits, None, &mut false, &mut |_| {}).map(|p| p.execution)
    }

    /// The executed instructions, in order.
    pub fn insns(&self) -> &[Ip] {
        &self.insns
    }

    /// The number of executed instructions.
    pub fn len(&self) -> usize {
        self.insns.len()
    }

    /// True if nothing was executed.
    pub fn is_empty(&self) -> bool {
        self.insns.is_empty()
    }

    /// The code the instructions ran over.
    pub fn memory(&self) -> &CodeImage {
        &self.memory
    }

    /// The instruction that executed right after the last one, when the
    /// execution was cut short (by [`Limits::max_instructions`]); `None` when
    /// the program ended.
    pub fn successor(&self) -> Option<Ip> {
        self.successor
    }

    /// The execution mode of instruction `index`.
    pub fn mode_at(&self, index: usize) -> ExecMode {
        let at = self.modes.partition_point(|&(start, _)| start <= index);
        at.checked_sub(1)
            .and_then(|i| self.modes.get(i))
            .map_or(ExecMode::Bits64, |&(_, mode)| mode)
    }
}

/// What [`parse_log`] read.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub(crate) execution: Execution,
    /// [`Limits::max_instructions`] was reached.
    pub(crate) limited: bool,
}

/// How many extra blocks to read past the limit looking for a successor
/// that is not a repeat of the last instruction (a `REP` string
/// instruction still iterating, or a jump to itself).
const MAX_REPEATS_PAST_LIMIT: usize = 1 << 20;

/// The parser behind [`Execution::from_qemu_log`]. Stops at a line equal to
/// `end_marker`, if given (the recorder's end-of-log line); `at_marker` is
/// set when it did. Every line that is not ours (other `-d` items) is
/// handed to `other`.
pub(crate) fn parse_log(
    mut log: impl BufRead,
    limits: &Limits,
    end_marker: Option<&[u8]>,
    at_marker: &mut bool,
    other: &mut dyn FnMut(&[u8]),
) -> Result<Parsed, LogError> {
    let mut state = ParseState::default();
    let mut buf = Vec::with_capacity(256);
    let mut line_no = 0u64;
    let limit = limits.max_instructions.unwrap_or(usize::MAX);
    loop {
        buf.clear();
        let n = log.read_until(b'\n', &mut buf).map_err(|e| LogError {
            line: line_no + 1,
            kind: e.into(),
        })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let raw = buf.strip_suffix(b"\n").unwrap_or(&buf);
        if end_marker == Some(raw) {
            *at_marker = true;
            break;
        }
        let err = |kind: LogErrorKind| LogError {
            line: line_no,
            kind,
        };
        let line = parse_line(raw, state.in_asm).map_err(|e| err(e.into()))?;
        if line == Line::Other {
            other(raw);
        }
        if state.feed(line).map_err(err)? == Feed::Done {
            break;
        }
        if !state.limit_reached && state.insns.len() >= limit {
            state.limit_reached = true;
        }
    }
    let limited = state.limit_reached;
    let execution = state.finish().map_err(|kind| LogError { line: 0, kind })?;
    Ok(Parsed { execution, limited })
}

#[derive(Debug, Default)]
struct ParseState {
    insns: Vec<Ip>,
    modes: Vec<(usize, ExecMode)>,
    code: CodeImageBuilder,
    cpu: Option<u32>,
    in_asm: bool,
    /// Set once the limit is reached: the first block after it.
    successor: Option<Ip>,
    limit_reached: bool,
    repeats_past_limit: usize,
    /// Whether the instruction at an address is a REP string instruction.
    rep_cache: HashMap<u64, bool>,
}

#[derive(Debug, PartialEq, Eq)]
enum Feed {
    More,
    Done,
}

impl ParseState {
    fn feed(&mut self, line: Line) -> Result<Feed, LogErrorKind> {
        match line {
            Line::AsmHeader => self.in_asm = true,
            Line::Code { addr, bytes } => self.code.add(addr, bytes.as_slice())?,
            Line::Other => self.in_asm = false,
            Line::Stopped { pc } => {
                self.in_asm = false;
                if self.insns.last() != Some(&pc) {
                    return Err(LogErrorKind::StoppedMismatch {
                        pc,
                        last: self.insns.last().copied(),
                    });
                }
                self.insns.pop();
                if self
                    .modes
                    .last()
                    .is_some_and(|&(i, _)| i >= self.insns.len())
                {
                    self.modes.pop();
                }
            }
            Line::Exec { cpu, pc, mode } => {
                self.in_asm = false;
                match self.cpu {
                    None => self.cpu = Some(cpu),
                    Some(first) if first != cpu => {
                        return Err(LogErrorKind::Threads { first, other: cpu });
                    }
                    Some(_) => {}
                }
                if self.limit_reached {
                    // Looking for the successor: repeats of the last
                    // instruction still belong to the execution.
                    if self.insns.last() != Some(&pc)
                        || self.repeats_past_limit >= MAX_REPEATS_PAST_LIMIT
                    {
                        self.successor = Some(pc).filter(|&p| self.insns.last() != Some(&p));
                        return Ok(Feed::Done);
                    }
                    self.repeats_past_limit += 1;
                }
                if self.insns.last() == Some(&pc) && self.is_rep_string(pc, mode) {
                    // Another iteration of the same REP instruction.
                    return Ok(Feed::More);
                }
                if self.modes.last().map(|&(_, m)| m) != Some(mode) {
                    self.modes.push((self.insns.len(), mode));
                }
                self.insns.push(pc);
            }
        }
        Ok(Feed::More)
    }

    /// Whether the instruction at `pc` (whose listing came before its first
    /// execution) is a string instruction with a REP prefix.
    fn is_rep_string(&mut self, pc: Ip, mode: ExecMode) -> bool {
        if let Some(&known) = self.rep_cache.get(&pc.0) {
            return known;
        }
        let mut buf = [0u8; 15];
        let n = self.code.peek(pc, &mut buf);
        let rep = decode_bytes(&buf[..n], pc, mode).is_some_and(|i| {
            (i.has_rep_prefix() || i.has_repne_prefix()) && i.is_string_instruction()
        });
        self.rep_cache.insert(pc.0, rep);
        rep
    }

    fn finish(self) -> Result<Execution, LogErrorKind> {
        if self.insns.is_empty() {
            return Err(LogErrorKind::Empty);
        }
        Ok(Execution {
            insns: self.insns,
            modes: self.modes,
            memory: self.code.build()?,
            successor: self.successor,
        })
    }
}

/// Decodes the instruction at `ip`, if its bytes are known and valid.
pub(crate) fn decode_at(memory: &CodeImage, ip: Ip, mode: ExecMode) -> Option<Instruction> {
    decode_bytes(memory.bytes_at(ip)?, ip, mode)
}

/// Decodes one instruction at `ip` from `bytes`.
fn decode_bytes(bytes: &[u8], ip: Ip, mode: ExecMode) -> Option<Instruction> {
    let bitness = match mode {
        ExecMode::Bits16 => 16,
        ExecMode::Bits32 => 32,
        ExecMode::Bits64 | ExecMode::Reserved => 64,
    };
    let bytes = &bytes[..bytes.len().min(15)];
    let mut decoder = Decoder::with_ip(bitness, bytes, ip.0, DecoderOptions::NONE);
    let insn = decoder.decode();
    (!insn.is_invalid()).then_some(insn)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log in qemu 7.2's format: `IN:` listings before first execution,
    /// `Trace` lines per executed block, and lines of other `-d` items.
    fn trace(pc: u64) -> String {
        format!("Trace 0: 0x7f0000000100 [0000000000000000/{pc:016x}/0040c0b3/00000201] \n")
    }

    fn listing(addr: u64, bytes: &str, text: &str) -> String {
        format!("----------------\nIN: \n0x{addr:08x}:  {bytes:<24} {text}\n\n")
    }

    fn parse(log: &str, limits: Limits) -> Result<Execution, LogError> {
        Execution::from_qemu_log(log.as_bytes(), &limits)
    }

    #[test]
    fn instructions_code_and_mode_from_a_log() {
        let mut log = String::from("page layout changed following binary load\n");
        log += &listing(0x401000, "48 89 e7", "movq %rsp, %rdi");
        log += &trace(0x401000);
        log += &listing(0x401003, "f3 48 a5", "rep movsq");
        // One block per REP iteration: folded into one instruction.
        for _ in 0..3 {
            log += &trace(0x401003);
        }
        log += &listing(0x401006, "eb fe", "jmp 0x401006");
        // A jump to itself is executed twice, not folded.
        log += &trace(0x401006);
        log += &trace(0x401006);
        let e = parse(&log, Limits::default()).unwrap();
        assert_eq!(
            e.insns(),
            &[Ip(0x401000), Ip(0x401003), Ip(0x401006), Ip(0x401006)]
        );
        assert_eq!(e.mode_at(3), ExecMode::Bits64);
        assert_eq!(e.successor(), None);
        assert_eq!(e.memory().segments().len(), 1);
        assert_eq!(e.memory().segments()[0].bytes.len(), 8);
    }

    #[test]
    fn a_stopped_block_is_taken_back() {
        let mut log = listing(0x1000, "90", "nop");
        log += &trace(0x1000);
        log += "Stopped execution of TB chain before 0x7f0000000100 [0000000000001000] \n";
        log += &trace(0x1000);
        let e = parse(&log, Limits::default()).unwrap();
        assert_eq!(e.insns(), &[Ip(0x1000)]);

        let bad = format!(
            "{}{}",
            trace(0x1000),
            "Stopped execution of TB chain before 0x7f00 [2000]\n"
        );
        let err = parse(&bad, Limits::default()).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(matches!(
            err.kind,
            LogErrorKind::StoppedMismatch {
                pc: Ip(0x2000),
                last: Some(Ip(0x1000))
            }
        ));
    }

    #[test]
    fn the_limit_keeps_the_next_instruction_as_successor() {
        let mut log = listing(0x1000, "90", "nop");
        log += &listing(0x1001, "90", "nop");
        for pc in [0x1000, 0x1001, 0x1000, 0x1001] {
            log += &trace(pc);
        }
        let limits = Limits {
            max_instructions: Some(2),
            ..Limits::default()
        };
        let e = parse(&log, limits).unwrap();
        assert_eq!(e.insns(), &[Ip(0x1000), Ip(0x1001)]);
        assert_eq!(e.successor(), Some(Ip(0x1000)));
    }

    #[test]
    fn errors_name_the_line() {
        let log = format!("{}Trace 0: 0x7f00 [0/12g4/0/0]\n", trace(0x1000));
        let err = parse(&log, Limits::default()).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(
            err.to_string().starts_with("qemu log line 2: field `pc`"),
            "{err}"
        );

        let log = format!("{}Trace 1: 0x7f00 [0/2000/0/0]\n", trace(0x1000));
        let err = parse(&log, Limits::default()).unwrap_err();
        assert!(matches!(
            err.kind,
            LogErrorKind::Threads { first: 0, other: 1 }
        ));

        let log = format!(
            "{}{}",
            listing(0x1000, "90", "nop"),
            listing(0x1000, "cc", "int3")
        );
        let err = parse(&log, Limits::default()).unwrap_err();
        assert!(matches!(
            err.kind,
            LogErrorKind::Code(CodeConflict {
                addr: Ip(0x1000),
                ..
            })
        ));

        let err = parse("nothing here\n", Limits::default()).unwrap_err();
        assert!(matches!(err.kind, LogErrorKind::Empty));
    }

    #[test]
    fn mode_runs_follow_the_flags() {
        let mut log = listing(0x1000, "90", "nop");
        log += &trace(0x1000);
        // HF_CS64 clear, HF_CS32 set: 32-bit code.
        log += "Trace 0: 0x7f00 [0000000000000000/0000000000001000/000000b3/00000201] \n";
        let e = parse(&log, Limits::default()).unwrap();
        assert_eq!(e.mode_at(0), ExecMode::Bits64);
        assert_eq!(e.mode_at(1), ExecMode::Bits32);
    }
}
