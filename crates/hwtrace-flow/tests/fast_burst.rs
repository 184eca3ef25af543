//! [`FastDecoder::next_runs`] against [`FastDecoder::next`]: runs taken a
//! burst at a time must be the runs `next` gives one by one — the same
//! runs with the same offsets, the same offset before each (what a driver
//! reports the run's instructions at), the same result after each
//! (`step_result`), and after each burst the same IP and time — and the
//! events and errors between them must not change. (`next` itself is
//! checked against the instruction decoder by `fast_exact.rs`.) Bursts
//! counted ([`FastDecoder::tally_runs`]) must add up to those same runs,
//! keep whole exactly the ones they promise to, and stop where asked.
//!
//! Inputs: every libipt corpus case (events of every kind between and in
//! the middle of TNT runs, errors, both ways of going on after one), the
//! real hardware traces, a real execution recorded with qemu-user, whole
//! and with damaged bytes. Needs `qemu-x86_64` (`scripts/setup.sh`
//! installs Debian's `qemu-user`).

use hwtrace_flow::event::Status;
use hwtrace_flow::insn::{BlockRun, Counted, FastDecoder, FastStep, RunBuffer, RunTally};
use hwtrace_flow::{Config, Error, ErrorKind, SyncProgress};
use hwtrace_sim::{Execution, Limits, PtConfig, PtEncoder};
use hwtrace_types::{ReadMemory, TraceOffset};
use std::path::Path;
use std::time::Duration;

mod common;
use common::{corpus_cases, real};

/// One thing a decode reports.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Item {
    /// A run, the offset before it and the result after it; the IP and
    /// time after it where the burst's caller can see them (after the
    /// last run of a burst, and after every run taken with `next`).
    Run {
        run: BlockRun,
        before: TraceOffset,
        result: Result<Status, Error>,
        after: Option<(u64, (u64, bool))>,
    },
    Event(String),
    Error(Error),
    SyncError(Error),
}

/// Ends a decode that would run away (none of these inputs come close).
const MAX_ITEMS: usize = 3_000_000;

/// The items of the runs of a burst `dec` just took, the first at
/// `before`: no status but after the last, which has the decoder's.
fn burst_items<M: ReadMemory>(
    dec: &FastDecoder<'_, M>,
    runs: &RunBuffer,
    before: TraceOffset,
) -> Vec<Item> {
    let n = runs.len();
    let mut at = before;
    let mut items = Vec::with_capacity(n);
    for (i, run) in runs.iter().enumerate() {
        let last = i + 1 == n;
        items.push(Item::Run {
            run,
            before: at,
            result: if last {
                dec.step_result()
            } else {
                Ok(Status::default())
            },
            after: last.then(|| (dec.ip(), dec.time())),
        });
        at = run.offset;
    }
    items
}

/// Decodes `trace` with `next` alone (`cap == 0`) or with bursts of at
/// most `cap` runs, `next` taking what a burst leaves; counts the runs
/// that came from bursts and the TNT paths cached at the end.
fn decode<M: ReadMemory>(
    trace: &[u8],
    config: Config,
    mem: M,
    resync: bool,
    cap: usize,
) -> (Vec<Item>, usize, Paths) {
    decode_with(&mut FastDecoder::new(trace, config, mem), resync, cap)
}

/// [`decode`] with the decoder `dec`.
fn decode_with<M: ReadMemory>(
    dec: &mut FastDecoder<'_, M>,
    resync: bool,
    cap: usize,
) -> (Vec<Item>, usize, Paths) {
    let mut buf = RunBuffer::with_capacity(cap.max(1));
    let (mut out, mut burst_runs) = (Vec::new(), 0);
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
            let before = dec.offset();
            if cap > 0 && dec.next_runs(&mut buf) > 0 {
                let n = buf.len();
                burst_runs += n;
                out.extend(burst_items(dec, &buf, before));
                continue;
            }
            match dec.next() {
                Ok(Some(FastStep::Run(run))) => out.push(Item::Run {
                    run,
                    before,
                    result: dec.step_result(),
                    after: Some((dec.ip(), dec.time())),
                }),
                Ok(Some(FastStep::Event(ev))) => out.push(Item::Event(format!("{ev:?}"))),
                Ok(None) => break 'sync,
                Err(e) => {
                    out.push(Item::Error(e));
                    sync = if resync {
                        dec.resync().or_else(|_| dec.sync_forward())
                    } else {
                        dec.sync_forward()
                    };
                    continue 'sync;
                }
            }
        }
    }
    let paths = Paths {
        all: dec.cached_paths(),
        partial: dec.cached_partial_paths(),
        passed_events: 0,
        octets: 0,
        leaps: 0,
    };
    (out, burst_runs, paths)
}

