//! PE images built here with `object`'s PE writer, then loaded back.

use hwtrace_mem::image::{Image, ImageError, PeSpec, SegmentFilter, parse_pe_arg};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
use object::pe;
use object::write::pe::{NtHeaders, Writer};
use std::path::{Path, PathBuf};

const CODE: &[u8] = &[0x55, 0x48, 0x89, 0xe5, 0x31, 0xc0, 0x5d, 0xc3]; // push rbp; ...; ret
const RDATA: &[u8] = b"read-only data";

struct Built {
    bytes: Vec<u8>,
    text_rva: u32,
    text_file_offset: u32,
    rdata_rva: u32,
}

/// A PE32+ (or PE32) image with a `.text` and an `.rdata` section.
fn build(is_64: bool, image_base: u64) -> Built {
    let mut bytes = Vec::new();
    let mut w = Writer::new(is_64, 0x1000, 0x200, &mut bytes);
    w.reserve_dos_header_and_stub();
    w.reserve_nt_headers(pe::IMAGE_NUMBEROF_DIRECTORY_ENTRIES);
    w.reserve_section_headers(2);
    let text = w.reserve_text_section(CODE.len() as u32);
    let rdata = w.reserve_rdata_section(RDATA.len() as u32);
    w.write_dos_header_and_stub().unwrap();
    w.write_nt_headers(NtHeaders {
        machine: if is_64 {
            pe::IMAGE_FILE_MACHINE_AMD64
        } else {
            pe::IMAGE_FILE_MACHINE_I386
        },
        time_date_stamp: 0,
        characteristics: pe::IMAGE_FILE_EXECUTABLE_IMAGE,
        major_linker_version: 14,
        minor_linker_version: 0,
        address_of_entry_point: text.virtual_address,
        image_base,
        major_operating_system_version: 6,
        minor_operating_system_version: 0,
        major_image_version: 0,
        minor_image_version: 0,
        major_subsystem_version: 6,
        minor_subsystem_version: 0,
        subsystem: pe::IMAGE_SUBSYSTEM_WINDOWS_CUI,
        dll_characteristics: 0,
        size_of_stack_reserve: 0x10_0000,
        size_of_stack_commit: 0x1000,
        size_of_heap_reserve: 0x10_0000,
        size_of_heap_commit: 0x1000,
    });
    w.write_section_headers();
    w.write_section(text.file_offset, CODE);
    w.write_section(rdata.file_offset, RDATA);
    Built {
        bytes,
        text_rva: text.virtual_address,
        text_file_offset: text.file_offset,
        rdata_rva: rdata.virtual_address,
    }
}

fn read(image: &Image, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
    let mut buf = vec![0; len];
    let n = image.read_memory(AddressSpace::UNKNOWN, Ip(addr), &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("image_pe-{}-{name}", std::process::id()))
}

#[test]
fn pe32_plus_at_image_base_and_at_a_given_base() {
    let base = 0x1_4000_0000u64;
    let pe = build(true, base);
    let path = tmp("a.exe");
    std::fs::write(&path, &pe.bytes).unwrap();

    let mut image = Image::new();
    let n = image
        .add_pe(None, &parse_pe_arg(path.to_str().unwrap()).unwrap())
        .unwrap();
    assert_eq!(n, 1, "only .text is executable");
    let text = base + u64::from(pe.text_rva);
    assert_eq!(read(&image, text, 64), Ok(CODE.to_vec()));
    let rdata = base + u64::from(pe.rdata_rva);
    assert_eq!(
        read(&image, rdata, 1),
        Err(MemoryError::Unmapped { addr: Ip(rdata) })
    );

    let rebased = 0x7ff6_0000_0000u64;
    let mut image = Image::new();
    image
        .add_pe(
            None,
            &parse_pe_arg(&format!("{}@{rebased:#x}", path.display())).unwrap(),
        )
        .unwrap();
    assert_eq!(
        read(&image, rebased + u64::from(pe.text_rva), 8),
        Ok(CODE.to_vec())
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn pe32_with_every_section() {
    let base = 0x40_0000u64;
    let pe = build(false, base);
    let mut image = Image::new();
    let n = image
        .add_pe_bytes(
            None,
            Path::new("b.exe"),
            pe.bytes,
            None,
            SegmentFilter::AllLoad,
        )
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(
        read(&image, base + u64::from(pe.text_rva), 8),
        Ok(CODE.to_vec())
    );
    assert_eq!(
        read(&image, base + u64::from(pe.rdata_rva), 64),
        Ok(RDATA.to_vec())
    );
}

#[test]
fn virtual_size_zero_means_the_raw_size() {
    let base = 0x1_4000_0000u64;
    let pe = build(true, base);
    let mut bytes = pe.bytes;
    let header = bytes.windows(8).position(|w| w == b".text\0\0\0").unwrap();
    bytes[header + 8..header + 12].fill(0);
    let mut image = Image::new();
    image
        .add_pe_bytes(
            None,
            Path::new("old.exe"),
            bytes,
            None,
            SegmentFilter::Executable,
        )
        .unwrap();
    let text = base + u64::from(pe.text_rva);
    // The whole file-aligned raw data is loaded: the code, then padding.
    let got = read(&image, text, 0x1000).unwrap();
    assert_eq!(&got[..CODE.len()], CODE);
    assert_eq!(got.len(), 0x200);
}

#[test]
fn non_pe_and_broken_pe_are_refused_by_name() {
    let elf = Image::new()
        .add_pe(
            None,
            &PeSpec {
                path: "/bin/true".into(),
                base: None,
                sections: SegmentFilter::Executable,
            },
        )
        .unwrap_err();
    if Path::new("/bin/true").exists() {
        assert!(
            matches!(&elf, ImageError::WrongFormat { expected: "a PE", found, .. } if found.contains("Elf")),
            "{elf:?}"
        );
        assert!(
            elf.to_string().starts_with("/bin/true: not a PE file"),
            "{elf}"
        );
    }
    // Section table cut off.
    let mut cut = build(true, 0x1_4000_0000).bytes;
    cut.truncate(0x100);
    let err = Image::new()
        .add_pe_bytes(
            None,
            Path::new("cut.exe"),
            cut,
            None,
            SegmentFilter::Executable,
        )
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ImageError::Malformed { format: "PE", .. } | ImageError::WrongFormat { .. }
        ),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("cut.exe: "), "{err}");
    // Section bytes cut off.
    let pe = build(true, 0x1_4000_0000);
    let mut short = pe.bytes;
    short.truncate(pe.text_file_offset as usize + 4);
    let err = Image::new()
        .add_pe_bytes(
            None,
            Path::new("short.exe"),
            short,
            None,
            SegmentFilter::Executable,
        )
        .unwrap_err();
    assert!(err.to_string().contains("short.exe"), "{err}");
}
