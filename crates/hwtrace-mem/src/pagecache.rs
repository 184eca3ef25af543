//! Page caches as kAFL/Nyx and libxdc store them: `pages.addr`, a list of
//! little-endian u64 page virtual addresses (a value whose low 12 bits are
//! not zero marks a page that was not mapped), and `pages.dump`, the 4 KiB
//! pages in the same order. The corpus in `../shared/corpus/real/` uses it.

use crate::backing::Backing;
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
use std::io;
use std::path::{Path, PathBuf};

const PAGE: usize = 4096;

/// Why a page cache could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PageCacheError {
    /// A file could not be read or mapped.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// `pages.addr` is not a whole number of u64s.
    #[error("address list of {len} bytes is not a multiple of 8")]
    AddrLength {
        /// Its length.
        len: usize,
    },
    /// No page cache where one was asked for.
    #[error("no page cache: none of {}", tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    NotFound {
        /// The address lists looked for (each with its `.dump` beside it).
        tried: Vec<PathBuf>,
    },
    /// `pages.dump` holds fewer pages than `pages.addr` names.
    #[error("page dump of {dump_len} bytes is shorter than the {pages} pages listed")]
    DumpTooShort {
        /// Entries in the address list.
        pages: usize,
        /// Length of the page dump.
        dump_len: usize,
    },
}

/// A page cache: virtual pages of one address space, memory-mapped.
#[derive(Debug)]
pub struct PageCache {
    dump: Backing,
    /// (page virtual address, slot in the dump), sorted by address.
    index: Vec<(u64, usize)>,
}

impl PageCache {
    /// Opens the page cache `path` names: a folder holding `pages.addr`
    /// and `pages.dump` (hwtrace's and the corpus's names) or
    /// `page_cache.addr` and `page_cache.dump` (a kAFL/Nyx work folder's),
    /// or the common start of two such files (`PREFIX.addr`,
    /// `PREFIX.dump`, as libxdc's tools take it).
    pub fn open(path: &Path) -> Result<Self, PageCacheError> {
        let (addr, dump) = Self::locate(path)?;
        Self::open_files(&addr, &dump)
    }

    /// The address list and page dump [`open`](Self::open) reads for
    /// `path`: the first pair of the candidates whose address list exists.
    pub fn locate(path: &Path) -> Result<(PathBuf, PathBuf), PageCacheError> {
        let with = |stem: PathBuf, ext: &str| {
            let mut s = stem.into_os_string();
            s.push(ext);
            PathBuf::from(s)
        };
        let stems = [
            path.join("pages"),
            path.join("page_cache"),
            path.to_path_buf(),
        ];
        for stem in &stems {
            let addr = with(stem.clone(), ".addr");
            if addr.is_file() {
                return Ok((addr, with(stem.clone(), ".dump")));
            }
        }
        Err(PageCacheError::NotFound {
            tried: stems.into_iter().map(|s| with(s, ".addr")).collect(),
        })
    }

    /// Opens an address list and a page dump.
    pub fn open_files(addr: &Path, dump: &Path) -> Result<Self, PageCacheError> {
        let io_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PageCacheError::Io { path, source }
        };
        let addrs = std::fs::read(addr).map_err(io_err(addr))?;
        let dump = Backing::map(dump).map_err(io_err(dump))?;
        Self::build(&addrs, dump)
    }

    /// A page cache from bytes in memory.
    pub fn from_bytes(addrs: &[u8], dump: Vec<u8>) -> Result<Self, PageCacheError> {
        Self::build(addrs, Backing::Owned(dump))
    }

    fn build(addrs: &[u8], dump: Backing) -> Result<Self, PageCacheError> {
        if !addrs.len().is_multiple_of(8) {
            return Err(PageCacheError::AddrLength { len: addrs.len() });
        }
        let pages = addrs.len() / 8;
        let dump_len = dump.bytes().len();
        if pages.checked_mul(PAGE).is_none_or(|need| need > dump_len) {
            return Err(PageCacheError::DumpTooShort { pages, dump_len });
        }
        let mut index: Vec<(u64, usize)> = addrs
            .chunks_exact(8)
            .enumerate()
            .filter_map(|(slot, b)| {
                let mut v = [0u8; 8];
                v.copy_from_slice(b);
                let va = u64::from_le_bytes(v);
                (va & 0xfff == 0).then_some((va, slot))
            })
            .collect();
        // Stable: of duplicate addresses, the first listed wins.
        index.sort_by_key(|&(va, _)| va);
        index.dedup_by_key(|&mut (va, _)| va);
        Ok(Self { dump, index })
    }

    /// How many mapped pages the cache holds.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the cache holds no mapped page.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The virtual addresses of the mapped pages, ascending.
    pub fn page_addresses(&self) -> impl Iterator<Item = Ip> + '_ {
        self.index.iter().map(|&(va, _)| Ip(va))
    }

    /// The 4 KiB page at page address `va`.
    pub fn page(&self, va: u64) -> Option<&[u8]> {
        let i = self.index.binary_search_by_key(&va, |&(v, _)| v).ok()?;
        let slot = self.index.get(i)?.1;
        self.dump.bytes().get(slot * PAGE..(slot + 1) * PAGE)
    }
}

