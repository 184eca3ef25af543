//! PDB function names on a real PE + PDB that clang (`-gcodeview`) and
//! lld-link build at test time, checked against `llvm-pdbutil`'s own dump
//! of the PDB; a PDB of another build is refused (exports are used), and
//! a corrupt one is an error naming it, not a panic.

use hwtrace_report::symbols::{Placement, Space, SymbolError, Symbolizer};
use hwtrace_types::Ip;
use object::{Object, ObjectSection};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `helper` is static: only the PDB names it (no export, and lld writes
/// no COFF symbol table into the image).
const PROGRAM: &str = r#"
static int helper(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * 3; return s; }
__declspec(dllexport) int exported_entry(int x) { return helper(x) + 1; }
__declspec(noinline) int second_func(int a, int b) { return a * b + helper(a); }
int main(void) { return exported_entry(5) + second_func(2, 3); }
"#;

/// Another build: its PDB has another GUID.
const OTHER: &str = r#"
__declspec(dllexport) int exported_entry(int x) { return x + 7; }
int main(void) { return exported_entry(1); }
"#;

/// Where the image is placed: not its link-time base, so the bias counts.
const LOAD: u64 = 0x7ff6_1230_0000;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-pdb-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn run(cmd: &mut Command, package: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} cannot run ({e}): install Debian package {package}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compiles `source` and links `dir/name.exe` with `dir/name.pdb`.
fn build(dir: &Path, name: &str, source: &str) -> (PathBuf, PathBuf) {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let obj = dir.join(format!("{name}.obj"));
    run(
        Command::new("clang")
            .args([
                "--target=x86_64-pc-windows-msvc",
                "-g",
                "-gcodeview",
                "-O0",
                "-c",
            ])
            .arg(&src)
            .arg("-o")
            .arg(&obj),
        "clang",
    );
    let exe = dir.join(format!("{name}.exe"));
    let pdb = dir.join(format!("{name}.pdb"));
    run(
        Command::new("lld-link")
            .args([
                "/debug",
                "/entry:main",
                "/subsystem:console",
                "/nodefaultlib",
            ])
            .arg(format!("/pdb:{}", pdb.display()))
            .arg(format!("/out:{}", exe.display()))
            .arg(&obj),
        "lld",
    );
    (exe, pdb)
}

/// A procedure as `llvm-pdbutil dump -symbols` shows it.
#[derive(Debug)]
struct Proc {
    name: String,
    section: usize,
    offset: u64,
    size: u64,
}

/// The `S_GPROC32`/`S_LPROC32` records and `S_PUB32` function records of
/// `pdb`, from llvm-pdbutil (an independent PDB reader).
fn pdbutil(pdb: &Path) -> (Vec<Proc>, Vec<Proc>) {
    let text = run(
        Command::new("llvm-pdbutil")
            .args(["dump", "-publics", "-symbols"])
            .arg(pdb),
        "llvm",
    );
    let lines: Vec<&str> = text.lines().collect();
    let (mut procs, mut publics) = (Vec::new(), Vec::new());
    for (i, line) in lines.iter().enumerate() {
        let is_proc = line.contains("S_GPROC32 ") || line.contains("S_LPROC32 ");
        let is_pub = line.contains("S_PUB32 ");
        if !is_proc && !is_pub {
            continue;
        }
        let name = line.split('`').nth(1).expect("a quoted name").to_owned();
        let next = lines[i + 1];
        if is_pub && !next.contains("function") {
            continue;
        }
        let addr = next
            .split("addr = ")
            .nth(1)
            .expect("addr = on the next line");
        let (sec, off) = addr.split_once(':').unwrap();
        let off: String = off.chars().take_while(char::is_ascii_digit).collect();
        let size = next
            .split("code size = ")
            .nth(1)
            .map_or(0, |s| s.trim().parse().unwrap());
        let p = Proc {
            name,
            section: sec.parse().unwrap(),
            offset: off.parse().unwrap(),
            size,
        };
        if is_proc {
            procs.push(p)
        } else {
            publics.push(p)
        }
    }
    (procs, publics)
}

/// The runtime address of `section:offset` of `exe` loaded at [`LOAD`].
fn runtime(exe: &Path, section: usize, offset: u64) -> Ip {
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sec = file.sections().nth(section - 1).unwrap();
    Ip(LOAD + (sec.address() - file.relative_address_base()) + offset)
}

fn load(exe: &Path, pdb: Option<&Path>) -> Symbolizer {
    let mut s = Symbolizer::new();
    if let Some(pdb) = pdb {
        s.set_pdb(exe, pdb);
    }
    s.add_file(exe, Placement::LowestAt(Ip(LOAD)), Space::ANY)
        .unwrap();
    s
}

fn object_pdb(s: &Symbolizer) -> Option<PathBuf> {
    let m = &s.modules()[0];
    s.object(m).unwrap().pdb().map(Path::to_path_buf)
}

#[test]
fn pdb_names_every_procedure_as_llvm_pdbutil_reads_it() {
    let d = dir("good");
    let (exe, pdb) = build(&d.0, "x", PROGRAM);
    let (procs, publics) = pdbutil(&pdb);
    let names: Vec<&str> = procs.iter().map(|p| p.name.as_str()).collect();
    for want in ["helper", "exported_entry", "second_func", "main"] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let s = load(&exe, None);
    assert!(s.problems().is_empty(), "{:?}", s.problems());
    assert_eq!(object_pdb(&s).as_deref(), Some(pdb.as_path()));
    for p in &procs {
        assert!(p.size > 0, "{p:?}");
        let start = runtime(&exe, p.section, p.offset);
        for at in [0, p.size / 2, p.size - 1] {
            let ip = Ip(start.0 + at);
            let f = s
                .function(Space::ANY, ip)
                .unwrap_or_else(|| panic!("{ip:?} in {p:?}"));
            assert_eq!((f.name, f.start, f.size), (p.name.as_str(), start, p.size));
            assert_eq!(
                s.name(Space::ANY, ip).unwrap(),
                format!("{}+{at:#x}", p.name)
            );
        }
        // One past the end is not this function any more.
        let after = s.function(Space::ANY, Ip(start.0 + p.size));
        assert_ne!(after.map(|f| f.name), Some(p.name.as_str()), "{p:?}");
    }
    // Every public function symbol names its own address.
    assert!(!publics.is_empty());
    for p in &publics {
        let ip = runtime(&exe, p.section, p.offset);
        assert_eq!(s.function(Space::ANY, ip).unwrap().name, p.name);
    }
}

#[test]
fn pdb_of_another_build_is_refused_and_exports_are_used() {
    let d = dir("mismatch");
    let (exe, pdb) = build(&d.0, "x", PROGRAM);
    let (procs, _) = pdbutil(&pdb);
    let helper = procs.iter().find(|p| p.name == "helper").unwrap();
    let exported = procs.iter().find(|p| p.name == "exported_entry").unwrap();
    // The right PDB, kept under another name for the explicit option.
    let right = d.0.join("right.pdb");
    std::fs::rename(&pdb, &right).unwrap();
    // Another build's PDB where the image (and its CodeView path) looks.
    let other = d.0.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let (_, other_pdb) = build(&other, "y", OTHER);
    std::fs::copy(&other_pdb, &pdb).unwrap();

    let s = load(&exe, None);
    assert_eq!(object_pdb(&s), None);
    let problems = s.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        matches!(&problems[0], SymbolError::PdbMismatch { path, image, .. } if *path == pdb && *image == exe),
        "{problems:?}"
    );
    let message = problems[0].to_string();
    assert!(message.contains("not the PDB of"), "{message}");
    assert!(message.contains(&pdb.display().to_string()), "{message}");
    // Fallback: the export names its code; `helper` has no name of its own.
    let entry = runtime(&exe, exported.section, exported.offset);
    assert_eq!(
        s.function(Space::ANY, entry).unwrap().name,
        "exported_entry"
    );
    let in_helper = Ip(runtime(&exe, helper.section, helper.offset).0 + 4);
    let name = s.name(Space::ANY, in_helper).unwrap();
    assert!(!name.starts_with("helper"), "{name}");
    assert_eq!(name, format!("exported_entry+{:#x}", in_helper.0 - entry.0));

    // The explicit PDB is the right one: it is used.
    let s = load(&exe, Some(&right));
    assert!(s.problems().is_empty(), "{:?}", s.problems());
    assert_eq!(object_pdb(&s).as_deref(), Some(right.as_path()));
    assert_eq!(s.function(Space::ANY, in_helper).unwrap().name, "helper");
}

