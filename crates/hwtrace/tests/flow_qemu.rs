//! Real executions as ground truth for hwtrace's own flow decoder (issue 3):
//! programs recorded instruction by instruction with qemu-user
//! (hwtrace-sim's recorder), encoded as the PT a CPU would write for
//! user-mode tracing (syscalls leave and re-enter tracing, a PSB+ every few
//! KiB, with and without return compression), then decoded with
//! `hwtrace_flow::insn::InsnDecoder` over the execution's code. The decoded
//! instructions must be the executed ones exactly, from the first PSB and
//! from later PSBs (by `sync_set` and by slicing the trace there).
//! `hwtrace flow` itself is run over an execution's code written out as
//! `--image` files: its instructions are echo's, its `--branches` are the
//! taken branches of an `ls` run.
//!
//! Budgets (this is a debug build on a loaded 2-core machine; the whole
//! file runs in well under two minutes): every program is capped at
//! [`MAX_INSNS`] instructions, python3's start-up at [`PYTHON_INSNS`], and
//! each trace is also decoded from [`SUFFIX_STARTS`] later PSBs.
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`). hwtrace-sim's own
//! `qemu_roundtrip.rs` checks the same encodings with libipt, so encoder
//! and decoder cannot share a mistake unnoticed.

use anyhow::{Context, Result, bail, ensure};
use hwtrace_flow::insn::{Insn, InsnClass, InsnDecoder};
use hwtrace_flow::{Config, ErrorKind};
use hwtrace_sim::{EncodedTrace, Execution, Limits, PtConfig, PtEncoder, RecordEnd, Recording};
use hwtrace_types::TraceOffset;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The most instructions any program is recorded for.
const MAX_INSNS: usize = 600_000;
/// python3 runs about 31.5 million instructions to start; the first
/// `PYTHON_INSNS` (ld.so, libc and the interpreter's early start) are
/// recorded. The execution then ends with FUP + TIP.PGD before the first
/// instruction not recorded.
const PYTHON_INSNS: usize = 300_000;
/// How many later PSBs each trace is also decoded from.
const SUFFIX_STARTS: usize = 3;

fn qemu_present() -> bool {
    Path::new("/usr/bin/qemu-x86_64").exists()
}

fn record(program: &str, args: &[&str], max: usize) -> Result<Recording> {
    let started = Instant::now();
    let limits = Limits {
        max_instructions: Some(max),
        timeout: Some(Duration::from_secs(90)),
    };
    let rec = Execution::record_qemu(program, args, limits)
        .with_context(|| format!("recording {program} {args:?}"))?;
    eprintln!(
        "{program} {args:?}: {} instructions, {} code bytes, {:?}, recorded in {:.1?}",
        rec.execution.len(),
        rec.execution.memory().len(),
        rec.end,
        started.elapsed()
    );
    Ok(rec)
}

/// What one decode gave: instruction addresses, and errors (offset, IP,
/// what) with the decoding resumed at the next PSB as ptxed does.
#[derive(Debug, Default)]
struct Decoded {
    ips: Vec<u64>,
    errors: Vec<String>,
}

/// Decodes from where `dec` is synchronised (`status`) to the end.
fn decode_on<M: hwtrace_types::ReadMemory>(
    dec: &mut InsnDecoder<'_, M>,
    first: Result<hwtrace_flow::event::Status, hwtrace_flow::Error>,
) -> Decoded {
    let mut out = Decoded::default();
    let mut sync = first;
    'sync: loop {
        let mut status = match sync {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(e) => {
                out.errors.push(format!("sync: {e}"));
                break;
            }
        };
        loop {
            while status.event_pending {
                match dec.event() {
                    Ok((_, s)) => status = s,
                    Err(e) => {
                        out.errors.push(format!("event: {e}"));
                        sync = dec.sync_forward();
                        continue 'sync;
                    }
                }
            }
            if status.eos {
                break 'sync;
            }
            let mut insn = Insn::empty(0, None, false);
            match dec.next_insn(&mut insn) {
                Ok(s) => {
                    out.ips.push(insn.ip);
                    status = s;
                }
                Err(e) => {
                    if insn.class != InsnClass::Unknown {
                        out.ips.push(insn.ip);
                    }
                    if e.kind == ErrorKind::Eos {
                        break 'sync;
                    }
                    out.errors.push(format!("insn: {e}"));
                    sync = dec.sync_forward();
                    continue 'sync;
                }
            }
        }
    }
    out
}

/// Where two instruction sequences first differ, for a readable failure.
fn check_same(what: &str, got: &Decoded, executed: &[u64]) -> Result<()> {
    ensure!(got.errors.is_empty(), "{what}: errors {:?}", got.errors);
    if got.ips == executed {
        return Ok(());
    }
    let decoded = &got.ips;
    let at = decoded
        .iter()
        .zip(executed)
        .position(|(a, b)| a != b)
        .unwrap_or(decoded.len().min(executed.len()));
    let show = |v: &[u64]| -> Vec<String> {
        v[at.saturating_sub(3)..(at + 3).min(v.len())]
            .iter()
            .map(|ip| format!("{ip:#x}"))
            .collect()
    };
    bail!(
        "{what}: decoded {} instructions, executed {}; first difference at {at}: decoded {:?}, executed {:?}",
        decoded.len(),
        executed.len(),
        show(decoded),
        show(executed)
    )
}

/// Encodes with `config`, decodes from the start and from later PSBs.
fn roundtrip(execution: &Execution, config: PtConfig) -> Result<EncodedTrace> {
    let started = Instant::now();
    let trace = PtEncoder::new(config).encode(execution)?;
    let executed: Vec<u64> = execution.insns().iter().map(|ip| ip.0).collect();
    let code = execution.memory();

    let mut dec = InsnDecoder::new(&trace.bytes, Config::default(), code);
    let first = dec.sync_forward();
    check_same("from the start", &decode_on(&mut dec, first), &executed)?;

    let later = trace.psbs.get(1..).unwrap_or_default();
    let step = (later.len() / SUFFIX_STARTS).max(1);
    for (n, psb) in later.iter().step_by(step).take(SUFFIX_STARTS).enumerate() {
        let suffix = &executed[psb.insn_index..];
        // Alternately: sync_set on the whole trace, and the trace sliced
        // at the PSB (what a segment of a parallel decode sees).
        let got = if n % 2 == 0 {
            let mut dec = InsnDecoder::new(&trace.bytes, Config::default(), code);
            let first = dec.sync_set(psb.offset);
            decode_on(&mut dec, first)
        } else {
            let from = usize::try_from(psb.offset.0)?;
            let mut dec = InsnDecoder::new(&trace.bytes[from..], Config::default(), code);
            let first = dec.sync_set(TraceOffset(0));
            decode_on(&mut dec, first)
        };
        check_same(
            &format!("from the PSB at {:#x}", psb.offset.0),
            &got,
            suffix,
        )?;
    }
    eprintln!(
        "  retc={} psb_period={}: {} bytes, {} PSBs, {} compressed returns, {} disables, decoded and checked in {:.1?}",
        config.return_compression,
        config.psb_period,
        trace.bytes.len(),
        trace.stats.psbs,
        trace.stats.compressed_returns,
        trace.stats.disables,
        started.elapsed()
    );
    Ok(trace)
}

/// Both return-compression settings, with checks that the traces really
/// exercise compression, several PSBs and syscalls leaving user mode.
fn check_program(rec: &Recording) -> Result<()> {
    let execution = &rec.execution;
    let with = roundtrip(execution, PtConfig::default())?;
    ensure!(
        with.stats.compressed_returns > 0,
        "no return was compressed"
    );
    ensure!(with.stats.psbs > 2, "only {} PSBs", with.stats.psbs);
    ensure!(
        with.stats.disables > 0 && with.stats.enables > 1,
        "no syscall left user mode: {:?}",
        with.stats
    );
    let without = roundtrip(
        execution,
        PtConfig {
            return_compression: false,
            ..PtConfig::default()
        },
    )?;
    ensure!(without.stats.compressed_returns == 0);
    ensure!(without.stats.uncompressed_returns > with.stats.uncompressed_returns);
    Ok(())
}

/// A scratch file, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    /// A new file; a counter keeps the names of tests running at the same
    /// time apart.
    fn new(name: &str, contents: &[u8]) -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "hwtrace-flow-qemu-{}-{n}-{name}",
            std::process::id()
        ));
        std::fs::write(&path, contents)?;
        Ok(Scratch(path))
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Deterministic text: `n` lines of pseudo-random words.
fn text(n: usize) -> String {
    const WORDS: [&str; 8] = [
        "branch", "trace", "packet", "return", "syscall", "psb", "tnt", "tip",
    ];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut out = String::new();
    for i in 0..n {
        for _ in 0..4 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            out += WORDS[(x >> 61) as usize];
            out.push(' ');
        }
        out += &format!("{}\n", x % 1000 + i as u64);
    }
    out
}

fn exited(rec: &Recording) -> Result<()> {
    ensure!(
        matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "{:?}",
        rec.end
    );
    Ok(())
}

#[test]
fn echo() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/echo", &["hello", "flow"], MAX_INSNS)?;
    exited(&rec)?;
    ensure!(
        rec.stdout == b"hello flow\n",
        "echo printed {:?}",
        rec.stdout
    );
    check_program(&rec)
}

#[test]
fn gzip() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let input = Scratch::new("gzip-input.txt", text(40).as_bytes())?;
    let rec = record("/usr/bin/gzip", &["-c", "-9", input.path()], MAX_INSNS)?;
    exited(&rec)?;
    ensure!(rec.stdout.starts_with(&[0x1f, 0x8b]), "no gzip stream");
    check_program(&rec)
}

#[test]
fn sort() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let unsorted = text(30);
    let input = Scratch::new("sort-input.txt", unsorted.as_bytes())?;
    let rec = record("/usr/bin/sort", &[input.path()], MAX_INSNS)?;
    exited(&rec)?;
    let mut want: Vec<&str> = unsorted.lines().collect();
    want.sort_unstable();
    let mut got: Vec<&str> = std::str::from_utf8(&rec.stdout)?.lines().collect();
    got.sort_unstable();
    ensure!(got == want, "sort lost or changed lines");
    check_program(&rec)
}

#[test]
fn python3_start_up() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/usr/bin/python3", &["-c", "pass"], PYTHON_INSNS)?;
    ensure!(rec.end == RecordEnd::Limit, "{:?}", rec.end);
    ensure!(rec.execution.len() >= PYTHON_INSNS);
    check_program(&rec)
}

/// Every PSB segment on its own, as a parallel decoder would see it: with
/// a PSB every 512 bytes, the trace from each PSB up to the PSB after next
/// decodes to exactly the executed instructions from that PSB's, at least
/// as far as the next PSB's (the rest of the slice ends mid-flow).
#[test]
fn every_psb_segment_decodes_on_its_own() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/echo", &["segments"], MAX_INSNS)?;
    exited(&rec)?;
    let executed: Vec<u64> = rec.execution.insns().iter().map(|ip| ip.0).collect();
    for return_compression in [true, false] {
        let config = PtConfig {
            return_compression,
            psb_period: 512,
            long_tnt: true,
            ..PtConfig::default()
        };
        let trace = PtEncoder::new(config).encode(&rec.execution)?;
        ensure!(trace.psbs.len() > 20, "only {} PSBs", trace.psbs.len());
        for (k, psb) in trace.psbs.iter().enumerate() {
            let from = usize::try_from(psb.offset.0)?;
            let to = match trace.psbs.get(k + 2) {
                Some(p) => usize::try_from(p.offset.0)?,
                None => trace.bytes.len(),
            };
            let next = trace
                .psbs
                .get(k + 1)
                .map_or(executed.len(), |p| p.insn_index);
            let mut dec = InsnDecoder::new(
                &trace.bytes[from..to],
                Config::default(),
                rec.execution.memory(),
            );
            let first = dec.sync_forward();
            let got = decode_on(&mut dec, first);
            let what = format!("retc={return_compression}, segment at {from:#x}..{to:#x}");
            ensure!(got.errors.is_empty(), "{what}: {:?}", got.errors);
            ensure!(
                got.ips.len() >= next - psb.insn_index,
                "{what}: {} instructions, the next PSB is {} on",
                got.ips.len(),
                next - psb.insn_index
            );
            let end = psb.insn_index + got.ips.len();
            ensure!(end <= executed.len(), "{what}: decoded past the end");
            check_same(&what, &got, &executed[psb.insn_index..end])?;
        }
    }
    Ok(())
}

/// The execution's code segments in scratch files, with their addresses.
fn code_files(execution: &Execution) -> Result<Vec<(Scratch, u64)>> {
    execution
        .memory()
        .segments()
        .iter()
        .enumerate()
        .map(|(n, seg)| {
            Ok((
                Scratch::new(&format!("seg{n}.bin"), &seg.bytes)?,
                seg.addr.0,
            ))
        })
        .collect()
}

/// Runs hwtrace with `args`; its stdout if it succeeded.
fn hwtrace(args: &[String]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Runs `hwtrace flow` over `trace` with the execution's code written out
/// as `--image` files; returns its stdout.
fn flow_cli(execution: &Execution, trace: &[u8], extra: &[&str]) -> Result<String> {
    let trace_file = Scratch::new("cli.pt", trace)?;
    let files = code_files(execution)?;
    let mut args = vec!["flow".to_owned(), trace_file.path().to_owned()];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    for (file, addr) in &files {
        args.push("--image".to_owned());
        args.push(format!("{}@{addr:x}", file.path()));
    }
    hwtrace(&args)
}

/// The block count of `hwtrace ptxed --block-decoder` (libipt's ptxed
/// command line, checked against libipt's corpus) over the same code.
fn ptxed_blocks(execution: &Execution, trace: &[u8]) -> Result<u64> {
    let trace_file = Scratch::new("ptxed.pt", trace)?;
    let files = code_files(execution)?;
    let mut args = vec!["ptxed".to_owned()];
    for (file, addr) in &files {
        args.push("--raw".to_owned());
        args.push(format!("{}:{addr:#x}", file.path()));
    }
    for a in [
        "--pt",
        trace_file.path(),
        "--block-decoder",
        "--stat",
        "--stat:blocks",
        "--quiet",
    ] {
        args.push(a.to_owned());
    }
    let text = hwtrace(&args)?;
    text.lines()
        .find_map(|l| l.strip_prefix("blocks:\t"))
        .and_then(|n| n.trim_end_matches('.').parse().ok())
        .with_context(|| format!("no block count in {text:?}"))
}

/// `hwtrace flow` end to end: the addresses printed are the executed ones.
#[test]
fn the_flow_command_prints_the_executed_instructions() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/echo", &["cli"], MAX_INSNS)?;
    exited(&rec)?;
    let trace = PtEncoder::new(PtConfig::default()).encode(&rec.execution)?;
    let stdout = flow_cli(&rec.execution, &trace.bytes, &["--no-disasm", "--stats"])?;
    let ips: Vec<u64> = stdout
        .lines()
        .filter(|l| !l.starts_with('['))
        .map(|l| u64::from_str_radix(l, 16))
        .collect::<Result<_, _>>()?;
    let executed: Vec<u64> = rec.execution.insns().iter().map(|ip| ip.0).collect();
    check_same(
        "hwtrace flow",
        &Decoded {
            ips,
            errors: Vec::new(),
        },
        &executed,
    )?;
    let stats = stdout.lines().last().unwrap_or_default();
    ensure!(
        stats.starts_with(&format!("[stats: {} instructions,", executed.len()))
            && stats.contains(" 0 errors,"),
        "{stats}"
    );
    // Syscalls leave user mode: tracing is disabled and enabled again.
    ensure!(stdout.lines().filter(|l| *l == "[disabled]").count() as u64 == trace.stats.disables);

    // Blocks: every instruction once, and as many blocks as ptxed's block
    // decoder draws.
    let blocks = flow_cli(
        &rec.execution,
        &trace.bytes,
        &["--blocks", "--quiet", "--stats"],
    )?;
    let stats = blocks.lines().last().unwrap_or_default();
    let want = ptxed_blocks(&rec.execution, &trace.bytes)?;
    ensure!(
        stats.starts_with(&format!(
            "[stats: {} instructions, {want} blocks,",
            executed.len()
        )),
        "{stats}; ptxed: {want} blocks"
    );
    Ok(())
}

/// `hwtrace flow --branches` against the execution itself: every taken
/// branch of the executed instruction sequence (iced-x86 classifies each
/// instruction; a conditional jump is taken when the next instruction is
/// not the one after it), in order; each SYSCALL ends tracing and the
/// instruction after it begins it again.
#[test]
fn the_branches_are_the_executed_ones() -> Result<()> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/ls", &["-d", "/"], MAX_INSNS)?;
    exited(&rec)?;
    let ips = rec.execution.insns();
    let code = rec.execution.memory();
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut syscalls = 0usize;
    for (ip, next) in ips.iter().zip(ips.iter().skip(1)) {
        let bytes = code
            .bytes_at(*ip)
            .context("executed code is in the image")?;
        let insn = Decoder::with_ip(64, bytes, ip.0, DecoderOptions::NONE).decode();
        let fall = ip.0 + insn.len() as u64;
        if insn.mnemonic() == Mnemonic::Syscall {
            syscalls += 1;
            continue;
        }
        let is_taken = match insn.flow_control() {
            FlowControl::Next | FlowControl::Exception => false,
            FlowControl::ConditionalBranch => next.0 != fall,
            _ => true,
        };
        if is_taken {
            taken.push((ip.0, next.0));
        }
    }
    let trace = PtEncoder::new(PtConfig::default()).encode(&rec.execution)?;
    let stdout = flow_cli(&rec.execution, &trace.bytes, &["--branches", "--json"])?;
    let hex = |v: &serde_json::Value| -> Option<u64> {
        u64::from_str_radix(v.as_str()?.trim_start_matches("0x"), 16).ok()
    };
    let (mut got, mut ends, mut begins) = (Vec::new(), 0usize, 0usize);
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        if v["type"] != "branch" {
            continue;
        }
        match (v["kind"].as_str(), v["ends_trace"].as_bool()) {
            (Some("tr strt"), _) => begins += 1,
            (Some("far call"), Some(true)) => ends += 1,
            _ => got.push((
                hex(&v["from"]).context("from")?,
                hex(&v["to"]).context("to")?,
            )),
        }
    }
    ensure!(taken.len() > 10_000, "{} branches", taken.len());
    if let Some(i) = (0..got.len().max(taken.len())).find(|&i| got.get(i) != taken.get(i)) {
        bail!(
            "{} branches printed, {} taken; branch {i}: printed {:x?}, executed {:x?}",
            got.len(),
            taken.len(),
            got.get(i..(i + 3).min(got.len())),
            taken.get(i..(i + 3).min(taken.len()))
        );
    }
    // The last SYSCALL (exit_group) is the last instruction: it has no pair.
    ensure!(
        ends == syscalls + 1,
        "{ends} trace ends, {syscalls} syscalls + exit"
    );
    ensure!(begins == syscalls + 1, "{begins} trace begins");
    Ok(())
}
