//! Test-only bindings to Intel's libipt (Debian libipt-dev), the reference decoder hwtrace is checked against. Never needed to run hwtrace.
//!
//! Hand-written FFI to the system libipt **2.0.5** (`/usr/include/intel-pt.h`; `build.rs` refuses
//! other versions, since the struct layouts in [`ffi`](self) are mirrored by hand). Use it only as a
//! dev-dependency, for cross-checks and benchmarks:
//!
//! - packets: [`packets`] (every packet with offset, size and payload, errors in place) and
//!   [`count_packets`] (a non-allocating loop for benchmarks);
//! - instructions and blocks over an [`Image`]: [`insn_trace`], [`insn_addresses`],
//!   [`count_insns`], [`count_blocks`].
//!
//! All decoders follow ptdump/ptxed: sync at the first PSB (or at offset 0 for
//! [`SyncMode::AssumeAtStart`] packet decoding), report an error, resync at the next PSB.
//!
//! Install the library with `scripts/setup.sh`.

// This is an FFI crate: calling libipt is its whole job, so the workspace's `unsafe_code = "deny"`
// is lifted here. Every unsafe block says why it is sound.
#![allow(unsafe_code)]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod config;
mod error;
mod event;
mod ffi;
mod flow;
mod image;
mod packet;

pub use config::{Config, Cpu, SyncMode};
pub use error::{OracleError, Stage};
pub use event::{OracleEvent, OracleEventKind};
pub use flow::{BlockCount, InsnItem, count_blocks, count_insns, insn_addresses, insn_trace};
pub use image::{Image, ReadMemory, SectionOverlap, Sections};
pub use packet::{OracleKind, OraclePacket, count_packets, packets};
