//! Answers from a decoded trace, in the forms people already use.
//!
//! Everything here consumes the same input, a stream of [`exec::Exec`]
//! records (executed instructions in trace order, with the breaks, times
//! and threads the trace reports between them), so every answer works for
//! every trace hwtrace decodes: raw PT over images or dumps, perf.data,
//! BTS and LBR (edges only).

pub mod calls;
pub mod coverage;
pub mod exec;
pub mod flame;
pub mod symbols;
pub mod timeline;
