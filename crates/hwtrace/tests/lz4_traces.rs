//! Traces saved LZ4-compressed, as kAFL saves them (`traces/*.bin.lz4`,
//! python's `lz4.frame`; here compressed by Debian's `lz4`, the reference
//! implementation): every command reads them as the trace itself, and a
//! cut-short file is an error naming it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn foo() -> PathBuf {
    common::shared().join("real/foo")
}

/// `trace` compressed into `dir` (frames of 64 KiB blocks, as lz4.frame
/// writes by default, with a content checksum).
fn compress(trace: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("trace.pt.lz4");
    let status = Command::new("lz4")
        .args(["-q", "-f", "-B4", "--content-size"])
        .arg(trace)
        .arg(&out)
        .status()
        .expect("lz4 runs (Debian package lz4, scripts/setup.sh)");
    assert!(status.success());
    out
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hwtrace-lz4-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_compressed_trace_decodes_as_the_trace_itself() {
    let dir = scratch("same");
    let plain = foo().join("trace.pt");
    let packed = compress(&plain, &dir);
    assert!(std::fs::metadata(&packed).unwrap().len() < std::fs::metadata(&plain).unwrap().len());
    let pages = foo();
    let pages = pages.to_str().unwrap();
    for args in [
        vec!["ptdump"],
        vec!["flow", "--pages", pages, "--lenient", "--no-disasm"],
        vec![
            "flow",
            "--pages",
            pages,
            "--lenient",
            "--quiet",
            "--stats",
            "--jobs",
            "2",
        ],
    ] {
        let run = |trace: &Path| {
            let mut a = vec![args[0], trace.to_str().unwrap()];
            a.extend(&args[1..]);
            common::hwtrace(&a)
        };
        let (want, got) = (run(&plain), run(&packed));
        assert!(want.status.success(), "{args:?}: {want:?}");
        assert_eq!(got.status.code(), want.status.code(), "{args:?}");
        assert!(!want.stdout.is_empty(), "{args:?}");
        assert!(got.stdout == want.stdout, "{args:?}: the outputs differ");
    }
    // An answer, and libxdc's edge list (what a kAFL user compares).
    let edges = dir.join("edges.txt");
    let out = common::hwtrace(&[
        "coverage",
        packed.to_str().unwrap(),
        "--pages",
        pages,
        "--lenient",
        "--quiet",
        "--libxdc-edges",
        edges.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        std::fs::read(&edges).unwrap()
            == std::fs::read(foo().join("reference/libxdc-edges.txt")).unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cut_short_compressed_trace_is_an_error_naming_it() {
    let dir = scratch("cut");
    let packed = compress(&foo().join("trace.pt"), &dir);
    let bytes = std::fs::read(&packed).unwrap();
    let cut = dir.join("cut.pt.lz4");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = common::fails(&["ptdump", cut.to_str().unwrap()]);
    assert!(
        err.contains(&cut.display().to_string()) && err.contains("LZ4 frame file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
