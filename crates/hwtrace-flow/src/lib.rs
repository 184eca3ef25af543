//! Instruction-flow reconstruction from Intel PT: the event layer (last-IP, TNT, return stack, timing) and the instruction and block decoders.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod time;

pub use time::{Fcr, Time, TimeCal, TimeConfig, TimeError, TscEstimate};
