//! Opening trace files without reading them into memory.

use anyhow::{Context, Result};
use std::fs::File;
use std::path::Path;

/// A trace file mapped into memory (or an empty slice for an empty file,
/// which cannot be mapped).
#[derive(Debug)]
pub struct MappedFile {
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("cannot stat {}", path.display()))?
            .len();
        if len == 0 {
            return Ok(Self { map: None });
        }
        // SAFETY: the map is read-only and private to this process. The one
        // hazard memmap2 documents is another process truncating or writing
        // the file while it is mapped; trace files are not modified while
        // hwtrace reads them, and a concurrent truncation would at worst end
        // the run with SIGBUS, never corrupt memory we hand out as &[u8]
        // beyond the lifetime of this struct.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        Ok(Self { map: Some(map) })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}
