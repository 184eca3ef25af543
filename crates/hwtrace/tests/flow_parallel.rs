//! Parallel decoding by PSB segment (issue 8) must give exactly what the
//! sequential decode gives: every item (instruction, event, error,
//! resynchronisation) equal and in the same order, on every libipt corpus
//! case, the three real hardware traces and real executions recorded with
//! qemu-user and encoded by hwtrace-sim (with and without return
//! compression, a PSB every 512 B and 4 KiB, with overflows from a slow
//! consumer). Several thread counts and tiny work units put seams at
//! nearly every PSB. `hwtrace flow --jobs N` prints the same bytes as
//! `--jobs 1` in every output format. The block-cached fast decoder
//! driven through [`FastSource`] gives the instruction decoder's items,
//! sequentially and in parallel, expanding its runs or only counting them.
//!
//! Needs `qemu-x86_64` (`scripts/setup.sh`) for the recorded executions.

mod common;

use anyhow::{Context, Result, ensure};
use hwtrace_flow::event::{EventKind, passable_status};
use hwtrace_flow::insn::{FastDecoder, Insn, InsnDecoder};
use hwtrace_flow::parallel::{
    FastSource, Flow, FlowItem, MAX_STALL, ParallelConfig, ParallelStats, PassedRun, Sink, Skipped,
    decode, decode_into,
};
use hwtrace_flow::{Config, Errata};
use hwtrace_mem::image::{Image, parse_image_arg};
use hwtrace_mem::pagecache::PageCache;
use hwtrace_sim::{
    Consumer, Execution, Limits, OutputTarget, PtConfig, PtEncoder, RecordEnd, Timing, TscModel,
    write_output,
};
use hwtrace_types::{PhysAddr, ReadMemory, TraceOffset};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

/// (threads, least unit bytes, most items a worker keeps per unit): one
/// unit per PSB, and a few sizes between, on 2 to 4 threads; and workers
/// that stop after 50 items, so the merging thread decodes on from where
/// they stopped nearly everywhere.
const SPLITS: [(usize, u64, usize); 4] = [
    (2, 1, 1 << 17),
    (3, 700, 1 << 17),
    (4, 4096, 1 << 17),
    (2, 4096, 50),
];

/// The parallel decode of a split: `threads` threads, units of at least
/// `unit_bytes`, at most `unit_items` items kept per unit, small batches.
fn split(threads: usize, unit_bytes: u64, unit_items: usize) -> ParallelConfig {
    ParallelConfig {
        unit_bytes,
        window: 2 * threads,
        unit_items,
        batch: 7,
        ..ParallelConfig::new(threads)
    }
}

/// Adds a decode's seam statistics to `total`.
fn add(total: &mut ParallelStats, stats: ParallelStats) {
    total.units += stats.units;
    total.spliced += stats.spliced;
    total.continued += stats.continued;
}

/// Decodes `trace` sequentially and in parallel with every split in
/// [`SPLITS`]; fails naming the first differing item. Returns the
/// parallel decodes' seam statistics, summed.
fn same<M: ReadMemory + Sync>(
    what: &str,
    trace: &[u8],
    config: Config,
    mem: &M,
) -> Result<ParallelStats> {
    let want: Vec<FlowItem> = Flow::new(InsnDecoder::new(trace, config, mem)).collect();
    let mut total = ParallelStats::default();
    for (threads, unit_bytes, unit_items) in SPLITS {
        let pc = split(threads, unit_bytes, unit_items);
        let mut got = Vec::new();
        let stats = decode(
            trace,
            &pc,
            || InsnDecoder::new(trace, config, mem),
            |batch| {
                got.extend(batch);
                Ok::<(), ()>(())
            },
        )
        .map_err(|()| anyhow::anyhow!("emit cannot fail"))?;
        if got != want {
            let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            anyhow::bail!(
                "{what}: {threads} threads, units of {unit_bytes} B, {unit_items} items ({stats:?}): item {at} of {} differs: sequential {:?}, parallel {:?}",
                want.len(),
                want.get(at),
                got.get(at)
            );
        }
        ensure!(stats.spliced + stats.continued >= stats.units.min(1));
        add(&mut total, stats);
    }
    Ok(total)
}

