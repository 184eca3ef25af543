//! `hwtrace calls`, `timeline` and `report` on real executions (issue 7's
//! acceptance): gzip, sort and python3's start-up recorded instruction by
//! instruction with qemu-user (hwtrace-sim's recorder), encoded as the PT
//! a CPU would write, then decoded by the commands over the programs' real
//! ELF files (`--elf FILE@BIAS`, so functions have their symbol names).
//!
//! The truth is computed here, independently of hwtrace's decoder, call
//! tracker and symboliser: every executed call instruction (iced-x86
//! classifies the recorded instructions) enters the function at the next
//! executed instruction, and that address is named by this file's own
//! reading of the ELF symbol tables (`object`). Where each file was loaded
//! is found by matching the recorded code bytes against the file's
//! executable segment.
//!
//! Budgets (debug build, loaded 2-core machine): programs are capped at
//! [`MAX_INSNS`] instructions, python3's start-up at [`PYTHON_INSNS`].
//! Needs `qemu-x86_64` (`scripts/setup.sh`) and `ldd` (libc-bin).

mod common;

use anyhow::{Context, Result, bail, ensure};
use common::qemu::{self, Scratch, need, record};
use hwtrace_sim::{Execution, PtConfig, PtEncoder, RecordEnd, Recording, TscModel};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The most instructions gzip and sort are recorded for.
const MAX_INSNS: usize = 400_000;
/// python3's start-up: ld.so, libc and the interpreter's early start.
const PYTHON_INSNS: usize = 250_000;

/// Gzip's and sort's input lines.
fn text(n: usize) -> String {
    qemu::text(
        n,
        &["call", "return", "frame", "stack", "flame", "trace"],
        4,
    )
}

/// An ELF file as this test reads it.
struct Elf {
    path: PathBuf,
    name: String,
    data: Vec<u8>,
    /// The lowest PT_LOAD address (the image base `file+0xoff` counts from).
    lowest: u64,
    /// Loadable segments: (vaddr, file offset, file size, executable).
    loads: Vec<(u64, u64, u64, bool)>,
    /// Text symbols: (address, size, name), sorted.
    funcs: Vec<(u64, u64, String)>,
}

impl Elf {
    fn read(path: &Path) -> Result<Self> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file = object::File::parse(&*data)?;
        let mut loads = Vec::new();
        for seg in file.segments() {
            let (offset, size) = seg.file_range();
            let exec =
                matches!(seg.flags(), object::SegmentFlags::Elf { p_flags } if p_flags & 1 != 0);
            loads.push((seg.address(), offset, size, exec));
        }
        let lowest = loads.iter().map(|l| l.0).min().context("no PT_LOAD")?;
        let mut funcs: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
            .filter(|(_, _, n)| !n.is_empty())
            .collect();
        funcs.sort();
        funcs.dedup();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Self {
            path: path.to_owned(),
            name,
            data,
            lowest,
            loads,
            funcs,
        })
    }

    /// The names of the symbols covering link-time address `a` (a symbol
    /// of size 0 covers its own address).
    fn names_at(&self, a: u64) -> Vec<&str> {
        self.funcs
            .iter()
            .filter(|(addr, size, _)| *addr <= a && a - addr < (*size).max(1))
            .map(|(_, _, n)| n.as_str())
            .collect()
    }

    /// Where this file was loaded in `execution`, found by matching the
    /// recorded code bytes against its executable segments: the bias is
    /// page aligned, and every recorded code run inside the segment must
    /// equal the file's bytes there.
    fn bias_in(&self, execution: &Execution) -> Option<u64> {
        let segs = execution.memory().segments();
        for &(vaddr, offset, size, exec) in &self.loads {
            if !exec {
                continue;
            }
            let file = self.data.get(offset as usize..(offset + size) as usize)?;
            for seg in segs.iter().filter(|s| s.bytes.len() >= 48) {
                let len = seg.bytes.len() as u64;
                let mut delta = seg.addr.0.wrapping_sub(vaddr) & 0xfff;
                while delta + len <= size {
                    if file[delta as usize..(delta + len) as usize] == seg.bytes[..] {
                        let bias = seg.addr.0.wrapping_sub(vaddr + delta);
                        if self.all_match(execution, bias) {
                            return Some(bias);
                        }
                    }
                    delta += 0x1000;
                }
            }
        }
        None
    }

    /// Whether every recorded code run inside an executable segment at
    /// `bias` equals the file's bytes.
    fn all_match(&self, execution: &Execution, bias: u64) -> bool {
        execution.memory().segments().iter().all(|seg| {
            let Some(&(vaddr, offset, size, _)) = self
                .loads
                .iter()
                .find(|l| l.3 && seg.addr.0.wrapping_sub(bias).wrapping_sub(l.0) < l.2)
            else {
                return true;
            };
            let start = seg.addr.0 - bias - vaddr;
            let end = start + seg.bytes.len() as u64;
            end <= size
                && self
                    .data
                    .get((offset + start) as usize..(offset + end) as usize)
                    == Some(&seg.bytes[..])
        })
    }

    /// Whether runtime address `ip` is in an executable segment at `bias`.
    fn holds(&self, bias: u64, ip: u64) -> bool {
        self.loads
            .iter()
            .any(|l| l.3 && ip.wrapping_sub(bias).wrapping_sub(l.0) < l.2)
    }
}

