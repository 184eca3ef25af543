//! Why an image section could not be added or an image argument parsed.

use std::io;
use std::path::PathBuf;

/// Why a section could not be added to an [`Image`](super::Image).
///
/// Every variant names the file (and where it helps, the offset or
/// address) so a command line can report it as is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The file could not be opened, mapped or read.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A file range starts at or beyond the end of the file.
    #[error("{}: offset {offset:#x} is beyond the end of the file ({len:#x} bytes)", path.display())]
    OffsetBeyondEnd {
        /// The file.
        path: PathBuf,
        /// The requested offset.
        offset: u64,
        /// The file's length.
        len: u64,
    },
    /// A file range ends beyond the end of the file.
    #[error(
        "{}: range {offset:#x}+{size:#x} ends beyond the end of the file ({len:#x} bytes)",
        path.display()
    )]
    RangeBeyondEnd {
        /// The file.
        path: PathBuf,
        /// The requested offset.
        offset: u64,
        /// The requested size.
        size: u64,
        /// The file's length.
        len: u64,
    },
    /// A section would hold no bytes.
    #[error("{name}: empty section at {addr:#x}")]
    Empty {
        /// The file or buffer name.
        name: String,
        /// Where it was to be loaded.
        addr: u64,
    },
    /// A section would run past the top of the 64-bit address space.
    #[error("{name}: {len:#x} bytes at {addr:#x} run past the end of the address space")]
    AddressOverflow {
        /// The file or buffer name.
        name: String,
        /// Where it was to be loaded.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// The file is not of the expected format.
    #[error("{}: not {expected} file (looks like {found})", path.display())]
    WrongFormat {
        /// The file.
        path: PathBuf,
        /// What was expected: "an ELF", "a PE".
        expected: &'static str,
        /// What the file looks like.
        found: String,
    },
    /// The file is of the right format but cannot be used (truncated
    /// headers, an ELF with a segment outside the file, ...).
    #[error("{}: unsupported or malformed {format}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// "ELF" or "PE".
        format: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A page cache folder could not be opened.
    #[error("{}", path.display())]
    PageCache {
        /// The folder.
        path: PathBuf,
        /// What was wrong.
        source: crate::pagecache::PageCacheError,
    },
}

/// Why an image argument (`FILE[:OFF[-SIZE]]@ADDR`, ptxed's
/// `FILE[:FROM[-TO]]:BASE`, ...) could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The argument has no load address where one is required.
    #[error("{arg:?}: missing load address (expected {form})")]
    MissingAddress {
        /// The argument.
        arg: String,
        /// The expected form.
        form: &'static str,
    },
    /// A number in the argument could not be parsed.
    #[error("{arg:?}: {what} {text:?} is not a hex number")]
    BadNumber {
        /// The argument.
        arg: String,
        /// Which number: "address", "offset", "size".
        what: &'static str,
        /// The text that was not a number.
        text: String,
    },
    /// A file range is empty or inverted.
    #[error("{arg:?}: empty or inverted file range")]
    BadRange {
        /// The argument.
        arg: String,
    },
    /// The argument names no file.
    #[error("{arg:?}: missing file name")]
    MissingFile {
        /// The argument.
        arg: String,
    },
}
