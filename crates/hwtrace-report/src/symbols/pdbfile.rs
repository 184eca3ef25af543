//! Function names from a PE image's PDB: the image's CodeView (RSDS)
//! debug directory entry names the PDB and its GUID and age; a PDB is used
//! only when both match, because a stale PDB names the wrong functions
//! with full confidence. Public symbols and procedure symbols (with their
//! sizes) are read with the `pdb` crate.

use super::SymbolError;
use super::file::Func;
use pdb::FallibleIterator;
use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};

thread_local! {
    /// Whether this thread is inside the `pdb` crate's reading, where a
    /// panic is caught and reported as a corrupt PDB ([`read_from`]).
    static READING_PDB: Cell<bool> = const { Cell::new(false) };
}

/// Installs (once) a panic hook in front of the one in place that stays
/// silent for panics the PDB reader catches, so a corrupt PDB is one
/// error line, not a panic message first. For a program's `main`: a
/// library leaves the process's panic hook alone unless asked.
pub fn quiet_caught_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !READING_PDB.with(Cell::get) {
                before(info);
            }
        }));
    });
}

/// What a PE image's CodeView record says about its PDB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CodeView {
    /// The GUID as stored in the image (little-endian fields).
    pub guid: [u8; 16],
    /// The age the PDB's DBI stream must have.
    pub age: u32,
    /// The PDB path the linker recorded.
    pub path: String,
}

impl CodeView {
    /// The CodeView record of a PE `file`, if it has one.
    pub fn of(file: &object::File<'_>) -> Option<Self> {
        use object::Object;
        let info = file.pdb_info().ok().flatten()?;
        Some(Self {
            guid: info.guid(),
            age: info.age(),
            path: String::from_utf8_lossy(info.path()).into_owned(),
        })
    }

    /// Where the PDB may be, in order: beside the image (the recorded
    /// file name in the image's directory: images and PDBs are usually
    /// copied together), then the path the linker recorded.
    pub fn candidates(&self, image: &Path) -> Vec<PathBuf> {
        // The recorded path is usually a Windows one: either separator.
        let base = self
            .path
            .rsplit(['/', '\\'])
            .next()
            .filter(|b| !b.is_empty());
        let mut out = Vec::new();
        if let Some(base) = base {
            out.push(image.parent().unwrap_or(Path::new(".")).join(base));
        }
        if !self.path.is_empty() {
            let recorded = PathBuf::from(&self.path);
            if !out.contains(&recorded) {
                out.push(recorded);
            }
        }
        out
    }
}

/// `{XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX}` from the GUID's stored bytes,
/// as Windows tools print it.
fn guid_text(b: &[u8; 16]) -> String {
    format!(
        "{:08X}-{:04X}-{:04X}-{:02X}{:02X}-{}",
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        u16::from_le_bytes([b[4], b[5]]),
        u16::from_le_bytes([b[6], b[7]]),
        b[8],
        b[9],
        b[10..]
            .iter()
            .map(|x| format!("{x:02X}"))
            .collect::<String>()
    )
}

/// The functions of the PDB at `path` for the image `image` whose
/// CodeView record is `cv`, at link-time addresses (`image_base` + RVA).
/// Procedures come with their sizes; a public symbol at an address no
/// procedure starts at comes with size 0 (the caller sizes it to the next
/// symbol). Fails when the PDB is not the image's (GUID or age differ) or
/// cannot be parsed.
pub(super) fn read(
    path: &Path,
    image: &Path,
    cv: &CodeView,
    image_base: u64,
) -> Result<Vec<Func>, SymbolError> {
    let file = std::fs::File::open(path).map_err(|e| SymbolError::Read {
        path: path.to_path_buf(),
        error: e.to_string(),
    })?;
    read_from(file, path, Some((image, cv)), image_base)
}

/// [`read`] from any source of the PDB's bytes, named `path` in errors;
/// without an image to match (`expected` `None`), any PDB's functions.
///
/// The `pdb` crate trusts some of the file's sizes (a crafted DBI header
/// overflows its offset arithmetic, found by the `object_files` fuzz
/// target): a panic while reading is reported as a corrupt PDB.
pub(super) fn read_from<'s, S: pdb::Source<'s> + 's>(
    source: S,
    path: &Path,
    expected: Option<(&Path, &CodeView)>,
    image_base: u64,
) -> Result<Vec<Func>, SymbolError> {
    let read = AssertUnwindSafe(|| parse(source, path, expected, image_base));
    let was = READING_PDB.with(|r| r.replace(true));
    let caught = std::panic::catch_unwind(read);
    READING_PDB.with(|r| r.set(was));
    caught.unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(SymbolError::Pdb {
            path: path.to_path_buf(),
            error: format!("the PDB reader failed on its contents ({why})"),
        })
    })
}

