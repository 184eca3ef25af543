//! The benchmark inputs: real hardware traces from `../shared/corpus/real/`
//! repeated until the buffer is large enough. Each trace starts at a PSB, so
//! the repetition is a valid trace with the same mix of packets.

use anyhow::{Context, Result};
use std::path::PathBuf;

/// The folder of the real-trace corpus.
pub fn real_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HWTRACE_CORPUS") {
        return PathBuf::from(dir).join("real");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/real")
}

/// The three real traces concatenated and repeated to at least `min_bytes`.
pub fn real_traces_repeated(min_bytes: usize) -> Result<Vec<u8>> {
    let mut one = Vec::new();
    for case in ["foo", "Unzip", "icelake_tip"] {
        let path = real_dir().join(case).join("trace.pt");
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        one.extend_from_slice(&bytes);
    }
    let mut out = Vec::with_capacity(min_bytes + one.len());
    while out.len() < min_bytes {
        out.extend_from_slice(&one);
    }
    Ok(out)
}
