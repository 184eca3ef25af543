//! LBR samples: SAMPLE records with `PERF_SAMPLE_BRANCH_STACK`, one line
//! (or JSON object) per sample with the sampled thread, CPU and IP, the
//! LBR top-of-stack (`hw_idx`, when `branch_sample_type` has
//! `PERF_SAMPLE_BRANCH_HW_INDEX`) and every entry, newest first.
//!
//! An entry is printed as `perf script -F brstack` prints it:
//! `0xFROM/0xTO/PRED/TX/ABORT/CYCLES/TYPE`: PRED `M` (mispredicted), `P`
//! (predicted) or `-` (not said), TX `X` inside a transaction, ABORT `A` for
//! a transaction abort, CYCLES since the previous entry (0: not counted),
//! TYPE perf's name for `PERF_BR_*` (empty when unknown, as perf prints
//! it). With `--sym` the addresses read `symbol+0xoff` (perf's `brstacksym`).

use std::io::Write;

use anyhow::Result;
use hwtrace_perf::data::{BranchEntry, FileOffset, PerfData, PerfRecord};
use hwtrace_perf::pevent::Body;
use serde_json::json;

use super::symbols::Names;

/// `PERF_BR_*` names, as perf's `branch_type_name` spells them.
const TYPES: [&str; 16] = [
    "",
    "COND",
    "UNCOND",
    "IND",
    "CALL",
    "IND_CALL",
    "RET",
    "SYSCALL",
    "SYSRET",
    "COND_CALL",
    "COND_RET",
    "ERET",
    "IRQ",
    "SERROR",
    "NO_TX",
    "",
];

/// `PERF_BR_NEW_*` names (type 15, `PERF_BR_EXTEND_ABI`).
const NEW_TYPES: [&str; 8] = [
    "FAULT_ALGN",
    "FAULT_DATA",
    "FAULT_INST",
    "ARCH_1",
    "ARCH_2",
    "ARCH_3",
    "ARCH_4",
    "ARCH_5",
];

/// `PERF_BR_SPEC_*` names.
const SPECS: [&str; 4] = [
    "N/A",
    "SPEC_WRONG_PATH",
    "NON_SPEC_CORRECT_PATH",
    "SPEC_CORRECT_PATH",
];

/// `PERF_BR_PRIV_*` names.
fn privilege_name(p: u8) -> &'static str {
    match p {
        0 => "N/A",
        1 => "USER",
        2 => "KERNEL",
        3 => "HV",
        _ => "?",
    }
}

/// perf's name of an entry's branch type.
pub fn type_name(e: &BranchEntry) -> &'static str {
    match e.branch_type() {
        15 => NEW_TYPES
            .get(usize::from(e.new_type()))
            .copied()
            .unwrap_or(""),
        t => TYPES[usize::from(t & 15)],
    }
}

/// `M`, `P` or `-`, as perf's `mispred_str`.
fn prediction(e: &BranchEntry) -> char {
    if e.predicted() {
        'P'
    } else if e.mispred() {
        'M'
    } else {
        '-'
    }
}

/// One entry in perf's brstack form, addresses as `from` and `to` say.
pub fn entry_text(e: &BranchEntry, from: &str, to: &str) -> String {
    format!(
        "{from}/{to}/{}/{}/{}/{}/{}",
        prediction(e),
        if e.in_tx() { 'X' } else { '-' },
        if e.abort() { 'A' } else { '-' },
        e.cycles(),
        type_name(e)
    )
}

/// Counts of what was printed.
#[derive(Clone, Debug, Default)]
pub struct LbrReport {
    /// Samples with a branch stack.
    pub samples: u64,
    /// Entries over all samples.
    pub entries: u64,
    /// `PERF_RECORD_LOST_SAMPLES` records: file offset and samples lost.
    pub lost: Vec<(FileOffset, u64)>,
}