/// [`read_from`], where the `pdb` crate may panic.
fn parse<'s, S: pdb::Source<'s> + 's>(
    source: S,
    path: &Path,
    expected: Option<(&Path, &CodeView)>,
    image_base: u64,
) -> Result<Vec<Func>, SymbolError> {
    let corrupt = |e: pdb::Error| SymbolError::Pdb {
        path: path.to_path_buf(),
        error: e.to_string(),
    };
    let mut pdb = pdb::PDB::open(source).map_err(corrupt)?;
    let info = pdb.pdb_information().map_err(corrupt)?;
    let dbi = pdb.debug_information().map_err(corrupt)?;
    // The image's age is the DBI stream's; the info stream's may be
    // higher after incremental links, so it is only a fallback.
    let age = dbi.age().unwrap_or(info.age);
    let guid = info.guid.to_bytes_le();
    if let Some((image, cv)) = expected
        && (guid != cv.guid || age != cv.age)
    {
        return Err(SymbolError::PdbMismatch {
            path: path.to_path_buf(),
            image: image.to_path_buf(),
            wanted: format!("{{{}}} age {}", guid_text(&cv.guid), cv.age),
            found: format!("{{{}}} age {}", guid_text(&guid), age),
        });
    }
    let map = pdb.address_map().map_err(corrupt)?;
    let mut procs: Vec<Func> = Vec::new();
    let mut modules = dbi.modules().map_err(corrupt)?;
    while let Some(module) = modules.next().map_err(corrupt)? {
        let Some(module_info) = pdb.module_info(&module).map_err(corrupt)? else {
            continue;
        };
        let mut symbols = module_info.symbols().map_err(corrupt)?;
        while let Some(symbol) = symbols.next().map_err(corrupt)? {
            // Records this parser does not know are skipped, not fatal.
            if let Ok(pdb::SymbolData::Procedure(p)) = symbol.parse()
                && let Some(rva) = p.offset.to_rva(&map)
            {
                procs.push(Func {
                    addr: image_base.wrapping_add(u64::from(rva.0)),
                    size: u64::from(p.len),
                    name: p.name.to_string().into(),
                });
            }
        }
    }
    procs.sort_by_key(|f| f.addr);
    let mut publics: Vec<Func> = Vec::new();
    let globals = pdb.global_symbols().map_err(corrupt)?;
    let mut symbols = globals.iter();
    while let Some(symbol) = symbols.next().map_err(corrupt)? {
        if let Ok(pdb::SymbolData::Public(p)) = symbol.parse()
            && (p.function || p.code)
            && let Some(rva) = p.offset.to_rva(&map)
        {
            let addr = image_base.wrapping_add(u64::from(rva.0));
            // A procedure record names it already, with its size.
            if procs.binary_search_by_key(&addr, |f| f.addr).is_err() {
                publics.push(Func {
                    addr,
                    size: 0,
                    name: p.name.to_string().into(),
                });
            }
        }
    }
    procs.extend(publics);
    procs.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
    procs.dedup_by(|b, a| a.addr == b.addr && a.name == b.name);
    Ok(procs)
}

/// Keeps the symbols of `own` (COFF symbols, exports) that no PDB
/// function starts at or covers: the PDB's names take precedence.
pub(super) fn merge(pdb: Vec<Func>, own: Vec<(bool, Func)>) -> Vec<(bool, Func)> {
    // reach[i]: the highest end among pdb[..=i], so the walk back stops
    // as soon as nothing below can cover.
    let reach: Vec<u64> = pdb
        .iter()
        .scan(0u64, |top, f| {
            *top = (*top).max(f.addr.saturating_add(f.size.max(1)));
            Some(*top)
        })
        .collect();
    let covered = |addr: u64| {
        let end = pdb.partition_point(|f| f.addr <= addr);
        (0..end)
            .rev()
            .take_while(|&i| reach[i] > addr)
            .any(|i| addr - pdb[i].addr < pdb[i].size.max(1))
    };
    let kept: Vec<(bool, Func)> = own.into_iter().filter(|(_, f)| !covered(f.addr)).collect();
    pdb.into_iter().map(|f| (true, f)).chain(kept).collect()
}
