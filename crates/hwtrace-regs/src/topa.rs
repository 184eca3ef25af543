//! Table of Physical Addresses (ToPA): entries, building tables and checking
//! them the way the processor would (SDM Vol. 3C §33.2.7.2 “Table of Physical
//! Addresses (ToPA)”, “ToPA Table Entry Format” and “ToPA Errors”).

use crate::cpuid::PtCaps;
use crate::field::{FieldDef, FieldKind, Meaning, RegisterDef};
use crate::macros::{flags, raw_register};
use hwtrace_types::PhysAddr;

/// An output region size, encoded in bits 9:6 of an entry: 4 KiB × 2^n,
/// from 4 KiB (0) to 128 MiB (15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopaSize(u8);

impl TopaSize {
    /// 4 KiB, the smallest region.
    pub const SIZE_4K: Self = Self(0);
    /// 128 MiB, the largest region.
    pub const SIZE_128M: Self = Self(15);

    /// The size with encoding `n` (0..=15).
    pub const fn from_encoding(n: u8) -> Option<Self> {
        if n <= 15 { Some(Self(n)) } else { None }
    }

    /// The size of `bytes`, which must be a power of two from 4 KiB to 128 MiB.
    pub const fn from_bytes(bytes: u64) -> Option<Self> {
        if !bytes.is_power_of_two() || bytes < 4096 || bytes > (128 << 20) {
            return None;
        }
        Some(Self((bytes.trailing_zeros() - 12) as u8))
    }

    /// The 4-bit encoding.
    pub const fn encoding(self) -> u8 {
        self.0
    }

    /// The region size in bytes.
    pub const fn bytes(self) -> u64 {
        4096 << self.0
    }
}

/// One 8-byte ToPA table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TopaEntry(u64);
raw_register!(TopaEntry);

impl TopaEntry {
    /// Reserved bits 1, 3, 5 and 11:10 (bits at and above MAXPHYADDR too,
    /// checked where MAXPHYADDR is known).
    pub const RESERVED: u64 = 0xC2A;
    /// Bits 63:12: the output region base (END=0) or next table base (END=1).
    pub const BASE_MASK: u64 = !0xFFF;

    flags! {
        /// END (bit 0): this entry links to the next table instead of an output region.
        end, with_end = 0;
        /// INT (bit 2): raise a PMI when the region is filled.
        int, with_int = 2;
        /// STOP (bit 4): stop tracing (STATUS.Stopped) when the region is filled.
        stop, with_stop = 4;
    }

    /// An output-region entry.
    pub const fn output(base: PhysAddr, size: TopaSize, int: bool, stop: bool) -> Self {
        Self(base.0 & Self::BASE_MASK)
            .with_size(size)
            .with_int(int)
            .with_stop(stop)
    }

    /// An END entry linking to the table at `next_table`.
    pub const fn end_link(next_table: PhysAddr) -> Self {
        Self((next_table.0 & Self::BASE_MASK) | 1)
    }

    /// Size (bits 9:6) of the output region.
    pub const fn size(self) -> TopaSize {
        TopaSize(((self.0 >> 6) & 0xF) as u8)
    }

    /// Returns a copy with the size field set.
    #[must_use]
    pub const fn with_size(self, size: TopaSize) -> Self {
        Self((self.0 & !(0xF << 6)) | ((size.0 as u64) << 6))
    }

    /// The base address in bits 63:12.
    pub const fn base(self) -> PhysAddr {
        PhysAddr(self.0 & Self::BASE_MASK)
    }
}

fn topa_size_meaning(v: u64) -> Meaning {
    Meaning::Bytes(4096 << (v & 0xF))
}

/// Layout of a ToPA table entry.
pub static TOPA_ENTRY: RegisterDef = RegisterDef {
    name: "TOPA_ENTRY",
    sdm: "SDM Vol. 3C §33.2.7.2 “ToPA Table Entry Format”",
    reserved: TopaEntry::RESERVED,
    width: 64,
    fields: &[
        FieldDef::flag(
            "END",
            0,
            "link: the base is the next ToPA table",
            "output region entry",
        ),
        FieldDef::flag("INT", 2, "PMI when this region is filled", "no PMI"),
        FieldDef::flag(
            "STOP",
            4,
            "tracing stops (STATUS.Stopped) when this region is filled",
            "tracing goes on",
        ),
        FieldDef::field("Size", 9, 6, FieldKind::Computed(topa_size_meaning)),
        FieldDef::field("OutputRegionBase", 63, 12, FieldKind::Address),
    ],
};

/// One output region to put in a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopaRegion {
    /// Physical base, aligned to `size`.
    pub base: PhysAddr,
    /// Region size.
    pub size: TopaSize,
    /// PMI when filled.
    pub int: bool,
    /// Stop tracing when filled.
    pub stop: bool,
}

