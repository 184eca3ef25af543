//! The words every hwtrace layer shares.
//!
//! Bare `u64`s are easy to mix up in a decoder: a trace offset, a linear
//! address, a physical address and a CR3 value all fit in one. The newtypes
//! here keep them apart at API boundaries, and the two memory traits are the
//! only way upper layers (the flow decoder, the simulator) see code bytes, so
//! they never depend on ELF, perf or the operating system.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod addr;
pub mod hash;
mod memory;

pub use addr::{Cr3, Ip, PhysAddr, TraceOffset, Tsc};
pub use memory::{AddressSpace, BytesAt, MemoryError, PhysMemory, ReadMemory};
