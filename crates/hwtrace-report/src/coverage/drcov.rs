//! drcov files (DynamoRIO's coverage format, which Lighthouse,
//! Cartographer, bncov and lighthouse-style plugins load): a text header,
//! a module table, and a binary table of basic blocks.
//!
//! ```text
//! DRCOV VERSION: 2
//! DRCOV FLAVOR: drcov-hwtrace
//! Module Table: version 2, count N
//! Columns: id, base, end, entry, path
//!   0, 0x..., 0x..., 0x..., /usr/bin/gzip
//! BB Table: M bbs
//! <M × { u32 start (from the module's base), u16 size, u16 module id }, little-endian>
//! ```
//!
//! A module is an image of the symboliser (a file mapped at one bias in
//! one address space; its base is where the file's lowest address
//! landed, so offsets are the file's own as a disassembler shows them).
//! Code in no image gets a module `[unknown]` per 4 GiB region and
//! address space. Each block is written once (drcov has no hit counts);
//! a block longer than 65535 bytes is written in pieces.

use super::Coverage;
use crate::symbols::{Space, Symbolizer};
use hwtrace_types::Ip;
use std::collections::HashMap;
use std::io::{self, Write};

/// One row of the module table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrcovModule {
    /// The file (or `[unknown]`).
    pub path: String,
    /// Its base: block offsets count from here.
    pub base: Ip,
    /// One past its last mapped byte.
    pub end: Ip,
    /// Its entry point (0 when not known).
    pub entry: Ip,
}

/// One row of the block table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DrcovBlock {
    /// Offset of the first byte from the module's base.
    pub offset: u32,
    /// Size in bytes.
    pub size: u16,
    /// Index in the module table.
    pub module: u16,
}

/// What a drcov file holds, before it is written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrcovTable {
    /// The module table.
    pub modules: Vec<DrcovModule>,
    /// The block table.
    pub blocks: Vec<DrcovBlock>,
    /// For each block of the coverage, its module's index (`None`: it
    /// was dropped).
    pub module_of: Vec<Option<u16>>,
    /// Blocks that could not be written: more than 65535 modules, or
    /// more than 4 GiB above their module's base.
    pub dropped: u64,
}

/// Lays `cov` out as a drcov table over `symbols`' images.
pub fn table(cov: &Coverage, symbols: &Symbolizer) -> DrcovTable {
    let mut t = DrcovTable::default();
    // Symboliser modules keep their order; unknown regions follow.
    let mut known: HashMap<usize, u16> = HashMap::new();
    let mut unknown: HashMap<(Space, u64), usize> = HashMap::new();
    let mut unknown_rows: Vec<(Space, u64, u64)> = Vec::new();
    let mut placed: Vec<(Option<usize>, Option<usize>)> = Vec::with_capacity(cov.blocks.len());
    for b in &cov.blocks {
        let module = symbols.module_index(b.space, b.start);
        if module.is_some() {
            placed.push((module, None));
            continue;
        }
        let region = b.start.0 >> 32;
        let n = *unknown.entry((b.space, region)).or_insert_with(|| {
            unknown_rows.push((b.space, u64::MAX, 0));
            unknown_rows.len() - 1
        });
        let row = &mut unknown_rows[n];
        row.1 = row.1.min(b.start.0 & !0xfff);
        row.2 = row.2.max(b.end.0);
        placed.push((None, Some(n)));
    }
    for (i, m) in symbols.modules().iter().enumerate() {
        let Ok(id) = u16::try_from(t.modules.len()) else {
            break;
        };
        known.insert(i, id);
        t.modules.push(DrcovModule {
            // One line per module: a newline in a name would end it.
            path: m.path.display().to_string().replace(['\n', '\r'], "?"),
            base: m.base,
            end: m.end.max(m.base),
            entry: symbols
                .object(m)
                .and_then(|o| o.entry())
                .map_or(Ip(0), |e| Ip(e.wrapping_add(m.bias))),
        });
    }
    let mut unknown_ids: Vec<Option<u16>> = Vec::new();
    for &(_, base, end) in &unknown_rows {
        let id = u16::try_from(t.modules.len()).ok();
        if id.is_some() {
            t.modules.push(DrcovModule {
                path: "[unknown]".to_owned(),
                base: Ip(base),
                end: Ip(end),
                entry: Ip(0),
            });
        }
        unknown_ids.push(id);
    }
    for (b, (module, region)) in cov.blocks.iter().zip(placed) {
        let id = match (module, region) {
            (Some(m), _) => known.get(&m).copied(),
            (None, Some(r)) => unknown_ids[r],
            (None, None) => None,
        };
        t.module_of.push(id);
        let Some(id) = id else {
            t.dropped += 1;
            continue;
        };
        let base = t.modules[id as usize].base.0;
        let mut start = b.start.0;
        let end = b.end.0.max(start + 1);
        while start < end {
            let Ok(offset) = u32::try_from(start.wrapping_sub(base)) else {
                t.dropped += 1;
                break;
            };
            let size = u16::try_from(end - start).unwrap_or(u16::MAX);
            t.blocks.push(DrcovBlock {
                offset,
                size,
                module: id,
            });
            start += u64::from(size);
        }
    }
    t.blocks
        .sort_unstable_by_key(|b| (b.module, b.offset, b.size));
    t.blocks.dedup();
    t
}

/// Writes `t` in drcov's format.
pub fn write(t: &DrcovTable, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "DRCOV VERSION: 2")?;
    writeln!(out, "DRCOV FLAVOR: drcov-hwtrace")?;
    writeln!(out, "Module Table: version 2, count {}", t.modules.len())?;
    writeln!(out, "Columns: id, base, end, entry, path")?;
    for (id, m) in t.modules.iter().enumerate() {
        writeln!(
            out,
            "{id:3}, {:#018x}, {:#018x}, {:#018x}, {}",
            m.base.0, m.end.0, m.entry.0, m.path
        )?;
    }
    writeln!(out, "BB Table: {} bbs", t.blocks.len())?;
    let mut buf = Vec::with_capacity(t.blocks.len() * 8);
    for b in &t.blocks {
        buf.extend_from_slice(&b.offset.to_le_bytes());
        buf.extend_from_slice(&b.size.to_le_bytes());
        buf.extend_from_slice(&b.module.to_le_bytes());
    }
    out.write_all(&buf)
}
