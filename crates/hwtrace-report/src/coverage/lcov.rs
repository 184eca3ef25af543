//! lcov tracefiles (`.info`, what `genhtml` renders): per source file,
//! the hit count of every line DWARF's line table has code for in the
//! traced images.
//!
//! A line's count is the largest hit count among the blocks that
//! executed any of its instructions (a line split over a condition and
//! its body counts as often as its most executed part, like gcov's line
//! counts); a line of the line table that no block reached is written
//! with count 0. Images without DWARF contribute nothing.

use super::{Block, Coverage};
use crate::symbols::Symbolizer;
use std::collections::BTreeMap;
use std::io::{self, Write};

/// Line counts per source file.
pub type LineCounts = BTreeMap<String, BTreeMap<u32, u64>>;

/// The line counts of `cov` over `symbols`' DWARF.
pub fn line_counts(cov: &Coverage, symbols: &Symbolizer) -> LineCounts {
    // The blocks of each module, by start.
    let mut per_module: Vec<Vec<&Block>> = vec![Vec::new(); symbols.modules().len()];
    for b in &cov.blocks {
        if let Some(m) = symbols.module_index(b.space, b.start) {
            per_module[m].push(b);
        }
    }
    let mut out = LineCounts::new();
    for (module, mut blocks) in symbols.modules().iter().zip(per_module) {
        let lines = symbols.module_lines(module);
        if lines.is_empty() {
            continue;
        }
        blocks.sort_by_key(|b| b.start);
        let longest = blocks
            .iter()
            .map(|b| b.end.0.saturating_sub(b.start.0))
            .max()
            .unwrap_or(0);
        for r in lines {
            let (lo, hi) = (r.addr, r.addr.saturating_add(r.len.max(1)));
            // Blocks overlapping [lo, hi) start in (lo - longest, hi).
            let first = blocks.partition_point(|b| b.start.0 + longest <= lo);
            let hits = blocks[first..]
                .iter()
                .take_while(|b| b.start.0 < hi)
                .filter(|b| b.end.0 > lo)
                .map(|b| b.hits)
                .max()
                .unwrap_or(0);
            let count = out.entry(r.file).or_default().entry(r.line).or_insert(0);
            *count = (*count).max(hits);
        }
    }
    out
}

/// Writes `counts` as an lcov tracefile with test name `test`.
pub fn write(counts: &LineCounts, test: &str, out: &mut dyn Write) -> io::Result<()> {
    // Test names are [A-Za-z0-9_]: genhtml warns about others.
    let test: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    for (file, lines) in counts {
        writeln!(out, "TN:{test}")?;
        writeln!(out, "SF:{file}")?;
        for (line, hits) in lines {
            writeln!(out, "DA:{line},{hits}")?;
        }
        writeln!(out, "LF:{}", lines.len())?;
        writeln!(out, "LH:{}", lines.values().filter(|&&h| h > 0).count())?;
        writeln!(out, "end_of_record")?;
    }
    Ok(())
}
