//! `hwtrace perf decode`: the instructions of every Intel PT AUX stream of
//! a perf.data file (the branches of every intel_bts stream, the branch
//! stacks of LBR samples), attributed to threads, over the code of the
//! files the sideband says were mapped.
//!
//! - [`sideband`]: threads, processes, executable mappings, build ids and
//!   the threads that ran on each CPU;
//! - [`image`]: a process's code image from its mappings (files under
//!   `--sysroot`, build-id checked; the vDSO from `--vdso`), and what could
//!   not be mapped;
//! - [`queue`]: one Intel PT AUX queue as decoder items (hwtrace-flow's
//!   instruction flow, `drive`), the image following the process switched
//!   in on per-CPU queues and the program after an exec; shared with the
//!   answers front end;
//! - [`stream`]: those items printed, every error blamed on the missing
//!   mapping it fell in, every gap said with where and how much;
//! - [`bts`]: one intel_bts AUX queue, its 24-byte records as branches;
//! - [`lbr`]: SAMPLE records with branch stacks (LBR), one line per sample;
//! - [`kernel`]: kernel code (`--kcore`) and symbols (`--kallsyms`);
//! - [`symbols`]: `--sym`, addresses named after the mapped files' symbols.
//!
//! The perf.data file is memory-mapped and AUX payloads are decoded in
//! place; contiguous AUXTRACE buffers of one queue (a packet may straddle
//! two) are joined in a buffer of at most [`stream::MAX_JOIN`] bytes.

pub mod bts;
mod drive;
pub mod image;
pub mod kernel;
pub mod lbr;
pub mod queue;
pub mod sideband;
pub mod stream;
pub mod symbols;

pub use image::ImageOptions;
pub use stream::{Format, Options};