/// Pages gathered from pieces of memory, to be written as a page cache
/// ([`PageCacheWriter::write`]): what a program ran, say, for tools that
/// read code from page caches (`hwtrace flow --pages`, libxdc, kAFL).
/// Bytes of a page no piece covered are zero; where pieces overlap, the
/// later one's bytes are kept.
#[derive(Debug, Default)]
pub struct PageCacheWriter {
    pages: std::collections::BTreeMap<u64, Box<[u8; PAGE]>>,
}

impl PageCacheWriter {
    /// No pages yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` at virtual address `addr` (across as many pages as
    /// they span; bytes past the top of the address space are dropped).
    pub fn add(&mut self, addr: u64, bytes: &[u8]) {
        let mut done = 0usize;
        while done < bytes.len() {
            let Some(va) = addr.checked_add(done as u64) else {
                return;
            };
            let base = va & !(PAGE as u64 - 1);
            let at = (va - base) as usize;
            let n = (PAGE - at).min(bytes.len() - done);
            let page = self
                .pages
                .entry(base)
                .or_insert_with(|| Box::new([0; PAGE]));
            page[at..at + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
    }

    /// How many pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether no page was added.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Writes `dir/pages.addr` and `dir/pages.dump` (creating `dir`), in
    /// ascending address order.
    pub fn write(&self, dir: &Path) -> Result<(), PageCacheError> {
        let io_err = |path: PathBuf| move |source| PageCacheError::Io { path, source };
        std::fs::create_dir_all(dir).map_err(io_err(dir.to_path_buf()))?;
        let mut addrs = Vec::with_capacity(self.pages.len() * 8);
        let mut dump = Vec::with_capacity(self.pages.len() * PAGE);
        for (va, page) in &self.pages {
            addrs.extend_from_slice(&va.to_le_bytes());
            dump.extend_from_slice(&page[..]);
        }
        let addr_path = dir.join("pages.addr");
        std::fs::write(&addr_path, addrs).map_err(io_err(addr_path.clone()))?;
        let dump_path = dir.join("pages.dump");
        std::fs::write(&dump_path, dump).map_err(io_err(dump_path.clone()))
    }
}

impl ReadMemory for PageCache {
    /// Reads across page boundaries; the address space is ignored (a page
    /// cache holds one).
    fn read_memory(
        &self,
        _space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let mut done = 0;
        while done < buf.len() {
            let va = addr.0.wrapping_add(done as u64);
            let Some(page) = self.page(va & !0xfff) else {
                return if done == 0 {
                    Err(MemoryError::Unmapped { addr })
                } else {
                    Ok(done)
                };
            };
            let off = (va & 0xfff) as usize;
            let n = (PAGE - off).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&page[off..off + n]);
            done += n;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> PageCache {
        let addrs: Vec<u8> = [0x40_1000u64, 0x40_0000, 0x50_0001, 0x40_0000]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut dump = vec![0u8; 4 * PAGE];
        dump[..PAGE].fill(0x11);
        dump[PAGE..2 * PAGE].fill(0x22);
        dump[2 * PAGE..3 * PAGE].fill(0x33);
        dump[3 * PAGE..].fill(0x44);
        PageCache::from_bytes(&addrs, dump).unwrap()
    }

    #[test]
    fn reads_cross_pages_and_first_duplicate_wins() {
        let c = cache();
        assert_eq!(c.len(), 2);
        let mut b = [0u8; 4];
        assert_eq!(
            c.read_memory(AddressSpace::UNKNOWN, Ip(0x40_0ffe), &mut b),
            Ok(4)
        );
        assert_eq!(b, [0x22, 0x22, 0x11, 0x11]);
        let mut big = [0u8; 16];
        assert_eq!(
            c.read_memory(AddressSpace::UNKNOWN, Ip(0x40_1ff8), &mut big),
            Ok(8)
        );
    }

    #[test]
    fn unmapped_markers_and_misses_are_unmapped() {
        let c = cache();
        let mut b = [0u8; 1];
        for addr in [0x50_0000u64, 0x50_0001, 0x3f_ffff, 0] {
            assert_eq!(
                c.read_memory(AddressSpace::UNKNOWN, Ip(addr), &mut b),
                Err(MemoryError::Unmapped { addr: Ip(addr) })
            );
        }
    }

    #[test]
    fn malformed_inputs_are_refused() {
        assert!(matches!(
            PageCache::from_bytes(&[0; 7], vec![]),
            Err(PageCacheError::AddrLength { len: 7 })
        ));
        assert!(matches!(
            PageCache::from_bytes(&[0; 16], vec![0; PAGE]),
            Err(PageCacheError::DumpTooShort {
                pages: 2,
                dump_len: 4096
            })
        ));
    }

    #[test]
    fn corpus_page_caches_open_and_read() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real");
        let dirs = std::fs::read_dir(&root).unwrap_or_else(|e| {
            panic!(
                "the corpus belongs beside the checkout: {}: {e}",
                root.display()
            )
        });
        let mut seen = 0;
        for dir in dirs.flatten() {
            let c = PageCache::open(&dir.path()).unwrap();
            let first = c.page_addresses().next().unwrap();
            let mut b = [0u8; 4096 + 16];
            let n = c
                .read_memory(AddressSpace::UNKNOWN, first.add(4096 - 8), &mut b)
                .unwrap();
            assert!(n >= 8);
            seen += 1;
        }
        assert_eq!(seen, 3);
    }

    #[test]
    fn written_pages_read_back() {
        let mut w = PageCacheWriter::new();
        // Across a page boundary, then overlapping the first piece.
        w.add(0x40_0ffe, &[1, 2, 3, 4]);
        w.add(0x40_0fff, &[9]);
        w.add(0x7000, &[5]);
        assert_eq!(w.len(), 3);
        let dir = std::env::temp_dir().join(format!("hwtrace-pagecache-{}", std::process::id()));
        w.write(&dir).unwrap();
        let cache = PageCache::open(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let pages: Vec<u64> = cache.page_addresses().map(|ip| ip.0).collect();
        assert_eq!(pages, [0x7000, 0x40_0000, 0x40_1000]);
        let mut buf = [0u8; 6];
        let n = cache
            .read_memory(AddressSpace::default(), Ip(0x40_0ffd), &mut buf)
            .unwrap();
        assert_eq!((n, buf), (6, [0, 1, 9, 3, 4, 0]));
        assert_eq!(cache.page(0x7000).unwrap()[..2], [5, 0]);
        // The top of the address space: what does not fit is dropped.
        let mut top = PageCacheWriter::new();
        top.add(u64::MAX, &[1, 2]);
        assert_eq!(top.len(), 1);
    }

    /// A kAFL/Nyx work folder's `page_cache.*`, and `PREFIX.addr` /
    /// `PREFIX.dump` given by their prefix, open as `pages.*` do; where
    /// there is none the error names every file looked for.
    #[test]
    fn page_caches_are_found_by_folder_or_prefix() {
        let dir =
            std::env::temp_dir().join(format!("hwtrace-pagecache-names-{}", std::process::id()));
        let mut w = PageCacheWriter::new();
        w.add(0x40_1000, &[0xc3]);
        w.write(&dir).unwrap();
        let names = [("page_cache", dir.clone()), ("data", dir.join("data"))];
        for (stem, arg) in names {
            for ext in ["addr", "dump"] {
                std::fs::rename(
                    dir.join(format!("pages.{ext}")),
                    dir.join(format!("{stem}.{ext}")),
                )
                .unwrap();
            }
            let cache = PageCache::open(&arg).unwrap_or_else(|e| panic!("{}: {e}", arg.display()));
            assert_eq!(cache.page(0x40_1000).map(|p| p[0]), Some(0xc3));
            for ext in ["addr", "dump"] {
                std::fs::rename(
                    dir.join(format!("{stem}.{ext}")),
                    dir.join(format!("pages.{ext}")),
                )
                .unwrap();
            }
        }
        let missing = dir.join("nothing");
        let e = PageCache::open(&missing).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        for tried in [
            "nothing/pages.addr",
            "nothing/page_cache.addr",
            "nothing.addr",
        ] {
            assert!(e.contains(tried), "{e}");
        }
    }
}
