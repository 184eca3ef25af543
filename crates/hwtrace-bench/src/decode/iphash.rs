//! A hash of an instruction-address sequence, so decoders that print
//! addresses (hwtrace, perf) and those that return them (libipt) can be
//! checked to report the same instructions in the same order without
//! keeping the sequences.

/// FNV-1a over each address's eight little-endian bytes, and the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpHash {
    hash: u64,
    count: u64,
}

impl Default for IpHash {
    fn default() -> Self {
        Self {
            hash: 0xcbf2_9ce4_8422_2325,
            count: 0,
        }
    }
}

impl IpHash {
    /// Adds the next address.
    pub fn add(&mut self, ip: u64) {
        for b in ip.to_le_bytes() {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.count += 1;
    }

    /// The hash so far.
    pub fn value(&self) -> u64 {
        self.hash
    }

    /// How many addresses were added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Adds the address a line of decoder output names, if it names one:
    /// the first whitespace-separated word when it is all hex digits
    /// (`perf script -F ip`, `hwtrace flow --no-disasm`), after a `? `
    /// speculation mark. Lines in brackets (events, errors) are skipped.
    pub fn add_line(&mut self, line: &[u8]) -> bool {
        let mut words = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty());
        let mut word = words.next();
        if word == Some(b"?") {
            word = words.next();
        }
        let Some(word) = word else { return false };
        if word.is_empty() || word.len() > 16 || !word.iter().all(u8::is_ascii_hexdigit) {
            return false;
        }
        let mut ip = 0u64;
        for &b in word {
            let d = (b as char).to_digit(16).unwrap_or(0);
            ip = ip << 4 | u64::from(d);
        }
        self.add(ip);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_perf_and_hwtrace_hash_alike() {
        let mut perf = IpHash::default();
        for l in [
            "     7ffff78508e0",
            "\t7ffff78508e2",
            "  instruction trace error",
        ] {
            perf.add_line(l.as_bytes());
        }
        let mut ours = IpHash::default();
        for l in [
            "00007ffff78508e0",
            "[enabled]",
            "? 00007ffff78508e2",
            "[1f, 7ffff78508e3: error: x]",
        ] {
            ours.add_line(l.as_bytes());
        }
        let mut direct = IpHash::default();
        direct.add(0x7fff_f785_08e0);
        direct.add(0x7fff_f785_08e2);
        assert_eq!(perf, direct);
        assert_eq!(ours, direct);
        assert_eq!(direct.count(), 2);
        let mut swapped = IpHash::default();
        swapped.add(0x7fff_f785_08e2);
        swapped.add(0x7fff_f785_08e0);
        assert_ne!(swapped.value(), direct.value());
    }
}