/// Why a ToPA table is refused. Entry indexes count from 0 at the table base.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopaError {
    /// The processor cannot use ToPA at all.
    #[error("ToPA output is not supported (CPUID.(EAX=14H,ECX=0):ECX[0] = 0)")]
    NotSupported,
    /// The table has no END and no STOP entry: the processor would read past its end.
    #[error(
        "ToPA table at {table} has no END entry and no STOP entry in its {entries} entries: \
         the processor would read whatever follows the table as entries"
    )]
    NotTerminated {
        /// The table base.
        table: PhysAddr,
        /// Entries examined.
        entries: usize,
    },
    /// The table holds no output region before its END entry.
    #[error("ToPA table at {table} has no output region before its END entry (entry {index})")]
    NoOutputRegion {
        /// The table base.
        table: PhysAddr,
        /// Index of the END entry.
        index: usize,
    },
    /// Reserved bits set in an entry.
    #[error(
        "ToPA entry {index} has reserved bits {bits:#x} set: the processor signals an operational error"
    )]
    ReservedBits {
        /// The entry index.
        index: usize,
        /// The offending bits.
        bits: u64,
    },
    /// INT or STOP set on an END entry, which the SDM treats as a reserved-bit violation.
    #[error(
        "ToPA entry {index} is an END entry with INT or STOP set; those bits must be 0 when END=1"
    )]
    FlagsOnEnd {
        /// The entry index.
        index: usize,
    },
    /// An output region not aligned to its size.
    #[error(
        "ToPA entry {index}: output region {base} is not aligned to its size of {size} bytes \
         (operational error when the processor reaches it)"
    )]
    RegionMisaligned {
        /// The entry index.
        index: usize,
        /// The region base.
        base: PhysAddr,
        /// The region size.
        size: u64,
    },
    /// An address at or above MAXPHYADDR.
    #[error("ToPA entry {index}: address {base} needs more than MAXPHYADDR = {max_phys_addr} bits")]
    BeyondMaxPhysAddr {
        /// The entry index.
        index: usize,
        /// The address.
        base: PhysAddr,
        /// MAXPHYADDR.
        max_phys_addr: u8,
    },
    /// More than one output entry where the processor allows only one.
    #[error(
        "ToPA table at {table} has {count} output entries, but this processor allows one \
         (CPUID.(EAX=14H,ECX=0):ECX[1] = 0)"
    )]
    MultipleEntriesUnsupported {
        /// The table base.
        table: PhysAddr,
        /// Output entries found.
        count: usize,
    },
    /// A single-entry processor needs END back to the same table.
    #[error(
        "ToPA table at {table}: on a single-entry processor the output entry must be followed by \
         END pointing back to the table itself"
    )]
    SingleEntryNeedsEndToSelf {
        /// The table base.
        table: PhysAddr,
    },
    /// The output slice is too small for the table being built.
    #[error("the ToPA table needs {needed} entries but the buffer holds {capacity}")]
    BufferTooSmall {
        /// Entries needed.
        needed: usize,
        /// Entries available.
        capacity: usize,
    },
    /// A table base that is not 4 KiB aligned.
    #[error("ToPA table base {table} is not 4 KiB aligned")]
    TableMisaligned {
        /// The table base.
        table: PhysAddr,
    },
}

/// What the table after the regions does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopaLink {
    /// END entry pointing at a table (the same table makes a ring buffer).
    End(PhysAddr),
    /// No END entry: the last region must have STOP set.
    None,
}

/// A checked summary of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopaSummary {
    /// Output entries before END (or up to and including the first STOP).
    pub output_entries: usize,
    /// Their total size in bytes.
    pub total_bytes: u64,
    /// The END entry's link, if the table reaches one.
    pub end_link: Option<PhysAddr>,
    /// Index of the first output entry with STOP.
    pub first_stop: Option<usize>,
    /// Number of output entries with INT.
    pub interrupts: usize,
}

/// Writes a table at `table_base` for `regions` into `out`, then checks it
/// with [`validate_table`]. Returns the number of entries written.
pub fn build_table(
    table_base: PhysAddr,
    regions: &[TopaRegion],
    link: TopaLink,
    out: &mut [TopaEntry],
    caps: &PtCaps,
    max_phys_addr: u8,
) -> Result<usize, TopaError> {
    let needed = regions.len() + usize::from(matches!(link, TopaLink::End(_)));
    if needed > out.len() {
        return Err(TopaError::BufferTooSmall {
            needed,
            capacity: out.len(),
        });
    }
    for (index, (slot, r)) in out.iter_mut().zip(regions).enumerate() {
        if r.base.0 & !TopaEntry::BASE_MASK != 0 {
            // The low 12 bits would be silently dropped: refuse instead.
            return Err(TopaError::RegionMisaligned {
                index,
                base: r.base,
                size: r.size.bytes(),
            });
        }
        *slot = TopaEntry::output(r.base, r.size, r.int, r.stop);
    }
    if let TopaLink::End(next) = link {
        if next.0 & 0xFFF != 0 {
            return Err(TopaError::TableMisaligned { table: next });
        }
        out[regions.len()] = TopaEntry::end_link(next);
    }
    validate_table(table_base, &out[..needed], caps, max_phys_addr)?;
    Ok(needed)
}