/// The TNT paths a decode cached: how many, and how many of them stop
/// before using all their bits; and the events its counted bursts passed
/// over.
#[derive(Clone, Copy, Debug, Default)]
struct Paths {
    all: usize,
    partial: usize,
    /// Events counted bursts passed over (disable/enable pairs, when
    /// asked to).
    passed_events: u64,
    /// Runs of eight TNT-8 packets counted bursts remembered together.
    octets: usize,
    /// Leaps over a few bytes of trace counted bursts remembered.
    leaps: usize,
}

/// How counted bursts are asked for ([`tally_decode`]).
#[derive(Clone, Copy)]
struct Bursts {
    cap: usize,
    reach: u64,
    toggles: bool,
}

/// Decodes `trace` with counted bursts of at most `cap` runs, each asked
/// to stop `reach` bytes past where it starts, and checks them against
/// `want` (the items of `next` alone): a burst's counted runs must add up
/// as the same runs one by one do, its kept runs must be the next ones
/// whole, the burst must stop at the first run taken at or past where it
/// was asked to (and keep it), and keep the run an error follows.
/// With `toggles`, bursts pass over disable/enable pairs: those events
/// come between the runs counted. Returns how many runs the bursts held,
/// how many events they passed over and how many runs of eight TNT-8
/// packets the decoder remembered together.
fn tally_decode<M: ReadMemory>(
    want: &[Item],
    trace: &[u8],
    config: Config,
    mem: M,
    resync: bool,
    bursts: Bursts,
) -> Result<(usize, u64, (usize, usize)), String> {
    let Bursts {
        cap,
        reach,
        toggles,
    } = bursts;
    let mut dec = FastDecoder::new(trace, config, mem);
    let mut tally = RunTally::with_capacity(cap);
    tally.set_passes_toggles(toggles);
    let mut i = 0;
    let mut counted_runs = 0;
    let mut passed_events = 0;
    let mut progress = SyncProgress::new();
    let mut sync = dec.sync_forward();
    let expect = |i: &mut usize, got: Item| -> Result<(), String> {
        match want.get(*i) {
            Some(w) if agree(w, &got) => {
                *i += 1;
                Ok(())
            }
            w => Err(format!("item {i}: next {w:?}, counted bursts {got:?}")),
        }
    };
    'sync: while i < want.len() {
        match sync {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::Eos => break,
            Err(e) => {
                expect(&mut i, Item::SyncError(e))?;
                if !progress.moved(dec.offset()) {
                    break;
                }
                sync = dec.sync_forward();
                continue;
            }
        }
        loop {
            let before = dec.offset();
            let until = TraceOffset(before.0.saturating_add(reach));
            if dec.tally_runs(&mut tally, until) > 0 {
                // The counted runs are the next ones of `want`.
                let c = *tally.counted();
                let mut sum = Counted {
                    last_at: before,
                    end: before,
                    ..Counted::default()
                };
                // Events passed over (a disable and an enable, when the
                // tally passes toggles) come between runs: the run after
                // them is taken where they end.
                let mut j = i;
                let mut events = 0;
                let skip_events = |j: &mut usize, events: &mut u64| {
                    while toggles
                        && *events < tally.events()
                        && matches!(want.get(*j), Some(Item::Event(_)))
                    {
                        *j += 1;
                        *events += 1;
                    }
                };
                for _ in 0..c.runs {
                    let passed = events;
                    skip_events(&mut j, &mut events);
                    let Some(Item::Run {
                        run, before: at, ..
                    }) = want.get(j)
                    else {
                        return Err(format!("item {j}: counted a run, next {:?}", want.get(j)));
                    };
                    if events > passed {
                        sum.end = *at;
                    }
                    if *at != sum.end {
                        return Err(format!(
                            "item {j}: run taken at {at:?}, the one before ended at {:?}",
                            sum.end
                        ));
                    }
                    if run.offset >= until {
                        return Err(format!("item {j}: counted past {until:?}: {run:?}"));
                    }
                    j += 1;
                    sum.runs += 1;
                    sum.insns += u64::from(run.insns);
                    if *at == sum.last_at {
                        sum.last_insns += u64::from(run.insns);
                    } else {
                        sum.last_at = *at;
                        sum.last_insns = u64::from(run.insns);
                    }
                    sum.end = run.offset;
                }
                let passed = events;
                skip_events(&mut j, &mut events);
                if events > passed {
                    // The kept runs are taken where the events end.
                    sum.end = c.end;
                }
                if events != tally.events() {
                    return Err(format!(
                        "item {i}: the burst passed over {} events, {events} of them seen",
                        tally.events()
                    ));
                }
                if c != sum {
                    return Err(format!(
                        "item {i}: counted {c:?}, the runs add up to {sum:?}"
                    ));
                }
                i = j;
                passed_events += events;
                counted_runs += c.runs + tally.kept().len();
                let kept = tally.kept();
                if tally.reached_until() != kept.iter().any(|r| r.offset >= until) {
                    return Err(format!(
                        "item {i}: reached {until:?}: {}, kept {:?}",
                        tally.reached_until(),
                        kept.iter().collect::<Vec<_>>()
                    ));
                }
                if kept.is_empty() && dec.step_result().is_err() {
                    return Err(format!("item {i}: an error after a counted run"));
                }
                for item in burst_items(&dec, kept, sum.end) {
                    expect(&mut i, item)?;
                }
                continue;
            }
            match dec.next() {
                Ok(Some(FastStep::Run(run))) => expect(
                    &mut i,
                    Item::Run {
                        run,
                        before,
                        result: dec.step_result(),
                        after: Some((dec.ip(), dec.time())),
                    },
                )?,
                Ok(Some(FastStep::Event(ev))) => expect(&mut i, Item::Event(format!("{ev:?}")))?,
                Ok(None) => break 'sync,
                Err(e) => {
                    expect(&mut i, Item::Error(e))?;
                    sync = if resync {
                        dec.resync().or_else(|_| dec.sync_forward())
                    } else {
                        dec.sync_forward()
                    };
                    continue 'sync;
                }
            }
        }
    }
    if i != want.len() {
        return Err(format!(
            "counted bursts stopped at item {i} of {}",
            want.len()
        ));
    }
    Ok((
        counted_runs,
        passed_events,
        (dec.cached_octets(), dec.cached_leaps()),
    ))
}

