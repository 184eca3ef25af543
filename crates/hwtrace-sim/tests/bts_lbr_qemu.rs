//! A real program as ground truth for BTS and LBR: `/bin/true` recorded
//! with qemu-user, its taken branches derived, checked against the executed
//! instruction stream, then written by the BTS and LBR simulators and
//! decoded back.
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`).

use anyhow::{Context, Result, ensure};
use hwtrace_regs::Uarch;
use hwtrace_regs::debugctl::{DebugCtl, DebugCtlFlag, DebugCtlLayout};
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::dump::{BtsDump, BtsOrder};
use hwtrace_sim::decode::{bts_branches, lbr_branches};
use hwtrace_sim::{
    Branch, BranchKind, BtsConfig, BtsSim, Execution, LbrConfig, LbrSim, Limits, RecordedBranch,
    branches,
};
use iced_x86::{Decoder, DecoderOptions};

/// Every place the instruction stream does not fall through is a branch
/// of the derived stream, in order, and every derived branch goes where
/// the execution went next.
fn check_against_instructions(execution: &Execution, stream: &[Branch]) -> Result<()> {
    let insns = execution.insns();
    let mut jumps = Vec::new();
    for (i, pair) in insns.windows(2).enumerate() {
        let bytes = execution
            .memory()
            .bytes_at(pair[0])
            .with_context(|| format!("no code at {}", pair[0]))?;
        let bytes = &bytes[..bytes.len().min(15)];
        let insn = Decoder::with_ip(64, bytes, pair[0].0, DecoderOptions::NONE).decode();
        ensure!(!insn.is_invalid(), "undecodable at {}", pair[0]);
        if pair[1].0 != pair[0].0 + insn.len() as u64 {
            jumps.push((i, pair[0], pair[1]));
        }
    }
    let mut it = stream.iter();
    for &(i, from, to) in &jumps {
        ensure!(
            it.any(|b| b.from == from && b.to == to),
            "discontinuity {i} ({from} -> {to}) is not in the branch stream in order"
        );
    }
    // Branches to the fall-through (taken Jcc/JMP/CALL to the next
    // instruction) are the only ones that are not discontinuities.
    let extra = stream.len() - jumps.len();
    let to_next = stream
        .iter()
        .filter(|b| {
            execution.memory().bytes_at(b.from).is_some_and(|bytes| {
                let bytes = &bytes[..bytes.len().min(15)];
                let insn = Decoder::with_ip(64, bytes, b.from.0, DecoderOptions::NONE).decode();
                b.to.0 == b.from.0 + insn.len() as u64
            })
        })
        .count();
    ensure!(
        extra == to_next,
        "{extra} branches are not discontinuities, {to_next} go to the next instruction"
    );
    Ok(())
}

/// Runs `program` under qemu-x86_64 with the log `Execution::from_qemu_log`
/// reads, written to a file (simpler than the streaming recorder, and
/// `/bin/true` logs only a few MB).
fn record(program: &str) -> Result<Execution> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-bts-lbr-qemu-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("qemu.log");
    let status = std::process::Command::new("qemu-x86_64")
        .args(["-singlestep", "-d", "exec,nochain,in_asm", "-D"])
        .arg(&log)
        .arg(program)
        .stdin(std::process::Stdio::null())
        .status()
        .context("running qemu-x86_64 (scripts/setup.sh installs it)")?;
    ensure!(status.success(), "{program} under qemu: {status}");
    let file = std::io::BufReader::new(std::fs::File::open(&log)?);
    let execution = Execution::from_qemu_log(file, &Limits::default())?;
    std::fs::remove_dir_all(&dir)?;
    Ok(execution)
}

#[test]
fn bin_true_branches_survive_bts_and_lbr() -> Result<()> {
    let execution = record("/bin/true")?;
    let stream = branches(&execution)?;
    eprintln!(
        "/bin/true: {} instructions, {} taken branches",
        execution.len(),
        stream.len()
    );
    ensure!(stream.len() > 1000, "too few branches: {}", stream.len());
    check_against_instructions(&execution, &stream)?;

    // BTS, 64-bit layout: 4096 records, interrupt at 4000, drained.
    let debugctl = [DebugCtlFlag::Tr, DebugCtlFlag::Bts, DebugCtlFlag::Btint]
        .into_iter()
        .try_fold(DebugCtl::new(DebugCtlLayout::Modern), |c, f| {
            c.with(f, true)
        })?;
    let base = 0xFFFF_FE00_0000_0000;
    let config = BtsConfig {
        format: DsFormat::Bits64,
        area: DsManagementArea {
            bts_buffer_base: base,
            bts_index: base,
            bts_absolute_maximum: base + 4096 * 24,
            bts_interrupt_threshold: base + 4000 * 24,
            ..DsManagementArea::default()
        },
        debugctl,
        pmi_latency: 10,
    };
    let mut sim = BtsSim::new(config)?;
    let (report, drained) = sim.run_draining(&stream)?;
    ensure!(report.lost == 0 && report.written == stream.len() as u64);
    let mut got = bts_branches(&BtsDump::raw(&drained, DsFormat::Bits64)?);
    let area = DsManagementArea::parse(&sim.area_bytes()?, DsFormat::Bits64)?;
    got.extend(bts_branches(&BtsDump::new(
        &area,
        sim.buffer(),
        DsFormat::Bits64,
        BtsOrder::Linear,
    )?));
    let want: Vec<_> = stream.iter().map(RecordedBranch::bts).collect();
    ensure!(
        got == want,
        "BTS decoded {} branches, {} executed",
        got.len(),
        want.len()
    );

    // LBR on Skylake (32 entries, no filter) and on Westmere and Sandy
    // Bridge with 0x1C4: the last entries the filter keeps.
    for (uarch, select) in [
        (Uarch::Skylake, 0),
        (Uarch::Westmere, 0x1C4),
        (Uarch::SandyBridge, 0x1C4),
        (Uarch::SandyBridge, 0x28),
    ] {
        let config = LbrConfig::for_uarch(uarch)?.with_select(select);
        let mut sim = LbrSim::new(config)?;
        sim.run(&stream)?;
        let got = lbr_branches(&sim.snapshot().stack()?);
        let kept: Vec<_> = stream
            .iter()
            .filter(|b| {
                let calls_or_rets = matches!(
                    b.kind,
                    BranchKind::NearRelCall | BranchKind::NearIndCall | BranchKind::NearRet
                );
                match (uarch, select) {
                    (_, 0) => true,
                    // Westmere's JMP filters drop calls and returns as well.
                    (Uarch::Westmere, _) => false,
                    (_, 0x1C4) => calls_or_rets,
                    _ => !matches!(b.kind, BranchKind::NearRelCall | BranchKind::NearRet),
                }
            })
            .map(|b| RecordedBranch::lbr(b, true))
            .collect();
        let start = kept.len().saturating_sub(usize::from(config.depth));
        ensure!(
            got == kept[start..],
            "{uarch} with {select:#x}: decoded {got:?}, expected {:?}",
            &kept[start..]
        );
    }
    Ok(())
}
