//! Errors of the perf.data reader: `Error { offset, kind }`, the offset being
//! where in the file the offending structure starts.

use thiserror::Error;

use crate::pevent::record::ErrorKind as RecordErrorKind;

/// A byte offset into a perf.data file (or pipe stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileOffset(pub u64);

impl core::fmt::Display for FileOffset {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// What was wrong.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file does not start with `PERFILE2`.
    #[error("bad magic {found:#018x} (not a perf.data file, or a big-endian/v1 one)")]
    BadMagic {
        /// The first eight bytes, little-endian.
        found: u64,
    },
    /// A structure runs past the end of the input.
    #[error("{what}: needs {needed} bytes, {available} left")]
    Truncated {
        /// The structure.
        what: &'static str,
        /// Bytes it needs.
        needed: u64,
        /// Bytes that are there.
        available: u64,
    },
    /// A `perf_file_section` points outside the file.
    #[error("{what} section [{offset:#x}, +{size:#x}) lies outside the {file_len:#x}-byte file")]
    SectionOutOfBounds {
        /// Which section.
        what: &'static str,
        /// Its offset.
        offset: u64,
        /// Its size.
        size: u64,
        /// The file size.
        file_len: u64,
    },
    /// The header's `size` or `attr_size` is not one the format allows.
    #[error("{what} {value} is not a valid size")]
    BadSize {
        /// Which size field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A kernel record's body (as libipt-sb parses it) is malformed.
    #[error("{0}")]
    Record(RecordErrorKind),
    /// A user-space record (types 64 and up) is shorter than its fixed part.
    #[error("record type {record_type}: size {size} is shorter than the {needed} bytes it needs")]
    RecordTooShort {
        /// The record type.
        record_type: u32,
        /// What the fixed part needs.
        needed: usize,
        /// `header.size`.
        size: u16,
    },
    /// A SAMPLE record ends inside a field `sample_type` asked for.
    #[error("sample record: field {field} needs {needed} bytes beyond the {size}-byte record")]
    SampleTooShort {
        /// The field.
        field: &'static str,
        /// Bytes needed from the start of the record.
        needed: u64,
        /// `header.size`.
        size: u16,
    },
    /// An AUXTRACE record's payload runs past the end of the data section.
    #[error("AUXTRACE payload of {size:#x} bytes: only {available:#x} left in the data section")]
    AuxtracePayload {
        /// The payload size the record announces.
        size: u64,
        /// Bytes left in the data section.
        available: u64,
    },
    /// A feature section is malformed.
    #[error("feature {feature} ({name}): {reason}")]
    Feature {
        /// The feature number (`HEADER_*`).
        feature: u32,
        /// Its name.
        name: &'static str,
        /// What was wrong.
        reason: &'static str,
    },
    /// A pipe-mode stream has no attribute for a record that needs one.
    #[error("no event attribute (HEADER_ATTR) before the first sample")]
    NoAttr,
    /// A record inside a COMPRESSED record is malformed; the error's
    /// offset is the COMPRESSED record's.
    #[error("in the decompressed stream at +{stream_offset:#x}: {kind}")]
    InCompressed {
        /// Where in the decompressed stream (all COMPRESSED records of
        /// the file, decoded and concatenated) the inner record starts.
        stream_offset: u64,
        /// What was wrong with it.
        kind: Box<ErrorKind>,
    },
    /// libzstd refused the compressed bytes.
    #[error("zstd: {reason}")]
    Zstd {
        /// libzstd's error name.
        reason: &'static str,
    },
    /// A COMPRESSED record expands to more than the ring buffer perf
    /// compressed it from (`HEADER_COMPRESSED.mmap_len`).
    #[error("COMPRESSED record expands to more than {limit:#x} bytes")]
    CompressedTooLarge {
        /// The limit.
        limit: u64,
    },
    /// `HEADER_COMPRESSED` names a compression other than zstd.
    #[error("compression type {kind} is not zstd (1)")]
    UnsupportedCompression {
        /// `comp_type`.
        kind: u32,
    },
    /// A record type perf never puts inside COMPRESSED data (AUXTRACE,
    /// whose payload follows the record; COMPRESSED itself).
    #[error("record type {record_type} inside a COMPRESSED record")]
    NotAllowedInCompressed {
        /// The record type.
        record_type: u32,
    },
}

/// A perf.data error: where and what.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("perf.data offset {offset}: {kind}")]
pub struct Error {
    /// Where the offending structure starts.
    pub offset: FileOffset,
    /// What was wrong.
    pub kind: ErrorKind,
}

impl Error {
    pub(crate) fn at(offset: u64, kind: ErrorKind) -> Self {
        Self {
            offset: FileOffset(offset),
            kind,
        }
    }
}
