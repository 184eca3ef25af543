//! `hwtrace coverage` through the command line: a perf.data recording
//! (`hwtrace record --portable`, real files in its MMAP2 records) gives
//! the same blocks and edges as the raw PT stream it holds decoded over
//! the same files with `--elf`, its drcov modules are the real files at
//! their load addresses, an intel_bts recording gives the blocks between
//! the branches `hwtrace perf decode` lists for it, and bad input is
//! refused with a message.
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`).

mod common;

use common::{fails, hwtrace, ok};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "hwtrace-coverage-cli-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn hex(v: &serde_json::Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// Blocks (start, end) → hits, and edges between them → hits.
type Blocks = BTreeMap<(u64, u64), u64>;
type Edges = BTreeMap<((u64, u64), (u64, u64)), u64>;

fn read_json(path: &str) -> (serde_json::Value, Blocks, Edges) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let keys: Vec<(u64, u64)> = v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (hex(&b["start"]), hex(&b["end"])))
        .collect();
    let blocks = v["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&keys)
        .map(|(b, k)| (*k, b["hits"].as_u64().unwrap()))
        .collect();
    let edges = v["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let at = |f: &str| keys[e[f].as_u64().unwrap() as usize];
            ((at("from"), at("to")), e["hits"].as_u64().unwrap())
        })
        .collect();
    (v, blocks, edges)
}

#[test]
fn perf_data_and_its_raw_stream_over_the_same_files_agree() {
    assert!(
        Path::new("/usr/bin/qemu-x86_64").exists(),
        "qemu-x86_64 missing: install Debian package qemu-user (scripts/setup.sh)"
    );
    let dir = Scratch::new("perf");
    let data = dir.path("echo.data");
    ok(&[
        "record",
        "--portable",
        "--pt",
        "-o",
        &data,
        "--",
        "/bin/echo",
        "cov",
    ]);
    let json = dir.path("perf.json");
    let drcov_path = dir.path("perf.drcov");
    let summary = ok(&["coverage", &data, "--json", &json, "--drcov", &drcov_path]);
    let (v, blocks, edges) = read_json(&json);
    assert!(blocks.len() > 100, "{summary}");
    // Every block is in one of the recorded files, named after it.
    let modules = v["modules"].as_array().unwrap();
    let paths: Vec<&str> = modules
        .iter()
        .map(|m| m["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"/bin/echo"), "{paths:?}");
    assert!(paths.iter().any(|p| p.contains("libc.so")), "{paths:?}");
    for b in v["blocks"].as_array().unwrap() {
        assert!(b["module"].is_u64(), "{b}");
        assert!(b["pid"].is_u64(), "{b}");
        assert!(b["symbol"].is_string(), "{b}");
    }
    let dr = drcov::from_file(&drcov_path).unwrap();
    let dr_paths: Vec<&str> = dr.modules.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(dr_paths, paths);
    assert_eq!(dr.basic_blocks.len(), blocks.len());

    // The same trace as raw PT over the same files, each at the base the
    // perf.data mapping gave it (these are all linked at 0).
    let raw = dir.path("echo.pt");
    ok(&["perf", "dump-aux", &data, "-o", &raw]);
    let mut args: Vec<String> = vec!["coverage".into(), raw.clone()];
    for m in modules {
        args.push("--elf".into());
        args.push(format!(
            "{}@{:x}",
            m["path"].as_str().unwrap(),
            hex(&m["base"])
        ));
    }
    let raw_json = dir.path("raw.json");
    args.extend(["--json".into(), raw_json.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ok(&args);
    let (_, raw_blocks, raw_edges) = read_json(&raw_json);
    assert_eq!(raw_blocks, blocks);
    assert_eq!(raw_edges, edges);

    // Without the files, each mapping decoding stopped in is named once,
    // and the exit code says the coverage is incomplete.
    let out = hwtrace(&["coverage", &data, "--sysroot", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let libc = err
        .lines()
        .filter(|l| l.contains("cannot decode code of /nonexistent/lib/x86_64-linux-gnu/libc.so.6"))
        .count();
    assert_eq!(libc, 1, "{err}");
    assert!(err.contains("decoding stopped"), "{err}");
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let err = fails(&["coverage"]);
    assert!(err.contains("TRACE"), "{err}");
    let dir = Scratch::new("bad");
    let trace = dir.path("t.pt");
    std::fs::write(&trace, [0u8; 32]).unwrap();
    let err = fails(&["coverage", &trace]);
    assert!(err.contains("needs the code it ran"), "{err}");
    let err = fails(&["coverage", &trace, "--bts", &trace]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = fails(&[
        "coverage",
        &trace,
        "--image",
        &format!("{trace}@1000"),
        "--drcov",
        "/nonexistent/dir/out.drcov",
    ]);
    assert!(
        err.contains("--drcov: cannot create /nonexistent/dir/out.drcov"),
        "{err}"
    );
}

/// An intel_bts perf.data (`hwtrace record --portable --bts`): the blocks
/// between consecutive branches and the edges between them, exactly as
/// the branches `hwtrace perf decode` lists for the same file give them.
#[test]
fn intel_bts_perf_data_gives_the_blocks_between_its_branches() {
    assert!(
        Path::new("/usr/bin/qemu-x86_64").exists(),
        "qemu-x86_64 missing: install Debian package qemu-user (scripts/setup.sh)"
    );
    let dir = Scratch::new("bts");
    let data = dir.path("bts.data");
    ok(&[
        "record",
        "--portable",
        "--bts",
        "-o",
        &data,
        "--",
        "/bin/echo",
        "bts",
    ]);
    // `tid cpu from -> to kind`, oldest first.
    let listed: Vec<(u64, u64)> = ok(&["perf", "decode", &data])
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w[3], "->", "{l}");
            let h = |s: &str| u64::from_str_radix(s, 16).unwrap();
            (h(w[2]), h(w[4]))
        })
        .collect();
    assert!(listed.len() > 1000, "{} branches", listed.len());
    let mut want_blocks = Blocks::new();
    let mut want_edges = Edges::new();
    let mut prev = None;
    for pair in listed.windows(2) {
        let key = (pair[0].1, pair[1].0 + 1);
        *want_blocks.entry(key).or_insert(0) += 1;
        if let Some(p) = prev.replace(key) {
            *want_edges.entry((p, key)).or_insert(0) += 1;
        }
    }
    let json = dir.path("bts.json");
    ok(&["coverage", &data, "--json", &json]);
    let (v, blocks, edges) = read_json(&json);
    assert_eq!(blocks, want_blocks);
    assert_eq!(edges, want_edges);
    assert!(
        v["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["module"].is_u64()),
        "a block outside the recorded files"
    );
}
