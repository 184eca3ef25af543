//! IA32_DS_AREA (MSR 600H) and the DS buffer management area it points at,
//! in the 32-bit and 64-bit layouts (SDM Vol. 3B §18.4.9 “BTS and DS Save
//! Area”, §18.4.9.1 “64 Bit Format of the DS Save Area”), and the rules for
//! the BTS fields (§18.4.9 field descriptions, quoted by seed 002).

use crate::debugctl::BtsMode;
use crate::field::{FieldDef, FieldKind, RegisterDef};

/// 32-bit (IA-32, and seed 001's Pentium 4) or 64-bit (IA-32e) layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DsFormat {
    /// Four-byte pointers, 12-byte BTS records.
    Bits32,
    /// Eight-byte pointers, 24-byte BTS records.
    Bits64,
}

impl DsFormat {
    /// Bytes per pointer field.
    pub const fn word(self) -> usize {
        match self {
            Self::Bits32 => 4,
            Self::Bits64 => 8,
        }
    }

    /// Bytes per BTS record.
    pub const fn bts_record_size(self) -> u64 {
        match self {
            Self::Bits32 => 12,
            Self::Bits64 => 24,
        }
    }

    /// Bytes of the management area this crate reads and writes: eight
    /// pointers and the first PEBS counter reset value.
    pub const fn area_size(self) -> usize {
        match self {
            Self::Bits32 => 0x28,
            Self::Bits64 => 0x48,
        }
    }

    const fn counter_reset_offset(self) -> usize {
        match self {
            Self::Bits32 => 0x20,
            Self::Bits64 => 0x40,
        }
    }
}

/// Errors reading, writing or checking a DS area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DsError {
    /// The byte slice is shorter than the layout.
    #[error("the DS management area needs {needed} bytes in the {format:?} layout, got {got}")]
    TooShort {
        /// The layout.
        format: DsFormat,
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// A pointer too wide for the 32-bit layout.
    #[error("{field} = {value:#x} does not fit the 32-bit DS layout")]
    PointerTooWide {
        /// The field.
        field: &'static str,
        /// The value.
        value: u64,
    },
    /// BTS buffer base not on a doubleword boundary.
    #[error("BTS buffer base {base:#x} is not doubleword aligned, as the SDM requires")]
    BaseMisaligned {
        /// The base.
        base: u64,
    },
    /// Absolute maximum not above base plus one record.
    #[error(
        "BTS absolute maximum {max:#x} leaves room for less than one {record}-byte record after base \
         {base:#x}: BTS behaviour is undefined"
    )]
    BufferTooSmall {
        /// The base.
        base: u64,
        /// The absolute maximum.
        max: u64,
        /// The record size.
        record: u64,
    },
    /// A pointer not a whole number of records from the base.
    #[error(
        "{field} {value:#x} is not a whole number of {record}-byte records from the buffer base {base:#x}"
    )]
    NotOnRecordBoundary {
        /// The field.
        field: &'static str,
        /// The value.
        value: u64,
        /// The base.
        base: u64,
        /// The record size.
        record: u64,
    },
    /// Index outside base..=absolute maximum.
    #[error("BTS index {index:#x} is outside the buffer [{base:#x}, {max:#x}]")]
    IndexOutOfBuffer {
        /// The index.
        index: u64,
        /// The base.
        base: u64,
        /// The absolute maximum.
        max: u64,
    },
    /// With BTINT, the threshold must leave room before the end.
    #[error(
        "BTS interrupt threshold {threshold:#x} is not inside the buffer before its absolute maximum \
         {max:#x}: with BTINT the interrupt would never be raised before the buffer is full"
    )]
    ThresholdNotBeforeEnd {
        /// The threshold.
        threshold: u64,
        /// The absolute maximum.
        max: u64,
    },
    /// In circular mode the threshold must lie beyond the buffer.
    #[error(
        "circular BTS buffer (BTINT = 0) with interrupt threshold {threshold:#x} not above the absolute \
         maximum {max:#x}: clearing BTINT is not enough, the processor still interrupts at the threshold"
    )]
    CircularWithThreshold {
        /// The threshold.
        threshold: u64,
        /// The absolute maximum.
        max: u64,
    },
}