/// Whether `got` (bursts) says what `want` (`next`) says: the IP and time
/// are compared where the burst decode could see them.
fn agree(want: &Item, got: &Item) -> bool {
    match (want, got) {
        (
            Item::Run {
                run: a,
                before: b1,
                result: r1,
                after: w,
            },
            Item::Run {
                run: b,
                before: b2,
                result: r2,
                after: g,
            },
        ) => a == b && b1 == b2 && r1 == r2 && (g.is_none() || g == w),
        _ => want == got,
    }
}

/// Runs the decode with `next` alone and with bursts of several sizes;
/// returns how many runs there were, how many the bursts gave and how many
/// TNT paths they cached (bursts of the largest size).
fn same<M: ReadMemory + Copy>(
    what: &str,
    trace: &[u8],
    config: Config,
    mem: M,
    resync: bool,
) -> Result<(usize, usize, Paths), String> {
    let (want, _, no_paths) = decode(trace, config, mem, resync, 0);
    assert_eq!(no_paths.all, 0, "{what}: next alone cached TNT paths");
    let (mut burst_runs, mut paths) = (0, Paths::default());
    for cap in [1, 3, 256] {
        let (got, runs, p) = decode(trace, config, mem, resync, cap);
        burst_runs = runs;
        paths = p;
        let diff = want
            .iter()
            .zip(&got)
            .position(|(a, b)| !agree(a, b))
            .or((want.len() != got.len()).then(|| want.len().min(got.len())));
        if let Some(at) = diff {
            return Err(format!(
                "{what} (resync {resync}, bursts of {cap}): item {at} of {} (bursts: {}): next {:?}, bursts {:?}",
                want.len(),
                got.len(),
                want.get(at),
                got.get(at)
            ));
        }
    }
    let runs = want
        .iter()
        .filter(|i| matches!(i, Item::Run { .. }))
        .count();
    for (cap, reach, toggles) in [
        (1, u64::MAX, false),
        (3, 100, false),
        (256, u64::MAX, false),
        (256, 2000, false),
        (256, 1, false),
        (3, 100, true),
        (256, u64::MAX, true),
    ] {
        let bursts = Bursts {
            cap,
            reach,
            toggles,
        };
        let (counted, events, (octets, leaps)) =
            tally_decode(&want, trace, config, mem, resync, bursts).map_err(|e| {
                format!(
                    "{what} (resync {resync}, counted bursts of {cap}, reach {reach}, passing \
                     toggles {toggles}): {e}"
                )
            })?;
        paths.passed_events = paths.passed_events.max(events);
        paths.octets = paths.octets.max(octets);
        paths.leaps = paths.leaps.max(leaps);
        // Without a stop, the same bursts as `next_runs`'s.
        if cap == 256 && reach == u64::MAX && !toggles && counted != burst_runs {
            return Err(format!(
                "{what}: {counted} runs in counted bursts, {burst_runs} in copied ones"
            ));
        }
    }
    Ok((runs, burst_runs, paths))
}