/// Checks a table as the processor will walk it from its first entry: stops
/// at the first END entry or after the first STOP region.
pub fn validate_table(
    table_base: PhysAddr,
    entries: &[TopaEntry],
    caps: &PtCaps,
    max_phys_addr: u8,
) -> Result<TopaSummary, TopaError> {
    if !caps.topa() {
        return Err(TopaError::NotSupported);
    }
    if table_base.0 & 0xFFF != 0 {
        return Err(TopaError::TableMisaligned { table: table_base });
    }
    let phys_limit = if max_phys_addr >= 64 {
        u64::MAX
    } else {
        !(u64::MAX << max_phys_addr)
    };
    let mut summary = TopaSummary {
        output_entries: 0,
        total_bytes: 0,
        end_link: None,
        first_stop: None,
        interrupts: 0,
    };
    for (index, e) in entries.iter().enumerate() {
        let reserved = e.raw() & TopaEntry::RESERVED;
        if reserved != 0 {
            return Err(TopaError::ReservedBits {
                index,
                bits: reserved,
            });
        }
        if e.base().0 & !phys_limit != 0 {
            return Err(TopaError::BeyondMaxPhysAddr {
                index,
                base: e.base(),
                max_phys_addr,
            });
        }
        if e.end() {
            if e.int() || e.stop() {
                return Err(TopaError::FlagsOnEnd { index });
            }
            if summary.output_entries == 0 && e.base() == table_base {
                return Err(TopaError::NoOutputRegion {
                    table: table_base,
                    index,
                });
            }
            summary.end_link = Some(e.base());
            return check_single_entry(table_base, summary, caps);
        }
        let size = e.size().bytes();
        if e.base().0 & (size - 1) != 0 {
            return Err(TopaError::RegionMisaligned {
                index,
                base: e.base(),
                size,
            });
        }
        summary.output_entries += 1;
        summary.total_bytes = summary.total_bytes.saturating_add(size);
        summary.interrupts += usize::from(e.int());
        if e.stop() && summary.first_stop.is_none() {
            summary.first_stop = Some(index);
        }
    }
    if summary.first_stop.is_some() {
        return check_single_entry(table_base, summary, caps);
    }
    Err(TopaError::NotTerminated {
        table: table_base,
        entries: entries.len(),
    })
}

