//! Opening trace files without reading them into memory.
//!
//! Every input file is memory-mapped. A compressed file is first
//! decompressed into an unlinked temporary file, which is mapped instead:
//! the disk holds the decompressed trace, memory only what is being read,
//! however large it is. Compressed files are told by their magic numbers,
//! whatever their names ([`Compression::of`]): LZ4 frames (kAFL saves its
//! traces so: `traces/*.bin.lz4`, written by python's `lz4.frame`), zstd
//! frames (`zstd trace.pt`; the compressor perf itself uses) and gzip
//! members (`gzip trace.pt`). xz and bzip2 files are named as such and
//! refused, rather than decoded as trace bytes. Standard input (`-`) and
//! pipes cannot be mapped: they are copied (decompressed if need be) into
//! such a file as they stream in.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How a file is compressed, by the magic number it starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compression {
    /// An LZ4 frame (magic 0x184D2204, little-endian).
    Lz4,
    /// A zstd frame (magic 0xFD2FB528, little-endian).
    Zstd,
    /// A gzip member (1F 8B, then method 8: deflate).
    Gzip,
    /// Formats we do not decompress: named in the error.
    Unsupported(&'static str),
}

impl Compression {
    /// The compression of a file starting with `head` (its first four
    /// bytes; fewer when it is shorter), `None` for anything else. A whole
    /// raw trace starts with a PSB (or PADs); a piece cut at a random byte
    /// starts with one of these magics about once in 2^24 (gzip's three
    /// bytes), and then fails to decompress with an error saying so.
    fn of(head: &[u8]) -> Option<Self> {
        match head {
            [0x04, 0x22, 0x4d, 0x18, ..] => Some(Self::Lz4),
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Some(Self::Zstd),
            [0x1f, 0x8b, 0x08, ..] => Some(Self::Gzip),
            [0xfd, b'7', b'z', b'X', ..] => Some(Self::Unsupported("xz")),
            [b'B', b'Z', b'h', ..] => Some(Self::Unsupported("bzip2")),
            _ => None,
        }
    }

    /// Its name in messages.
    fn name(self) -> &'static str {
        match self {
            Self::Lz4 => "LZ4 frame",
            Self::Zstd => "zstd",
            Self::Gzip => "gzip",
            Self::Unsupported(name) => name,
        }
    }
}

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

/// Maps `path` read-only, decompressed first when it is compressed
/// ([`Compression`]); `None` when there are no bytes (an empty file cannot
/// be mapped). `-` is standard input; standard input, a pipe (`<(zstd -dc
/// trace.zst)`, `perf record -o - | hwtrace perf decode -`) or any other
/// file that cannot be mapped is first copied into a temporary file as it
/// streams in.
pub fn map_file(path: &Path) -> Result<Option<memmap2::Mmap>> {
    let mut file = if path == Path::new("-") {
        // Standard input as a file of its own: mapped when it is one
        // (`< trace.pt`), read as it streams when it is a pipe.
        use std::os::fd::AsFd;
        let fd = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .context("cannot read standard input")?;
        File::from(fd)
    } else {
        File::open(path).with_context(|| format!("cannot open {}", path.display()))?
    };
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    anyhow::ensure!(!meta.is_dir(), "{} is a directory", path.display());
    if !meta.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        // A device never ends (/dev/zero), waits for typing (a terminal)
        // or is a disk: not a trace.
        anyhow::ensure!(
            kind.is_fifo() || kind.is_socket(),
            "{} is a device, not a trace file{}",
            path.display(),
            if path == Path::new("-") {
                " (pipe a trace into standard input, or redirect one from a file)"
            } else {
                ""
            }
        );
        // A pipe: read as it comes.
        return map_spooled(spool_stream(file, path)?, path);
    }
    let mut head = [0u8; 4];
    let head = &mut head[..meta.len().min(4) as usize];
    // At offset 0 whatever the file's position (standard input's may not be).
    std::os::unix::fs::FileExt::read_exact_at(&file, head, 0)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if let Some(compression) = Compression::of(head) {
        std::io::Seek::rewind(&mut file)
            .with_context(|| format!("cannot read {}", path.display()))?;
        file = spool(
            BufReader::with_capacity(1 << 16, file),
            path,
            Some(compression),
        )?;
    }
    map_spooled(file, path)
}

/// Maps `file` (`path`, or what it was spooled into), `None` when empty.
fn map_spooled(file: File, path: &Path) -> Result<Option<memmap2::Mmap>> {
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
    // hwtrace reads them (a spooled trace's file has no name left to
    // open), and a concurrent truncation would at worst end the run with
    // SIGBUS, never corrupt memory handed out as &[u8] within the map's
    // lifetime.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot map {}", path.display()))?;
    Ok(Some(map))
}

/// Copies a stream that cannot be mapped (`path` names it) into a
/// temporary file, decompressing it when it starts with a compression's
/// magic number.
fn spool_stream(mut input: impl Read, path: &Path) -> Result<File> {
    let mut head = Vec::with_capacity(4);
    (&mut input)
        .take(4)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let compression = Compression::of(&head);
    let stream = BufReader::with_capacity(1 << 16, std::io::Cursor::new(head).chain(input));
    spool(stream, path, compression)
}

/// A new file in the temporary folder (another process's leftover of the
/// same name is passed over), for copying or decompressing `path` into.
fn temporary_file(path: &Path) -> Result<(File, std::path::PathBuf)> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = std::env::temp_dir().join(format!("hwtrace-{}-{n}.spooled", std::process::id()));
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
                        "{}: cannot create {} to copy it into",
                        path.display(),
                        name.display()
                    )
                });
            }
        }
    }
}

