//! The sections of PE images (Windows executables and DLLs), read with the
//! `object` crate's raw section table.
//!
//! A section's bytes go to `ImageBase + VirtualAddress` (PE/COFF
//! specification, "Section Table"); the file holds
//! `min(VirtualSize, SizeOfRawData)` of them, the rest is zero-filled by
//! the loader and is not loaded here.

use super::ImageError;
use super::elf::{FileSegment, SegmentFilter};
use object::pe::{IMAGE_SCN_CNT_CODE, IMAGE_SCN_MEM_EXECUTE};
use object::read::pe::{ImageNtHeaders, ImageOptionalHeader, PeFile};
use object::{FileKind, LittleEndian};
use std::path::Path;

/// The sections of a PE image: `vaddr` of each segment is its RVA.
#[derive(Debug)]
pub(super) struct PeLayout {
    pub image_base: u64,
    pub segments: Vec<FileSegment>,
}

/// Reads the section table of the PE image `data` (named `path`).
pub(super) fn pe_layout(
    path: &Path,
    data: &[u8],
    filter: SegmentFilter,
) -> Result<PeLayout, ImageError> {
    match FileKind::parse(data) {
        Ok(FileKind::Pe32) => layout::<object::pe::ImageNtHeaders32>(path, data, filter),
        Ok(FileKind::Pe64) => layout::<object::pe::ImageNtHeaders64>(path, data, filter),
        Ok(kind) => Err(ImageError::WrongFormat {
            path: path.to_path_buf(),
            expected: "a PE",
            found: format!("{kind:?}"),
        }),
        Err(_) => Err(ImageError::WrongFormat {
            path: path.to_path_buf(),
            expected: "a PE",
            found: super::describe_unknown(data),
        }),
    }
}

fn layout<Pe: ImageNtHeaders>(
    path: &Path,
    data: &[u8],
    filter: SegmentFilter,
) -> Result<PeLayout, ImageError> {
    let file = PeFile::<Pe>::parse(data).map_err(|e| ImageError::Malformed {
        path: path.to_path_buf(),
        format: "PE",
        reason: e.to_string(),
    })?;
    let image_base = file.nt_headers().optional_header().image_base();
    let mut segments = Vec::new();
    for (index, section) in file.section_table().iter().enumerate() {
        let flags = section.characteristics.get(LittleEndian);
        if filter == SegmentFilter::Executable
            && flags & (IMAGE_SCN_MEM_EXECUTE | IMAGE_SCN_CNT_CODE) == 0
        {
            continue;
        }
        // The file holds min(VirtualSize, SizeOfRawData) bytes; a
        // VirtualSize of 0 (some old linkers) means SizeOfRawData.
        let offset = section.pointer_to_raw_data.get(LittleEndian);
        let raw_size = section.size_of_raw_data.get(LittleEndian);
        let size = match section.virtual_size.get(LittleEndian) {
            0 => raw_size,
            virtual_size => virtual_size.min(raw_size),
        };
        if size == 0 {
            continue;
        }
        let (offset, size) = (u64::from(offset), u64::from(size));
        if offset + size > data.len() as u64 {
            return Err(ImageError::Malformed {
                path: path.to_path_buf(),
                format: "PE",
                reason: format!(
                    "section {index}: bytes {offset:#x}+{size:#x} lie outside the file ({:#x} bytes)",
                    data.len()
                ),
            });
        }
        segments.push(FileSegment {
            file_offset: offset,
            size,
            vaddr: u64::from(section.virtual_address.get(LittleEndian)),
        });
    }
    Ok(PeLayout {
        image_base,
        segments,
    })
}
