//! The one symboliser every answer uses: which image an address is in,
//! the function symbol covering it, and with DWARF its source line and
//! inlined frames. A PE image's functions come from its PDB when one with
//! the image's GUID and age is found ([`Symbolizer::set_pdb`], beside the
//! image, or where its CodeView record says), else from its exports.
//! Kernel addresses are named from `/proc/kallsyms` text ([`Kallsyms`]),
//! added as a symbol list.
//!
//! Images are added as [`Mapping`]s (a file's bytes from an offset, at an
//! address, in an address space: what the front end loaded or the perf
//! sideband recorded) or as whole files at a bias ([`Symbolizer::add_file`],
//! `--elf FILE@BIAS`). Mappings of one file at one bias form a
//! [`Module`], whose base is where the file's lowest loaded address
//! landed, so `image+0xoff` and drcov's module offsets are the offsets a
//! disassembler shows for the file.
//!
//! Lookups: a sorted, non-overlapping range table per address space
//! (binary search; where mappings overlap, the later one wins, as in the
//! decoder's images), then the file's sorted symbol table (binary search
//! with a prefix maximum of symbol ends, so addresses no symbol covers do
//! not scan the table), then addr2line (which parses each compilation
//! unit once, on first use). Each file is read once however often it is
//! mapped; its DWARF only when a line or frame is first asked for.

mod dwarf;
mod file;
mod kallsyms;
mod pdbfile;
mod ranges;

pub use dwarf::{Dwarf, Frame, LineRange};
pub use file::{FileFormat, Func, ObjectInfo, Segment};
pub use kallsyms::{Kallsyms, KallsymsError, LAST_SYMBOL_REACH};
pub use pdbfile::quiet_caught_panics;

use crate::exec::Mapping;
use hwtrace_types::{Cr3, Ip};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The functions a PDB held in memory names, at `image_base` + RVA, with
/// no image to match it against (a PE image's own PDB is found and checked
/// by [`Symbolizer`]): procedures with their sizes, public code symbols at
/// other addresses with size 0, sorted by address. `name` names the PDB in
/// errors.
pub fn pdb_functions(name: &Path, bytes: &[u8], image_base: u64) -> Result<Vec<Func>, SymbolError> {
    pdbfile::read_from(std::io::Cursor::new(bytes), name, None, image_base)
}

/// Why a file gave no symbols.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SymbolError {
    /// The file could not be read.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        error: String,
    },
    /// The file is not an object file `object` can read.
    #[error("{}: not an executable file: {error}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        error: String,
    },
    /// The file has nothing loadable.
    #[error("{}: no loadable segment", path.display())]
    NoSegments {
        /// The file.
        path: PathBuf,
    },
    /// A PDB found for a PE image is another build's: its names would be
    /// wrong, so it is not used.
    #[error("{}: not the PDB of {}: it is {found}, the image wants {wanted}", path.display(), image.display())]
    PdbMismatch {
        /// The PDB.
        path: PathBuf,
        /// The image.
        image: PathBuf,
        /// The image's CodeView GUID and age.
        wanted: String,
        /// The PDB's GUID and age.
        found: String,
    },
    /// A PDB could not be parsed.
    #[error("{}: corrupt PDB: {error}", path.display())]
    Pdb {
        /// The PDB.
        path: PathBuf,
        /// What was wrong.
        error: String,
    },
}

impl SymbolError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Read { path, .. }
            | Self::Parse { path, .. }
            | Self::NoSegments { path }
            | Self::PdbMismatch { path, .. }
            | Self::Pdb { path, .. } => path,
        }
    }
}

/// An address space as answers see it: the process (perf.data) and the
/// CR3 (PT's PIP packets). A field left `None` in a mapping matches
/// every value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Space {
    /// The process id.
    pub pid: Option<u32>,
    /// The CR3.
    pub cr3: Option<Cr3>,
}

impl Space {
    /// The space of every process and CR3.
    pub const ANY: Self = Self {
        pid: None,
        cr3: None,
    };
}

