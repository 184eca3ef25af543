//! The trace hardware as typed, validated, self-explaining values.
//!
//! Every register the Intel SDM defines for branch tracing is modelled here
//! with its fields named as the SDM names them:
//!
//! | module | what |
//! |---|---|
//! | [`rtit`] | IA32_RTIT_CTL, _STATUS, _OUTPUT_BASE, _OUTPUT_MASK_PTRS, _CR3_MATCH, _ADDRn_A/B |
//! | [`cpuid`] | CPUID leaf 07H (PT present) and leaf 14H sub-leaves 0 and 1 |
//! | [`pt_config`] | a whole PT configuration checked against CPUID, and a builder |
//! | [`topa`], [`output`] | ToPA tables and the OUTPUT_MASK_PTRS write-position arithmetic |
//! | [`debugctl`] | IA32_DEBUGCTL, modern and NetBurst layouts, TR/BTS/BTINT modes |
//! | [`ds`], [`bts`] | IA32_DS_AREA, the DS management area (32/64-bit), BTS records |
//! | [`lbr`], [`lbr_select`], [`arch_lbr`] | LBR formats, FROM/TO/INFO, TOS, MSR_LBR_SELECT per micro-architecture, architectural LBR |
//! | [`dump`] | record decoders: a DS area + BTS buffer dump, an LBR MSR dump → branches in the order taken |
//! | [`explain`](mod@explain) | registers by name or number, values explained field by field, values built from names |
//!
//! Each layout is a [`field::RegisterDef`] table, so what [`explain::explain`]
//! prints and what [`explain::build`] accepts come from one description.
//! Nothing here allocates, panics on input, or touches the machine.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

#[cfg(test)]
#[macro_use]
extern crate std;

mod macros;

pub mod arch_lbr;
pub mod bts;
pub mod cpuid;
pub mod debugctl;
pub mod ds;
pub mod dump;
pub mod explain;
pub mod field;
pub mod lbr;
pub mod lbr_select;
pub mod msr;
pub mod output;
pub mod pt_config;
pub mod rtit;
pub mod topa;
pub mod uarch;

pub use explain::{BuildError, Context, ExplainError, Explanation, RegisterId, build, explain};
pub use uarch::Uarch;