/// The DS buffer management area (the BTS and PEBS pointer fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DsManagementArea {
    /// Linear address of the first byte of the BTS buffer.
    pub bts_buffer_base: u64,
    /// Linear address of the next BTS record to write.
    pub bts_index: u64,
    /// Linear address just past the end of the BTS buffer.
    pub bts_absolute_maximum: u64,
    /// Linear address of the BTS record that raises the interrupt.
    pub bts_interrupt_threshold: u64,
    /// Linear address of the first byte of the PEBS buffer.
    pub pebs_buffer_base: u64,
    /// Linear address of the next PEBS record to write.
    pub pebs_index: u64,
    /// Linear address just past the end of the PEBS buffer.
    pub pebs_absolute_maximum: u64,
    /// Linear address of the PEBS record that raises the interrupt.
    pub pebs_interrupt_threshold: u64,
    /// Counter reset value for PEBS counter 0.
    pub pebs_counter_reset: u64,
}

const NAMES: [&str; 8] = [
    "BTS buffer base",
    "BTS index",
    "BTS absolute maximum",
    "BTS interrupt threshold",
    "PEBS buffer base",
    "PEBS index",
    "PEBS absolute maximum",
    "PEBS interrupt threshold",
];

impl DsManagementArea {
    fn pointers(&self) -> [u64; 8] {
        [
            self.bts_buffer_base,
            self.bts_index,
            self.bts_absolute_maximum,
            self.bts_interrupt_threshold,
            self.pebs_buffer_base,
            self.pebs_index,
            self.pebs_absolute_maximum,
            self.pebs_interrupt_threshold,
        ]
    }

    /// Parses the area from little-endian bytes.
    pub fn parse(bytes: &[u8], format: DsFormat) -> Result<Self, DsError> {
        let needed = format.area_size();
        let area = bytes.get(..needed).ok_or(DsError::TooShort {
            format,
            needed,
            got: bytes.len(),
        })?;
        let w = format.word();
        let mut p = [0u64; 8];
        for (i, slot) in p.iter_mut().enumerate() {
            *slot = read_le(&area[i * w..(i + 1) * w]);
        }
        let reset_at = format.counter_reset_offset();
        Ok(Self {
            bts_buffer_base: p[0],
            bts_index: p[1],
            bts_absolute_maximum: p[2],
            bts_interrupt_threshold: p[3],
            pebs_buffer_base: p[4],
            pebs_index: p[5],
            pebs_absolute_maximum: p[6],
            pebs_interrupt_threshold: p[7],
            pebs_counter_reset: read_le(&area[reset_at..reset_at + 8]),
        })
    }

    /// Writes the area as little-endian bytes into `out`, returning the
    /// number of bytes written.
    pub fn write(&self, format: DsFormat, out: &mut [u8]) -> Result<usize, DsError> {
        let needed = format.area_size();
        let got = out.len();
        let area = out.get_mut(..needed).ok_or(DsError::TooShort {
            format,
            needed,
            got,
        })?;
        let w = format.word();
        for (i, (value, field)) in self.pointers().into_iter().zip(NAMES).enumerate() {
            if format == DsFormat::Bits32 && value > u64::from(u32::MAX) {
                return Err(DsError::PointerTooWide { field, value });
            }
            area[i * w..(i + 1) * w].copy_from_slice(&value.to_le_bytes()[..w]);
        }
        let reset_at = format.counter_reset_offset();
        area[8 * w..reset_at].fill(0);
        area[reset_at..reset_at + 8].copy_from_slice(&self.pebs_counter_reset.to_le_bytes());
        Ok(needed)
    }

