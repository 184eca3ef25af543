//! The loadable segments of ELF files (executables and shared objects),
//! read with the `object` crate's raw program headers.
//!
//! Only `PT_LOAD` segments with file bytes matter: they are what the loader
//! maps (System V gABI, "Program Loading"). Bytes of `p_memsz` beyond
//! `p_filesz` are zero-filled `.bss`, never code, and are not loaded (libipt
//! does the same).

use super::ImageError;
use object::elf::{PF_X, PT_LOAD};
use object::read::elf::{FileHeader, ProgramHeader};
use object::{Endianness, FileKind};
use std::path::Path;

/// Which `PT_LOAD` segments to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SegmentFilter {
    /// Only executable ones (`PF_X`): all the flow decoder reads.
    #[default]
    Executable,
    /// Every one with file bytes, as libipt's ptxed `--elf` loads them.
    AllLoad,
}

/// Where an ELF file goes in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElfPlacement {
    /// Each segment at `p_vaddr + bias` (bias 0: where the file says; a
    /// shared object linked at 0 loaded at `bias`).
    Bias(u64),
    /// The lowest `PT_LOAD` `p_vaddr` at this address, the others at the
    /// same distance from it (ptxed's `--elf FILE:BASE`).
    LowestAt(u64),
}

impl Default for ElfPlacement {
    fn default() -> Self {
        Self::Bias(0)
    }
}

/// One loadable piece of a file: `size` bytes at `file_offset` go to
/// `vaddr` (before any bias or base is applied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileSegment {
    pub file_offset: u64,
    pub size: u64,
    pub vaddr: u64,
}

/// The segments of an ELF file and the lowest `PT_LOAD` address.
#[derive(Debug)]
pub(super) struct ElfLayout {
    pub segments: Vec<FileSegment>,
    /// Lowest `p_vaddr` of any `PT_LOAD` (with or without file bytes).
    pub lowest: Option<u64>,
}

impl ElfLayout {
    /// The amount added to every `p_vaddr` under `placement`.
    pub fn bias(&self, placement: ElfPlacement) -> u64 {
        match placement {
            ElfPlacement::Bias(bias) => bias,
            ElfPlacement::LowestAt(base) => base.wrapping_sub(self.lowest.unwrap_or(0)),
        }
    }
}

/// Reads the program headers of the ELF file `data` (named `path`).
pub(super) fn elf_layout(
    path: &Path,
    data: &[u8],
    filter: SegmentFilter,
) -> Result<ElfLayout, ImageError> {
    match FileKind::parse(data) {
        Ok(FileKind::Elf32) => layout::<object::elf::FileHeader32<Endianness>>(path, data, filter),
        Ok(FileKind::Elf64) => layout::<object::elf::FileHeader64<Endianness>>(path, data, filter),
        Ok(kind) => Err(ImageError::WrongFormat {
            path: path.to_path_buf(),
            expected: "an ELF",
            found: format!("{kind:?}"),
        }),
        Err(_) => Err(ImageError::WrongFormat {
            path: path.to_path_buf(),
            expected: "an ELF",
            found: super::describe_unknown(data),
        }),
    }
}

fn layout<Elf: FileHeader<Endian = Endianness>>(
    path: &Path,
    data: &[u8],
    filter: SegmentFilter,
) -> Result<ElfLayout, ImageError> {
    let malformed = |reason: String| ImageError::Malformed {
        path: path.to_path_buf(),
        format: "ELF",
        reason,
    };
    let header = Elf::parse(data).map_err(|e| malformed(e.to_string()))?;
    let endian = header.endian().map_err(|e| malformed(e.to_string()))?;
    let phdrs = header
        .program_headers(endian, data)
        .map_err(|e| malformed(e.to_string()))?;
    let mut segments = Vec::new();
    let mut lowest: Option<u64> = None;
    for (index, ph) in phdrs.iter().enumerate() {
        if ph.p_type(endian) != PT_LOAD {
            continue;
        }
        let vaddr: u64 = ph.p_vaddr(endian).into();
        lowest = Some(lowest.map_or(vaddr, |l| l.min(vaddr)));
        let size: u64 = ph.p_filesz(endian).into();
        if size == 0 {
            continue;
        }
        if filter == SegmentFilter::Executable && ph.p_flags(endian) & PF_X == 0 {
            continue;
        }
        let file_offset: u64 = ph.p_offset(endian).into();
        let in_file = file_offset
            .checked_add(size)
            .is_some_and(|end| end <= data.len() as u64);
        if !in_file {
            return Err(malformed(format!(
                "program header {index}: bytes {file_offset:#x}+{size:#x} lie outside the file ({:#x} bytes)",
                data.len()
            )));
        }
        segments.push(FileSegment {
            file_offset,
            size,
            vaddr,
        });
    }
    Ok(ElfLayout { segments, lowest })
}
