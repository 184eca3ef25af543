//! ELF files written here with `object`'s ELF writer (32- and 64-bit),
//! for the cases real binaries do not show: segments without file bytes,
//! non-load segments, overlapping segments, a file without code.

use hwtrace_mem::image::{ElfPlacement, Image, SegmentFilter};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
use object::elf;
use object::write::elf::{FileHeader, ProgramHeader, Writer};
use std::path::Path;

/// One segment to write: type, flags, vaddr, file bytes, memory size.
struct Seg {
    p_type: u32,
    flags: u32,
    vaddr: u64,
    bytes: Vec<u8>,
    memsz: u64,
}

fn load(flags: u32, vaddr: u64, bytes: &[u8]) -> Seg {
    Seg {
        p_type: elf::PT_LOAD,
        flags,
        vaddr,
        bytes: bytes.to_vec(),
        memsz: bytes.len() as u64,
    }
}

fn build(is_64: bool, segs: &[Seg]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer::new(object::Endianness::Little, is_64, &mut out);
    w.reserve_file_header();
    w.reserve_program_headers(segs.len() as u32);
    let offsets: Vec<usize> = segs.iter().map(|s| w.reserve(s.bytes.len(), 16)).collect();
    w.write_file_header(&FileHeader {
        os_abi: elf::ELFOSABI_NONE,
        abi_version: 0,
        e_type: elf::ET_EXEC,
        e_machine: if is_64 { elf::EM_X86_64 } else { elf::EM_386 },
        e_entry: segs.first().map_or(0, |s| s.vaddr),
        e_flags: 0,
    })
    .unwrap();
    w.write_align_program_headers();
    for (s, &offset) in segs.iter().zip(&offsets) {
        w.write_program_header(&ProgramHeader {
            p_type: s.p_type,
            p_flags: s.flags,
            p_offset: offset as u64,
            p_vaddr: s.vaddr,
            p_paddr: s.vaddr,
            p_filesz: s.bytes.len() as u64,
            p_memsz: s.memsz,
            p_align: 16,
        });
    }
    for (s, &offset) in segs.iter().zip(&offsets) {
        w.pad_until(offset);
        w.write(&s.bytes);
    }
    out
}

fn read(image: &Image, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
    let mut buf = vec![0; len];
    let n = image.read_memory(AddressSpace::UNKNOWN, Ip(addr), &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// Code at 0x8048000, data at 0x8049000, .bss (no file bytes) lowest at
/// 0x8040000, a note, and a second code segment over the first one's tail.
fn sample() -> Vec<Seg> {
    vec![
        load(
            elf::PF_R | elf::PF_X,
            0x804_8000,
            &[0x90, 0x90, 0x90, 0x90, 0xc3],
        ),
        load(elf::PF_R, 0x804_9000, b"data"),
        Seg {
            p_type: elf::PT_LOAD,
            flags: elf::PF_R | elf::PF_W,
            vaddr: 0x804_0000,
            bytes: Vec::new(),
            memsz: 0x1000,
        },
        Seg {
            p_type: elf::PT_NOTE,
            flags: elf::PF_R | elf::PF_X,
            vaddr: 0x804_a000,
            bytes: b"note".to_vec(),
            memsz: 4,
        },
        load(elf::PF_R | elf::PF_X, 0x804_8003, &[0xcc, 0xcc]),
    ]
}

#[test]
fn segments_by_flags_type_and_order_in_32_and_64_bit() {
    for is_64 in [false, true] {
        let bytes = build(is_64, &sample());
        let mut image = Image::new();
        let n = image
            .add_elf_bytes(
                None,
                Path::new("built"),
                bytes.clone(),
                ElfPlacement::Bias(0),
                SegmentFilter::Executable,
            )
            .unwrap();
        assert_eq!(n, 2, "64-bit: {is_64}");
        // The later code segment overrides the earlier one's tail.
        assert_eq!(
            read(&image, 0x804_8000, 8),
            Ok(vec![0x90, 0x90, 0x90, 0xcc, 0xcc])
        );
        for unmapped in [0x804_9000, 0x804_0000, 0x804_a000] {
            assert_eq!(
                read(&image, unmapped, 1),
                Err(MemoryError::Unmapped { addr: Ip(unmapped) })
            );
        }

        let mut all = Image::new();
        let n = all
            .add_elf_bytes(
                None,
                Path::new("built"),
                bytes,
                ElfPlacement::Bias(0),
                SegmentFilter::AllLoad,
            )
            .unwrap();
        assert_eq!(n, 3, "the .bss segment has no file bytes");
        assert_eq!(read(&all, 0x804_9000, 8), Ok(b"data".to_vec()));
    }
}

#[test]
fn lowest_at_counts_segments_without_file_bytes_like_libipt() {
    let bytes = build(false, &sample());
    let mut image = Image::new();
    image
        .add_elf_bytes(
            None,
            Path::new("built"),
            bytes,
            ElfPlacement::LowestAt(0x1000_0000),
            SegmentFilter::AllLoad,
        )
        .unwrap();
    // The lowest PT_LOAD is the .bss one at 0x8040000.
    assert_eq!(read(&image, 0x1000_8000, 1), Ok(vec![0x90]));
    assert_eq!(read(&image, 0x1000_9000, 4), Ok(b"data".to_vec()));
}

#[test]
fn a_file_without_code_adds_nothing() {
    let bytes = build(true, &[load(elf::PF_R, 0x1000, b"only data")]);
    let mut image = Image::new();
    let n = image
        .add_elf_bytes(
            None,
            Path::new("data-only"),
            bytes,
            ElfPlacement::Bias(0),
            SegmentFilter::Executable,
        )
        .unwrap();
    assert_eq!(n, 0);
    assert!(image.is_empty());
}

#[test]
fn images_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Image>();
    let bytes = build(true, &sample());
    let mut image = Image::new();
    image
        .add_elf_bytes(
            None,
            Path::new("built"),
            bytes,
            ElfPlacement::Bias(0),
            SegmentFilter::AllLoad,
        )
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let image = &image;
            s.spawn(move || {
                for i in 0..10_000u64 {
                    let addr = if (i + t) % 2 == 0 {
                        0x804_8001
                    } else {
                        0x804_9001
                    };
                    assert!(read(image, addr, 2).is_ok());
                }
            });
        }
    });
}
