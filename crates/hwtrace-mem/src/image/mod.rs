//! Code images: what the flow decoder reads instructions from.
//!
//! An [`Image`] holds sections of bytes at virtual addresses: raw files,
//! the loadable segments of ELF and PE files, page caches, or bytes in
//! memory. Each section belongs to an address space: a CR3, or the default
//! space, which serves every read (of any CR3, or of none) that the CR3's
//! own sections do not cover: the kernel, say, beside per-process user
//! code. Within a space a later section overrides earlier ones where they
//! overlap, as in libipt's `pt_image`.
//!
//! Reads are on the decoder's hot path: each space keeps its visible pieces
//! as a sorted vector with a one-entry cache of the last piece hit, so a
//! read costs a compare in the common case and a binary search otherwise,
//! and never allocates. Files are memory-mapped once per path, however
//! many sections (ELF segments, ranges, address spaces) they back.
//!
//! VMCS bases in an [`AddressSpace`] are not used to select sections.

mod elf;
mod error;
mod kcore;
mod map;
mod pe;
mod spec;
#[cfg(test)]
mod tests;

pub use elf::{ElfPlacement, SegmentFilter};
pub use error::{ImageError, SpecError};
pub use kcore::{Kcore, KcoreError, KcoreSegment, MAX_COPY, kcore_segments};
pub use spec::{
    ElfSpec, ImageSpec, PeSpec, PtxedFile, RawSpec, parse_elf_arg, parse_hex, parse_image_arg,
    parse_pe_arg, parse_ptxed_elf, parse_ptxed_file, parse_ptxed_raw,
};

use crate::backing::Backing;
use crate::pagecache::PageCache;
use elf::FileSegment;
use hwtrace_types::{AddressSpace, Cr3, Ip, MemoryError, ReadMemory};
use map::{Region, SpaceMap};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PAGE: u64 = 4096;

/// Where a section's bytes come from.
#[derive(Debug)]
enum Source {
    /// A file mapping or a buffer; regions index it by byte offset.
    Bytes(Arc<Backing>),
    /// A page cache; regions find their page by address.
    Pages(Arc<PageCache>),
}

/// A section as it was added (before later ones hid parts of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SectionInfo {
    /// The file (or buffer name) it came from.
    pub name: String,
    /// Its address space; `None`: the default space.
    pub cr3: Option<Cr3>,
    /// Its first address.
    pub addr: Ip,
    /// Its length in bytes.
    pub len: u64,
    /// Byte offset in the file of its first byte (0 for page caches and
    /// buffers).
    pub file_offset: u64,
}

/// Sections of code (and data) at virtual addresses, per address space.
#[derive(Debug, Default)]
pub struct Image {
    sources: Vec<Source>,
    sections: Vec<SectionInfo>,
    /// Sections without a CR3.
    default: SpaceMap,
    /// Sections of one CR3 each, sorted by CR3.
    spaces: Vec<(Cr3, SpaceMap)>,
    /// The source of each file mapped so far, by path.
    files: HashMap<PathBuf, u32>,
}

/// PIP reports CR3 bits 51:5 (SDM vol. 3C, §32.4.2.12); bits 4:0 of a CR3
/// given on a command line are ignored to match.
fn cr3_key(cr3: Cr3) -> Cr3 {
    Cr3(cr3.0 & !0x1f)
}

impl Image {
    /// An image with no sections.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sections in the order they were added.
    pub fn sections(&self) -> &[SectionInfo] {
        &self.sections
    }

