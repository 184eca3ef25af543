//! Instruction-flow reconstruction from Intel PT: the event layer (last-IP,
//! TNT, return stack, timing) and the instruction and block decoders.
//!
//! The layers, bottom up:
//!
//! - [`time`]: the estimated TSC from timing packets.
//! - [`event`]: packets to events ([`event::EventDecoder`]) and the answers
//!   the instruction layer needs ([`event::QueryDecoder`]).
//! - [`insn`]: instruction classification (iced-x86, cached per address
//!   space and IP), the return stack, and the instruction and block
//!   decoders ([`insn::InsnDecoder`], [`insn::BlockDecoder`]) that walk the
//!   code the trace ran over, read through [`hwtrace_types::ReadMemory`].
//!
//! Every decoder has the same verbs: `sync_forward`, `offset`,
//! `sync_offset` and `next() -> Result<Option<_>, Error>`; after an error,
//! `sync_forward` goes on at the next PSB (or [`insn::InsnDecoder::resync`]
//! at the next IP the trace gives). Errors carry the trace offset and IP.
//! Semantics follow Intel's reference decoder (libipt 2.3), including the
//! errata workarounds it applies per processor ([`Errata`]).
//!
//! ```
//! use hwtrace_flow::Config;
//! use hwtrace_flow::insn::{InsnDecoder, Step};
//! use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
//!
//! /// `nop; nop; hlt` at 0x1000.
//! struct Code;
//! impl ReadMemory for Code {
//!     fn read_memory(&self, _: AddressSpace, addr: Ip, buf: &mut [u8]) -> Result<usize, MemoryError> {
//!         let code = [0x90, 0x90, 0xf4];
//!         let off = addr.0.wrapping_sub(0x1000) as usize;
//!         let rest = code.get(off..).filter(|r| !r.is_empty()).ok_or(MemoryError::Unmapped { addr })?;
//!         let n = rest.len().min(buf.len());
//!         buf[..n].copy_from_slice(&rest[..n]);
//!         Ok(n)
//!     }
//! }
//!
//! // PSB, MODE.Exec 64-bit, FUP 0x1000, PSBEND, FUP 0x1002, TIP.PGD.
//! let trace = [
//!     0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
//!     0x02, 0x82, 0x99, 0x01, 0x7d, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x02, 0x23, 0x3d,
//!     0x02, 0x10, 0x01,
//! ];
//! let mut dec = InsnDecoder::new(&trace, Config::default(), Code);
//! dec.sync_forward()?;
//! let mut ips = Vec::new();
//! while let Some(step) = dec.next()? {
//!     if let Step::Insn(insn) = step {
//!         ips.push(insn.ip);
//!     }
//! }
//! assert_eq!(ips, [0x1000, 0x1001]);
//! # Ok::<(), hwtrace_flow::Error>(())
//! ```
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub mod config;
pub mod errata;
pub mod error;
pub mod event;
pub mod insn;
pub mod parallel;
mod progress;
pub mod time;

pub use config::{AddrFilter, Config};
pub use errata::Errata;
pub use error::{Error, ErrorKind};
pub use progress::SyncProgress;
pub use time::{Fcr, Time, TimeCal, TimeConfig, TimeError, TscEstimate};
