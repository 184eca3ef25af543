//! The fast (block-cached) decoder against the instruction decoder: on
//! every libipt corpus case, the three real hardware traces and real
//! executions recorded with qemu-user, [`FastDecoder`]'s runs expanded into
//! instructions must be [`InsnDecoder`]'s instructions exactly, with the
//! same events and the same errors at the same offsets and IPs, whether
//! decoding goes on after an error at the next PSB or by `resync`.
//!
//! Needs `qemu-x86_64` for the executions (`scripts/setup.sh` installs
//! Debian's `qemu-user`).

use hwtrace_flow::event::Event;
use hwtrace_flow::insn::{FastDecoder, FastStep, Insn, InsnClass, InsnDecoder};
use hwtrace_flow::{Config, Error, ErrorKind, SyncProgress};
use hwtrace_packet::ExecMode;
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder, RecordEnd, TscModel};
use hwtrace_types::ReadMemory;
use std::path::Path;
use std::time::Duration;

mod common;
use common::{corpus_cases, real};

/// What a decode reports, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    Insn {
        ip: u64,
        size: u8,
        mode: Option<ExecMode>,
        class: InsnClass,
        speculative: bool,
        target: Option<u64>,
        bytes: Vec<u8>,
    },
    Event(Event),
    Error(Error),
    SyncError(Error),
}

fn insn_item(i: &Insn) -> Item {
    Item::Insn {
        ip: i.ip,
        size: i.size,
        mode: i.mode,
        class: i.class,
        speculative: i.speculative,
        target: i.target,
        bytes: i.bytes().to_vec(),
    }
}

/// How decoding goes on after an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recover {
    NextPsb,
    Resync,
}

/// Ends a decode that would run away (none of these inputs come close).
const MAX_ITEMS: usize = 5_000_000;

/// The instruction decoder driven as ptxed drives it: events drained, an
/// instruction decoded before its branch failed counted.
fn reference<M: ReadMemory>(trace: &[u8], config: Config, mem: M, how: Recover) -> Vec<Item> {
    let mut dec = InsnDecoder::new(trace, config, mem);
    let mut out = Vec::new();
    let mut progress = SyncProgress::new();
    let mut sync = dec.sync_forward();
    'sync: while out.len() < MAX_ITEMS {
        let mut status = match sync {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(e) => {
                out.push(Item::SyncError(e));
                if !progress.moved(dec.offset()) {
                    break;
                }
                sync = dec.sync_forward();
                continue;
            }
        };
        while out.len() < MAX_ITEMS {
            while status.event_pending {
                match dec.event() {
                    Ok((ev, s)) => {
                        out.push(Item::Event(ev));
                        status = s;
                    }
                    Err(e) => {
                        out.push(Item::Error(e));
                        sync = recover_insn(&mut dec, how);
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
                    out.push(insn_item(&insn));
                    status = s;
                }
                Err(e) => {
                    if insn.class != InsnClass::Unknown {
                        out.push(insn_item(&insn));
                    }
                    if e.kind == ErrorKind::Eos {
                        break 'sync;
                    }
                    out.push(Item::Error(e));
                    sync = recover_insn(&mut dec, how);
                    continue 'sync;
                }
            }
        }
    }
    out
}

fn recover_insn<M: ReadMemory>(
    dec: &mut InsnDecoder<'_, M>,
    how: Recover,
) -> Result<hwtrace_flow::event::Status, Error> {
    match how {
        Recover::NextPsb => dec.sync_forward(),
        Recover::Resync => dec.resync().or_else(|_| dec.sync_forward()),
    }
}

