//! Kernel code from a `kcore` file: the ELF core `/proc/kcore` presents
//! (one `PT_LOAD` program header per range of kernel virtual memory, its
//! `p_vaddr` a kernel virtual address) or the copy `perf record --kcore`
//! keeps in `kcore_dir/kcore` (the same layout, holding only the kernel
//! text and the modules).
//!
//! Only the ELF header and the program headers are read up front; bytes
//! are read on demand with positioned reads, because `/proc/kcore` cannot
//! be memory-mapped and its segments span every byte of the direct map.
//! [`Kcore::add_to`] therefore puts only the ranges asked for into an
//! [`Image`]: a regular file is memory-mapped through [`Image::add_raw`],
//! anything else (`/proc/kcore`) is copied, up to [`MAX_COPY`] bytes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use hwtrace_types::Ip;

use super::{Image, ImageError, RawSpec};

/// The most bytes [`Kcore::add_to`] copies out of a file it cannot map
/// (`/proc/kcore`): kernel text with modules stays far below this.
pub const MAX_COPY: u64 = 256 << 20;

/// At most this many program headers are read: `/proc/kcore` has one per
/// memory range (tens to a few hundred); more is a corrupt file.
const MAX_PHDRS: u16 = 4096;

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const ET_CORE: u16 = 4;
const EM_X86_64: u16 = 62;
const PT_LOAD: u32 = 1;

/// Why a kcore file cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KcoreError {
    /// The file (or `DIR/kcore`) could not be opened or read.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The header says this is not a 64-bit little-endian x86-64 ELF core.
    #[error("{}: not a kcore file (a 64-bit little-endian x86-64 ELF core): {what}", path.display())]
    NotKcore {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// The program headers do not fit the file or are too many.
    #[error("{}: program headers at {offset:#x}: {what}", path.display())]
    BadProgramHeaders {
        /// The file.
        path: PathBuf,
        /// Their file offset.
        offset: u64,
        /// What was wrong.
        what: String,
    },
    /// No segment holds the address.
    #[error("{}: no segment holds kernel address {addr}", path.display())]
    Unmapped {
        /// The file.
        path: PathBuf,
        /// The address.
        addr: Ip,
    },
    /// A range to copy is larger than [`MAX_COPY`] in all.
    #[error(
        "{}: {len:#x} bytes at {addr} would be copied (the file cannot be mapped), more than the {max:#x} allowed: give a smaller kernel range",
        path.display()
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Where the copy would start.
        addr: Ip,
        /// How much in all.
        len: u64,
        /// [`MAX_COPY`].
        max: u64,
    },
    /// A section could not be added to the image.
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// One `PT_LOAD` segment: kernel virtual addresses `vaddr..vaddr+size`
/// backed by file bytes from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KcoreSegment {
    /// Its first kernel virtual address.
    pub vaddr: Ip,
    /// The file offset of its first byte.
    pub offset: u64,
    /// Its length in the file (`p_filesz`).
    pub size: u64,
}

impl KcoreSegment {
    /// Whether `addr` is inside.
    pub fn contains(&self, addr: Ip) -> bool {
        addr.0.wrapping_sub(self.vaddr.0) < self.size
    }
}

