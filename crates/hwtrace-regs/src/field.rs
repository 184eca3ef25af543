//! Register layouts as data: named bit fields with a meaning for each value.
//!
//! Every register in this crate is described once, as a [`RegisterDef`]: a
//! list of [`FieldDef`]s (name as in the Intel SDM, bit range, how to read the
//! value) and the mask of bits the SDM calls reserved. The typed wrappers
//! (`RtitCtl`, `DebugCtl`, ...) are the convenient API; these tables are what
//! [`explain`](crate::explain()) prints and what [`compose`] builds from, so a
//! value built from names always explains back to the same names.

use core::fmt;

/// An inclusive range of bits, `hi:lo` as the SDM writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BitRange {
    /// Lowest bit.
    pub lo: u8,
    /// Highest bit (inclusive).
    pub hi: u8,
}

impl BitRange {
    /// A range `hi:lo`; `lo` must not exceed `hi` and `hi` must be below 64
    /// (the tables are checked by a unit test).
    pub const fn new(hi: u8, lo: u8) -> Self {
        Self { lo, hi }
    }

    /// A one-bit range.
    pub const fn bit(b: u8) -> Self {
        Self { lo: b, hi: b }
    }

    /// Number of bits.
    pub const fn width(self) -> u32 {
        (self.hi - self.lo) as u32 + 1
    }

    /// The in-place mask of the range.
    pub const fn mask(self) -> u64 {
        let w = self.width();
        let ones = if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
        ones << self.lo
    }

    /// The field's value, shifted down to bit 0.
    pub const fn get(self, raw: u64) -> u64 {
        (raw & self.mask()) >> self.lo
    }

    /// `raw` with the field replaced by `value`; bits of `value` above the
    /// field width are dropped (callers check the width first).
    pub const fn set(self, raw: u64, value: u64) -> u64 {
        (raw & !self.mask()) | ((value << self.lo) & self.mask())
    }
}

impl fmt::Display for BitRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}:{}", self.hi, self.lo)
        }
    }
}

/// How the bits of a field are read.
#[derive(Debug, Clone, Copy)]
pub enum FieldKind {
    /// A one-bit flag with the meaning of each state.
    Flag {
        /// Meaning when the bit is 1.
        set: &'static str,
        /// Meaning when the bit is 0.
        clear: &'static str,
    },
    /// An encoded value; values not listed are reserved.
    Enum(&'static [(u64, &'static str)]),
    /// A plain number (count, index, bitmap).
    Number,
    /// An address kept in place: the field's value is `raw & mask`, not
    /// shifted, because the low bits are implied zero.
    Address,
    /// An address kept in place whose top field bit is copied into every bit
    /// above it (LBR formats that reuse the upper bits for flags).
    SignedAddress,
    /// A value whose meaning is computed (frequencies, sizes, ...).
    Computed(fn(u64) -> Meaning),
}

/// The meaning of one field value, printable with `Display`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Meaning {
    /// A fixed description.
    Text(&'static str),
    /// A number with no further meaning.
    Number(u64),
    /// An address.
    Address(u64),
    /// A size in bytes.
    Bytes(u64),
    /// "Once every 2^n `<unit>`".
    Period {
        /// The exponent.
        log2: u32,
        /// What is counted.
        unit: &'static str,
    },
    /// IA32_RTIT_OUTPUT_MASK_PTRS.MaskOrTableOffset, whose meaning depends
    /// on IA32_RTIT_CTL.ToPA: both readings are given.
    MaskOrTableOffset(u64),
    /// An encoding the SDM reserves; hardware refuses or mis-handles it.
    Reserved(u64),
}

impl fmt::Display for Meaning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Meaning::Text(t) => f.write_str(t),
            Meaning::Number(n) => write!(f, "{n}"),
            Meaning::Address(a) => write!(f, "address {a:#x}"),
            Meaning::Bytes(b) => write_bytes(f, b),
            Meaning::Period { log2, unit } => {
                if log2 < 64 {
                    write!(f, "every {} {unit}", 1u64 << log2)
                } else {
                    write!(f, "every 2^{log2} {unit}")
                }
            }
            Meaning::MaskOrTableOffset(v) => {
                let mask = (v << 7) | 0x7F;
                write!(f, "single range: mask {mask:#x}")?;
                if (mask & mask.wrapping_add(1)) == 0 {
                    f.write_str(" (")?;
                    write_bytes(f, mask + 1)?;
                    f.write_str(" region)")?;
                } else {
                    f.write_str(" (not contiguous: operational error on enable)")?;
                }
                write!(f, "; ToPA: entry {v} at table offset {:#x}", v << 3)
            }
            Meaning::Reserved(v) => write!(f, "reserved encoding {v:#x} (must not be used)"),
        }
    }
}