/// Where a whole file is placed ([`Symbolizer::add_file`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Its link-time addresses plus this bias.
    Bias(u64),
    /// Its lowest loaded address at this address.
    LowestAt(Ip),
}

/// One image: a file (or a named region without a readable file) mapped
/// at one bias in one address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// The file.
    pub path: PathBuf,
    /// Its file name, for `name+0xoff`.
    pub name: String,
    /// The space it is mapped in.
    pub space: Space,
    /// Where its lowest loaded address is (its image base): offsets in it
    /// are counted from here.
    pub base: Ip,
    /// The lowest address mapped.
    pub start: Ip,
    /// One past the highest address mapped.
    pub end: Ip,
    /// Runtime address minus link-time address.
    pub bias: u64,
    /// Index of its file in the symboliser's file table, if readable.
    file: Option<usize>,
}

/// A function symbol at its runtime address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionRef<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its first byte.
    pub start: Ip,
    /// Its size (0: unknown).
    pub size: u64,
}

/// The symboliser: images per address space, their symbols and DWARF.
#[derive(Debug, Default)]
pub struct Symbolizer {
    modules: Vec<Module>,
    /// The ranges each module covers, in the order added.
    mapped: Vec<(Space, Ip, Ip, usize)>,
    /// Per space, sorted disjoint `(start, end, module)`.
    index: HashMap<Space, Vec<(u64, u64, usize)>>,
    files: Vec<ObjectInfo>,
    /// Path → index in `files`, or `None` when it could not be read.
    by_path: HashMap<PathBuf, Option<usize>>,
    problems: Vec<SymbolError>,
    /// Image path → the PDB to try first for it ([`Self::set_pdb`]).
    pdbs: HashMap<PathBuf, PathBuf>,
}

impl Symbolizer {
    /// An empty symboliser.
    pub fn new() -> Self {
        Self::default()
    }

    /// The images of `mappings`. Files that cannot be read still name
    /// their addresses (`file+0xoff`); why they gave no symbols is in
    /// [`Self::problems`].
    pub fn from_mappings(mappings: &[Mapping]) -> Self {
        let mut s = Self::new();
        for m in mappings {
            s.insert_mapping(m);
        }
        s.rebuild();
        s
    }

    /// Adds one mapping (see [`Self::from_mappings`]).
    pub fn add_mapping(&mut self, m: &Mapping) {
        self.insert_mapping(m);
        self.rebuild();
    }

    /// Adds every loadable segment of the file at `path`, placed as
    /// `placement` says, in `space`; fails if the file cannot be read or
    /// has nothing to load.
    pub fn add_file(
        &mut self,
        path: &Path,
        placement: Placement,
        space: Space,
    ) -> Result<(), SymbolError> {
        let index = match self.by_path.get(path) {
            Some(Some(i)) => *i,
            _ => {
                let info =
                    ObjectInfo::load_with_pdb(path, self.pdbs.get(path).map(PathBuf::as_path))?;
                self.problems.extend_from_slice(info.pdb_problems());
                self.files.push(info);
                let i = self.files.len() - 1;
                self.by_path.insert(path.to_path_buf(), Some(i));
                i
            }
        };
        let info = &self.files[index];
        let segments: Vec<Segment> = info
            .segments()
            .iter()
            .copied()
            .filter(|s| s.mem_size > 0)
            .collect();
        if segments.is_empty() {
            return Err(SymbolError::NoSegments {
                path: path.to_path_buf(),
            });
        }
        let bias = match placement {
            Placement::Bias(b) => b,
            Placement::LowestAt(at) => at.0.wrapping_sub(info.lowest()),
        };
        let module = self.module_for(path, space, Some(index), bias);
        for seg in segments {
            let start = Ip(seg.vaddr.wrapping_add(bias));
            self.extend(module, space, start, seg.mem_size);
        }
        self.rebuild();
        Ok(())
    }

