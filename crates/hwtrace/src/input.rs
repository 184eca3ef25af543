//! Opening trace files without reading them into memory.
//!
//! Every input file is memory-mapped. A file in the LZ4 frame format
//! (kAFL saves its traces so: `traces/*.bin.lz4`, written by python's
//! `lz4.frame`) is first decompressed into an unlinked temporary file,
//! which is mapped instead: the disk holds the decompressed trace, memory
//! only what is being read, however large it is.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The first four bytes of an LZ4 frame (its magic number, little-endian
/// 0x184D2204).
const LZ4_FRAME_MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];

/// A trace file mapped into memory (or an empty slice for an empty file,
/// which cannot be mapped).
#[derive(Debug)]
pub struct MappedFile {
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    /// Maps `path` read-only ([`map_file`]).
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            map: map_file(path)?,
        })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The map (`None` for no bytes), for a reader that goes on with it
    /// (the file is not opened, nor decompressed, again).
    pub fn into_map(self) -> Option<memmap2::Mmap> {
        self.map
    }
}

/// A part of a mapped file (`FILE:FROM-TO` arguments of ptdump and ptxed).
#[derive(Debug)]
pub struct MappedRange {
    file: MappedFile,
    range: std::ops::Range<usize>,
}

impl MappedRange {
    /// No bytes (before a file is given).
    pub fn empty() -> Self {
        Self {
            file: MappedFile { map: None },
            range: 0..0,
        }
    }

    /// `range` of this file (whole as [`Self::whole`] maps it); `None`
    /// when it is not within the file (`start` past `end`, or `end` past
    /// the file's end).
    pub fn narrowed(self, range: std::ops::Range<u64>) -> Option<Self> {
        if range.start > range.end || range.end > self.file_len() {
            return None;
        }
        // Both bounds are within the mapped bytes, so they fit in usize.
        let range = usize::try_from(range.start).ok()?..usize::try_from(range.end).ok()?;
        Some(Self {
            file: self.file,
            range,
        })
    }

    /// The whole file at `path`, mapped.
    pub fn whole(path: &Path) -> Result<Self> {
        let file = MappedFile::open(path)?;
        let range = 0..file.bytes().len();
        Ok(Self { file, range })
    }

    /// The file's size.
    pub fn file_len(&self) -> u64 {
        self.file.bytes().len() as u64
    }

    /// The bytes of the range.
    pub fn bytes(&self) -> &[u8] {
        &self.file.bytes()[self.range.clone()]
    }
}

/// Maps `path` read-only, decompressed first when it is an LZ4 frame;
/// `None` when there are no bytes (an empty file cannot be mapped).
pub fn map_file(path: &Path) -> Result<Option<memmap2::Mmap>> {
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len();
    let mut head = [0u8; 4];
    if len >= 4 {
        file.read_exact(&mut head)
            .with_context(|| format!("cannot read {}", path.display()))?;
    }
    if head == LZ4_FRAME_MAGIC {
        file = decompress(file, path)?;
    }
    if file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?
        .len()
        == 0
    {
        return Ok(None);
    }
    // SAFETY: the map is read-only and private to this process. The one
    // hazard memmap2 documents is another process truncating or writing
    // the file while it is mapped; trace files are not modified while
    // hwtrace reads them (a decompressed trace's file has no name left to
    // open), and a concurrent truncation would at worst end the run with
    // SIGBUS, never corrupt memory handed out as &[u8] within the map's
    // lifetime.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot map {}", path.display()))?;
    Ok(Some(map))
}

/// A new file in the temporary folder (another process's leftover of the
/// same name is passed over), for decompressing `path` into.
fn temporary_file(path: &Path) -> Result<(File, std::path::PathBuf)> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name =
            std::env::temp_dir().join(format!("hwtrace-{}-{n}.decompressed", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&name)
        {
            Ok(file) => return Ok((file, name)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => continue,
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "{}: cannot create {} to decompress into",
                        path.display(),
                        name.display()
                    )
                });
            }
        }
    }
}

/// Decompresses the LZ4 frames of `file` (named `path`) into a temporary
/// file whose name is removed at once, and returns that file.
fn decompress(mut file: File, path: &Path) -> Result<File> {
    let (out, name) = temporary_file(path)?;
    // Unlinked now: the file lives as long as it is open or mapped.
    let _ = std::fs::remove_file(&name);
    std::io::Seek::rewind(&mut file).with_context(|| format!("cannot read {}", path.display()))?;
    let mut frames = lz4_flex::frame::FrameDecoder::new(BufReader::new(file));
    let mut sink = BufWriter::with_capacity(1 << 20, &out);
    let bytes = std::io::copy(&mut frames, &mut sink)
        .and_then(|n| sink.flush().map(|()| n))
        .with_context(|| {
            format!(
                "{}: an LZ4 frame file that does not decompress (a truncated or corrupt kAFL trace dump?)",
                path.display()
            )
        })?;
    drop(sink);
    anyhow::ensure!(
        bytes > 0,
        "{}: an LZ4 frame file that decompresses to nothing",
        path.display()
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("hwtrace-input-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_plain_file_maps_as_it_is_and_an_empty_one_to_nothing() {
        let path = scratch("plain");
        std::fs::write(&path, b"\x02\x82\x02\x82 not compressed").unwrap();
        assert_eq!(
            MappedFile::open(&path).unwrap().bytes(),
            b"\x02\x82\x02\x82 not compressed"
        );
        std::fs::write(&path, b"").unwrap();
        assert!(MappedFile::open(&path).unwrap().bytes().is_empty());
        std::fs::write(&path, b"\x04\x22").unwrap();
        assert_eq!(MappedFile::open(&path).unwrap().bytes(), b"\x04\x22");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_broken_lz4_frame_is_an_error_naming_the_file() {
        let path = scratch("broken.lz4");
        std::fs::write(&path, [0x04, 0x22, 0x4d, 0x18, 0x64, 0x40, 0xa7, 0xff]).unwrap();
        let e = format!("{:#}", MappedFile::open(&path).unwrap_err());
        assert!(
            e.contains(&path.display().to_string()) && e.contains("LZ4 frame file"),
            "{e}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
