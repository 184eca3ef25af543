//! An AFL-style edge bitmap: 64 KiB of 8-bit counters, one per hashed
//! edge, as AFL++ maps and libxdc (the Intel PT decoder of kAFL/Nyx)
//! fill them from a trace.
//!
//! The index of an edge is libxdc's: with
//! `mix(v) = (v ^ (v >> 31)) * 0x7fb5d329728ea185` (64-bit, wrapping),
//! `index = (mix(to) ^ (mix(from) >> 1)) mod 65536`, where `from` is the
//! address of the instruction that left the source block (its last
//! instruction) and `to` the first address of the block entered. The
//! shift keeps A→B and B→A apart, as AFL's `prev_loc >> 1` does. Each
//! traversal adds one to its counter, wrapping at 256 as AFL's and
//! libxdc's `map[index]++` does; AFL++'s hit-count classes (1, 2, 3,
//! 4–7, 8–15, ...) are for the fuzzer to apply.

use super::Coverage;
use hwtrace_types::Ip;
use std::io::{self, Write};

/// The map size (AFL++'s default `MAP_SIZE`, libxdc's usual bitmap).
pub const MAP_SIZE: usize = 1 << 16;

/// libxdc's address mixer.
pub const fn mix(v: u64) -> u64 {
    (v ^ (v >> 31)).wrapping_mul(0x7fb5_d329_728e_a185)
}

/// The counter an edge `from` → `to` lands in.
pub const fn edge_index(from: Ip, to: Ip) -> usize {
    ((mix(to.0) ^ (mix(from.0) >> 1)) as usize) & (MAP_SIZE - 1)
}

/// The bitmap of every edge of `cov`, each counted as often as it ran.
pub fn bitmap(cov: &Coverage) -> Vec<u8> {
    let mut map = vec![0u8; MAP_SIZE];
    for e in &cov.edges {
        let (Some(from), Some(to)) = (
            cov.blocks.get(e.from as usize),
            cov.blocks.get(e.to as usize),
        ) else {
            continue;
        };
        let slot = &mut map[edge_index(from.last, to.start)];
        // hits increments wrap like `hits` single increments would.
        *slot = slot.wrapping_add((e.hits % 256) as u8);
    }
    map
}

/// Writes the raw map (what `afl-showmap -b` writes: the bytes only).
pub fn write(cov: &Coverage, out: &mut dyn Write) -> io::Result<()> {
    out.write_all(&bitmap(cov))
}
