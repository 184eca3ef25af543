//! BTS records: branch from, branch to and the predicted flag, 12 bytes in
//! the 32-bit DS layout and 24 bytes in the 64-bit one (SDM Vol. 3B §18.4.9
//! “BTS and DS Save Area”, figures “BTS Record Format” and
//! “64-bit Branch Trace Record Format”). Bit 4 of the third field says the
//! branch was predicted.

use crate::ds::DsFormat;
use hwtrace_types::Ip;

/// One branch record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BtsRecord {
    /// Linear address of the branch instruction.
    pub from: Ip,
    /// Linear address of the branch target.
    pub to: Ip,
    /// The processor predicted the branch (bit 4 of the flags field).
    pub predicted: bool,
}

/// Errors reading or writing records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BtsError {
    /// Not enough bytes for one record.
    #[error("a {format:?} BTS record needs {needed} bytes, got {got}")]
    TooShort {
        /// The layout.
        format: DsFormat,
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// An address too wide for the 32-bit record.
    #[error("address {0} does not fit a 32-bit BTS record")]
    AddressTooWide(Ip),
}

/// Bit 4 of the flags field.
const PREDICTED: u64 = 1 << 4;

impl BtsRecord {
    /// Reads one record from the start of `bytes`.
    pub fn parse(bytes: &[u8], format: DsFormat) -> Result<Self, BtsError> {
        let w = format.word();
        let needed = 3 * w;
        let rec = bytes.get(..needed).ok_or(BtsError::TooShort {
            format,
            needed,
            got: bytes.len(),
        })?;
        let word = |i: usize| {
            let mut buf = [0u8; 8];
            buf[..w].copy_from_slice(&rec[i * w..(i + 1) * w]);
            u64::from_le_bytes(buf)
        };
        Ok(Self {
            from: Ip(word(0)),
            to: Ip(word(1)),
            predicted: word(2) & PREDICTED != 0,
        })
    }

    /// Writes the record to the start of `out` (reserved flag bits zero),
    /// returning the bytes written.
    pub fn write(&self, format: DsFormat, out: &mut [u8]) -> Result<usize, BtsError> {
        let w = format.word();
        let needed = 3 * w;
        let got = out.len();
        let rec = out.get_mut(..needed).ok_or(BtsError::TooShort {
            format,
            needed,
            got,
        })?;
        let flags = if self.predicted { PREDICTED } else { 0 };
        for (i, value) in [self.from.0, self.to.0, flags].into_iter().enumerate() {
            if format == DsFormat::Bits32 && value > u64::from(u32::MAX) {
                return Err(BtsError::AddressTooWide(Ip(value)));
            }
            rec[i * w..(i + 1) * w].copy_from_slice(&value.to_le_bytes()[..w]);
        }
        Ok(needed)
    }
}

/// The records of a BTS buffer, oldest first as written from the base;
/// a trailing partial record is ignored.
pub fn records(buffer: &[u8], format: DsFormat) -> impl Iterator<Item = BtsRecord> + '_ {
    let size = 3 * format.word();
    buffer
        .chunks_exact(size)
        .filter_map(move |c| BtsRecord::parse(c, format).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 001's example: `jnz` at 0x80001240 taken to 0x80002000.
    #[test]
    fn seed_001_record_round_trips_in_both_sizes() {
        let r = BtsRecord {
            from: Ip(0x8000_1240),
            to: Ip(0x8000_2000),
            predicted: true,
        };
        let mut buf = [0u8; 24];
        assert_eq!(r.write(DsFormat::Bits32, &mut buf), Ok(12));
        assert_eq!(
            &buf[..12],
            &[0x40, 0x12, 0, 0x80, 0, 0x20, 0, 0x80, 0x10, 0, 0, 0]
        );
        assert_eq!(BtsRecord::parse(&buf, DsFormat::Bits32), Ok(r));
        assert_eq!(r.write(DsFormat::Bits64, &mut buf), Ok(24));
        assert_eq!(BtsRecord::parse(&buf, DsFormat::Bits64), Ok(r));
        assert_eq!(buf[16], 0x10);
    }

    #[test]
    fn short_input_and_wide_addresses_are_errors() {
        assert_eq!(
            BtsRecord::parse(&[0; 23], DsFormat::Bits64),
            Err(BtsError::TooShort {
                format: DsFormat::Bits64,
                needed: 24,
                got: 23
            })
        );
        let wide = BtsRecord {
            from: Ip(0xFFFF_8000_0000_0000),
            to: Ip(0),
            predicted: false,
        };
        assert!(matches!(
            wide.write(DsFormat::Bits32, &mut [0; 12]),
            Err(BtsError::AddressTooWide(_))
        ));
    }

    #[test]
    fn buffer_iterates_whole_records_only() {
        let mut buf = [0u8; 12 * 3 + 5];
        for i in 0..3u64 {
            let r = BtsRecord {
                from: Ip(0x100 + i),
                to: Ip(0x200 + i),
                predicted: i == 1,
            };
            r.write(DsFormat::Bits32, &mut buf[i as usize * 12..])
                .expect("room");
        }
        let got: std::vec::Vec<_> = records(&buf, DsFormat::Bits32).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[1],
            BtsRecord {
                from: Ip(0x101),
                to: Ip(0x201),
                predicted: true
            }
        );
    }
}
