//! Real executions as ground truth: record programs with qemu-user, encode
//! the PT a CPU would have written for them, and decode it with Intel's
//! libipt over the execution's own code. The decoded instructions must be
//! exactly the executed ones, from the first PSB and from later PSBs.
//!
//! Needs `qemu-x86_64` and libipt 2.0.5 (`scripts/setup.sh`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use hwtrace_libipt::{Config, Image, Sections, insn_addresses};
use hwtrace_packet::find_psb_forward;
use hwtrace_sim::{
    EncodedTrace, Execution, IpRange, Limits, PtConfig, PtEncoder, RecordEnd, Recording,
};
use hwtrace_types::Ip;

fn record(program: &str, args: &[&str], limits: Limits) -> Result<Recording> {
    let started = Instant::now();
    let rec = Execution::record_qemu(program, args, limits)
        .with_context(|| format!("recording {program} {args:?}"))?;
    eprintln!(
        "{program} {args:?}: {} instructions, {} code bytes in {} segments, {:?}, recorded in {:.1?}",
        rec.execution.len(),
        rec.execution.memory().len(),
        rec.execution.memory().segments().len(),
        rec.end,
        started.elapsed()
    );
    Ok(rec)
}

/// Decodes `trace` (from its first PSB) with libipt over the execution's
/// code.
fn libipt_decode(execution: &Execution, trace: &[u8]) -> Result<Vec<u64>> {
    let mut sections = Sections::new();
    for seg in execution.memory().segments() {
        sections
            .insert(seg.addr.0, &seg.bytes)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let image = Image::with_memory(&sections).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let (ips, errors) =
        insn_addresses(trace, &Config::default(), &image).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(errors.is_empty(), "libipt reported errors: {errors:?}");
    Ok(ips)
}

/// Where two instruction sequences first differ, for a readable failure.
fn check_same(what: &str, decoded: &[u64], executed: &[u64]) -> Result<()> {
    if decoded == executed {
        return Ok(());
    }
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

/// Encodes with `config`, decodes from the start and from later PSBs, and
/// compares with the execution.
fn roundtrip(execution: &Execution, config: PtConfig) -> Result<EncodedTrace> {
    let started = Instant::now();
    let trace = PtEncoder::new(config).encode(execution)?;
    // What a decoder can see: the instructions inside the IP filter (all,
    // without one). The tests' ranges end in gaps of unexecuted code, so no
    // straight-line flow crosses them and this is exactly what PacketEn
    // allows.
    let traced = |i: &usize| config.filter_allows(execution.insns()[*i]);
    let executed: Vec<u64> = (0..execution.len())
        .filter(traced)
        .map(|i| execution.insns()[i].0)
        .collect();
    // `position[i]`: how many traced instructions precede instruction i.
    let mut position = Vec::with_capacity(execution.len() + 1);
    let mut seen = 0;
    for i in 0..execution.len() {
        position.push(seen);
        seen += usize::from(traced(&i));
    }
    position.push(seen);

    // The PSBs the encoder reports are the ones in the bytes.
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = find_psb_forward(&trace.bytes, from) {
        found.push(at as u64);
        from = at + 1;
    }
    let marked: Vec<u64> = trace.psbs.iter().map(|p| p.offset.0).collect();
    ensure!(
        found == marked,
        "PSBs in the bytes {found:?} != reported {marked:?}"
    );

    let decoded = libipt_decode(execution, &trace.bytes)?;
    check_same("from the start", &decoded, &executed)?;

    // Later PSBs: libipt syncs at the first PSB of what it is given. Every
    // PSB is checked on the stretch up to the next PSB: what libipt decodes
    // from there must be the execution from that PSB's instruction on, at
    // least up to the next PSB's (it may walk on through code that needs no
    // packets). One PSB, in the middle, is decoded to the end of the trace.
    for (k, psb) in trace.psbs.iter().enumerate().skip(1) {
        let from = usize::try_from(psb.offset.0)?;
        let start = position[psb.insn_index];
        let (to, at_least) = match trace.psbs.get(k + 1) {
            Some(next) => (
                usize::try_from(next.offset.0)?,
                position[next.insn_index] - start,
            ),
            None => (trace.bytes.len(), executed.len() - start),
        };
        let decoded = libipt_decode(execution, &trace.bytes[from..to])?;
        let want = &executed[start..];
        let what = format!("from the PSB at {from:#x} to {to:#x}");
        check_same(&what, &decoded, &want[..decoded.len().min(want.len())])?;
        ensure!(
            decoded.len() >= at_least,
            "{what}: decoded {} instructions, executed {at_least} before the next PSB",
            decoded.len()
        );
    }
    if let Some(middle) = trace
        .psbs
        .get(trace.psbs.len() / 2)
        .filter(|p| p.insn_index > 0)
    {
        let from = usize::try_from(middle.offset.0)?;
        let decoded = libipt_decode(execution, &trace.bytes[from..])?;
        check_same(
            &format!("from the PSB at {from:#x} to the end"),
            &decoded,
            &executed[position[middle.insn_index]..],
        )?;
    }
    eprintln!(
        "  retc={} psb_period={} long_tnt={}: {} bytes, {:?}, checked in {:.1?}",
        config.return_compression,
        config.psb_period,
        config.long_tnt,
        trace.bytes.len(),
        trace.stats,
        started.elapsed()
    );
    Ok(trace)
}

/// Both return-compression settings; checks that compression was really
/// used (and really not used), and that the trace had more than one PSB so
/// suffix decoding was exercised.
fn check_program(rec: &Recording) -> Result<()> {
    let execution = &rec.execution;
    let with = roundtrip(execution, PtConfig::default())?;
    ensure!(
        with.stats.compressed_returns > 0,
        "no return was compressed"
    );
    ensure!(with.stats.psbs > 1, "only {} PSB", with.stats.psbs);
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
    ensure!(
        without.stats.uncompressed_returns
            == with.stats.uncompressed_returns + with.stats.compressed_returns,
        "every return must be a TIP without compression"
    );
    ensure!(
        without.bytes.len() > with.bytes.len(),
        "compression saved nothing"
    );
    Ok(())
}

fn qemu_present() -> bool {
    Path::new("/usr/bin/qemu-x86_64").exists()
}

/// A scratch file for a program's input, removed on drop.
struct Input(std::path::PathBuf);

impl Input {
    fn new(name: &str, contents: &[u8]) -> Result<Self> {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("hwtrace-sim-test-{}-{name}", std::process::id()));
        std::fs::write(&path, contents)?;
        Ok(Input(path))
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap_or_default()
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Deterministic text: `n` lines of pseudo-random words (a small LCG, so
/// the input is the same on every run).
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

#[test]
fn echo() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/echo", &["hi"], Limits::default())?;
    ensure!(rec.stdout == b"hi\n", "echo printed {:?}", rec.stdout);
    ensure!(matches!(rec.end, RecordEnd::Exited(s) if s.success()));
    check_program(&rec)
}

/// More configurations on one execution: TNT-64, a PSB every 256 bytes
/// (many PSB+, many suffix starts), TSC packets in PSB+.
#[test]
fn echo_other_configurations() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/echo", &["configurations"], Limits::default())?;
    for return_compression in [true, false] {
        let trace = roundtrip(
            &rec.execution,
            PtConfig {
                return_compression,
                psb_period: 256,
                long_tnt: true,
                tsc: Some(hwtrace_sim::TscModel {
                    start: 0x1_0000_0000,
                    ticks_per_insn: 3,
                }),
                ..PtConfig::default()
            },
        )?;
        ensure!(trace.stats.psbs > 50, "{:?}", trace.stats);
    }
    Ok(())
}

#[test]
fn gzip() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let input = Input::new("gzip-input.txt", text(400).as_bytes())?;
    let rec = record(
        "/usr/bin/gzip",
        &["-c", "-9", input.path()],
        Limits::default(),
    )?;
    ensure!(
        matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "{:?}",
        rec.end
    );
    ensure!(
        rec.stdout.starts_with(&[0x1f, 0x8b]),
        "gzip wrote no gzip stream"
    );
    check_program(&rec)
}

#[test]
fn sort() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let unsorted = text(50);
    let input = Input::new("sort-input.txt", unsorted.as_bytes())?;
    let rec = record("/usr/bin/sort", &[input.path()], Limits::default())?;
    ensure!(
        matches!(rec.end, RecordEnd::Exited(s) if s.success()),
        "{:?}",
        rec.end
    );
    // sort ran under qemu in the test's locale; compare bytewise only in C.
    let mut lines: Vec<&str> = unsorted.lines().collect();
    lines.sort_unstable();
    let got: Vec<&str> = std::str::from_utf8(&rec.stdout)?.lines().collect();
    let mut got_sorted = got.clone();
    got_sorted.sort_unstable();
    ensure!(got_sorted == lines, "sort lost or changed lines");
    check_program(&rec)
}