/// What a caller that only counts keeps of an item: instructions as their
/// trace offset.
fn counted(item: &FlowItem) -> FlowItem {
    match *item {
        FlowItem::Insn { offset, .. } => FlowItem::Insn {
            offset,
            insn: Insn::empty(0, None, false),
        },
        other => other,
    }
}

/// An item with its times left out (for callers that read none).
fn untimed(item: &FlowItem) -> FlowItem {
    match *item {
        FlowItem::Event { offset, mut event } => {
            (event.has_tsc, event.tsc, event.lost_mtc, event.lost_cyc) = (false, 0, 0, 0);
            FlowItem::Event { offset, event }
        }
        other => other,
    }
}

/// The fast decoder's items for a caller that reads no times
/// ([`FastSource::untimed`]), in parallel with [`SPLITS`]' splits, against
/// the instruction decoder's sequential ones, times aside; the seam
/// statistics summed.
fn same_untimed<M: ReadMemory + Sync>(
    what: &str,
    trace: &[u8],
    config: Config,
    mem: &M,
) -> Result<ParallelStats> {
    let want: Vec<FlowItem> = Flow::new(InsnDecoder::new(trace, config, mem))
        .map(|i| untimed(&i))
        .collect();
    let mut total = ParallelStats::default();
    for (threads, unit_bytes, unit_items) in SPLITS {
        let pc = split(threads, unit_bytes, unit_items);
        let mut got = Vec::new();
        let emit = |batch: Vec<FlowItem>| {
            got.extend(batch.iter().map(untimed));
            Ok::<(), ()>(())
        };
        let make = || FastSource::new(FastDecoder::new(trace, config, mem)).untimed();
        let stats =
            decode(trace, &pc, make, emit).map_err(|()| anyhow::anyhow!("emit cannot fail"))?;
        let how = format!("{threads} threads, units of {unit_bytes} B, untimed");
        check(what, &how, &got, &want)?;
        add(&mut total, stats);
    }
    Ok(total)
}

/// `items` against `want`, naming the first difference.
fn check(what: &str, how: &str, items: &[FlowItem], want: &[FlowItem]) -> Result<()> {
    if items != want {
        let at = items.iter().zip(want).take_while(|(a, b)| a == b).count();
        anyhow::bail!(
            "{what}: {how}: item {at} of {} differs: instruction decoder {:?}, fast {:?}",
            want.len(),
            want.get(at),
            items.get(at)
        );
    }
    Ok(())
}

/// What a sink that only counts keeps (as `hwtrace flow --quiet` does):
/// the items other than instructions, each with how many instructions
/// came before it, and how many came in all. Whole runs reach it as counts
/// ([`Flow::skip_runs`]), with the disable and enable events passed over
/// among them (`passed`), and the PSB+ status updates passed over
/// (`passed_status`).
#[derive(Debug, Default, PartialEq, Eq)]
struct Placed {
    insns: u64,
    items: Vec<(u64, FlowItem)>,
    passed: u64,
    passed_status: u64,
}

impl Sink for Placed {
    fn push(&mut self, item: FlowItem) {
        match item {
            FlowItem::Insn { .. } => self.insns += 1,
            other => self.items.push((self.insns, other)),
        }
    }

    fn counts_only(&self) -> bool {
        true
    }

    fn push_skipped(&mut self, _: TraceOffset, skipped: Skipped) {
        self.insns += skipped.insns;
        self.passed += skipped.events;
        self.passed_status += skipped.status_updates;
    }
}

/// What a sink that keeps runs whole keeps (as `hwtrace flow --branches`
/// does), counted as [`Placed`] counts: whole runs reach it as runs
/// ([`Flow::visit_runs`]), every other step as items.
#[derive(Debug, Default)]
struct Kept(Placed);

impl Sink for Kept {
    fn push(&mut self, item: FlowItem) {
        self.0.push(item);
    }

