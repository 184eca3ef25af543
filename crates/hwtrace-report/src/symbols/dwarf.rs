//! DWARF through addr2line: the inlined frames and the source line of a
//! link-time address, and a file's whole line table (for lcov).
//!
//! The debug sections are copied out of the file once into shared
//! buffers (`EndianRcSlice`), so the file need not stay open or mapped;
//! addr2line parses units lazily and keeps what it parsed.

use object::{Object, ObjectSection};
use std::path::Path;
use std::rc::Rc;

type Reader = gimli::EndianRcSlice<gimli::RunTimeEndian>;

/// One frame at an address, innermost (inlined) first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The function (as DWARF names it).
    pub function: Option<String>,
    /// The source file.
    pub file: Option<String>,
    /// The line in it.
    pub line: Option<u32>,
}

/// A run of instructions from one source line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineRange {
    /// Link-time address of its first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The source file.
    pub file: String,
    /// The line.
    pub line: u32,
}

/// A file's DWARF, ready for lookups.
pub struct Dwarf {
    ctx: addr2line::Context<Reader>,
}

impl std::fmt::Debug for Dwarf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dwarf")
    }
}

impl Dwarf {
    /// The DWARF of the file at `path`: `Ok(None)` when it has no
    /// `.debug_info` (or cannot be read: a debug file that is not there
    /// is the usual case, not an error).
    pub fn load(path: &Path) -> Result<Option<Self>, gimli::Error> {
        let Ok(data) = std::fs::read(path) else {
            return Ok(None);
        };
        Self::parse(&data)
    }

    /// The DWARF of the object file whose bytes are `data` (ELF, PE or
    /// Mach-O): `Ok(None)` when it is not one or has no `.debug_info`.
    pub fn parse(data: &[u8]) -> Result<Option<Self>, gimli::Error> {
        let Ok(file) = object::File::parse(data) else {
            return Ok(None);
        };
        let has_info = file
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0);
        if !has_info {
            return Ok(None);
        }
        let endian = if file.is_little_endian() {
            gimli::RunTimeEndian::Little
        } else {
            gimli::RunTimeEndian::Big
        };
        let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
            // A compressed section (object's compression feature is off)
            // reads as empty: lookups then find nothing there.
            let bytes: Rc<[u8]> = file
                .section_by_name(id.name())
                .and_then(|s| s.uncompressed_data().ok())
                .map_or_else(|| Rc::from(&[][..]), |d| Rc::from(&*d));
            Ok(gimli::EndianRcSlice::new(bytes, endian))
        };
        let dwarf = gimli::Dwarf::load(load)?;
        let ctx = addr2line::Context::from_dwarf(dwarf)?;
        Ok(Some(Self { ctx }))
    }

    /// The frames at link-time address `probe`, innermost first (inlined
    /// functions, then the function they were inlined into). None at the
    /// last address of memory: addr2line looks up `[probe, probe + 1)`,
    /// which overflows there (a panic with overflow checks on; found by the
    /// `object_files` fuzz target).
    pub fn frames(&self, probe: u64) -> Vec<Frame> {
        let mut out = Vec::new();
        if probe == u64::MAX {
            return out;
        }
        let Ok(mut iter) = self.ctx.find_frames(probe).skip_all_loads() else {
            return out;
        };
        while let Ok(Some(frame)) = iter.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| f.demangle().ok().map(|n| n.into_owned()));
            let (file, line) = frame
                .location
                .as_ref()
                .map_or((None, None), |l| (l.file.map(str::to_owned), l.line));
            out.push(Frame {
                function,
                file,
                line,
            });
        }
        out
    }

    /// The source line of link-time address `probe` (none at the last
    /// address of memory, as for [`frames`](Self::frames)).
    pub fn line(&self, probe: u64) -> Option<(String, u32)> {
        if probe == u64::MAX {
            return None;
        }
        let loc = self.ctx.find_location(probe).ok()??;
        Some((loc.file?.to_owned(), loc.line?))
    }

    /// Every line-table run in `[low, high)`, by address.
    pub fn lines(&self, low: u64, high: u64) -> Vec<LineRange> {
        let Ok(iter) = self.ctx.find_location_range(low, high) else {
            return Vec::new();
        };
        let mut out: Vec<LineRange> = iter
            .filter_map(|(addr, len, loc)| {
                Some(LineRange {
                    addr,
                    len,
                    file: loc.file?.to_owned(),
                    line: loc.line.filter(|&l| l > 0)?,
                })
            })
            .collect();
        out.sort_by_key(|r| r.addr);
        out
    }
}