/// python3's start-up runs about 31.5 million instructions (qemu 7.2,
/// Debian bookworm's python3.11), over a minute of single-stepping; the
/// first `PYTHON_INSNS` of them (ld.so, libc and the interpreter's early
/// initialisation) keep the test near 20 s on two cores. The execution
/// then ends with FUP + TIP.PGD before the first instruction not recorded.
const PYTHON_INSNS: usize = 1_500_000;

#[test]
fn python3_start_up() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let limits = Limits {
        max_instructions: Some(PYTHON_INSNS),
        timeout: Some(Duration::from_secs(120)),
    };
    let rec = record("/usr/bin/python3", &["-c", "pass"], limits)?;
    ensure!(rec.end == RecordEnd::Limit, "{:?}", rec.end);
    ensure!(
        rec.execution.len() >= PYTHON_INSNS,
        "{}",
        rec.execution.len()
    );
    ensure!(rec.execution.successor().is_some());
    check_program(&rec)
}

#[test]
fn a_program_that_cannot_start_is_a_qemu_error() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    match Execution::record_qemu("/nonexistent/program", &["x"], Limits::default()) {
        // qemu 7.2 printf()s its reason and _exit()s, so with a pipe as
        // stdout the reason is lost; the status is what is left.
        Err(hwtrace_sim::RecordError::Qemu { status, .. }) => {
            ensure!(!status.success());
            Ok(())
        }
        other => bail!("expected a qemu error, got {other:?}"),
    }
}