    /// Adds a symbol list read from `path` (`/proc/kallsyms`: functions
    /// at their runtime addresses, no code) as one module in `space`,
    /// spanning its functions. Where it overlaps images added before, it
    /// wins: a kernel mapping perf recorded as `[kernel.kallsyms]_text`
    /// is named by the list's functions. Nothing is added for an empty
    /// list.
    pub fn add_symbol_list(&mut self, path: &Path, space: Space, funcs: Vec<Func>) {
        let info = ObjectInfo::from_symbols(path, funcs);
        let (Some(first), Some(last)) = (info.funcs().first(), info.funcs().last()) else {
            return;
        };
        let (start, end) = (first.addr, last.addr.saturating_add(last.size.max(1)));
        self.files.push(info);
        let index = self.files.len() - 1;
        self.by_path.insert(path.to_path_buf(), Some(index));
        let module = self.module_for(path, space, Some(index), 0);
        self.extend(module, space, Ip(start), end - start);
        self.rebuild();
    }

    /// Names the PDB of the PE image at `image`, tried before the one
    /// beside the image and the one its CodeView record names; like
    /// those, used only if its GUID and age match the image's. Takes
    /// effect for images added after this call.
    pub fn set_pdb(&mut self, image: &Path, pdb: &Path) {
        self.pdbs.insert(image.to_path_buf(), pdb.to_path_buf());
    }

    /// Files that could not be read or parsed, and PDBs that were found
    /// but refused (another build's, or corrupt).
    pub fn problems(&self) -> &[SymbolError] {
        &self.problems
    }

    /// Every module, in the order first mapped.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Whether no image was added.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The file information of `module`, if its file could be read.
    pub fn object(&self, module: &Module) -> Option<&ObjectInfo> {
        module.file.map(|i| &self.files[i])
    }

    fn file_index(&mut self, path: &Path) -> Option<usize> {
        if let Some(known) = self.by_path.get(path) {
            return *known;
        }
        let index = match ObjectInfo::load_with_pdb(path, self.pdbs.get(path).map(PathBuf::as_path))
        {
            Ok(info) => {
                self.problems.extend_from_slice(info.pdb_problems());
                self.files.push(info);
                Some(self.files.len() - 1)
            }
            Err(e) => {
                self.problems.push(e);
                None
            }
        };
        self.by_path.insert(path.to_path_buf(), index);
        index
    }

    fn insert_mapping(&mut self, m: &Mapping) {
        if m.len == 0 {
            return;
        }
        let space = Space {
            pid: m.pid,
            cr3: m.cr3,
        };
        let file = self.file_index(&m.path);
        let vaddr = file.and_then(|i| self.files[i].vaddr_of_offset(m.file_offset));
        // Without a file (or outside its segments) the file's offsets are
        // its addresses: `image+0xoff` is then the file offset.
        let bias = m.start.0.wrapping_sub(vaddr.unwrap_or(m.file_offset));
        let file = file.filter(|_| vaddr.is_some());
        let module = self.module_for(&m.path, space, file, bias);
        self.extend(module, space, m.start, m.len);
    }

    /// The module of `path` at `bias` in `space`, created if new.
    fn module_for(&mut self, path: &Path, space: Space, file: Option<usize>, bias: u64) -> usize {
        if let Some(i) = self
            .modules
            .iter()
            .position(|m| m.path == path && m.space == space && m.bias == bias)
        {
            return i;
        }
        let lowest = file.map_or(0, |i| self.files[i].lowest());
        let base = Ip(lowest.wrapping_add(bias));
        let name = path
            .file_name()
            .unwrap_or(path.as_os_str())
            .to_string_lossy()
            .into_owned();
        self.modules.push(Module {
            path: path.to_path_buf(),
            name,
            space,
            base,
            start: Ip(u64::MAX),
            end: Ip(0),
            bias,
            file,
        });
        self.modules.len() - 1
    }

    fn extend(&mut self, module: usize, space: Space, start: Ip, len: u64) {
        let end = Ip(start.0.saturating_add(len));
        let m = &mut self.modules[module];
        m.start = m.start.min(start);
        m.end = m.end.max(end);
        self.mapped.push((space, start, end, module));
    }

