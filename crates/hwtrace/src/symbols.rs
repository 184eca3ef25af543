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
//! The ELF reading is the few tables needed here (header, program headers,
//! section headers, symbol and string tables; 32- and 64-bit
//! little-endian), kept in this file so the command needs no ELF crate of
//! its own.

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
        let elf = Elf::parse(&data)
            .with_context(|| format!("--elf: {}: not an ELF file", path.display()))?;
        let (segments, funcs) = elf
            .segments()
            .and_then(|segments| Ok((segments, elf.funcs()?)))
            .with_context(|| format!("--elf: {}: malformed ELF", path.display()))?;
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

/// A little-endian ELF file, 32- or 64-bit: just what symbols need.
#[derive(Clone, Copy, Debug)]
struct Elf<'a> {
    data: &'a [u8],
    is64: bool,
}

/// `PT_LOAD`, `SHT_SYMTAB`, `SHT_DYNSYM`, `STT_FUNC`, `STT_GNU_IFUNC`.
const PT_LOAD: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;

impl<'a> Elf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self> {
        if data.get(..4) != Some(b"\x7fELF") {
            bail!("no ELF magic");
        }
        let is64 = match data.get(4) {
            Some(1) => false,
            Some(2) => true,
            other => bail!("unknown ELF class {other:?}"),
        };
        if data.get(5) != Some(&1) {
            bail!("not little-endian (x86 ELF files are)");
        }
        Ok(Self { data, is64 })
    }

    fn bytes(&self, at: u64, len: u64) -> Result<&'a [u8]> {
        usize::try_from(at)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(at, len)| self.data.get(at..at.checked_add(len)?))
            .with_context(|| format!("{len:#x} bytes at {at:#x} lie outside the file"))
    }

    fn u16(&self, at: u64) -> Result<u64> {
        let b = self.bytes(at, 2)?;
        Ok(u64::from(u16::from_le_bytes([b[0], b[1]])))
    }

    fn u32(&self, at: u64) -> Result<u64> {
        let b = self.bytes(at, 4)?;
        Ok(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
    }

    /// A 32-bit field in ELF32, a 64-bit one in ELF64.
    fn word(&self, at: u64) -> Result<u64> {
        if self.is64 {
            let b = self.bytes(at, 8)?;
            let mut v = [0u8; 8];
            v.copy_from_slice(b);
            Ok(u64::from_le_bytes(v))
        } else {
            self.u32(at)
        }
    }

    /// Field offsets: `(elf32, elf64)`.
    fn pick(&self, offsets: (u64, u64)) -> u64 {
        if self.is64 { offsets.1 } else { offsets.0 }
    }

    /// `(p_vaddr, p_memsz)` of every `PT_LOAD`.
    fn segments(&self) -> Result<Vec<(u64, u64)>> {
        let phoff = self.word(self.pick((0x1c, 0x20)))?;
        let entsize = self.u16(self.pick((0x2a, 0x36)))?;
        let count = self.u16(self.pick((0x2c, 0x38)))?;
        let mut out = Vec::new();
        for i in 0..count {
            let ph = phoff + i * entsize;
            if self.u32(ph)? != u64::from(PT_LOAD) {
                continue;
            }
            let vaddr = self.word(ph + self.pick((0x08, 0x10)))?;
            let memsz = self.word(ph + self.pick((0x14, 0x28)))?;
            out.push((vaddr, memsz));
        }
        Ok(out)
    }

    /// `(sh_type, sh_offset, sh_size, sh_link, sh_entsize)` of section `i`.
    fn section(&self, i: u64) -> Result<(u32, u64, u64, u64, u64)> {
        let shoff = self.word(self.pick((0x20, 0x28)))?;
        let entsize = self.u16(self.pick((0x2e, 0x3a)))?;
        let sh = shoff + i * entsize;
        Ok((
            self.u32(sh + 4)? as u32,
            self.word(sh + self.pick((0x10, 0x18)))?,
            self.word(sh + self.pick((0x14, 0x20)))?,
            self.u32(sh + self.pick((0x18, 0x28)))?,
            self.word(sh + self.pick((0x24, 0x38)))?,
        ))
    }

    /// The defined function symbols of `.symtab` and `.dynsym`, each with
    /// whether it is global (or weak), at its unbiased address.
    fn funcs(&self) -> Result<Vec<(bool, Func)>> {
        if self.word(self.pick((0x20, 0x28)))? == 0 {
            return Ok(Vec::new());
        }
        let mut count = self.u16(self.pick((0x30, 0x3c)))?;
        if count == 0 {
            // More sections than e_shnum holds: section 0's sh_size.
            count = self.section(0)?.2;
        }
        let mut out = Vec::new();
        for i in 0..count {
            let (kind, offset, size, link, entsize) = self.section(i)?;
            if kind != SHT_SYMTAB && kind != SHT_DYNSYM {
                continue;
            }
            let (_, str_off, str_size, _, _) = self
                .section(link)
                .with_context(|| format!("section {i}: its string table {link}"))?;
            let strings = self.bytes(str_off, str_size)?;
            let entsize = if entsize == 0 {
                self.pick((16, 24))
            } else {
                entsize
            };
            for n in 0..size / entsize {
                let sym = offset + n * entsize;
                let (info, shndx, value, sym_size) = if self.is64 {
                    (
                        self.bytes(sym + 4, 1)?[0],
                        self.u16(sym + 6)?,
                        self.word(sym + 8)?,
                        self.word(sym + 16)?,
                    )
                } else {
                    (
                        self.bytes(sym + 12, 1)?[0],
                        self.u16(sym + 14)?,
                        self.u32(sym + 4)?,
                        self.u32(sym + 8)?,
                    )
                };
                let kind = info & 0xf;
                if shndx == 0 || (kind != STT_FUNC && kind != STT_GNU_IFUNC) {
                    continue;
                }
                let name_at = usize::try_from(self.u32(sym)?).unwrap_or(usize::MAX);
                let Some(name) = strings.get(name_at..) else {
                    bail!("symbol {n} of section {i}: name beyond its string table");
                };
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                if name.is_empty() {
                    continue;
                }
                out.push((
                    info >> 4 != 0,
                    Func {
                        addr: value,
                        size: sym_size,
                        name: String::from_utf8_lossy(name).into_owned(),
                    },
                ));
            }
        }
        Ok(out)
    }
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
