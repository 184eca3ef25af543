//! Small helpers that generate typed accessors from a field's bit position.

/// Getter and builder-style setter for one-bit flags of a `u64` newtype.
macro_rules! flags {
    ($( $(#[$meta:meta])* $get:ident, $with:ident = $bit:expr; )*) => {
        $(
            $(#[$meta])*
            #[inline]
            pub const fn $get(self) -> bool {
                (self.0 >> $bit) & 1 != 0
            }

            #[doc = concat!("Returns a copy with `", stringify!($get), "` set to `on`.")]
            #[inline]
            #[must_use]
            pub const fn $with(self, on: bool) -> Self {
                if on { Self(self.0 | (1u64 << $bit)) } else { Self(self.0 & !(1u64 << $bit)) }
            }
        )*
    };
}

/// Getter and checked setter for multi-bit numeric fields of a `u64` newtype.
macro_rules! numbers {
    ($( $(#[$meta:meta])* $get:ident, $with:ident = $name:literal, $hi:literal : $lo:literal; )*) => {
        $(
            $(#[$meta])*
            #[inline]
            pub const fn $get(self) -> u64 {
                $crate::field::BitRange::new($hi, $lo).get(self.0)
            }

            #[doc = concat!("Returns a copy with `", stringify!($get), "` set, or an error if `value` is wider than bits ", stringify!($hi), ":", stringify!($lo), ".")]
            #[inline]
            pub fn $with(self, value: u64) -> Result<Self, $crate::field::ComposeError> {
                let range = $crate::field::BitRange::new($hi, $lo);
                if range.width() < 64 && value >> range.width() != 0 {
                    return Err($crate::field::ComposeError::ValueTooWide {
                        field: $name,
                        value,
                        bits: range.width(),
                    });
                }
                Ok(Self(range.set(self.0, value)))
            }
        )*
    };
}

/// `new`, `raw`, `from_raw` and conversions for a `u64` register newtype.
macro_rules! raw_register {
    ($name:ident) => {
        impl $name {
            /// The register with every bit clear.
            #[inline]
            pub const fn new() -> Self {
                Self(0)
            }

            /// Wraps a raw value as read with RDMSR (not validated).
            #[inline]
            pub const fn from_raw(raw: u64) -> Self {
                Self(raw)
            }

            /// The raw value to write with WRMSR.
            #[inline]
            pub const fn raw(self) -> u64 {
                self.0
            }
        }

        impl From<u64> for $name {
            fn from(raw: u64) -> Self {
                Self(raw)
            }
        }

        impl From<$name> for u64 {
            fn from(r: $name) -> u64 {
                r.0
            }
        }
    };
}

pub(crate) use {flags, numbers, raw_register};