    fn keeps_runs(&self) -> bool {
        true
    }

    fn push_run(&mut self, run: &PassedRun) {
        self.0.insns += u64::from(run.run.insns);
    }
}

impl Placed {
    /// Appends `next`, the stretch after this one.
    fn append(&mut self, next: Placed) {
        let before = self.insns;
        self.items
            .extend(next.items.into_iter().map(|(n, item)| (before + n, item)));
        self.insns += next.insns;
        self.passed += next.passed;
        self.passed_status += next.passed_status;
    }

    /// The items but the disable and enable events and the status updates
    /// of the kinds a counting decode may pass over, and how many of each
    /// there were, passed over or not.
    fn without_toggles(&self) -> (Vec<(u64, FlowItem)>, u64, u64) {
        let toggle = |item: &FlowItem| {
            matches!(item, FlowItem::Event { event, .. }
                if !event.status_update
                    && matches!(event.kind, EventKind::Disabled { .. } | EventKind::Enabled { .. }))
        };
        let status = |item: &FlowItem| matches!(item, FlowItem::Event { event, .. } if passable_status(event));
        let items: Vec<_> = self
            .items
            .iter()
            .filter(|(_, i)| !toggle(i) && !status(i))
            .copied()
            .collect();
        let toggles = self.items.iter().filter(|(_, i)| toggle(i)).count() as u64 + self.passed;
        let statuses =
            self.items.iter().filter(|(_, i)| status(i)).count() as u64 + self.passed_status;
        (items, toggles, statuses)
    }
}

/// The fast decoder through [`FastSource`] against the instruction
/// decoder's sequential decode: sequentially and in parallel (one unit
/// per PSB on 2 threads, and units of 700 B on 3), runs expanded, and
/// runs only counted (instructions compared by trace offset).
/// `seams`: whether passing over whole runs must splice every unit the
/// decode handing out each instruction splices ([`Seams::Exact`]). Also
/// returns how many disable/enable events and status updates the
/// sequential counting decode passed over.
fn same_fast<M: ReadMemory + Sync>(
    what: &str,
    trace: &[u8],
    config: Config,
    mem: &M,
    seams: Seams,
) -> Result<(ParallelStats, (u64, u64))> {
    let mut total = ParallelStats::default();
    let want: Vec<FlowItem> = Flow::new(InsnDecoder::new(trace, config, mem)).collect();
    let want_counted: Vec<FlowItem> = want.iter().map(counted).collect();
    let expand = || FastSource::new(FastDecoder::new(trace, config, mem));
    let count = || FastSource::counting(FastDecoder::new(trace, config, mem), MAX_STALL);
    let keep = || FastSource::runs(FastDecoder::new(trace, config, mem), MAX_STALL);
    let got: Vec<FlowItem> = Flow::new(expand()).collect();
    check(what, "sequential", &got, &want)?;
    let got: Vec<FlowItem> = Flow::new(count()).map(|i| counted(&i)).collect();
    check(what, "sequential, counting", &got, &want_counted)?;
    // Only counting, whole runs passed over: every other item after the
    // same number of instructions.
    let mut want_placed = Placed::default();
    want.iter().for_each(|i| want_placed.push(*i));
    let mut flow = Flow::new(count());
    let mut got = Placed::default();
    loop {
        let skipped = flow.skip_runs(TraceOffset(u64::MAX));
        got.push_skipped(TraceOffset(0), skipped);
        let Some(item) = flow.next() else { break };
        got.push(item);
    }
    check_placed(what, "sequential, runs passed over", &got, &want_placed)?;
    let passed = (got.passed, got.passed_status);
    for (threads, unit_bytes, unit_items) in [(2, 1, 1 << 17), (3, 700, 1 << 17), (2, 4096, 20)] {
        let pc = split(threads, unit_bytes, unit_items);
        let how = format!("{threads} threads, units of {unit_bytes} B, {unit_items} items");
        let mut got = Vec::new();
        let mut got_counted = Vec::new();
        let emit = |batch: Vec<FlowItem>| {
            got.extend(batch);
            Ok::<(), ()>(())
        };
        let one_by_one =
            decode(trace, &pc, expand, emit).map_err(|()| anyhow::anyhow!("emit cannot fail"))?;
        check(what, &how, &got, &want)?;
        let emit = |batch: Vec<FlowItem>| {
            got_counted.extend(batch.iter().map(counted));
            Ok::<(), ()>(())
        };
        decode(trace, &pc, count, emit).map_err(|()| anyhow::anyhow!("emit cannot fail"))?;
        check(
            what,
            &format!("{how}, counting"),
            &got_counted,
            &want_counted,
        )?;
        let mut got = Placed::default();
        let emit = |stretch: Placed| {
            got.append(stretch);
            Ok::<(), ()>(())
        };
        let new = |_: usize| Placed::default();
        let stats = decode_into(trace, &pc, count, new, emit)
            .map_err(|()| anyhow::anyhow!("emit cannot fail"))?;
        // Passing over whole runs loses no seam: a unit is spliced on
        // exactly where the decode handing out every instruction splices
        // it (else the merging thread decodes it again, right but alone).
        ensure!(
            seams == Seams::Unchecked
                || (stats.spliced, stats.continued) == (one_by_one.spliced, one_by_one.continued),
            "{what}: {how}: runs passed over {stats:?}, one by one {one_by_one:?}"
        );
        add(&mut total, stats);
        check_placed(
            what,
            &format!("{how}, runs passed over"),
            &got,
            &want_placed,
        )?;
        let mut got = Placed::default();
        let emit = |stretch: Kept| {
            got.append(stretch.0);
            Ok::<(), ()>(())
        };
        let new = |_: usize| Kept::default();
        decode_into(trace, &pc, keep, new, emit)
            .map_err(|()| anyhow::anyhow!("emit cannot fail"))?;
        check_placed(what, &format!("{how}, runs kept"), &got, &want_placed)?;
    }
    Ok((total, passed))
}

