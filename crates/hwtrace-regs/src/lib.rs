//! The trace hardware as typed values: IA32_RTIT_*, CPUID leaves 0x07/0x14, DEBUGCTL, the DS save area, BTS records and the LBR MSRs, validated and explained.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

#[cfg(test)]
#[macro_use]
extern crate std;

mod macros;

pub mod cpuid;
pub mod field;
pub mod msr;
pub mod rtit;
pub mod output;
pub mod topa;
pub mod pt_config;
pub mod bts;
pub mod debugctl;
pub mod ds;
pub mod lbr;
pub mod uarch;
pub mod arch_lbr;
pub mod lbr_select;
