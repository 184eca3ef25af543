//! What to load, as the command lines say it.
//!
//! hwtrace's forms (every number hex, `0x` optional, `_` ignored):
//! - `FILE[:OFF[-SIZE]]@ADDR`: `SIZE` bytes of `FILE` from `OFF` (default:
//!   to the end) at `ADDR`;
//! - `FILE[@BIAS]`: an ELF file, each executable segment at `p_vaddr + BIAS`;
//! - `FILE[@BASE]`: a PE image at `BASE` (default: its `ImageBase`).
//!
//! libipt ptxed's forms (numbers as C's `strtoull(s, _, 0)` reads them:
//! decimal, `0x` hex, `0` octal):
//! - `--raw FILE[:FROM[-TO]]:BASE`;
//! - `--elf FILE[:BASE]`, `BASE` being where the lowest `PT_LOAD` segment goes.
//!
//! In both, a `:` suffix that is not a number stays part of the file name,
//! as in ptxed (a Windows drive letter, a colon in a path).

use super::SpecError;
use super::elf::{ElfPlacement, SegmentFilter};
use hwtrace_types::Ip;
use std::path::PathBuf;

/// A raw file (or a range of one) at an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawSpec {
    /// The file.
    pub path: PathBuf,
    /// First byte of the file to load.
    pub offset: u64,
    /// How many bytes; `None`: to the end of the file.
    pub size: Option<u64>,
    /// Where byte `offset` goes.
    pub addr: Ip,
    /// Whether a range past the end of the file is cut to the file
    /// (ptxed's behaviour) instead of refused.
    pub truncate: bool,
}

/// An ELF file and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfSpec {
    /// The file.
    pub path: PathBuf,
    /// Where its segments go.
    pub placement: ElfPlacement,
    /// Which segments to load.
    pub segments: SegmentFilter,
}

/// A PE image and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeSpec {
    /// The file.
    pub path: PathBuf,
    /// Where the image starts; `None`: at its `ImageBase`.
    pub base: Option<u64>,
    /// Which sections to load.
    pub sections: SegmentFilter,
}

/// One source of image sections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageSpec {
    /// A raw file.
    Raw(RawSpec),
    /// An ELF executable or shared object.
    Elf(ElfSpec),
    /// A PE image.
    Pe(PeSpec),
    /// A page cache folder holding `pages.addr` and `pages.dump`.
    Pages(PathBuf),
}

const IMAGE_FORM: &str = "FILE[:OFF[-SIZE]]@ADDR";
const PTXED_RAW_FORM: &str = "FILE[:FROM[-TO]]:BASE";

/// Parses a hex number: `0x` optional, `_` and WinDbg's `` ` `` ignored.
pub fn parse_hex(s: &str) -> Option<u64> {
    let digits: String = s.chars().filter(|c| *c != '_' && *c != '`').collect();
    let hex = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
        .unwrap_or(&digits);
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Parses hwtrace's `--image FILE[:OFF[-SIZE]]@ADDR`.
pub fn parse_image_arg(arg: &str) -> Result<RawSpec, SpecError> {
    let Some((file, addr)) = arg.rsplit_once('@') else {
        return Err(SpecError::MissingAddress {
            arg: arg.to_owned(),
            form: IMAGE_FORM,
        });
    };
    let addr = parse_hex(addr).ok_or_else(|| SpecError::BadNumber {
        arg: arg.to_owned(),
        what: "address",
        text: addr.to_owned(),
    })?;
    let (path, offset, size) = match file.rsplit_once(':') {
        Some((name, range)) => match parse_hex_range(range) {
            Some((offset, size)) => {
                if size == Some(0) {
                    return Err(SpecError::BadRange {
                        arg: arg.to_owned(),
                    });
                }
                (name, offset, size)
            }
            None => (file, 0, None),
        },
        None => (file, 0, None),
    };
    if path.is_empty() {
        return Err(SpecError::MissingFile {
            arg: arg.to_owned(),
        });
    }
    Ok(RawSpec {
        path: PathBuf::from(path),
        offset,
        size,
        addr: Ip(addr),
        truncate: false,
    })
}

/// `OFF` or `OFF-SIZE`, both hex.
fn parse_hex_range(s: &str) -> Option<(u64, Option<u64>)> {
    match s.split_once('-') {
        Some((off, size)) => Some((parse_hex(off)?, Some(parse_hex(size)?))),
        None => Some((parse_hex(s)?, None)),
    }
}

/// Splits `FILE@NUM` (hex); a suffix that is not a number stays in the name.
fn split_at_suffix(arg: &str) -> (&str, Option<u64>) {
    if let Some((file, num)) = arg.rsplit_once('@')
        && let Some(num) = parse_hex(num)
    {
        return (file, Some(num));
    }
    (arg, None)
}

/// Parses hwtrace's `--elf FILE[@BIAS]`: executable segments at
/// `p_vaddr + BIAS`.
pub fn parse_elf_arg(arg: &str) -> Result<ElfSpec, SpecError> {
    let (file, bias) = split_at_suffix(arg);
    if file.is_empty() {
        return Err(SpecError::MissingFile {
            arg: arg.to_owned(),
        });
    }
    Ok(ElfSpec {
        path: PathBuf::from(file),
        placement: ElfPlacement::Bias(bias.unwrap_or(0)),
        segments: SegmentFilter::Executable,
    })
}

/// Parses hwtrace's `--pe FILE[@BASE]`: executable sections at
/// `BASE + VirtualAddress` (default base: the image's `ImageBase`).
pub fn parse_pe_arg(arg: &str) -> Result<PeSpec, SpecError> {
    let (file, base) = split_at_suffix(arg);
    if file.is_empty() {
        return Err(SpecError::MissingFile {
            arg: arg.to_owned(),
        });
    }
    Ok(PeSpec {
        path: PathBuf::from(file),
        base,
        sections: SegmentFilter::Executable,
    })
}

/// A file argument of ptxed with its optional range (`--pt`,
/// `--pevent:primary`, and `--raw` before its base).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxedFile {
    /// The file.
    pub path: PathBuf,
    /// First byte to use.
    pub offset: u64,
    /// How many bytes; `None`: to the end of the file.
    pub size: Option<u64>,
}

