//! Symbols for branch addresses: the function symbols (`.symtab` and
//! `.dynsym`) of ELF files loaded with `--elf FILE[@BIAS]`, as
//! `hwtrace bts decode` and `hwtrace lbr decode` print them.
//!
//! An address inside a function symbol (`st_value + bias` up to
//! `st_value + st_size + bias`) reads `name+0xoff`; an address inside one
//! of the file's `PT_LOAD` segments that no symbol covers (a stripped
//! executable) reads `file+0xoff`, the offset from the file's lowest
//! loaded address; any other address has no symbol.
//!
//! The ELF files are read with the `object` crate, as the image layer reads
//! them.

use anyhow::{Context as _, Result, bail};
use hwtrace_mem::image::{ElfPlacement, ElfSpec, parse_elf_arg};
use std::path::Path;

/// A function symbol of one file, at its loaded address.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Func {
    addr: u64,
    size: u64,
    name: String,
}

/// One ELF file's loaded ranges and function symbols.
#[derive(Clone, Debug)]
struct FileSymbols {
    /// The file name (without its folder), for `file+0xoff`.
    name: String,
    /// The lowest loaded address.
    base: u64,
    /// `PT_LOAD` segments, `[start, end)`, at their loaded addresses.
    segments: Vec<(u64, u64)>,
    /// By address; at one address, global symbols first, then by name.
    funcs: Vec<Func>,
}

impl FileSymbols {
    fn load(spec: &ElfSpec) -> Result<Self> {
        let path = &spec.path;
        let data = std::fs::read(path)
            .with_context(|| format!("--elf: cannot read {}", path.display()))?;
        let (segments, funcs) = read_elf(&data)
            .with_context(|| format!("--elf: {}: not an ELF file", path.display()))?;
        let Some(lowest) = segments.iter().map(|&(start, _)| start).min() else {
            bail!("--elf: {}: no PT_LOAD segment", path.display());
        };
        let bias = match spec.placement {
            ElfPlacement::Bias(bias) => bias,
            ElfPlacement::LowestAt(at) => at.wrapping_sub(lowest),
        };
        let segments = segments
            .into_iter()
            .filter(|&(_, size)| size > 0)
            .map(|(vaddr, size)| {
                let start = vaddr.wrapping_add(bias);
                (start, start.saturating_add(size))
            })
            .collect();
        let mut funcs: Vec<(bool, Func)> = funcs
            .into_iter()
            .map(|(global, mut f)| {
                f.addr = f.addr.wrapping_add(bias);
                (global, f)
            })
            .collect();
        funcs.sort_by(|(ga, a), (gb, b)| {
            (a.addr, !ga, &a.name, a.size).cmp(&(b.addr, !gb, &b.name, b.size))
        });
        let mut funcs: Vec<Func> = funcs.into_iter().map(|(_, f)| f).collect();
        // The same symbol from .symtab and .dynsym.
        funcs.dedup_by(|b, a| a.addr == b.addr && a.name == b.name);
        Ok(Self {
            name: file_name(path),
            base: lowest.wrapping_add(bias),
            segments,
            funcs,
        })
    }

    /// The function symbol covering `addr`: the first symbol at the
    /// highest address at or below it whose size reaches it (a symbol of
    /// size 0 covers its own address only).
    fn func(&self, addr: u64) -> Option<&Func> {
        let end = self.funcs.partition_point(|f| f.addr <= addr);
        let below = &self.funcs[..end];
        let covers = |f: &&Func| addr - f.addr < f.size.max(1);
        let nearest = below.iter().rev().find(covers)?.addr;
        below.iter().filter(|f| f.addr == nearest).find(covers)
    }

    fn contains(&self, addr: u64) -> bool {
        self.segments.iter().any(|&(s, e)| s <= addr && addr < e)
    }
}

/// `PT_LOAD` segments as `(vaddr, size)`.
type Segments = Vec<(u64, u64)>;
/// Function symbols, each with whether it is global.
type Funcs = Vec<(bool, Func)>;