    /// Whether no section was added.
    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }

    /// The visible address ranges of `cr3`'s own sections (`None`: the
    /// default space) as `(first, last)` inclusive pairs, ascending, with
    /// the index in [`Image::sections`] of the section each comes from.
    pub fn visible(&self, cr3: Option<Cr3>) -> Vec<(Ip, Ip, usize)> {
        let map = match cr3 {
            None => Some(&self.default),
            Some(cr3) => self.space(cr3),
        };
        map.map_or_else(Vec::new, |m| {
            m.regions()
                .iter()
                .map(|r| (Ip(r.first), Ip(r.last), r.section as usize))
                .collect()
        })
    }

    /// Adds the bytes `bytes` at `addr`, named `name` in listings and
    /// errors.
    pub fn add_bytes(
        &mut self,
        cr3: Option<Cr3>,
        addr: Ip,
        bytes: Vec<u8>,
        name: &str,
    ) -> Result<(), ImageError> {
        let len = bytes.len() as u64;
        check_range(name, addr.0, len)?;
        let source = self.push_source(Source::Bytes(Arc::new(Backing::Owned(bytes))));
        self.add_section(cr3, source, name, addr.0, len, 0)
    }

    /// Adds what one spec names; returns how many sections that added.
    pub fn add(&mut self, cr3: Option<Cr3>, spec: &ImageSpec) -> Result<usize, ImageError> {
        match spec {
            ImageSpec::Raw(raw) => self.add_raw(cr3, raw).map(|()| 1),
            ImageSpec::Elf(elf) => self.add_elf(cr3, elf),
            ImageSpec::Pe(pe) => self.add_pe(cr3, pe),
            ImageSpec::Pages(dir) => self.add_pages_dir(cr3, dir),
        }
    }

    /// Adds a raw file, or a range of it, at an address. The file is
    /// memory-mapped (once per path, however often it is added).
    pub fn add_raw(&mut self, cr3: Option<Cr3>, spec: &RawSpec) -> Result<(), ImageError> {
        let path = &spec.path;
        let (source, backing) = self.file_source(path)?;
        let file_len = backing.bytes().len() as u64;
        if spec.offset >= file_len {
            return Err(ImageError::OffsetBeyondEnd {
                path: path.clone(),
                offset: spec.offset,
                len: file_len,
            });
        }
        let available = file_len - spec.offset;
        let len = match spec.size {
            None => available,
            Some(size) if size <= available => size,
            Some(_) if spec.truncate => available,
            Some(size) => {
                return Err(ImageError::RangeBeyondEnd {
                    path: path.clone(),
                    offset: spec.offset,
                    size,
                    len: file_len,
                });
            }
        };
        let name = path.display().to_string();
        self.add_section(cr3, source, &name, spec.addr.0, len, spec.offset)
    }

    /// Adds the `PT_LOAD` segments of an ELF file; returns how many (a
    /// file with none adds nothing and returns 0).
    pub fn add_elf(&mut self, cr3: Option<Cr3>, spec: &ElfSpec) -> Result<usize, ImageError> {
        let (source, backing) = self.file_source(&spec.path)?;
        let layout = elf::elf_layout(&spec.path, backing.bytes(), spec.segments)?;
        let bias = layout.bias(spec.placement);
        self.add_segments(cr3, &spec.path, |_| source, &layout.segments, bias)
    }

    /// Adds the `PT_LOAD` segments of an ELF file held in memory.
    pub fn add_elf_bytes(
        &mut self,
        cr3: Option<Cr3>,
        name: &Path,
        bytes: Vec<u8>,
        placement: ElfPlacement,
        segments: SegmentFilter,
    ) -> Result<usize, ImageError> {
        let layout = elf::elf_layout(name, &bytes, segments)?;
        let bias = layout.bias(placement);
        let source =
            |image: &mut Self| image.push_source(Source::Bytes(Arc::new(Backing::Owned(bytes))));
        self.add_segments(cr3, name, source, &layout.segments, bias)
    }

    /// Adds the sections of a PE image; returns how many.
    pub fn add_pe(&mut self, cr3: Option<Cr3>, spec: &PeSpec) -> Result<usize, ImageError> {
        let (source, backing) = self.file_source(&spec.path)?;
        let layout = pe::pe_layout(&spec.path, backing.bytes(), spec.sections)?;
        let base = spec.base.unwrap_or(layout.image_base);
        self.add_segments(cr3, &spec.path, |_| source, &layout.segments, base)
    }

    /// Adds the sections of a PE image held in memory.
    pub fn add_pe_bytes(
        &mut self,
        cr3: Option<Cr3>,
        name: &Path,
        bytes: Vec<u8>,
        base: Option<u64>,
        sections: SegmentFilter,
    ) -> Result<usize, ImageError> {
        let layout = pe::pe_layout(name, &bytes, sections)?;
        let base = base.unwrap_or(layout.image_base);
        let source =
            |image: &mut Self| image.push_source(Source::Bytes(Arc::new(Backing::Owned(bytes))));
        self.add_segments(cr3, name, source, &layout.segments, base)
    }

    /// Adds every segment of one file, sharing one source (made by
    /// `source` only if there is a segment); all or none.
    fn add_segments(
        &mut self,
        cr3: Option<Cr3>,
        path: &Path,
        source: impl FnOnce(&mut Self) -> u32,
        segments: &[FileSegment],
        bias: u64,
    ) -> Result<usize, ImageError> {
        let name = path.display().to_string();
        // Check every segment first so a bad one leaves the image as it was.
        for seg in segments {
            check_range(&name, seg.vaddr.wrapping_add(bias), seg.size)?;
        }
        if segments.is_empty() {
            return Ok(0);
        }
        let source = source(self);
        for seg in segments {
            let addr = seg.vaddr.wrapping_add(bias);
            self.add_section(cr3, source, &name, addr, seg.size, seg.file_offset)?;
        }
        Ok(segments.len())
    }

    /// The source of the file at `path`, mapped on first use.
    fn file_source(&mut self, path: &Path) -> Result<(u32, Arc<Backing>), ImageError> {
        if let Some(&i) = self.files.get(path)
            && let Some(Source::Bytes(backing)) = self.sources.get(i as usize)
        {
            return Ok((i, Arc::clone(backing)));
        }
        let backing = Arc::new(map_file(path)?);
        let i = self.push_source(Source::Bytes(Arc::clone(&backing)));
        self.files.insert(path.to_path_buf(), i);
        Ok((i, backing))
    }

    /// Adds the pages of a page cache folder (`pages.addr`, `pages.dump`);
    /// returns how many runs of contiguous pages that made.
    pub fn add_pages_dir(&mut self, cr3: Option<Cr3>, dir: &Path) -> Result<usize, ImageError> {
        let cache = PageCache::open(dir).map_err(|source| ImageError::PageCache {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(self.add_page_cache(cr3, cache, &dir.display().to_string()))
    }

    /// Adds the pages of a page cache: each run of contiguous pages becomes
    /// one section. Returns how many.
    pub fn add_page_cache(&mut self, cr3: Option<Cr3>, cache: PageCache, name: &str) -> usize {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for page in cache.page_addresses() {
            match runs.last_mut() {
                Some((first, len)) if first.checked_add(*len) == Some(page.0) => *len += PAGE,
                _ => runs.push((page.0, PAGE)),
            }
        }
        let source = self.push_source(Source::Pages(Arc::new(cache)));
        let mut added = 0;
        for (first, len) in runs {
            // Page addresses are 4 KiB aligned, so a run ends at most at
            // the top of the address space: this cannot fail.
            if self.add_section(cr3, source, name, first, len, 0).is_ok() {
                added += 1;
            }
        }
        added
    }

    fn push_source(&mut self, source: Source) -> u32 {
        self.sources.push(source);
        u32::try_from(self.sources.len() - 1).unwrap_or(u32::MAX)
    }

    fn add_section(
        &mut self,
        cr3: Option<Cr3>,
        source: u32,
        name: &str,
        addr: u64,
        len: u64,
        file_offset: u64,
    ) -> Result<(), ImageError> {
        let last = check_range(name, addr, len)?;
        let cr3 = cr3.map(cr3_key);
        let section = u32::try_from(self.sections.len()).unwrap_or(u32::MAX);
        self.sections.push(SectionInfo {
            name: name.to_owned(),
            cr3,
            addr: Ip(addr),
            len,
            file_offset,
        });
        let region = Region {
            first: addr,
            last,
            source,
            offset: file_offset,
            section,
        };
        self.space_mut(cr3).insert(region);
        Ok(())
    }

    fn space_mut(&mut self, cr3: Option<Cr3>) -> &mut SpaceMap {
        let Some(cr3) = cr3 else {
            return &mut self.default;
        };
        let i = match self.spaces.binary_search_by_key(&cr3, |(c, _)| *c) {
            Ok(i) => i,
            Err(i) => {
                self.spaces.insert(i, (cr3, SpaceMap::default()));
                i
            }
        };
        &mut self.spaces[i].1
    }

    #[inline]
    fn space(&self, cr3: Cr3) -> Option<&SpaceMap> {
        if self.spaces.is_empty() {
            return None;
        }
        let cr3 = cr3_key(cr3);
        let i = self.spaces.binary_search_by_key(&cr3, |(c, _)| *c).ok()?;
        self.spaces.get(i).map(|(_, m)| m)
    }

    /// The bytes from `addr` (which `r` holds) to the end of `r`.
    #[inline(always)]
    fn bytes_of(&self, r: &Region, addr: u64) -> Option<&[u8]> {
        match self.sources.get(r.source as usize)? {
            Source::Bytes(b) => {
                // Sections are checked against their bytes when added, so
                // this arithmetic cannot wrap; `get` keeps it panic-free
                // regardless.
                let start = (r.offset as usize).wrapping_add((addr - r.first) as usize);
                let end = (r.offset as usize)
                    .wrapping_add((r.last - r.first) as usize)
                    .wrapping_add(1);
                b.bytes().get(start..end)
            }
            Source::Pages(cache) => {
                let base = addr & !(PAGE - 1);
                let page = cache.page(base)?;
                let end = if r.last - base >= PAGE - 1 {
                    PAGE
                } else {
                    r.last - base + 1
                };
                page.get((addr - base) as usize..end as usize)
            }
        }
    }

    /// The bytes readable at `addr` in the space of `specific` (falling
    /// back to the default space), up to where the source of the bytes
    /// changes.
    #[inline(always)]
    fn chunk(&self, specific: Option<&SpaceMap>, addr: u64) -> Option<&[u8]> {
        let Some(map) = specific else {
            let r = self.default.lookup(addr).ok()?;
            return self.bytes_of(r, addr);
        };
        match map.lookup(addr) {
            Ok(r) => self.bytes_of(r, addr),
            Err(next) => {
                let r = self.default.lookup(addr).ok()?;
                let bytes = self.bytes_of(r, addr)?;
                // The default space serves only up to the CR3's next own
                // section, which takes precedence from there on.
                match next.and_then(|n| usize::try_from(n - addr).ok()) {
                    Some(until) => bytes.get(..until.min(bytes.len())),
                    None => Some(bytes),
                }
            }
        }
    }
}

impl ReadMemory for Image {
    /// Reads from the sections of `space`'s CR3, falling back to the
    /// default space address by address, across section boundaries, until
    /// `buf` is full or an address is unmapped. Never reads past 2^64 - 1.
    #[inline]
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let specific = space.cr3.and_then(|cr3| self.space(cr3));
        // The common case: the whole read inside one piece.
        if let Some(first) = self.chunk(specific, addr.0)
            && let Some(whole) = first.get(..buf.len())
        {
            buf.copy_from_slice(whole);
            return Ok(buf.len());
        }
        self.read_pieces(specific, addr, buf)
    }
}