    /// Checks the BTS fields for `mode` and summarises the buffer.
    pub fn check_bts(&self, format: DsFormat, mode: BtsMode) -> Result<BtsBufferInfo, DsError> {
        let record = format.bts_record_size();
        let (base, max, index, threshold) = (
            self.bts_buffer_base,
            self.bts_absolute_maximum,
            self.bts_index,
            self.bts_interrupt_threshold,
        );
        if base % 4 != 0 {
            return Err(DsError::BaseMisaligned { base });
        }
        if max < base || max - base < record {
            return Err(DsError::BufferTooSmall { base, max, record });
        }
        // The SDM describes the maximum as "a multiple of the record size
        // plus 1" past the base; common drivers use an exact multiple. Accept both.
        let span = max - base;
        if span % record > 1 {
            return Err(DsError::NotOnRecordBoundary {
                field: "BTS absolute maximum",
                value: max,
                base,
                record,
            });
        }
        let capacity = span / record;
        if index < base || index > max {
            return Err(DsError::IndexOutOfBuffer { index, base, max });
        }
        if (index - base) % record != 0 {
            return Err(DsError::NotOnRecordBoundary {
                field: "BTS index",
                value: index,
                base,
                record,
            });
        }
        let threshold_record = match mode {
            BtsMode::InterruptOnThreshold => {
                if threshold < base || threshold >= base + capacity * record {
                    return Err(DsError::ThresholdNotBeforeEnd { threshold, max });
                }
                if (threshold - base) % record != 0 {
                    return Err(DsError::NotOnRecordBoundary {
                        field: "BTS interrupt threshold",
                        value: threshold,
                        base,
                        record,
                    });
                }
                Some((threshold - base) / record)
            }
            BtsMode::CircularBuffer => {
                if threshold <= max {
                    return Err(DsError::CircularWithThreshold { threshold, max });
                }
                None
            }
            BtsMode::Off | BtsMode::BusMessages => None,
        };
        Ok(BtsBufferInfo {
            capacity,
            written: (index - base) / record,
            threshold_record,
        })
    }
}

/// A checked BTS buffer, counted in records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtsBufferInfo {
    /// Records the buffer holds.
    pub capacity: u64,
    /// Records written so far (index − base).
    pub written: u64,
    /// The record whose write raises the interrupt (interrupt mode only).
    pub threshold_record: Option<u64>,
}

impl BtsBufferInfo {
    /// Records left after the interrupt for the handler to drain in time.
    pub const fn headroom(&self) -> Option<u64> {
        match self.threshold_record {
            Some(t) => Some(self.capacity - t),
            None => None,
        }
    }
}

fn read_le(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = bytes.len().min(8);
    buf[..n].copy_from_slice(&bytes[..n]);
    u64::from_le_bytes(buf)
}