fn check_single_entry(
    table: PhysAddr,
    summary: TopaSummary,
    caps: &PtCaps,
) -> Result<TopaSummary, TopaError> {
    if caps.topa_multiple_entries() {
        return Ok(summary);
    }
    if summary.output_entries > 1 {
        return Err(TopaError::MultipleEntriesUnsupported {
            table,
            count: summary.output_entries,
        });
    }
    if summary.end_link != Some(table) {
        return Err(TopaError::SingleEntryNeedsEndToSelf { table });
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuid::CpuidRegs;

    fn caps(multi: bool) -> PtCaps {
        let ecx = if multi { 0b11 } else { 0b01 };
        PtCaps::new(
            CpuidRegs {
                eax: 1,
                ebx: 0,
                ecx,
                edx: 0,
            },
            CpuidRegs::default(),
        )
    }

    /// Seed 000 (WindowsIntelPT's AllocAndSetTopa): one 4 KiB entry per page
    /// of the buffer, INT and STOP on the last one, then END back to the
    /// table itself.
    #[test]
    fn seed_000_topa_with_int_and_stop_on_the_last_entry() {
        let table = PhysAddr(0x7_0000);
        let pages = [0x10_0000u64, 0x23_4000, 0x11_1000, 0x9_F000];
        let mut regions = [TopaRegion {
            base: PhysAddr(0),
            size: TopaSize::SIZE_4K,
            int: false,
            stop: false,
        }; 4];
        for (r, p) in regions.iter_mut().zip(pages) {
            r.base = PhysAddr(p);
        }
        regions[3].int = true;
        regions[3].stop = true;
        let mut out = [TopaEntry::new(); 8];
        let n = build_table(
            table,
            &regions,
            TopaLink::End(table),
            &mut out,
            &caps(true),
            39,
        )
        .expect("valid table");
        assert_eq!(n, 5);
        assert_eq!(out[3].raw(), 0x9_F000 | 0b10100);
        assert_eq!(out[4].raw(), 0x7_0001);
        let s = validate_table(table, &out[..n], &caps(true), 39).expect("valid");
        assert_eq!(s.output_entries, 4);
        assert_eq!(s.total_bytes, 16 << 10);
        assert_eq!(s.first_stop, Some(3));
        assert_eq!(s.interrupts, 1);
        assert_eq!(s.end_link, Some(table));
    }

    #[test]
    fn table_without_end_or_stop_is_refused() {
        let entries = [TopaEntry::output(
            PhysAddr(0x1000),
            TopaSize::SIZE_4K,
            true,
            false,
        )];
        let err = validate_table(PhysAddr(0x8000), &entries, &caps(true), 46).unwrap_err();
        assert_eq!(
            err,
            TopaError::NotTerminated {
                table: PhysAddr(0x8000),
                entries: 1
            }
        );
        assert!(format!("{err}").contains("no END entry and no STOP entry"));
    }

    #[test]
    fn stop_without_end_is_enough() {
        let entries = [TopaEntry::output(
            PhysAddr(0x1000),
            TopaSize::SIZE_4K,
            false,
            true,
        )];
        let s =
            validate_table(PhysAddr(0x8000), &entries, &caps(true), 46).expect("STOP terminates");
        assert_eq!(s.end_link, None);
    }

    #[test]
    fn misaligned_region_and_reserved_bits_are_refused() {
        let two_meg = TopaSize::from_bytes(2 << 20).expect("2 MiB is a ToPA size");
        let bad = [TopaEntry::output(PhysAddr(0x10_1000), two_meg, false, true)];
        assert!(matches!(
            validate_table(PhysAddr(0), &bad, &caps(true), 46),
            Err(TopaError::RegionMisaligned {
                index: 0,
                size: 0x20_0000,
                ..
            })
        ));
        let reserved = [TopaEntry::from_raw(0x1000 | 0b10010)];
        assert_eq!(
            validate_table(PhysAddr(0), &reserved, &caps(true), 46),
            Err(TopaError::ReservedBits {
                index: 0,
                bits: 0b10
            })
        );
    }

    #[test]
    fn single_entry_processors_need_one_region_and_end_to_self() {
        let table = PhysAddr(0x5000);
        let r = TopaRegion {
            base: PhysAddr(0x10_0000),
            size: TopaSize::SIZE_4K,
            int: true,
            stop: false,
        };
        let mut out = [TopaEntry::new(); 4];
        assert_eq!(
            build_table(
                table,
                &[r],
                TopaLink::End(table),
                &mut out,
                &caps(false),
                39
            ),
            Ok(2)
        );
        assert_eq!(
            build_table(
                table,
                &[r, r],
                TopaLink::End(table),
                &mut out,
                &caps(false),
                39
            ),
            Err(TopaError::MultipleEntriesUnsupported { table, count: 2 })
        );
        assert_eq!(
            build_table(
                table,
                &[r],
                TopaLink::End(PhysAddr(0x6000)),
                &mut out,
                &caps(false),
                39
            ),
            Err(TopaError::SingleEntryNeedsEndToSelf { table })
        );
    }

    #[test]
    fn end_first_to_itself_has_no_output() {
        let table = PhysAddr(0x5000);
        let entries = [TopaEntry::end_link(table)];
        assert_eq!(
            validate_table(table, &entries, &caps(true), 39),
            Err(TopaError::NoOutputRegion { table, index: 0 })
        );
    }

    #[test]
    fn sizes_cover_4k_to_128m() {
        assert_eq!(TopaSize::from_bytes(4096), Some(TopaSize::SIZE_4K));
        assert_eq!(TopaSize::from_bytes(128 << 20), Some(TopaSize::SIZE_128M));
        assert_eq!(TopaSize::from_bytes(256 << 20), None);
        assert_eq!(TopaSize::from_bytes(6000), None);
        assert_eq!(TopaSize::from_encoding(16), None);
        assert_eq!(TopaSize::SIZE_128M.bytes(), 128 << 20);
    }

    #[test]
    fn buffer_too_small_is_an_error() {
        let r = TopaRegion {
            base: PhysAddr(0x1000),
            size: TopaSize::SIZE_4K,
            int: false,
            stop: true,
        };
        let mut out = [TopaEntry::new(); 1];
        assert_eq!(
            build_table(
                PhysAddr(0),
                &[r],
                TopaLink::End(PhysAddr(0)),
                &mut out,
                &caps(true),
                39
            ),
            Err(TopaError::BufferTooSmall {
                needed: 2,
                capacity: 1
            })
        );
    }
}