/// Parses ptxed's `FILE[:FROM[-TO]]` exactly as its `preprocess_filename`
/// does: a `:FROM` or `:FROM-TO` suffix after the last `:` is a range if it
/// parses as numbers (C's `strtoull` base 0), else part of the name. `TO`
/// is exclusive and must exceed `FROM`; `FROM` alone means to the end (as
/// does a `FROM-TO` of size 0, which cannot happen).
pub fn parse_ptxed_file(arg: &str) -> Result<PtxedFile, SpecError> {
    let whole = |arg: &str| PtxedFile {
        path: PathBuf::from(arg),
        offset: 0,
        size: None,
    };
    let Some((name, range)) = arg.rsplit_once(':') else {
        return Ok(whole(arg));
    };
    match parse_c_range(range) {
        CRange::NotARange => Ok(whole(arg)),
        CRange::From(from) => Ok(PtxedFile {
            path: PathBuf::from(name),
            offset: from,
            size: None,
        }),
        CRange::FromTo(from, to) if to > from => Ok(PtxedFile {
            path: PathBuf::from(name),
            offset: from,
            size: Some(to - from),
        }),
        CRange::FromTo(..) => Err(SpecError::BadRange {
            arg: arg.to_owned(),
        }),
    }
}

/// Parses libipt ptxed's `--raw FILE[:FROM[-TO]]:BASE` exactly as ptxed
/// does: the text after the last `:` must be a number (the base); then the
/// rest is read by [`parse_ptxed_file`]. A range past the end of the file
/// is cut to it (libipt's `pt_mk_section`).
pub fn parse_ptxed_raw(arg: &str) -> Result<RawSpec, SpecError> {
    let Some((file, base)) = extract_base(arg) else {
        return Err(SpecError::MissingAddress {
            arg: arg.to_owned(),
            form: PTXED_RAW_FORM,
        });
    };
    let file = parse_ptxed_file(file).map_err(|_| SpecError::BadRange {
        arg: arg.to_owned(),
    })?;
    Ok(RawSpec {
        path: file.path,
        offset: file.offset,
        size: file.size,
        addr: Ip(base),
        truncate: true,
    })
}

/// Parses libipt ptxed's `--elf FILE[:BASE]`: all `PT_LOAD` segments with
/// file bytes, the lowest at `BASE`; without a base (or base 0) where the
/// file says. A suffix that is not a number stays in the name.
pub fn parse_ptxed_elf(arg: &str) -> ElfSpec {
    let (file, base) = extract_base(arg).unwrap_or((arg, 0));
    let placement = if base == 0 {
        ElfPlacement::Bias(0)
    } else {
        ElfPlacement::LowestAt(base)
    };
    ElfSpec {
        path: PathBuf::from(file),
        placement,
        segments: SegmentFilter::AllLoad,
    }
}

/// ptxed's `extract_base`: the number after the last `:`, if all of it is
/// one.
fn extract_base(arg: &str) -> Option<(&str, u64)> {
    let (file, num) = arg.rsplit_once(':')?;
    if num.is_empty() {
        return None;
    }
    let parsed = strtoull(num);
    (!parsed.overflow && parsed.rest.is_empty()).then_some((file, parsed.value))
}

/// ptxed's `parse_range` outcome.
#[derive(Debug, PartialEq, Eq)]
enum CRange {
    NotARange,
    From(u64),
    FromTo(u64, u64),
}

