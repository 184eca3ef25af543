//! ELF64 core dumps as QEMU's `dump-guest-memory` writes them: one PT_LOAD
//! segment per run of guest RAM keyed by `p_paddr`, and a PT_NOTE segment
//! with, per vCPU, a "CORE" NT_PRSTATUS note and a "QEMU" note holding the
//! CPU state with the control registers (see [`QemuCpuState`]).
//!
//! Parsed by hand (System V ABI, ELF-64 Object File Format): only the file
//! header, program headers and notes are needed.

use super::{QemuCpuState, Region, RegionError, RegionMap};
use crate::backing::Backing;
use hwtrace_types::{MemoryError, PhysAddr, PhysMemory};
use std::path::Path;

/// `\x7fELF`.
pub const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const ET_CORE: u16 = 4;
const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
/// `e_phnum` value saying the real count is in section header 0's
/// `sh_info` (QEMU uses it for guests with many RAM blocks).
const PN_XNUM: u16 = 0xffff;
const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;

/// A malformed ELF core: where and what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ELF core at file offset {offset:#x}: {kind}")]
pub struct ElfError {
    /// The file offset of the offending field or structure.
    pub offset: u64,
    /// What is wrong.
    pub kind: ElfErrorKind,
}

/// What is wrong with an ELF core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ElfErrorKind {
    /// The file does not start with `\x7fELF`.
    #[error("not an ELF file")]
    BadMagic,
    /// Not ELFCLASS64 little-endian (32-bit guests' dumps are ELF32).
    #[error("not a little-endian ELF64 file (class {class}, data {data})")]
    Unsupported {
        /// EI_CLASS.
        class: u8,
        /// EI_DATA.
        data: u8,
    },
    /// `e_type` is not ET_CORE.
    #[error("e_type {0} is not ET_CORE (4)")]
    NotCore(u16),
    /// A header or table runs past the end of the file.
    #[error("{0} runs past the end of the file")]
    Truncated(&'static str),
    /// `e_phentsize` is not the size of an Elf64_Phdr.
    #[error("e_phentsize {0} is not 56")]
    PhdrSize(u16),
    /// The PT_LOAD segments do not form a valid physical map.
    #[error("{0}")]
    Segments(RegionError),
}

/// An ELF core dump of a guest's physical memory.
#[derive(Debug)]
pub struct ElfCore {
    bytes: Backing,
    regions: RegionMap,
    cpus: Vec<QemuCpuState>,
}

fn field<const N: usize>(b: &[u8], off: usize, what: &'static str) -> Result<[u8; N], ElfError> {
    b.get(off..off.saturating_add(N))
        .and_then(|s| s.try_into().ok())
        .ok_or(ElfError {
            offset: off as u64,
            kind: ElfErrorKind::Truncated(what),
        })
}

fn u16_at(b: &[u8], off: usize, what: &'static str) -> Result<u16, ElfError> {
    field(b, off, what).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], off: usize, what: &'static str) -> Result<u32, ElfError> {
    field(b, off, what).map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], off: usize, what: &'static str) -> Result<u64, ElfError> {
    field(b, off, what).map(u64::from_le_bytes)
}

fn to_usize(v: u64, off: usize, what: &'static str) -> Result<usize, ElfError> {
    usize::try_from(v).map_err(|_| ElfError {
        offset: off as u64,
        kind: ElfErrorKind::Truncated(what),
    })
}

impl ElfCore {
    /// Maps and parses the core at `path`.
    pub fn open(path: &Path) -> Result<Self, super::DumpError> {
        let bytes = Backing::map(path).map_err(|source| super::DumpError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::parse(bytes)?)
    }

