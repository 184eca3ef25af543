//! Instruction-flow reconstruction from Intel PT: the event layer (last-IP,
//! TNT, return stack, timing) and the instruction and block decoders.
//!
//! The layers, bottom up:
//!
//! - [`time`]: the estimated TSC from timing packets.
//! - [`event`]: packets to events ([`event::EventDecoder`]) and the answers
//!   the instruction layer needs ([`event::QueryDecoder`]).
//! - [`insn`]: instruction classification, the return stack, and the
//!   instruction and block decoders that walk the code the trace ran over,
//!   read through [`hwtrace_types::ReadMemory`].
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod config;
pub mod errata;
pub mod error;
pub mod event;
pub mod insn;
pub mod time;

pub use config::{AddrFilter, Config};
pub use errata::Errata;
pub use error::{Error, ErrorKind};
pub use time::{Fcr, Time, TimeCal, TimeConfig, TimeError, TscEstimate};