/// The program and the shared objects `ldd` says it loads.
fn program_files(program: &str) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .context("running ldd (Debian libc-bin)")?;
    ensure!(out.status.success(), "ldd {program} failed");
    let mut files = vec![PathBuf::from(program)];
    for line in String::from_utf8(out.stdout)?.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push(std::fs::canonicalize(p)?);
        }
    }
    Ok(files)
}

/// The loaded ELF files with their biases.
fn loaded(program: &str, execution: &Execution) -> Result<Vec<(Elf, u64)>> {
    let mut out = Vec::new();
    for path in program_files(program)? {
        let elf = Elf::read(&path)?;
        if let Some(bias) = elf.bias_in(execution) {
            out.push((elf, bias));
        }
    }
    ensure!(
        out.iter().any(|(e, _)| e.name.starts_with("libc.so")),
        "libc not found in the recorded code"
    );
    Ok(out)
}

/// The functions entered, in order: after every executed call (iced-x86
/// classifies the recorded instructions), the next executed instruction;
/// a call to the very next instruction only reads the IP.
fn truth_entries(execution: &Execution) -> Result<Vec<u64>> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let ips = execution.insns();
    let code = execution.memory();
    let mut entries = Vec::new();
    for (ip, next) in ips.iter().zip(ips.iter().skip(1)) {
        let bytes = code.bytes_at(*ip).context("executed code is recorded")?;
        let insn = Decoder::with_ip(64, bytes, ip.0, DecoderOptions::NONE).decode();
        let is_call = matches!(
            insn.flow_control(),
            FlowControl::Call | FlowControl::IndirectCall
        );
        if is_call && next.0 != ip.0 + insn.len() as u64 {
            entries.push(next.0);
        }
    }
    Ok(entries)
}

/// The trace, the code outside the ELF files as raw images, the ELF files
/// at their biases: the arguments every command gets.
struct Inputs {
    dir: Scratch,
    args: Vec<String>,
    elves: Vec<(Elf, u64)>,
    /// Raw images: (file name, address, length).
    raw: Vec<(String, u64, u64)>,
}

fn inputs(name: &str, program: &str, rec: &Recording, config: PtConfig) -> Result<Inputs> {
    let dir = Scratch::new("calls-qemu", name)?;
    let trace = PtEncoder::new(config).encode(&rec.execution)?;
    let trace_path = dir.file("trace.pt", &trace.bytes)?;
    let elves = loaded(program, &rec.execution)?;
    let mut args = vec![trace_path.display().to_string()];
    let mut raw = Vec::new();
    // Code no file holds (qemu's vDSO): raw images, first, so that the
    // files named after them win where both hold an address.
    for (n, seg) in rec.execution.memory().segments().iter().enumerate() {
        if elves.iter().any(|(e, b)| e.holds(*b, seg.addr.0)) {
            continue;
        }
        let file = format!("seg{n}.bin");
        let path = dir.file(&file, &seg.bytes)?;
        args.push("--image".into());
        args.push(format!("{}@{:x}", path.display(), seg.addr.0));
        raw.push((file, seg.addr.0, seg.bytes.len() as u64));
    }
    for (elf, bias) in &elves {
        args.push("--elf".into());
        args.push(format!("{}@{bias:x}", elf.path.display()));
    }
    Ok(Inputs {
        dir,
        args,
        elves,
        raw,
    })
}