/// A log written by qemu itself to a file, with `page` and `strace` lines
/// mixed in, reads as the same kind of execution, and its trace decodes.
#[test]
fn a_log_file_with_other_items_mixed_in() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let log = Input::new("true.log", b"")?;
    let status = std::process::Command::new("qemu-x86_64")
        .args(["-singlestep", "-d", "exec,nochain,in_asm,page,strace", "-D"])
        .arg(log.path())
        .arg("/bin/true")
        .status()?;
    ensure!(status.success());
    let text = std::fs::read(log.path())?;
    ensure!(
        text.windows(4).any(|w| w == b"mmap"),
        "no strace lines in the log: the test would prove nothing"
    );
    let execution = Execution::from_qemu_log(&text[..], &Limits::default())?;
    ensure!(execution.successor().is_none());
    eprintln!(
        "/bin/true from a log file: {} instructions",
        execution.len()
    );
    roundtrip(&execution, PtConfig::default())?;
    Ok(())
}

/// The address ranges of the execution's code, split where more than
/// 1 MiB of address space holds no executed code (between mapped objects:
/// the program, ld.so, libc, ...), with how many instructions ran in each.
fn code_clusters(execution: &Execution) -> Vec<(IpRange, usize)> {
    let mut clusters: Vec<IpRange> = Vec::new();
    for seg in execution.memory().segments() {
        let end = Ip(seg.end() - 1);
        match clusters.last_mut() {
            Some(last) if seg.addr.0 - last.end.0 <= 1 << 20 => last.end = end,
            _ => clusters.push(IpRange {
                start: seg.addr,
                end,
            }),
        }
    }
    clusters
        .into_iter()
        .map(|r| {
            let n = execution
                .insns()
                .iter()
                .filter(|&&ip| r.contains(ip))
                .count();
            (r, n)
        })
        .collect()
}

/// IP filtering: only one object's code traced, then everything but it
/// (up to four ranges), each with and without return compression. Taken
/// branches out of a range end in TIP.PGD, branches and returns from the
/// kernel into one start with TIP.PGE.
#[test]
fn ip_filters() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let input = Input::new("filter-input.txt", text(50).as_bytes())?;
    let rec = record("/usr/bin/sort", &[input.path()], Limits::default())?;
    let mut clusters = code_clusters(&rec.execution);
    eprintln!("code clusters: {clusters:x?}");
    ensure!(clusters.len() >= 2, "one cluster only: nothing to filter");
    clusters.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let busiest = [Some(clusters[0].0), None, None, None];
    let mut others = [None; 4];
    for (slot, &(range, _)) in others.iter_mut().zip(&clusters[1..]) {
        *slot = Some(range);
    }
    for ip_filter in [busiest, others] {
        for return_compression in [true, false] {
            let trace = roundtrip(
                &rec.execution,
                PtConfig {
                    return_compression,
                    ip_filter,
                    ..PtConfig::default()
                },
            )?;
            ensure!(
                trace.stats.enables > 1 && trace.stats.disables > 1,
                "{:?}",
                trace.stats
            );
        }
    }
    Ok(())
}

/// A program running past `Limits::timeout` is killed and reported.
#[test]
fn the_timeout_kills_the_program() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let limits = Limits {
        max_instructions: None,
        timeout: Some(Duration::from_millis(200)),
    };
    let started = Instant::now();
    match Execution::record_qemu("/usr/bin/python3", &["-c", "pass"], limits) {
        Err(hwtrace_sim::RecordError::Timeout(t)) => {
            ensure!(t == Duration::from_millis(200));
            // Killed, not waited for: the whole start-up takes minutes.
            ensure!(
                started.elapsed() < Duration::from_secs(20),
                "{:?}",
                started.elapsed()
            );
            Ok(())
        }
        other => bail!("expected a timeout, got {other:?}"),
    }
}
