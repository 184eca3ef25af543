//! The trace hardware simulated: real program executions as ground truth,
//! and the Intel PT a CPU would have written for them.
//!
//! * [`Execution`] is what a program really did: the address of every
//!   executed instruction, in order, and the code bytes they ran over
//!   ([`CodeImage`]). [`QemuRecorder`] (or [`Execution::record_qemu`]) runs a
//!   program under qemu-user and records it; [`Execution::from_qemu_log`]
//!   reads a log written earlier. See [`execution`] for where the code
//!   bytes come from.
//! * [`PtEncoder`] turns an execution into the PT byte stream of user-mode
//!   branch tracing, with or without return compression, PSB+ every few
//!   KiB, and optional TSC packets (see [`pt_encoder`] for each rule and
//!   its SDM section).
//! * [`walk`] makes up an execution over code in memory (a dump's
//!   processes, say, which cannot be run again) and the trace of one that
//!   switches address spaces.
//!
//! Decoders are checked against these traces: decoding must give back
//! exactly the executed instructions (`tests/qemu_roundtrip.rs` does this
//! with libipt).
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod branch;
pub mod bts;
pub mod clock;
pub mod decode;
pub mod execution;
pub mod lbr;
mod memory;
pub mod output;
pub mod pt_encoder;
pub mod qemu_log;
mod record;
mod state;
pub mod walk;

pub use branch::{Branch, BranchError, BranchErrorKind, BranchKind, branches};
pub use bts::{BtsConfig, BtsPmi, BtsReport, BtsSim, BtsSimError, BtsStep};
pub use clock::{Timing, TimingError};
pub use decode::RecordedBranch;
pub use execution::{Execution, Limits, LogError, LogErrorKind};
pub use lbr::{LbrConfig, LbrSim, LbrSimError, LbrSnapshot, LbrStep};
pub use memory::{CodeConflict, CodeImage, CodeImageBuilder, Segment};
pub use output::{
    Consumer, Loss, OutputRun, OutputStageError, OutputTarget, PmiPoint, RegionContents, TopaTable,
    write_output,
};
pub use pt_encoder::{
    Cr3Filter, EncodeError, EncodeErrorKind, EncodeStats, EncodedTrace, IpRange, PsbMark, PtConfig,
    PtEncoder, TscModel,
};
pub use qemu_log::LineError;
pub use record::{QemuRecorder, RecordEnd, RecordError, Recording};