fn parse_c_range(s: &str) -> CRange {
    if s.is_empty() {
        return CRange::NotARange;
    }
    let begin = strtoull(s);
    if begin.overflow {
        return CRange::NotARange;
    }
    if begin.rest.is_empty() {
        return CRange::From(begin.value);
    }
    let Some(after) = begin.rest.strip_prefix('-') else {
        return CRange::NotARange;
    };
    let end = strtoull(after);
    if end.overflow || !end.rest.is_empty() {
        return CRange::NotARange;
    }
    CRange::FromTo(begin.value, end.value)
}

/// What C's `strtoull(s, &rest, 0)` gives.
#[derive(Debug, PartialEq, Eq)]
struct CNumber<'a> {
    value: u64,
    rest: &'a str,
    /// `errno == ERANGE`.
    overflow: bool,
}

/// C's `strtoull` with base 0: leading white space, an optional sign (a
/// minus negates modulo 2^64), then `0x` hex, `0` octal or decimal. With no
/// digits the value is 0 and `rest` is all of `s`.
fn strtoull(s: &str) -> CNumber<'_> {
    let bytes = s.as_bytes();
    let mut i = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r'))
        .unwrap_or(bytes.len());
    let negative = match bytes.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let has_hex_prefix = bytes.get(i) == Some(&b'0')
        && matches!(bytes.get(i + 1), Some(b'x' | b'X'))
        && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
    let (radix, start) = if has_hex_prefix {
        (16, i + 2)
    } else if bytes.get(i) == Some(&b'0') {
        (8, i)
    } else {
        (10, i)
    };
    let mut value: u64 = 0;
    let mut overflow = false;
    let mut end = start;
    while let Some(digit) = bytes.get(end).and_then(|b| char::from(*b).to_digit(radix)) {
        match value
            .checked_mul(u64::from(radix))
            .and_then(|v| v.checked_add(u64::from(digit)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        end += 1;
    }
    if end == start {
        return CNumber {
            value: 0,
            rest: s,
            overflow: false,
        };
    }
    if overflow {
        value = u64::MAX;
    } else if negative {
        value = value.wrapping_neg();
    }
    CNumber {
        value,
        rest: s.get(end..).unwrap_or(""),
        overflow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strtoull_follows_c() {
        let n = strtoull("0x1000");
        assert_eq!((n.value, n.rest, n.overflow), (0x1000, "", false));
        let n = strtoull("010");
        assert_eq!((n.value, n.rest), (8, ""));
        let n = strtoull("  42z");
        assert_eq!((n.value, n.rest), (42, "z"));
        let n = strtoull("0x");
        assert_eq!((n.value, n.rest), (0, "x"));
        let n = strtoull("09");
        assert_eq!((n.value, n.rest), (0, "9"));
        let n = strtoull("-1");
        assert_eq!((n.value, n.rest), (u64::MAX, ""));
        let n = strtoull("zz");
        assert_eq!((n.value, n.rest), (0, "zz"));
        let n = strtoull("0x10000000000000000");
        assert_eq!((n.value, n.overflow), (u64::MAX, true));
        let n = strtoull("");
        assert_eq!((n.value, n.rest), (0, ""));
    }

    #[test]
    fn image_arg_forms() {
        let s = parse_image_arg("a.bin@0x400000").unwrap();
        assert_eq!(
            (s.path, s.offset, s.size, s.addr, s.truncate),
            (PathBuf::from("a.bin"), 0, None, Ip(0x400000), false)
        );
        let s = parse_image_arg("a.bin:0x10@400000").unwrap();
        assert_eq!((s.offset, s.size, s.addr), (0x10, None, Ip(0x400000)));
        let s = parse_image_arg("a.bin:10-20@ffff_8000").unwrap();
        assert_eq!(
            (s.offset, s.size, s.addr),
            (0x10, Some(0x20), Ip(0xffff_8000))
        );
        // A colon suffix that is not a range stays in the name.
        let s = parse_image_arg("C:dir/a.bin@1000").unwrap();
        assert_eq!((s.path, s.offset), (PathBuf::from("C:dir/a.bin"), 0));
    }

    #[test]
    fn image_arg_errors_name_the_argument() {
        assert_eq!(
            parse_image_arg("a.bin"),
            Err(SpecError::MissingAddress {
                arg: "a.bin".into(),
                form: IMAGE_FORM
            })
        );
        assert_eq!(
            parse_image_arg("a.bin@zz"),
            Err(SpecError::BadNumber {
                arg: "a.bin@zz".into(),
                what: "address",
                text: "zz".into()
            })
        );
        assert_eq!(
            parse_image_arg("a.bin:10-0@1000"),
            Err(SpecError::BadRange {
                arg: "a.bin:10-0@1000".into()
            })
        );
        assert_eq!(
            parse_image_arg("@1000"),
            Err(SpecError::MissingFile {
                arg: "@1000".into()
            })
        );
        let msg = parse_image_arg("a.bin@").unwrap_err().to_string();
        assert!(msg.contains("a.bin@"), "{msg}");
    }

    #[test]
    fn elf_and_pe_args() {
        let e = parse_elf_arg("/lib/libc.so.6@7f0000000000").unwrap();
        assert_eq!(e.path, PathBuf::from("/lib/libc.so.6"));
        assert_eq!(e.placement, ElfPlacement::Bias(0x7f00_0000_0000));
        assert_eq!(e.segments, SegmentFilter::Executable);
        let e = parse_elf_arg("/bin/true").unwrap();
        assert_eq!(e.placement, ElfPlacement::Bias(0));
        let e = parse_elf_arg("odd@name").unwrap();
        assert_eq!(
            (e.path, e.placement),
            (PathBuf::from("odd@name"), ElfPlacement::Bias(0))
        );
        let p = parse_pe_arg("k.dll@0x180000000").unwrap();
        assert_eq!(
            (p.path, p.base),
            (PathBuf::from("k.dll"), Some(0x1_8000_0000))
        );
        assert_eq!(parse_pe_arg("k.dll").unwrap().base, None);
        assert!(parse_elf_arg("@10").is_err());
    }

    #[test]
    fn ptxed_raw_like_ptxed() {
        let s = parse_ptxed_raw("x.bin:0x1000").unwrap();
        assert_eq!(
            (s.path, s.offset, s.size, s.addr, s.truncate),
            (PathBuf::from("x.bin"), 0, None, Ip(0x1000), true)
        );
        // Decimal and octal bases, as strtoull reads them.
        assert_eq!(parse_ptxed_raw("x.bin:4096").unwrap().addr, Ip(4096));
        assert_eq!(parse_ptxed_raw("x.bin:010").unwrap().addr, Ip(8));
        let s = parse_ptxed_raw("x.bin:0x10:0x2000").unwrap();
        assert_eq!((s.offset, s.size, s.addr), (0x10, None, Ip(0x2000)));
        let s = parse_ptxed_raw("x.bin:0x10-0x30:0x2000").unwrap();
        assert_eq!((s.offset, s.size), (0x10, Some(0x20)));
        // TO must exceed FROM.
        assert!(matches!(
            parse_ptxed_raw("x.bin:0x30-0x10:0x2000"),
            Err(SpecError::BadRange { .. })
        ));
        // Not a range: part of the file name.
        let s = parse_ptxed_raw("c:x.bin:0x2000").unwrap();
        assert_eq!((s.path, s.offset), (PathBuf::from("c:x.bin"), 0));
        // The base is required and must be all number.
        for bad in ["x.bin", "x.bin:", "x.bin:0x10z", "x.bin:0x"] {
            assert!(
                matches!(parse_ptxed_raw(bad), Err(SpecError::MissingAddress { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn ptxed_file_ranges() {
        let f = parse_ptxed_file("t.pt").unwrap();
        assert_eq!((f.path, f.offset, f.size), (PathBuf::from("t.pt"), 0, None));
        let f = parse_ptxed_file("t.pt:16").unwrap();
        assert_eq!(
            (f.path, f.offset, f.size),
            (PathBuf::from("t.pt"), 16, None)
        );
        let f = parse_ptxed_file("t.pt:0x10-0x18").unwrap();
        assert_eq!((f.offset, f.size), (0x10, Some(8)));
        let f = parse_ptxed_file("dir:name.pt").unwrap();
        assert_eq!((f.path, f.offset), (PathBuf::from("dir:name.pt"), 0));
        let f = parse_ptxed_file("t.pt:").unwrap();
        assert_eq!(f.path, PathBuf::from("t.pt:"));
        assert!(matches!(
            parse_ptxed_file("t.pt:8-8"),
            Err(SpecError::BadRange { .. })
        ));
    }

    #[test]
    fn ptxed_elf_like_ptxed() {
        let e = parse_ptxed_elf("a.out");
        assert_eq!(
            (e.path, e.placement, e.segments),
            (
                PathBuf::from("a.out"),
                ElfPlacement::Bias(0),
                SegmentFilter::AllLoad
            )
        );
        let e = parse_ptxed_elf("a.out:0x400000");
        assert_eq!(
            (e.path, e.placement),
            (PathBuf::from("a.out"), ElfPlacement::LowestAt(0x400000))
        );
        assert_eq!(parse_ptxed_elf("a.out:0").placement, ElfPlacement::Bias(0));
        let e = parse_ptxed_elf("a:b");
        assert_eq!(
            (e.path, e.placement),
            (PathBuf::from("a:b"), ElfPlacement::Bias(0))
        );
    }
}
