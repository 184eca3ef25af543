//! The answer commands' common input: any trace hwtrace decodes, opened as
//! one stream of [`hwtrace_report::exec::Exec`] records.
//!
//! - [`source`]: the command-line options every answer command flattens
//!   ([`SourceArgs`]) and the [`Source`] they open: raw Intel PT over the
//!   image options or a memory dump, perf.data (recognised by its magic),
//!   BTS buffers and LBR MSR dumps;
//! - `pt`: an instruction-flow [`crate::flow::Items`] stream mapped to
//!   `Exec` records (used for raw PT and for each perf.data AUX stream);
//! - `perf`: perf.data Intel PT streams, per thread, over the files the
//!   sideband names (through [`crate::perfdecode`]);
//! - `branches`: BTS records and LBR entries as `Exec::Branch`;
//! - [`folded`]: a raw trace decoded on every core, each stretch's records
//!   folded where they were decoded (coverage's parts), in trace order.
//!
//! Decoding problems are not printed here: they become `Exec::Gap`
//! records in the stream and lines in the [`SourceReport`], so each answer
//! decides how to show them.

mod branches;
pub mod folded;
mod perf;
mod pipeline;
mod pt;
pub mod source;
#[cfg(test)]
pub(crate) mod testing;

pub use source::{Source, SourceArgs, SourceReport};
