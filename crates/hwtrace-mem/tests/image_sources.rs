//! Raw files, page caches of the real-trace corpus, and inputs that must
//! never panic.

use hwtrace_mem::image::{
    ElfPlacement, Image, ImageError, RawSpec, SegmentFilter, parse_image_arg, parse_ptxed_raw,
};
use hwtrace_mem::pagecache::PageCache;
use hwtrace_types::{AddressSpace, Cr3, Ip, MemoryError, ReadMemory};
use proptest::prelude::*;
use std::path::{Path, PathBuf};

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("image_sources-{}-{name}", std::process::id()))
}

fn read(image: &Image, space: AddressSpace, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
    let mut buf = vec![0; len];
    let n = image.read_memory(space, Ip(addr), &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// A file of 256 bytes 0, 1, ..., 255.
fn counting_file(name: &str) -> PathBuf {
    let path = tmp(name);
    std::fs::write(&path, (0..=255u8).collect::<Vec<_>>()).unwrap();
    path
}

#[test]
fn raw_files_whole_and_in_ranges() {
    let path = counting_file("raw");
    let p = path.display();
    let any = AddressSpace::UNKNOWN;
    let mut image = Image::new();
    image
        .add_raw(None, &parse_image_arg(&format!("{p}@1000")).unwrap())
        .unwrap();
    image
        .add_raw(None, &parse_image_arg(&format!("{p}:10@2000")).unwrap())
        .unwrap();
    image
        .add_raw(None, &parse_image_arg(&format!("{p}:10-4@3000")).unwrap())
        .unwrap();
    assert_eq!(read(&image, any, 0x10fe, 8), Ok(vec![0xfe, 0xff]));
    assert_eq!(read(&image, any, 0x2000, 2), Ok(vec![0x10, 0x11]));
    assert_eq!(read(&image, any, 0x20ef, 8), Ok(vec![0xff]));
    assert_eq!(
        read(&image, any, 0x3000, 8),
        Ok(vec![0x10, 0x11, 0x12, 0x13])
    );
    let listed: Vec<(u64, u64, u64)> = image
        .sections()
        .iter()
        .map(|s| (s.addr.0, s.len, s.file_offset))
        .collect();
    assert_eq!(
        listed,
        [(0x1000, 256, 0), (0x2000, 0xf0, 0x10), (0x3000, 4, 0x10)]
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn raw_ranges_past_the_end_refused_or_cut_like_ptxed() {
    let path = counting_file("range");
    let p = path.display();
    let err = Image::new()
        .add_raw(None, &parse_image_arg(&format!("{p}:f0-20@1000")).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::RangeBeyondEnd {
                offset: 0xf0,
                size: 0x20,
                len: 256,
                ..
            }
        ),
        "{err:?}"
    );
    let err = Image::new()
        .add_raw(None, &parse_image_arg(&format!("{p}:100@1000")).unwrap())
        .unwrap_err();
    assert!(
        matches!(err, ImageError::OffsetBeyondEnd { offset: 0x100, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains(&p.to_string()), "{err}");
    // ptxed's FROM-TO range, cut at the end of the file as libipt does.
    let mut image = Image::new();
    image
        .add_raw(
            None,
            &parse_ptxed_raw(&format!("{p}:0xf0-0x200:0x1000")).unwrap(),
        )
        .unwrap();
    assert_eq!(image.sections()[0].len, 0x10);
    assert_eq!(
        read(&image, AddressSpace::UNKNOWN, 0x100f, 4),
        Ok(vec![0xff])
    );
    // An empty file has no byte to load.
    let empty = tmp("empty");
    std::fs::write(&empty, b"").unwrap();
    let err = Image::new()
        .add_raw(
            None,
            &RawSpec {
                path: empty.clone(),
                offset: 0,
                size: None,
                addr: Ip(0),
                truncate: true,
            },
        )
        .unwrap_err();
    assert!(
        matches!(err, ImageError::OffsetBeyondEnd { len: 0, .. }),
        "{err:?}"
    );
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(empty);
}

#[test]
fn raw_files_per_cr3() {
    let path = counting_file("cr3");
    let spec = parse_image_arg(&format!("{}:80@1000", path.display())).unwrap();
    let mut image = Image::new();
    image.add_raw(Some(Cr3(0x5000)), &spec).unwrap();
    assert_eq!(
        read(&image, AddressSpace::with_cr3(Cr3(0x5000)), 0x1000, 1),
        Ok(vec![0x80])
    );
    assert_eq!(
        read(&image, AddressSpace::UNKNOWN, 0x1000, 1),
        Err(MemoryError::Unmapped { addr: Ip(0x1000) })
    );
    let _ = std::fs::remove_file(path);
}

/// Every instruction libipt's ptxed decoded from the real `foo` trace is
/// readable from the case's page cache, and reads agree with the page
/// cache itself.
#[test]
fn corpus_page_cache_holds_every_reference_instruction() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real/foo");
    let insns = std::fs::read_to_string(dir.join("reference/ptxed-insn.txt")).unwrap_or_else(|e| {
        panic!(
            "the corpus belongs beside the checkout: {}: {e}",
            dir.display()
        )
    });
    let mut image = Image::new();
    let runs = image.add_pages_dir(None, &dir).unwrap();
    assert!(runs > 0);
    let cache = PageCache::open(&dir).unwrap();
    let mut checked = 0;
    for line in insns.lines() {
        let Ok(ip) = u64::from_str_radix(line.trim(), 16) else {
            continue;
        };
        let got = read(&image, AddressSpace::UNKNOWN, ip, 15).unwrap();
        let mut want = vec![0; 15];
        let n = cache
            .read_memory(AddressSpace::UNKNOWN, Ip(ip), &mut want)
            .unwrap();
        want.truncate(n);
        assert_eq!(got, want, "at {ip:#x}");
        checked += 1;
    }
    assert!(checked > 100_000, "only {checked} instructions");
}

#[test]
fn page_cache_folder_errors_name_the_folder() {
    let dir = tmp("nopages");
    let err = Image::new().add_pages_dir(None, &dir).unwrap_err();
    assert!(
        matches!(&err, ImageError::PageCache { path, .. } if *path == dir),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&dir.display().to_string()),
        "{err}"
    );
}

proptest! {
    /// Arbitrary sections and arbitrary reads: no panic, and a read either
    /// fails at its first byte or returns bytes.
    #[test]
    fn random_reads_never_panic(
        sections in proptest::collection::vec(
            (any::<Option<u64>>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64)),
            0..16),
        reads in proptest::collection::vec((any::<Option<u64>>(), any::<u64>(), 0usize..128), 0..32),
    ) {
        let mut image = Image::new();
        for (cr3, addr, bytes) in sections {
            let _ = image.add_bytes(cr3.map(Cr3), Ip(addr), bytes, "random");
        }
        for (cr3, addr, len) in reads {
            let space = cr3.map_or(AddressSpace::UNKNOWN, |c| AddressSpace::with_cr3(Cr3(c)));
            let mut buf = vec![0; len];
            match image.read_memory(space, Ip(addr), &mut buf) {
                Ok(n) => prop_assert!(n <= len && (n > 0 || len == 0)),
                Err(e) => prop_assert_eq!(e, MemoryError::Unmapped { addr: Ip(addr) }),
            }
        }
    }

    /// Random bytes, and a real ELF with random bytes overwritten, as ELF
    /// and PE files: an error or an image, never a panic.
    #[test]
    fn random_files_never_panic(
        junk in proptest::collection::vec(any::<u8>(), 0..512),
        patches in proptest::collection::vec((0usize..4096, any::<u8>()), 1..16),
        placement in prop_oneof![
            any::<u64>().prop_map(ElfPlacement::Bias),
            any::<u64>().prop_map(ElfPlacement::LowestAt)
        ],
    ) {
        let mut inputs = vec![junk];
        if let Ok(mut elf) = std::fs::read("/bin/true") {
            for (at, byte) in patches {
                if let Some(b) = elf.get_mut(at) {
                    *b = byte;
                }
            }
            inputs.push(elf);
        }
        for bytes in inputs {
            let mut image = Image::new();
            let name = Path::new("random");
            let _ = image.add_elf_bytes(None, name, bytes.clone(), placement, SegmentFilter::AllLoad);
            let _ = image.add_pe_bytes(None, name, bytes, None, SegmentFilter::AllLoad);
            let mut buf = [0u8; 32];
            for s in image.sections().to_vec() {
                let _ = image.read_memory(AddressSpace::UNKNOWN, s.addr, &mut buf);
            }
        }
    }
}
