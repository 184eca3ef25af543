//! Real executions for the answer commands' tests: programs recorded
//! instruction by instruction with qemu-user (hwtrace-sim's recorder),
//! scratch folders for the files the commands read and write, and
//! deterministic input text for the programs; the coverage of an
//! execution computed from its recorded instructions alone, and what
//! `hwtrace coverage --json` says in the same terms.

use anyhow::{Context, Result, ensure};
use hwtrace_flow::insn::{Decoded, InsnClass, MAX_INSN_SIZE, classify};
use hwtrace_sim::{Execution, Limits, Recording};
use hwtrace_types::{AddressSpace, ReadMemory};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Fails naming the Debian package when `tool` is not on the PATH.
pub fn need(tool: &str, package: &str) -> Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    ensure!(
        found,
        "{tool} missing: install Debian package {package} (scripts/setup.sh)"
    );
    Ok(())
}

/// Records `program args` with qemu-user for at most `max` instructions
/// (and 90 seconds).
pub fn record(program: &str, args: &[&str], max: usize) -> Result<Recording> {
    need("qemu-x86_64", "qemu-user")?;
    let limits = Limits {
        max_instructions: Some(max),
        timeout: Some(Duration::from_secs(90)),
    };
    Execution::record_qemu(program, args, limits)
        .with_context(|| format!("recording {program} {args:?}"))
}

/// A scratch folder, removed on drop; unique per process and call, so
/// tests running at once never share one.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// `hwtrace-{what}-{pid}-{n}-{name}` in the temporary folder.
    pub fn new(what: &str, name: &str) -> Result<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("hwtrace-{what}-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    /// Writes `bytes` to `name` in the folder.
    pub fn file(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.0.join(name);
        std::fs::write(&path, bytes)?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic text for gzip and sort: `n` lines of `per_line`
/// pseudo-random `words` and a number.
pub fn text(n: usize, words: &[&str], per_line: usize) -> String {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut out = String::new();
    for i in 0..n {
        for _ in 0..per_line {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            out += words[(x >> 61) as usize % words.len()];
            out.push(' ');
        }
        out += &format!("{}\n", x % 997 + i as u64);
    }
    out
}

/// A block as the truth and the JSON name it: first byte, end.
pub type Key = (u64, u64);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Truth {
    /// Block → (address of its last instruction, hits).
    pub blocks: BTreeMap<Key, (u64, u64)>,
    pub edges: BTreeMap<(Key, Key), u64>,
    /// The blocks whose last instruction is a conditional branch (filled
    /// by [`truth`] alone).
    pub cond: BTreeSet<Key>,
}

/// The `i`th recorded instruction, classified (iced-x86) from the recorded
/// code.
pub fn classified(execution: &Execution, i: usize) -> Result<Decoded> {
    let ip = *execution.insns().get(i).context("no such instruction")?;
    let mut buf = [0u8; MAX_INSN_SIZE];
    let n = execution
        .memory()
        .read_memory(AddressSpace::UNKNOWN, ip, &mut buf)
        .map_err(|e| anyhow::anyhow!("{ip:?}: {e}"))?;
    classify(&buf[..n], ip.0, execution.mode_at(i)).map_err(|e| anyhow::anyhow!("{ip:?}: {e:?}"))
}

/// The coverage of the recorded instructions, by the rule
/// `hwtrace_report::coverage` documents: a block ends at every control
/// transfer and wherever the next instruction is not the fall-through; an
/// edge joins each block to the next one executed.
pub fn truth(execution: &Execution) -> Result<Truth> {
    let mut t = Truth::default();
    let mut open: Option<(u64, u64, u64)> = None;
    let mut prev: Option<Key> = None;
    let mut close = |open: &mut Option<(u64, u64, u64)>, t: &mut Truth, cond: bool| {
        if let Some((start, end, last)) = open.take() {
            let key = (start, end);
            if cond {
                t.cond.insert(key);
            }
            t.blocks.entry(key).or_insert((last, 0)).1 += 1;
            if let Some(p) = prev.replace(key) {
                *t.edges.entry((p, key)).or_insert(0) += 1;
            }
        }
    };
    for (i, ip) in execution.insns().iter().enumerate() {
        let d = classified(execution, i)?;
        if open.is_some_and(|(_, end, _)| end != ip.0) {
            close(&mut open, &mut t, false);
        }
        let end = ip.0 + u64::from(d.size);
        let (start, _, _) = open.unwrap_or((ip.0, 0, 0));
        open = Some((start, end, ip.0));
        if !matches!(d.class, InsnClass::Other | InsnClass::Ptwrite) {
            close(&mut open, &mut t, d.class == InsnClass::CondJump);
        }
    }
    close(&mut open, &mut t, false);
    Ok(t)
}

pub fn hex(v: &serde_json::Value) -> Result<u64> {
    let s = v.as_str().context("a hex string")?;
    Ok(u64::from_str_radix(s.trim_start_matches("0x"), 16)?)
}

/// What `hwtrace coverage --json` wrote, in the truth's terms: the blocks
/// of process `pid` (`None`: all) and the edges between them.
pub fn from_json(path: &Path, pid: Option<u64>) -> Result<Truth> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path)?)?;
    let mut t = Truth::default();
    let mut keys = Vec::new();
    for b in v["blocks"].as_array().context("blocks")? {
        if pid.is_some_and(|p| b["pid"].as_u64() != Some(p)) {
            keys.push(None);
            continue;
        }
        let key = (hex(&b["start"])?, hex(&b["end"])?);
        let hits = b["hits"].as_u64().context("hits")?;
        ensure!(
            t.blocks.insert(key, (hex(&b["last"])?, hits)).is_none(),
            "block {key:x?} twice"
        );
        keys.push(Some(key));
    }
    let key = |e: &serde_json::Value, end: &str| -> Result<Option<Key>> {
        let i = usize::try_from(e[end].as_u64().with_context(|| format!("edge {end}"))?)?;
        keys.get(i)
            .copied()
            .with_context(|| format!("edge {end} {i}: no such block"))
    };
    for e in v["edges"].as_array().context("edges")? {
        if let (Some(from), Some(to)) = (key(e, "from")?, key(e, "to")?) {
            t.edges
                .insert((from, to), e["hits"].as_u64().context("hits")?);
        }
    }
    Ok(t)
}
