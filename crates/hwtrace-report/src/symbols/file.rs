//! One executable file's symbol information: where its bytes load
//! (ELF `PT_LOAD` segments, PE sections), its function symbols (ELF
//! `.symtab`/`.dynsym`, COFF symbols, PE exports, a matching PDB's
//! procedures and publics), sorted for binary search, and the DWARF it
//! carries or points at (loaded on first use).

use super::SymbolError;
use super::dwarf::Dwarf;
use super::pdbfile::{self, CodeView};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use std::cell::OnceCell;
use std::path::{Path, PathBuf};

/// Which kind of file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// ELF.
    Elf,
    /// PE (COFF with an optional header).
    Pe,
    /// Anything else `object` reads (Mach-O, plain COFF, ...).
    Other,
    /// A list of symbols without code or headers (`/proc/kallsyms`):
    /// [`ObjectInfo::from_symbols`].
    SymbolList,
}

/// A range of the file loaded at a link-time address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// File offset of its first byte.
    pub offset: u64,
    /// Bytes of it in the file.
    pub file_size: u64,
    /// Its link-time address.
    pub vaddr: u64,
    /// Its size in memory.
    pub mem_size: u64,
}

/// A function symbol at its link-time address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Func {
    /// Link-time address.
    pub addr: u64,
    /// Size in bytes (0: it covers its own address only).
    pub size: u64,
    /// Its name as the symbol table has it, demangled (Rust, C++).
    pub name: Box<str>,
}

/// What one file says about the code in it.
pub struct ObjectInfo {
    path: PathBuf,
    format: FileFormat,
    segments: Vec<Segment>,
    /// The lowest loaded link-time address (ELF: lowest `PT_LOAD`
    /// `p_vaddr`; PE: `ImageBase`): where the image's base is.
    lowest: u64,
    /// By address; at one address, global symbols first, then by name.
    funcs: Vec<Func>,
    /// `reach[i]`: the highest end of the symbols `funcs[..=i]`, so a
    /// lookup stops scanning back as soon as nothing below can cover.
    reach: Vec<u64>,
    /// The GNU build id note, for finding separate debug info.
    build_id: Option<Vec<u8>>,
    /// The entry point's link-time address (0: none).
    entry: u64,
    /// `.gnu_debuglink`'s file name.
    debuglink: Option<String>,
    /// The PDB whose names were read (PE only).
    pdb: Option<PathBuf>,
    /// Why PDBs that were found were not used (wrong GUID or age,
    /// corrupt): the symbols then come from the image alone.
    pdb_problems: Vec<SymbolError>,
    dwarf: OnceCell<Option<Dwarf>>,
}

impl std::fmt::Debug for ObjectInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectInfo")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("segments", &self.segments.len())
            .field("funcs", &self.funcs.len())
            .finish_non_exhaustive()
    }
}

impl ObjectInfo {
    /// Reads `path`'s headers and symbols (not its DWARF: that waits for
    /// the first line or frame lookup).
    ///
    /// The first bytes are looked at before the file is read whole, so a
    /// raw memory dump given as an image costs no more than its header.
    pub fn load(path: &Path) -> Result<Self, SymbolError> {
        Self::load_with_pdb(path, None)
    }

    /// [`Self::load`], trying the PDB `pdb` (when given) before the ones
    /// a PE image's CodeView record points at.
    pub fn load_with_pdb(path: &Path, pdb: Option<&Path>) -> Result<Self, SymbolError> {
        use std::io::Read;
        let unreadable = |e: std::io::Error| SymbolError::Read {
            path: path.to_path_buf(),
            error: e.to_string(),
        };
        let mut magic = [0u8; 4];
        let mut file = std::fs::File::open(path).map_err(unreadable)?;
        let n = file.read(&mut magic).map_err(unreadable)?;
        if !is_object_magic(&magic[..n]) {
            return Err(SymbolError::Parse {
                path: path.to_path_buf(),
                error: "no ELF, PE or Mach-O header".to_owned(),
            });
        }
        let data = std::fs::read(path).map_err(unreadable)?;
        Self::parse_with_pdb(path, &data, pdb)
    }

