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
