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
//!
//! **Which edges.** libxdc counts only the outcomes of conditional
//! branches (a jcc, `jcxz`, `loop` and kin to its target or its
//! fall-through): with the code, those decide every other transfer, and
//! they are what a TNT packet records. [`AflEdges::Conditional`] (the
//! default) counts the same, so the map, and [`libxdc_hash`] of it, are
//! what kAFL/Nyx compute for the same trace (checked against the hashes
//! libxdc gives for the real traces of `../shared/corpus/real`, decoded
//! with `--lenient`, which reads tracing's on/off status as libxdc does).
//! [`AflEdges::All`] counts every block-to-block transfer (calls, returns,
//! jumps, fall-throughs into a block entered from elsewhere), as a
//! compiler-instrumented AFL target's map would.

use super::Coverage;
use hwtrace_flow::insn::InsnClass;
use hwtrace_types::Ip;
use std::io::{self, Write};

/// The map size (AFL++'s default `MAP_SIZE`, libxdc's usual bitmap).
pub const MAP_SIZE: usize = 1 << 16;

/// The largest map libxdc fills: its trace cache keeps counter offsets in
/// 24 bits. Any power of two up to this works as libxdc's `bitmap_size`
/// (Nyx and AFL++ targets often use larger maps than 64 KiB).
pub const MAX_MAP_SIZE: usize = 1 << 24;

/// Which edges the map counts (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AflEdges {
    /// libxdc's: conditional branches' outcomes only.
    #[default]
    Conditional,
    /// Every transfer between blocks.
    All,
}

/// libxdc's address mixer.
pub const fn mix(v: u64) -> u64 {
    (v ^ (v >> 31)).wrapping_mul(0x7fb5_d329_728e_a185)
}

/// The counter an edge `from` → `to` lands in, in a map of [`MAP_SIZE`].
pub const fn edge_index(from: Ip, to: Ip) -> usize {
    edge_slot(from, to, MAP_SIZE)
}

/// The counter an edge `from` → `to` lands in, in a map of `size` bytes (a
/// power of two): libxdc takes the low 32 bits of the mix, then the
/// index's bits.
pub const fn edge_slot(from: Ip, to: Ip, size: usize) -> usize {
    ((mix(to.0) ^ (mix(from.0) >> 1)) as u32 as usize) & (size - 1)
}

/// The bitmap of `size` bytes (a power of two, at most [`MAX_MAP_SIZE`])
/// of the edges of `cov` that `which` selects, each counted as often as it
/// ran.
pub fn bitmap(cov: &Coverage, which: AflEdges, size: usize) -> Vec<u8> {
    debug_assert!(size.is_power_of_two() && size <= MAX_MAP_SIZE);
    let mut map = vec![0u8; size];
    for e in &cov.edges {
        let (Some(from), Some(to)) = (
            cov.blocks.get(e.from as usize),
            cov.blocks.get(e.to as usize),
        ) else {
            continue;
        };
        let hits = match which {
            AflEdges::Conditional if from.last_class != InsnClass::CondJump => continue,
            // libxdc sees no outcome where the branch left the filter.
            AflEdges::Conditional => e.hits - e.left_filter,
            AflEdges::All => e.hits,
        };
        let Some(slot) = map.get_mut(edge_slot(from.last, to.start, size)) else {
            continue;
        };
        // hits increments wrap like `hits` single increments would.
        *slot = slot.wrapping_add((hits % 256) as u8);
    }
    map
}

/// Writes the raw map (what `afl-showmap -b` writes: the bytes only).
pub fn write(map: &[u8], out: &mut dyn Write) -> io::Result<()> {
    out.write_all(map)
}

/// The hash libxdc gives a bitmap (`libxdc_bitmap_get_hash`): the first
/// 64-bit half of MurmurHash3's x64 128-bit variant over the map's
/// bytes, seeded with `0xaaaaaaaa`. What kAFL/Nyx compare to tell two
/// executions' coverage apart.
pub fn libxdc_hash(map: &[u8]) -> u64 {
    murmur3_x64_128(map, 0xaaaa_aaaa).0
}

/// MurmurHash3, x64 128-bit variant (Austin Appleby's public-domain
/// algorithm): both halves of the digest.
pub fn murmur3_x64_128(data: &[u8], seed: u32) -> (u64, u64) {
    const C1: u64 = 0x87c3_7b91_1142_53d5;
    const C2: u64 = 0x4cf5_ad43_2745_937f;
    let mix_k1 = |k: u64| k.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
    let mix_k2 = |k: u64| k.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
    let (mut h1, mut h2) = (u64::from(seed), u64::from(seed));
    let mut blocks = data.chunks_exact(16);
    for b in &mut blocks {
        let (lo, hi) = b.split_at(8);
        let k1 = u64::from_le_bytes(lo.try_into().unwrap_or_default());
        let k2 = u64::from_le_bytes(hi.try_into().unwrap_or_default());
        h1 ^= mix_k1(k1);
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);
        h2 ^= mix_k2(k2);
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }
    // The tail: up to 15 bytes, little-endian, the first eight in k1.
    let tail = blocks.remainder();
    let word = |bytes: &[u8]| {
        bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
    };
    if tail.len() > 8 {
        h2 ^= mix_k2(word(&tail[8..]));
    }
    if !tail.is_empty() {
        h1 ^= mix_k1(word(&tail[..tail.len().min(8)]));
    }
    let len = data.len() as u64;
    h1 ^= len;
    h2 ^= len;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    (h1, h2)
}

/// MurmurHash3's finaliser: every bit of `k` avalanches.
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}
