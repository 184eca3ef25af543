//! Lookup, override, cross-boundary reads, misses and address spaces.

use super::*;
use hwtrace_types::{AddressSpace, Cr3, Ip, MemoryError, ReadMemory};

const ANY: AddressSpace = AddressSpace::UNKNOWN;

fn read(image: &Image, space: AddressSpace, addr: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
    let mut buf = vec![0u8; len];
    let n = image.read_memory(space, Ip(addr), &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn cr3(v: u64) -> AddressSpace {
    AddressSpace::with_cr3(Cr3(v))
}

#[test]
fn reads_inside_a_section_and_misses_around_it() {
    let mut image = Image::new();
    image
        .add_bytes(None, Ip(0x1000), vec![1, 2, 3, 4], "a")
        .unwrap();
    assert_eq!(read(&image, ANY, 0x1000, 4), Ok(vec![1, 2, 3, 4]));
    assert_eq!(read(&image, ANY, 0x1002, 1), Ok(vec![3]));
    // Short read at the end of the mapping.
    assert_eq!(read(&image, ANY, 0x1002, 8), Ok(vec![3, 4]));
    for miss in [0x0fff, 0x1004, 0, u64::MAX] {
        assert_eq!(
            read(&image, ANY, miss, 1),
            Err(MemoryError::Unmapped { addr: Ip(miss) })
        );
    }
    // An empty buffer reads nothing and is not an error.
    assert_eq!(read(&image, ANY, 0x5000, 0), Ok(vec![]));
}

#[test]
fn later_sections_override_earlier_ones() {
    let mut image = Image::new();
    image
        .add_bytes(None, Ip(0x100), vec![0xaa; 16], "old")
        .unwrap();
    // Inside: splits the old section in three.
    image
        .add_bytes(None, Ip(0x104), vec![0xbb; 4], "mid")
        .unwrap();
    // Over the old tail and beyond.
    image
        .add_bytes(None, Ip(0x10e), vec![0xcc; 4], "tail")
        .unwrap();
    let mut want = vec![0xaa; 4];
    want.extend([0xbb; 4]);
    want.extend([0xaa; 6]);
    want.extend([0xcc; 4]);
    assert_eq!(read(&image, ANY, 0x100, 32), Ok(want));
    // The old section's bytes after the split still come from the right
    // offset.
    image
        .add_bytes(None, Ip(0x200), (0u8..16).collect(), "seq")
        .unwrap();
    image
        .add_bytes(None, Ip(0x203), vec![0xff; 2], "hole")
        .unwrap();
    assert_eq!(read(&image, ANY, 0x205, 3), Ok(vec![5, 6, 7]));
    assert_eq!(read(&image, ANY, 0x201, 5), Ok(vec![1, 2, 0xff, 0xff, 5]));
    // A section covering everything hides all older ones.
    image.add_bytes(None, Ip(0), vec![7; 0x400], "all").unwrap();
    assert_eq!(read(&image, ANY, 0x100, 2), Ok(vec![7, 7]));
    assert_eq!(image.visible(None).len(), 1);
    assert_eq!(image.sections().len(), 6);
}

#[test]
fn visible_pieces_name_their_sections() {
    let mut image = Image::new();
    image
        .add_bytes(None, Ip(0x100), vec![0; 0x100], "a")
        .unwrap();
    image
        .add_bytes(None, Ip(0x180), vec![0; 0x10], "b")
        .unwrap();
    assert_eq!(
        image.visible(None),
        vec![
            (Ip(0x100), Ip(0x17f), 0),
            (Ip(0x180), Ip(0x18f), 1),
            (Ip(0x190), Ip(0x1ff), 0)
        ]
    );
}

#[test]
fn reads_cross_adjacent_sections_and_stop_at_gaps() {
    let mut image = Image::new();
    image.add_bytes(None, Ip(0x1000), vec![1; 4], "a").unwrap();
    image.add_bytes(None, Ip(0x1004), vec![2; 4], "b").unwrap();
    image.add_bytes(None, Ip(0x1009), vec![3; 4], "c").unwrap();
    assert_eq!(read(&image, ANY, 0x1002, 16), Ok(vec![1, 1, 2, 2, 2, 2]));
    assert_eq!(read(&image, ANY, 0x1009, 16), Ok(vec![3; 4]));
}

#[test]
fn sections_at_the_top_of_the_address_space() {
    let mut image = Image::new();
    image
        .add_bytes(None, Ip(u64::MAX - 3), vec![9; 4], "top")
        .unwrap();
    assert_eq!(read(&image, ANY, u64::MAX - 1, 8), Ok(vec![9, 9]));
    assert!(matches!(
        image.add_bytes(None, Ip(u64::MAX - 2), vec![0; 4], "over"),
        Err(ImageError::AddressOverflow { .. })
    ));
    assert!(matches!(
        image.add_bytes(None, Ip(0), vec![], "empty"),
        Err(ImageError::Empty { .. })
    ));
}

#[test]
fn cr3_spaces_fall_back_to_the_default_space() {
    let mut image = Image::new();
    image
        .add_bytes(None, Ip(0x1000), vec![0xd0; 8], "kernel")
        .unwrap();
    image
        .add_bytes(None, Ip(0x2000), vec![0xd1; 4], "shared")
        .unwrap();
    image
        .add_bytes(Some(Cr3(0xa000)), Ip(0x2000), vec![0xa0; 2], "proc a")
        .unwrap();
    image
        .add_bytes(Some(Cr3(0xb000)), Ip(0x3000), vec![0xb0; 4], "proc b")
        .unwrap();
    // A's own bytes first, then the default space's past their end.
    assert_eq!(
        read(&image, cr3(0xa000), 0x2000, 4),
        Ok(vec![0xa0, 0xa0, 0xd1, 0xd1])
    );
    assert_eq!(read(&image, cr3(0xa000), 0x1000, 1), Ok(vec![0xd0]));
    // B's sections are not A's.
    assert_eq!(
        read(&image, cr3(0xa000), 0x3000, 1),
        Err(MemoryError::Unmapped { addr: Ip(0x3000) })
    );
    assert_eq!(read(&image, cr3(0xb000), 0x3000, 1), Ok(vec![0xb0]));
    // No CR3, or one without sections: only the default space.
    assert_eq!(read(&image, ANY, 0x2000, 1), Ok(vec![0xd1]));
    assert_eq!(read(&image, cr3(0xc000), 0x2000, 1), Ok(vec![0xd1]));
    assert_eq!(
        read(&image, ANY, 0x3000, 1),
        Err(MemoryError::Unmapped { addr: Ip(0x3000) })
    );
    // CR3 bits 4:0 (not in PIP packets) are ignored.
    assert_eq!(read(&image, cr3(0xb01f), 0x3000, 1), Ok(vec![0xb0]));
}

/// Regression (found by the model test): a read that starts in the default
/// space must not run on over a section of the CR3's own further along.
#[test]
fn default_space_reads_stop_where_the_cr3s_own_section_starts() {
    let mut image = Image::new();
    image
        .add_bytes(None, Ip(0x100), vec![0xdd; 8], "kernel")
        .unwrap();
    image
        .add_bytes(Some(Cr3(0x1000)), Ip(0x104), vec![0xaa], "proc")
        .unwrap();
    assert_eq!(
        read(&image, cr3(0x1000), 0x100, 8),
        Ok(vec![0xdd, 0xdd, 0xdd, 0xdd, 0xaa, 0xdd, 0xdd, 0xdd])
    );
}

#[test]
fn the_last_hit_cache_survives_random_access() {
    let mut image = Image::new();
    for i in 0..64u64 {
        image
            .add_bytes(None, Ip(0x1_0000 + i * 0x100), vec![i as u8; 0x80], "s")
            .unwrap();
    }
    // Walk forwards, backwards and in strides; every hit and miss must be
    // right whatever the cache held before.
    let order: Vec<u64> = (0..64)
        .chain((0..64).rev())
        .chain((0..64).step_by(7))
        .collect();
    for i in order {
        let base = 0x1_0000 + i * 0x100;
        assert_eq!(read(&image, ANY, base + 0x7f, 1), Ok(vec![i as u8]));
        assert_eq!(
            read(&image, ANY, base + 0x80, 1),
            Err(MemoryError::Unmapped {
                addr: Ip(base + 0x80)
            })
        );
    }
}

#[test]
fn page_caches_read_across_pages_and_are_overridden() {
    let addrs: Vec<u8> = [0x40_0000u64, 0x40_1000, 0x40_3000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut dump = vec![0x11u8; 4096];
    dump.extend([0x22u8; 4096]);
    dump.extend([0x33u8; 4096]);
    let cache = PageCache::from_bytes(&addrs, dump).unwrap();
    let mut image = Image::new();
    assert_eq!(image.add_page_cache(None, cache, "pages"), 2);
    assert_eq!(
        read(&image, ANY, 0x40_0ffe, 4),
        Ok(vec![0x11, 0x11, 0x22, 0x22])
    );
    assert_eq!(read(&image, ANY, 0x40_1ffe, 4), Ok(vec![0x22, 0x22]));
    assert_eq!(read(&image, ANY, 0x40_3000, 1), Ok(vec![0x33]));
    // A later section over the middle of a page cuts the page short.
    image
        .add_bytes(None, Ip(0x40_0800), vec![0xee; 2], "patch")
        .unwrap();
    assert_eq!(
        read(&image, ANY, 0x40_07ff, 4),
        Ok(vec![0x11, 0xee, 0xee, 0x11])
    );
}

mod model {
    //! Random images and reads checked against a byte-by-byte model.

    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// (cr3 or default, address, length, fill seed)
    fn section() -> impl Strategy<Value = (Option<u64>, u64, usize, u8)> {
        (
            prop_oneof![Just(None), Just(Some(0x1000u64)), Just(Some(0x2000))],
            prop_oneof![0u64..0x200, (u64::MAX - 0x100)..=u64::MAX],
            0usize..0x40,
            any::<u8>(),
        )
    }

    proptest! {
        #[test]
        fn reads_match_a_byte_model(
            sections in proptest::collection::vec(section(), 0..24),
            reads in proptest::collection::vec(
                (prop_oneof![Just(None), Just(Some(0x1000u64)), Just(Some(0x3000))],
                 prop_oneof![0u64..0x240, (u64::MAX - 0x120)..=u64::MAX],
                 0usize..0x50),
                1..32),
        ) {
            let mut image = Image::new();
            let mut model: HashMap<(Option<u64>, u64), u8> = HashMap::new();
            for (i, &(cr3, addr, len, seed)) in sections.iter().enumerate() {
                let bytes: Vec<u8> =
                    (0..len).map(|k| seed.wrapping_add(k as u8).wrapping_mul(i as u8 | 1)).collect();
                let fits = len > 0 && addr.checked_add(len as u64 - 1).is_some();
                let added = image.add_bytes(cr3.map(Cr3), Ip(addr), bytes.clone(), "s");
                prop_assert_eq!(added.is_ok(), fits);
                if fits {
                    for (k, b) in bytes.iter().enumerate() {
                        model.insert((cr3, addr + k as u64), *b);
                    }
                }
            }
            for (cr3, addr, len) in reads {
                let space = cr3.map_or(AddressSpace::UNKNOWN, |c| AddressSpace::with_cr3(Cr3(c)));
                let mut want = Vec::new();
                for k in 0..len as u64 {
                    let Some(a) = addr.checked_add(k) else { break };
                    let byte = cr3
                        .and_then(|c| model.get(&(Some(c), a)))
                        .or_else(|| model.get(&(None, a)));
                    match byte {
                        Some(b) => want.push(*b),
                        None => break,
                    }
                }
                let got = read(&image, space, addr, len);
                if want.is_empty() && len > 0 {
                    prop_assert_eq!(got, Err(MemoryError::Unmapped { addr: Ip(addr) }));
                } else {
                    prop_assert_eq!(got, Ok(want));
                }
            }
        }
    }
}

#[test]
fn a_file_added_many_times_is_mapped_once() {
    let path = std::env::temp_dir().join(format!("hwtrace-image-once-{}", std::process::id()));
    std::fs::write(&path, (0u8..64).collect::<Vec<_>>()).unwrap();
    let mut image = Image::new();
    for (i, offset) in [0u64, 8, 16].into_iter().enumerate() {
        let spec = RawSpec {
            path: path.clone(),
            offset,
            size: Some(4),
            addr: Ip(0x1000 * (i as u64 + 1)),
            truncate: false,
        };
        image.add_raw(Some(Cr3(0x1000 * i as u64)), &spec).unwrap();
    }
    assert_eq!(image.sources.len(), 1);
    assert_eq!(read(&image, cr3(0x1000), 0x2000, 8), Ok(vec![8, 9, 10, 11]));
    assert_eq!(
        read(&image, cr3(0x2000), 0x3000, 8),
        Ok(vec![16, 17, 18, 19])
    );
    let _ = std::fs::remove_file(path);
}