/// Prints (when `print`) and counts every sample with a branch stack.
/// Records that fail to parse are skipped here: the caller reports them
/// (with their file offsets) from its own pass.
pub fn decode(
    file: &PerfData<'_>,
    mut names: Option<&mut Names<'_>>,
    json: bool,
    print: bool,
    out: &mut dyn Write,
) -> Result<LbrReport> {
    let mut report = LbrReport::default();
    let mut records = file.records();
    // Samples of `perf record -z -b` sit inside COMPRESSED records.
    // Records that fail to parse are reported by the AUX stream pass.
    while let Some(expanded) = records.next_expanded().transpose() {
        let Ok(expanded) = expanded else { continue };
        let item = expanded.item();
        let sample = match item.record.clone() {
            PerfRecord::Sample { sample, .. } => sample,
            PerfRecord::Event(r) => {
                if let Body::LostSamples(n) = r.body {
                    report.lost.push((item.offset, n));
                }
                continue;
            }
            _ => continue,
        };
        let Some(stack) = sample.branch_stack else {
            continue;
        };
        report.samples += 1;
        report.entries += stack.len() as u64;
        if !print {
            continue;
        }
        let (pid, tid) = match sample.pid_tid {
            Some((p, t)) => (Some(p), Some(t)),
            None => (None, None),
        };
        let mut name = |a: u64| names.as_deref_mut().map(|n| n.name(pid, a));
        if json {
            let entries: Vec<_> = stack
                .entries()
                .map(|e| {
                    let mut v = json!({
                        "from": format!("{:#x}", e.from), "to": format!("{:#x}", e.to),
                        "mispred": e.mispred(), "predicted": e.predicted(),
                        "in_tx": e.in_tx(), "abort": e.abort(), "cycles": e.cycles(),
                        "type": e.branch_type(), "type_name": type_name(&e),
                        "spec": SPECS[usize::from(e.spec())],
                        "new_type": e.new_type(), "priv": privilege_name(e.privilege()),
                    });
                    if let (Some(f), Some(t)) = (name(e.from), name(e.to)) {
                        v["from_sym"] = json!(f);
                        v["to_sym"] = json!(t);
                    }
                    v
                })
                .collect();
            let v = json!({
                "offset": item.offset.0, "tid": tid, "pid": pid, "cpu": sample.cpu,
                "time": sample.time, "ip": sample.ip.map(|ip| format!("{ip:#x}")),
                "hw_idx": stack.hw_idx, "entries": entries,
            });
            writeln!(out, "{v}")?;
            continue;
        }
        let mut line = format!(
            "{} {} {}",
            tid.map_or("?".into(), |t| t.to_string()),
            sample.cpu.map_or("-".into(), |c| c.to_string()),
            sample.ip.map_or("?".into(), |ip| format!("{ip:x}"))
        );
        if let Some(h) = stack.hw_idx {
            // u64::MAX: the stack is not a whole LBR snapshot.
            if h == u64::MAX {
                line.push_str(" hw_idx=-1");
            } else {
                line.push_str(&format!(" hw_idx={h}"));
            }
        }
        for e in stack.entries() {
            let from = name(e.from)
                .flatten()
                .unwrap_or_else(|| format!("{:#x}", e.from));
            let to = name(e.to)
                .flatten()
                .unwrap_or_else(|| format!("{:#x}", e.to));
            line.push(' ');
            line.push_str(&entry_text(&e, &from, &to));
        }
        writeln!(out, "{line}")?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(flags: u64) -> BranchEntry {
        BranchEntry {
            from: 0x401000,
            to: 0x402000,
            flags,
        }
    }

    #[test]
    fn entries_read_as_perf_prints_them() {
        let text = |flags| entry_text(&entry(flags), "0x401000", "0x402000");
        assert_eq!(text(0), "0x401000/0x402000/-/-/-/0/");
        assert_eq!(text(1), "0x401000/0x402000/M/-/-/0/");
        assert_eq!(text(2 | 4 | 8), "0x401000/0x402000/P/X/A/0/");
        assert_eq!(
            text((0x1234 << 4) | (4 << 20)),
            "0x401000/0x402000/-/-/-/4660/CALL"
        );
        assert_eq!(text(6 << 20), "0x401000/0x402000/-/-/-/0/RET");
        // PERF_BR_EXTEND_ABI: the name comes from new_type.
        assert_eq!(
            text((15 << 20) | (2 << 26)),
            "0x401000/0x402000/-/-/-/0/FAULT_INST"
        );
        assert_eq!(type_name(&entry((15 << 20) | (9 << 26))), "");
        assert_eq!(privilege_name(entry(2 << 30).privilege()), "KERNEL");
        assert_eq!(
            SPECS[usize::from(entry(3 << 24).spec())],
            "SPEC_CORRECT_PATH"
        );
    }
}