    /// Parses a core held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, ElfError> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(bytes: Backing) -> Result<Self, ElfError> {
        let b = bytes.bytes();
        if b.get(0..4) != Some(&ELF_MAGIC[..]) {
            return Err(ElfError {
                offset: 0,
                kind: ElfErrorKind::BadMagic,
            });
        }
        let ident: [u8; 6] = field(b, 0, "ELF identification")?;
        if ident[4] != ELFCLASS64 || ident[5] != ELFDATA2LSB {
            return Err(ElfError {
                offset: 4,
                kind: ElfErrorKind::Unsupported {
                    class: ident[4],
                    data: ident[5],
                },
            });
        }
        field::<EHDR_SIZE>(b, 0, "ELF header")?;
        let e_type = u16_at(b, 16, "e_type")?;
        if e_type != ET_CORE {
            return Err(ElfError {
                offset: 16,
                kind: ElfErrorKind::NotCore(e_type),
            });
        }
        let phoff = to_usize(u64_at(b, 32, "e_phoff")?, 32, "program header table")?;
        let phentsize = u16_at(b, 54, "e_phentsize")?;
        let mut phnum = usize::from(u16_at(b, 56, "e_phnum")?);
        if phnum > 0 && usize::from(phentsize) != PHDR_SIZE {
            return Err(ElfError {
                offset: 54,
                kind: ElfErrorKind::PhdrSize(phentsize),
            });
        }
        if phnum == usize::from(PN_XNUM) {
            let shoff = to_usize(u64_at(b, 40, "e_shoff")?, 40, "section header 0")?;
            phnum = u32_at(b, shoff.saturating_add(44), "section header 0 sh_info")? as usize;
        }
        let table_len = phnum.saturating_mul(PHDR_SIZE);
        if phoff.checked_add(table_len).is_none_or(|end| end > b.len()) {
            return Err(ElfError {
                offset: 32,
                kind: ElfErrorKind::Truncated("program header table"),
            });
        }
        let mut regions = Vec::new();
        let mut cpus = Vec::new();
        for i in 0..phnum {
            let ph = phoff + i * PHDR_SIZE;
            let p_type = u32_at(b, ph, "p_type")?;
            let offset = u64_at(b, ph + 8, "p_offset")?;
            let paddr = u64_at(b, ph + 24, "p_paddr")?;
            let filesz = u64_at(b, ph + 32, "p_filesz")?;
            match p_type {
                PT_LOAD => regions.push(Region {
                    phys: PhysAddr(paddr),
                    file_offset: offset,
                    len: filesz,
                }),
                PT_NOTE => {
                    let start = to_usize(offset, ph + 8, "PT_NOTE segment")?;
                    let len = to_usize(filesz, ph + 32, "PT_NOTE segment")?;
                    let notes = start
                        .checked_add(len)
                        .and_then(|end| b.get(start..end))
                        .ok_or(ElfError {
                            offset: (ph + 8) as u64,
                            kind: ElfErrorKind::Truncated("PT_NOTE segment"),
                        })?;
                    read_qemu_notes(notes, &mut cpus);
                }
                _ => {}
            }
        }
        let regions = RegionMap::new(regions, b.len() as u64).map_err(|e| ElfError {
            offset: phoff as u64,
            kind: ElfErrorKind::Segments(e),
        })?;
        Ok(Self {
            bytes,
            regions,
            cpus,
        })
    }

    /// The PT_LOAD segments as physical regions.
    pub fn regions(&self) -> &[Region] {
        self.regions.regions()
    }

    /// The vCPU states from "QEMU" notes, in note order (vCPU 0 first).
    pub fn cpus(&self) -> &[QemuCpuState] {
        &self.cpus
    }
}

/// Collects the "QEMU" notes of a note segment; stops quietly at the first
/// malformed note header (notes are an optional extra, memory still reads).
fn read_qemu_notes(mut notes: &[u8], out: &mut Vec<QemuCpuState>) {
    let pad4 = |n: usize| n.checked_add(3).map(|v| v & !3);
    while notes.len() >= 12 {
        let word = |i: usize| {
            u32::from_le_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]) as usize
        };
        let (namesz, descsz) = (word(0), word(4));
        let (Some(name_len), Some(desc_len)) = (pad4(namesz), pad4(descsz)) else {
            return;
        };
        let Some(desc_start) = 12usize.checked_add(name_len) else {
            return;
        };
        let Some(next) = desc_start.checked_add(desc_len) else {
            return;
        };
        let (Some(name), Some(desc)) = (
            notes.get(12..12 + namesz),
            notes.get(desc_start..desc_start + descsz),
        ) else {
            return;
        };
        if name.strip_suffix(b"\0").unwrap_or(name) == b"QEMU"
            && let Some(cpu) = QemuCpuState::parse(desc)
        {
            out.push(cpu);
        }
        notes = notes.get(next..).unwrap_or(&[]);
    }
}

impl PhysMemory for ElfCore {
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.regions.read(self.bytes.bytes(), addr, buf)
    }
}