#[test]
fn corrupt_pdb_is_an_error_naming_it() {
    let d = dir("corrupt");
    let (exe, pdb) = build(&d.0, "x", PROGRAM);
    let good = std::fs::read(&pdb).unwrap();
    let mut zeroed = good.clone();
    // The MSF superblock's block size and stream directory fields.
    zeroed[32..60].fill(0xff);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 3].to_vec()),
        ("superblock", zeroed),
        ("empty", Vec::new()),
        (
            "garbage",
            (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
    ];
    for (what, bytes) in cases {
        std::fs::write(&pdb, &bytes).unwrap();
        let s = load(&exe, None);
        assert_eq!(object_pdb(&s), None, "{what}");
        let problems = s.problems();
        assert_eq!(problems.len(), 1, "{what}: {problems:?}");
        assert!(
            matches!(&problems[0], SymbolError::Pdb { path, .. } if *path == pdb),
            "{what}: {problems:?}"
        );
        assert!(problems[0].to_string().contains(&pdb.display().to_string()));
        // The image's own symbols still name its exported function.
        assert!(
            s.modules()
                .iter()
                .filter_map(|m| s.object(m))
                .flat_map(|o| o.funcs())
                .any(|f| &*f.name == "exported_entry"),
            "{what}"
        );
    }
}