/// An open kcore file.
#[derive(Debug)]
pub struct Kcore {
    path: PathBuf,
    file: File,
    /// Whether the file can be memory-mapped (a regular file).
    regular: bool,
    segments: Vec<KcoreSegment>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn le64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Kcore {
    /// Opens `path`: a kcore file, or a directory holding one named `kcore`
    /// (`perf record --kcore`'s `kcore_dir`).
    pub fn open(path: &Path) -> Result<Self, KcoreError> {
        let path = if path.is_dir() {
            path.join("kcore")
        } else {
            path.to_path_buf()
        };
        let io = |source| KcoreError::Io {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        // /proc files report length 0: they are read, not mapped.
        let regular = meta.is_file() && meta.len() > 0;
        let mut ehdr = [0u8; EHDR_SIZE];
        file.read_exact_at(&mut ehdr, 0)
            .map_err(|e| KcoreError::NotKcore {
                path: path.clone(),
                what: format!("cannot read its 64-byte ELF header ({e})"),
            })?;
        let segments = parse_headers(&path, &ehdr, |buf, off| file.read_exact_at(buf, off))?;
        Ok(Self {
            path,
            file,
            regular,
            segments,
        })
    }

    /// The file read (after `DIR/kcore` was resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `PT_LOAD` segments with file bytes, in file order.
    pub fn segments(&self) -> &[KcoreSegment] {
        &self.segments
    }

    /// Reads up to `buf.len()` bytes at kernel address `addr`, within the
    /// segment holding it; returns how many were read.
    pub fn read(&self, addr: Ip, buf: &mut [u8]) -> Result<usize, KcoreError> {
        let seg = self
            .segments
            .iter()
            .find(|s| s.contains(addr))
            .ok_or_else(|| KcoreError::Unmapped {
                path: self.path.clone(),
                addr,
            })?;
        let within = addr.0 - seg.vaddr.0;
        let n = (seg.size - within).min(buf.len() as u64) as usize;
        self.file
            .read_exact_at(&mut buf[..n], seg.offset + within)
            .map_err(|source| KcoreError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(n)
    }

    /// Adds the parts of the segments inside `first..=last` to `image` in
    /// the default address space (kernel code is the same in every
    /// process); returns how many bytes were added.
    pub fn add_to(&self, image: &mut Image, first: Ip, last: Ip) -> Result<u64, KcoreError> {
        let mut added = 0u64;
        let mut copied = 0u64;
        for seg in &self.segments {
            let seg_last = seg.vaddr.0.saturating_add(seg.size - 1);
            let (lo, hi) = (seg.vaddr.0.max(first.0), seg_last.min(last.0));
            if lo > hi {
                continue;
            }
            let len = hi - lo + 1;
            let offset = seg.offset + (lo - seg.vaddr.0);
            if self.regular {
                let spec = RawSpec {
                    path: self.path.clone(),
                    offset,
                    size: Some(len),
                    addr: Ip(lo),
                    truncate: false,
                };
                image.add_raw(None, &spec)?;
            } else {
                copied = copied.saturating_add(len);
                if copied > MAX_COPY {
                    return Err(KcoreError::TooLarge {
                        path: self.path.clone(),
                        addr: Ip(lo),
                        len: copied,
                        max: MAX_COPY,
                    });
                }
                let mut bytes = vec![0u8; len as usize];
                self.file
                    .read_exact_at(&mut bytes, offset)
                    .map_err(|source| KcoreError::Io {
                        path: self.path.clone(),
                        source,
                    })?;
                image.add_bytes(None, Ip(lo), bytes, &self.path.display().to_string())?;
            }
            added += len;
        }
        Ok(added)
    }
}

/// Checks the ELF header and reads the program headers through `read`.
/// The loadable segments the headers of a kcore held in memory describe
/// (`bytes` from the file's start, at least its ELF header and program
/// headers; `name` in errors): what [`Kcore::open`] reads of a file.
pub fn kcore_segments(name: &Path, bytes: &[u8]) -> Result<Vec<KcoreSegment>, KcoreError> {
    let ehdr: &[u8; EHDR_SIZE] = bytes.first_chunk().ok_or_else(|| KcoreError::NotKcore {
        path: name.to_path_buf(),
        what: format!("{} bytes, shorter than a 64-byte ELF header", bytes.len()),
    })?;
    parse_headers(name, ehdr, |buf, off| {
        let start = usize::try_from(off).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| bytes.get(start..end))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    })
}

fn parse_headers(
    path: &Path,
    ehdr: &[u8; EHDR_SIZE],
    read: impl Fn(&mut [u8], u64) -> std::io::Result<()>,
) -> Result<Vec<KcoreSegment>, KcoreError> {
    let not = |what: String| KcoreError::NotKcore {
        path: path.to_path_buf(),
        what,
    };
    if &ehdr[..4] != b"\x7fELF" {
        return Err(not(format!("magic {:02x?}", &ehdr[..4])));
    }
    if ehdr[4] != 2 || ehdr[5] != 1 {
        return Err(not(format!(
            "class {} data {} (2 and 1 expected)",
            ehdr[4], ehdr[5]
        )));
    }
    let (e_type, machine) = (le16(ehdr, 16), le16(ehdr, 18));
    if e_type != ET_CORE {
        return Err(not(format!("e_type {e_type} (4, a core file, expected)")));
    }
    if machine != EM_X86_64 {
        return Err(not(format!("e_machine {machine} (62, x86-64, expected)")));
    }
    let phoff = le64(ehdr, 32);
    let (phentsize, phnum) = (le16(ehdr, 54), le16(ehdr, 56));
    let bad = |what: String| KcoreError::BadProgramHeaders {
        path: path.to_path_buf(),
        offset: phoff,
        what,
    };
    if usize::from(phentsize) != PHDR_SIZE {
        return Err(bad(format!("e_phentsize {phentsize} (56 expected)")));
    }
    if phnum > MAX_PHDRS {
        return Err(bad(format!("{phnum} of them (at most {MAX_PHDRS} read)")));
    }
    let mut table = vec![0u8; usize::from(phnum) * PHDR_SIZE];
    read(&mut table, phoff).map_err(|e| bad(format!("{phnum} headers cannot be read ({e})")))?;
    let mut out = Vec::new();
    for ph in table.chunks_exact(PHDR_SIZE) {
        let (p_type, offset, vaddr, size) = (le32(ph, 0), le64(ph, 8), le64(ph, 16), le64(ph, 32));
        if p_type != PT_LOAD || size == 0 {
            continue;
        }
        if vaddr.checked_add(size - 1).is_none() || offset.checked_add(size).is_none() {
            return Err(bad(format!(
                "segment at {vaddr:#x} of {size:#x} bytes (file offset {offset:#x}) wraps around"
            )));
        }
        out.push(KcoreSegment {
            vaddr: Ip(vaddr),
            offset,
            size,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_types::{AddressSpace, ReadMemory};

    /// An ELF core with one PT_NOTE and a PT_LOAD per `(vaddr, bytes)`,
    /// written byte by byte as the kernel lays out /proc/kcore.
    fn core(loads: &[(u64, &[u8])]) -> Vec<u8> {
        let phnum = loads.len() + 1;
        let mut data_at = (EHDR_SIZE + phnum * PHDR_SIZE) as u64;
        let mut b = Vec::new();
        b.extend_from_slice(b"\x7fELF\x02\x01\x01");
        b.resize(16, 0);
        b.extend_from_slice(&ET_CORE.to_le_bytes());
        b.extend_from_slice(&EM_X86_64.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes()); // e_version
        b.extend_from_slice(&0u64.to_le_bytes()); // e_entry
        b.extend_from_slice(&(EHDR_SIZE as u64).to_le_bytes()); // e_phoff
        b.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        b.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        b.extend_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
        b.extend_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
        b.extend_from_slice(&(phnum as u16).to_le_bytes());
        b.extend_from_slice(&[0u8; 6]); // shentsize, shnum, shstrndx
        assert_eq!(b.len(), EHDR_SIZE);
        let phdr = |b: &mut Vec<u8>, p_type: u32, off: u64, vaddr: u64, size: u64| {
            b.extend_from_slice(&p_type.to_le_bytes());
            b.extend_from_slice(&7u32.to_le_bytes()); // RWX, as kcore says
            for v in [off, vaddr, 0, size, size, 0x1000] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        };
        phdr(&mut b, 4, 0, 0, 0); // PT_NOTE, empty
        for (vaddr, bytes) in loads {
            phdr(&mut b, PT_LOAD, data_at, *vaddr, bytes.len() as u64);
            data_at += bytes.len() as u64;
        }
        for (_, bytes) in loads {
            b.extend_from_slice(bytes);
        }
        b
    }

    fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hwtrace-kcore-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("kcore");
        std::fs::write(&p, bytes).unwrap();
        dir
    }

    const TEXT: u64 = 0xffff_ffff_8100_0000;
    const MODULES: u64 = 0xffff_ffff_c000_0000;

    #[test]
    fn segments_read_and_image_hold_kernel_addresses() {
        let text: Vec<u8> = (0..=255u8).cycle().take(0x2000).collect();
        let module = [0xc3u8; 16];
        let dir = scratch("read", &core(&[(TEXT, &text), (MODULES, &module)]));
        // The directory form, as perf record --kcore leaves it.
        let k = Kcore::open(&dir).unwrap();
        assert_eq!(k.path(), dir.join("kcore"));
        assert_eq!(k.segments().len(), 2);
        assert_eq!(k.segments()[0].vaddr, Ip(TEXT));
        let mut buf = [0u8; 4];
        assert_eq!(k.read(Ip(TEXT + 0x101), &mut buf).unwrap(), 4);
        assert_eq!(buf, [1, 2, 3, 4]);
        // Reads stop at the segment's end.
        let mut big = [0u8; 64];
        assert_eq!(k.read(Ip(MODULES + 8), &mut big).unwrap(), 8);
        assert!(matches!(
            k.read(Ip(TEXT - 1), &mut buf),
            Err(KcoreError::Unmapped { addr: Ip(a), .. }) if a == TEXT - 1
        ));

        // Only the range asked for goes into the image.
        let mut image = Image::new();
        let added = k
            .add_to(&mut image, Ip(TEXT + 0x1000), Ip(MODULES + 7))
            .unwrap();
        assert_eq!(added, 0x1000 + 8);
        let space = AddressSpace::UNKNOWN;
        let mut buf = [0u8; 2];
        image
            .read_memory(space, Ip(TEXT + 0x1010), &mut buf)
            .unwrap();
        assert_eq!(buf, [0x10, 0x11]);
        assert!(
            image
                .read_memory(space, Ip(TEXT + 0xfff), &mut buf)
                .is_err()
        );
        assert_eq!(
            image.read_memory(space, Ip(MODULES + 6), &mut buf).unwrap(),
            2
        );
        assert!(image.read_memory(space, Ip(MODULES + 8), &mut buf).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn what_is_not_a_kcore_is_named() {
        let good = core(&[(TEXT, &[0x90; 8])]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"not an elf file at all, but long enough for a header....".repeat(2),
                "magic",
            ),
            (
                {
                    let mut b = good.clone();
                    b[4] = 1;
                    b
                },
                "class 1",
            ),
            (
                {
                    let mut b = good.clone();
                    b[16] = 2;
                    b
                },
                "e_type 2",
            ),
            (
                {
                    let mut b = good.clone();
                    b[18] = 3;
                    b
                },
                "e_machine 3",
            ),
            (
                {
                    let mut b = good.clone();
                    b[54] = 32;
                    b
                },
                "e_phentsize 32",
            ),
            (
                {
                    let mut b = good.clone();
                    b[56..58].copy_from_slice(&9u16.to_le_bytes());
                    b
                },
                "9 headers cannot be read",
            ),
            (good[..40].to_vec(), "64-byte ELF header"),
        ];
        for (i, (bytes, want)) in cases.iter().enumerate() {
            let dir = scratch(&format!("bad{i}"), bytes);
            let err = Kcore::open(&dir.join("kcore")).unwrap_err().to_string();
            assert!(
                err.contains(want) && err.contains("kcore"),
                "case {i}: {err}"
            );
            std::fs::remove_dir_all(&dir).ok();
        }
        let err = Kcore::open(Path::new("/no/such/kcore")).unwrap_err();
        assert!(matches!(err, KcoreError::Io { .. }), "{err}");
    }
}
