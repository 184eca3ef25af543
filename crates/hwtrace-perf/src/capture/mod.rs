//! Linux capture with `perf_event_open`: Intel PT and BTS through their AUX
//! areas, LBR through branch-stack samples, sideband (mmap, comm, context
//! switches) through the data ring, written as perf.data.
//!
//! The layers:
//!
//! * [`pmu`]: sysfs PMU discovery (`type`, `format/*`, `caps/*`) and config
//!   terms (`tsc,mtc,cyc,noretcomp,branch`) → config words.
//! * [`access`]: `perf_event_paranoid` and CAP_PERFMON.
//! * [`plan`](mod@plan): options → a checked [`Plan`] (attribute, sizes, filter) with
//!   a typed [`CaptureError`] for every missing capability, before any
//!   system call.
//! * [`ring`]: the mmap head/tail protocol as arithmetic over slices
//!   (wrap-around as [`ring::RawData::Split`], snapshot windows).
//! * [`sys`]: the kernel boundary (`perf_event_open`, mmaps, ioctls).
//! * [`procfs`]: an attached process's threads and mappings.
//! * [`session`]: running a capture into a perf.data writer: the workload
//!   is forked and held until the events exist (they enable themselves at
//!   its exec); one inherited event per online CPU follows it and its
//!   children (the kernel maps inherited events only when bound to a CPU),
//!   each with its data ring and, for Intel PT/BTS, its AUX area; rings are
//!   drained in rounds closed by FINISHED_ROUND.
//!
//! Snapshot mode reads each AUX area once, when recording ends (perf's
//! SIGUSR2-triggered snapshots are not offered).
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
