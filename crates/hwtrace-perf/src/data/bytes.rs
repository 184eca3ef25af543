//! A little-endian cursor over borrowed bytes that knows its file offset.

use super::error::{Error, ErrorKind};

/// Reads fields in order from `bytes`, whose first byte is at file offset
/// `base`. Every read is bounds-checked; a short read names the structure.
#[derive(Clone, Debug)]
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    base: u64,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8], base: u64, what: &'static str) -> Self {
        Self {
            bytes,
            pos: 0,
            base,
            what,
        }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let available = self.remaining();
        if n > available {
            return Err(Error::at(
                self.base + self.pos as u64,
                ErrorKind::Truncated {
                    what: self.what,
                    needed: n as u64,
                    available: available as u64,
                },
            ));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Error> {
        Ok(le16(self.take(2)?))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Error> {
        Ok(le32(self.take(4)?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Error> {
        Ok(le64(self.take(8)?))
    }
}

pub(crate) fn le16(b: &[u8]) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[..2]);
    u16::from_le_bytes(a)
}

pub(crate) fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// `u64` at `at` in `b`, or `None` when it does not fit.
pub(crate) fn le64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at.checked_add(8)?).map(le64)
}

/// The bytes before the first NUL (all of them if there is none).
pub(crate) fn cstr(b: &[u8]) -> &[u8] {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    &b[..end]
}