/// How [`same_fast`] compares the seams found by the two decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seams {
    /// The same units spliced on.
    Exact,
    /// Not compared: after an overflow, the decode passing over runs
    /// splices fewer units than the one handing out every instruction
    /// (4 of 10 against 7 of 10 on echo's overflowing trace; the output
    /// is the same, less of it decoded in parallel). A known gap.
    Unchecked,
}

/// `got` against `want`, naming the first difference.
/// Where `got` passed over disable/enable pairs, the other items are
/// compared (each after as many instructions) and the pairs counted.
fn check_placed(what: &str, how: &str, got: &Placed, want: &Placed) -> Result<()> {
    if got.passed > 0 || got.passed_status > 0 {
        let (got_items, got_toggles, got_statuses) = got.without_toggles();
        let (want_items, want_toggles, want_statuses) = want.without_toggles();
        ensure!(
            (got.insns, got_toggles, got_statuses) == (want.insns, want_toggles, want_statuses),
            "{what}: {how}: {} instructions, {got_toggles} disables/enables ({} passed over) and {got_statuses} status updates ({} passed over) vs {}, {want_toggles} and {want_statuses}",
            got.insns,
            got.passed,
            got.passed_status,
            want.insns
        );
        let at = got_items
            .iter()
            .zip(&want_items)
            .take_while(|(a, b)| a == b)
            .count();
        ensure!(
            got_items == want_items,
            "{what}: {how}: item {at} of {} (disables/enables aside) differs: instruction decoder {:?}, fast {:?}",
            want_items.len(),
            want_items.get(at),
            got_items.get(at)
        );
        return Ok(());
    }
    if got != want {
        let at = got
            .items
            .iter()
            .zip(&want.items)
            .take_while(|(a, b)| a == b)
            .count();
        anyhow::bail!(
            "{what}: {how}: {} vs {} instructions; item {at} of {} differs: instruction decoder {:?}, fast {:?}",
            got.insns,
            want.insns,
            want.items.len(),
            want.items.get(at),
            got.items.get(at)
        );
    }
    Ok(())
}

