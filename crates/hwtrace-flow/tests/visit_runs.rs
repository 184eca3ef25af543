//! [`Flow::visit_runs`] over [`FastSource::runs`] against the instruction
//! decoder's items: each run handed out whole must stand for exactly the
//! instructions the instruction decoder gives there (as many, contiguous,
//! all at the run's trace offset, plain but the last, the last with the
//! run's address, class and size), and every other item must be the
//! instruction decoder's own. Inputs: every libipt corpus case, the real
//! hardware traces, and real executions recorded with qemu-user (whole
//! and damaged). Needs `qemu-x86_64` (`scripts/setup.sh` installs Debian's
//! `qemu-user`).

use hwtrace_flow::Config;
use hwtrace_flow::insn::{FastDecoder, InsnClass, InsnDecoder};
use hwtrace_flow::parallel::{FastSource, Flow, FlowItem, MAX_STALL, PassedRun};
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder};
use hwtrace_types::{ReadMemory, TraceOffset};
use std::time::Duration;

mod common;
use common::{corpus_cases, real};

/// Ends a decode that would run away (none of these inputs come close).
const MAX_ITEMS: usize = 5_000_000;

/// What the runs-keeping decode gives: runs, and single items.
enum Got {
    Run(PassedRun),
    Item(FlowItem),
}

fn runs_decode<M: ReadMemory>(trace: &[u8], config: Config, mem: M) -> Vec<Got> {
    let src = FastSource::runs(FastDecoder::new(trace, config, mem), MAX_STALL);
    let mut flow = Flow::new(src);
    let mut out = Vec::new();
    while out.len() < MAX_ITEMS {
        flow.visit_runs(TraceOffset(u64::MAX), &mut |r| out.push(Got::Run(*r)));
        match flow.next() {
            Some(item) => out.push(Got::Item(item)),
            None => break,
        }
    }
    out
}

/// Checks `got` against the instruction decoder's items; returns the
/// instructions and how many of them came in runs.
fn agree<M: ReadMemory + Copy>(
    what: &str,
    trace: &[u8],
    config: Config,
    mem: M,
) -> Result<(usize, usize), String> {
    let want: Vec<FlowItem> = Flow::new(InsnDecoder::new(trace, config, mem))
        .take(MAX_ITEMS)
        .collect();
    let got = runs_decode(trace, config, mem);
    let mut at = 0;
    let mut in_runs = 0;
    for (k, g) in got.iter().enumerate() {
        match g {
            Got::Item(item) => {
                if want.get(at) != Some(item) {
                    return Err(format!(
                        "{what}: item {at} (got {k}): want {:?}, got {item:?}",
                        want.get(at)
                    ));
                }
                at += 1;
            }
            Got::Run(r) => {
                let n = r.run.insns as usize;
                let Some(insns) = want.get(at..at + n) else {
                    return Err(format!("{what}: run {r:?} past the end ({at})"));
                };
                let mut ip = r.run.ip.0;
                for (i, item) in insns.iter().enumerate() {
                    let FlowItem::Insn { offset, insn } = item else {
                        return Err(format!(
                            "{what}: item {} inside run {r:?}: {item:?}",
                            at + i
                        ));
                    };
                    let last = i + 1 == n;
                    let plain = matches!(insn.class, InsnClass::Other | InsnClass::Ptwrite);
                    let fits = *offset == r.before
                        && insn.ip == ip
                        && insn.mode == r.run.mode
                        && insn.speculative == r.run.speculative
                        && (last || plain)
                        && (!last
                            || (insn.class == r.run.end_class
                                && insn.ip == r.run.end_ip.0
                                && insn.size == r.run.end_size));
                    if !fits {
                        return Err(format!(
                            "{what}: item {} is not instruction {i} of run {r:?}: {item:?}",
                            at + i
                        ));
                    }
                    ip = ip.wrapping_add(u64::from(insn.size));
                }
                at += n;
                in_runs += n;
            }
        }
    }
    if at != want.len() {
        return Err(format!("{what}: {at} of {} items", want.len()));
    }
    let insns = want
        .iter()
        .filter(|i| matches!(i, FlowItem::Insn { .. }))
        .count();
    Ok((insns, in_runs))
}

#[test]
fn corpus_cases_visit_runs_as_the_insn_decoder_steps() {
    let mut failures = Vec::new();
    let (mut checked, mut insns, mut in_runs) = (0, 0, 0);
    for case in corpus_cases() {
        match agree(&case.name, &case.trace, case.config, &case.files) {
            Ok((n, r)) => {
                insns += n;
                in_runs += r;
            }
            Err(e) => failures.push(e),
        }
        checked += 1;
    }
    assert!(checked > 400, "only {checked} corpus cases found");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(insns > 1000 && in_runs > 0, "{in_runs} of {insns} in runs");
}

#[test]
fn real_traces_visit_runs_as_the_insn_decoder_steps() {
    let lenient = Config {
        lenient_status: true,
        ..Config::default()
    };
    for name in ["foo", "Unzip", "icelake_tip"] {
        let (trace, pages) = real(name);
        for config in [Config::default(), lenient] {
            let (insns, in_runs) =
                agree(name, &trace, config, &pages).unwrap_or_else(|e| panic!("{e}"));
            // Most of the work went through runs.
            assert!(
                in_runs * 10 >= insns * 9,
                "{name}: {in_runs} of {insns} instructions in runs"
            );
        }
    }
}

#[test]
fn qemu_executions_visit_runs_as_the_insn_decoder_steps() {
    let limits = Limits {
        max_instructions: Some(100_000),
        timeout: Some(Duration::from_secs(90)),
    };
    for (program, args) in [
        ("/usr/bin/sort", vec!["/etc/passwd"]),
        ("/bin/ls", vec!["-l", "/usr"]),
    ] {
        let rec = Execution::record_qemu(program, &args, limits)
            .unwrap_or_else(|e| panic!("recording {program} (qemu-user installed?): {e}"));
        let code = rec.execution.memory();
        for compression in [true, false] {
            let pt = PtConfig {
                return_compression: compression,
                ..PtConfig::default()
            };
            let trace = PtEncoder::new(pt)
                .encode(&rec.execution)
                .unwrap_or_else(|e| panic!("encoding {program}: {e}"))
                .bytes;
            let what = format!("{program} (return compression {compression})");
            let (insns, in_runs) =
                agree(&what, &trace, Config::default(), code).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(insns, rec.execution.len(), "{what}");
            assert!(
                in_runs * 10 >= insns * 9,
                "{what}: {in_runs} of {insns} in runs"
            );
            // Damaged: a byte flipped every 3 KiB, from 1 KiB on.
            let mut bad = trace.clone();
            for at in (1024..bad.len()).step_by(3072) {
                bad[at] ^= 0x5a;
            }
            agree(&format!("{what}, damaged"), &bad, Config::default(), code)
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
