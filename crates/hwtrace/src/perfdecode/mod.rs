//! `hwtrace perf decode`: the instructions of every Intel PT AUX stream of
//! a perf.data file, attributed to threads, over the code of the files the
//! sideband says were mapped.
//!
//! - [`sideband`]: threads, processes, executable mappings, build ids and
//!   the threads that ran on each CPU;
//! - [`image`]: a process's code image from its mappings (files under
//!   `--sysroot`, build-id checked; the vDSO from `--vdso`), and what could
//!   not be mapped;
//! - [`stream`]: one AUX queue decoded with hwtrace-flow's instruction
//!   decoder (through [`crate::flow::Items`]), every error blamed on the
//!   missing mapping it fell in, every gap said with where and how much.
//!
//! The perf.data file is memory-mapped and AUX payloads are decoded in
//! place; contiguous AUXTRACE buffers of one queue (a packet may straddle
//! two) are joined in a buffer of at most [`stream::MAX_JOIN`] bytes.

pub mod image;
pub mod sideband;
pub mod stream;

pub use image::ImageOptions;
pub use stream::{Format, Options};