/// Writes `input` (read from `path`), decompressed as `compression` says
/// (`None`: as it is), into a temporary file whose name is removed at
/// once, and returns that file.
fn spool(input: impl BufRead, path: &Path, compression: Option<Compression>) -> Result<File> {
    if let Some(Compression::Unsupported(name)) = compression {
        anyhow::bail!(
            "{}: an {name}-compressed file: decompress it first (`{name} -dk`), \
             hwtrace reads LZ4, zstd and gzip files as they are",
            path.display()
        );
    }
    let (out, name) = temporary_file(path)?;
    // Unlinked now: the file lives as long as it is open or mapped.
    let _ = std::fs::remove_file(&name);
    let mut input = input;
    let mut sink = BufWriter::with_capacity(1 << 20, &out);
    let copied = match compression {
        None => std::io::copy(&mut input, &mut sink),
        Some(Compression::Lz4) => {
            std::io::copy(&mut lz4_flex::frame::FrameDecoder::new(input), &mut sink)
        }
        Some(Compression::Gzip) => {
            std::io::copy(&mut flate2::bufread::MultiGzDecoder::new(input), &mut sink)
        }
        Some(Compression::Zstd) => unzstd(input, &mut sink),
        Some(Compression::Unsupported(_)) => unreachable!("refused above"),
    };
    let bytes = copied
        .and_then(|n| sink.flush().map(|()| n))
        .with_context(|| match compression {
            None => format!(
                "{}: cannot copy it into {} (a file in $TMPDIR)",
                path.display(),
                name.display()
            ),
            Some(Compression::Lz4) => format!(
                "{}: an LZ4 frame file that does not decompress (a truncated or corrupt kAFL trace dump?)",
                path.display()
            ),
            Some(c) => format!(
                "{}: a {} file that does not decompress (truncated or corrupt?)",
                path.display(),
                c.name()
            ),
        })?;
    drop(sink);
    if let Some(c) = compression {
        anyhow::ensure!(
            bytes > 0,
            "{}: a {} file that decompresses to nothing",
            path.display(),
            c.name()
        );
    }
    Ok(out)
}

/// Decompresses the zstd frames of `input` (one after another, as `zstd`
/// and `cat a.zst b.zst` write them) into `sink`; the decompressed size.
/// A stream that ends inside a frame is an error.
fn unzstd(mut input: impl BufRead, sink: &mut impl Write) -> std::io::Result<u64> {
    let corrupt = |code: usize| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            zstd_safe::get_error_name(code),
        )
    };
    let mut dctx = zstd_safe::DCtx::create();
    let mut buf = vec![0u8; zstd_safe::DCtx::out_size()];
    let (mut total, mut in_frame) = (0u64, false);
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            if in_frame {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the zstd stream ends inside a frame",
                ));
            }
            return Ok(total);
        }
        let mut src = zstd_safe::InBuffer::around(chunk);
        let mut dst = zstd_safe::OutBuffer::around(&mut buf[..]);
        // 0: a frame ended and everything it holds is out.
        let hint = dctx
            .decompress_stream(&mut dst, &mut src)
            .map_err(corrupt)?;
        let (used, made) = (src.pos(), dst.pos());
        if used == 0 && made == 0 {
            return Err(std::io::Error::other("the zstd stream makes no progress"));
        }
        in_frame = hint != 0;
        sink.write_all(&buf[..made])?;
        total += made as u64;
        input.consume(used);
    }
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
        let e = format!("{:#}", MappedFile::open(&std::env::temp_dir()).unwrap_err());
        assert!(e.ends_with("is a directory"), "{e}");
        // /dev/zero would fill the disk it is copied to.
        let e = format!(
            "{:#}",
            MappedFile::open(Path::new("/dev/zero")).unwrap_err()
        );
        assert!(
            e.ends_with("/dev/zero is a device, not a trace file"),
            "{e}"
        );
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

    fn zstd_frame(data: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; zstd_safe::compress_bound(data.len())];
        let n = zstd_safe::compress(&mut out[..], data, 3).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn zstd_frames_decompress_one_after_another_and_a_cut_frame_is_an_error() {
        let (a, b) = (vec![0x02u8; 300_000], b"\x02\x82 a second frame".to_vec());
        let both = [zstd_frame(&a), zstd_frame(&b)].concat();
        let mut out = Vec::new();
        let n = unzstd(&both[..], &mut out).unwrap();
        assert_eq!((n, out), (a.len() as u64 + b.len() as u64, [a, b].concat()));
        let mut out = Vec::new();
        assert_eq!(unzstd(&[][..], &mut out).unwrap(), 0);
        let e = unzstd(&both[..both.len() - 3], &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
        let mut bad = both.clone();
        bad[4..12].fill(0xff);
        let e = unzstd(&bad[..], &mut Vec::new()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn magic_numbers_name_the_compression() {
        assert_eq!(
            Compression::of(&[0x04, 0x22, 0x4d, 0x18]),
            Some(Compression::Lz4)
        );
        assert_eq!(
            Compression::of(&[0x28, 0xb5, 0x2f, 0xfd]),
            Some(Compression::Zstd)
        );
        assert_eq!(
            Compression::of(&[0x1f, 0x8b, 0x08]),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::of(b"BZh9"),
            Some(Compression::Unsupported("bzip2"))
        );
        // A PSB, PADs, a short file: trace bytes.
        assert_eq!(Compression::of(&[0x02, 0x82, 0x02, 0x82]), None);
        assert_eq!(Compression::of(&[0, 0, 0, 0]), None);
        assert_eq!(Compression::of(&[0x1f, 0x8b]), None);
    }
}
