//! perf.data in and out.
//!
//! # Why our own reader, not `linux-perf-data`
//!
//! `linux-perf-data` 0.13 copies each AUXTRACE payload into an owned buffer
//! and returns AUXTRACE_INFO, AUX and ITRACE_START raw. Intel PT files are
//! routinely gigabytes of AUX data; copying it bounds nothing. This reader
//! works over one `&[u8]` (a memory map in the CLI): every payload, string
//! and branch stack is a borrowed slice of it, so memory stays at the
//! attribute table, the feature strings and one [`AuxStreams`] index entry
//! per AUXTRACE buffer, however large the file. It reuses the kernel-record
//! parser of [`crate::pevent`] (the same code libipt-compatible sideband
//! uses), and adds the user-space records (AUXTRACE_INFO, AUXTRACE,
//! HEADER_ATTR, HEADER_FEATURE, ...), samples with branch stacks, the file
//! and pipe headers and the feature sections. Compressed records
//! (`perf record -z`, zstd) are expanded by [`Records::next_expanded`],
//! streaming, into a reused buffer (see [`compressed`]).
//!
//! The layers:
//!
//! * [`header`]: file/pipe header, attribute table, feature sections.
//! * [`attr`]: `perf_event_attr` parsed and encoded.
//! * [`reader`]: [`PerfData`] and its record iterator ([`Records`]).
//! * [`sample`]: SAMPLE records and branch stacks (LBR).
//! * [`auxtrace`]: AUXTRACE_INFO (Intel PT and BTS private words) and AUXTRACE.
//! * [`compressed`]: COMPRESSED/COMPRESSED2 records and HEADER_COMPRESSED.
//! * [`streams`]: per-(CPU, thread) AUX streams with gaps and losses.
//! * [`write`](mod@write): a perf.data writer for hwtrace's own captures.
//!
//! Errors are [`Error`] `{ offset, kind }`, the offset being a file offset.
//!
//! ```no_run
//! use hwtrace_perf::data::{AuxStreams, PerfData};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let bytes = std::fs::read("perf.data")?;
//! let file = PerfData::parse(&bytes)?;
//! for (key, queue) in &AuxStreams::collect(&file).queues {
//!     println!("{key}: {} bytes, {} gaps", queue.len(), queue.gaps.len());
//! }
//! # Ok(()) }
//! ```

pub mod attr;
pub mod auxtrace;
mod bytes;
pub mod compressed;
pub mod error;
pub mod header;
pub mod reader;
pub mod sample;
pub mod streams;
pub mod write;

#[cfg(test)]
mod compressed_tests;
#[cfg(test)]
mod tests;

pub use attr::Attr;
pub use auxtrace::{
    Auxtrace, AuxtraceInfo, AuxtraceKind, IntelBtsInfo, IntelPtInfo, TscConversion,
};
pub use compressed::{Compressed, Compression};
pub use error::{Error, ErrorKind, FileOffset};
pub use header::{BuildId, EventAttr, Features, FileHeader, FileSection};
pub use reader::{Expanded, PerfData, PerfRecord, RecordItem, Records, record_type_name};
pub use sample::{BranchEntry, BranchStack, Sample};
pub use streams::{AuxChunk, AuxGap, AuxLoss, AuxQueue, AuxStreams, QueueKey};
pub use write::{PerfDataWriter, PipeWriter, RecordWriter};
