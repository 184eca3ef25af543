//! `hwtrace flow`'s engine: the loop that drives the instruction decoder,
//! as small iterators of [`Item`]s, and the printers of those items.
//!
//! - [`Items`] drives a decoder (the block-cached
//!   [`hwtrace_flow::insn::FastDecoder`], or the instruction decoder) the
//!   way libipt's ptxed does (synchronise, drain pending events before each instruction,
//!   report an error and resynchronise at the next PSB) and yields one
//!   [`Item`] per instruction, event, error and resynchronisation gap;
//! - [`Blocks`] and [`Branches`] reshape that stream into basic blocks
//!   (libipt's block decoder's boundaries) and taken branches (from → to,
//!   like `perf script --itrace=b`);
//! - [`RunEndItems`] and [`RunEndBatch`] give runs of plain code a fast
//!   decoder hands out whole as their first and last instruction, all
//!   [`Branches`] needs of them; [`RunPieces`] and [`PieceBatch`] give
//!   them as [`Piece`]s that [`Blocks`] folds as they are;
//! - [`FlowMemory`] is the code the decoder reads: images and/or a
//!   physical dump read through the page tables of the CR3 the trace
//!   reports;
//! - [`Printer`] writes items as text lines (with Intel-syntax
//!   disassembly) or JSON objects;
//! - [`counted::count`] is the counting decode on any number of threads,
//!   for commands that print only counts and failures, and
//!   [`FailureLines`] writes those failures.
//!
//! Nothing here allocates per instruction: items are `Copy` values and the
//! printers reuse their buffers.

pub mod counted;
mod disasm;
mod failures;
mod items;
mod mapped;
mod memory;
mod print;
mod run_blocks;
mod run_ends;
mod shape;

pub use disasm::{Disassembler, Syntax};
pub use failures::FailureLines;
pub use items::{Item, Items};
pub use mapped::MappedTrace;
pub use memory::FlowMemory;
pub use print::{Format, Printer, Stats, status_error_hint};
pub use run_blocks::{PieceBatch, RunPiece, RunPieces};
pub use run_ends::{RunEndBatch, RunEndItems, RunFlow};
pub use shape::{Blocks, Branches, Piece};
