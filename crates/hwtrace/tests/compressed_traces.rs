//! Compressed traces: LZ4 as kAFL saves them (`traces/*.bin.lz4`,
//! python's `lz4.frame`; here compressed by Debian's `lz4`, the reference
//! implementation), zstd and gzip as their own tools write them. Every
//! command reads them as the trace itself, a cut-short file is an error
//! naming it, and xz or bzip2 files are refused by name.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn foo() -> PathBuf {
    common::shared().join("real/foo")
}

/// `trace` compressed into `dir` (frames of 64 KiB blocks, as lz4.frame
/// writes by default, with a content checksum).
fn compress(trace: &Path, dir: &Path) -> PathBuf {
    compress_with("lz4", LZ4_ARGS, trace, dir, "trace.pt.lz4")
}

/// Debian's `lz4` writing as kAFL's python `lz4.frame` does (to standard
/// output).
const LZ4_ARGS: &[&str] = &["-q", "-c", "-B4", "--content-size"];

/// `trace` compressed by `tool ARGS` (writing to standard output) into
/// `dir/name`.
fn compress_with(tool: &str, args: &[&str], trace: &Path, dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let run = Command::new(tool)
        .args(args)
        .arg(trace)
        .output()
        .unwrap_or_else(|e| panic!("{tool} runs (scripts/setup.sh installs it): {e}"));
    assert!(run.status.success(), "{tool}: {run:?}");
    std::fs::write(&out, run.stdout).unwrap();
    out
}