/// The fast decoder, its runs expanded; also how many runs it gave.
fn fast<M: ReadMemory>(trace: &[u8], config: Config, mem: M, how: Recover) -> (Vec<Item>, usize) {
    let mut dec = FastDecoder::new(trace, config, mem);
    let mut out = Vec::new();
    let mut runs = 0;
    let mut progress = SyncProgress::new();
    let mut sync = dec.sync_forward();
    'sync: while out.len() < MAX_ITEMS {
        match sync {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(e) => {
                out.push(Item::SyncError(e));
                if !progress.moved(dec.offset()) {
                    break;
                }
                sync = dec.sync_forward();
                continue;
            }
        }
        while out.len() < MAX_ITEMS {
            match dec.next() {
                Ok(Some(FastStep::Run(run))) => {
                    runs += 1;
                    assert!(run.insns >= 1, "an empty run at {:?}", run.ip);
                    let mut n = 0;
                    let mut last = None;
                    dec.expand(&run, |i| {
                        out.push(insn_item(i));
                        n += 1;
                        last = Some((i.ip, i.class));
                    })
                    .expect("a run's instructions decode again");
                    assert_eq!(n, run.insns);
                    assert_eq!(last, Some((run.end_ip.0, run.end_class)));
                }
                Ok(Some(FastStep::Event(ev))) => out.push(Item::Event(ev)),
                Ok(None) => break 'sync,
                Err(e) => {
                    out.push(Item::Error(e));
                    sync = match how {
                        Recover::NextPsb => dec.sync_forward(),
                        Recover::Resync => dec.resync().or_else(|_| dec.sync_forward()),
                    };
                    continue 'sync;
                }
            }
        }
    }
    (out, runs)
}

/// What a decode gave: instructions, runs (fast decoder) and errors.
#[derive(Clone, Copy, Debug)]
struct Counts {
    insns: usize,
    runs: usize,
    errors: usize,
}

/// Compares the two decodes.
fn same<M: ReadMemory + Copy>(
    what: &str,
    trace: &[u8],
    config: Config,
    mem: M,
    how: Recover,
) -> Result<Counts, String> {
    let want = reference(trace, config, mem, how);
    let (got, runs) = fast(trace, config, mem, how);
    if want == got {
        let count = |f: fn(&Item) -> bool| want.iter().filter(|i| f(i)).count();
        return Ok(Counts {
            insns: count(|i| matches!(i, Item::Insn { .. })),
            runs,
            errors: count(|i| matches!(i, Item::Error(_) | Item::SyncError(_))),
        });
    }
    let at = want
        .iter()
        .zip(&got)
        .position(|(a, b)| a != b)
        .unwrap_or(want.len().min(got.len()));
    Err(format!(
        "{what} ({how:?}): item {at} of {} (fast: {}): insn decoder {:?}, fast decoder {:?}",
        want.len(),
        got.len(),
        want.get(at),
        got.get(at)
    ))
}

// ----- memory -----

