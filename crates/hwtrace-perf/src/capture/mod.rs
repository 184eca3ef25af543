//! Linux capture with `perf_event_open`: Intel PT and BTS through their AUX
//! areas, LBR through branch-stack samples, sideband (mmap, comm, context
//! switches) through the data ring, written as perf.data.
//!
//! The layers:
//!
//! * [`pmu`]: sysfs PMU discovery (`type`, `format/*`, `caps/*`) and config
//!   terms (`tsc,mtc,cyc,noretcomp,branch`) → config words.
//! * [`access`]: `perf_event_paranoid` and CAP_PERFMON.
//! * [`plan`]: options → a checked [`Plan`] (attribute, sizes, filter) with
//!   a typed [`CaptureError`] for every missing capability, before any
//!   system call.
//! * [`ring`]: the mmap head/tail protocol as arithmetic over slices
//!   (wrap-around as [`ring::RawData::Split`], snapshot windows).
//! * [`sys`]: the kernel boundary (`perf_event_open`, mmaps, ioctls).
//! * [`session`]: running a capture into a perf.data writer.
//!
//! This is the only module of the workspace allowed `unsafe` (system calls
//! and shared ring memory); each block says why it is sound.
#![allow(unsafe_code)]

pub mod access;
pub mod error;
pub mod plan;
pub mod pmu;
pub mod procfs;
pub mod ring;
pub mod session;
pub mod sys;

#[cfg(test)]
mod tests;

pub use error::{CaptureError, PORTABLE_HINT, Tracer};
pub use plan::{Plan, RecordOptions, plan};
pub use pmu::{ConfigValues, ConfigWord, Format, Pmu};
pub use session::{Summary, Target, record};
