//! Bytes of a dump file: memory-mapped, or owned (tests, generated dumps).

use memmap2::Mmap;
use std::fs::File;
use std::io;
use std::path::Path;

/// The bytes behind a dump or page cache, borrowed from a mapping of the
/// file or owned in memory.
#[derive(Debug)]
pub enum Backing {
    /// A read-only mapping of a whole file.
    Mapped(Mmap),
    /// Bytes held in memory.
    Owned(Vec<u8>),
}

impl Backing {
    /// Maps `path` read-only. An empty file gives an empty owned buffer
    /// (mapping zero bytes fails on some systems).
    pub fn map(path: &Path) -> io::Result<Self> {
        let file = File::open(path)?;
        if file.metadata()?.len() == 0 {
            return Ok(Self::Owned(Vec::new()));
        }
        // SAFETY: `Mmap::map` is unsafe only because another process could
        // modify or truncate the file while it is mapped, which would change
        // (or, on truncation, remove) bytes behind a `&[u8]`. Dumps and page
        // caches are inputs that hwtrace never writes, and the documented
        // contract of every reader here is that the file is not modified
        // while it is open; the mapping is read-only and private to us.
        #[allow(unsafe_code)]
        let map = unsafe { Mmap::map(&file)? };
        Ok(Self::Mapped(map))
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Owned(v) => v,
        }
    }
}