fn hwtrace(args: &[String]) -> Result<(String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        out.status.success(),
        "hwtrace {:?}: {:?}: {stderr}",
        &args[..1],
        out.status
    );
    Ok((String::from_utf8(out.stdout)?, stderr))
}

/// The names an entry at `ip` may have: a covering symbol of the ELF file
/// holding it, else `file+0xoff` from the file's image base, else the raw
/// image's `name+0xoff`.
fn expected_names(inputs: &Inputs, ip: u64) -> Vec<String> {
    for (elf, bias) in &inputs.elves {
        if elf.holds(*bias, ip) {
            let names = elf.names_at(ip - bias);
            if names.is_empty() {
                return vec![format!("{}+{:#x}", elf.name, ip - bias - elf.lowest)];
            }
            return names.into_iter().map(str::to_owned).collect();
        }
    }
    for (file, addr, len) in &inputs.raw {
        if ip.wrapping_sub(*addr) < *len {
            return vec![format!("{file}+{:#x}", ip - addr)];
        }
    }
    vec![format!("{ip:#x}")]
}

/// `hwtrace calls --json` over `rec`: the entries equal the truth, each
/// named as the ELF symbols say.
fn check_entries(name: &str, program: &str, rec: &Recording) -> Result<()> {
    let inputs = inputs(name, program, rec, PtConfig::default())?;
    let mut args = vec!["calls".to_owned(), "--json".to_owned()];
    args.extend(inputs.args.iter().cloned());
    let (stdout, stderr) = hwtrace(&args)?;
    ensure!(stderr.is_empty(), "stderr: {stderr}");
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let hex = |v: &serde_json::Value| -> Option<u64> {
        u64::from_str_radix(v.as_str()?.trim_start_matches("0x"), 16).ok()
    };
    let mut entered = Vec::new();
    let mut named = 0usize;
    let (mut opened, mut closed) = (0usize, 0usize);
    for e in &events {
        match e["event"].as_str() {
            Some("enter") => {
                let ip = hex(&e["ip"]).context("ip")?;
                let got = e["function"].as_str().context("function")?;
                let want = expected_names(&inputs, ip);
                ensure!(
                    want.iter().any(|w| w == got),
                    "{name}: the function entered at {ip:#x} is named {got:?}, its symbols say {want:?}"
                );
                if !want[0].contains("+0x") {
                    named += 1;
                }
                entered.push(ip);
                opened += 1;
            }
            Some("begin" | "caller") => opened += 1,
            Some("exit") => closed += 1,
            Some("gap") => {}
            other => bail!("unexpected event {other:?}"),
        }
    }
    let truth = truth_entries(&rec.execution)?;
    if let Some(i) = (0..truth.len().max(entered.len())).find(|&i| truth.get(i) != entered.get(i)) {
        bail!(
            "{name}: {} functions entered, {} in the truth; entry {i}: {:x?} vs truth {:x?}",
            entered.len(),
            truth.len(),
            entered.get(i..(i + 3).min(entered.len())),
            truth.get(i..(i + 3).min(truth.len()))
        );
    }
    ensure!(truth.len() > 1000, "{name}: only {} calls", truth.len());
    ensure!(opened == closed, "{opened} frames opened, {closed} closed");
    ensure!(
        named >= 20,
        "{name}: only {named} entries have symbol names"
    );
    eprintln!(
        "{name}: {} instructions, {} function entries equal the truth ({named} named by symbols)",
        rec.execution.len(),
        truth.len()
    );
    Ok(())
}

#[test]
fn gzip_function_entries_equal_the_truth() -> Result<()> {
    need("qemu-x86_64", "qemu-user")?;
    let dir = Scratch::new("calls-qemu", "gzip-input")?;
    let input = dir.file("input.txt", text(40).as_bytes())?;
    let rec = record(
        "/usr/bin/gzip",
        &["-c", "-9", input.to_str().unwrap_or_default()],
        MAX_INSNS,
    )?;
    ensure!(
        matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "{:?}",
        rec.end
    );
    check_entries("gzip", "/usr/bin/gzip", &rec)
}

#[test]
fn sort_function_entries_equal_the_truth() -> Result<()> {
    need("qemu-x86_64", "qemu-user")?;
    let dir = Scratch::new("calls-qemu", "sort-input")?;
    let input = dir.file("input.txt", text(30).as_bytes())?;
    let rec = record(
        "/usr/bin/sort",
        &[input.to_str().unwrap_or_default()],
        MAX_INSNS,
    )?;
    check_entries("sort", "/usr/bin/sort", &rec)
}