    fn rebuild(&mut self) {
        let mut by_space: HashMap<Space, Vec<(u64, u64, usize)>> = HashMap::new();
        for &(space, start, end, module) in &self.mapped {
            by_space
                .entry(space)
                .or_default()
                .push((start.0, end.0, module));
        }
        self.index = by_space
            .into_iter()
            .map(|(space, list)| (space, ranges::flatten(&list)))
            .collect();
    }

    /// The module holding `ip` in `space`: mappings of exactly that space
    /// first, then those that leave the CR3, the process, or both open.
    pub fn module(&self, space: Space, ip: Ip) -> Option<&Module> {
        self.module_index(space, ip).map(|i| &self.modules[i])
    }

    /// The index in [`Self::modules`] of the module holding `ip` in
    /// `space` (see [`Self::module`]).
    pub fn module_index(&self, space: Space, ip: Ip) -> Option<usize> {
        let tries = [
            space,
            Space { cr3: None, ..space },
            Space { pid: None, ..space },
            Space::ANY,
        ];
        for (n, s) in tries.iter().enumerate() {
            if tries[..n].contains(s) {
                continue;
            }
            if let Some(list) = self.index.get(s)
                && let Some(m) = ranges::lookup(list, ip.0)
            {
                return Some(m);
            }
        }
        None
    }

    /// The function symbol covering `ip`.
    pub fn function(&self, space: Space, ip: Ip) -> Option<FunctionRef<'_>> {
        let module = self.module(space, ip)?;
        let f = self.object(module)?.func(ip.0.wrapping_sub(module.bias))?;
        Some(FunctionRef {
            name: &f.name,
            start: Ip(f.addr.wrapping_add(module.bias)),
            size: f.size,
        })
    }

    /// `function+0xoff`, else `image+0xoff` (from the image base), else
    /// `None` when no image holds `ip`.
    pub fn name(&self, space: Space, ip: Ip) -> Option<String> {
        if let Some(f) = self.function(space, ip) {
            return Some(format!("{}+{:#x}", f.name, ip.0 - f.start.0));
        }
        let module = self.module(space, ip)?;
        Some(format!(
            "{}+{:#x}",
            module.name,
            ip.0.wrapping_sub(module.base.0)
        ))
    }

    /// The DWARF frames at `ip`, innermost (inlined) first; empty without
    /// debug information.
    pub fn frames(&self, space: Space, ip: Ip) -> Vec<Frame> {
        let Some(module) = self.module(space, ip) else {
            return Vec::new();
        };
        self.object(module)
            .and_then(ObjectInfo::dwarf)
            .map(|d| d.frames(ip.0.wrapping_sub(module.bias)))
            .unwrap_or_default()
    }

    /// The source file and line of `ip` (DWARF's line table).
    pub fn line(&self, space: Space, ip: Ip) -> Option<(String, u32)> {
        let module = self.module(space, ip)?;
        let dwarf = self.object(module)?.dwarf()?;
        dwarf.line(ip.0.wrapping_sub(module.bias))
    }

    /// Every line-table run of `module`'s mapped code, at runtime
    /// addresses, by address; empty without DWARF.
    pub fn module_lines(&self, module: &Module) -> Vec<LineRange> {
        let Some(dwarf) = self.object(module).and_then(ObjectInfo::dwarf) else {
            return Vec::new();
        };
        let Some(index) = self.modules.iter().position(|m| m == module) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for &(_, start, end, _) in self.mapped.iter().filter(|r| r.3 == index) {
            let (lo, hi) = (
                start.0.wrapping_sub(module.bias),
                end.0.wrapping_sub(module.bias),
            );
            out.extend(dwarf.lines(lo, hi).into_iter().map(|mut r| {
                r.addr = r.addr.wrapping_add(module.bias);
                r
            }));
        }
        out.sort_by_key(|r| r.addr);
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests;
