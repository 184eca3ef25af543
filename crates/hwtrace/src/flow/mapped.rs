//! [`MappedTrace`]: the trace `hwtrace flow` decodes, memory-mapped, with
//! the pages already decoded handed back to the kernel, so the resident
//! size stays flat however large the trace is.

use anyhow::Result;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// How far behind the decode released pages stay (the decoders only read
/// forward; a released page read again is simply read from the file).
const MARGIN: u64 = 256 << 10;
/// Release in steps of this much at least (one system call each: 2,048 for
/// a GiB, no time measured). Small, so the resident part of the trace stays
/// what the decoders have in flight (a parallel decode's units ahead of the
/// merge point) and does not swing with where the trace is cut into steps:
/// with 1 MiB of margin and 2 MiB steps, `flow --jobs 1` peaked at 16.7 MiB
/// on the benchmark's 256 MiB trace, with these at 14.8 MiB.
const STEP: u64 = 512 << 10;
/// The page size madvise ranges are aligned to (x86-64).
const PAGE: u64 = 4096;

/// A trace file mapped read-only (an empty file, which cannot be mapped,
/// is an empty slice).
#[derive(Debug)]
pub struct MappedTrace {
    map: Option<memmap2::Mmap>,
    /// Bytes from the start already released.
    released: AtomicU64,
}

impl MappedTrace {
    /// Maps `path` read-only ([`crate::input::map_file`]: an LZ4-compressed
    /// trace is decompressed first).
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self::from_map(crate::input::map_file(path)?))
    }

    /// A file already mapped ([`crate::input::MappedFile::into_map`]).
    pub fn from_map(map: Option<memmap2::Mmap>) -> Self {
        Self {
            map,
            released: AtomicU64::new(0),
        }
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The decode has reached `offset`: the pages well before it are
    /// dropped from this process (they count towards its resident size
    /// otherwise, a whole trace's worth by the end).
    pub fn decoded_to(&self, offset: u64) {
        let Some(map) = &self.map else { return };
        let end = offset.saturating_sub(MARGIN) / PAGE * PAGE;
        if end < self.released.load(Ordering::Relaxed).saturating_add(STEP) {
            return;
        }
        let from = self.released.load(Ordering::Relaxed);
        let (Ok(at), Ok(len)) = (usize::try_from(from), usize::try_from(end - from)) else {
            return;
        };
        // SAFETY: MADV_DONTNEED on a private, read-only file mapping that
        // was never written drops the resident pages; the next access reads
        // the same bytes from the file again, so slices into the map stay
        // valid and unchanged. Advice that fails only costs memory.
        #[allow(unsafe_code)]
        let done =
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, at, len) };
        if done.is_ok() {
            self.released.store(end, Ordering::Relaxed);
        }
    }
}
