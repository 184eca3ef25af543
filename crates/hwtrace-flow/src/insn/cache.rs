//! Decoded instructions, kept per address space and IP so hot code is
//! decoded once.

use super::classify::{Decoded, MAX_INSN_SIZE};
use hwtrace_packet::ExecMode;
use hwtrace_types::AddressSpace;
use std::collections::HashMap;

/// How many instructions the cache keeps before it starts over (bounded
/// memory on huge code footprints).
const CAPACITY: usize = 1 << 18;

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
    map: HashMap<Key, Cached>,
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
        self.map.clear();
    }

    /// The instruction at `ip`, if cached.
    pub fn get(&self, space: AddressSpace, ip: u64, mode: ExecMode) -> Option<&Cached> {
        self.map.get(&key(space, ip, mode))
    }

    /// Remembers an instruction.
    pub fn insert(&mut self, space: AddressSpace, ip: u64, mode: ExecMode, entry: Cached) {
        if self.map.len() >= CAPACITY {
            self.map.clear();
        }
        self.map.insert(key(space, ip, mode), entry);
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
}
