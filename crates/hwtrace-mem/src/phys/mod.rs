//! Physical memory sources: raw dumps, QEMU ELF cores, and sparse memory
//! built in memory. All implement [`PhysMemory`].

mod elfcore;
mod elfwrite;
mod qemu_note;
mod raw;
mod regions;
mod sparse;

pub use elfcore::{ELF_MAGIC, ElfCore, ElfError, ElfErrorKind};
pub use elfwrite::write_qemu_core;
pub use qemu_note::{CR0_PG, CR4_LA57, QemuCpuState};
pub use raw::RawDump;
pub use regions::{Region, RegionError, RegionMap};
pub use sparse::SparseMemory;

use hwtrace_types::{MemoryError, PhysAddr, PhysMemory};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Why a dump could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DumpError {
    /// Reading or mapping the file failed.
    #[error("{}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is a malformed ELF core.
    #[error(transparent)]
    Elf(#[from] ElfError),
    /// A physical base was given for an ELF core, whose segments carry
    /// their own addresses.
    #[error("{}: an ELF core carries its own physical addresses; drop @BASE", path.display())]
    BaseForElf {
        /// The file.
        path: PathBuf,
    },
}

/// A dump file of either kind, told apart by its first bytes.
#[derive(Debug)]
pub enum Dump {
    /// A raw dump.
    Raw(RawDump),
    /// An ELF core.
    Elf(ElfCore),
}

impl Dump {
    /// Opens `path`: an ELF core if it starts with `\x7fELF`, else a raw
    /// dump of physical memory from `base` (0 if not given).
    pub fn open(path: &Path, base: Option<PhysAddr>) -> Result<Self, DumpError> {
        let io_err = |source| DumpError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut magic = [0u8; 4];
        let n = std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut magic))
            .map_err(io_err)?;
        if n == 4 && magic == ELF_MAGIC {
            if base.is_some() {
                return Err(DumpError::BaseForElf {
                    path: path.to_path_buf(),
                });
            }
            return Ok(Self::Elf(ElfCore::open(path)?));
        }
        Ok(Self::Raw(
            RawDump::open(path, base.unwrap_or_default()).map_err(io_err)?,
        ))
    }

    /// The vCPU states the dump records (ELF cores from QEMU only).
    pub fn cpus(&self) -> &[QemuCpuState] {
        match self {
            Self::Raw(_) => &[],
            Self::Elf(e) => e.cpus(),
        }
    }

    /// The physical regions the dump holds.
    pub fn regions(&self) -> &[Region] {
        match self {
            Self::Raw(r) => r.regions(),
            Self::Elf(e) => e.regions(),
        }
    }
}

impl PhysMemory for Dump {
    fn read_phys(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), MemoryError> {
        match self {
            Self::Raw(r) => r.read_phys(addr, buf),
            Self::Elf(e) => e.read_phys(addr, buf),
        }
    }
}