/// Layout of IA32_DS_AREA.
pub static DS_AREA: RegisterDef = RegisterDef {
    name: "IA32_DS_AREA",
    sdm: "SDM Vol. 3B §18.4.9 “BTS and DS Save Area”",
    reserved: 0,
    width: 64,
    fields: &[FieldDef::field(
        "DSBufferManagementArea",
        63,
        0,
        FieldKind::Address,
    )],
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 001: a 2000-record BTS buffer (Pentium 4, 12-byte records) with
    /// the interrupt threshold at record 1900, index at the base.
    fn seed_001(base: u64) -> DsManagementArea {
        DsManagementArea {
            bts_buffer_base: base,
            bts_index: base,
            bts_absolute_maximum: base + 2000 * 12,
            bts_interrupt_threshold: base + 1900 * 12,
            ..DsManagementArea::default()
        }
    }

    #[test]
    fn seed_001_buffer_interrupts_at_record_1900() {
        let ds = seed_001(0x8100_0000);
        let info = ds
            .check_bts(DsFormat::Bits32, BtsMode::InterruptOnThreshold)
            .expect("seed 001 is valid");
        assert_eq!(
            info,
            BtsBufferInfo {
                capacity: 2000,
                written: 0,
                threshold_record: Some(1900)
            }
        );
        assert_eq!(info.headroom(), Some(100));
        // The same area used as a circular buffer would still interrupt.
        assert_eq!(
            ds.check_bts(DsFormat::Bits32, BtsMode::CircularBuffer),
            Err(DsError::CircularWithThreshold {
                threshold: 0x8100_0000 + 1900 * 12,
                max: 0x8100_0000 + 24000
            })
        );
        let circular = DsManagementArea {
            bts_interrupt_threshold: ds.bts_absolute_maximum + 1,
            ..ds
        };
        assert!(
            circular
                .check_bts(DsFormat::Bits32, BtsMode::CircularBuffer)
                .is_ok()
        );
    }

    #[test]
    fn seed_001_area_round_trips_through_bytes_in_both_layouts() {
        let ds = DsManagementArea {
            pebs_counter_reset: 0xFFFF_FFFF_FF00_0000,
            ..seed_001(0x8100_0000)
        };
        for format in [DsFormat::Bits32, DsFormat::Bits64] {
            let mut bytes = [0xAAu8; 0x48];
            let n = ds.write(format, &mut bytes).expect("fits");
            assert_eq!(n, format.area_size());
            assert_eq!(DsManagementArea::parse(&bytes[..n], format), Ok(ds));
        }
        let mut bytes = [0u8; 0x28];
        ds.write(DsFormat::Bits32, &mut bytes).expect("fits");
        assert_eq!(&bytes[8..12], &(0x8100_0000u32 + 24000).to_le_bytes());
        assert_eq!(
            DsManagementArea::parse(&bytes[..0x27], DsFormat::Bits32),
            Err(DsError::TooShort {
                format: DsFormat::Bits32,
                needed: 0x28,
                got: 0x27
            })
        );
        let wide = seed_001(0x1_0000_0000);
        assert!(matches!(
            wide.write(DsFormat::Bits32, &mut bytes),
            Err(DsError::PointerTooWide { .. })
        ));
    }

    #[test]
    fn bts_rules_are_enforced() {
        let base = 0x1000;
        let good = seed_001(base);
        let check =
            |ds: DsManagementArea| ds.check_bts(DsFormat::Bits32, BtsMode::InterruptOnThreshold);
        assert!(matches!(
            check(DsManagementArea {
                bts_buffer_base: 0x1002,
                ..good
            }),
            Err(DsError::BaseMisaligned { .. })
        ));
        assert!(matches!(
            check(DsManagementArea {
                bts_absolute_maximum: base + 11,
                ..good
            }),
            Err(DsError::BufferTooSmall { .. })
        ));
        assert!(matches!(
            check(DsManagementArea {
                bts_interrupt_threshold: base + 13,
                ..good
            }),
            Err(DsError::NotOnRecordBoundary {
                field: "BTS interrupt threshold",
                ..
            })
        ));
        assert!(matches!(
            check(DsManagementArea {
                bts_interrupt_threshold: good.bts_absolute_maximum,
                ..good
            }),
            Err(DsError::ThresholdNotBeforeEnd { .. })
        ));
        assert!(matches!(
            check(DsManagementArea {
                bts_index: good.bts_absolute_maximum + 12,
                ..good
            }),
            Err(DsError::IndexOutOfBuffer { .. })
        ));
        // "A multiple of the record size plus 1" is accepted.
        assert!(
            check(DsManagementArea {
                bts_absolute_maximum: good.bts_absolute_maximum + 1,
                ..good
            })
            .is_ok()
        );
        assert!(matches!(
            check(DsManagementArea {
                bts_absolute_maximum: good.bts_absolute_maximum + 5,
                ..good
            }),
            Err(DsError::NotOnRecordBoundary {
                field: "BTS absolute maximum",
                ..
            })
        ));
    }
}
