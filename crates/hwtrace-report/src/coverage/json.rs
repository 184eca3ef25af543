//! Coverage as one JSON document: modules (as the drcov table has them),
//! blocks with their hit counts, module, offset and symbol, and edges
//! with their counts, written entry by entry.

use super::Coverage;
use super::drcov::DrcovTable;
use crate::symbols::Symbolizer;
use serde_json::json;
use std::io::{self, Write};

/// Writes `cov` with the modules of `table` (see [`super::drcov::table`])
/// and symbols from `symbols`.
pub fn write(
    cov: &Coverage,
    table: &DrcovTable,
    symbols: &Symbolizer,
    out: &mut dyn Write,
) -> io::Result<()> {
    let hex = |v: u64| format!("{v:#x}");
    writeln!(out, "{{")?;
    writeln!(
        out,
        "\"summary\": {},",
        json!({"blocks": cov.blocks.len(), "edges": cov.edges.len(), "insns": cov.insns,
               "modules": table.modules.len()})
    )?;
    writeln!(out, "\"modules\": [")?;
    for (id, m) in table.modules.iter().enumerate() {
        let sep = if id + 1 < table.modules.len() {
            ","
        } else {
            ""
        };
        let v = json!({"id": id, "path": m.path, "base": hex(m.base.0), "end": hex(m.end.0),
                       "entry": hex(m.entry.0)});
        writeln!(out, "  {v}{sep}")?;
    }
    writeln!(out, "],")?;
    writeln!(out, "\"blocks\": [")?;
    for (id, b) in cov.blocks.iter().enumerate() {
        let sep = if id + 1 < cov.blocks.len() { "," } else { "" };
        let module = table.module_of.get(id).copied().flatten().map(usize::from);
        let v = json!({
            "id": id,
            "start": hex(b.start.0),
            "end": hex(b.end.0),
            "last": hex(b.last.0),
            "insns": b.insns,
            "hits": b.hits,
            "pid": b.space.pid,
            "cr3": b.space.cr3.map(|c| hex(c.0)),
            "module": module,
            "offset": module.map(|m| hex(b.start.0.wrapping_sub(table.modules[m].base.0))),
            "symbol": symbols.name(b.space, b.start),
        });
        writeln!(out, "  {v}{sep}")?;
    }
    writeln!(out, "],")?;
    writeln!(out, "\"edges\": [")?;
    for (n, e) in cov.edges.iter().enumerate() {
        let sep = if n + 1 < cov.edges.len() { "," } else { "" };
        let v = json!({"from": e.from, "to": e.to, "hits": e.hits});
        writeln!(out, "  {v}{sep}")?;
    }
    writeln!(out, "]")?;
    writeln!(out, "}}")
}