impl Image {
    /// A read that crosses pieces, or misses: on until `buf` is full or an
    /// address is unmapped.
    #[cold]
    #[inline(never)]
    fn read_pieces(
        &self,
        specific: Option<&SpaceMap>,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let mut done = 0;
        while done < buf.len() {
            let Some(at) = addr.0.checked_add(done as u64) else {
                break;
            };
            let Some(chunk) = self.chunk(specific, at).filter(|c| !c.is_empty()) else {
                break;
            };
            let n = chunk.len().min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&chunk[..n]);
            done += n;
        }
        if done == 0 && !buf.is_empty() {
            return Err(MemoryError::Unmapped { addr });
        }
        Ok(done)
    }
}

/// The last address of `len` bytes at `addr`, or why they cannot be a
/// section.
fn check_range(name: &str, addr: u64, len: u64) -> Result<u64, ImageError> {
    if len == 0 {
        return Err(ImageError::Empty {
            name: name.to_owned(),
            addr,
        });
    }
    addr.checked_add(len - 1)
        .ok_or_else(|| ImageError::AddressOverflow {
            name: name.to_owned(),
            addr,
            len,
        })
}

fn map_file(path: &Path) -> Result<Backing, ImageError> {
    Backing::map(path).map_err(|source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A short description of bytes no format recognised.
fn describe_unknown(data: &[u8]) -> String {
    match data.len() {
        0 => "an empty file".to_owned(),
        n if n < 16 => format!("{n} bytes of unknown data"),
        _ => {
            let magic: Vec<String> = data.iter().take(4).map(|b| format!("{b:02x}")).collect();
            format!("unknown data starting {}", magic.join(" "))
        }
    }
}