/// The processor `--cpu F/M` names, as errata.
fn config_for(cpu: Option<&str>) -> Config {
    let Some((family, model)) = cpu.and_then(|c| {
        let mut parts = c.split('/');
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    }) else {
        return Config::default();
    };
    match Errata::for_model(family, model) {
        Ok(errata) => Config {
            errata,
            ..Config::default()
        },
        Err(_) => Config::default(),
    }
}

#[test]
fn every_libipt_case_decodes_the_same_in_parallel() -> Result<()> {
    let mut dirs: Vec<_> = std::fs::read_dir(shared().join("libipt"))
        .context("../shared/corpus/libipt")?
        .flatten()
        .collect();
    dirs.sort_by_key(|d| d.file_name());
    let mut checked = 0;
    for dir in dirs {
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("case.json"))?)?;
        let Some(images) = case["images"].as_array().filter(|a| !a.is_empty()) else {
            continue;
        };
        let mut image = Image::new();
        for i in images {
            let (Some(file), Some(at)) = (i["file"].as_str(), i["load_address"].as_str()) else {
                continue;
            };
            let arg = format!("{}@{at}", dir.path().join(file).display());
            let spec = parse_image_arg(&arg).map_err(|e| anyhow::anyhow!("{arg}: {e}"))?;
            // A few cases name an empty file (ptxed fails to load it, and
            // decodes without it too).
            let _ = image.add_raw(None, &spec);
        }
        let Some(trace) = case["trace"].as_str() else {
            continue;
        };
        let trace = std::fs::read(dir.path().join(trace))?;
        let name = dir.file_name().to_string_lossy().into_owned();
        let config = config_for(case["cpu"].as_str());
        same(&name, &trace, config, &image)?;
        same_fast(&name, &trace, config, &image, Seams::Exact)?;
        checked += 1;
    }
    ensure!(checked > 300, "only {checked} cases found");
    Ok(())
}