#[test]
fn a_pdb_in_memory_names_the_same_procedures_without_an_image() {
    let d = dir("bytes");
    let (exe, pdb) = build(&d.0, "x", PROGRAM);
    let (procs, publics) = pdbutil(&pdb);
    let bytes = std::fs::read(&pdb).unwrap();
    let funcs = hwtrace_report::symbols::pdb_functions(Path::new("x.pdb"), &bytes, LOAD).unwrap();
    assert!(funcs.windows(2).all(|w| w[0].addr <= w[1].addr), "sorted");
    for p in &procs {
        let at = runtime(&exe, p.section, p.offset).0;
        assert!(
            funcs
                .iter()
                .any(|f| (&*f.name, f.addr, f.size) == (p.name.as_str(), at, p.size)),
            "{p:?} at {at:#x} in {funcs:?}"
        );
    }
    for p in &publics {
        let at = runtime(&exe, p.section, p.offset).0;
        assert!(funcs.iter().any(|f| f.addr == at), "{p:?} in {funcs:?}");
    }
    // A truncated PDB is an error naming it.
    let e =
        hwtrace_report::symbols::pdb_functions(Path::new("cut.pdb"), &bytes[..100], 0).unwrap_err();
    assert!(
        matches!(&e, SymbolError::Pdb { path, .. } if path == Path::new("cut.pdb")),
        "{e:?}"
    );
}

/// A PDB whose DBI header's sizes overflow the `pdb` crate's offset
/// arithmetic (found by the `object_files` fuzz target, kept in
/// `testdata/fuzz/object_files`): a corrupt PDB, not a panic.
#[test]
fn a_pdb_the_reader_trips_on_is_reported_corrupt() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/fuzz/object_files/pdb-dbi-sizes-overflow");
    let input = std::fs::read(&path).unwrap();
    // The first byte picks the fuzz target's check; the PDB follows.
    let e =
        hwtrace_report::symbols::pdb_functions(Path::new("bad.pdb"), &input[1..], 0).unwrap_err();
    assert!(
        matches!(&e, SymbolError::Pdb { path, .. } if path == Path::new("bad.pdb")),
        "{e:?}"
    );
    assert!(e.to_string().starts_with("bad.pdb: corrupt PDB: "), "{e}");
}
