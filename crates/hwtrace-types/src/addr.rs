//! Newtypes for offsets, addresses and time stamps.

use core::fmt;

macro_rules! newtype_u64 {
    ($(#[$meta:meta])* $name:ident, $fmt:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        pub struct $name(pub u64);

        impl $name {
            /// The raw value.
            #[inline]
            pub const fn get(self) -> u64 {
                self.0
            }
        }

        impl From<u64> for $name {
            #[inline]
            fn from(v: u64) -> Self {
                Self(v)
            }
        }

        impl From<$name> for u64 {
            #[inline]
            fn from(v: $name) -> u64 {
                v.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "(", $fmt, ")"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, $fmt, self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

newtype_u64!(
    /// A byte offset into a trace buffer (from the start of the buffer the
    /// decoder was given, or of the file it was mapped from).
    TraceOffset,
    "{:#x}"
);

newtype_u64!(
    /// A linear (virtual) instruction address.
    Ip,
    "{:#x}"
);

newtype_u64!(
    /// A guest- or host-physical address.
    PhysAddr,
    "{:#x}"
);

newtype_u64!(
    /// A CR3 value as PIP packets report it (bits 51:5 of the register;
    /// the low bits are zero).
    Cr3,
    "{:#x}"
);

newtype_u64!(
    /// A time-stamp counter value.
    Tsc,
    "{:#x}"
);

impl TraceOffset {
    /// The offset `n` bytes further on.
    #[inline]
    pub const fn add(self, n: u64) -> Self {
        Self(self.0.wrapping_add(n))
    }
}

impl Ip {
    /// The address `n` bytes further on, wrapping at 2^64 as the CPU does.
    #[inline]
    pub const fn add(self, n: u64) -> Self {
        Self(self.0.wrapping_add(n))
    }
}