#[test]
fn python3_start_up_function_entries_equal_the_truth() -> Result<()> {
    need("qemu-x86_64", "qemu-user")?;
    let rec = record("/usr/bin/python3", &["-c", "pass"], PYTHON_INSNS)?;
    ensure!(rec.end == RecordEnd::Limit, "{:?}", rec.end);
    let program = std::fs::canonicalize("/usr/bin/python3")?;
    check_entries("python3", program.to_str().unwrap_or_default(), &rec)
}

/// Checks a Chrome trace event JSON document: the required fields of every
/// event (`ph`, `ts`, `pid`, `tid`, `name`), `B`/`E` balanced per track,
/// complete events nested per track (each inside the one enclosing it or
/// after it), and every track named by a `thread_name` metadata event.
/// Returns the complete events per track.
fn validate_timeline(doc: &serde_json::Value) -> Result<BTreeMap<(u64, u64), usize>> {
    let events = doc["traceEvents"].as_array().context("traceEvents")?;
    let mut named = HashMap::new();
    let mut open: HashMap<(u64, u64), Vec<String>> = HashMap::new();
    let mut spans: BTreeMap<(u64, u64), Vec<(u64, u64)>> = BTreeMap::new();
    // Microseconds with up to three decimals, as whole nanoseconds.
    let ns = |v: &serde_json::Value| -> Option<u64> { Some((v.as_f64()? * 1000.0).round() as u64) };
    for e in events {
        let ph = e["ph"].as_str().context("an event without ph")?;
        let pid = e["pid"].as_u64().with_context(|| format!("no pid: {e}"))?;
        ensure!(e["name"].is_string(), "no name: {e}");
        if ph == "M" {
            if e["name"] == "thread_name" {
                let tid = e["tid"].as_u64().context("thread_name without tid")?;
                named.insert((pid, tid), e["args"]["name"].clone());
            }
            continue;
        }
        let tid = e["tid"].as_u64().with_context(|| format!("no tid: {e}"))?;
        let ts = ns(&e["ts"]).with_context(|| format!("no ts: {e}"))?;
        match ph {
            "B" => open
                .entry((pid, tid))
                .or_default()
                .push(e["name"].to_string()),
            "E" => {
                ensure!(
                    open.entry((pid, tid)).or_default().pop().is_some(),
                    "E without B: {e}"
                );
            }
            "X" => {
                let dur = ns(&e["dur"]).with_context(|| format!("no dur: {e}"))?;
                spans.entry((pid, tid)).or_default().push((ts, ts + dur));
            }
            "i" | "I" => {}
            other => bail!("unexpected phase {other}: {e}"),
        }
    }
    for (track, stack) in &open {
        ensure!(stack.is_empty(), "track {track:?}: B without E: {stack:?}");
    }
    let mut counts = BTreeMap::new();
    for (track, mut list) in spans {
        ensure!(
            named.contains_key(&track),
            "track {track:?} has no thread_name"
        );
        // Outer first: by start, then longest first.
        list.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut stack: Vec<(u64, u64)> = Vec::new();
        for &(start, end) in &list {
            while stack
                .last()
                .is_some_and(|top| top.1 <= start && top.0 < start)
            {
                stack.pop();
            }
            if let Some(top) = stack.last() {
                ensure!(
                    end <= top.1,
                    "track {track:?}: [{start}, {end}] overlaps [{}, {}] without nesting",
                    top.0,
                    top.1
                );
            }
            stack.push((start, end));
        }
        counts.insert(track, list.len());
    }
    Ok(counts)
}

