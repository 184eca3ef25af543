//! The checks of the `object_files` fuzz target, shared with hwtrace-report's
//! `tests/object_fuzz_regressions.rs`: arbitrary bytes as the files the
//! image options and the symboliser read.
//!
//! The first byte picks how the rest is read:
//! - 0: an ELF file loaded as an image (`--elf`, executable segments and
//!   every `PT_LOAD`, at its addresses and moved) and read back section
//!   by section;
//! - 1: a PE image loaded as an image (`--pe`, at its ImageBase and
//!   moved) and read back;
//! - 2: an object file's symbols and DWARF for the symboliser: function
//!   lookups, frames and line tables at addresses across its segments;
//! - 3: the image options' own syntax (`--image`, `--elf`, `--pe`,
//!   ptxed's `--raw`/`--elf`), each line of the input as one argument;
//! - 4: a QEMU `dump-guest-memory` ELF core (`--dump`): its regions read
//!   at both ends, and each vCPU's page tables walked from its CR3;
//! - 5: the headers of a `/proc/kcore` (`--kcore`): each segment holds
//!   its own first and last address;
//! - 6: a PDB (`--pdb`, or found beside a PE image): its functions, sorted;
//! - 7: `/proc/kallsyms` text (`--kallsyms`): each text symbol names its
//!   own address, and the symboliser, given the symbols as functions, names
//!   every address as kallsyms does.
//!
//! Nothing may panic; an image holds only bytes the file had (or zeros
//! past its end), every section reads whole.
//! [`check`] returns how many sections, symbols, frames and arguments it
//! got, so a test can tell a well-formed input from one refused at once.

use hwtrace_mem::image::{
    ElfPlacement, Image, SegmentFilter, kcore_segments, parse_elf_arg, parse_image_arg,
    parse_pe_arg, parse_ptxed_elf, parse_ptxed_file, parse_ptxed_raw,
};
use hwtrace_mem::paging::{PageTables, PagingConfig};
use hwtrace_mem::phys::ElfCore;
use hwtrace_report::symbols::{Dwarf, Kallsyms, ObjectInfo, Space, Symbolizer, pdb_functions};
use hwtrace_types::{AddressSpace, Ip, PhysAddr, PhysMemory, ReadMemory};
use std::path::Path;

/// Runs every check on one input; how many things it got.
pub fn check(data: &[u8]) -> usize {
    let Some((&kind, rest)) = data.split_first() else {
        return 0;
    };
    match kind % 8 {
        0 => elf_image(rest),
        1 => pe_image(rest),
        2 => symbols(rest),
        3 => image_args(rest),
        4 => qemu_core(rest),
        5 => kcore(rest),
        6 => pdb(rest),
        _ => kallsyms(rest),
    }
}

/// Reads every section of `image` back, in pieces of at most 4 KiB.
fn read_back(image: &Image) -> usize {
    let mut buf = [0u8; 4096];
    // Loaded without a CR3: every section is in the unknown space.
    let space = AddressSpace::UNKNOWN;
    for s in image.sections() {
        let n = s.len.min(buf.len() as u64) as usize;
        let got = image.read_memory(space, s.addr, &mut buf[..n]);
        assert!(got.is_ok_and(|k| k == n), "{}: {:?}", s.name, got);
        if s.len > 1 {
            let last = s.addr.0.checked_add(s.len - 1);
            assert!(last.is_some(), "{}: past the top of memory", s.name);
            let last = Ip(last.unwrap_or_default());
            assert_eq!(image.read_memory(space, last, &mut buf[..1]).ok(), Some(1));
        }
    }
    image.sections().len()
}

fn elf_image(data: &[u8]) -> usize {
    let mut got = 0;
    for placement in [
        ElfPlacement::Bias(0),
        ElfPlacement::LowestAt(0x5555_0000_0000),
    ] {
        for filter in [SegmentFilter::Executable, SegmentFilter::AllLoad] {
            let mut image = Image::new();
            let name = Path::new("fuzz.elf");
            if image
                .add_elf_bytes(None, name, data.to_vec(), placement, filter)
                .is_ok()
            {
                got += read_back(&image);
            }
        }
    }
    got
}

fn pe_image(data: &[u8]) -> usize {
    let mut got = 0;
    for base in [None, Some(0x1_4000_0000)] {
        for filter in [SegmentFilter::Executable, SegmentFilter::AllLoad] {
            let mut image = Image::new();
            let name = Path::new("fuzz.exe");
            if image
                .add_pe_bytes(None, name, data.to_vec(), base, filter)
                .is_ok()
            {
                got += read_back(&image);
            }
        }
    }
    got
}