    /// Reads the headers and symbols of `data`, the bytes of `path`; for a
    /// PE image also the PDB beside it or at its recorded path.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self, SymbolError> {
        Self::parse_with_pdb(path, data, None)
    }

    /// [`Self::parse`], trying the PDB `pdb` (when given) first.
    pub fn parse_with_pdb(
        path: &Path,
        data: &[u8],
        pdb: Option<&Path>,
    ) -> Result<Self, SymbolError> {
        let bad = |error: object::Error| SymbolError::Parse {
            path: path.to_path_buf(),
            error: error.to_string(),
        };
        let file = object::File::parse(data).map_err(bad)?;
        let format = match file.format() {
            object::BinaryFormat::Elf => FileFormat::Elf,
            object::BinaryFormat::Pe => FileFormat::Pe,
            _ => FileFormat::Other,
        };
        let segments: Vec<Segment> = if format == FileFormat::Pe {
            // PE sections are what the loader maps, at ImageBase + RVA.
            file.sections()
                .filter(|s| s.size() > 0)
                .map(|s| {
                    let (offset, file_size) = s.file_range().unwrap_or((0, 0));
                    Segment {
                        offset,
                        file_size,
                        vaddr: s.address(),
                        mem_size: s.size(),
                    }
                })
                .collect()
        } else {
            // For ELF, `segments()` are the PT_LOAD program headers.
            file.segments()
                .map(|s| {
                    let (offset, file_size) = s.file_range();
                    Segment {
                        offset,
                        file_size,
                        vaddr: s.address(),
                        mem_size: s.size(),
                    }
                })
                .collect()
        };
        let lowest = if format == FileFormat::Pe {
            file.relative_address_base()
        } else {
            segments.iter().map(|s| s.vaddr).min().unwrap_or(0)
        };
        let mut pdb_used = None;
        let mut pdb_problems = Vec::new();
        let mut pdb_funcs = None;
        if format == FileFormat::Pe
            && let Some(cv) = CodeView::of(&file)
        {
            let auto = cv.candidates(path).into_iter().filter(|c| c.is_file());
            for candidate in pdb.map(Path::to_path_buf).into_iter().chain(auto) {
                if pdb_problems
                    .iter()
                    .any(|p: &SymbolError| p.path() == candidate)
                {
                    continue;
                }
                match pdbfile::read(&candidate, path, &cv, lowest) {
                    Ok(funcs) => {
                        pdb_funcs = Some(funcs);
                        pdb_used = Some(candidate);
                        break;
                    }
                    Err(e) => pdb_problems.push(e),
                }
            }
        }
        let funcs = functions(&file, &segments, format, pdb_funcs);
        let reach = reach_of(&funcs);
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let debuglink = file
            .gnu_debuglink()
            .ok()
            .flatten()
            .map(|(name, _)| String::from_utf8_lossy(name).into_owned());
        Ok(Self {
            path: path.to_path_buf(),
            format,
            segments,
            lowest,
            funcs,
            reach,
            entry: file.entry(),
            build_id,
            debuglink,
            pdb: pdb_used,
            pdb_problems,
            dwarf: OnceCell::new(),
        })
    }

    /// The functions of a symbol list (kallsyms) read from `path`: no
    /// segments, no DWARF; each function at its runtime address. Sorted
    /// here; at one address the first given is kept.
    pub fn from_symbols(path: &Path, mut funcs: Vec<Func>) -> Self {
        funcs.sort_by_key(|f| f.addr);
        funcs.dedup_by_key(|f| f.addr);
        let reach = reach_of(&funcs);
        Self {
            path: path.to_path_buf(),
            format: FileFormat::SymbolList,
            segments: Vec::new(),
            lowest: funcs.first().map_or(0, |f| f.addr),
            funcs,
            reach,
            build_id: None,
            entry: 0,
            debuglink: None,
            pdb: None,
            pdb_problems: Vec::new(),
            dwarf: OnceCell::from(None),
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The PDB whose function names it uses, if one was found and
    /// matched the image.
    pub fn pdb(&self) -> Option<&Path> {
        self.pdb.as_deref()
    }

    /// Why PDBs that were found were refused (GUID or age mismatch,
    /// corrupt, unreadable); the functions then come from the image.
    pub fn pdb_problems(&self) -> &[SymbolError] {
        &self.pdb_problems
    }

    /// Its format.
    pub fn format(&self) -> FileFormat {
        self.format
    }

    /// Its loaded ranges.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The lowest loaded link-time address (the image base).
    pub fn lowest(&self) -> u64 {
        self.lowest
    }

    /// The entry point's link-time address, if the file has one.
    pub fn entry(&self) -> Option<u64> {
        (self.entry != 0).then_some(self.entry)
    }

    /// The link-time address the byte at file offset `offset` loads at
    /// (`None` where no segment holds it, or where the header's numbers
    /// would place it past the top of memory).
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|s| {
            let into = offset.checked_sub(s.offset).filter(|&d| d < s.file_size)?;
            s.vaddr.checked_add(into)
        })
    }

    /// The function symbol covering link-time address `addr`: the first
    /// symbol at the highest address at or below it whose size reaches it
    /// (a symbol of size 0 covers its own address only).
    pub fn func(&self, addr: u64) -> Option<&Func> {
        let end = self.funcs.partition_point(|f| f.addr <= addr);
        let covers = |f: &Func| addr - f.addr < f.size.max(1);
        let nearest = (0..end)
            .rev()
            .take_while(|&i| self.reach[i] > addr)
            .find(|&i| covers(&self.funcs[i]))?;
        let at = self.funcs[nearest].addr;
        let first = self.funcs[..=nearest].partition_point(|f| f.addr < at);
        self.funcs[first..=nearest].iter().find(|f| covers(f))
    }

    /// Function symbols by address.
    pub fn funcs(&self) -> &[Func] {
        &self.funcs
    }

    /// The file's DWARF (or its separate debug file's), loaded the first
    /// time; `None` when there is none.
    pub fn dwarf(&self) -> Option<&Dwarf> {
        self.dwarf
            .get_or_init(|| {
                for candidate in self.debug_files() {
                    if let Ok(Some(d)) = Dwarf::load(&candidate) {
                        return Some(d);
                    }
                }
                None
            })
            .as_ref()
    }

    /// Where DWARF may be: the file itself, then the debug files the GNU
    /// tools look for (by build id, then by `.gnu_debuglink`).
    fn debug_files(&self) -> Vec<PathBuf> {
        let mut out = vec![self.path.clone()];
        if let Some(id) = self.build_id.as_deref().filter(|id| id.len() > 1) {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            out.push(PathBuf::from(format!(
                "/usr/lib/debug/.build-id/{}/{}.debug",
                &hex[..2],
                &hex[2..]
            )));
        }
        if let Some(link) = &self.debuglink {
            let dir = self.path.parent().unwrap_or(Path::new("/"));
            out.push(dir.join(link));
            out.push(dir.join(".debug").join(link));
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            out.push(Path::new("/usr/lib/debug").join(rel).join(link));
        }
        out
    }
}