/// The loadable segments and the defined function symbols of an ELF file.
fn read_elf(data: &[u8]) -> Result<(Segments, Funcs)> {
    use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
    let file = object::File::parse(data)?;
    if file.format() != object::BinaryFormat::Elf {
        bail!("a {:?} file", file.format());
    }
    // For ELF, `segments()` are the PT_LOAD program headers.
    let segments = file
        .segments()
        .map(|seg| (seg.address(), seg.size()))
        .collect();
    let mut funcs = Vec::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || !sym.is_definition() {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if name.is_empty() {
            continue;
        }
        let func = Func {
            addr: sym.address(),
            size: sym.size(),
            name: name.to_owned(),
        };
        funcs.push((sym.is_global(), func));
    }
    Ok((segments, funcs))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// `--elf FILE[@BIAS]`, repeatable: the images whose symbols name branch
/// addresses. Use with `#[command(flatten)]`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SymbolArgs {
    /// An ELF executable or shared object loaded at p_vaddr + BIAS (hex):
    /// addresses in it are shown as `symbol+0xoff` (or `file+0xoff`).
    #[arg(long, value_name = "FILE[@BIAS]", value_parser = parse_elf)]
    elf: Vec<ElfSpec>,
}

fn parse_elf(s: &str) -> Result<ElfSpec, String> {
    parse_elf_arg(s).map_err(|e| e.to_string())
}

impl SymbolArgs {
    /// The symbols of the files given (none: an empty [`Symbolizer`]).
    pub fn load(&self) -> Result<Symbolizer> {
        Symbolizer::load(&self.elf)
    }
}

/// The symbols of the `--elf` images of a command, in command-line order:
/// where they overlap, the first file that has a symbol wins.
#[derive(Clone, Debug, Default)]
pub struct Symbolizer {
    files: Vec<FileSymbols>,
}

impl Symbolizer {
    /// Reads each file's segments and function symbols; fails naming the
    /// file.
    pub fn load(specs: &[ElfSpec]) -> Result<Self> {
        let files = specs.iter().map(FileSymbols::load).collect::<Result<_>>()?;
        Ok(Self { files })
    }

    /// Whether no file was given.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// `name+0xoff` for the function symbol covering `addr`, else
    /// `file+0xoff` for the file loaded there, else `None`.
    pub fn symbolize(&self, addr: u64) -> Option<String> {
        let func = self.files.iter().find_map(|f| f.func(addr));
        if let Some(func) = func {
            return Some(format!("{}+{:#x}", func.name, addr - func.addr));
        }
        let file = self.files.iter().find(|f| f.contains(addr))?;
        Some(format!("{}+{:#x}", file.name, addr - file.base))
    }

    /// `0xaddr (symbol+0xoff)`, or `0xaddr` when no image covers it.
    pub fn address(&self, addr: u64) -> String {
        match self.symbolize(addr) {
            Some(sym) => format!("{addr:#x} ({sym})"),
            None => format!("{addr:#x}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_elf_is_named() {
        let path = std::env::temp_dir().join(format!("hwtrace-symbols-{}", std::process::id()));
        std::fs::write(&path, b"not an executable").unwrap();
        let spec = parse_elf_arg(path.to_str().unwrap()).unwrap();
        let err = format!("{:#}", Symbolizer::load(&[spec]).unwrap_err());
        assert!(
            err.starts_with(&format!("--elf: {}: not an ELF file", path.display())),
            "{err}"
        );
        let _ = std::fs::remove_file(&path);
        let spec = parse_elf_arg(path.to_str().unwrap()).unwrap();
        let err = format!("{:#}", Symbolizer::load(&[spec]).unwrap_err());
        assert!(
            err.starts_with(&format!("--elf: cannot read {}", path.display())),
            "{err}"
        );
    }

    #[test]
    fn symbols_cover_their_size_and_files_their_segments() {
        let file = FileSymbols {
            name: "a.out".to_owned(),
            base: 0x1000,
            segments: vec![(0x1000, 0x3000)],
            funcs: vec![
                Func {
                    addr: 0x1100,
                    size: 0x100,
                    name: "big".to_owned(),
                },
                Func {
                    addr: 0x1100,
                    size: 0x10,
                    name: "big_alias".to_owned(),
                },
                Func {
                    addr: 0x1140,
                    size: 0,
                    name: "label".to_owned(),
                },
            ],
        };
        let s = Symbolizer { files: vec![file] };
        assert_eq!(s.symbolize(0x1100).as_deref(), Some("big+0x0"));
        assert_eq!(s.symbolize(0x1140).as_deref(), Some("label+0x0"));
        assert_eq!(s.symbolize(0x1141).as_deref(), Some("big+0x41"));
        assert_eq!(s.symbolize(0x1200).as_deref(), Some("a.out+0x200"));
        assert_eq!(s.symbolize(0x3000), None);
    }
}
