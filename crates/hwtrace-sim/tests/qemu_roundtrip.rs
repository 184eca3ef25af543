//! Real executions as ground truth: record programs with qemu-user, encode
//! the PT a CPU would have written for them, and decode it with Intel's
//! libipt over the execution's own code. The decoded instructions must be
//! exactly the executed ones, from the first PSB and from later PSBs.
//!
//! Needs `qemu-x86_64` and libipt 2.0.5 (`scripts/setup.sh`).

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use hwtrace_libipt::{Config, Image, Sections, insn_addresses};
use hwtrace_packet::find_psb_forward;
use hwtrace_sim::{EncodedTrace, Execution, Limits, PtConfig, PtEncoder, RecordEnd, Recording};

/// How many later PSBs each trace is also decoded from (spread over the
/// trace; decoding a suffix costs as much as the suffix is long).
const SUFFIX_STARTS: usize = 4;

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
    let executed: Vec<u64> = execution.insns().iter().map(|ip| ip.0).collect();

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

    // Later PSBs: libipt syncs at the first PSB of what it is given.
    let later = &trace.psbs[1.min(trace.psbs.len())..];
    let step = (later.len() / SUFFIX_STARTS).max(1);
    for psb in later.iter().step_by(step).take(SUFFIX_STARTS) {
        let offset = usize::try_from(psb.offset.0)?;
        let decoded = libipt_decode(execution, &trace.bytes[offset..])?;
        check_same(
            &format!("from the PSB at {:#x}", psb.offset.0),
            &decoded,
            &executed[psb.insn_index..],
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

#[test]
fn echo() -> Result<()> {
    ensure!(qemu_present(), "qemu-x86_64 missing: run scripts/setup.sh");
    let rec = record("/bin/echo", &["hi"], Limits::default())?;
    ensure!(rec.stdout == b"hi\n", "echo printed {:?}", rec.stdout);
    ensure!(matches!(rec.end, RecordEnd::Exited(s) if s.success()));
    check_program(&rec)
}
