//! Writing ELF64 cores in the shape QEMU's `dump-guest-memory` produces:
//! for round-trip tests and for generating small dumps (tests, simulator).

use super::QemuCpuState;
use hwtrace_types::PhysAddr;

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;

/// Builds an ELF64 ET_CORE for x86-64: a PT_NOTE segment with one "QEMU"
/// note per vCPU (when `cpus` is not empty), then one PT_LOAD per run of
/// physical memory (`p_paddr` = the run's base, `p_vaddr` = 0, as QEMU
/// writes them without `paging=true`).
pub fn write_qemu_core(runs: &[(PhysAddr, &[u8])], cpus: &[QemuCpuState]) -> Vec<u8> {
    let mut notes = Vec::new();
    for cpu in cpus {
        let desc = cpu.to_bytes();
        notes.extend_from_slice(&5u32.to_le_bytes());
        notes.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        notes.extend_from_slice(&0u32.to_le_bytes());
        notes.extend_from_slice(b"QEMU\0\0\0\0");
        notes.extend_from_slice(&desc);
        while notes.len() % 4 != 0 {
            notes.push(0);
        }
    }
    let phnum = runs.len() + usize::from(!cpus.is_empty());
    let mut data_at = EHDR_SIZE + phnum * PHDR_SIZE;
    let mut out = Vec::new();
    // e_ident: magic, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, System V ABI.
    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    out.extend_from_slice(&4u16.to_le_bytes()); // e_type = ET_CORE
    out.extend_from_slice(&62u16.to_le_bytes()); // e_machine = EM_X86_64
    out.extend_from_slice(&1u32.to_le_bytes()); // e_version
    out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    out.extend_from_slice(&(EHDR_SIZE as u64).to_le_bytes()); // e_phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    out.extend_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
    out.extend_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
    out.extend_from_slice(&(phnum as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // e_shentsize
    out.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    out.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
    let phdr = |out: &mut Vec<u8>, p_type: u32, offset: usize, paddr: u64, len: usize| {
        out.extend_from_slice(&p_type.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // p_flags
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // p_vaddr
        out.extend_from_slice(&paddr.to_le_bytes());
        out.extend_from_slice(&(len as u64).to_le_bytes()); // p_filesz
        out.extend_from_slice(&(len as u64).to_le_bytes()); // p_memsz
        out.extend_from_slice(&0u64.to_le_bytes()); // p_align
    };
    if !cpus.is_empty() {
        phdr(&mut out, 4, data_at, 0, notes.len());
        data_at += notes.len();
    }
    for (base, bytes) in runs {
        phdr(&mut out, 1, data_at, base.0, bytes.len());
        data_at += bytes.len();
    }
    out.extend_from_slice(&notes);
    for (_, bytes) in runs {
        out.extend_from_slice(bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::{ElfCore, ElfErrorKind};
    use super::*;
    use hwtrace_types::{MemoryError, PhysMemory};

    fn cpu(cr3: u64) -> QemuCpuState {
        QemuCpuState {
            version: 1,
            rip: 0xffff_ffff_8100_0000,
            rsp: 0,
            cr: [0x8005_0033, 0, 0, cr3, 0x3606f0],
        }
    }

    #[test]
    fn round_trip_segments_and_cpu_notes() {
        let low = vec![0x11u8; 0x2000];
        let high = vec![0x22u8; 0x1000];
        let core = write_qemu_core(
            &[(PhysAddr(0), &low), (PhysAddr(0x1_0000_0000), &high)],
            &[cpu(0x1000), cpu(0x5000)],
        );
        let elf = ElfCore::from_bytes(core).unwrap();
        assert_eq!(elf.regions().len(), 2);
        assert_eq!(elf.cpus().len(), 2);
        assert_eq!(elf.cpus()[1].cr3().0, 0x5000);
        assert_eq!(
            elf.read_phys_u64(PhysAddr(0x1ff8)).unwrap(),
            0x1111_1111_1111_1111
        );
        assert_eq!(
            elf.read_phys_u64(PhysAddr(0x1_0000_0008)).unwrap(),
            0x2222_2222_2222_2222
        );
        let mut b = [0u8; 8];
        assert_eq!(
            elf.read_phys(PhysAddr(0x2000), &mut b),
            Err(MemoryError::NoPhysical {
                addr: PhysAddr(0x2000)
            })
        );
    }

    #[test]
    fn malformed_headers_name_the_offset() {
        let core = write_qemu_core(&[(PhysAddr(0), &[0u8; 16])], &[cpu(0)]);
        let err = |bytes: Vec<u8>| ElfCore::from_bytes(bytes).unwrap_err();
        assert_eq!(err(b"MZ\x90\0".to_vec()).kind, ElfErrorKind::BadMagic);
        let mut class32 = core.clone();
        class32[4] = 1;
        assert!(matches!(
            err(class32).kind,
            ElfErrorKind::Unsupported { class: 1, .. }
        ));
        let mut exec = core.clone();
        exec[16] = 2;
        assert_eq!(
            err(exec),
            super::super::ElfError {
                offset: 16,
                kind: ElfErrorKind::NotCore(2)
            }
        );
        assert!(matches!(
            err(core[..100].to_vec()).kind,
            ElfErrorKind::Truncated(_)
        ));
        // A PT_LOAD pointing past the end of the file.
        let mut past = core.clone();
        let last_phdr = 64 + 56;
        past[last_phdr + 8..last_phdr + 16].copy_from_slice(&0xffff_0000u64.to_le_bytes());
        assert!(matches!(err(past).kind, ElfErrorKind::Segments(_)));
    }

    #[test]
    fn garbage_after_the_magic_never_panics() {
        let core = write_qemu_core(&[(PhysAddr(0), &[7u8; 64])], &[cpu(0x1000)]);
        // Every cut inside the headers or the segment data is refused
        // (the last segment ends at the end of the file).
        for cut in 0..core.len() {
            assert!(
                ElfCore::from_bytes(core[..cut].to_vec()).is_err(),
                "cut at {cut}"
            );
        }
        // Flipped bytes either parse or fail; either way, reads stay in bounds.
        for i in 0..core.len() {
            let mut c = core.clone();
            c[i] ^= 0xff;
            if let Ok(elf) = ElfCore::from_bytes(c) {
                for r in elf.regions() {
                    let mut b = vec![0u8; r.len as usize];
                    assert!(elf.read_phys(r.phys, &mut b).is_ok());
                }
            }
        }
    }
}
