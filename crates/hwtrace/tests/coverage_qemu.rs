//! `hwtrace coverage` on real executions (issue 7): gzip, sort and
//! python3's start-up recorded instruction by instruction with qemu-user
//! (hwtrace-sim's recorder), encoded as the Intel PT a CPU would write
//! with user-mode tracing (every system call leaves and re-enters
//! tracing), then run through the command over the execution's code.
//!
//! The ground truth is computed here from the recorded instructions
//! alone, by the rule `hwtrace_report::coverage` documents: a block ends
//! at every control transfer and wherever the next instruction is not the
//! fall-through; an edge joins each block to the next one executed.
//! Checked against it: the JSON's blocks with their hit counts and its
//! edges with theirs; the drcov file read back by the `drcov` crate (an
//! independent parser): modules and blocks; the AFL bitmap against one
//! computed here with libxdc's edge hash. A small C program built with
//! DWARF is recorded the same way for lcov: its line counts are the loop's
//! and `genhtml` (Debian `lcov`) renders the file without a warning.
//! The taken branches of a run, as raw BTS records, give the blocks
//! between branches (branch-only input).
//!
//! Needs `qemu-x86_64`, `gcc` and `genhtml` (`scripts/setup.sh`).
//! Budgets: short runs (a debug build on a shared 2-core machine).

mod common;

use anyhow::{Context, Result, bail, ensure};
use common::parallel::same;
use common::qemu::{self, Key, Scratch, Truth, from_json, need, record, truth};
use hwtrace_flow::insn::InsnClass;
use hwtrace_report::coverage::afl;
use hwtrace_sim::{Cr3Filter, PtConfig, PtEncoder, RecordEnd, Recording};
use hwtrace_types::Cr3;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The most instructions a program is recorded for.
const MAX_INSNS: usize = 150_000;
/// python3's start-up: its first instructions (ld.so, libc, the
/// interpreter's early start); the trace ends with TIP.PGD there.
const PYTHON_INSNS: usize = 100_000;

/// Gzip's and sort's input lines.
fn text(n: usize) -> String {
    qemu::text(n, &["block", "edge", "drcov", "lcov", "bitmap", "hit"], 3)
}

/// libxdc's edge hash, written out again from its definition, over the
/// edges out of blocks that end in a conditional branch (libxdc's map,
/// `hwtrace coverage`'s default) or, `all`, over every edge.
fn afl_map(t: &Truth, all: bool) -> Vec<u8> {
    let mix = |v: u64| (v ^ (v >> 31)).wrapping_mul(0x7fb5_d329_728e_a185);
    let mut map = vec![0u8; 1 << 16];
    for (&(from, to), &hits) in &t.edges {
        if !all && !t.cond.contains(&from) {
            continue;
        }
        let last = t.blocks[&from].0;
        let index = ((mix(to.0) ^ (mix(last) >> 1)) & 0xffff) as usize;
        for _ in 0..hits {
            map[index] = map[index].wrapping_add(1);
        }
    }
    map
}

/// Where one side has what the other lacks, for a readable failure.
fn compare<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &BTreeMap<K, V>,
    want: &BTreeMap<K, V>,
) -> Result<()> {
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(k) != Some(v))
        .take(5)
        .map(|(k, v)| format!("{k:x?}: want {v:?}, got {:?}", got.get(k)))
        .collect();
    let extra: Vec<_> = got
        .keys()
        .filter(|k| !want.contains_key(k))
        .take(5)
        .collect();
    ensure!(
        wrong.is_empty() && extra.is_empty(),
        "{what}: {} vs {} entries; differing {wrong:?}; not in the truth {extra:x?}",
        got.len(),
        want.len()
    );
    Ok(())
}

