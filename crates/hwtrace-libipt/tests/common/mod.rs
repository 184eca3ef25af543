//! Shared helpers: where the corpus is, a tiny reader for the few `case.json` fields we need,
//! and ptdump-line normalisation.
#![allow(dead_code)]

use std::path::PathBuf;

/// `../shared/corpus` beside the repository (as CI lays it out), or `$HWTRACE_CORPUS`.
pub fn corpus() -> PathBuf {
    let dir = std::env::var_os("HWTRACE_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
        });
    assert!(
        dir.is_dir(),
        "corpus not found at {} (expected shared/ beside the repository, or set HWTRACE_CORPUS)",
        dir.display()
    );
    dir
}

pub fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

pub fn read_text(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The strings of the JSON array `"key": [ "a", "b" ]` in `json` (the corpus' case.json files
/// are flat and machine-written, so this small scan is enough and keeps the crate free of
/// JSON dependencies).
pub fn json_strings(json: &str, key: &str) -> Vec<String> {
    let needle = format!("\"{key}\":");
    let Some(start) = json.find(&needle) else {
        return Vec::new();
    };
    let rest = json[start + needle.len()..].trim_start();
    let Some(body) = rest.strip_prefix('[') else {
        return Vec::new();
    };
    let body = &body[..body.find(']').expect("unterminated array in case.json")];
    body.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The string value of `"key": "value"`, or `None` for `null`/missing.
pub fn json_string(json: &str, key: &str) -> Option<String> {
    let needle = format!("\"{key}\":");
    let rest = json[json.find(&needle)? + needle.len()..].trim_start();
    let body = rest.strip_prefix('"')?;
    Some(body[..body.find('"')?].to_owned())
}

/// A ptdump line as whitespace-separated tokens (libipt's own tests compare with `diff -b`).
pub fn tokens(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}
