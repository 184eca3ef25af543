//! The instruction layer: classification, the return stack, and the
//! instruction, block and fast (block-cached) decoders.

mod block;
mod blockcache;
mod cache;
mod classify;
mod decoder;
mod fast;
mod leapmemo;
mod octets;
mod pairmemo;
mod retstack;
mod runs;
mod tally;

pub use block::{Block, BlockDecoder, BlockStep, MAX_BLOCK_INSNS, ends_block};
pub use blockcache::{
    BlockCache, BlockFlow, CachedBlock, Edge, MAX_CACHED_BLOCK_INSNS, MAX_CACHED_BLOCKS,
    MAX_PATH_LEN, NO_BLOCK, PathEnd, PathKey, PathRun, TntPath,
};
pub use cache::{Cached, InsnCache};
pub use classify::{ClassifyError, Decoded, InsnClass, MAX_INSN_SIZE, Special, classify};
pub use decoder::{Insn, InsnDecoder, InsnState, MAX_UNTRACED_INSNS, Step, read_insn};
pub use fast::{BlockRun, DecodedCode, FastDecoder, FastStep};
pub use retstack::{RETSTACK_SIZE, RetStack};
pub use runs::{DEFAULT_RUN_CAPACITY, RunBuffer};
pub use tally::{Counted, DEFAULT_TALLY_CAPACITY, RunTally};