fn write_bytes(f: &mut fmt::Formatter<'_>, b: u64) -> fmt::Result {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (size, name) in UNITS {
        if b >= size && b.is_multiple_of(size) {
            return write!(f, "{} {name}", b / size);
        }
    }
    write!(f, "{b} bytes")
}

/// One named field of a register.
#[derive(Debug, Clone, Copy)]
pub struct FieldDef {
    /// The name used by the Intel SDM (`TraceEn`, `BTS_OFF_OS`, ...).
    pub name: &'static str,
    /// Where the field lives.
    pub bits: BitRange,
    /// How to read it.
    pub kind: FieldKind,
}

impl FieldDef {
    /// A one-bit flag.
    pub const fn flag(name: &'static str, bit: u8, set: &'static str, clear: &'static str) -> Self {
        Self {
            name,
            bits: BitRange::bit(bit),
            kind: FieldKind::Flag { set, clear },
        }
    }

    /// A multi-bit field.
    pub const fn field(name: &'static str, hi: u8, lo: u8, kind: FieldKind) -> Self {
        Self {
            name,
            bits: BitRange::new(hi, lo),
            kind,
        }
    }

    /// The field's value as [`explain`](crate::explain()) reports it and
    /// [`compose`] accepts it: shifted down, except for in-place addresses.
    pub const fn value(&self, raw: u64) -> u64 {
        match self.kind {
            FieldKind::Address | FieldKind::SignedAddress => raw & self.bits.mask(),
            _ => self.bits.get(raw),
        }
    }

    /// Sign-extends an in-place value from the field's top bit (fields
    /// starting at bit 0 only; others are returned unchanged).
    const fn sign_extend(&self, value: u64) -> u64 {
        let top = self.bits.hi as u32;
        if self.bits.lo != 0 || top >= 63 {
            return value;
        }
        let shift = 63 - top;
        (((value << shift) as i64) >> shift) as u64
    }

    /// What a value of this field means.
    pub fn meaning(&self, value: u64) -> Meaning {
        match self.kind {
            FieldKind::Flag { set, clear } => Meaning::Text(if value != 0 { set } else { clear }),
            FieldKind::Enum(table) => table
                .iter()
                .find(|(v, _)| *v == value)
                .map_or(Meaning::Reserved(value), |(_, t)| Meaning::Text(t)),
            FieldKind::Number => Meaning::Number(value),
            FieldKind::Address => Meaning::Address(value),
            FieldKind::SignedAddress => Meaning::Address(self.sign_extend(value)),
            FieldKind::Computed(f) => f(value),
        }
    }

    /// `raw` with this field set to `value` (in the form [`FieldDef::value`]
    /// returns), or why the value does not fit.
    pub fn insert(&self, raw: u64, value: u64) -> Result<u64, ComposeError> {
        match self.kind {
            FieldKind::SignedAddress if self.sign_extend(value & self.bits.mask()) == value => {
                Ok((raw & !self.bits.mask()) | (value & self.bits.mask()))
            }
            FieldKind::Address | FieldKind::SignedAddress => {
                if value & !self.bits.mask() != 0 {
                    return Err(ComposeError::AddressNotRepresentable {
                        field: self.name,
                        value,
                        mask: self.bits.mask(),
                    });
                }
                Ok((raw & !self.bits.mask()) | value)
            }
            _ => {
                let width = self.bits.width();
                if width < 64 && value >> width != 0 {
                    return Err(ComposeError::ValueTooWide {
                        field: self.name,
                        value,
                        bits: width,
                    });
                }
                if let FieldKind::Enum(table) = self.kind
                    && !table.iter().any(|(v, _)| *v == value)
                {
                    return Err(ComposeError::ReservedEncoding {
                        field: self.name,
                        value,
                    });
                }
                Ok(self.bits.set(raw, value))
            }
        }
    }
}