/// `hwtrace timeline` on gzip with TSC packets: a valid Chrome trace
/// whose complete events are the frames `hwtrace calls` reports, on the
/// TSC axis; without TSC the clock is instructions and the last frame
/// ends at the execution's instruction count.
#[test]
fn gzip_timeline_is_a_valid_chrome_trace() -> Result<()> {
    need("qemu-x86_64", "qemu-user")?;
    let dir = Scratch::new("calls-qemu", "gzip-timeline-input")?;
    let input = dir.file("input.txt", text(20).as_bytes())?;
    let rec = record(
        "/usr/bin/gzip",
        &["-c", input.to_str().unwrap_or_default()],
        MAX_INSNS,
    )?;
    let timed = PtConfig {
        tsc: Some(TscModel {
            start: 1 << 40,
            ticks_per_insn: 3,
        }),
        ..PtConfig::default()
    };
    for (config, clock) in [(timed, "TSC"), (PtConfig::default(), "instructions")] {
        let inputs = inputs("gzip-timeline", "/usr/bin/gzip", &rec, config)?;
        let out = inputs.dir.0.join("timeline.json");
        let mut args = vec![
            "timeline".to_owned(),
            "-o".to_owned(),
            out.display().to_string(),
            "--tsc-hz".to_owned(),
            "3000000000".to_owned(),
        ];
        args.extend(inputs.args.iter().cloned());
        hwtrace(&args)?;
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&out)?)?;
        let counts = validate_timeline(&doc)?;
        let clock_words = doc["otherData"]["clock"].as_str().unwrap_or_default();
        ensure!(clock_words.starts_with(clock), "{clock_words}");

        let mut args = vec!["calls".to_owned(), "--json".to_owned()];
        args.extend(inputs.args.iter().cloned());
        let (calls, _) = hwtrace(&args)?;
        let exits = calls
            .lines()
            .filter(|l| l.contains("\"event\":\"exit\""))
            .count();
        let frames: usize = counts.values().sum();
        ensure!(frames == exits, "{frames} complete events, {exits} frames");
        ensure!(counts.len() == 1, "tracks: {counts:?}");
        // The outermost frame spans the whole run: the last instruction
        // ends it (instructions), or 3 ticks per instruction at 3 GHz
        // since the first TSC (TSC, up to the last PSB's timestamp).
        let end = doc["traceEvents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["ph"] == "X")
            .filter_map(|e| Some(e["ts"].as_f64()? + e["dur"].as_f64()?))
            .fold(0.0, f64::max);
        let insns = rec.execution.len() as f64;
        match clock {
            "instructions" => ensure!(end == insns, "ends at {end}, {insns} instructions"),
            _ => ensure!(
                end > 0.0 && end <= insns / 1000.0 + 0.001,
                "ends at {end} µs, {insns} instructions at 1 ns each"
            ),
        }
    }
    Ok(())
}

/// `hwtrace report` on sort: the counts are the execution's, the top
/// functions are named, and the outputs asked for are written and listed.
#[test]
fn sort_report_counts_the_execution() -> Result<()> {
    need("qemu-x86_64", "qemu-user")?;
    let dir = Scratch::new("calls-qemu", "sort-report-input")?;
    let input = dir.file("input.txt", text(10).as_bytes())?;
    let rec = record(
        "/usr/bin/sort",
        &[input.to_str().unwrap_or_default()],
        MAX_INSNS,
    )?;
    let inputs = inputs("sort-report", "/usr/bin/sort", &rec, PtConfig::default())?;
    let flame = inputs.dir.0.join("flame.svg");
    let timeline = inputs.dir.0.join("timeline.json");
    let mut args = vec![
        "report".to_owned(),
        "--top".to_owned(),
        "5".to_owned(),
        "--flame".to_owned(),
        flame.display().to_string(),
        "--timeline".to_owned(),
        timeline.display().to_string(),
    ];
    args.extend(inputs.args.iter().cloned());
    let (report, _) = hwtrace(&args)?;
    let line = |prefix: &str| -> Option<&str> {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .map(str::trim)
    };
    ensure!(
        line("instructions") == Some(&format!("instructions     {}", rec.execution.len())[..]),
        "{report}"
    );
    ensure!(line("threads") == Some("threads          1"), "{report}");
    ensure!(
        line("decode errors") == Some("decode errors    0"),
        "{report}"
    );
    let top: Vec<&str> = report
        .lines()
        .skip_while(|l| !l.starts_with("top functions"))
        .skip(2)
        .take_while(|l| !l.is_empty())
        .collect();
    ensure!(top.len() == 5, "{report}");
    ensure!(
        top.iter().any(|l| l.contains("[libc.so.6]")),
        "no libc function among the top: {report}"
    );
    ensure!(
        report.contains(&format!("flame graph (SVG): {}", flame.display()))
            && report.contains(&format!(
                "timeline (Perfetto / Chrome trace JSON): {}",
                timeline.display()
            )),
        "{report}"
    );
    let svg = std::fs::read_to_string(&flame)?;
    ensure!(svg.contains("<svg") && svg.contains("libc"), "flame graph");
    validate_timeline(&serde_json::from_slice(&std::fs::read(&timeline)?)?)?;
    Ok(())
}
