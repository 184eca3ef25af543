//! Intel Processor Trace packets: decode, encode, synchronise.
//!
//! This is the bottom of hwtrace's decoding pipeline. It turns trace bytes
//! into [`Packet`]s and back, following the Intel SDM (vol. 3C, chapter 33
//! "Intel Processor Trace", section 33.4 "Trace Packets and Data Types") and
//! the packets the SDM adds for PEBS-via-PT (BBP/BIP/BEP), event trace
//! (CFE/EVD) and triggers (TRIG).
//!
//! * [`PacketDecoder`] decodes borrowed bytes without allocating or copying;
//!   every packet comes with its byte offset, and every error names the
//!   offset and what was wrong. After an error, [`PacketDecoder::resync`]
//!   moves to the next PSB and reports the bytes it skipped.
//! * [`encode`](encode()) writes any packet into a caller's buffer; it is the exact
//!   inverse of the decoder. With the `alloc` feature, [`TraceBuilder`]
//!   builds whole traces for tests and simulators.
//! * [`LastIp`] is the small state machine that turns compressed IP payloads
//!   into full addresses (SDM 33.4.2.2, "IP Compression").
//!
//! The crate is `no_std` and never allocates on the decode path.
#![no_std]
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

#[cfg(feature = "alloc")]
extern crate alloc;

#[cfg(feature = "alloc")]
mod builder;
mod decode;
mod display;
mod encode;
mod error;
mod ip;
mod packet;
mod sync;

#[cfg(feature = "alloc")]
pub use builder::TraceBuilder;
pub use decode::{DecodedPacket, PacketDecoder, Skipped, decode_packet, pad_run};
pub use display::{cfe_type_name, evd_type_name};
pub use encode::{MAX_PACKET_LEN, encode};
pub use error::{DecodeError, DecodeErrorKind, EncodeError};
pub use ip::{IpCompression, IpPayload, LastIp, LastIpError};
pub use packet::{
    Bbp, Cfe, Evd, ExecMode, ModeExec, ModeTsx, Mwait, Packet, PacketKind, Pip, Ptw, Pwre, Pwrx,
    Tma, Tnt, Trig,
};
pub use sync::{PSB, find_psb_backward, find_psb_forward, is_psb_at};
