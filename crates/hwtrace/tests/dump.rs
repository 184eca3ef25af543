//! `hwtrace dump` on real hardware traces and on broken input.

use std::path::{Path, PathBuf};
use std::process::Command;

fn hwtrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hwtrace"))
}

fn real(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/corpus/real")
        .join(case)
}

/// `(offset, packet name)` of every line of libipt's ptdump listing.
fn reference_packets(case: &str) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(real(case).join("reference/ptdump.txt")).unwrap();
    text.lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            let off = u64::from_str_radix(words.next().unwrap(), 16).unwrap();
            (off, words.next().unwrap().to_string())
        })
        .collect()
}

fn dump_json(trace: &Path, extra: &[&str]) -> (Vec<serde_json::Value>, Option<i32>) {
    let out = hwtrace()
        .arg("dump")
        .arg("--json")
        .args(extra)
        .arg(trace)
        .output()
        .unwrap();
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, out.status.code())
}

#[test]
fn real_traces_dump_like_libipt() {
    for case in ["foo", "Unzip", "icelake_tip"] {
        let (lines, code) = dump_json(&real(case).join("trace.pt"), &[]);
        assert_eq!(code, Some(0), "{case}: exit code");
        let ours: Vec<(u64, String)> = lines
            .iter()
            .map(|v| {
                assert!(v.get("error").is_none(), "{case}: {v}");
                (
                    v["offset"].as_u64().unwrap(),
                    v["kind"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let reference = reference_packets(case);
        assert_eq!(ours.len(), reference.len(), "{case}: packet count");
        for (o, r) in ours.iter().zip(&reference) {
            assert_eq!(o, r, "{case}");
        }
    }
}

#[test]
fn ips_are_reconstructed() {
    let (lines, _) = dump_json(&real("foo").join("trace.pt"), &[]);
    let first_pge = lines.iter().find(|v| v["kind"] == "tip.pge").unwrap();
    // ptdump: `tip.pge    3: 00007ffff78508e0`.
    assert_eq!(first_pge["ip"], "0x7ffff78508e0");
}

#[test]
fn corrupt_bytes_are_reported_and_decoding_resyncs() {
    let mut trace = std::fs::read(real("foo").join("trace.pt")).unwrap();
    // Break a packet right after the first PSB+ with a byte that is no
    // opcode (0xc9), then check the dump names the offset and goes on from
    // the next PSB.
    trace[0x3d] = 0xc9;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-dump-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("broken.pt");
    std::fs::write(&path, &trace).unwrap();
    let (lines, code) = dump_json(&path, &[]);
    assert_eq!(code, Some(2), "errors give exit code 2");
    let err = lines
        .iter()
        .find(|v| v.get("error").is_some())
        .expect("an error line");
    assert_eq!(err["offset"], 0x3d);
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .contains("unknown opcode 0xc9"),
        "{err}"
    );
    let resync = err["resync"].as_u64().unwrap();
    let reference = reference_packets("foo");
    assert!(
        reference.iter().any(|(o, n)| *o == resync && n == "psb"),
        "resynced at a real PSB"
    );
    // Everything from the resync point on is decoded as before.
    let after = lines
        .iter()
        .filter(|v| v.get("kind").is_some() && v["offset"].as_u64().unwrap() >= resync)
        .count();
    let expected = reference.iter().filter(|(o, _)| *o >= resync).count();
    assert_eq!(after, expected);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn text_listing_and_stats() {
    let out = hwtrace()
        .args(["dump", "--stats"])
        .arg(real("icelake_tip").join("trace.pt"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("0000000000000000  psb\n"), "{text}");
    assert!(text.contains("tnt.8      1"), "{text}");
    assert!(text.contains("errors: 0, bytes skipped: 0"), "{text}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let out = hwtrace()
        .args(["dump", "/nonexistent/trace.pt"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("cannot open /nonexistent/trace.pt"), "{err}");
}