// ----- memory -----

/// Files loaded at addresses (libipt's corpus images).
#[test]
fn corpus_cases_burst_as_next_steps() {
    let (mut checked, mut runs, mut burst_runs) = (0, 0, 0);
    let mut failures = Vec::new();
    for case in corpus_cases() {
        for resync in [false, true] {
            match same(&case.name, &case.trace, case.config, &case.files, resync) {
                Ok((r, b, _)) => {
                    runs += r;
                    burst_runs += b;
                }
                Err(e) => failures.push(e),
            }
        }
        checked += 1;
    }
    assert!(checked > 400, "only {checked} corpus cases found");
    assert!(
        burst_runs > 100,
        "only {burst_runs} of {runs} runs came in bursts"
    );
    assert!(
        failures.is_empty(),
        "{} decodes of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn tick_events_leave_bursts_to_next() {
    // With a tick event at every branch nothing is plain: no burst runs,
    // and `next` does everything.
    let (trace, pages) = real("foo");
    let config = Config {
        tick_events: true,
        ..Config::default()
    };
    let mut dec = FastDecoder::new(&trace, config, &pages);
    dec.sync_forward().expect("a PSB");
    let mut buf = RunBuffer::new();
    let mut steps = 0;
    while let Ok(Some(_)) = dec.next() {
        assert_eq!(dec.next_runs(&mut buf), 0);
        assert!(buf.is_empty());
        steps += 1;
        if steps > 10_000 {
            break;
        }
    }
    assert!(steps > 1000, "only {steps} steps");
}

#[test]
fn real_traces_burst_as_next_steps() {
    for name in ["foo", "Unzip"] {
        let (trace, pages) = real(name);
        for resync in [false, true] {
            let (runs, burst_runs, paths) = same(name, &trace, Config::default(), &pages, resync)
                .unwrap_or_else(|e| panic!("{e}"));
            // Most runs of real code come in bursts, hot loops as TNT paths.
            assert!(
                burst_runs * 10 > runs * 9,
                "{name}: {burst_runs} of {runs} runs in bursts"
            );
            assert!(paths.all > 10, "{name}: only {paths:?} TNT paths");
            // Paths an event follows stop before their last bit.
            assert!(paths.partial > 0, "{name}: {paths:?} TNT paths");
            // foo is IP-filtered: every call out of its range is a
            // disable/enable pair, which counting bursts pass over.
            if name == "foo" {
                assert!(paths.passed_events > 1000, "{name}: {paths:?}");
            }
            // Unzip's loops write long runs of TNT-8 packets: counting
            // bursts take eight at a time once they have seen them.
            if name == "Unzip" {
                assert!(paths.octets > 0, "{name}: {paths:?}");
            }
        }
    }
}

/// A real trace three times over, one copy after the other (each starts
/// with a PSB, as the benchmark's repeated corpus does): counting bursts
/// over the second and third copies take the runs of eight TNT-8 packets
/// and the leaps the first one's left remembered, and count as `next`
/// does.
#[test]
fn repeated_real_traces_burst_as_next_steps() {
    for name in ["foo", "Unzip"] {
        let (trace, pages) = real(name);
        let thrice = trace.repeat(3);
        let (_, _, paths) =
            same(name, &thrice, Config::default(), &pages, false).unwrap_or_else(|e| panic!("{e}"));
        if name == "Unzip" {
            assert!(paths.octets > 0, "{name}: {paths:?}");
        }
        // foo's TIPs, TNT-8 packets and pairs repeat byte for byte (its
        // leaps are taken, so more are recorded); Unzip's loops are
        // mostly runs of TNT-8 packets, taken eight at a time.
        let leaps = if name == "foo" { 100 } else { 1 };
        assert!(paths.leaps >= leaps, "{name}: {paths:?}");
    }
}

/// A function called from two places, whose trace from a conditional
/// jump in it is the same bytes whichever called it: a leap from there
/// returns (compressed) to its caller, so it holds only where the return
/// stack has the caller it was recorded with. The function is eleven
/// conditional jumps and a return, six TNT-8 packets of two taken bits a
/// call, so its packets start at the same jumps for the caller at 0x1000
/// and the one at 0x1008 in turn; the code after each return differs
/// (three NOPs after the first). Taken for the other caller, such a leap
/// would count the wrong instructions and leave the wrong return address
/// on the stack.
#[test]
fn leaps_that_return_to_an_earlier_call_are_taken_for_that_caller_only() {
    use hwtrace_packet::{ModeExec, Packet, Tnt, TraceBuilder};
    use hwtrace_types::{BytesAt, Ip};
    const BASE: u64 = 0x1000;
    const JUMPS: usize = 11;
    const CALLS: usize = 600;
    let main = [
        0xe8, 0x1b, 0x00, 0x00, 0x00, // 1000: call 1020
        0x90, 0x90, 0x90, // 1005: nop x3
        0xe8, 0x13, 0x00, 0x00, 0x00, // 1008: call 1020
        0xeb, 0xf1, // 100d: jmp 1000
    ];
    let mut code = vec![0xf4u8; 0x20];
    code[..main.len()].copy_from_slice(&main);
    // 1020: jz +0, eleven times; ret.
    for _ in 0..JUMPS {
        code.extend_from_slice(&[0x74, 0x00]);
    }
    code.push(0xc3);
    let mem = BytesAt::new(Ip(BASE), &code);
    let mut t = TraceBuilder::new();
    t.push(Packet::Psb).unwrap();
    t.push(Packet::Psbend).unwrap();
    t.push(Packet::ModeExec(ModeExec {
        csl: true,
        csd: false,
        iflag: false,
    }))
    .unwrap();
    t.ip(Packet::TipPge, BASE).unwrap();
    // The first calls one bit a packet: their stations' bytes are not the
    // later ones', so those are first met once both callers' blocks are
    // known (before, the return's block had no successor yet, and a dry
    // run from there went nowhere).
    let tnt = |t: &mut TraceBuilder, len: u8| {
        t.push(Packet::Tnt(Tnt {
            bits: (1 << len) - 1,
            len,
            long: false,
        }))
        .unwrap();
    };
    for _ in 0..4 * (JUMPS + 1) {
        tnt(&mut t, 1);
    }
    for _ in 0..CALLS * (JUMPS + 1) / 2 {
        tnt(&mut t, 2);
    }
    let trace = t.finish();
    let (runs, _, paths) = same("two callers", &trace, Config::default(), mem, false)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(runs > CALLS * (JUMPS + 2), "{runs} runs");
    assert!(paths.leaps > 0, "no leap kept: {paths:?}");
}

/// A decoder warmed from one that has decoded the trace
/// ([`FastDecoder::warm_from`], as a parallel decode's pool does) decodes
/// it as a cold one does, one run at a time and in bursts: its caches are
/// only what it would have decoded itself.
#[test]
fn warmed_decoders_decode_as_cold_ones() {
    for name in ["foo", "Unzip"] {
        let (trace, pages) = real(name);
        for cap in [0, 256] {
            let mut cold = FastDecoder::new(&trace, Config::default(), &pages);
            let (want, ..) = decode_with(&mut cold, true, cap);
            let mut warmed = FastDecoder::new(&trace, Config::default(), &pages);
            warmed.warm_from(&cold);
            assert_eq!(warmed.cached_paths(), cold.cached_paths(), "{name}");
            let (got, ..) = decode_with(&mut warmed, true, cap);
            assert_eq!(got, want, "{name}, bursts of {cap}");
        }
    }
    // One that has decoded keeps its own caches.
    let ((foo, foo_pages), (unzip, unzip_pages)) = (real("foo"), real("Unzip"));
    let mut a = FastDecoder::new(&foo, Config::default(), &foo_pages);
    let mut b = FastDecoder::new(&unzip, Config::default(), &unzip_pages);
    decode_with(&mut a, true, 256);
    decode_with(&mut b, true, 256);
    let paths = a.cached_paths();
    assert_ne!(paths, b.cached_paths());
    a.warm_from(&b);
    assert_eq!(a.cached_paths(), paths);
}

/// A real execution (gzip's first 100,000 instructions), with and without
/// return compression, and with a byte flipped every 3 KiB so errors and
/// resynchronisation come in the middle of hot code.
#[test]
fn qemu_execution_bursts_as_next_steps() {
    assert!(
        Path::new("/usr/bin/qemu-x86_64").exists(),
        "qemu-x86_64 missing: install Debian's qemu-user (scripts/setup.sh)"
    );
    let scratch = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-fast-burst-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    let input = scratch.join("input.txt");
    let text: String = (0..300)
        .map(|i| format!("line {i} of burst test text {}\n", i * 7919 % 1000))
        .collect();
    std::fs::write(&input, text).expect("writing the input");
    let input = input.to_str().expect("UTF-8 temp path").to_string();
    let limits = Limits {
        max_instructions: Some(100_000),
        timeout: Some(Duration::from_secs(90)),
    };
    let rec = Execution::record_qemu("/usr/bin/gzip", &["-c", "-9", &input], limits)
        .unwrap_or_else(|e| panic!("recording gzip: {e}"));
    let code = rec.execution.memory();
    for (k, pt) in [
        PtConfig::default(),
        PtConfig {
            return_compression: false,
            psb_period: 512,
            long_tnt: true,
            ..PtConfig::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let compressed = pt.return_compression;
        let trace = PtEncoder::new(pt)
            .encode(&rec.execution)
            .unwrap_or_else(|e| panic!("encoding gzip: {e}"))
            .bytes;
        let what = format!("gzip config {k}");
        let (runs, burst_runs, paths) =
            same(&what, &trace, Config::default(), code, false).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            burst_runs * 10 > runs * 9,
            "{what}: {burst_runs} of {runs} runs in bursts"
        );
        assert!(paths.all > 10, "{what}: only {paths:?} TNT paths");
        if compressed {
            // Returns out of a TNT packet's blocks stop paths.
            assert!(paths.partial > 0, "{what}: {paths:?} TNT paths");
        }
        let mut bad = trace.clone();
        for at in (1024..bad.len()).step_by(3072) {
            bad[at] ^= 0x5a;
        }
        for resync in [false, true] {
            same(
                &format!("{what}, damaged"),
                &bad,
                Config::default(),
                code,
                resync,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
