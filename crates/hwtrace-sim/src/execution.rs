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
    #[error("reading the log failed: {0}")]
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
    /// executed instruction, as the CPU (and Intel PT) counts it.
    pub fn from_qemu_log(log: impl BufRead, limits: &Limits) -> Result<Execution, LogError> {
        parse_log(log, limits, None, &mut false).map(|p| p.execution)
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
/// set when it did.
pub(crate) fn parse_log(
    mut log: impl BufRead,
    limits: &Limits,
    end_marker: Option<&[u8]>,
    at_marker: &mut bool,
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
                if self.modes.last().map(|&(_, m)| m) != Some(mode) {
                    self.modes.push((self.insns.len(), mode));
                }
                self.insns.push(pc);
            }
        }
        Ok(Feed::More)
    }

    fn finish(mut self) -> Result<Execution, LogErrorKind> {
        if self.insns.is_empty() {
            return Err(LogErrorKind::Empty);
        }
        let memory = self.code.build()?;
        let (insns, modes) = fold_rep_iterations(&self.insns, &self.modes, &memory);
        self.insns = insns;
        Ok(Execution {
            insns: self.insns,
            modes,
            memory,
            successor: self.successor,
        })
    }
}

/// Folds consecutive repeats of a `REP`/`REPE`/`REPNE` string instruction
/// (one qemu block per iteration) into one instruction, remapping the mode
/// runs.
fn fold_rep_iterations(
    insns: &[Ip],
    modes: &[(usize, ExecMode)],
    memory: &CodeImage,
) -> (Vec<Ip>, Vec<(usize, ExecMode)>) {
    let mut out = Vec::with_capacity(insns.len());
    let mut out_modes = Vec::with_capacity(modes.len());
    let mut next_mode = modes.iter().peekable();
    let mut mode = ExecMode::Bits64;
    for (i, &ip) in insns.iter().enumerate() {
        while let Some(&&(start, m)) = next_mode.peek() {
            if start > i {
                break;
            }
            mode = m;
            next_mode.next();
        }
        if i > 0 && insns[i - 1] == ip && is_rep_string(memory, ip, mode) {
            continue;
        }
        if out_modes.last().map(|&(_, m)| m) != Some(mode) {
            out_modes.push((out.len(), mode));
        }
        out.push(ip);
    }
    (out, out_modes)
}

/// Whether the instruction at `ip` is a string instruction with a REP
/// prefix.
fn is_rep_string(memory: &CodeImage, ip: Ip, mode: ExecMode) -> bool {
    let Some(insn) = decode_at(memory, ip, mode) else {
        return false;
    };
    (insn.has_rep_prefix() || insn.has_repne_prefix()) && insn.is_string_instruction()
}

/// Decodes the instruction at `ip`, if its bytes are known and valid.
pub(crate) fn decode_at(memory: &CodeImage, ip: Ip, mode: ExecMode) -> Option<Instruction> {
    let bytes = memory.bytes_at(ip)?;
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
