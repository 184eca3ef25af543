//! perf_event sideband and perf.data, and Linux capture.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod capture;
pub mod data;
pub mod pevent;
