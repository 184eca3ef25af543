//! Linux perf_event sideband, as libipt's tools read it.
//!
//! A sideband file holds raw `perf_event` records (what perf writes into its
//! ring buffer), each followed by the `sample_id` fields `sample_type`
//! selects. The layers, bottom up:
//!
//! * [`record`]: zero-copy parsing ([`RecordReader`], [`parse_record`]) with
//!   typed errors ([`record::Error`] `{ offset, kind }`).
//! * [`time`]: perf time → TSC ([`TimeConversion`]) exactly as libipt-sb
//!   rounds, and `--pevent:tsc-offset` ([`apply_tsc_offset`]).
//! * [`print`](mod@print): libipt-sb's `--sb:compact`/`--sb:verbose` output
//!   ([`print_record`], [`PrintFlags`]).
//! * [`session`]: channels merged by TSC ([`Session`]): ptdump asks for the
//!   records due at a TSC, ptxed presents trace events and gets context
//!   switches; [`context`] keeps which file is mapped where for each pid.
//! * [`options`]: the `--sb:*`/`--pevent:*` command-line options
//!   ([`SidebandOptions`]) → a [`Session`].
//!
//! ptdump's use, printing sideband records between trace packets:
//!
//! ```no_run
//! use hwtrace_perf::pevent::{ChannelConfig, OutputOptions, PrintFlags, Session};
//! use hwtrace_types::Tsc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut out = std::io::stdout().lock();
//! let records = PrintFlags { compact: true, offset: true, ..PrintFlags::default() };
//! let mut session = Session::new(OutputOptions { records, ..OutputOptions::default() });
//! // The --pevent:* options given before the file apply to it.
//! let config = ChannelConfig { sample_type: 0x4, ..ChannelConfig::default() };
//! session.add_file("trace-sideband.sb:0x0-0x400", config)?;
//! session.start(&mut out)?;
//! // ... whenever the trace's time estimate becomes `tsc`, before printing
//! // the packet that moved it:
//! session.dump_due(Tsc(0x1234), &mut out)?;
//! // ... and after the last packet:
//! session.dump_rest(&mut out)?;
//! # Ok(()) }
//! ```

pub mod context;
pub mod options;
pub mod print;
pub mod record;
pub mod session;
pub mod time;

#[cfg(test)]
mod tests;

pub use context::{Abi, Context, ContextId, Contexts, Mapping};
pub use options::{OptionError, OptionErrorKind, SidebandOptions};
pub use print::{PrintFlags, print_record, record_name};
pub use record::{Body, Header, Record, RecordReader, SampleId, SidebandOffset, parse_record};
pub use session::{
    ChannelConfig, ChannelId, Diagnostic, DiagnosticKind, FileRange, LoadError, LoadErrorKind,
    Location, LocationHint, OutputOptions, Session, TraceEvent, split_file_arg,
};
pub use time::{TimeConversion, TimeError, apply_tsc_offset};
