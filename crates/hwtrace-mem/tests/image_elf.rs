//! ELF images from real binaries of this machine, checked against the
//! section table (a different path through the file than the program
//! headers the image loads from).

use hwtrace_mem::image::{
    ElfPlacement, ElfSpec, Image, ImageError, SegmentFilter, parse_elf_arg, parse_ptxed_elf,
};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use std::path::{Path, PathBuf};

const TRUE: &str = "/bin/true";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// The file bytes at virtual address `va` (unbiased), found through the
/// section headers.
fn file_bytes_at(data: &[u8], va: u64, len: usize) -> Vec<u8> {
    let file = object::File::parse(data).unwrap();
    let section = file
        .sections()
        .find(|s| s.address() <= va && va < s.address() + s.size())
        .unwrap_or_else(|| panic!("no section holds {va:#x}"));
    let (offset, _) = section.file_range().unwrap();
    let start = (offset + va - section.address()) as usize;
    data[start..start + len].to_vec()
}

fn read(image: &Image, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
    let mut buf = vec![0; len];
    let n = image.read_memory(AddressSpace::UNKNOWN, Ip(addr), &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// The system files these tests read are on every Debian machine the tests
/// run on; a missing one is a broken setup, not a reason to skip.
fn exists(path: &str) -> bool {
    assert!(Path::new(path).exists(), "{path} not found");
    true
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("image_elf-{}-{name}", std::process::id()))
}

#[test]
fn executable_entry_point_reads_the_file_bytes() {
    if !exists(TRUE) {
        return;
    }
    let data = std::fs::read(TRUE).unwrap();
    let entry = object::File::parse(&*data).unwrap().entry();
    let want = file_bytes_at(&data, entry, 16);
    for bias in [0u64, 0x5555_5555_4000] {
        let mut image = Image::new();
        let spec = parse_elf_arg(&format!("{TRUE}@{bias:x}")).unwrap();
        let n = image.add_elf(None, &spec).unwrap();
        assert!(n >= 1);
        assert_eq!(
            read(&image, entry + bias, 16),
            Ok(want.clone()),
            "bias {bias:#x}"
        );
        // Every loaded section is executable and within the file.
        for s in image.sections() {
            assert_eq!(s.name, TRUE);
            assert!(s.file_offset + s.len <= data.len() as u64);
        }
    }
}

#[test]
fn only_executable_segments_unless_asked() {
    if !exists(TRUE) {
        return;
    }
    let data = std::fs::read(TRUE).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let rodata = file.section_by_name(".rodata").unwrap().address();
    // Is .rodata in an executable segment (old linkers without
    // -z separate-code)? Then the filter cannot be seen here.
    let rodata_exec = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data)
        .unwrap()
        .elf_program_headers()
        .iter()
        .any(|ph| {
            use object::read::elf::ProgramHeader;
            let e = object::Endianness::Little;
            ph.p_type(e) == object::elf::PT_LOAD
                && ph.p_flags(e) & object::elf::PF_X != 0
                && ph.p_vaddr(e) <= rodata
                && rodata < ph.p_vaddr(e) + ph.p_filesz(e)
        });
    let mut exec = Image::new();
    exec.add_elf(None, &parse_elf_arg(TRUE).unwrap()).unwrap();
    if !rodata_exec {
        assert_eq!(
            read(&exec, rodata, 4),
            Err(MemoryError::Unmapped { addr: Ip(rodata) })
        );
    }
    let mut all = Image::new();
    all.add_elf(
        None,
        &ElfSpec {
            path: TRUE.into(),
            placement: ElfPlacement::Bias(0),
            segments: SegmentFilter::AllLoad,
        },
    )
    .unwrap();
    assert_eq!(read(&all, rodata, 4), Ok(file_bytes_at(&data, rodata, 4)));
    assert_eq!(all.sections().len(), file.segments().count());
}

#[test]
fn shared_object_at_a_bias_and_ptxed_base() {
    if !exists(LIBC) {
        return;
    }
    let data = std::fs::read(LIBC).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let lowest = file.segments().map(|s| s.address()).min().unwrap();
    // A few exported functions, spread over the library.
    let funcs: Vec<(String, u64)> = file
        .dynamic_symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() >= 8)
        .filter_map(|s| Some((s.name().ok()?.to_owned(), s.address())))
        .step_by(97)
        .take(20)
        .collect();
    assert!(funcs.len() >= 5, "too few symbols in {LIBC}");

    let bias = 0x7f12_3450_0000u64;
    let mut image = Image::new();
    image
        .add_elf(None, &parse_elf_arg(&format!("{LIBC}@0x{bias:x}")).unwrap())
        .unwrap();
    // ptxed's --elf FILE:BASE puts the lowest segment at BASE.
    let base = 0x7f99_0000_0000u64;
    let mut ptxed = Image::new();
    ptxed
        .add_elf(None, &parse_ptxed_elf(&format!("{LIBC}:{base:#x}")))
        .unwrap();
    for (name, va) in &funcs {
        let want = file_bytes_at(&data, *va, 8);
        assert_eq!(read(&image, va + bias, 8), Ok(want.clone()), "{name}");
        assert_eq!(read(&ptxed, va - lowest + base, 8), Ok(want), "{name}");
    }
}

#[test]
fn bad_inputs_are_typed_errors_naming_the_file() {
    let text = tmp("text");
    std::fs::write(&text, b"this is not an ELF file, only some text\n").unwrap();
    let err = Image::new()
        .add_elf(None, &parse_elf_arg(text.to_str().unwrap()).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, ImageError::WrongFormat { path, expected: "an ELF", .. } if *path == text),
        "{err:?}"
    );
    assert!(err.to_string().contains(text.to_str().unwrap()));

    let missing = tmp("missing");
    let err = Image::new()
        .add_elf(None, &parse_elf_arg(missing.to_str().unwrap()).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, ImageError::Io { path, .. } if *path == missing),
        "{err:?}"
    );

    if exists(TRUE) {
        // Truncated after the ELF header: the program headers are missing.
        let data = std::fs::read(TRUE).unwrap();
        let cut = tmp("cut");
        std::fs::write(&cut, &data[..80]).unwrap();
        let err = Image::new()
            .add_elf(None, &parse_elf_arg(cut.to_str().unwrap()).unwrap())
            .unwrap_err();
        assert!(
            matches!(&err, ImageError::Malformed { path, format: "ELF", .. } if *path == cut),
            "{err:?}"
        );
        // A segment pointing past the end of the file.
        let mut short = data.clone();
        short.truncate(0x2100);
        let err = Image::new()
            .add_elf_bytes(
                None,
                Path::new("short"),
                short,
                ElfPlacement::Bias(0),
                SegmentFilter::Executable,
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("short") && err.to_string().contains("outside the file"),
            "{err}"
        );
        let _ = std::fs::remove_file(cut);
    }
    let _ = std::fs::remove_file(text);
}

#[test]
fn a_failed_load_leaves_the_image_unchanged() {
    if !exists(TRUE) {
        return;
    }
    let mut image = Image::new();
    // The executable segment of /bin/true placed so it runs past 2^64.
    let data = std::fs::read(TRUE).unwrap();
    let text = object::File::parse(&*data)
        .unwrap()
        .section_by_name(".text")
        .unwrap()
        .address();
    let bias = 0u64.wrapping_sub(text) + 0x10;
    let err = image
        .add_elf(None, &parse_elf_arg(&format!("{TRUE}@{bias:x}")).unwrap())
        .unwrap_err();
    assert!(matches!(err, ImageError::AddressOverflow { .. }), "{err:?}");
    assert!(image.is_empty());
}
