//! What can go wrong reconstructing the flow, and where.

use core::fmt;
use hwtrace_types::TraceOffset;

/// Why decoding stopped.
///
/// The Display texts are the words of Intel's reference decoder (libipt's
/// `pt_errstr`) so that a compatible front-end prints the same diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An inconsistency inside the decoder.
    Internal,
    /// The decoder is not synchronised (call `sync_forward`).
    NoSync,
    /// A byte that starts no known packet.
    BadOpcode,
    /// A packet with a reserved or impossible payload.
    BadPacket,
    /// A packet where the trace grammar allows none of its kind.
    BadContext,
    /// The end of the trace.
    Eos,
    /// The trace does not give what the code needs here (a TNT bit for a
    /// conditional branch, a TIP for an indirect one).
    BadQuery,
    /// Too many pending events (corrupt trace).
    NoMemory,
    /// The configuration cannot be used.
    BadConfig,
    /// An IP was needed but none was known.
    NoIp,
    /// An IP was needed but the packet suppressed it.
    IpSuppressed,
    /// No memory image covers the address.
    NoMap,
    /// The bytes at the address are no instruction.
    BadInsn,
    /// No timing information.
    NoTime,
    /// No core:bus ratio.
    NoCbr,
    /// A compressed return with an empty return stack.
    RetStackEmpty,
    /// A compressed return whose TNT bit says not taken.
    BadRetComp,
    /// A status packet in PSB+ contradicts the decoder's state.
    BadStatusUpdate,
    /// An instruction was asked for while tracing is disabled.
    NoEnable,
    /// A counter overflowed.
    Overflow,
    /// `--cpu` names a processor without an errata entry.
    BadCpu,
    /// Millions of instructions ran without needing any trace (a loop of
    /// direct jumps): the decoder stops instead of running forever.
    NoProgress,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Internal => "internal error",
            Self::NoSync => "decoder out of sync",
            Self::BadOpcode => "unknown opcode",
            Self::BadPacket => "unknown packet",
            Self::BadContext => "unexpected packet context",
            Self::Eos => "reached end of trace stream",
            Self::BadQuery => "trace stream does not match query",
            Self::NoMemory => "out of memory",
            Self::BadConfig => "bad configuration",
            Self::NoIp => "no ip",
            Self::IpSuppressed => "ip has been suppressed",
            Self::NoMap => "no memory mapped at this address",
            Self::BadInsn => "unknown instruction",
            Self::NoTime => "no timing information",
            Self::NoCbr => "no core:bus ratio",
            Self::RetStackEmpty => "compressed return without call",
            Self::BadRetComp => "bad compressed return",
            Self::BadStatusUpdate => "bad status update",
            Self::NoEnable => "expected tracing enabled event",
            Self::Overflow => "overflow",
            Self::BadCpu => "unknown cpu",
            Self::NoProgress => "no trace for too many instructions",
        })
    }
}

impl core::error::Error for ErrorKind {}

/// A decoding failure: what, at which trace offset, and at which IP (when
/// the instruction layer knows one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    /// The offset of the packet being processed.
    pub offset: TraceOffset,
    /// The instruction pointer the decoder was at, if any.
    pub ip: Option<u64>,
    /// What went wrong.
    pub kind: ErrorKind,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            Some(ip) => write!(f, "{:#x}, ip {ip:#x}: {}", self.offset.0, self.kind),
            None => write!(f, "{:#x}: {}", self.offset.0, self.kind),
        }
    }
}

impl core::error::Error for Error {}

impl From<hwtrace_packet::DecodeErrorKind> for ErrorKind {
    fn from(e: hwtrace_packet::DecodeErrorKind) -> Self {
        use hwtrace_packet::DecodeErrorKind as K;
        match e {
            K::Truncated { .. } | K::NoPsb | K::OutOfBounds => Self::Eos,
            K::UnknownOpcode { .. } | K::UnknownExtOpcode { .. } | K::UnknownExt2Opcode { .. } => {
                Self::BadOpcode
            }
            K::NotSynced | K::NotPsb => Self::NoSync,
            _ => Self::BadPacket,
        }
    }
}
