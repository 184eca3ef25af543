//! [`BlockDecoder`]: the executed instructions grouped into blocks.
//!
//! A block is a run of instructions executed one after the other that
//! ends where the trace is needed to know what comes next (a conditional
//! or indirect branch, a return, a far transfer), where an event binds, or
//! where the trace ends. Direct calls and jumps stay inside a block unless
//! the configuration asks to end blocks there (libipt's `end_on_call`,
//! `end_on_jump`).

use super::classify::InsnClass;
use super::decoder::{Insn, InsnDecoder};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use crate::event::{Event, Status};
use hwtrace_packet::ExecMode;
use hwtrace_types::{ReadMemory, TraceOffset};

/// The most instructions one block holds.
pub const MAX_BLOCK_INSNS: usize = u16::MAX as usize;

/// Whether an instruction of `class` (`direct`: with a known target) ends
/// a block under `config`.
pub const fn ends_block(class: InsnClass, direct: bool, config: &Config) -> bool {
    match class {
        InsnClass::Other | InsnClass::Ptwrite => false,
        InsnClass::Call => !direct || config.end_on_call,
        InsnClass::Jump => !direct || config.end_on_jump,
        _ => true,
    }
}

/// A run of executed instructions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Block {
    /// The instructions, in execution order (at least one).
    pub insns: Vec<Insn>,
}

impl Block {
    /// The first instruction's address.
    pub fn ip(&self) -> u64 {
        self.insns.first().map_or(0, |i| i.ip)
    }

    /// The last instruction's address.
    pub fn end_ip(&self) -> u64 {
        self.insns.last().map_or(0, |i| i.ip)
    }

    /// The execution mode.
    pub fn mode(&self) -> Option<ExecMode> {
        self.insns.first().and_then(|i| i.mode)
    }

    /// Whether the block ran inside a transaction.
    pub fn speculative(&self) -> bool {
        self.insns.first().is_some_and(|i| i.speculative)
    }

    /// The class of the last instruction.
    pub fn end_class(&self) -> InsnClass {
        self.insns.last().map_or(InsnClass::Unknown, |i| i.class)
    }
}

/// One step of [`BlockDecoder::next`].
#[derive(Debug, PartialEq, Eq)]
pub enum BlockStep<'b> {
    /// A block of instructions.
    Block(&'b Block),
    /// An event between blocks.
    Event(Event),
}

/// Groups the instruction decoder's output into [`Block`]s.
///
/// The block buffer is reused, so decoding allocates only while blocks
/// grow beyond any seen before.
#[derive(Debug)]
pub struct BlockDecoder<'a, M> {
    dec: InsnDecoder<'a, M>,
    config: Config,
    block: Block,
    last: Status,
    /// An error found after the instructions of the block just returned.
    pending: Option<Error>,
}

impl<'a, M: ReadMemory> BlockDecoder<'a, M> {
    /// A decoder over `trace`, reading code from `mem`.
    pub fn new(trace: &'a [u8], config: Config, mem: M) -> Self {
        Self {
            dec: InsnDecoder::new(trace, config, mem),
            config,
            block: Block::default(),
            last: Status::default(),
            pending: None,
        }
    }

    /// The instruction decoder underneath.
    pub fn insn_decoder(&self) -> &InsnDecoder<'a, M> {
        &self.dec
    }

    /// The offset of the packet being processed.
    pub fn offset(&self) -> TraceOffset {
        self.dec.offset()
    }

    /// The offset of the last PSB synchronised to.
    pub fn sync_offset(&self) -> Option<TraceOffset> {
        self.dec.sync_offset()
    }

    /// Synchronises at the next PSB.
    pub fn sync_forward(&mut self) -> Result<(), Error> {
        self.pending = None;
        self.last = self.dec.sync_forward()?;
        Ok(())
    }

    /// The next block or event; `Ok(None)` at the end of the trace. After
    /// an error, call [`sync_forward`](Self::sync_forward) to go on. An
    /// error found after some instructions comes after their block.
    #[allow(
        clippy::should_implement_trait,
        reason = "the decoder verb of every layer; the block is lent, which Iterator cannot do"
    )]
    pub fn next(&mut self) -> Result<Option<BlockStep<'_>>, Error> {
        if let Some(e) = self.pending.take() {
            return Err(e);
        }
        if self.last.event_pending {
            let (ev, status) = self.dec.event()?;
            self.last = status;
            return Ok(Some(BlockStep::Event(ev)));
        }
        if self.last.eos {
            return Ok(None);
        }
        self.block.insns.clear();
        loop {
            let mut insn = Insn::empty(0, None, false);
            match self.dec.next_insn(&mut insn) {
                Ok(status) => {
                    self.last = status;
                    self.block.insns.push(insn);
                    if status.event_pending
                        || status.eos
                        || ends_block(insn.class, insn.target.is_some(), &self.config)
                        || self.block.insns.len() >= MAX_BLOCK_INSNS
                    {
                        break;
                    }
                }
                Err(e) => {
                    if insn.class != InsnClass::Unknown {
                        self.block.insns.push(insn);
                    }
                    if e.kind == ErrorKind::Eos {
                        self.last.eos = true;
                    } else {
                        self.pending = Some(Error {
                            ip: Some(insn.ip),
                            ..e
                        });
                    }
                    if self.block.insns.is_empty() {
                        return match self.pending.take() {
                            Some(e) => Err(e),
                            None => Ok(None),
                        };
                    }
                    break;
                }
            }
        }
        Ok(Some(BlockStep::Block(&self.block)))
    }
}
