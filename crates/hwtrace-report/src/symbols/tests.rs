//! The symboliser on a program gcc builds with DWARF, on a stripped copy
//! (`strip` from binutils), and on files that cannot be read.

use super::*;
use std::process::Command;

const PROGRAM: &str = r#"
static inline __attribute__((always_inline)) int square(int x) {
    return x * x;
}

int helper(int v) {
    return v + 1;
}

int main(int argc, char **argv) {
    volatile int n = argc;
    int s = square(n);
    return helper(s);
}
"#;

/// The line of `square`'s body in [`PROGRAM`].
const SQUARE_LINE: u32 = 3;

struct Built {
    dir: PathBuf,
    exe: PathBuf,
    stripped: PathBuf,
}

impl Drop for Built {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn build(tag: &str) -> Built {
    let dir = std::env::temp_dir().join(format!("hwtrace-symbols-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("t.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let exe = dir.join("t");
    let status = Command::new("gcc")
        .args(["-g", "-O0", "-fno-omit-frame-pointer", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("gcc runs (Debian package gcc)");
    assert!(status.success(), "gcc failed");
    let stripped = dir.join("t-stripped");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&exe)
        .status()
        .expect("strip runs (Debian package binutils)");
    assert!(status.success(), "strip failed");
    Built { dir, exe, stripped }
}

fn func_addr(info: &ObjectInfo, name: &str) -> u64 {
    info.funcs()
        .iter()
        .find(|f| &*f.name == name)
        .unwrap_or_else(|| panic!("{name} in the symbol table"))
        .addr
}

#[test]
fn symbols_lines_and_inlined_frames_of_a_program_with_dwarf() {
    let b = build("dwarf");
    let info = ObjectInfo::load(&b.exe).unwrap();
    assert_eq!(info.format(), FileFormat::Elf);
    let main = func_addr(&info, "main");
    let helper = func_addr(&info, "helper");
    let bias = 0x5555_0000_0000u64;
    let mut s = Symbolizer::new();
    s.add_file(&b.exe, Placement::Bias(bias), Space::ANY)
        .unwrap();
    let at = |link: u64| Ip(link + bias);
    assert_eq!(s.name(Space::ANY, at(main)).as_deref(), Some("main+0x0"));
    assert_eq!(
        s.name(Space::ANY, at(main + 4)).as_deref(),
        Some("main+0x4")
    );
    let f = s.function(Space::ANY, at(helper + 1)).unwrap();
    assert_eq!((f.name, f.start), ("helper", at(helper)));
    // Every instruction of main from `square`'s body has two frames:
    // square (inlined) inside main.
    let inlined: Vec<Vec<Frame>> = (main..main + f.size.max(64))
        .map(|a| s.frames(Space::ANY, at(a)))
        .filter(|fr| fr.len() == 2)
        .collect();
    assert!(!inlined.is_empty(), "no inlined frame found in main");
    let fr = &inlined[0];
    assert_eq!(fr[0].function.as_deref(), Some("square"));
    assert_eq!(fr[0].line, Some(SQUARE_LINE));
    assert_eq!(fr[1].function.as_deref(), Some("main"));
    assert!(fr[0].file.as_deref().is_some_and(|f| f.ends_with("t.c")));
    let (file, line) = s.line(Space::ANY, at(helper)).unwrap();
    assert!(file.ends_with("t.c"), "{file}");
    assert_eq!(line, 6, "helper's opening line");
    // The line table covers main and helper.
    let module = s.module(Space::ANY, at(main)).unwrap().clone();
    assert_eq!(module.base, Ip(bias + info.lowest()));
    let lines = s.module_lines(&module);
    for want in [SQUARE_LINE, 6, 7, 10, 11, 12, 13] {
        assert!(
            lines.iter().any(|r| r.line == want),
            "line {want} missing from {lines:?}"
        );
    }
    assert!(
        lines
            .iter()
            .all(|r| s.module(Space::ANY, Ip(r.addr)).is_some())
    );
    // Outside every image: nothing.
    assert_eq!(s.name(Space::ANY, Ip(0x10)), None);
    assert!(s.frames(Space::ANY, Ip(0x10)).is_empty());
}

#[test]
fn mappings_place_a_file_by_its_offsets_and_spaces_keep_processes_apart() {
    let b = build("maps");
    let info = ObjectInfo::load(&b.exe).unwrap();
    let main = func_addr(&info, "main");
    // The executable segment, as perf's MMAP2 record would give it.
    let text = *info
        .segments()
        .iter()
        .find(|seg| main.wrapping_sub(seg.vaddr) < seg.mem_size)
        .unwrap();
    let load = 0x7000_0000_0000u64;
    let mapping = |pid: u32, path: &Path| Mapping {
        path: path.to_path_buf(),
        cr3: None,
        pid: Some(pid),
        start: Ip(load + text.vaddr),
        len: text.mem_size,
        file_offset: text.offset,
    };
    let s = Symbolizer::from_mappings(&[mapping(1, &b.exe), mapping(2, &b.stripped)]);
    assert!(s.problems().is_empty(), "{:?}", s.problems());
    let one = Space {
        pid: Some(1),
        cr3: None,
    };
    let two = Space {
        pid: Some(2),
        cr3: None,
    };
    let ip = Ip(load + main + 1);
    assert_eq!(s.name(one, ip).as_deref(), Some("main+0x1"));
    // The stripped copy keeps .dynsym only: main is not there, so the
    // address is named by the file and its offset from the image base.
    assert_eq!(
        s.name(two, ip),
        Some(format!("t-stripped+{:#x}", main + 1 - info.lowest()))
    );
    assert!(s.frames(two, ip).is_empty());
    // A process with no mappings sees none.
    let three = Space {
        pid: Some(3),
        cr3: None,
    };
    assert_eq!(s.name(three, ip), None);
    assert_eq!(s.modules().len(), 2);
    assert_eq!(s.modules()[0].base, Ip(load + info.lowest()));
}

#[test]
fn unreadable_files_name_addresses_by_file_offset_and_are_reported() {
    let missing = PathBuf::from("/nonexistent/libgone.so");
    let s = Symbolizer::from_mappings(&[Mapping {
        path: missing.clone(),
        cr3: Some(Cr3(0x1000)),
        pid: None,
        start: Ip(0x40_1000),
        len: 0x1000,
        file_offset: 0x1000,
    }]);
    let space = Space {
        pid: None,
        cr3: Some(Cr3(0x1000)),
    };
    assert_eq!(
        s.name(space, Ip(0x40_1010)).as_deref(),
        Some("libgone.so+0x1010")
    );
    // Another CR3 does not see it.
    let other = Space {
        pid: None,
        cr3: Some(Cr3(0x2000)),
    };
    assert_eq!(s.name(other, Ip(0x40_1010)), None);
    assert!(matches!(s.problems(), [SymbolError::Read { path, .. }] if *path == missing));
    let mut s = Symbolizer::new();
    let text = std::env::temp_dir().join(format!("hwtrace-symbols-{}-text", std::process::id()));
    std::fs::write(&text, b"not an object file").unwrap();
    let err = s
        .add_file(&text, Placement::Bias(0), Space::ANY)
        .unwrap_err();
    assert!(matches!(err, SymbolError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("not an executable file"), "{err}");
    let _ = std::fs::remove_file(text);
}

/// A minimal PE32+ DLL: one `.text` section (RVA 0x1000, file offset
/// 0x200) with two exported functions, `alpha` at RVA 0x1000 and `beta`
/// at RVA 0x1010, ImageBase 0x180000000 (PE/COFF specification: DOS
/// stub, file header, optional header, section table, export directory).
fn tiny_dll() -> Vec<u8> {
    fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
    }
    let mut f = vec![0u8; 0x400];
    put(&mut f, 0, b"MZ");
    put(&mut f, 0x3c, &0x40u32.to_le_bytes());
    put(&mut f, 0x40, b"PE\0\0");
    // File header: x86-64, one section, a 240-byte optional header, DLL.
    put(&mut f, 0x44, &0x8664u16.to_le_bytes());
    put(&mut f, 0x46, &1u16.to_le_bytes());
    put(&mut f, 0x54, &240u16.to_le_bytes());
    put(&mut f, 0x56, &0x2022u16.to_le_bytes());
    // Optional header (PE32+).
    let o = 0x58;
    put(&mut f, o, &0x20bu16.to_le_bytes());
    put(&mut f, o + 4, &0x200u32.to_le_bytes()); // SizeOfCode
    put(&mut f, o + 16, &0x1000u32.to_le_bytes()); // AddressOfEntryPoint
    put(&mut f, o + 20, &0x1000u32.to_le_bytes()); // BaseOfCode
    put(&mut f, o + 24, &0x1_8000_0000u64.to_le_bytes()); // ImageBase
    put(&mut f, o + 32, &0x1000u32.to_le_bytes()); // SectionAlignment
    put(&mut f, o + 36, &0x200u32.to_le_bytes()); // FileAlignment
    put(&mut f, o + 40, &6u16.to_le_bytes()); // MajorOperatingSystemVersion
    put(&mut f, o + 48, &6u16.to_le_bytes()); // MajorSubsystemVersion
    put(&mut f, o + 56, &0x2000u32.to_le_bytes()); // SizeOfImage
    put(&mut f, o + 60, &0x200u32.to_le_bytes()); // SizeOfHeaders
    put(&mut f, o + 68, &3u16.to_le_bytes()); // Subsystem: console
    put(&mut f, o + 108, &16u32.to_le_bytes()); // NumberOfRvaAndSizes
    // Data directory 0: the export table.
    put(&mut f, o + 112, &0x1100u32.to_le_bytes());
    put(&mut f, o + 116, &0x60u32.to_le_bytes());
    // Section table.
    let s = o + 240;
    put(&mut f, s, b".text\0\0\0");
    put(&mut f, s + 8, &0x200u32.to_le_bytes()); // VirtualSize
    put(&mut f, s + 12, &0x1000u32.to_le_bytes()); // VirtualAddress
    put(&mut f, s + 16, &0x200u32.to_le_bytes()); // SizeOfRawData
    put(&mut f, s + 20, &0x200u32.to_le_bytes()); // PointerToRawData
    put(&mut f, s + 36, &0x6000_0020u32.to_le_bytes()); // code, execute, read
    // Section contents: RVA r is at file offset r - 0x1000 + 0x200.
    let at = |rva: usize| rva - 0x1000 + 0x200;
    put(&mut f, at(0x1000), &[0x90; 16]);
    put(&mut f, at(0x1010), &[0xc3]);
    let e = at(0x1100);
    put(&mut f, e + 12, &0x1150u32.to_le_bytes()); // Name
    put(&mut f, e + 16, &1u32.to_le_bytes()); // Base
    put(&mut f, e + 20, &2u32.to_le_bytes()); // NumberOfFunctions
    put(&mut f, e + 24, &2u32.to_le_bytes()); // NumberOfNames
    put(&mut f, e + 28, &0x1128u32.to_le_bytes()); // AddressOfFunctions
    put(&mut f, e + 32, &0x1130u32.to_le_bytes()); // AddressOfNames
    put(&mut f, e + 36, &0x1138u32.to_le_bytes()); // AddressOfNameOrdinals
    put(&mut f, at(0x1128), &0x1000u32.to_le_bytes());
    put(&mut f, at(0x112c), &0x1010u32.to_le_bytes());
    put(&mut f, at(0x1130), &0x1140u32.to_le_bytes());
    put(&mut f, at(0x1134), &0x1146u32.to_le_bytes());
    put(&mut f, at(0x1138), &[0, 0, 1, 0]);
    put(&mut f, at(0x1140), b"alpha\0beta\0");
    put(&mut f, at(0x1150), b"t.dll\0");
    f
}

#[test]
fn pe_exports_name_code_up_to_the_next_export() {
    let path = std::env::temp_dir().join(format!("hwtrace-symbols-{}-t.dll", std::process::id()));
    std::fs::write(&path, tiny_dll()).unwrap();
    let info = ObjectInfo::load(&path).unwrap();
    assert_eq!(info.format(), FileFormat::Pe);
    assert_eq!(info.lowest(), 0x1_8000_0000);
    let names: Vec<(&str, u64, u64)> = info
        .funcs()
        .iter()
        .map(|f| (&*f.name, f.addr, f.size))
        .collect();
    // Sizeless exports reach the next one, the last the section's end.
    assert_eq!(
        names,
        [
            ("alpha", 0x1_8000_1000, 0x10),
            ("beta", 0x1_8000_1010, 0x1f0)
        ]
    );
    // At its ImageBase.
    let mut s = Symbolizer::new();
    s.add_file(&path, Placement::Bias(0), Space::ANY).unwrap();
    assert_eq!(
        s.name(Space::ANY, Ip(0x1_8000_1004)).as_deref(),
        Some("alpha+0x4")
    );
    assert_eq!(
        s.name(Space::ANY, Ip(0x1_8000_1020)).as_deref(),
        Some("beta+0x10")
    );
    // Relocated: mapped by its section's file offset elsewhere.
    let s = Symbolizer::from_mappings(&[Mapping {
        path: path.clone(),
        cr3: None,
        pid: None,
        start: Ip(0x7ff0_0000_1000),
        len: 0x200,
        file_offset: 0x200,
    }]);
    assert_eq!(s.modules()[0].base, Ip(0x7ff0_0000_0000));
    assert_eq!(
        s.name(Space::ANY, Ip(0x7ff0_0000_1011)).as_deref(),
        Some("beta+0x1")
    );
    let _ = std::fs::remove_file(path);
}

/// Compiles `source` (file `name` in a scratch folder) with `compiler`
/// and `args`, then `check`s the symbols of the program.
fn with_program(
    compiler: &str,
    package: &str,
    name: &str,
    source: &str,
    args: &[&str],
    check: impl FnOnce(&Path),
) {
    let dir =
        std::env::temp_dir().join(format!("hwtrace-symbols-{}-{compiler}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let exe = dir.join("demo");
    let status = Command::new(compiler)
        .args(args)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} runs (Debian package {package}): {e}"));
    assert!(status.success(), "{compiler} failed");
    check(&exe);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Looks `name` up in the symbol table of `exe` and at that address in a
/// symboliser: both say `name`.
fn named(exe: &Path, name: &str) {
    let info = ObjectInfo::load(exe).unwrap();
    let addr = func_addr(&info, name);
    let mut s = Symbolizer::new();
    s.add_file(exe, Placement::Bias(0), Space::ANY).unwrap();
    let f = s.function(Space::ANY, Ip(addr)).unwrap();
    assert_eq!(f.name, name);
    assert_eq!(
        s.name(Space::ANY, Ip(addr + 1)).as_deref(),
        Some(format!("{name}+0x1").as_str())
    );
    let frames = s.frames(Space::ANY, Ip(addr));
    assert!(
        frames.iter().any(|f| f.function.as_deref() == Some(name)),
        "no DWARF frame named {name}: {frames:?}"
    );
}

#[test]
fn cpp_and_rust_names_are_demangled() {
    // `_ZN12hwtrace_demo7Counter4stepEi` in the symbol table.
    let cpp = r#"
namespace hwtrace_demo {
struct Counter { int step(int by); };
__attribute__((noinline)) int Counter::step(int by) { return by + 1; }
}
int main(int argc, char **) { hwtrace_demo::Counter c; return c.step(argc); }
"#;
    with_program("clang++", "clang", "demo.cpp", cpp, &["-g", "-O0"], |exe| {
        named(exe, "hwtrace_demo::Counter::step(int)");
        named(exe, "main");
    });
    // `_ZN12hwtrace_demo4deep6answer17h…E`: the path, without its hash.
    let rust = r#"
mod deep {
    #[inline(never)]
    pub fn answer(x: u64) -> u64 {
        x * 3 + 1
    }
}
fn main() {
    std::process::exit(deep::answer(std::hint::black_box(2)) as i32);
}
"#;
    with_program(
        "rustc",
        "rustc (the toolchain running the tests)",
        "demo.rs",
        rust,
        &["-g", "-C", "opt-level=0", "--crate-name", "hwtrace_demo"],
        |exe| named(exe, "hwtrace_demo::deep::answer"),
    );
}

#[test]
fn a_symbol_list_names_the_kernel_mapping_it_covers() {
    // perf's kernel mapping has no readable file: alone, it names
    // addresses `[kernel.kallsyms]_text+0xoff`.
    let kernel = Mapping {
        path: PathBuf::from("[kernel.kallsyms]_text"),
        cr3: None,
        pid: None,
        start: Ip(0xffff_ffff_8100_0000),
        len: 0x2000,
        file_offset: 0,
    };
    let mut s = Symbolizer::from_mappings(std::slice::from_ref(&kernel));
    let user = Space {
        pid: Some(7),
        cr3: None,
    };
    assert_eq!(
        s.name(user, Ip(0xffff_ffff_8100_0105)).as_deref(),
        Some("[kernel.kallsyms]_text+0x105")
    );
    let func = |addr: u64, size: u64, name: &str| Func {
        addr,
        size,
        name: name.into(),
    };
    let list = vec![
        func(0xffff_ffff_8100_0100, 0x80, "helper"),
        func(0xffff_ffff_8100_0000, 0x100, "start_kernel"),
        // A second name at one address: the first given is kept.
        func(0xffff_ffff_8100_0000, 0x100, "_text"),
    ];
    s.add_symbol_list(Path::new("kallsyms"), Space::ANY, list);
    assert_eq!(
        s.name(user, Ip(0xffff_ffff_8100_0105)).as_deref(),
        Some("helper+0x5")
    );
    assert_eq!(
        s.name(Space::ANY, Ip(0xffff_ffff_8100_0000)).as_deref(),
        Some("start_kernel+0x0")
    );
    let f = s.function(user, Ip(0xffff_ffff_8100_0110)).unwrap();
    assert_eq!(
        (f.name, f.start, f.size),
        ("helper", Ip(0xffff_ffff_8100_0100), 0x80)
    );
    let module = s.module(user, Ip(0xffff_ffff_8100_0110)).unwrap();
    assert_eq!(
        (module.name.as_str(), module.base),
        ("kallsyms", Ip(0xffff_ffff_8100_0000))
    );
    assert_eq!(s.object(module).unwrap().format(), FileFormat::SymbolList);
    assert!(s.frames(user, Ip(0xffff_ffff_8100_0110)).is_empty());
    // Past the list's last function the perf mapping names it again.
    assert_eq!(
        s.name(user, Ip(0xffff_ffff_8100_0190)).as_deref(),
        Some("[kernel.kallsyms]_text+0x190")
    );
    // An empty list adds nothing.
    let before = s.modules().len();
    s.add_symbol_list(Path::new("empty"), Space::ANY, Vec::new());
    assert_eq!(s.modules().len(), before);
}
