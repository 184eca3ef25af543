//! [`IntHasher`]: a multiply-rotate hasher for the integer keys of hot
//! maps (code addresses, block ids, address spaces). Decoders and answers
//! look such keys up once per block; SipHash, the standard library's
//! default, cost more than the lookups it served. Not for keys an
//! attacker chooses to collide (it has no seed).

use core::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher over the integers a key is made of.
#[derive(Clone, Copy, Debug, Default)]
pub struct IntHasher(u64);

/// Builds [`IntHasher`]s: `HashMap<K, V, BuildIntHasher>`.
pub type BuildIntHasher = BuildHasherDefault<IntHasher>;

impl Hasher for IntHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }

    #[inline]
    fn write_u16(&mut self, v: u16) {
        self.write_u64(u64::from(v));
    }

    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.write_u64(u64::from(v));
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    #[inline]
    fn write_isize(&mut self, v: isize) {
        self.write_u64(v as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::{BuildHasher, Hash};

    fn hash(v: impl Hash) -> u64 {
        BuildIntHasher::default().hash_one(v)
    }

    #[test]
    fn keys_that_differ_hash_apart() {
        assert_ne!(hash((1u64, 2u32)), hash((2u64, 1u32)));
        assert_ne!(hash(Some(0u32)), hash(None::<u32>));
        assert_eq!(hash(0x40_1000u64), hash(0x40_1000u64));
        // Nearby code addresses spread over the low bits a table indexes by.
        let mut low: [bool; 64] = [false; 64];
        for ip in 0x40_1000u64..0x40_1040 {
            low[(hash(ip) & 63) as usize] = true;
        }
        assert!(low.iter().filter(|&&b| b).count() > 32);
    }
}