fn symbols(data: &[u8]) -> usize {
    let mut got = 0;
    // A name with no PDB beside it: the symbols are the file's own.
    if let Ok(info) = ObjectInfo::parse(Path::new("/nonexistent/fuzz.obj"), data) {
        got += info.funcs().len() + info.segments().len();
        let mut probes: Vec<u64> = info.funcs().iter().take(64).map(|f| f.addr).collect();
        for s in info.segments().iter().take(16) {
            probes.extend([s.vaddr, s.vaddr.wrapping_add(s.mem_size / 2)]);
            let _ = info.vaddr_of_offset(s.offset);
            let _ = info.vaddr_of_offset(s.offset.wrapping_add(s.file_size));
        }
        probes.extend([0, 1, u64::MAX, info.lowest()]);
        for &p in &probes {
            if let Some(f) = info.func(p) {
                assert!(f.addr <= p, "{:#x} found for {p:#x}", f.addr);
                got += 1;
            }
        }
        if let Ok(Some(dwarf)) = Dwarf::parse(data) {
            for &p in probes.iter().take(32) {
                got += dwarf.frames(p).len();
                let _ = dwarf.line(p);
                got += dwarf.lines(p, p.saturating_add(0x1000)).len();
            }
        }
    }
    got
}

fn image_args(data: &[u8]) -> usize {
    let text = String::from_utf8_lossy(data);
    let mut got = 0;
    for arg in text.lines().take(64) {
        got += usize::from(parse_image_arg(arg).is_ok());
        got += usize::from(parse_elf_arg(arg).is_ok());
        got += usize::from(parse_pe_arg(arg).is_ok());
        got += usize::from(parse_ptxed_file(arg).is_ok());
        got += usize::from(parse_ptxed_raw(arg).is_ok());
        let _ = parse_ptxed_elf(arg);
    }
    got
}

fn qemu_core(data: &[u8]) -> usize {
    let Ok(core) = ElfCore::from_bytes(data.to_vec()) else {
        return 0;
    };
    let mut got = 0;
    let mut byte = [0u8; 1];
    for r in core.regions().iter().take(64) {
        // A region lies in the file: both its ends read.
        if r.len > 0 {
            assert!(core.read_phys(r.phys, &mut byte).is_ok(), "{r:?}");
            let last = PhysAddr(r.phys.0.saturating_add(r.len - 1));
            assert!(core.read_phys(last, &mut byte).is_ok(), "{r:?}");
            got += 1;
        }
    }
    for cpu in core.cpus().iter().take(8) {
        let config = PagingConfig {
            mode: cpu.paging_mode(),
            max_phys_addr: 46,
            nxe: true,
        };
        let tables = PageTables::new(&core, cpu.cr3(), config);
        for va in [cpu.rip, cpu.rsp, 0, 0xffff_8000_0000_0000] {
            got += usize::from(tables.translate(Ip(va)).is_ok());
        }
        got += tables.mappings_capped(64).take(4096).count();
    }
    got
}

fn kcore(data: &[u8]) -> usize {
    let Ok(segments) = kcore_segments(Path::new("fuzz-kcore"), data) else {
        return 0;
    };
    for s in &segments {
        let last = Ip(s.vaddr.0.wrapping_add(s.size - 1));
        assert!(s.contains(s.vaddr) && s.contains(last), "{s:?}");
    }
    segments.len()
}

fn pdb(data: &[u8]) -> usize {
    let Ok(funcs) = pdb_functions(Path::new("fuzz.pdb"), data, 0x1_4000_0000) else {
        return 0;
    };
    assert!(funcs.windows(2).all(|w| w[0].addr <= w[1].addr));
    // A PDB read whole counts even when it names no function.
    1 + funcs.len()
}

fn kallsyms(data: &[u8]) -> usize {
    let Ok(text) = std::str::from_utf8(data) else {
        return 0;
    };
    let Ok(k) = Kallsyms::parse(text) else {
        return 0;
    };
    let funcs = k.functions();
    let mut probes = vec![0, u64::MAX];
    for f in funcs.iter().take(64) {
        assert!(f.addr.checked_add(f.size).is_some(), "{f:?}");
        assert!(k.symbolize(f.addr).is_some(), "{f:?}");
        probes.extend([f.addr, f.addr.wrapping_sub(1), f.addr.wrapping_add(f.size)]);
    }
    let mut s = Symbolizer::new();
    s.add_symbol_list(Path::new("kallsyms"), Space::ANY, funcs);
    for at in probes {
        assert_eq!(s.name(Space::ANY, Ip(at)), k.symbolize(at), "at {at:#x}");
    }
    1 + k.len()
}