/// `reach[i]` of sorted `funcs`: the highest end of `funcs[..=i]`.
fn reach_of(funcs: &[Func]) -> Vec<u64> {
    funcs
        .iter()
        .scan(0u64, |top, f| {
            *top = (*top).max(f.addr.saturating_add(f.size.max(1)));
            Some(*top)
        })
        .collect()
}

/// Whether `head` starts like a file `object` reads as an executable:
/// ELF, PE (`MZ`), Mach-O (either byte order, fat or thin).
fn is_object_magic(head: &[u8]) -> bool {
    const MAGICS: [&[u8]; 7] = [
        b"\x7fELF",
        b"MZ",
        &[0xcf, 0xfa, 0xed, 0xfe],
        &[0xce, 0xfa, 0xed, 0xfe],
        &[0xfe, 0xed, 0xfa, 0xcf],
        &[0xfe, 0xed, 0xfa, 0xce],
        &[0xca, 0xfe, 0xba, 0xbe],
    ];
    MAGICS.iter().any(|m| head.starts_with(m))
}

/// The defined function symbols of `file` (PE: with its exports, and
/// its PDB's functions `pdb`, which win where they cover a symbol), sorted
/// and without duplicates. Sizeless PE exports reach the next symbol (or
/// their section's end): PE export tables give no sizes.
fn functions(
    file: &object::File<'_>,
    segments: &[Segment],
    format: FileFormat,
    pdb: Option<Vec<Func>>,
) -> Vec<Func> {
    let mut funcs: Vec<(bool, Func)> = Vec::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() {
            continue;
        }
        funcs.push((
            sym.is_global(),
            Func {
                addr: sym.address(),
                size: sym.size(),
                name: demangled(name),
            },
        ));
    }
    if format == FileFormat::Pe
        && let Ok(exports) = file.exports()
    {
        for e in exports {
            funcs.push((
                true,
                Func {
                    addr: e.address(),
                    size: 0,
                    name: demangled(&String::from_utf8_lossy(e.name())),
                },
            ));
        }
    }
    if let Some(pdb) = pdb {
        funcs = pdbfile::merge(pdb, funcs);
    }
    funcs.sort_by(|(ga, a), (gb, b)| {
        (a.addr, !ga, &a.name, a.size).cmp(&(b.addr, !gb, &b.name, b.size))
    });
    let mut funcs: Vec<Func> = funcs.into_iter().map(|(_, f)| f).collect();
    // The same symbol from .symtab and .dynsym (or a COFF symbol and an export).
    funcs.dedup_by(|b, a| a.addr == b.addr && a.name == b.name);
    if format == FileFormat::Pe {
        let starts: Vec<u64> = funcs.iter().map(|f| f.addr).collect();
        for f in funcs.iter_mut().filter(|f| f.size == 0) {
            let next = starts[starts.partition_point(|&a| a <= f.addr)..]
                .first()
                .copied();
            let section_end = segments
                .iter()
                .find(|s| f.addr.wrapping_sub(s.vaddr) < s.mem_size)
                .map(|s| s.vaddr.saturating_add(s.mem_size));
            let end = match (next, section_end) {
                (Some(n), Some(e)) => n.min(e),
                (Some(n), None) => n,
                (None, Some(e)) => e,
                (None, None) => f.addr.saturating_add(1),
            };
            f.size = end.saturating_sub(f.addr).max(1);
        }
    }
    funcs
}

/// A symbol's name as people read it: Rust (legacy and v0) and Itanium C++
/// mangled names demangled (`hwtrace_demo::Counter::step(int)`, Rust paths
/// without their hash), anything else as it is, like `perf report` shows
/// them by default.
fn demangled(name: &str) -> Box<str> {
    addr2line::demangle_auto(std::borrow::Cow::Borrowed(name), None)
        .into_owned()
        .into()
}
