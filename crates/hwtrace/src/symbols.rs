//! Symbols for branch addresses, as `hwtrace bts decode` and `hwtrace lbr
//! decode` print them: the ELF files loaded with `--elf FILE[@BIAS]`,
//! named through hwtrace-report's symboliser (the one every answer uses).
//!
//! An address inside a function symbol (`.symtab`, `.dynsym`) reads
//! `name+0xoff`; an address inside one of the file's `PT_LOAD` segments
//! that no symbol covers (a stripped executable) reads `file+0xoff`, the
//! offset from the file's lowest loaded address; any other address has no
//! symbol. Where files overlap, the first given wins.

use anyhow::{Result, bail};
use hwtrace_mem::image::{ElfPlacement, ElfSpec, parse_elf_arg};
use hwtrace_report::symbols::{self, FileFormat, ObjectInfo, Placement, Space, SymbolError};
use hwtrace_types::Ip;

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

/// The symbols of the `--elf` images of a command.
#[derive(Debug, Default)]
pub struct Symbolizer {
    inner: symbols::Symbolizer,
}

impl Symbolizer {
    /// Reads each file's segments and function symbols; fails naming the
    /// file.
    pub fn load(specs: &[ElfSpec]) -> Result<Self> {
        let mut inner = symbols::Symbolizer::new();
        // Later files win where they overlap: add the first given last.
        for spec in specs.iter().rev() {
            let path = &spec.path;
            match ObjectInfo::load(path) {
                Ok(info) if info.format() == FileFormat::Elf => {}
                Ok(info) => bail!(
                    "--elf: {}: not an ELF file (a {:?} file)",
                    path.display(),
                    info.format()
                ),
                Err(SymbolError::Read { error, .. }) => {
                    bail!("--elf: cannot read {}: {error}", path.display())
                }
                Err(e) => bail!("--elf: {}: not an ELF file: {e}", path.display()),
            }
            let placement = match spec.placement {
                ElfPlacement::Bias(bias) => Placement::Bias(bias),
                ElfPlacement::LowestAt(at) => Placement::LowestAt(Ip(at)),
            };
            if let Err(e) = inner.add_file(path, placement, Space::ANY) {
                bail!("--elf: {e}");
            }
        }
        Ok(Self { inner })
    }

    /// Whether no file was given.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// `name+0xoff` for the function symbol covering `addr`, else
    /// `file+0xoff` for the file loaded there, else `None`.
    pub fn symbolize(&self, addr: u64) -> Option<String> {
        self.inner.name(Space::ANY, Ip(addr))
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
    use std::path::Path;

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
    fn dynamic_symbols_and_file_offsets_of_a_system_executable() {
        let path = Path::new("/usr/bin/true");
        let info = ObjectInfo::load(path).expect("/usr/bin/true (Debian coreutils)");
        let spec = parse_elf_arg("/usr/bin/true@555555554000").unwrap();
        let s = Symbolizer::load(&[spec]).unwrap();
        assert!(!s.is_empty());
        let base = 0x5555_5555_4000 + info.lowest();
        // Stripped: the code is named by the file's offsets.
        let text = info
            .segments()
            .iter()
            .find(|seg| seg.vaddr > info.lowest())
            .expect("a second PT_LOAD segment");
        let ip = 0x5555_5555_4000 + text.vaddr + 4;
        // Its .dynsym defines no function: only the file names the code.
        let name = s.symbolize(ip).unwrap();
        assert_eq!(name, format!("true+{:#x}", ip - base));
        assert_eq!(s.address(ip), format!("{ip:#x} ({name})"));
        assert_eq!(s.symbolize(0x10), None);
        assert_eq!(s.address(0x10), "0x10");
    }
}