/// A register layout: its SDM name, where the SDM defines it, its fields and
/// its reserved bits.
#[derive(Debug, Clone, Copy)]
pub struct RegisterDef {
    /// The SDM name (`IA32_RTIT_CTL`).
    pub name: &'static str,
    /// Where the layout is defined (`SDM Vol. 3C §33.2.8.2, Table 33-6`).
    pub sdm: &'static str,
    /// The named fields, lowest bit first.
    pub fields: &'static [FieldDef],
    /// Bits the SDM reserves; writing 1 to them faults or is mis-handled.
    pub reserved: u64,
    /// Width of the register in bits (64 for MSRs, 32 for CPUID registers).
    pub width: u32,
}

impl RegisterDef {
    /// The field called `name`, compared without regard to case.
    pub fn field(&self, name: &str) -> Option<&'static FieldDef> {
        self.fields
            .iter()
            .find(|f| f.name.eq_ignore_ascii_case(name))
    }

    /// Bits of `raw` outside the register width or in reserved positions.
    pub const fn reserved_set(&self, raw: u64) -> u64 {
        let beyond = if self.width >= 64 {
            0
        } else {
            !0u64 << self.width
        };
        raw & (self.reserved | beyond)
    }
}

/// Why a value could not be composed from named fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ComposeError {
    /// The register has no field of that name.
    #[error("{register} has no field named `{field}`")]
    UnknownField {
        /// The register.
        register: &'static str,
        /// The name asked for (truncated to 32 bytes).
        field: FieldName,
    },
    /// The value needs more bits than the field has.
    #[error("value {value:#x} does not fit in {field}, which is {bits} bit(s) wide")]
    ValueTooWide {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The field width.
        bits: u32,
    },
    /// An address with bits outside the field (unaligned or too high).
    #[error(
        "address {value:#x} cannot be stored in {field}: only the bits of mask {mask:#x} exist, \
         so the address must be aligned and below the field's top bit"
    )]
    AddressNotRepresentable {
        /// The field.
        field: &'static str,
        /// The address given.
        value: u64,
        /// The field's in-place mask.
        mask: u64,
    },
    /// The value is an encoding the SDM reserves.
    #[error(
        "{value:#x} is a reserved encoding of {field}; the processor would #GP or mis-handle it"
    )]
    ReservedEncoding {
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
    },
}

/// A short copy of a user-supplied name, kept without allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FieldName {
    buf: [u8; 32],
    len: u8,
}

impl FieldName {
    /// Copies up to 32 bytes of `s`, cut at a character boundary.
    pub fn new(s: &str) -> Self {
        let mut end = s.len().min(32);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut buf = [0u8; 32];
        buf[..end].copy_from_slice(&s.as_bytes()[..end]);
        Self {
            buf,
            len: end as u8,
        }
    }

    /// The stored text.
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Debug for FieldName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for FieldName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sets the named fields of `def` on top of `base`, in order.
///
/// Values are given as [`FieldDef::value`] reports them, so
/// `compose(def, 0, explain(raw).fields())` rebuilds `raw` minus reserved bits.
pub fn compose<'a, I>(def: &RegisterDef, base: u64, settings: I) -> Result<u64, ComposeError>
where
    I: IntoIterator<Item = (&'a str, u64)>,
{
    let mut raw = base;
    for (name, value) in settings {
        let field = def.field(name).ok_or(ComposeError::UnknownField {
            register: def.name,
            field: FieldName::new(name),
        })?;
        raw = field.insert(raw, value)?;
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_range_round_trips_at_the_edges() {
        let full = BitRange::new(63, 0);
        assert_eq!(full.mask(), u64::MAX);
        assert_eq!(full.get(0x1234), 0x1234);
        let top = BitRange::bit(63);
        assert_eq!(top.set(0, 1), 1 << 63);
        assert_eq!(BitRange::new(17, 14).set(0, 0xF), 0xF << 14);
        assert_eq!(format!("{}", BitRange::new(17, 14)), "17:14");
        assert_eq!(format!("{}", BitRange::bit(5)), "5");
    }

    #[test]
    fn bytes_print_in_the_largest_whole_unit() {
        assert_eq!(format!("{}", Meaning::Bytes(4096)), "4 KiB");
        assert_eq!(format!("{}", Meaning::Bytes(128 << 20)), "128 MiB");
        assert_eq!(format!("{}", Meaning::Bytes(100)), "100 bytes");
    }

    #[test]
    fn field_name_cuts_long_input_at_a_char_boundary() {
        let long = "é".repeat(40);
        let name = FieldName::new(&long);
        assert_eq!(name.as_str().chars().count(), 16);
    }
}
