//! Decoded instructions, kept per address space and IP so hot code is
//! decoded once.
//!
//! The cache is direct-mapped: a fixed table indexed by a few bits of the
//! IP, one entry per slot, replaced on conflict. A lookup is an index and
//! a compare (a `HashMap` spent half the decode time hashing).
//!
//! The table holds 4-byte indices into the entries, which are appended as
//! slots are first filled: a decoder's memory follows the code it decoded,
//! not the table's size. (A table of whole entries, 6 MiB, was written in
//! full on first use; a parallel decode keeps one per decoder in flight,
//! and those tables were most of `hwtrace flow --jobs 2`'s peak RSS.)

use super::classify::{Decoded, MAX_INSN_SIZE};
use hwtrace_packet::ExecMode;
use hwtrace_types::AddressSpace;
/// Slots in the table (a power of two).
const SLOTS: usize = 1 << 16;

/// One cached instruction: what it does and its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cached {
    /// The classification.
    pub decoded: Decoded,
    /// The instruction bytes (the first `decoded.size`).
    pub raw: [u8; MAX_INSN_SIZE],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    cr3: Option<u64>,
    vmcs: Option<u64>,
    ip: u64,
    mode: u8,
}

/// A map from (address space, mode, IP) to the decoded instruction.
#[derive(Clone, Debug, Default)]
pub struct InsnCache {
    /// Per slot, 1 + the index of its entry in `entries`; 0: empty.
    /// Allocated zeroed on first insert (pages the decode never touches
    /// stay unmapped).
    slots: Vec<u32>,
    /// The entries, in the order their slots were first filled.
    entries: Vec<(Key, Cached)>,
}

const fn slot(ip: u64) -> usize {
    ((ip ^ (ip >> 16)) as usize) & (SLOTS - 1)
}

const fn mode_key(mode: ExecMode) -> u8 {
    match mode {
        ExecMode::Bits16 => 0,
        ExecMode::Bits32 => 1,
        ExecMode::Bits64 => 2,
        ExecMode::Reserved => 3,
    }
}

fn key(space: AddressSpace, ip: u64, mode: ExecMode) -> Key {
    Key {
        cr3: space.cr3.map(|c| c.0),
        vmcs: space.vmcs,
        ip,
        mode: mode_key(mode),
    }
}

impl InsnCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything (the memory changed).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = 0);
        self.entries.clear();
    }

    /// The instruction at `ip`, if cached.
    #[inline]
    pub fn get(&self, space: AddressSpace, ip: u64, mode: ExecMode) -> Option<&Cached> {
        let at = *self.slots.get(slot(ip))?;
        match self.entries.get((at as usize).wrapping_sub(1)) {
            Some((k, c)) if *k == key(space, ip, mode) => Some(c),
            _ => None,
        }
    }

    /// Remembers an instruction (replacing whatever shared its slot).
    pub fn insert(&mut self, space: AddressSpace, ip: u64, mode: ExecMode, entry: Cached) {
        if self.slots.is_empty() {
            self.slots = vec![0; SLOTS];
        }
        let Some(at) = self.slots.get_mut(slot(ip)) else {
            return;
        };
        let new = (key(space, ip, mode), entry);
        match self.entries.get_mut((*at as usize).wrapping_sub(1)) {
            Some(e) => *e = new,
            None => {
                // At most one entry per slot: never more than `SLOTS`.
                self.entries.push(new);
                *at = self.entries.len() as u32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify::{InsnClass, Special};
    use super::*;

    #[test]
    fn keyed_by_space_ip_and_mode() {
        let mut c = InsnCache::new();
        let e = Cached {
            decoded: Decoded {
                size: 1,
                class: InsnClass::Other,
                special: Special::None,
                target: None,
            },
            raw: [0x90; MAX_INSN_SIZE],
        };
        c.insert(AddressSpace::UNKNOWN, 0x10, ExecMode::Bits64, e);
        assert!(
            c.get(AddressSpace::UNKNOWN, 0x10, ExecMode::Bits64)
                .is_some()
        );
        assert!(
            c.get(AddressSpace::UNKNOWN, 0x10, ExecMode::Bits32)
                .is_none()
        );
        assert!(
            c.get(AddressSpace::UNKNOWN, 0x11, ExecMode::Bits64)
                .is_none()
        );
        c.clear();
        assert!(
            c.get(AddressSpace::UNKNOWN, 0x10, ExecMode::Bits64)
                .is_none()
        );
    }

    #[test]
    fn conflicting_ips_replace_each_other() {
        let mut c = InsnCache::new();
        let e = Cached {
            decoded: Decoded {
                size: 1,
                class: InsnClass::Other,
                special: Special::None,
                target: None,
            },
            raw: [0x90; MAX_INSN_SIZE],
        };
        let twin = (1..1u64 << 20)
            .map(|k| 0x10 + (k << 16))
            .find(|&ip| slot(ip) == slot(0x10))
            .expect("some IP shares the slot");
        c.insert(AddressSpace::UNKNOWN, 0x10, ExecMode::Bits64, e);
        c.insert(AddressSpace::UNKNOWN, twin, ExecMode::Bits64, e);
        // The twin took the entry of the slot they share.
        assert_eq!(c.entries.len(), 1);
        assert!(
            c.get(AddressSpace::UNKNOWN, 0x10, ExecMode::Bits64)
                .is_none()
        );
        assert!(
            c.get(AddressSpace::UNKNOWN, twin, ExecMode::Bits64)
                .is_some()
        );
    }
}
