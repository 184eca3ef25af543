//! The instruction layer: classification, the return stack, and the
//! instruction and block decoders.

mod block;
mod cache;
mod classify;
mod decoder;
mod retstack;

pub use block::{Block, BlockDecoder, BlockStep, MAX_BLOCK_INSNS, ends_block};
pub use cache::{Cached, InsnCache};
pub use classify::{ClassifyError, Decoded, InsnClass, MAX_INSN_SIZE, Special, classify};
pub use decoder::{Insn, InsnDecoder, MAX_UNTRACED_INSNS, Step};
pub use retstack::{RETSTACK_SIZE, RetStack};