/// Encodes `rec` as PT, runs `hwtrace coverage` over its code (raw
/// segment images, then `extra` arguments) and checks every output
/// against the truth; returns the scratch folder for more checks.
fn check(name: &str, rec: &Recording, extra: &[String]) -> Result<(Scratch, Truth)> {
    let execution = &rec.execution;
    let trace = PtEncoder::new(PtConfig::default()).encode(execution)?;
    ensure!(trace.stats.disables > 0, "no system call left tracing");
    let dir = Scratch::new("coverage", name)?;
    let trace_path = dir.file("trace.pt", &trace.bytes)?;
    let segments = execution.memory().segments();
    let mut args: Vec<String> = vec!["coverage".into(), trace_path.display().to_string()];
    let mut seg_paths = Vec::new();
    for (n, seg) in segments.iter().enumerate() {
        let p = dir.file(&format!("seg{n}.bin"), &seg.bytes)?;
        args.push("--image".into());
        args.push(format!("{}@{:x}", p.display(), seg.addr.0));
        seg_paths.push(p);
    }
    args.extend(extra.iter().cloned());
    // On every core, with tiny work units, the same bytes as on one thread
    // (both kinds of AFL map: the flag is the comparison's).
    let mut base: Vec<String> = args[1..].to_vec();
    if let Some(at) = base.iter().position(|a| a == "--afl-edges") {
        base.drain(at..at + 2);
    }
    same(name, &dir.0, &base)?;
    let out = |f: &str| dir.0.join(f).display().to_string();
    for (flag, file) in [
        ("--drcov", "cov.drcov"),
        ("--json", "cov.json"),
        ("--afl-map", "cov.afl"),
    ] {
        args.push(flag.into());
        args.push(out(file));
    }
    let run = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(&args)
        .output()?;
    ensure!(
        run.status.success(),
        "hwtrace {args:?}: {:?}: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let summary = String::from_utf8(run.stdout)?;
    let want = truth(execution)?;
    eprintln!(
        "{name}: {} instructions, {} blocks, {} edges; {}",
        execution.len(),
        want.blocks.len(),
        want.edges.len(),
        summary.lines().next().unwrap_or_default()
    );
    ensure!(
        summary.starts_with(&format!(
            "{} blocks, {} edges",
            want.blocks.len(),
            want.edges.len()
        )),
        "{summary}"
    );

    let got = from_json(&dir.0.join("cov.json"), None)?;
    compare("blocks (last instruction, hits)", &got.blocks, &want.blocks)?;
    compare("edge hits", &got.edges, &want.edges)?;

    // drcov, read back by the drcov crate.
    let dr = drcov::from_file(dir.0.join("cov.drcov"))
        .map_err(|e| anyhow::anyhow!("drcov parser: {e}"))?;
    ensure!(dr.header.version == 2, "{:?}", dr.header);
    let modules: Vec<(String, u64, u64)> = dr
        .modules
        .iter()
        .map(|m| (m.path.clone(), m.base, m.end))
        .collect();
    let mut want_modules: Vec<(String, u64, u64)> = segments
        .iter()
        .zip(&seg_paths)
        .map(|(s, p)| {
            (
                p.display().to_string(),
                s.addr.0,
                s.addr.0 + s.bytes.len() as u64,
            )
        })
        .collect();
    // `extra` images (an --elf) follow the segments in the table.
    want_modules.truncate(modules.len().min(want_modules.len()));
    ensure!(
        modules[..want_modules.len()] == want_modules[..],
        "drcov modules {modules:x?}, want {want_modules:x?}"
    );
    let got_bbs: BTreeSet<(u64, u64)> = dr
        .basic_blocks
        .iter()
        .map(|b| {
            let base = dr.modules[usize::from(b.module_id)].base;
            (base + u64::from(b.start), u64::from(b.size))
        })
        .collect();
    let want_bbs: BTreeSet<(u64, u64)> = want
        .blocks
        .keys()
        .map(|&(start, end)| (start, end - start))
        .collect();
    ensure!(
        got_bbs == want_bbs,
        "drcov blocks: {} vs {} in the truth; first missing {:x?}, first extra {:x?}",
        got_bbs.len(),
        want_bbs.len(),
        want_bbs.difference(&got_bbs).next(),
        got_bbs.difference(&want_bbs).next()
    );

    let map = std::fs::read(dir.0.join("cov.afl"))?;
    let all = extra
        .windows(2)
        .any(|w| w[0] == "--afl-edges" && w[1] == "all");
    ensure!(
        map == afl_map(&want, all),
        "the AFL bitmap (all edges: {all}) differs from the truth's"
    );
    // Conditional branches are a part of the edges (most of a loop's).
    ensure!(
        all || map != afl_map(&want, true),
        "the conditional branches' map is every edge's"
    );
    let hash = format!(
        "libxdc hash {:#018x}",
        hwtrace_report::coverage::afl::libxdc_hash(&map)
    );
    ensure!(summary.contains(&hash), "no {hash:?} in {summary}");
    // The library's libxdc map, straight from the trace over the recorded
    // code: the truth's conditional outcomes, whatever `--afl-edges` asked.
    let mut lib = hwtrace_report::coverage::libxdc::LibxdcMap::new(1 << 16)?;
    let got = lib.decode(
        &trace.bytes,
        hwtrace_flow::Config::default(),
        execution.memory(),
    );
    // A recording cut short after a conditional branch ends its trace with
    // that branch's outcome (and a FUP where it went): libxdc counts it,
    // while the truth, from the instructions recorded, has no block after.
    let mut want_lib = afl_map(&want, false);
    let last = execution.insns().len().checked_sub(1);
    if let (Some(i), Some(next)) = (last, execution.successor())
        && qemu::classified(execution, i)?.class == InsnClass::CondJump
    {
        let slot = &mut want_lib[afl::edge_slot(execution.insns()[i], next, 1 << 16)];
        *slot = slot.wrapping_add(1);
    }
    ensure!(
        lib.map() == want_lib.as_slice() && got.errors == 0,
        "the library's libxdc map differs from the truth's ({got:?})"
    );
    Ok((dir, want))
}

#[test]
fn gzip() -> Result<()> {
    let dir = Scratch::new("coverage", "gzip-input")?;
    let input = dir.file("in.txt", text(30).as_bytes())?;
    let rec = record(
        "/usr/bin/gzip",
        &["-c", "-6", input.to_str().unwrap_or_default()],
        MAX_INSNS,
    )?;
    ensure!(
        rec.end == RecordEnd::Limit || matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "{:?}",
        rec.end
    );
    check("gzip", &rec, &[]).map(|_| ())
}

/// A trace whose PSB+ carry the process's CR3 (PIP packets: CR3
/// filtering on), its last byte cut, then the same run traced without
/// CR3s: after the resynchronisation the second piece's blocks are in no
/// address space, not the first piece's, on one thread as on several.
#[test]
fn a_trace_with_cr3s_then_one_without_covers_the_same_on_every_core() -> Result<()> {
    let dir = Scratch::new("coverage", "cr3-then-none")?;
    let input = dir.file("in.txt", text(10).as_bytes())?;
    let rec = record(
        "/usr/bin/gzip",
        &["-c", "-1", input.to_str().unwrap_or_default()],
        40_000,
    )?;
    let cr3 = Cr3(0x1234_5000);
    let with = PtEncoder::new(PtConfig {
        cr3_filter: Some(Cr3Filter {
            cr3_match: cr3,
            process_cr3: cr3,
        }),
        ..PtConfig::default()
    })
    .encode(&rec.execution)?;
    let without = PtEncoder::new(PtConfig::default()).encode(&rec.execution)?;
    let mut trace = with.bytes[..with.bytes.len() - 1].to_vec();
    trace.extend_from_slice(&without.bytes);
    let path = dir.file("trace.pt", &trace)?;
    let mut args = vec![path.display().to_string()];
    for (n, seg) in rec.execution.memory().segments().iter().enumerate() {
        let p = dir.file(&format!("seg{n}.bin"), &seg.bytes)?;
        args.extend([
            "--image".into(),
            format!("{}@{:x}", p.display(), seg.addr.0),
        ]);
    }
    let summary = same("cr3-then-none", &dir.0, &args)?;
    eprintln!("CR3s, then none: {summary}");
    // The code ran in both spaces: each block twice over.
    let json = dir.0.join("both.json");
    let run = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("coverage")
        .args(&args)
        .arg("--json")
        .arg(&json)
        .output()?;
    ensure!(run.status.code() == Some(2), "{run:?}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let spaces: BTreeSet<String> = v["blocks"]
        .as_array()
        .context("blocks")?
        .iter()
        .map(|b| b["cr3"].to_string())
        .collect();
    ensure!(
        spaces.len() == 2 && spaces.contains("null"),
        "address spaces {spaces:?}"
    );
    Ok(())
}

#[test]
fn sort() -> Result<()> {
    let dir = Scratch::new("coverage", "sort-input")?;
    let input = dir.file("in.txt", text(25).as_bytes())?;
    let rec = record(
        "/usr/bin/sort",
        &[input.to_str().unwrap_or_default()],
        MAX_INSNS,
    )?;
    let all = ["--afl-edges".to_owned(), "all".to_owned()];
    check("sort", &rec, &all).map(|_| ())
}

#[test]
fn python3_start_up() -> Result<()> {
    let rec = record("/usr/bin/python3", &["-c", "pass"], PYTHON_INSNS)?;
    ensure!(rec.end == RecordEnd::Limit, "{:?}", rec.end);
    check("python3", &rec, &[]).map(|_| ())
}

const PROGRAM: &str = r#"#include <stdio.h>

static int never(int x) {
    return x * 42;
}

static int step(int i) {
    return i * 3;
}

int main(int argc, char **argv) {
    volatile int sum = 0;
    for (int i = 0; i < 7; i++) {
        sum += step(i);
    }
    if (argc > 5)
        sum += never(argc);
    printf("%d\n", sum);
    return 0;
}
"#;

/// Lines of [`PROGRAM`].
const STEP_BODY: u32 = 8;
const NEVER_BODY: u32 = 4;
const LOOP_BODY: u32 = 14;
const PRINTF: u32 = 18;

/// lcov from DWARF: a program built with `-g` (its own ELF given with
/// `--elf`, after the raw segments, so it names its code), recorded and
/// traced like the others; the loop's lines count its iterations, code
/// never run counts 0, and genhtml renders the file without a warning.
#[test]
fn lcov_of_a_program_with_dwarf_renders_in_genhtml() -> Result<()> {
    need("gcc", "gcc")?;
    need("genhtml", "lcov")?;
    let build = Scratch::new("coverage", "lcov-build")?;
    let src = build.file("loop.c", PROGRAM.as_bytes())?;
    let exe = build.0.join("loop");
    let status = Command::new("gcc")
        .args(["-g", "-O0", "-no-pie", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()?;
    ensure!(status.success(), "gcc failed");
    let rec = record(exe.to_str().unwrap_or_default(), &[], MAX_INSNS)?;
    ensure!(
        rec.stdout == b"63\n",
        "the program printed {:?}",
        rec.stdout
    );
    let lcov_path = build.0.join("loop.info");
    let extra = [
        "--elf".to_owned(),
        exe.display().to_string(),
        "--lcov".to_owned(),
        lcov_path.display().to_string(),
        "--test-name".to_owned(),
        "loop".to_owned(),
    ];
    let (_dir, _) = check("loop", &rec, &extra)?;
    let info = std::fs::read_to_string(&lcov_path)?;
    let src_name = src.display().to_string();
    let mut file_lines: BTreeMap<u32, u64> = BTreeMap::new();
    let mut in_src = false;
    for line in info.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            in_src = f == src_name;
        } else if let (true, Some(da)) = (in_src, line.strip_prefix("DA:")) {
            let (l, n) = da.split_once(',').context("DA:line,count")?;
            file_lines.insert(l.parse()?, n.parse()?);
        }
    }
    ensure!(!file_lines.is_empty(), "no lines of {src_name} in:\n{info}");
    for (line, want) in [(STEP_BODY, 7), (LOOP_BODY, 7), (NEVER_BODY, 0), (PRINTF, 1)] {
        ensure!(
            file_lines.get(&line) == Some(&want),
            "line {line}: {:?}, want {want}; all: {file_lines:?}",
            file_lines.get(&line)
        );
    }
    let html = build.0.join("html");
    let out = Command::new("genhtml")
        .arg("--output-directory")
        .arg(&html)
        .arg(&lcov_path)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "genhtml failed: {stderr}");
    if stderr.to_lowercase().contains("warning") {
        bail!("genhtml warned: {stderr}");
    }
    ensure!(html.join("index.html").is_file(), "no index.html");
    Ok(())
}

/// Branch-only input: the taken branches of a recorded run (what BTS
/// stores, written as raw 64-bit records) give blocks from each branch's
/// target to the next branch's source, and edges between consecutive
/// ones, with the counts of the recorded flow.
#[test]
fn bts_records_of_a_run_give_the_blocks_between_branches() -> Result<()> {
    let rec = record("/bin/echo", &["bts"], MAX_INSNS)?;
    let taken = hwtrace_sim::branches(&rec.execution)?;
    ensure!(taken.len() > 1000, "{} branches", taken.len());
    let mut raw = Vec::with_capacity(taken.len() * 24);
    for b in &taken {
        raw.extend_from_slice(&b.from.0.to_le_bytes());
        raw.extend_from_slice(&b.to.0.to_le_bytes());
        raw.extend_from_slice(&0x10u64.to_le_bytes());
    }
    // The truth: straight-line code between consecutive branches.
    let mut want = Truth::default();
    let mut prev: Option<Key> = None;
    for pair in taken.windows(2) {
        let key = (pair[0].to.0, pair[1].from.0 + 1);
        want.blocks.entry(key).or_insert((pair[1].from.0, 0)).1 += 1;
        if let Some(p) = prev.replace(key) {
            *want.edges.entry((p, key)).or_insert(0) += 1;
        }
    }
    let dir = Scratch::new("coverage", "bts")?;
    let records = dir.file("bts.raw", &raw)?;
    let json = dir.0.join("bts.json");
    let run = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("coverage")
        .arg("--bts")
        .arg(&records)
        .arg("--json")
        .arg(&json)
        .output()?;
    ensure!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let got = from_json(&json, None)?;
    compare("BTS blocks", &got.blocks, &want.blocks)?;
    compare("BTS edges", &got.edges, &want.edges)?;
    Ok(())
}