/// Files loaded at addresses (libipt's corpus images).
#[test]
fn corpus_cases_decode_alike() {
    let (mut checked, mut insns, mut errors) = (0, 0, 0);
    let mut failures = Vec::new();
    for case in corpus_cases() {
        let (name, trace, files) = (&case.name, &case.trace, &case.files);
        let base = case.config;
        let ticking = Config {
            tick_events: true,
            ..base
        };
        for (config, how) in [
            (base, Recover::NextPsb),
            (base, Recover::Resync),
            (ticking, Recover::NextPsb),
        ] {
            match same(name, trace, config, files, how) {
                Ok(c) => {
                    insns += c.insns;
                    errors += c.errors;
                }
                Err(e) => failures.push(e),
            }
        }
        checked += 1;
    }
    assert!(checked > 400, "only {checked} corpus cases found");
    assert!(insns > 1000, "only {insns} instructions in the corpus");
    assert!(errors > 100, "only {errors} errors in the corpus");
    assert!(
        failures.is_empty(),
        "{} decodes of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn real_traces_decode_alike() {
    // icelake_tip is a few packets that libipt's ptxed, too, stops at
    // with an error before any instruction: only the error is compared.
    // Also reading tracing's status as perf does (`lenient_status`), which
    // decodes on where libipt stops on Unzip and icelake_tip.
    let lenient = Config {
        lenient_status: true,
        ..Config::default()
    };
    for (name, min_insns) in [("foo", 100_000), ("Unzip", 1000), ("icelake_tip", 0)] {
        let (trace, pages) = real(name);
        for (how, config) in [
            (Recover::NextPsb, Config::default()),
            (Recover::Resync, Config::default()),
            (Recover::NextPsb, lenient),
        ] {
            let Counts { insns, runs, .. } =
                same(name, &trace, config, &pages, how).unwrap_or_else(|e| panic!("{e}"));
            assert!(insns >= min_insns, "{name}: only {insns} instructions");
            // The fast path did the work: runs hold several instructions.
            assert!(
                insns == 0 || runs * 2 < insns,
                "{name}: {runs} runs for {insns} instructions"
            );
        }
    }
}

/// Traces of real executions (the first 100,000 instructions of each):
/// with and without return compression, with timing (tick events), and
/// with bytes damaged so errors come up in the middle of hot code.
#[test]
fn qemu_executions_decode_alike() {
    assert!(
        Path::new("/usr/bin/qemu-x86_64").exists(),
        "qemu-x86_64 missing: install Debian's qemu-user (scripts/setup.sh)"
    );
    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-fast-exact-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let input = scratch.join("input.txt");
    let text: String = (0..300)
        .map(|i| format!("line {i} of branch trace text {}\n", i * 7919 % 1000))
        .collect();
    std::fs::write(&input, text).expect("writing the input");
    let input = input.to_str().expect("UTF-8 temp path").to_string();
    let programs: [(&str, Vec<&str>); 3] = [
        ("/usr/bin/gzip", vec!["-c", "-9", &input]),
        ("/usr/bin/sort", vec![&input]),
        ("/bin/echo", vec!["hello", "fast", "decoder"]),
    ];
    for (program, args) in programs {
        let limits = Limits {
            max_instructions: Some(100_000),
            timeout: Some(Duration::from_secs(90)),
        };
        let rec = Execution::record_qemu(program, &args, limits)
            .unwrap_or_else(|e| panic!("recording {program}: {e}"));
        assert!(
            matches!(rec.end, RecordEnd::Limit)
                || matches!(rec.end, RecordEnd::Exited(s) if s.success()),
            "{program}: {:?}",
            rec.end
        );
        let code = rec.execution.memory();
        let executed = rec.execution.len();
        let configs = [
            PtConfig::default(),
            PtConfig {
                return_compression: false,
                psb_period: 512,
                long_tnt: true,
                ..PtConfig::default()
            },
            PtConfig {
                tsc: Some(TscModel {
                    start: 1000,
                    ticks_per_insn: 3,
                }),
                ..PtConfig::default()
            },
        ];
        for (k, pt) in configs.into_iter().enumerate() {
            let trace = PtEncoder::new(pt)
                .encode(&rec.execution)
                .unwrap_or_else(|e| panic!("encoding {program}: {e}"))
                .bytes;
            let config = Config {
                tick_events: pt.tsc.is_some(),
                ..Config::default()
            };
            let what = format!("{program} config {k}");
            let Counts { insns, runs, .. } = same(&what, &trace, config, code, Recover::NextPsb)
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(insns, executed, "{what}: not every instruction decoded");
            assert!(
                runs * 2 < insns,
                "{what}: {runs} runs for {insns} instructions"
            );
            if k != 0 {
                continue;
            }
            // Damage: a byte flipped every 3 KiB, from 1 KiB on.
            let mut bad = trace.clone();
            for at in (1024..bad.len()).step_by(3072) {
                bad[at] ^= 0x5a;
            }
            for how in [Recover::NextPsb, Recover::Resync] {
                let c = same(&format!("{what}, damaged"), &bad, config, code, how)
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(c.errors > 0, "{what}, damaged ({how:?}): no error");
                assert!(c.insns > 0, "{what}, damaged ({how:?}): nothing decoded");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