fn scratch(name: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-lz4-{}-{name}", std::process::id()));
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
fn zstd_and_gzip_traces_decode_as_the_trace_itself() {
    let dir = scratch("zstd-gzip");
    let plain = foo().join("trace.pt");
    let pages = foo();
    let pages = pages.to_str().unwrap();
    let zst = compress_with("zstd", &["-q", "-c", "-19"], &plain, &dir, "trace.pt.zst");
    let gz = compress_with("gzip", &["-c", "-9"], &plain, &dir, "trace.pt.gz");
    // Two zstd frames one after the other, and two gzip members: what
    // `cat a.zst b.zst` makes, one stream of both traces.
    let twice = |name: &str, part: &Path| {
        let p = dir.join(name);
        let b = std::fs::read(part).unwrap();
        std::fs::write(&p, [b.clone(), b].concat()).unwrap();
        p
    };
    let zst2 = twice("twice.pt.zst", &zst);
    let gz2 = twice("twice.pt.gz", &gz);
    let plain2 = dir.join("twice.pt");
    let b = std::fs::read(&plain).unwrap();
    std::fs::write(&plain2, [b.clone(), b].concat()).unwrap();
    for (want, got) in [
        (&plain, &zst),
        (&plain, &gz),
        (&plain2, &zst2),
        (&plain2, &gz2),
    ] {
        for args in [
            vec!["ptdump"],
            vec!["flow", "--pages", pages, "--lenient", "--quiet", "--stats"],
        ] {
            let run = |trace: &Path| {
                let mut a = vec![args[0], trace.to_str().unwrap()];
                a.extend(&args[1..]);
                common::hwtrace(&a)
            };
            // Standard error names the file given.
            let err = |o: &std::process::Output, p: &Path| {
                String::from_utf8_lossy(&o.stderr).replace(p.to_str().unwrap(), "TRACE")
            };
            let (w, g) = (run(want), run(got));
            assert!(w.status.success(), "{args:?}: {w:?}");
            assert!(!w.stdout.is_empty() || !w.stderr.is_empty(), "{args:?}");
            assert_eq!(g.status.code(), w.status.code(), "{got:?} {args:?}");
            assert!(g.stdout == w.stdout, "{got:?} {args:?}: the outputs differ");
            assert_eq!(err(&g, got), err(&w, want), "{got:?} {args:?}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cut_short_compressed_traces_are_errors_naming_them() {
    let dir = scratch("cut");
    let plain = foo().join("trace.pt");
    for (tool, args, name, what) in [
        ("lz4", LZ4_ARGS, "trace.pt.lz4", "LZ4 frame file"),
        ("zstd", &["-q", "-c"][..], "trace.pt.zst", "zstd file"),
        ("gzip", &["-c"][..], "trace.pt.gz", "gzip file"),
    ] {
        let packed = compress_with(tool, args, &plain, &dir, name);
        let bytes = std::fs::read(&packed).unwrap();
        let cut = dir.join(format!("cut-{name}"));
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = common::fails(&["ptdump", cut.to_str().unwrap()]);
        assert!(
            err.contains(&cut.display().to_string()) && err.contains(what),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn xz_and_bzip2_traces_are_refused_by_name() {
    let dir = scratch("xz-bzip2");
    let plain = foo().join("trace.pt");
    for (tool, name, what) in [
        ("xz", "trace.pt.xz", "xz"),
        ("bzip2", "trace.pt.bz2", "bzip2"),
    ] {
        let packed = compress_with(tool, &["-c"], &plain, &dir, name);
        let err = common::fails(&["flow", packed.to_str().unwrap(), "--pages", "."]);
        assert!(
            err.contains(&packed.display().to_string())
                && err.contains(&format!("an {what}-compressed file")),
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `hwtrace ARGS…` reading `input` from a pipe (`cat INPUT | hwtrace …`):
/// standard input cannot be mapped, so it is copied as it streams in.
fn piped(input: &Path, args: &[&str]) -> std::process::Output {
    let mut cat = Command::new("cat")
        .arg(input)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .stdin(cat.stdout.take().unwrap())
        .output()
        .unwrap();
    assert!(cat.wait().unwrap().success());
    out
}

#[test]
fn standard_input_and_pipes_read_as_the_trace_itself() {
    let dir = scratch("stdin");
    let plain = foo().join("trace.pt");
    let gz = compress_with("gzip", &["-c"], &plain, &dir, "trace.pt.gz");
    let pages = foo();
    let pages = pages.to_str().unwrap();
    let p = plain.to_str().unwrap();
    for (file_args, pipe_args) in [
        (vec!["dump", p], vec!["dump", "-"]),
        (vec!["ptdump", p], vec!["ptdump", "-"]),
        (
            vec!["flow", p, "--pages", pages, "--lenient", "--no-disasm"],
            vec!["flow", "-", "--pages", pages, "--lenient", "--no-disasm"],
        ),
        // A named pipe given as a file: /dev/stdin.
        (vec!["ptdump", p], vec!["ptdump", "/dev/stdin"]),
    ] {
        let want = common::hwtrace(&file_args);
        assert!(
            want.status.success() && !want.stdout.is_empty(),
            "{file_args:?}"
        );
        for input in [&plain, &gz] {
            let got = piped(input, &pipe_args);
            assert_eq!(
                got.status.code(),
                want.status.code(),
                "{pipe_args:?} {input:?}"
            );
            assert!(
                got.stdout == want.stdout,
                "{pipe_args:?} {input:?}: outputs differ"
            );
        }
    }
    // A file redirected to standard input is mapped as it is; a device is
    // refused (/dev/zero would fill the disk it was copied to).
    for (args, input) in [(vec!["dump", p], &plain), (vec!["ptdump", p], &gz)] {
        let want = common::hwtrace(&args);
        let got = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
            .args([args[0], "-"])
            .stdin(std::fs::File::open(input).unwrap())
            .output()
            .unwrap();
        assert!(got.stdout == want.stdout, "{args:?} < {input:?}");
    }
    let zero = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(["dump", "-"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&zero.stderr);
    assert!(
        !zero.status.success() && err.contains("is a device"),
        "{err}"
    );
    // Nothing on standard input: no trace, said as for an empty file.
    let empty = dir.join("empty.pt");
    std::fs::write(&empty, b"").unwrap();
    let want = common::hwtrace(&["dump", empty.to_str().unwrap()]);
    let got = piped(&empty, &["dump", "-"]);
    assert_eq!(got.status.code(), want.status.code());
    assert_eq!(got.stdout, want.stdout);
    std::fs::remove_dir_all(&dir).unwrap();
}