#[test]
fn the_real_traces_decode_the_same_in_parallel() -> Result<()> {
    for name in ["foo", "Unzip", "icelake_tip"] {
        let dir = shared().join("real").join(name);
        let cache = PageCache::open_files(&dir.join("pages.addr"), &dir.join("pages.dump"))
            .with_context(|| format!("{name}: page cache"))?;
        let mut image = Image::new();
        image.add_page_cache(None, cache, name);
        let trace = std::fs::read(dir.join("trace.pt"))?;
        let stats = same(name, &trace, Config::default(), &image)?;
        let (counted, (passed, passed_status)) =
            same_fast(name, &trace, Config::default(), &image, Seams::Exact)?;
        eprintln!(
            "{name}: {} bytes, {stats:?}, counting the fast decoder's runs {counted:?}, {passed} disables/enables and {passed_status} status updates passed over",
            trace.len()
        );
        // foo and Unzip leave the traced ranges (IP filtering) at most
        // library calls: TIP.PGD then TIP.PGE, hundreds of times, which
        // counting passes over (and icelake_tip never).
        ensure!(
            (passed > 100) == (name != "icelake_tip"),
            "{name}: {passed} disables/enables passed over"
        );
        // Most of Unzip's PSB+ are written while tracing is off (between
        // the disable and the enable): their status updates too.
        ensure!(
            (passed_status > 100) == (name == "Unzip"),
            "{name}: {passed_status} status updates passed over"
        );
        if name == "foo" {
            // foo has a PSB every few KiB and no errors: its seams must be
            // found, or nothing ran in parallel; with the fast decoder's
            // runs too (seams only where every decode's runs end).
            for stats in [stats, counted] {
                ensure!(
                    stats.units > 10 && stats.spliced * 2 > stats.units,
                    "{stats:?}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn real_executions_decode_the_same_in_parallel() -> Result<()> {
    ensure!(
        Path::new("/usr/bin/qemu-x86_64").exists(),
        "qemu-x86_64 missing: install the Debian package qemu-user (scripts/setup.sh)"
    );
    let limits = Limits {
        max_instructions: Some(150_000),
        timeout: Some(Duration::from_secs(90)),
    };
    let rec = Execution::record_qemu("/bin/echo", &["parallel", "seams"], limits)
        .context("recording echo")?;
    // Cut short at the limit (echo needs more), or exited: either way a
    // real execution.
    ensure!(
        matches!(rec.end, RecordEnd::Exited(_) | RecordEnd::Limit),
        "echo ended {:?}",
        rec.end
    );
    let code = rec.execution.memory();
    let mut overflows = 0;
    // TSC in PSB+, MTC, and CYC or not. With CYC, a unit's first items
    // may take their times from a calibration the decode before it learned
    // earlier (a PSB every 256 B and TNT-64 packets put a CYC-timed
    // disable right after a seam): a unit's clock is warmed over the
    // packets before its PSB, and where that does not give the same
    // timing state, the unit is not spliced on.
    let timing = |cyc_thresh| Timing {
        mtc_freq: Some(4),
        cyc_thresh,
        cbr: Some(40),
        tsc_bus_ratio: 20,
        tsc_ctc_ratio: Some((2, 125)),
    };
    let tsc = Some(TscModel {
        start: 1 << 40,
        ticks_per_insn: 2,
    });
    let untimed = PtConfig::default();
    let configs = [
        (true, 512, untimed),
        (true, 4096, untimed),
        (false, 512, untimed),
        (false, 4096, untimed),
        (
            true,
            512,
            PtConfig {
                tsc,
                timing: timing(None),
                ..untimed
            },
        ),
        (
            true,
            256,
            PtConfig {
                tsc,
                timing: timing(Some(1)),
                long_tnt: true,
                ..untimed
            },
        ),
        (
            false,
            256,
            PtConfig {
                tsc,
                timing: timing(Some(1)),
                long_tnt: true,
                ..untimed
            },
        ),
    ];
    for (return_compression, psb_period, config) in configs {
        let config = PtConfig {
            return_compression,
            psb_period,
            ..config
        };
        let cyc = config.timing.cyc_thresh.is_some();
        let encoded = PtEncoder::new(config).encode(&rec.execution)?;
        let what = format!(
            "echo, retc={return_compression}, PSB every {psb_period} B, TSC {}, CYC {cyc}, TNT-64 {}",
            config.tsc.is_some(),
            config.long_tnt
        );
        let stats = same(&what, &encoded.bytes, Config::default(), code)?;
        same_fast(&what, &encoded.bytes, Config::default(), code, Seams::Exact)?;
        ensure!(stats.spliced * 2 > stats.units, "{what}: {stats:?}");
        if cyc {
            // Decoded without a CTC ratio, MTCs calibrate nothing, and a
            // decode that saw one no longer calibrates from PSB+ TSCs: a
            // unit's clock is warmed as such a decode's, so nearly every
            // unit splices on (without return compression 195 of 210 did
            // when warm-ups calibrated from the TSCs).
            ensure!(stats.continued * 50 <= stats.units, "{what}: {stats:?}");
            // Decoded as its configuration says (the CTC:TSC ratio, MTC
            // frequency and nominal ratio), CYC packets become time
            // through a measured calibration: the units' clocks, warmed
            // over the packets before their PSBs, learn the same one.
            let timed = Config {
                time: common::decoder_time(&config.timing),
                ..Config::default()
            };
            let calibrated = Flow::new(InsnDecoder::new(&encoded.bytes, timed, code))
                .filter_map(|item| match item {
                    FlowItem::Event { event, .. } => Some(event),
                    _ => None,
                })
                .filter(|e| e.has_tsc && e.lost_cyc == 0)
                .count();
            ensure!(calibrated > 0, "{what}: no event timed without lost CYCs");
            let stats = same(&format!("{what}, timed"), &encoded.bytes, timed, code)?;
            ensure!(stats.spliced * 2 > stats.units, "{what}, timed: {stats:?}");
            // A caller that reads no times (`hwtrace flow`) splices the
            // units on all the same.
            let stats = same_untimed(&what, &encoded.bytes, Config::default(), code)?;
            ensure!(
                stats.spliced * 2 > stats.units,
                "{what}, untimed: {stats:?}"
            );
        }
        // A consumer too slow for the output buffer: packets are lost
        // and OVF marks where, before a PSB.
        let run = write_output(
            &encoded.bytes,
            &OutputTarget::SingleRange {
                base: PhysAddr(0),
                size: 1024,
            },
            Some(Consumer { drain: 1, per: 2 }),
        )?;
        let lost = run.losses.iter().filter(|l| l.ovf_at.is_some()).count();
        ensure!(
            lost > 0,
            "{what}: no overflow in {} bytes",
            encoded.bytes.len()
        );
        overflows += lost;
        let what = format!("{what}, with {lost} overflows");
        same(&what, &run.stream, Config::default(), code)?;
        same_fast(
            &what,
            &run.stream,
            Config::default(),
            code,
            Seams::Unchecked,
        )?;
    }
    eprintln!("{overflows} overflows checked");
    Ok(())
}

/// `hwtrace flow` on a real trace over its page cache with `extra`
/// arguments: exit code, stdout and stderr.
fn flow_cli(name: &str, extra: &[&str]) -> Result<(Option<i32>, Vec<u8>, Vec<u8>)> {
    let dir = shared().join("real").join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_hwtrace"))
        .arg("flow")
        .arg(dir.join("trace.pt"))
        .arg("--pages")
        .arg(&dir)
        .args(extra)
        .output()?;
    Ok((out.status.code(), out.stdout, out.stderr))
}

#[test]
fn flow_jobs_prints_the_same_bytes_in_every_format() -> Result<()> {
    // foo decodes cleanly; Unzip has errors (exit code 2, and --quiet
    // reports them on stderr, in order).
    for (name, code) in [("foo", 0), ("Unzip", 2)] {
        for format in [
            &[][..],
            &["--blocks"],
            &["--branches", "--json"],
            &["--json", "--no-disasm"],
            &["--quiet", "--stats"],
            &["--quiet", "--stats", "--json"],
        ] {
            let one = flow_cli(name, &[format, &["--jobs", "1"]].concat())?;
            ensure!(
                one.0 == Some(code) && !one.1.is_empty(),
                "{name} {format:?}: exit {:?}",
                one.0
            );
            let many = flow_cli(
                name,
                &[format, &["--jobs", "3", "--unit-bytes", "1"]].concat(),
            )?;
            ensure!(
                one == many,
                "{name} {format:?}: --jobs 3 differs from --jobs 1 ({} vs {} bytes out, {} vs {} bytes err)",
                many.1.len(),
                one.1.len(),
                many.2.len(),
                one.2.len()
            );
        }
    }
    Ok(())
}

/// A sink that checks the address space a stretch's runs were decoded in
/// against the one [`Sink::starts_at`] gave and the items since (PIP and
/// VMCS events; unknown again after a resynchronisation), as an answer
/// that tracks it from the items relies on.
struct SpaceCheck {
    /// The space the runs should be in (`None` before the trace's start
    /// has said it: the first stretch starts with no `starts_at`).
    space: hwtrace_types::AddressSpace,
    started: bool,
    runs: u64,
    wrong: Vec<(
        TraceOffset,
        hwtrace_types::AddressSpace,
        hwtrace_types::AddressSpace,
    )>,
    folds: bool,
}

impl SpaceCheck {
    fn new(folds: bool) -> Self {
        Self {
            space: hwtrace_types::AddressSpace::UNKNOWN,
            started: false,
            runs: 0,
            wrong: Vec::new(),
            folds,
        }
    }
}

impl Sink for SpaceCheck {
    fn push(&mut self, item: FlowItem) {
        match item {
            FlowItem::Event { event, .. } => match event.kind {
                EventKind::Paging { cr3, .. } | EventKind::AsyncPaging { cr3, .. } => {
                    self.space.cr3 = Some(hwtrace_types::Cr3(cr3));
                }
                EventKind::Vmcs { base } | EventKind::AsyncVmcs { base, .. } => {
                    self.space.vmcs = Some(base);
                }
                _ => {}
            },
            FlowItem::Resync { .. } => self.space = hwtrace_types::AddressSpace::UNKNOWN,
            _ => {}
        }
    }
    fn keeps_runs(&self) -> bool {
        true
    }
    fn push_run(&mut self, run: &PassedRun) {
        self.runs += 1;
        if run.run.space != self.space {
            self.wrong.push((run.before, run.run.space, self.space));
        }
    }
    fn folds(&self) -> bool {
        self.folds
    }
    fn starts_at(&mut self, probe: &hwtrace_flow::parallel::Probe) {
        self.started = true;
        self.space = probe.space;
    }
}

/// Where a stretch of a parallel decode starts, its sink is told the
/// decoder's state ([`Sink::starts_at`]): its address space and the PIP,
/// VMCS and resynchronisations after it give the space of every run, on
/// the real traces (PIPs in every PSB+, errors in Unzip) and the three
/// concatenated with errors between them. A sink that folds is not held to
/// the item budget: its units splice as without one.
#[test]
fn a_stretch_starts_with_the_decoders_state() -> Result<()> {
    let mut image = Image::new();
    let mut traces = Vec::new();
    for name in ["foo", "Unzip", "icelake_tip"] {
        let dir = shared().join("real").join(name);
        let cache = PageCache::open_files(&dir.join("pages.addr"), &dir.join("pages.dump"))?;
        image.add_page_cache(None, cache, name);
        traces.push((name.to_owned(), std::fs::read(dir.join("trace.pt"))?));
    }
    let mut all = Vec::new();
    for (_, t) in &traces {
        all.extend_from_slice(&t[..t.len() - 1]);
    }
    traces.push(("concatenated".to_owned(), all));
    for (name, trace) in &traces {
        let trace = trace.as_slice();
        let keep = || {
            FastSource::runs(
                FastDecoder::new(trace, Config::default(), &image),
                MAX_STALL,
            )
        };
        for (threads, unit_bytes, _) in SPLITS {
            // Runs, stretches told where they start, stretches handed out.
            let check = |folds: bool, unit_items: usize| -> Result<(u64, usize, usize)> {
                let mut runs = 0;
                let mut started = 0;
                let mut sinks = 0;
                let config = ParallelConfig {
                    unit_items,
                    ..split(threads, unit_bytes, 1 << 17)
                };
                decode_into(
                    trace,
                    &config,
                    keep,
                    |_| SpaceCheck::new(folds),
                    |s| {
                        sinks += 1;
                        runs += s.runs;
                        started += usize::from(s.started);
                        if let Some(w) = s.wrong.first() {
                            anyhow::bail!(
                                "{name}: {} runs decoded in another space than the stretch's, first at {:?}: {:?} against {:?}",
                                s.wrong.len(),
                                w.0,
                                w.1,
                                w.2
                            );
                        }
                        Ok(())
                    },
                )?;
                Ok((runs, started, sinks))
            };
            let (runs, started, sinks) = check(true, 1 << 17)?;
            // icelake_tip (208 bytes) decodes to nothing but its error.
            ensure!(
                runs > 0 && started > 0 || trace.len() < 1000,
                "{name}: {runs} runs, {started} stretches told"
            );
            // A sink that folds is not stopped at a budget of one item: the
            // workers' stretches come back as they did. One that does not
            // fold is, and the merging thread's small batches follow.
            let folded = check(true, 1)?;
            ensure!(
                folded == (runs, started, sinks),
                "{name}: {folded:?} against {:?}",
                (runs, started, sinks)
            );
            let (held_runs, _, held_sinks) = check(false, 1)?;
            ensure!(
                held_runs == runs && (held_sinks > sinks || trace.len() < 1000),
                "{name}: {held_runs} runs in {held_sinks} stretches against {runs} in {sinks}"
            );
        }
    }
    Ok(())
}
