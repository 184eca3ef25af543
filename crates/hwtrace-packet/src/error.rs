//! What can go wrong decoding or encoding a packet, and where.

use crate::packet::PacketKind;
use core::fmt;
use hwtrace_types::TraceOffset;

/// A decoding failure at a byte offset of the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// Where the offending packet (or search) starts.
    pub offset: TraceOffset,
    /// What was wrong.
    pub kind: DecodeErrorKind,
}

/// What was wrong with the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The first byte is no PT opcode.
    UnknownOpcode {
        /// The byte.
        opcode: u8,
    },
    /// `02` followed by a byte that is no extended opcode.
    UnknownExtOpcode {
        /// The second byte.
        ext: u8,
    },
    /// `02 C3` followed by a byte that is no second-level extended opcode.
    UnknownExt2Opcode {
        /// The third byte.
        ext2: u8,
    },
    /// A known packet with a field value the SDM reserves.
    Reserved {
        /// The packet.
        packet: PacketKind,
        /// The field and value, in words.
        what: &'static str,
    },
    /// `02 82` that is not followed by the rest of the PSB pattern.
    BadPsb,
    /// A CYC packet longer than any counter value needs.
    CycTooLong,
    /// The trace ends inside a packet.
    Truncated {
        /// The packet, when its opcode was complete.
        packet: Option<PacketKind>,
        /// How many bytes the packet needs.
        needed: u8,
        /// How many bytes were left.
        available: u8,
    },
    /// No PSB found where one was searched for.
    NoPsb,
    /// The decoder was asked to sync at an offset that holds no PSB.
    NotPsb,
    /// An offset beyond the end of the trace.
    OutOfBounds,
    /// The decoder has not been synchronised to a PSB yet.
    NotSynced,
}

impl DecodeErrorKind {
    /// Whether this error means the input simply ended (more data could
    /// complete it), as opposed to bytes that can never be valid.
    pub const fn is_end_of_trace(&self) -> bool {
        matches!(self, Self::Truncated { .. } | Self::NoPsb)
    }
}

impl fmt::Display for DecodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownOpcode { opcode } => write!(f, "unknown opcode {opcode:#04x}"),
            Self::UnknownExtOpcode { ext } => write!(f, "unknown extended opcode 02 {ext:02x}"),
            Self::UnknownExt2Opcode { ext2 } => {
                write!(f, "unknown extended opcode 02 c3 {ext2:02x}")
            }
            Self::Reserved { packet, what } => write!(f, "{packet} packet with reserved {what}"),
            Self::BadPsb => f.write_str("incomplete psb pattern"),
            Self::CycTooLong => f.write_str("cyc packet longer than 15 payload bytes"),
            Self::Truncated {
                packet: Some(p),
                needed,
                available,
            } => {
                write!(
                    f,
                    "trace ends inside a {p} packet ({available} of {needed} bytes)"
                )
            }
            Self::Truncated {
                packet: None,
                needed,
                available,
            } => {
                write!(
                    f,
                    "trace ends inside a packet's opcode ({available} of {needed} bytes)"
                )
            }
            Self::NoPsb => f.write_str("no psb found"),
            Self::NotPsb => f.write_str("no psb at this offset"),
            Self::OutOfBounds => f.write_str("offset beyond the end of the trace"),
            Self::NotSynced => f.write_str("decoder not synchronised"),
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at trace offset {:#x}: {}", self.offset.0, self.kind)
    }
}

impl core::error::Error for DecodeError {}

/// An encoding failure: the packet cannot be written as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is smaller than the packet.
    BufferTooSmall {
        /// Bytes the packet needs.
        needed: usize,
    },
    /// A field does not fit its packet's encoding.
    FieldOutOfRange {
        /// The packet.
        packet: PacketKind,
        /// The field.
        field: &'static str,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BufferTooSmall { needed } => {
                write!(f, "output buffer too small: packet needs {needed} bytes")
            }
            Self::FieldOutOfRange { packet, field } => {
                write!(f, "{packet} field {field} out of range")
            }
        }
    }
}

impl core::error::Error for EncodeError {}
